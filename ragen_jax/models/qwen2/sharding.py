"""Sharding for the decoder (every family): logical axes per parameter, and rules logical axis -> mesh axes.

Mesh axes: "data" (pure data parallel: params replicated), "fsdp" (data parallel with parameters
sharded over the embed dimension, gathered per layer by XLA), "tensor" (Megatron-style: heads, MLP
and vocab split). A dimension that is not divisible by its mesh axes is replicated instead, so any
model runs on any mesh (e.g. 14 heads on tensor=4), just less evenly.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# Parameter path (joined with "/", matched with re.search so optimizer states that embed the
# parameter path, e.g. ".../mu/model/layers/...", match too) -> logical axis per dimension.
# Heads are flattened into the projection dimension (heads * head_dim), see model.py. A quantized
# base's codes and block scales (models/quant.py: `kernel_q` [L, in or in / 2, out], `kernel_scale`
# [L, in / block, out], GGUF Q4_1's `kernel_min` like the scale) shard like their kernel; an
# axis that does not divide stays whole.
LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embed_tokens/embedding$", ("vocab", "embed")),
    (r"layers/(input_layernorm|post_attention_layernorm)/scale$", ("layers", "norm")),
    (r"layers/self_attn/q_proj/kernel(_q|_scale|_min)?$", ("layers", "embed", "heads")),
    (r"layers/self_attn/q_proj/bias$", ("layers", "heads")),
    (r"layers/self_attn/(k_proj|v_proj)/kernel(_q|_scale|_min)?$", ("layers", "embed", "kv_heads")),
    (r"layers/self_attn/(k_proj|v_proj)/bias$", ("layers", "kv_heads")),
    (r"layers/self_attn/o_proj/kernel(_q|_scale|_min)?$", ("layers", "heads", "embed")),
    (r"layers/self_attn/o_proj/bias$", ("layers", "embed")),
    # Qwen3's per-head q/k norms [L, head_dim]: tiny, and every head shard needs all of it.
    (r"layers/self_attn/(q_norm|k_norm)/scale$", ("layers", "norm")),
    (r"layers/mlp/(gate_proj|up_proj)/kernel(_q|_scale|_min)?$", ("layers", "embed", "mlp")),
    (r"layers/mlp/(gate_proj|up_proj)/bias$", ("layers", "mlp")),
    (r"layers/mlp/down_proj/kernel(_q|_scale|_min)?$", ("layers", "mlp", "embed")),
    (r"layers/mlp/down_proj/bias$", ("layers", "embed")),
    # LoRA adapters (models/lora.py): A [L, in, r] shards `in` like its kernel, B [L, r, out] shards
    # `out` like its kernel; the small rank axis stays whole.
    (r"layers/self_attn/q_proj/lora_b$", ("layers", None, "heads")),
    (r"layers/self_attn/(k_proj|v_proj)/lora_b$", ("layers", None, "kv_heads")),
    (r"layers/self_attn/(q_proj|k_proj|v_proj)/lora_a$", ("layers", "embed", None)),
    (r"layers/self_attn/o_proj/lora_a$", ("layers", "heads", None)),
    (r"layers/self_attn/o_proj/lora_b$", ("layers", None, "embed")),
    (r"layers/mlp/(gate_proj|up_proj)/lora_a$", ("layers", "embed", None)),
    (r"layers/mlp/(gate_proj|up_proj)/lora_b$", ("layers", None, "mlp")),
    (r"layers/mlp/down_proj/lora_a$", ("layers", "mlp", None)),
    (r"layers/mlp/down_proj/lora_b$", ("layers", None, "embed")),
    (r"model/norm/scale$", ("norm",)),
    (r"lm_head/kernel$", ("embed", "vocab")),
    (r"value_head/kernel$", ("embed", None)),
    (r"value_head/bias$", (None,)),
)

# Logical axis -> mesh axis (or tuple of mesh axes, or None = replicated).
DEFAULT_RULES: dict[str, Any] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "layers": None,
    "norm": None,
    "batch": ("data", "fsdp"),
}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh. One size may be -1: it takes the remaining devices."""
    devices = list(devices) if devices is not None else jax.devices()
    sizes = [data, fsdp, tensor]
    if sum(s == -1 for s in sizes) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes must be positive (one may be -1), got data={data}, fsdp={fsdp}, tensor={tensor}")
    if -1 in sizes:
        rest = math.prod(s for s in sizes if s != -1)
        if len(devices) % rest:
            raise ValueError(f"{len(devices)} devices cannot be split into data={data}, fsdp={fsdp}, tensor={tensor}")
        sizes[sizes.index(-1)] = len(devices) // rest
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = {math.prod(sizes)} devices, "
            f"but {len(devices)} are available"
        )
    auto = (jax.sharding.AxisType.Auto,) * 3
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=auto, devices=devices)


