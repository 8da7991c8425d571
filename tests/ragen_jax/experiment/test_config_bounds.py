"""Every bound the algorithms and the compiled step enforce on an advantage / loss / filter / batching
value is checked by `load_config`, before anything is built or traced, as one ConfigError that names the key.

The truth: the bounds each consumer enforces itself (losses.ppo_policy_loss, FilterSpec, gigpo,
mismatch), restated here as plain numbers; `test_consumers_refuse_the_same_values` checks that the
consumers do refuse them, so the config check and the code cannot drift apart unnoticed."""

import jax.numpy as jnp
import pytest

from ragen_jax.algorithms import losses
from ragen_jax.algorithms.filters import FilterSpec
from ragen_jax.experiment.config import ConfigError, load_config

# (override, the key the message must name); tiny_cpu.py is 4 groups x 4, filter 0.5, mini-batch 4.
BAD = [
    ("loss.eps_low=1.2", "loss.eps_low"),
    ("loss.eps_low=1.0", "loss.eps_low"),
    ("loss.eps_low=-0.1", "loss.eps_low"),
    ("loss.eps_high=-0.1", "loss.eps_high"),
    ("loss.dual_clip=1.0", "loss.dual_clip"),
    ("batching.ppo_epochs=0", "batching.ppo_epochs"),
    ("batching.mini_batch_size=0", "batching.mini_batch_size"),
    ("batching.micro_batch_size=3", "batching.micro_batch_size"),
    ("batching.critic_warmup=-1", "batching.critic_warmup"),
    ("loss.kl_coef=-0.1", "loss.kl_coef"),
    ("loss.entropy_coef=-0.1", "loss.entropy_coef"),
    ("loss.value_clip=0", "loss.value_clip"),
    ("advantage.gamma=1.5", "advantage.gamma"),
    ("advantage.lam=-0.5", "advantage.lam"),
    ("algo.filter_ratio=0", "algo.filter_ratio"),
    ("algo.filter_ratio=1.5", "algo.filter_ratio"),
    ("algo.filter_cover=0", "algo.filter_cover"),
    ("filter.value=-1", "filter.value"),
    ("filter.max_groups=-1", "filter.max_groups"),
    ("filter.max_groups=5", "filter.max_groups"),
    ("advantage.options.weight=0.5", "advantage.options"),  # tiny_cpu.py's gae takes no options
    ("loss.tis_cap=0.5", "loss.tis_cap"),
    ("loss.tis_geo_mask=(1.1, 1.2)", "loss.tis_geo_mask"),
]


@pytest.mark.parametrize("override,key", BAD, ids=[b[0] for b in BAD])
def test_bad_value_named_by_load_config(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        load_config("tiny_cpu.py", [override])
    assert "\n" not in str(e.value)


def test_top_k_abs_below_one_group_is_named():
    with pytest.raises(ConfigError, match=r"filter\.value of top_k_abs"):
        load_config("tiny_cpu.py", ["filter.strategy=top_k_abs", "filter.value=0.5"])


@pytest.mark.parametrize("override", ["loss.eps_low=0", "loss.eps_low=0.99", "loss.eps_high=0", "advantage.gamma=0",
                                      "advantage.lam=1", "batching.critic_warmup=0", "loss.dual_clip=1.01"])
def test_values_at_the_bounds_load(override):
    load_config("tiny_cpu.py", [override])


def test_consumers_refuse_the_same_values():
    z = jnp.zeros((1, 2))
    for kw in (dict(eps_low=1.2), dict(eps_low=-0.1), dict(eps_high=-0.1), dict(dual_clip=1.0)):
        with pytest.raises(ValueError):
            losses.ppo_policy_loss(z, z, z, z > 0, **kw)
    losses.ppo_policy_loss(z, z, z, z > 0, eps_low=0.0, eps_high=0.0, dual_clip=1.01)
    with pytest.raises(ValueError):
        FilterSpec(strategy="top_k_abs", value=0.5)


@pytest.mark.parametrize("raw,want", [("auto", None), ("AUTO", None), ("none", None), ("true", True), ("off", False)])
def test_optional_switches_take_auto(raw, want):
    """model.remat and prompt.list_actions are decided by the run when None; `auto` is how users write that."""
    cfg = load_config("tiny_cpu.py", [f"model.remat={raw}", f"prompt.list_actions={raw}"])
    assert cfg.model.remat is want and cfg.prompt.list_actions is want


def test_a_plain_switch_refuses_auto():
    with pytest.raises(ConfigError, match=r"model.random_init expects true/false, got 'auto'"):
        load_config("tiny_cpu.py", ["model.random_init=auto"])
    with pytest.raises(ConfigError, match=r"model.remat expects true/false, or auto \(none\), got 'maybe'"):
        load_config("tiny_cpu.py", ["model.remat=maybe"])
