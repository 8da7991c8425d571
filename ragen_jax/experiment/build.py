"""Run setup shared by the RL trainer, the SFT trainer and evaluation: the pieces a run is built from.

`build_mesh` (devices), `load_task_tokenizer`, `build_text_envs` (one TextEnv per environment of the
run), `build_vocab` (the task vocabulary of small demo models), `build_policy` (HF directory or random
preset, with fresh LoRA adapters when `model.lora_rank > 0`), `init_policy_params` (`model.init_from`:
a policy export or a PEFT adapter directory), `quantize_policy` (`model.base_quant`: the frozen base
stored quantized, once it holds its final weights) and `check_run_dir_config` (a run directory resumes only
with its own config).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax
from flax import nnx

import envs_jax
from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.models.lora import LoRAParam, add_lora, is_peft_dir, load_peft_adapter, merged_state
from ragen_jax.models.quant import quantize_base, set_quantized
from ragen_jax.models.qwen2.sharding import make_mesh, param_shardings
from ragen_jax.models.gguf import expand_model_path, open_gguf, quantized_kernels, resolve_model_path
from ragen_jax.models.gguf import hf_config as gguf_hf_config
from ragen_jax.models.qwen2.weights import from_pretrained
from ragen_jax.models.vocab_map import VocabMap
from ragen_jax.rollout.teachers import teacher_texts
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.text.mix import MixedTextEnv
from ragen_jax.text.tokenizer import load_tokenizer
from ragen_jax.infra.checkpoint import load_policy_params
from ragen_jax.experiment.config import Config, ConfigError, gguf_init_from_error
from ragen_jax.experiment.legacy import migrate_saved
from ragen_jax.infra.distributed import run_path


def _flatten(d: dict, prefix="") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k != "overrides":
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def check_run_dir_config(workdir, cfg: Config, resumable: tuple[str, ...]) -> None:
    """A run directory may only be resumed with the config it was started with (up to `resumable` keys)."""
    saved = run_path(workdir) / "config.json"
    if not saved.exists():
        return
    try:
        old = _flatten(migrate_saved(json.loads(saved.read_text())))
    except json.JSONDecodeError:
        raise ConfigError(f"{saved} is not valid JSON; this directory holds a broken run") from None
    as_json = lambda c: _flatten(json.loads(json.dumps(c.to_dict(), default=str)))  # noqa: E731
    new = as_json(cfg)
    # A key missing from the saved config was added to Config after that run started: the run used
    # its default behaviour, so only a non-default value is a change.
    defaults = as_json(Config())
    old.update({k: defaults.get(k) for k in new if k not in old})
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in resumable)
    if diff:
        raise ConfigError(f"{workdir} holds a run with a different config ({', '.join(diff[:6])}"
                          f"{' ...' if len(diff) > 6 else ''}); use another --workdir to start a new run")


def build_mesh(cfg: Config, devices=None):
    """The run's device mesh; an explicit mesh smaller than the machine uses its first devices."""

    m = cfg.mesh
    devices = list(devices if devices is not None else jax.devices())  # every process's devices, by process
    sizes = (m.data, m.fsdp, m.tensor)
    if -1 not in sizes and math.prod(sizes) < len(devices):
        # Several processes: each runs the same programs on its own share of the mesh, so a mesh
        # that leaves one of them out has no work (and no place for its inputs) there.
        if len({d.process_index for d in devices[: math.prod(sizes)]}) < len({d.process_index for d in devices}):
            raise ConfigError(f"the mesh data={m.data} x fsdp={m.fsdp} x tensor={m.tensor} uses {math.prod(sizes)} of "
                              f"the {len(devices)} devices, leaving some of the {jax.process_count()} processes without a "
                              "share; use all devices (e.g. mesh.data=-1)")
        devices = devices[: math.prod(sizes)]
    return make_mesh(data=m.data, fsdp=m.fsdp, tensor=m.tensor, devices=devices)


def load_task_tokenizer(cfg: Config):
    """The model directory's own tokenizer when it has one, else the offline-built Qwen2.5 tokenizer."""

    m = cfg.model
    tok_files = ("tokenizer.json", "tokenizer_config.json")
    path = resolve_model_path(m.path) if m.path is not None else None
    if path is not None and any((Path(path) / f).exists() for f in tok_files):
        return load_tokenizer(path)
    return load_tokenizer()