def path_str(path) -> str:
    parts = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            if k.name != "value":  # nnx.Variable wraps its array in `.value`
                parts.append(k.name)
        else:
            parts.append(str(getattr(k, "key", k)))
    return "/".join(parts)


def logical_axes(path: str, ndim: int) -> tuple[str | None, ...]:
    """Logical axes of the parameter at `path` ("model/layers/mlp/up_proj/kernel"); unknown -> replicated."""
    for pattern, axes in LOGICAL_AXES:
        if re.search(pattern, path) and len(axes) == ndim:
            return axes
    return (None,) * ndim


def spec_for(shape, axes, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> P:
    """PartitionSpec for one array: each dim gets its rule's mesh axes if the dim divides evenly."""
    used: set[str] = set()
    out = []
    for dim, logical in zip(shape, axes):
        target = rules.get(logical) if logical is not None else None
        names = (target,) if isinstance(target, str) else tuple(target or ())
        # Axes absent from the mesh, of size 1, or already used by another dim are skipped.
        names = tuple(n for n in names if n in mesh.shape and mesh.shape[n] > 1 and n not in used)
        size = math.prod(mesh.shape[n] for n in names)
        if not names or dim % size:
            out.append(None)
            continue
        used.update(names)
        out.append(names[0] if len(names) == 1 else names)
    return P(*out)


def param_shardings(params_state, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES):
    """NamedSharding for every leaf of a params state (nnx.State, pure dict, or optimizer state).

    Returns a tree of the same structure, usable with `jax.device_put(params, shardings)` and as
    jit in/out shardings.
    """

    def one(path, leaf):
        shape = np.shape(leaf)
        axes = logical_axes(path_str(path), len(shape))
        return NamedSharding(mesh, spec_for(shape, axes, mesh, rules))

    return jax.tree_util.tree_map_with_path(one, params_state)


def batch_sharding(mesh: Mesh, ndim: int = 2, rules: Mapping[str, Any] = DEFAULT_RULES) -> NamedSharding:
    """Leading (batch) dim over the data-parallel axes; the rest replicated."""
    batch = rules.get("batch")
    names = (batch,) if isinstance(batch, str) else tuple(batch or ())
    names = tuple(n for n in names if n in mesh.shape)
    return NamedSharding(mesh, P(names or None, *([None] * (ndim - 1))))


def on_mesh(fn, mesh: Mesh):
    """`fn` traced with `mesh` as the context mesh (jit it: `jax.jit(on_mesh(f, mesh))`): what must be
    partitioned by hand inside it reads the mesh from there (the splash kernel's shard_map,
    models/attention.py `partitioned`); XLA's own partitioning is unchanged (the axes stay Auto)."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)

    return traced


def cache_sharding(cache, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES):
    """Shardings for a KVCache: k/v [L, B, S, n_kv, head_dim] by batch and kv heads; end [B] by batch."""
    kv = spec_for(cache.k.shape, ("layers", "batch", None, "kv_heads", None), mesh, rules)
    end = spec_for(cache.end.shape, ("batch",), mesh, rules)
    out = type(cache)(k=NamedSharding(mesh, kv), v=NamedSharding(mesh, kv), end=NamedSharding(mesh, end))
    if getattr(cache, "k_scale", None) is not None:  # an int8 cache's scales [L, B, S, n_kv]
        sc = NamedSharding(mesh, spec_for(cache.k_scale.shape, ("layers", "batch", None, "kv_heads"), mesh, rules))
        out = out.replace(k_scale=sc, v_scale=sc)
    return out
