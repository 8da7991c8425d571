"""RAGEN-2 settings: configs/sokoban_v2.py runs one tiny-model iteration; the filter knobs in the
config (V1 knobs mapped, saved runs without the new keys resume, errors name the key); the compiled
prepare/update with an empty selection (no optimizer step, even with Adam), loss scaling and soft
reweighting against a plain computation; the early-stop rules."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.rollout import Trajectories
from ragen_jax.trainer.collapse import EarlyStops
from ragen_jax.algorithms.gigpo import GiGPOOptions
from ragen_jax.experiment.config import Config, ConfigError, TrainConfig, config_from_dict, load_config
from ragen_jax.experiment.legacy import LEGACY_ALGO_KEYS
from ragen_jax.trainer.rl import RESUMABLE_CHANGES, Trainer
from ragen_jax.experiment.build import check_run_dir_config
from ragen_jax.trainer.step import StepPrograms, StepSettings, TrainState
from tests.ragen_jax.trainer.algo_knobs import set_algo

TINY = ["model.preset=tiny", "model.random_init=true", "model.vocab=task", "model.dtype=float32",
        "rollout.cache_dtype=float32", "rollout.num_groups=2", "rollout.group_size=2", "rollout.max_context=512",
        "prompt.max_turns=1", "prompt.max_response_tokens=16", "batching.mini_batch_size=2", "train.iterations=1",
        "train.val_every=0", "train.log_samples=0", "train.collapse_every=1", "train.collapse_samples=4",
        "mesh.data=1"]


def test_sokoban_v2_settings_and_one_tiny_iteration(tmp_path):
    full = load_config("sokoban_v2.py", ["model.random_init=true"])
    spec = full.filter.spec
    assert (spec.strategy, spec.top_p_mode, spec.value, spec.select, spec.metric, spec.include_zero) == (
        "top_p", "softmax", 0.9, "largest", "reward_std", True)
    assert full.prompt.max_actions_per_turn == 2 and full.train.val_size == 512 and full.model.preset == "qwen2.5-3b"
    cfg = load_config("sokoban_v2.py", TINY)
    trainer = Trainer(cfg, tmp_path / "run", quiet=True)
    before = jax.device_get(trainer.state.actor)
    (h,) = trainer.train()
    assert h["rollout/empty_after_filter"] == 0.0  # softmax top-p keeps at least one group
    assert h["rollout/filter_kept_count"] >= 1 and h["train/optimizer_steps"] >= 1
    assert 0.0 <= h["collapse/valid_thinking_rate"] <= 1.0 and "collapse/first_turn_valid_rate" in h
    assert all(np.isfinite(v) for v in h.values() if isinstance(v, float))
    after = jax.device_get(trainer.state.actor)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    assert (tmp_path / "run" / "checkpoints").is_dir()


# ------------------------------------------------------------------------------------ config
def test_v1_knobs_map_to_the_filter_spec():
    cfg = load_config("tiny_cpu.py")
    s = cfg.filter.spec
    assert (s.strategy, s.value, s.select, s.slots(4)) == ("top_k", 0.5, "largest", 2)
    cfg = load_config("tiny_cpu.py", ["algo.filter_type=variance_cover", "algo.filter_cover=0.7"])
    s = cfg.filter.spec
    assert (s.strategy, s.top_p_mode, s.value, s.max_groups, s.slots(4)) == ("top_p", "linear", 0.7, 2, 2)
    cfg = load_config("tiny_cpu.py", ["algo.filter_strategy=top_k_abs", "algo.filter_value=1",
                                      "algo.filter_mode=smallest"])
    s = cfg.filter.spec
    assert (s.strategy, s.value, s.select, s.slots(4)) == ("top_k_abs", 1.0, "smallest", 1)


@pytest.mark.parametrize("override, message", [
    ("filter.strategy=top_q", "unknown filter.strategy 'top_q'; valid: top_k, top_k_abs"),
    ("algo.filter_strategy=top_q", "unknown filter.strategy 'top_q'; valid: top_k, top_k_abs, top_p, min_p (set "
                                   "through the old name algo.filter_strategy)"),
    ("filter.metric=reward_variance", "unknown filter.metric 'reward_variance'; valid: reward_std"),
    ("filter.loss_scaling=log", "filter.loss_scaling='log' is not valid; choose one of 'none', 'linear'"),
    ("algo.filter_strategy=min_p", "algo.filter_strategy='min_p' needs a value; set filter.value"),
    ("filter.max_groups=9", "filter.max_groups=9 exceeds rollout.num_groups=4"),
    ("algo.filter_strategy=top_p", "(16 = 4 groups x 4) must be a multiple of batching.mini_batch_size=12"),
    ("train.stop_std_fraction=1.5", "train.stop_std_fraction must be in [0, 1)"),
])
def test_bad_filter_settings_name_the_key(override, message):
    extra = ["batching.mini_batch_size=12"] if override == "algo.filter_strategy=top_p" else []
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config("tiny_cpu.py", [override, *extra])


def test_a_run_saved_before_the_new_keys_resumes(tmp_path):
    cfg = load_config("tiny_cpu.py")
    saved = json.loads(json.dumps(cfg.to_dict(), default=str))
    # The layout runs were saved in before the sections (one algo section, V1 filter knobs), and
    # before the RAGEN-2 / collapse keys existed.
    # GiGPO's options (advantage.options now) were saved as algo.gigpo_* with their defaults.
    old = {name: getattr(GiGPOOptions(), key.split(".", 1)[1]) if key.startswith("options.") else saved[sec].pop(key)
           for name, (sec, key) in LEGACY_ALGO_KEYS.items()}
    assert saved["advantage"].pop("options") == {}
    assert (saved.pop("filter"), saved.pop("advantage"), saved.pop("loss"), saved.pop("batching")) == (
        {"strategy": "top_k", "value": 0.5, "select": "largest"}, {}, {}, {})
    saved["algo"] = {**old, "filter_ratio": 0.5, "filter_mode": "largest", "filter_type": "top_k", "filter_cover": 0.9}
    new_algo = {"filter_strategy", "filter_value", "filter_select", "filter_metric", "filter_include_zero",
                "filter_top_p_mode", "filter_max_groups", "filter_loss_scaling", "soft_advantage_reweight"}
    new_train = {"collapse_every", "collapse_samples", "stop_empty_filter", "stop_std_fraction", "stop_std_window",
                 "stop_val_success", "stop_val_count"}
    for k in new_algo:
        saved["algo"].pop(k, None)
    for k in new_train:
        saved["train"].pop(k)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    check_run_dir_config(tmp_path, cfg, RESUMABLE_CHANGES)  # the same run: no error
    assert config_from_dict(saved).filter.spec == cfg.filter.spec
    with pytest.raises(ConfigError, match="filter.strategy"):
        check_run_dir_config(tmp_path, load_config("tiny_cpu.py", ["filter.strategy=top_p",
                                                                   "batching.mini_batch_size=4"]), RESUMABLE_CHANGES)


# ------------------------------------------------------------------------------------ compiled programs
V, P, N, T = 32, 4, 2, 10


def _trajectories() -> Trajectories:
    rng = np.random.default_rng(0)
    b = P * N
    tokens = rng.integers(1, V, size=(b, T)).astype(np.int32)
    loss_mask = np.zeros((b, T), bool)
    loss_mask[:, 3:8] = True
    reward = np.array([0, 0, 1, 0, 2, -1, 0.5, 0.5], np.float32)  # group stds: 0, .71, 2.12, 0
    z = lambda dt: jnp.zeros((b,), dt)  # noqa: E731
    return Trajectories(
        tokens=jnp.asarray(tokens), length=jnp.full((b,), 8, jnp.int32), loss_mask=jnp.asarray(loss_mask),
        logprobs=jnp.zeros((b, T)), turn_end=jnp.full((b, 1), 7, jnp.int32), turn_reward=jnp.asarray(reward[:, None]),
        reward=jnp.asarray(reward), group=jnp.asarray(np.arange(b) // N, jnp.int32),
        seed=jnp.asarray(np.arange(b) // N, jnp.int32), success=z(bool), action_is_valid=z(bool),
        num_actions=z(jnp.int32), num_effective=z(jnp.int32), num_turns=jnp.ones((b,), jnp.int32),
        num_format_errors=z(jnp.int32), response_length=jnp.full((b,), 5, jnp.int32), truncated=z(bool))


@pytest.fixture(scope="module")
def tiny():
    graph, actor = nnx.split(Qwen2(Qwen2Config.from_preset("tiny").replace(vocab_size=V), rngs=nnx.Rngs(0)))
    return graph, actor, _trajectories()


def _programs(graph, **algo):
    cfg = Config()
    cfg.model.random_init = True
    cfg.model.critic = "none"
    cfg.rollout = dataclasses.replace(cfg.rollout, num_groups=P, group_size=N, max_context=T)
    set_algo(cfg, **{"estimator": "grpo", "mini_batch_size": 2, **algo})
    opt = optax.adamw(1e-2)
    return StepPrograms(StepSettings.of(cfg.validate()), graph, None, opt, opt), opt


def test_empty_selection_takes_no_optimizer_step(tiny):
    graph, actor, traj = tiny
    # min_p with value 2 on the (positive) mean length: nothing reaches 2 x the best score.
    progs, opt = _programs(graph, strategy="min_p", value=2.0, metric="length")
    batch, pm = jax.jit(progs.prepare)(actor, {}, None, traj)
    assert float(pm["rollout/empty_after_filter"]) == 1.0 and float(batch.row_weight.sum()) == 0.0
    state = TrainState(iteration=jnp.zeros((), jnp.int32), key=jax.random.PRNGKey(0), actor=actor,
                       actor_opt=opt.init(actor), critic={}, critic_opt={}, skipped_updates=jnp.zeros((), jnp.int32))
    new, um = jax.jit(progs.update)(state, batch)
    assert float(um["train/optimizer_steps"]) == 0.0
    for a, b in zip(jax.tree.leaves(actor), jax.tree.leaves(new.actor)):
        np.testing.assert_array_equal(a, b)
    # top_p linear 0.5 on these stds keeps only group 2: one mini-batch of its 2 rows trains.
    progs, _ = _programs(graph, strategy="top_p", value=0.5)
    batch, pm = jax.jit(progs.prepare)(actor, {}, None, traj)
    np.testing.assert_array_equal(batch.row_weight, [0, 0, 0, 0, 1, 1, 0, 0])
    _, um = jax.jit(progs.update)(state, batch)
    assert float(um["train/optimizer_steps"]) == 1.0


def test_loss_scaling_and_soft_reweight_scale_the_advantages(tiny):
    graph, actor, traj = tiny
    base, _ = _programs(graph, value=0.5)  # top_k: groups 2 and 1 (stds 2.12, .71)
    b0, _ = jax.jit(base.prepare)(actor, {}, None, traj)
    for scaling, factor in (("linear", 0.5), ("sqrt", 0.5 ** 0.5)):
        progs, _ = _programs(graph, value=0.5, loss_scaling=scaling)
        b, _ = jax.jit(progs.prepare)(actor, {}, None, traj)
        np.testing.assert_allclose(b.advantages, b0.advantages * factor, rtol=1e-6)
    progs, _ = _programs(graph, value=0.5, soft_reweight=True)
    b, _ = jax.jit(progs.prepare)(actor, {}, None, traj)
    # Slots [g2, g1]; the std is the one of the scores before the estimator (reward_norm identity:
    # the raw rewards, as RAGEN's token-level scores): g2 [2, -1] 2.121, g1 [1, 0] 0.707 -> weights 1, 1/3.
    w = np.repeat([1.0 / (1 + 1e-6 / 2.1213), 1 / 3], N)[:, None]
    np.testing.assert_allclose(b.advantages, b0.advantages * w, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------ early stops
def test_early_stop_rules():
    s = EarlyStops(TrainConfig(stop_empty_filter=2))
    assert s.after_iteration({"rollout/empty_after_filter": 1.0}) is None
    assert "2 consecutive" in s.after_iteration({"rollout/empty_after_filter": 1.0}) and s.rule == "empty_filtered_steps"
    s = EarlyStops(TrainConfig(stop_empty_filter=2))
    for e in (1.0, 0.0, 1.0):
        m = {"rollout/empty_after_filter": e}
        assert s.after_iteration(m) is None
    assert m["rollout/consecutive_empty_after_filter_steps"] == 1.0
    # Baseline 1.0 from the first 3 non-empty iterations; then 3 in a row below 0.1 x 1.0.
    s = EarlyStops(TrainConfig(stop_std_fraction=0.1, stop_std_window=3))
    seq = [1.0, 0.5, 1.5, 0.05, 0.2, 0.05, 0.05]
    out = [s.after_iteration({"rollout/in_group_std": v}) for v in seq]
    assert out[:6] == [None] * 6 and s.baseline == pytest.approx(1.0)
    assert s.after_iteration({"rollout/in_group_std": 0.01}) is not None and s.rule == "reward_variance_collapse"
    s = EarlyStops(TrainConfig(stop_val_success=0.01, stop_val_count=2))
    assert s.after_validation({"val/Sokoban/success": 0.0, "val/Sokoban/reward": -1}) is None
    assert s.after_validation({"val/Sokoban/success": 0.5}) is None  # resets
    assert s.after_validation({"val/Sokoban/success": 0.0}) is None
    assert "val/Sokoban/success" in s.after_validation({"val/Sokoban/success": 0.005})
    assert s.rule == "low_validation_success"
    off = EarlyStops(TrainConfig())
    assert all(off.after_iteration({"rollout/empty_after_filter": 1.0, "rollout/in_group_std": 0.0}) is None
               for _ in range(20))
