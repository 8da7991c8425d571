"""TIS, mismatch metrics and GiGPO wired into training.

- the config keys and their one-sentence errors (soft_advantage_reweight GRPO-only, as RAGEN);
- the compiled prepare/update on hand-made trajectories whose sampler log-probs differ from the
  trainer's by chosen amounts: TIS weights, mismatch metrics and the policy loss against values
  computed by hand from those amounts;
- one tiny Sokoban iteration of the Trainer with GiGPO + token TIS: the metrics are logged, the
  float32 sampler and trainer agree (mismatch ~0) where a bf16 sampler (rollout.matmul_dtype) does
  not, and prepare's advantages equal a plain-Python port of verl-agent's GiGPO applied to the state
  keys and rewards the rollout logged.
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import envs_jax
from envs_jax.observation_key import observation_key
from ragen_jax.algorithms.gigpo import GiGPOOptions
from ragen_jax.experiment.config import Config, ConfigError, load_config
from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.rollout import Rollout, Trajectories, group_seeds_for_iteration
from ragen_jax.trainer.rl import Trainer
from ragen_jax.trainer.step import StepPrograms, StepSettings, sequence_logprobs
from tests.ragen_jax.algorithms.ref_gigpo import port_gigpo
from tests.ragen_jax.trainer.algo_knobs import set_algo


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("override, message", [
    ("loss.tis=tokens", "loss.tis='tokens' is not valid; choose one of 'none', 'token', 'sequence'"),
    ("loss.tis_cap=0.5", "loss.tis_cap must be a number >= 1"),
    ("loss.tis_geo_mask=(1.01, 0.99)", "loss.tis_geo_mask must be (low, high) with 0 < low <= 1 <= high"),
    ("loss.tis_geo_mask=(0.99, 1.01)", "loss.tis_geo_mask applies to the TIS weights; set loss.tis"),
    ("advantage.options={'norm': 'mean'}", "advantage.options: norm='mean' is not valid; choose one of 'std', 'none'"),
    ("advantage.options.gamma=1.5", "advantage.options: gamma must be a number in [0, 1]"),
    ("advantage.options.weight=-1", "advantage.options: weight must be a number >= 0"),
    ("advantage.soft_reweight=true", "advantage.soft_reweight works only with advantage.estimator=grpo"),
    ("rollout.matmul_dtype=float16", "rollout.matmul_dtype must be None (the model's), 'float32' or 'bfloat16'"),
])
def test_bad_settings_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        gigpo = ["advantage.estimator=gigpo", "model.critic=none"] if override.startswith("advantage.options") else []
        load_config("tiny_cpu.py", [*gigpo, override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_settings_reach_the_config():
    cfg = load_config("tiny_cpu.py", ["advantage.estimator=gigpo", "loss.tis=sequence", "loss.tis_geo_mask=0.99,1.01",
                                      "advantage.options.norm=none", "advantage.options.gamma=0.9"])
    a = cfg.loss
    assert (a.tis, a.effective_tis_cap, a.tis_geo_mask, cfg.advantage.needs_state_keys) == ("sequence", 5.0, (0.99, 1.01),
                                                                                           True)
    assert cfg.advantage.estimator_options == GiGPOOptions(weight=1.0, norm="none", gamma=0.9)
    assert load_config("tiny_cpu.py").loss.effective_tis_cap == 2.0
    assert load_config("tiny_cpu.py", ["advantage.estimator=grpo", "advantage.soft_reweight=true"])


# ------------------------------------------------------------------------------------ compiled programs
V, P, N, T = 32, 2, 2, 10
# Sampler log-prob = trainer log-prob - D on the sampled target columns 2..6 (tokens 3..7): the log
# ratios r_t = exp(D) of the TIS weights, chosen around the cap 2 (log 2 = 0.693).
D = np.array([[1.0, 0.9, -0.5, 0.0, 0.5], [0.8, -0.1, 0.0, 0.1, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0],
              [-1.0, 0.5, 0.7, 0.05, -0.2]], np.float32)
COLS = slice(2, 7)


def _trajectories(logprobs) -> Trajectories:
    rng = np.random.default_rng(0)
    b = P * N
    loss_mask = np.zeros((b, T), bool)
    loss_mask[:, 3:8] = True
    reward = np.array([1, 0, 2, -1], np.float32)
    z = lambda dt: jnp.zeros((b,), dt)  # noqa: E731
    return Trajectories(
        tokens=jnp.asarray(rng.integers(1, V, size=(b, T)), jnp.int32), length=jnp.full((b,), 8, jnp.int32),
        loss_mask=jnp.asarray(loss_mask), logprobs=jnp.asarray(logprobs, jnp.float32),
        turn_end=jnp.full((b, 1), 7, jnp.int32), turn_reward=jnp.asarray(reward[:, None]), reward=jnp.asarray(reward),
        group=jnp.asarray(np.arange(b) // N, jnp.int32), seed=jnp.asarray(np.arange(b) // N, jnp.int32),
        success=z(bool), action_is_valid=z(bool), num_actions=z(jnp.int32), num_effective=z(jnp.int32),
        num_turns=jnp.ones((b,), jnp.int32), num_format_errors=z(jnp.int32), response_length=jnp.full((b,), 5, jnp.int32),
        truncated=z(bool))


def _programs(graph, **algo):
    cfg = Config()
    cfg.model.random_init = True
    cfg.model.critic = "none"
    cfg.rollout = dataclasses.replace(cfg.rollout, num_groups=P, group_size=N, max_context=T)
    set_algo(cfg, **{"estimator": "grpo", "mini_batch_size": P * N, "value": 1.0, "entropy_coef": 0.0, **algo})
    return StepPrograms(StepSettings.of(cfg.validate()), graph, None, optax.sgd(0.0), optax.sgd(0.0))


@pytest.fixture(scope="module")
def tiny():
    """(graph, actor, trajectories whose sampler log-probs are the trainer's minus D)."""
    graph, actor = nnx.split(Qwen2(Qwen2Config.from_preset("tiny").replace(vocab_size=V), rngs=nnx.Rngs(0)))
    traj = _trajectories(np.zeros((P * N, T)))
    valid = jnp.arange(T)[None, :] < traj.length[:, None]
    old = np.asarray(jax.jit(lambda p: sequence_logprobs(graph, p, traj.tokens, valid)[0])(actor))
    sampler = np.zeros((P * N, T), np.float32)
    sampler[:, 1:] = old
    sampler[:, 1:][:, COLS] -= D
    return graph, actor, _trajectories(sampler)


def _order(batch, traj):
    """The trajectory row of each batch row (the filter orders groups by score)."""
    return [next(j for j in range(P * N) if np.array_equal(batch.tokens[i], traj.tokens[j])) for i in range(P * N)]


def test_token_tis_weights_metrics_and_loss_by_hand(tiny):
    graph, actor, traj = tiny
    progs = _programs(graph, tis="token")
    batch, m = jax.jit(progs.prepare)(actor, {}, None, traj)
    d = D[_order(batch, traj)]
    want = np.zeros(batch.old_logp.shape, np.float32)
    want[:, COLS] = np.minimum(np.exp(d), 2.0)
    np.testing.assert_allclose(batch.tis_weight, want, rtol=1e-5, atol=1e-6)
    assert float(m["mismatch/logp_abs_diff_mean"]) == pytest.approx(np.abs(D).mean(), rel=1e-4)
    assert float(m["mismatch/logp_abs_diff_max"]) == pytest.approx(1.0, rel=1e-4)
    assert float(m["mismatch/ratio_above_cap"]) == pytest.approx(np.mean(D > math.log(2.0)))
    k3 = np.exp(D) - 1 - D  # r - 1 - log r, r = exp(trainer - sampler)
    assert float(m["mismatch/k3_kl"]) == pytest.approx(k3.mean(), rel=1e-4)
    assert float(m["tis/weight_mean"]) == pytest.approx(want[:, COLS].mean(), rel=1e-5)
    # First step of the update: the current policy is the old one (ratio 1, inside the clip), so the
    # token-mean loss is -sum(A w) / #tokens; entropy_coef 0.
    (loss, _), _ = jax.jit(progs.actor_value_and_grad)(actor, batch)
    adv = np.asarray(batch.advantages)[:, COLS]
    assert float(loss) == pytest.approx(-(adv * want[:, COLS]).sum() / adv.size, rel=1e-4, abs=1e-6)
    plain, _ = jax.jit(_programs(graph).prepare)(actor, {}, None, traj)
    assert plain.tis_weight is None
    (loss0, _), _ = jax.jit(_programs(graph).actor_value_and_grad)(actor, plain)
    assert float(loss0) == pytest.approx(-adv.sum() / adv.size, rel=1e-4, abs=1e-6)


def test_sequence_tis_with_geometric_mask_by_hand(tiny):
    graph, actor, traj = tiny
    batch, m = jax.jit(_programs(graph, tis="sequence", tis_geo_mask=(0.9, 1.1)).prepare)(actor, {}, None, traj)
    order = _order(batch, traj)
    seq = np.minimum(np.exp(D.sum(axis=1)), 5.0)  # row 0: exp(1.9) = 6.7, capped at 5
    geo = np.exp(D.mean(axis=1))
    keep = (geo >= 0.9) & (geo <= 1.1)  # rows 2 (exactly 1) and 3 (exp(0.01))
    assert keep.tolist() == [False, False, True, True]
    np.testing.assert_allclose(np.asarray(batch.tis_weight)[:, COLS], np.repeat((seq * keep)[order, None], 5, 1),
                               rtol=1e-5)
    assert float(m["tis/geo_masked_fraction"]) == 0.5
    assert float(m["tis/capped_fraction"]) == 0.25


# ------------------------------------------------------------------------------------ the Trainer
TINY = ["model.preset=tiny", "model.random_init=true", "model.vocab=task", "model.dtype=float32",
        "model.critic=none", "rollout.cache_dtype=float32", "rollout.num_groups=2", "rollout.group_size=4",
        "rollout.max_context=512", "prompt.max_turns=3", "prompt.max_response_tokens=8", "filter.value=1.0",
        "batching.mini_batch_size=8", "advantage.estimator=gigpo", "advantage.options.gamma=0.9", "loss.tis=token",
        "train.iterations=1", "train.val_every=0", "train.log_samples=0", "train.collapse_every=0", "mesh.data=1"]


@pytest.fixture(scope="module")
def gigpo_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("gigpo")
    trainer = Trainer(load_config("tiny_cpu.py", TINY), wd, quiet=True)
    (hist,) = trainer.train()
    # The same compiled rollout and prepare as the iteration, on the next iteration's batch.
    cfg = trainer.cfg
    seeds = group_seeds_for_iteration(1, cfg.rollout.num_groups, cfg.train.seed_base)
    traj = trainer.rollout(trainer.actor_params, jax.random.fold_in(trainer.state.key, 1), seeds)
    batch, pm = trainer.prepare_fn(trainer.state.actor, trainer.state.critic, trainer.ref, traj)
    # The same batch sampled with bf16 matmul operands (rollout.matmul_dtype), scored by the float32 trainer.
    bf16 = Rollout(trainer.policy, trainer.text_env, dataclasses.replace(cfg.rollout, matmul_dtype="bfloat16"),
                   mesh=trainer.mesh, vocab=trainer.vocab, state_keys=True)
    traj16 = bf16(trainer.actor_params, jax.random.fold_in(trainer.state.key, 1), seeds)
    _, pm16 = trainer.prepare_fn(trainer.state.actor, trainer.state.critic, trainer.ref, traj16)
    return wd, hist, jax.device_get(traj), jax.device_get(batch), jax.device_get((pm, pm16)), seeds


def test_gigpo_tis_iteration_logs_and_float32_sampler_agrees(gigpo_run):
    wd, hist, *_ = gigpo_run
    keys = ("mismatch/logp_abs_diff_mean", "mismatch/logp_abs_diff_max", "mismatch/k3_kl", "mismatch/ratio_above_cap",
            "tis/weight_mean", "tis/capped_fraction", "gigpo/anchor_groups_per_group", "gigpo/shared_turn_fraction",
            "gigpo/step_advantage_std")
    logged = json.loads((wd / "metrics.jsonl").read_text().splitlines()[-1])
    for k in keys:
        assert k in hist and math.isfinite(hist[k]) and k in logged, k
    # float32 sampling (KV cache, decode path) and the trainer's full forward: the same log-probs.
    assert hist["mismatch/logp_abs_diff_max"] < 1e-3
    assert hist["mismatch/ratio_above_cap"] == 0.0 and hist["tis/weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert 1.0 <= hist["gigpo/anchor_groups_per_group"] <= 3 * 4


def test_bf16_sampler_is_measured_as_a_mismatch(gigpo_run):
    *_, (pm, pm16), _ = gigpo_run
    f32, b16 = float(pm["mismatch/logp_abs_diff_mean"]), float(pm16["mismatch/logp_abs_diff_mean"])
    assert b16 > 1e-4 and b16 > 10 * f32, (f32, b16)
    assert float(pm16["mismatch/k3_kl"]) > float(pm["mismatch/k3_kl"])
    assert float(pm16["tis/weight_mean"]) != 1.0


def test_rollout_records_the_observation_keys(gigpo_run):
    _, _, traj, _, _, seeds = gigpo_run
    env, params = envs_jax.make("Sokoban")
    b, k = traj.turn_start.shape
    assert traj.state_key.shape[:2] == (b, k) and traj.state_key.dtype == np.int32
    first_key = jax.jit(lambda seed: observation_key(env, env.reset_env(jax.random.PRNGKey(seed), params)[1], params))
    for row in range(b):  # turn 1 acts on the group's reset state
        np.testing.assert_array_equal(traj.state_key[row, 0], first_key(int(seeds[row // 4])))
    assert np.all(traj.state_key[traj.turn_start < 0] == -1)  # turns not taken


def test_gigpo_advantages_equal_the_verl_agent_port(gigpo_run):
    _, _, traj, batch, (pm, _), _ = gigpo_run
    n = 4
    turn_end = np.where(traj.turn_end >= 1, traj.turn_end - 1, -1)  # target coordinates, as prepare
    episodes = []
    for row in range(traj.tokens.shape[0]):
        turns = [(tuple(traj.state_key[row, j]), float(traj.turn_reward[row, j]))
                 for j in range(turn_end.shape[1]) if turn_end[row, j] >= 0]
        episodes.append((row // n, float(traj.reward[row]), turns))
    want = port_gigpo(episodes, 0.9, 1.0, remove_std=False)
    # filter_ratio 1 keeps every group, in the filter's slot order: find each slot's group.
    shared = 0
    for slot in range(batch.tokens.shape[0] // n):
        rows = slice(slot * n, (slot + 1) * n)
        (g,) = [g for g in range(traj.tokens.shape[0] // n)
                if np.array_equal(batch.tokens[rows], traj.tokens[g * n:(g + 1) * n])]
        for i in range(n):
            row, src = slot * n + i, g * n + i
            ends = [e for e in turn_end[src] if e >= 0]
            assert len(ends) == len(want[src])
            for e, w in zip(ends, want[src]):
                assert batch.advantages[row, e] == pytest.approx(w, rel=1e-4, abs=1e-4)
            assert np.all(batch.advantages[row][~batch.mask[row]] == 0)
        keys = [tuple(traj.state_key[g * n + i, j]) for i in range(n) for j in range(turn_end.shape[1])
                if turn_end[g * n + i, j] >= 0]
        shared += sum(keys.count(x) > 1 for x in keys)
    assert shared > 0  # the case GiGPO adds to GRPO: turns in an anchor group of size > 1
    assert float(pm["gigpo/shared_turn_fraction"]) == pytest.approx(shared / np.sum(turn_end >= 0))
