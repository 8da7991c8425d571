"""Policies to evaluate, from three kinds of source: a run directory (its policy export, or its last
checkpoint when the run has not finished), a Hugging Face Qwen2 directory, or a random preset.

    policy, params, tokenizer, prompt = load_for_eval("runs/sokoban")     # or an HF dir, or "preset:tiny"

Every problem with the source is an `EvalError` of one sentence, raised before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import jax
import orbax.checkpoint as ocp
from flax import nnx

from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.models.lora import LoRAParam
from ragen_jax.models.gguf import expand_model_path, is_gguf, resolve_model_path
from ragen_jax.models.qwen2.weights import from_pretrained, read_config
from ragen_jax.models.vocab_map import VocabMap
from ragen_jax.text import PromptConfig
from ragen_jax.text.tokenizer import load_tokenizer
from ragen_jax.infra.checkpoint import POLICY_DIR, CheckpointError, load_policy_params
from ragen_jax.experiment.config import Config, ConfigError, config_from_dict
from ragen_jax.experiment.build import (build_policy, build_text_envs, build_vocab, init_policy_params,
                                        load_task_tokenizer, quantize_policy)


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
    # "algo": a run saved before the advantage / loss / filter / batching sections.
    return isinstance(d, dict) and isinstance(d.get("model"), dict) and ("advantage" in d or "algo" in d)


def _qwen_config(cfg: Config, vocab=None):
    m = cfg.model
    if vocab is not None:  # a small task vocabulary exists only for random-init presets (build_policy)
        return Qwen2Config.from_preset(m.preset).replace(dtype=m.dtype, param_dtype=m.param_dtype,
                                                         vocab_size=vocab.size)
    if m.path is not None:
        path = Path(resolve_model_path(m.path)) if is_gguf(m.path) else Path(m.path).expanduser()
        if not path.is_dir():
            raise EvalError(f"the run's base model directory {m.path!r} (model.path in its config.json) does not "
                            "exist here; it is needed for the model's shapes and tokenizer")
        return read_config(str(path), dtype=m.dtype, param_dtype=m.param_dtype)
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


def _restore_actor_from_checkpoints(ckpt_dir: Path, like, step: int | None = None):
    """The policy's trained parameters (an RL run's `actor`, an SFT run's `params`; with LoRA: the
    adapters) of checkpoint `step` (default the latest complete one), nothing else restored."""
    mngr = ocp.CheckpointManager(ckpt_dir.resolve(), options=ocp.CheckpointManagerOptions(create=False))
    if step is None:
        step = mngr.latest_step()
    elif step not in mngr.all_steps():
        mngr.close()
        raise CheckpointError(f"{ckpt_dir / str(step)} is not a complete checkpoint (complete ones: "
                              f"{sorted(mngr.all_steps()) or 'none'})")
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


def _restore_lora_from_checkpoints(ckpt_dir: Path, config: Config, vocab, step: int | None = None):
    """(graphdef, params) of a LoRA run that has only checkpoints/ (interrupted before its exports):
    its checkpoints hold the adapters alone, so the frozen base is rebuilt as the run built it
    (`model.path`, or the preset's seeded initialisation, then `model.init_from`) and the latest
    adapters go on top."""
    policy = build_policy(config, vocab)
    graphdef, params = nnx.split(policy)
    params = init_policy_params(config, graphdef, params)
    if config.model.base_quant != "none":  # the run trained over a quantized base: rebuild that one
        graphdef, params = nnx.split(quantize_policy(config, nnx.merge(graphdef, params)))
    adapters, base = nnx.split_state(params, LoRAParam, ...)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), adapters)
    trained = _restore_actor_from_checkpoints(ckpt_dir, like, step)
    return graphdef, nnx.merge_state(trained, jax.device_put(base, device))


def _load_run_dir(p: Path, config: Optional[Config], step: int | None = None):
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
    if (p / POLICY_DIR).is_dir() and step is None:  # a LoRA run's export is the merged policy: plain weights
        params = load_policy_params(p, like)
    elif (p / "checkpoints").is_dir() and config.model.lora_rank:
        graphdef, params = _restore_lora_from_checkpoints(p / "checkpoints", config, vocab, step)
    elif (p / "checkpoints").is_dir():
        params = _restore_actor_from_checkpoints(p / "checkpoints", like, step)
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


def load_source(source: str | Path, config: Optional[Config] = None, *, dtype: Optional[str] = None,
                step: Optional[int] = None) -> tuple[LoadedPolicy, Optional[Config]]:
    """`load_for_eval`, plus the run's Config when `source` is a run directory (else None). `step`: a
    run directory's checkpoint of that step instead of its policy export or latest checkpoint."""
    s = str(source)
    if s.startswith("preset:"):
        return _load_preset(s[len("preset:"):], config, dtype)
    try:
        p = expand_model_path(s)
    except (ValueError, FileNotFoundError) as e:
        raise EvalError(str(e)) from None
    if is_gguf(p):
        p = Path(resolve_model_path(p))  # a .gguf checkpoint: its cached HF directory
    if not p.exists():
        raise EvalError(f"model directory {s} does not exist (give a run directory, a Hugging Face model "
                        "directory or preset:NAME)")
    if not p.is_dir():
        raise EvalError(f"{s} is not a directory (give a run directory, a Hugging Face model directory or preset:NAME)")
    try:
        if _is_run_dir(p):
            return _load_run_dir(p, config, step)
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


__all__ = ["EvalError", "LoadedPolicy", "load_for_eval", "load_source"]
