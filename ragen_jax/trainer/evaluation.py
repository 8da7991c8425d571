"""Evaluation: a policy on a suite of environments with fixed initial states (behaviour spec section 7).

    policy, params, tokenizer, prompt = load_for_eval("runs/sokoban")     # or an HF dir, or "preset:tiny"
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
import orbax.checkpoint as ocp
from flax import nnx

import envs_jax
from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.models.lora import LoRAParam
from ragen_jax.models.gguf import is_gguf, resolve_model_path
from ragen_jax.models.qwen2.weights import from_pretrained, read_config
from ragen_jax.models.vocab_map import VocabMap
from ragen_jax.rollout import Rollout, RolloutConfig, format_trajectory, rollout_metrics
from ragen_jax.rollout.metrics import host_copy
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.text.tokenizer import load_tokenizer
from ragen_jax.trainer.checkpoint import POLICY_DIR, CheckpointError, load_policy_params
from ragen_jax.trainer.config import Config, ConfigError, config_from_dict
from ragen_jax.trainer.setup import (build_policy, build_text_envs, build_vocab,
                                     init_policy_params, load_task_tokenizer, prompt_for_env)

DEFAULT_SUITE = envs_jax.default_eval_suite()
# The per-env numbers of the table, in column order (pass@k is inserted after format_ok).
TABLE_METRICS = ("success", "reward_mean", "action_is_valid", "action_is_effective", "num_actions",
                 "response_length", "format_ok")


class EvalError(ValueError):
    """A problem with the evaluation's input, as one readable sentence."""


class LoadedPolicy(tuple):
    """(policy, params, tokenizer, prompt), plus `.vocab`: the run's VocabMap when its model has a
    small task vocabulary (model.vocab='task'), else None; pass it on as `evaluate(..., vocab=)`."""

    def __new__(cls, policy, params, tokenizer, prompt, vocab=None):
        self = super().__new__(cls, (policy, params, tokenizer, prompt))
        self.vocab = vocab
        return self

    policy = property(lambda self: self[0])  # flax.nnx module (its graph; the numbers are `params`)
    params = property(lambda self: self[1])  # nnx.State of the policy
    tokenizer = property(lambda self: self[2])
    prompt = property(lambda self: self[3])  # PromptConfig: the run's (defaults for an HF dir or a preset)


# ------------------------------------------------------------------------------------- loading
def _is_run_dir(p: Path) -> bool:
    """A Trainer/SFT run directory: its config.json is a ragen_jax Config (not an HF model config)."""
    if (p / "policy").is_dir() or (p / "checkpoints").is_dir():
        return True
    try:
        d = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and isinstance(d.get("model"), dict) and "algo" in d


def _qwen_config(cfg: Config, vocab=None):
    m = cfg.model
    if vocab is not None:  # a small task vocabulary exists only for random-init presets (build_policy)
        return Qwen2Config.from_preset(m.preset).replace(dtype=m.dtype, param_dtype=m.param_dtype,
                                                         vocab_size=vocab.size)
    if m.path is not None:
        if not Path(m.path).expanduser().is_dir():
            raise EvalError(f"the run's base model directory {m.path!r} (model.path in its config.json) does not "
                            "exist here; it is needed for the model's shapes and tokenizer")
        return read_config(str(Path(m.path).expanduser()), dtype=m.dtype, param_dtype=m.param_dtype)
    return Qwen2Config.from_preset(m.preset).replace(dtype=m.dtype, param_dtype=m.param_dtype)


def _committed(policy):
    """The policy's params committed to this process's first device, as restored checkpoints are: jit
    keys its compiled programs on committed-ness too, so every source then shares one compilation.
    (Several processes: each holds its own copy; `launch/eval.py` spreads it over a mesh.)"""
    params = jax.device_put(nnx.state(policy), jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))
    nnx.update(policy, params)  # the module holds the same arrays (no second copy alive)
    return params


