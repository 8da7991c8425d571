"""Evaluation: a policy on a suite of environments with fixed initial states (behaviour spec section 7).

    policy, params, tokenizer, prompt = load_for_eval("runs/sokoban")     # evaluation/policies.py
    results = evaluate(policy, params, tokenizer, ("Sokoban", "FrozenLake"), prompt=prompt)
    print(format_table(results)); write_eval_json(results, "eval.json")

Per environment, one compiled `Rollout` with P = num_states initial states (seeds seed_start ..) and
N = rollouts_per_state episodes each. The compiled rollouts are cached per (policy graph, tokenizer,
env, settings), so evaluating new parameters of the same policy (the Trainer's validation, or a
sweep over checkpoints) never recompiles: the evaluation is a pure function of `params`, and nothing
leaves the device until the rollout is over.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import jax
import numpy as np
from flax import nnx

import envs_jax
from ragen_jax.rollout import Rollout, RolloutConfig, format_trajectory, rollout_metrics
from ragen_jax.rollout.metrics import host_copy
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.experiment.build import prompt_for_env
from ragen_jax.experiment.config import Config
from ragen_jax.evaluation.policies import EvalError

DEFAULT_SUITE = envs_jax.default_eval_suite()
# The per-env numbers of the table, in column order (pass@k is inserted after format_ok).
TABLE_METRICS = ("success", "reward_mean", "action_is_valid", "action_is_effective", "num_actions",
                 "response_length", "format_ok")



# ------------------------------------------------------------------------------------- evaluation
def check_env_names(envs: Sequence[str]) -> tuple[str, ...]:
    """The names as registered (case-insensitive match); EvalError naming the valid ones otherwise."""
    valid = envs_jax.registered_envs()
    by_lower = {v.lower(): v for v in valid}
    out = []
    for e in envs:
        name = by_lower.get(str(e).strip().lower())
        if name is None:
            raise EvalError(f"unknown environment {e!r}; valid: {', '.join(valid)}")
        out.append(name)
    if not out:
        raise EvalError(f"no environments to evaluate; valid: {', '.join(valid)}")
    return tuple(out)


# Compiled rollouts keyed by everything that shapes the program. The policy enters by its graph
# (nnx GraphDef: structure and static config, no numbers), so a freshly loaded checkpoint of the same
# model reuses the compiled program. Bounded: the oldest entries go first.
_ROLLOUTS: "collections.OrderedDict" = collections.OrderedDict()
MAX_CACHED_ROLLOUTS = 32


def get_rollout(policy, tokenizer, env_name: str, *, num_states: int, rollouts_per_state: int, temperature: float,
                greedy: bool, prompt=None, max_context: int = 3600, env_overrides: Optional[dict] = None,
                mesh=None, cache_dtype: Optional[str] = None, vocab=None) -> Rollout:
    """The cached compiled evaluation rollout of one env (built on first use)."""
    pc = prompt_for_env(prompt if prompt is not None else PromptConfig(), env_name)
    overrides = dict(env_overrides or {})
    rc = RolloutConfig(num_groups=num_states, group_size=rollouts_per_state, max_context=max_context,
                       temperature=temperature, greedy=greedy, cache_dtype=cache_dtype)
    graphdef = nnx.split(policy)[0]
    # A vocabulary map by content: reloading the same run gives a new but equal map.
    vocab_key = None if vocab is None else hashlib.sha1(np.asarray(vocab.to_qwen).tobytes()).hexdigest()
    key = (graphdef, env_name, repr(sorted(overrides.items())), dataclasses.astuple(pc), dataclasses.astuple(rc),
           id(tokenizer), id(mesh), vocab_key)
    hit = _ROLLOUTS.get(key)
    # ids are only unique among live objects: the entry keeps the objects themselves to compare.
    if hit is not None and all(a is b for a, b in zip(hit[1], (tokenizer, mesh))):
        _ROLLOUTS.move_to_end(key)
        return hit[0]
    env, env_params = envs_jax.make(env_name, **overrides)
    ro = Rollout(policy, TextEnv(env, env_params, tokenizer, pc), rc, mesh=mesh, vocab=vocab)
    _ROLLOUTS[key] = (ro, (tokenizer, mesh))
    while len(_ROLLOUTS) > MAX_CACHED_ROLLOUTS:
        _ROLLOUTS.popitem(last=False)
    return ro


def episode_metrics(traj, rollouts_per_state: int, env_name: str = "") -> dict:
    """Per-env evaluation numbers from one rollout's trajectories (host floats)."""
    traj = host_copy(traj)  # gathered from every process when the batch spans several
    m = rollout_metrics(traj, rollouts_per_state)
    success = np.asarray(traj.success, bool)
    out = {k: m[k] for k in TABLE_METRICS}
    out[f"pass@{rollouts_per_state}"] = float(success.reshape(-1, rollouts_per_state).any(axis=1).mean())
    for k in ("num_turns", "truncated", "reward_std"):
        out[k] = m[k]
    out["num_episodes"] = int(success.size)
    out["num_states"] = int(success.size // rollouts_per_state)
    # Per initial state (seed order), so two evaluations on the same states can be compared pairwise.
    out["state_success"] = success.reshape(-1, rollouts_per_state).mean(axis=1).tolist()
    alias = envs_jax.get_spec(env_name).success_alias if env_name in envs_jax.registered_envs() else ""
    if alias:  # e.g. Bandit's success is "chose the high-risk arm": high_arm_rate
        out[alias] = out["success"]
    return out


def pool_repeats(trajs: list, num_states: int, rollouts_per_state: int):
    """Host trajectories of R runs of one rollout program on the same states -> one batch whose rows
    are ordered by state, then run, then rollout (as one run with R x rollouts_per_state would be)."""
    if len(trajs) == 1:
        return trajs[0]
    batch = num_states * rollouts_per_state

    def pool(*leaves):
        a = np.stack([np.asarray(x) for x in leaves])  # (R, P*N, ...)
        if a.ndim < 2 or a.shape[1] != batch:
            return np.asarray(leaves[0])  # not per episode
        a = a.reshape(len(leaves), num_states, rollouts_per_state, *a.shape[2:]).swapaxes(0, 1)
        return a.reshape(num_states * len(leaves) * rollouts_per_state, *a.shape[3:])

    return jax.tree.map(pool, *trajs)


def evaluate(policy, params, tokenizer, envs: Sequence[str] = DEFAULT_SUITE, *, num_states: int = 256,
             seed_start: int = 123, rollouts_per_state: int = 1, repeats: int = 1, temperature: float = 0.5,
             greedy: bool = False,
             prompt=None, max_context: int = 3600, transcripts: int = 0, mesh=None, key=None,
             env_overrides: Optional[dict] = None, cache_dtype: Optional[str] = None, vocab=None,
             progress: Optional[Callable[[str, str, Optional[dict]], None]] = None) -> dict:
    """Evaluate `params` of `policy` on each env of `envs`; returns {env: metrics}.

    Initial states are the fixed seeds seed_start .. seed_start + num_states - 1 (the reference's
    validation set: 256 states from 123, one rollout each, temperature 0.5). `key` (default
    PRNGKey(0)) drives sampling and env randomness, the same for every env. `repeats` R > 1 runs the
    same compiled rollout R times (keys: `key` itself, then fold_in(key, r)) and pools the episodes,
    so every state gets R x rollouts_per_state samples at the memory of one run (the first run is
    the R = 1 evaluation itself; metrics and pass@k are the pooled batch's). `prompt`: PromptConfig;
    Single-action envs (Bandit) always get one turn with one action (`prompt_for_env`). `env_overrides`:
    {env name: parameter overrides for envs_jax.make}. `vocab`: the VocabMap of a small-vocabulary
    model (`LoadedPolicy.vocab`). `transcripts`: that many sample conversations
    per env (format_trajectory) under "transcripts". `progress(env, "start"|"done", metrics)` is
    called around each env. Metrics per env: success, reward_mean, action_is_valid,
    action_is_effective, num_actions, response_length, format_ok, pass@k (k = rollouts_per_state:
    the fraction of states with at least one success), num_turns, truncated, reward_std,
    num_episodes, num_states, seconds, state_success (per state in seed order: the fraction of its
    rollouts that succeeded; a list, left out of flat_metrics); an env record's success_alias repeats
    success under that name (Bandit: high_arm_rate).
    """
    names = check_env_names(envs)
    for what, v in (("num_states", num_states), ("rollouts_per_state", rollouts_per_state),
                    ("repeats", repeats), ("max_context", max_context)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise EvalError(f"{what} must be a positive integer, got {v!r}")
    if transcripts < 0:
        raise EvalError(f"transcripts must be >= 0, got {transcripts!r}")
    if not greedy and not temperature > 0:
        raise EvalError(f"temperature must be > 0 when sampling (or use greedy), got {temperature!r}")
    key = jax.random.PRNGKey(0) if key is None else key
    seeds = np.arange(seed_start, seed_start + num_states, dtype=np.int64)
    if seeds[-1] > np.iinfo(np.int32).max or seeds[0] < 0:
        raise EvalError(f"seeds {seed_start}..{seeds[-1]} do not fit in int32")
    results = {}
    for name in names:
        if progress is not None:
            progress(name, "start", None)
        try:
            ro = get_rollout(policy, tokenizer, name, num_states=num_states, rollouts_per_state=rollouts_per_state,
                             temperature=temperature, greedy=greedy, prompt=prompt, max_context=max_context,
                             env_overrides=(env_overrides or {}).get(name), mesh=mesh, cache_dtype=cache_dtype,
                             vocab=vocab)
        except ValueError as e:  # settings that cannot work for this env (context too small, mesh, ...)
            raise EvalError(f"{name}: {e}") from None
        t0 = time.perf_counter()
        # Gathered from every process when the episodes are sharded over several (all take part).
        trajs = [host_copy(ro(params, key if r == 0 else jax.random.fold_in(key, r), seeds.astype(np.int32)))
                 for r in range(repeats)]
        traj = pool_repeats(trajs, num_states, rollouts_per_state)
        m = episode_metrics(traj, rollouts_per_state * repeats, name)
        m["seconds"] = time.perf_counter() - t0
        if transcripts:
            m["transcripts"] = [format_trajectory(traj, r, tokenizer)
                                for r in range(min(transcripts, num_states * rollouts_per_state * repeats))]
        results[name] = m
        if progress is not None:
            progress(name, "done", m)
    return results


def validate_run(cfg: Config, policy, params, tokenizer, *, mesh=None, vocab=None) -> dict:
    """A training run's validation (RL and SFT alike): the validation set `cfg.env.validation_set`
    (`env.val_set`: environments with their number of states; default `train.val_size` states of each
    training env - the envs of `env.mix` - and of `env.val_envs`), fixed states from `train.val_seed`,
    one rollout each at `train.val_temperature`; flat `val/<Env>/<metric>` numbers plus
    `timing/validation_s`. Each env runs its own compiled rollout (cached: compiled once)."""
    t0 = time.perf_counter()
    results = {}
    for name, size in cfg.env.validation_set(cfg.train.val_size):
        results.update(evaluate(
            policy, params, tokenizer, [name], num_states=size, seed_start=cfg.train.val_seed,
            temperature=cfg.train.val_temperature, prompt=cfg.prompt, max_context=cfg.rollout.max_context, mesh=mesh,
            key=jax.random.PRNGKey(cfg.train.seed + 7), env_overrides={name: cfg.env.overrides_for(name)},
            cache_dtype=cfg.rollout.cache_dtype, vocab=vocab))
    out = flat_metrics(results)
    out["timing/validation_s"] = time.perf_counter() - t0
    return out


def log_validation(trainer, step: int) -> dict:
    """Validate, log the metrics at `step` and print one line; shared by the RL and SFT trainers
    (anything with `validate()`, `logger` and `note`: a `RunAssembly`)."""
    m = trainer.validate()
    trainer.logger.scalars(step, m)
    summary = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in m.items() if k.endswith("/success"))
    trainer.note(f"validation @ step {step}: success {summary}")
    return m


# ------------------------------------------------------------------------------------- output
def flat_metrics(results: dict, prefix: str = "val") -> dict[str, float]:
    """{"{prefix}/{env}/{metric}": value} for the numeric metrics (the Trainer's validation log keys)."""
    return {f"{prefix}/{env}/{k}": float(v) for env, m in results.items() for k, v in m.items()
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and k != "seconds"}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _jsonable(dataclasses.asdict(x))
    return x


def write_eval_json(results: dict, path: str | Path, settings: Optional[dict] = None, *,
                    extra: Optional[dict] = None) -> Path:
    """Write {"settings": ..., "results": {env: metrics}, **extra} (atomically: a temp file, then a
    rename); `extra`: further top-level entries (the demo's "k_sample" results)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"settings": _jsonable(settings or {}), "results": _jsonable(results)}
    for k, v in (extra or {}).items():
        if k in doc:
            raise ValueError(f"write_eval_json: extra entry {k!r} would replace the file's own {k!r}")
        doc[k] = _jsonable(v)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def format_table(results: dict) -> str:
    """A fixed-width table, one row per env, one column per metric (pass@k included)."""
    if not results:
        return "(no environments evaluated)"
    pass_keys = sorted({k for m in results.values() for k in m if k.startswith("pass@")})
    cols = list(TABLE_METRICS) + pass_keys + ["num_episodes"]
    headers = {"success": "success", "reward_mean": "reward", "action_is_valid": "valid",
               "action_is_effective": "effective", "num_actions": "actions", "response_length": "resp_len",
               "format_ok": "format_ok", "num_episodes": "episodes"}
    name_w = max(len("env"), *(len(n) for n in results))
    widths = [max(len(headers.get(c, c)), 9) for c in cols]

    def cell(v, w):
        if v is None:
            return "-".rjust(w)
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            return str(int(v)).rjust(w)
        return f"{float(v):.3f}".rjust(w)

    lines = ["env".ljust(name_w) + "  " + "  ".join(headers.get(c, c).rjust(w) for c, w in zip(cols, widths))]
    lines.append("-" * len(lines[0]))
    for name, m in results.items():
        lines.append(name.ljust(name_w) + "  " + "  ".join(cell(m.get(c), w) for c, w in zip(cols, widths)))
    return "\n".join(lines)


__all__ = ["pool_repeats", "validate_run", "log_validation", "DEFAULT_SUITE", "check_env_names", "episode_metrics",
           "evaluate", "flat_metrics", "format_table", "get_rollout", "write_eval_json"]
