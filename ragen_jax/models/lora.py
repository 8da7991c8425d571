"""LoRA adapters for the Qwen2 family, and their Hugging Face PEFT layout.

    add_lora(policy, rank=64, alpha=64, targets=ALL_TARGETS, rngs=nnx.Rngs(0))   # in place
    adapters, base = lora_split(policy)     # the trainable adapters; the frozen base (may be bf16)
    merged = merge_lora(nnx.state(policy))  # W + (alpha / rank) A @ B per targeted kernel, adapters gone
    save_peft_adapter(policy, dir, base_model="Qwen/Qwen2.5-0.5B-Instruct") ; load_peft_adapter(dir, policy)

Per targeted kernel W [L, in, out] (stacked over layers like every layer parameter), the adapters
are A [L, in, r] (PEFT's default init: uniform in +-1/sqrt(in)) and B [L, r, out] (zeros), so a fresh
adapter leaves the model exactly unchanged. The forward adds `scale * (x @ A) @ B` to `x @ W`
(model.py `dense_layer`), scale = alpha / rank (PEFT's, without rsLoRA). Adapters are `LoRAParam`s, a
subclass of `nnx.Param`: `nnx.state(model, LoRAParam)` selects exactly what a LoRA run trains, and
everything else is the frozen base. Sharded like their kernel (sharding.py: the `in` axis of A like
W's `in`, the `out` axis of B like W's `out`, the rank replicated).

PEFT layout: `adapter_config.json` (peft_type LORA, r, lora_alpha, target_modules, base model) and
`adapter_model.safetensors` with `base_model.model.model.layers.{i}.<module>.lora_A.weight` [r, in]
and `...lora_B.weight` [out, r] (torch Linear layout: [out, in]).
"""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from ragen_jax.models.quant import QUANT_KEYS
from ragen_jax.models.quant import kernel as quant_kernel

# PEFT module name -> path of the Dense module inside the trunk's stacked decoder layers.
TARGETS: dict[str, tuple[str, str]] = {
    "q_proj": ("self_attn", "q_proj"),
    "k_proj": ("self_attn", "k_proj"),
    "v_proj": ("self_attn", "v_proj"),
    "o_proj": ("self_attn", "o_proj"),
    "gate_proj": ("mlp", "gate_proj"),
    "up_proj": ("mlp", "up_proj"),
    "down_proj": ("mlp", "down_proj"),
}
ALL_TARGETS = tuple(TARGETS)  # PEFT's "all-linear" for Qwen2 (the output head excluded, as PEFT does)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoRAParam(nnx.Param):
    """A trainable LoRA matrix; the rest of a LoRA model's parameters are the frozen base."""


def check_targets(targets: Sequence[str]) -> tuple[str, ...]:
    """The targets as a tuple; ValueError naming the valid ones for anything else ("all-linear" = all)."""
    if isinstance(targets, str):
        targets = tuple(t.strip() for t in targets.split(",") if t.strip())
    if "all-linear" in targets:
        return ALL_TARGETS
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
        raise ValueError(f"unknown LoRA target(s) {bad or list(targets)}; valid: {', '.join(ALL_TARGETS)} "
                         "(or 'all-linear')")
    return tuple(dict.fromkeys(targets))


def _dense_modules(model, targets):
    trunk = model.model
    for name in targets:
        group, proj = TARGETS[name]
        yield name, getattr(getattr(trunk.layers, group), proj)