def _abstract_policy(qcfg):
    """The policy's graph and a ShapeDtypeStruct tree of its state, without allocating weights."""
    abstract = nnx.eval_shape(lambda: Qwen2(qcfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # this process's (several may run)
    # Orbax restores onto the shardings of the target; a single device unless the caller re-places.
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)
    return graphdef, like


def _restore_actor_from_checkpoints(ckpt_dir: Path, like):
    """The policy's trained parameters (an RL run's `actor`, an SFT run's `params`; with LoRA: the
    adapters) of the latest complete checkpoint, nothing else restored."""
    mngr = ocp.CheckpointManager(ckpt_dir.resolve(), options=ocp.CheckpointManagerOptions(create=False))
    step = mngr.latest_step()
    if step is None:
        raise CheckpointError(f"{ckpt_dir} holds no complete checkpoint")
    try:
        saved = json.loads((ckpt_dir / str(step) / "state" / "_METADATA").read_text())["tree_metadata"]
        field = "params" if not any("'actor'" in k for k in saved) and any("'params'" in k for k in saved) else "actor"
        # A partial restore: the optimizer states and the critic are never read (memory: 1x the policy).
        item = {field: like}
        restore_args = jax.tree.map(
            lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, global_shape=x.shape, dtype=x.dtype), item)
        out = mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)))
    except Exception as e:  # orbax raises many types; the user needs the path and the reason
        raise CheckpointError(f"checkpoint {ckpt_dir / str(step)} cannot be restored ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else 'no detail'}); it may be corrupt or "
                              "from a different model") from None
    finally:
        mngr.close()
    return out["state"][field]


def _restore_lora_from_checkpoints(ckpt_dir: Path, config: Config, vocab):
    """(graphdef, params) of a LoRA run that has only checkpoints/ (interrupted before its exports):
    its checkpoints hold the adapters alone, so the frozen base is rebuilt as the run built it
    (`model.path`, or the preset's seeded initialisation, then `model.init_from`) and the latest
    adapters go on top."""
    policy = build_policy(config, vocab)
    graphdef, params = nnx.split(policy)
    params = init_policy_params(config, graphdef, params)
    adapters, base = nnx.split_state(params, LoRAParam, ...)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), adapters)
    trained = _restore_actor_from_checkpoints(ckpt_dir, like)
    return graphdef, nnx.merge_state(trained, jax.device_put(base, device))


def _load_run_dir(p: Path, config: Optional[Config]):
    if config is None:
        try:
            config = config_from_dict(json.loads((p / "config.json").read_text()))
        except FileNotFoundError:
            raise EvalError(f"{p} has no config.json; a run directory needs the config its Trainer wrote") from None
        except (ValueError, TypeError) as e:
            raise EvalError(f"{p / 'config.json'} is not a readable run config ({e})") from None

    tokenizer = load_task_tokenizer(config)
    vocab = _run_vocab(p, config, tokenizer)
    qcfg = _qwen_config(config, vocab)
    graphdef, like = _abstract_policy(qcfg)
    if (p / POLICY_DIR).is_dir():  # a LoRA run's export is the merged policy: plain weights
        params = load_policy_params(p, like)
    elif (p / "checkpoints").is_dir() and config.model.lora_rank:
        graphdef, params = _restore_lora_from_checkpoints(p / "checkpoints", config, vocab)
    elif (p / "checkpoints").is_dir():
        params = _restore_actor_from_checkpoints(p / "checkpoints", like)
    else:
        raise EvalError(f"{p} has neither a policy export ({POLICY_DIR}/) nor checkpoints/; was the run started?")
    policy = nnx.merge(graphdef, params)
    return LoadedPolicy(policy, params, tokenizer, dataclasses.replace(config.prompt), vocab), config


def _run_vocab(p: Path, config: Config, tokenizer):
    """The run's task vocabulary: its vocab.json, else rebuilt from the config (deterministic)."""
    if getattr(config.model, "vocab", "full") != "task":
        return None

    if (p / "vocab.json").is_file():
        try:
            return VocabMap.load(p / "vocab.json")
        except (ValueError, KeyError, TypeError) as e:
            raise EvalError(f"{p / 'vocab.json'} is not a readable vocabulary map ({e})") from None
    return build_vocab(config, build_text_envs(config, tokenizer), tokenizer)


def _load_hf_dir(p: Path, config: Optional[Config], dtype: Optional[str] = None):
    param_dtype = dtype
    if dtype is None:
        dtype = config.model.dtype if config is not None else "float32"
        param_dtype = config.model.param_dtype if config is not None else dtype
    policy = from_pretrained(str(p), dtype=dtype, param_dtype=param_dtype)
    has_tok = any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    tokenizer = load_tokenizer(str(p) if has_tok else None)
    prompt = dataclasses.replace(config.prompt) if config is not None else PromptConfig()
    return LoadedPolicy(policy, _committed(policy), tokenizer, prompt), None


def _load_preset(name: str, config: Optional[Config], dtype: Optional[str] = None, seed: int = 0):
    try:
        qcfg = Qwen2Config.from_preset(name)
    except ValueError as e:
        raise EvalError(str(e)) from None
    if config is not None:
        qcfg = qcfg.replace(dtype=config.model.dtype, param_dtype=config.model.param_dtype)
    if dtype is not None:
        qcfg = qcfg.replace(dtype=dtype, param_dtype=dtype)
    policy = Qwen2(qcfg, rngs=nnx.Rngs(seed))
    prompt = dataclasses.replace(config.prompt) if config is not None else PromptConfig()
    return LoadedPolicy(policy, _committed(policy), load_tokenizer(), prompt), None