def build_text_envs(cfg: Config, tokenizer) -> dict:
    """TextEnv per environment used by the run: the training env first (under `cfg.env.train_key`; with
    `env.mix` a `MixedTextEnv` of the mix, then each of its envs), then validation envs."""
    out = {}
    for name in dict.fromkeys((*cfg.env.train_envs, *(n for n, _ in cfg.env.validation_set(1)))):
        env, params = envs_jax.make(name, **cfg.env.overrides_for(name))
        out[name] = TextEnv(env, params, tokenizer, prompt_for_env(cfg.prompt, name))
    if cfg.env.mix:
        try:
            mixed = MixedTextEnv([(n, out[n], g) for n, g in cfg.env.mix])
        except ValueError as e:
            raise ConfigError(f"env.mix: {e}") from None
        out = {cfg.env.train_key: mixed, **out}
    return out


def prompt_for_env(prompt: PromptConfig, env_name: str) -> PromptConfig:
    """The conversation settings an environment is run with: the run's, except that one-shot envs
    (their record's `single_action`: Bandit) always get one turn with one action."""
    if envs_jax.get_spec(env_name).single_action:
        return dataclasses.replace(prompt, max_turns=1, max_actions_per_turn=1)
    return prompt


# Texts the task vocabulary must be able to express beyond what the environments render: the
# answer format, separators and the demonstrations' templated thoughts.
TASK_VOCAB_TEXTS = (
    "<think></think><answer></answer>", " <think> </think> <answer> </answer> ", "</think>\n<answer>",
    " || ", "||", " | ", ", ", ". ", "\n", " ",
)


def build_vocab(cfg: Config, text_envs: dict, tokenizer):
    """A VocabMap for model.vocab='task' (small model vocabulary), else None (full Qwen vocabulary)."""
    if cfg.model.vocab != "task":
        return None

    names = set()
    for te in text_envs.values():
        names.update(te.action_names)
    texts = list(TASK_VOCAB_TEXTS)
    for n in sorted(names):
        texts += [n, " " + n, n.lower(), " " + n.lower(), n.upper(), " " + n.upper()]
        # A teacher writes the last name with "</answer>": a name ending in punctuation (the cube's
        # U') merges with "</" into one token no other text has.
        texts.append(n + "</answer>")
    texts += list(teacher_texts())  # the demonstrations' fixed texts
    return VocabMap.for_text_envs(list(text_envs.values()), tokenizer, extra_texts=texts)


def build_policy(cfg: Config, vocab=None, mesh=None):
    """The policy model from the config: a local HF directory or a random preset (own vocab if mapped).

    With `mesh`, every parameter is created directly in its mesh sharding (`param_shardings`): a
    checkpoint is read slice by slice into the shards each device holds, a random init runs under a
    jit with those output shardings. The whole model never sits on one device."""

    m = cfg.model
    m.check_backend()
    overrides = dict(dtype=m.dtype, param_dtype=m.param_dtype, matmul_dtype=m.matmul_dtype, remat=m.use_remat,
                     remat_policy=m.remat_policy, attention=m.attention)
    if m.path is not None:
        if vocab is not None:
            raise ConfigError("model.vocab='task' needs a randomly initialised model (model.random_init=true)")
        return _with_lora(cfg, from_pretrained(resolve_model_path(m.path), mesh=mesh, **overrides), mesh)
    if vocab is not None:
        overrides["vocab_size"] = vocab.size
    qcfg = Qwen2Config.from_preset(m.preset).replace(**overrides)
    if mesh is None:
        return _with_lora(cfg, Qwen2(qcfg, rngs=nnx.Rngs(cfg.train.seed)), mesh)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen2(qcfg, rngs=nnx.Rngs(cfg.train.seed))))
    init = jax.jit(lambda: nnx.split(Qwen2(qcfg, rngs=nnx.Rngs(cfg.train.seed)))[1],
                   out_shardings=param_shardings(abstract, mesh))
    return _with_lora(cfg, nnx.merge(graphdef, init()), mesh)