def add_lora(model, rank: int, alpha: float, targets: Sequence[str] = ALL_TARGETS, *, rngs: nnx.Rngs,
             dtype="float32") -> None:
    """Attach fresh adapters (A random, B zero) to the targeted kernels of a Qwen2 or Qwen2Critic trunk,
    in place, and record rank/alpha in its config (the forward reads the scale from there)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA rank must be a positive integer, got {rank!r}")
    if not alpha > 0:
        raise ValueError(f"LoRA alpha must be > 0, got {alpha!r}")
    targets = check_targets(targets)
    for _, dense in _dense_modules(model, targets):
        n_layers, din, dout = dense.kernel.shape
        bound = 1.0 / math.sqrt(din)  # PEFT: kaiming_uniform_(a=sqrt(5)) on the [r, in] weight
        a = jax.random.uniform(rngs.params(), (n_layers, din, rank), jnp.float32, -bound, bound)
        dense.lora_a = LoRAParam(a.astype(dtype))
        dense.lora_b = LoRAParam(jnp.zeros((n_layers, rank, dout), dtype))
    cfg = model.cfg.replace(lora_rank=rank, lora_alpha=float(alpha), lora_targets=targets)
    model.cfg = cfg
    model.model.cfg = cfg


def lora_split(model):
    """(graphdef, adapters, base): `nnx.merge(graphdef, adapters, base)` rebuilds the model."""
    return nnx.split(model, LoRAParam, ...)


# What a LoRA run trains: the policy's adapters; the critic's adapters and its whole value head
# (PEFT's modules_to_save=["score"] in RAGEN's critic: a fresh head has nothing to adapt from).
POLICY_TRAINABLE = LoRAParam
CRITIC_TRAINABLE = nnx.Any(LoRAParam, nnx.PathContains("value_head"))


def merged_state(state, scale: float, quant: str = "none"):
    """`merge_lora` over an nnx.State (adapters included), as an nnx.State of the base architecture
    (the structure of the same model without adapters, float kernels: a quantized base, `quant` its
    mode, is dequantized). Traceable: run it under jit to keep shardings."""
    plain = nnx.split_state(state, LoRAParam, ...)[1]
    plain = jax.tree.map(lambda x: x, plain)  # a new State: the caller's is left untouched
    if quant != "none":  # codes + scales -> one float kernel (a placeholder filled just below)
        flat = [(path[:-1] + ("kernel",), nnx.Param(jnp.zeros(()))) if path[-1] == "kernel_q" else (path, v)
                for path, v in nnx.to_flat_state(plain) if path[-1] not in QUANT_KEYS[1:]]
        plain = nnx.from_flat_state(flat)
    nnx.replace_by_pure_dict(plain, merge_lora(state.to_pure_dict(), scale, quant))
    return plain


def merged_kernel(kernel, lora_a, lora_b, scale: float):
    """W + scale * A @ B per stacked layer, in W's dtype (float32 accumulation)."""
    delta = jnp.einsum("lir,lro->lio", lora_a.astype(jnp.float32), lora_b.astype(jnp.float32))
    return (kernel.astype(jnp.float32) + scale * delta).astype(kernel.dtype)


def merge_lora(state: dict, scale: float, quant: str = "none") -> dict:
    """A pure parameter dict (`nnx.state(model).to_pure_dict()`) with every adapter folded into its
    kernel and removed: the weights of the base architecture (export, or sampling without adapters).
    A quantized base (`quant`: its mode, models/quant.py) is dequantized first, to its scales' dtype
    (float32 for a .gguf file's float16 scales) promoted with the adapters': the merged model is float
    (the quantized base the run trained over, plus the adapters)."""
    def walk(node):
        if not isinstance(node, dict):
            return node
        out = {k: walk(v) for k, v in node.items() if k not in ("lora_a", "lora_b", *QUANT_KEYS)}
        if "kernel_q" in node:
            dtype = node["kernel_scale"].dtype  # the base's param_dtype, which its scales are stored in
            if quant == "gguf":  # the file's float16 scales: its blocks are exact in float32 (the gguf package's
                dtype = jnp.float32  # weights); in float16 the merged kernel lost ~1e-3 of every adapter delta
            if "lora_a" in node:
                dtype = jnp.promote_types(dtype, node["lora_a"].dtype)
            out["kernel"] = quant_kernel(node, quant, dtype)
        if "lora_a" in node:
            out["kernel"] = merged_kernel(out["kernel"], node["lora_a"], node["lora_b"], scale)
        return out

    return walk(state)