def load_source(source: str | Path, config: Optional[Config] = None, *,
                dtype: Optional[str] = None) -> tuple[LoadedPolicy, Optional[Config]]:
    """`load_for_eval`, plus the run's Config when `source` is a run directory (else None)."""
    s = str(source)
    if s.startswith("preset:"):
        return _load_preset(s[len("preset:"):], config, dtype)
    p = Path(s).expanduser()
    if is_gguf(p):
        p = Path(resolve_model_path(p))  # a .gguf checkpoint: its cached HF directory
    if not p.exists():
        raise EvalError(f"model directory {s} does not exist (give a run directory, a Hugging Face model "
                        "directory or preset:NAME)")
    if not p.is_dir():
        raise EvalError(f"{s} is not a directory (give a run directory, a Hugging Face model directory or preset:NAME)")
    try:
        if _is_run_dir(p):
            return _load_run_dir(p, config)
        if (p / "config.json").is_file():
            return _load_hf_dir(p, config, dtype)
    except CheckpointError as e:
        raise EvalError(str(e)) from None
    except (FileNotFoundError, ConfigError) as e:
        raise EvalError(str(e)) from None
    raise EvalError(f"{s} is neither a run directory (config.json + policy/ or checkpoints/) nor a Hugging Face "
                    "model directory (config.json + safetensors)")


def load_for_eval(source: str | Path, config: Optional[Config] = None, *, dtype: Optional[str] = None) -> LoadedPolicy:
    """(policy, params, tokenizer, prompt settings) from one of:

    * a training/SFT run directory (config.json written by the Trainer and the `policy/` export, or
      only `checkpoints/`: then the actor of the latest complete checkpoint is restored alone),
    * a Hugging Face model directory (config.json + safetensors; its tokenizer if it has one, else
      the built-in Qwen2.5 tokenizer),
    * `preset:NAME` (e.g. `preset:tiny`): a randomly initialised model, for smoke tests.

    `config`: optional Config whose model dtypes and prompt settings are used (for a run directory it
    replaces the saved config). `dtype` ("float32"/"bfloat16"): compute and storage dtype for an HF
    directory or a preset (a run directory keeps its own). Raises EvalError with one sentence for
    any unusable source.
    """
    return load_source(source, config, dtype=dtype)[0]


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


def evaluate(policy, params, tokenizer, envs: Sequence[str] = DEFAULT_SUITE, *, num_states: int = 256,
             seed_start: int = 123, rollouts_per_state: int = 1, temperature: float = 0.5, greedy: bool = False,
             prompt=None, max_context: int = 3600, transcripts: int = 0, mesh=None, key=None,
             env_overrides: Optional[dict] = None, cache_dtype: Optional[str] = None, vocab=None,
             progress: Optional[Callable[[str, str, Optional[dict]], None]] = None) -> dict:
    """Evaluate `params` of `policy` on each env of `envs`; returns {env: metrics}.

    Initial states are the fixed seeds seed_start .. seed_start + num_states - 1 (the reference's
    validation set: 256 states from 123, one rollout each, temperature 0.5). `key` (default
    PRNGKey(0)) drives sampling and env randomness, the same for every env. `prompt`: PromptConfig;
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
                    ("max_context", max_context)):
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
        traj = host_copy(ro(params, key, seeds.astype(np.int32)))
        m = episode_metrics(traj, rollouts_per_state, name)
        m["seconds"] = time.perf_counter() - t0
        if transcripts:
            m["transcripts"] = [format_trajectory(traj, r, tokenizer)
                                for r in range(min(transcripts, num_states * rollouts_per_state))]
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
    (anything with `validate()`, `logger` and `_print`)."""
    m = trainer.validate()
    trainer.logger.scalars(step, m)
    summary = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in m.items() if k.endswith("/success"))
    trainer._print(f"validation @ step {step}: success {summary}")
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


def write_eval_json(results: dict, path: str | Path, settings: Optional[dict] = None) -> Path:
    """Write {"settings": ..., "results": {env: metrics}} (atomically: a temp file, then a rename)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"settings": _jsonable(settings or {}), "results": _jsonable(results)}
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


__all__ = ["validate_run", "log_validation", "DEFAULT_SUITE", "EvalError", "LoadedPolicy", "check_env_names", "episode_metrics",
           "evaluate", "flat_metrics", "format_table", "get_rollout", "load_for_eval", "load_source", "write_eval_json"]
