"""The old `algo.*` names keep working after the move to the advantage / loss / filter / batching
sections: as overrides, as `cfg.algo.x = v` in config files, and in a saved run's config.json, each
with a deprecation warning; the V1 filter knobs become the FilterSpec the old AlgoConfig built.

The truth: hand-written old-name -> new-key pairs and hand-computed FilterSpecs (tiny_cpu.py is 4 groups
x 4 with a top_k filter of 0.5 and mini-batch 4)."""

import warnings

import pytest

from ragen_jax.algorithms.filters import FilterSpec
from ragen_jax.experiment.config import Config, ConfigError, config_from_dict, load_config

# (old override, new override): the same value through both names.
RENAMED = [
    ("algo.adv_estimator=grpo", "advantage.estimator=grpo"),
    ("algo.gamma=0.9", "advantage.gamma=0.9"),
    ("algo.loss_agg=seq-mean-token-sum", "loss.agg=seq-mean-token-sum"),
    ("algo.tis=token", "loss.tis=token"),
    ("algo.kl_coef=0.1", "loss.kl_coef=0.1"),
    ("algo.ppo_epochs=2", "batching.ppo_epochs=2"),
    ("algo.micro_batch_size=2", "batching.micro_batch_size=2"),
    ("algo.critic_warmup=3", "batching.critic_warmup=3"),
    ("algo.filter_metric=reward_mean", "filter.metric=reward_mean"),
    ("algo.filter_loss_scaling=sqrt", "filter.loss_scaling=sqrt"),
    ("algo.filter_rounding=ceil", "filter.rounding=ceil"),
]


@pytest.mark.parametrize("old,new", RENAMED, ids=[r[0] for r in RENAMED])
def test_old_override_sets_the_new_key(old, new):
    with pytest.warns(FutureWarning, match=rf"{old.split('=')[0]} is deprecated; use {new.split('=')[0]}"):
        via_old = load_config("tiny_cpu.py", [old])
    assert via_old.to_dict() == load_config("tiny_cpu.py", [new]).to_dict()
    assert via_old.to_dict() != load_config("tiny_cpu.py").to_dict()


def test_old_attribute_set_and_read():
    cfg = Config()
    with pytest.warns(FutureWarning, match="algo.loss_agg is deprecated; use loss.agg"):
        cfg.algo.loss_agg = "seq-mean-token-mean"
    with pytest.warns(FutureWarning):
        cfg.algo.mini_batch_size = 8
        assert cfg.algo.soft_advantage_reweight is False
    assert (cfg.loss.agg, cfg.batching.mini_batch_size) == ("seq-mean-token-mean", 8)
    with pytest.raises(ConfigError, match="algo.no_such_key"):
        cfg.algo.no_such_key = 1


# Old V1 / RAGEN-2 filter overrides on tiny_cpu.py (P = 4) -> the FilterSpec the old code built.
V1 = [
    ([], FilterSpec("top_k", 0.5)),
    (["algo.filter_ratio=1.0"], FilterSpec("top_k", 1.0)),
    (["algo.filter_mode=smallest"], FilterSpec("top_k", 0.5, select="smallest")),
    # variance_cover: top_p linear with filter_cover, at most floor(0.5 * 4) = 2 groups.
    (["algo.filter_type=variance_cover", "algo.filter_cover=0.7"], FilterSpec("top_p", 0.7, max_groups=2)),
    (["algo.filter_type=variance_cover", "algo.filter_ratio=1.0", "algo.filter_rounding=ceil"],
     FilterSpec("top_p", 0.9, max_groups=4, rounding="ceil")),
    (["algo.filter_strategy=top_k_abs", "algo.filter_value=1", "algo.filter_mode=smallest"],
     FilterSpec("top_k_abs", 1, select="smallest")),
    (["algo.filter_strategy=top_p", "batching.mini_batch_size=16"], FilterSpec("top_p", 0.9)),
    (["filter.strategy=top_p", "filter.value=0.6", "algo.filter_ratio=0.25", "batching.mini_batch_size=16"],
     FilterSpec("top_p", 0.6)),  # an explicit RAGEN-2 strategy wins over V1's ratio, as before
]