# ----------------------------------------------------------------------------- PEFT layout
def _peft_name(layer: int, target: str, which: str) -> str:
    group, proj = TARGETS[target]
    return f"base_model.model.model.layers.{layer}.{group}.{proj}.lora_{which}.weight"


def save_peft_adapter(model, path: str, base_model: str | None = None) -> None:
    """Write the adapters alone in PEFT's layout (loadable with `PeftModel.from_pretrained`)."""
    cfg = model.cfg
    if not getattr(cfg, "lora_rank", 0):
        raise ValueError("the model has no LoRA adapters (model.lora_rank=0)")
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for target, dense in _dense_modules(model, cfg.lora_targets):
        a = np.asarray(jax.device_get(dense.lora_a[...]), np.float32)  # [L, in, r]
        b = np.asarray(jax.device_get(dense.lora_b[...]), np.float32)  # [L, r, out]
        for i in range(a.shape[0]):
            tensors[_peft_name(i, target, "A")] = np.ascontiguousarray(a[i].T)  # [r, in]
            tensors[_peft_name(i, target, "B")] = np.ascontiguousarray(b[i].T)  # [out, r]
    save_file(tensors, os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": int(cfg.lora_rank), "lora_alpha": float(cfg.lora_alpha), "lora_dropout": 0.0,
        "target_modules": list(cfg.lora_targets), "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True, "modules_to_save": None, "use_rslora": False, "init_lora_weights": True,
    }
    with open(os.path.join(path, ADAPTER_CONFIG), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


def read_peft_config(path: str) -> dict:
    """The adapter_config.json of a PEFT adapter directory; ValueError naming what is unusable."""
    file = os.path.join(path, ADAPTER_CONFIG)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file}: not found (a PEFT adapter directory needs {ADAPTER_CONFIG})")
    with open(file, encoding="utf-8") as f:
        config = json.load(f)
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{file}: peft_type {config.get('peft_type')!r} is not LORA")
    if config.get("use_rslora") or config.get("use_dora"):
        raise ValueError(f"{file}: rsLoRA / DoRA adapters are not supported")
    targets = config.get("target_modules")
    config["target_modules"] = check_targets(ALL_TARGETS if targets in ("all-linear", None) else targets)
    return config


def load_peft_adapter(path: str, model) -> None:
    """Read a PEFT adapter directory into `model`'s adapters, in place (adds them when the model has
    none, with the directory's rank, alpha and targets; a model with other adapters is an error)."""
    config = read_peft_config(path)
    rank, alpha, targets = int(config["r"]), float(config["lora_alpha"]), config["target_modules"]
    cfg = model.cfg
    if not getattr(cfg, "lora_rank", 0):
        add_lora(model, rank, alpha, targets, rngs=nnx.Rngs(0))
    elif (cfg.lora_rank, set(cfg.lora_targets)) != (rank, set(targets)) or cfg.lora_alpha != alpha:
        raise ValueError(f"{path}: adapter rank {rank}, alpha {alpha}, targets {list(targets)} do not match the "
                         f"model's LoRA (rank {cfg.lora_rank}, alpha {cfg.lora_alpha}, targets "
                         f"{list(cfg.lora_targets)})")
    file = os.path.join(path, ADAPTER_WEIGHTS)
    with safe_open(file, framework="numpy") as f:
        names = set(f.keys())
        for target, dense in _dense_modules(model, targets):
            n_layers = dense.kernel.shape[0]
            for which, attr in (("A", "lora_a"), ("B", "lora_b")):
                want = [_peft_name(i, target, which) for i in range(n_layers)]
                missing = [n for n in want if n not in names]
                if missing:
                    raise ValueError(f"{file}: missing tensor {missing[0]} (and {len(missing) - 1} more)")
                stacked = np.stack([f.get_tensor(n).astype(np.float32).T for n in want])
                var = getattr(dense, attr)
                if stacked.shape != var.shape:
                    raise ValueError(f"{file}: {target}.lora_{which} has shape {stacked.shape[1:]} per layer, "
                                     f"the model expects {var.shape[1:]}")
                var[...] = jnp.asarray(stacked, var.dtype)


def is_peft_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))
