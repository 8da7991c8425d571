"""Every bound the algorithms and the compiled step enforce on an `algo.*` value is checked by
`load_config`, before anything is built or traced, as one ConfigError that names the key.

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
    ("algo.eps_low=1.2", "algo.eps_low"),
    ("algo.eps_low=1.0", "algo.eps_low"),
    ("algo.eps_low=-0.1", "algo.eps_low"),
    ("algo.eps_high=-0.1", "algo.eps_high"),
    ("algo.dual_clip=1.0", "algo.dual_clip"),
    ("algo.ppo_epochs=0", "algo.ppo_epochs"),
    ("algo.mini_batch_size=0", "algo.mini_batch_size"),
    ("algo.micro_batch_size=3", "algo.micro_batch_size"),
    ("algo.critic_warmup=-1", "algo.critic_warmup"),
    ("algo.kl_coef=-0.1", "algo.kl_coef"),
    ("algo.entropy_coef=-0.1", "algo.entropy_coef"),
    ("algo.value_clip=0", "algo.value_clip"),
    ("algo.gamma=1.5", "algo.gamma"),
    ("algo.lam=-0.5", "algo.lam"),
    ("algo.filter_ratio=0", "algo.filter_ratio"),
    ("algo.filter_ratio=1.5", "algo.filter_ratio"),
    ("algo.filter_cover=0", "algo.filter_cover"),
    ("algo.filter_value=-1", "algo.filter_value"),
    ("algo.filter_max_groups=-1", "algo.filter_max_groups"),
    ("algo.filter_max_groups=5", "algo.filter_max_groups"),
    ("algo.gigpo_weight=-1", "algo.gigpo_weight"),
    ("algo.gigpo_gamma=1.5", "algo.gigpo_gamma"),
    ("algo.tis_cap=0.5", "algo.tis_cap"),
    ("algo.tis_geo_mask=(1.1, 1.2)", "algo.tis_geo_mask"),
]


@pytest.mark.parametrize("override,key", BAD, ids=[b[0] for b in BAD])
def test_bad_value_named_by_load_config(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        load_config("tiny_cpu.py", [override])
    assert "\n" not in str(e.value)


def test_top_k_abs_below_one_group_is_named():
    with pytest.raises(ConfigError, match=r"algo\.filter_value of top_k_abs"):
        load_config("tiny_cpu.py", ["algo.filter_strategy=top_k_abs", "algo.filter_value=0.5"])


@pytest.mark.parametrize("override", ["algo.eps_low=0", "algo.eps_low=0.99", "algo.eps_high=0", "algo.gamma=0",
                                      "algo.lam=1", "algo.critic_warmup=0", "algo.dual_clip=1.01"])
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