@pytest.mark.parametrize("overrides,spec", V1, ids=[" ".join(v[0]) or "none" for v in V1])
def test_v1_filter_knobs_give_the_old_spec(overrides, spec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        cfg = load_config("tiny_cpu.py", overrides)
    assert cfg.filter.spec == spec
    assert cfg.validate().filter.spec == spec  # translated once: validating again changes nothing


# A config.json as runs saved it before the sections (only the keys that matter here; the others
# take their defaults, as they did then).
OLD_SAVED = {"model": {"random_init": True}, "rollout": {"num_groups": 8, "group_size": 4},
             "algo": {"adv_estimator": "grpo", "loss_agg": "seq-mean-token-mean", "soft_advantage_reweight": True,
                      "filter_ratio": 0.25, "filter_mode": "largest", "filter_type": "variance_cover",
                      "filter_cover": 0.7, "filter_strategy": None, "filter_value": None, "filter_select": None,
                      "filter_max_groups": 0, "filter_rounding": "floor", "filter_loss_scaling": "linear",
                      "mini_batch_size": 4, "micro_batch_size": 2, "tis": "sequence", "tis_geo_mask": [0.99, 1.01]}}


def test_old_saved_config_migrates():
    cfg = config_from_dict(OLD_SAVED).validate()
    assert (cfg.advantage.estimator, cfg.advantage.soft_reweight, cfg.loss.agg) == ("grpo", True,
                                                                                    "seq-mean-token-mean")
    assert (cfg.batching.mini_batch_size, cfg.batching.micro_batch_size) == (4, 2)
    assert (cfg.loss.tis, cfg.loss.tis_geo_mask, cfg.filter.loss_scaling) == ("sequence", (0.99, 1.01), "linear")
    assert cfg.filter.spec == FilterSpec("top_p", 0.7, max_groups=2)  # floor(0.25 * 8)
    assert config_from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()  # the new format round-trips


@pytest.mark.parametrize("overrides,match", [
    (["algo.eps_low=1.2"], r"loss\.eps_low must .* \(set through the old name algo\.eps_low\)"),
    (["algo.micro_batch_size=3"], r"batching\.micro_batch_size=3 must divide .* old name algo\.micro_batch_size"),
    (["algo.filter_value=-1"], r"filter\.value must .* old name algo\.filter_value"),
    (["algo.filter_ratio=1.5"], r"algo\.filter_ratio must be in \(0, 1\]"),
    (["algo.filter_strategy=min_p"], r"algo\.filter_strategy='min_p' needs a value; set filter\.value"),
    (["algo.no_such_key=1"], r"unknown config key 'algo\.no_such_key'"),
    (["loss.eps_low=1.2"], r"^loss\.eps_low must (?!.*old name)"),
])
def test_bad_values_name_the_new_key_and_the_old_one(overrides, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ConfigError, match=match) as e:
            load_config("tiny_cpu.py", overrides)
    assert "\n" not in str(e.value)


GIGPO = ["advantage.estimator=gigpo", "model.critic=none"]


@pytest.mark.parametrize("old", ["advantage.gigpo_norm=none", "algo.gigpo_norm=none"])
def test_released_gigpo_names_set_its_options(old):
    # GiGPO's options live in advantage.options (its record's GiGPOOptions); the names they were
    # released under still set them, with a deprecation warning.
    with pytest.warns(FutureWarning, match=rf"{old.split('=')[0]} is deprecated; use advantage\.options\.norm"):
        via_old = load_config("tiny_cpu.py", [*GIGPO, old])
    assert via_old.to_dict() == load_config("tiny_cpu.py", [*GIGPO, "advantage.options.norm=none"]).to_dict()
    assert via_old.advantage.options == {"norm": "none"}


def test_saved_gigpo_keys_migrate_into_options():
    # Runs saved before advantage.options stored all three keys for every estimator: under gigpo a
    # non-default value becomes an option, defaults and other estimators' copies are dropped (so the
    # same command still resumes such a run: check_run_dir_config compares against these).
    base = Config().to_dict()
    saved = {**base, "advantage": {k: v for k, v in base["advantage"].items() if k != "options"}}
    saved["advantage"].update(estimator="gigpo", gigpo_weight=1.0, gigpo_norm="none", gigpo_gamma=0.95)
    assert config_from_dict(saved).advantage.options == {"norm": "none"}
    saved["advantage"].update(estimator="grpo")
    assert config_from_dict(saved).advantage.options == {}