def without_remat(graphdef, like):
    """The graph of a Qwen2 or Qwen2Critic (`like`: its parameter state, abstract is enough) with its
    layers' remat off: remat is static config of the graph, so an update program without it is
    built from this graph (the parameters are the same)."""
    if graphdef is None:
        return None
    model = nnx.merge(graphdef, like)
    cfg = model.cfg.replace(remat=False)
    model.cfg = cfg
    model.model.cfg = cfg
    return nnx.split(model)[0]


def _with_lora(cfg: Config, policy, mesh):
    """`policy` with fresh adapters (A random, B zero: the model is unchanged) when model.lora_rank > 0,
    placed in their mesh sharding. Adapters stay float32 whatever param_dtype: they are what the
    optimizer updates (the base may be bf16: it never changes)."""
    m = cfg.model
    if not m.lora_rank:
        return policy
    add_lora(policy, m.lora_rank, m.lora_alpha, m.lora_targets, rngs=nnx.Rngs(cfg.train.seed + 3))
    if mesh is not None:
        adapters = nnx.state(policy, LoRAParam)
        nnx.update(policy, jax.device_put(adapters, param_shardings(adapters, mesh)))
    return policy


def quantize_policy(cfg: Config, policy, mesh=None):
    """`policy` (a LoRA model holding its final base weights: after `init_policy_params`) with that frozen
    base stored in `model.base_quant` (models/quant.py; in place), placed in its mesh sharding. Every
    program of the run then reads the quantized base. `model.base_quant=none`: unchanged."""
    mode = cfg.model.base_quant
    if mode == "none":
        return policy
    try:
        if mode == "gguf":  # the file's own blocks replace the float projections read from its conversion
            set_quantized(policy, gguf_base(cfg), mode)
        else:
            quantize_base(policy, mode)
    except ValueError as e:
        raise ConfigError(f"model.base_quant: {e}") from None
    if mesh is not None:
        state = nnx.state(policy)
        nnx.update(policy, jax.device_put(state, param_shardings(state, mesh)))
    return policy


def gguf_base(cfg: Config) -> dict:
    """`model.base_quant=gguf`: the Q4_0 / Q4_1 / Q8_0 projections of the `model.path` .gguf file
    (`gguf.quantized_kernels`). The base is the file's (`model.init_from` may only add adapters: checked
    by ModelConfig.validate)."""
    m = cfg.model
    reader = open_gguf(expand_model_path(m.path))
    config, arch = gguf_hf_config(reader)
    kernels = quantized_kernels(reader, config, arch)
    if not kernels:
        raise ConfigError(f"model.base_quant=gguf: {m.path} has no projection stored as Q4_0, Q4_1 or Q8_0 in every "
                          "layer; use model.base_quant=nf4 (or int8) to quantize its weights")
    return kernels


def init_policy_params(cfg: Config, graphdef, params, mesh=None):
    """The policy's parameter state (`nnx.split(policy)[1]`, adapters included) after `model.init_from`:

    - a PEFT adapter directory (adapter_config.json, e.g. `<SFT-LoRA run>/adapter`): its adapters are
      loaded onto the base (rank, alpha and targets must equal model.lora_*); without LoRA
      (lora_rank=0) they are merged into the weights, which then train in full;
    - a policy export (`<run>/policy`, or the run directory): the base-architecture weights (a LoRA
      run exports its merged policy there); a LoRA run keeps its fresh adapters on top.

    Placed in `params`' shardings. No `init_from`: `params` unchanged."""
    src = cfg.model.init_from
    if not src:
        return params
    if cfg.model.base_quant == "gguf" and not is_peft_dir(str(src)):
        raise gguf_init_from_error(src)
    if is_peft_dir(str(src)):
        model = nnx.merge(graphdef, params)
        try:
            load_peft_adapter(str(src), model)  # in place; adds adapters to a model without any
        except ValueError as e:
            raise ConfigError(f"model.init_from: {e}; set model.lora_rank / lora_alpha / lora_targets to the "
                              "adapter's") from None
        state = nnx.state(model)
        if not cfg.model.lora_rank:
            state = jax.jit(merged_state, static_argnums=1)(state, model.cfg.lora_scale)
        return jax.device_put(state, jax.tree.map(lambda x: x.sharding, params))
    adapters, base = nnx.split_state(params, LoRAParam, ...)
    base = load_policy_params(src, base)
    return nnx.merge_state(adapters, base) if cfg.model.lora_rank else base
