"""Hugging Face checkpoint I/O for every family (Qwen2, Llama, Qwen3: config.json + safetensors, single file or sharded), no torch.

`WEIGHT_MAP` is the one table between HF tensor names and our parameter tree. Per-layer HF tensors
(`{i}` in the name) are stacked on our leading layer axis. HF `nn.Linear` weights are `[out, in]`,
ours `[in, out]`: those rows have `transpose=True`.
"""

from __future__ import annotations

import json
import os
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from ragen_jax.models.lora import merge_lora
from ragen_jax.models.qwen2.config import Qwen2Config
from ragen_jax.models.qwen2.model import Qwen2
from ragen_jax.models.qwen2.sharding import DEFAULT_RULES, param_shardings

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class WeightSpec(NamedTuple):
    hf_name: str  # "{i}" stands for the layer index
    path: tuple[str, ...]  # our parameter path (nnx state keys)
    per_layer: bool  # stacked on our leading [L] axis
    transpose: bool  # HF [out, in] <-> ours [in, out]


def _layer(hf: str, path: tuple[str, ...], transpose: bool) -> WeightSpec:
    return WeightSpec(f"model.layers.{{i}}.{hf}", ("model", "layers", *path), True, transpose)


WEIGHT_MAP: tuple[WeightSpec, ...] = (
    WeightSpec("model.embed_tokens.weight", ("model", "embed_tokens", "embedding"), False, False),
    _layer("input_layernorm.weight", ("input_layernorm", "scale"), False),
    _layer("self_attn.q_proj.weight", ("self_attn", "q_proj", "kernel"), True),
    _layer("self_attn.q_proj.bias", ("self_attn", "q_proj", "bias"), False),
    _layer("self_attn.k_proj.weight", ("self_attn", "k_proj", "kernel"), True),
    _layer("self_attn.k_proj.bias", ("self_attn", "k_proj", "bias"), False),
    _layer("self_attn.v_proj.weight", ("self_attn", "v_proj", "kernel"), True),
    _layer("self_attn.v_proj.bias", ("self_attn", "v_proj", "bias"), False),
    _layer("self_attn.o_proj.weight", ("self_attn", "o_proj", "kernel"), True),
    _layer("self_attn.o_proj.bias", ("self_attn", "o_proj", "bias"), False),
    _layer("self_attn.q_norm.weight", ("self_attn", "q_norm", "scale"), False),
    _layer("self_attn.k_norm.weight", ("self_attn", "k_norm", "scale"), False),
    _layer("post_attention_layernorm.weight", ("post_attention_layernorm", "scale"), False),
    _layer("mlp.gate_proj.weight", ("mlp", "gate_proj", "kernel"), True),
    _layer("mlp.gate_proj.bias", ("mlp", "gate_proj", "bias"), False),
    _layer("mlp.up_proj.weight", ("mlp", "up_proj", "kernel"), True),
    _layer("mlp.up_proj.bias", ("mlp", "up_proj", "bias"), False),
    _layer("mlp.down_proj.weight", ("mlp", "down_proj", "kernel"), True),
    _layer("mlp.down_proj.bias", ("mlp", "down_proj", "bias"), False),
    WeightSpec("model.norm.weight", ("model", "norm", "scale"), False, False),
    # Absent from tied checkpoints (the head reuses model.embed_tokens.weight).
    WeightSpec("lm_head.weight", ("lm_head", "kernel"), False, True),
)


def _present(spec: WeightSpec, cfg: Qwen2Config) -> bool:
    """Whether `cfg`'s family and switches give the model this parameter (mirrors model.py's modules)."""
    path = spec.path
    if path[0] == "lm_head":
        return not cfg.tie_word_embeddings
    if path[-1] == "bias":
        if path[-2] in ("q_proj", "k_proj", "v_proj"):
            return cfg.qkv_bias
        return cfg.o_bias if path[-2] == "o_proj" else cfg.mlp_bias
    if path[-2] in ("q_norm", "k_norm"):
        return cfg.qk_norm
    return True


def weight_specs(cfg: Qwen2Config) -> tuple[WeightSpec, ...]:
    return tuple(s for s in WEIGHT_MAP if _present(s, cfg))


def _hf_names(spec: WeightSpec, cfg: Qwen2Config) -> list[str]:
    if spec.per_layer:
        return [spec.hf_name.format(i=i) for i in range(cfg.num_hidden_layers)]
    return [spec.hf_name]


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _set(tree, path, value):
    for k in path[:-1]:
        tree = tree[k]
    tree[path[-1]] = value


# ----------------------------------------------------------------------------- reading
def read_config(path: str, **overrides) -> Qwen2Config:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: model directory does not exist")
    cfg_file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(f"{cfg_file}: not found (a Hugging Face model directory needs config.json)")
    try:
        with open(cfg_file, encoding="utf-8") as f:
            hf = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file}: invalid JSON ({e.msg} at line {e.lineno})") from None
    return Qwen2Config.from_hf_config(hf, source=cfg_file, **overrides)


def _weight_files(path: str) -> dict[str, str]:
    """HF tensor name -> file path, from the index (sharded) or the single file."""
    index = os.path.join(path, INDEX_FILE)
    single = os.path.join(path, SINGLE_FILE)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: has no 'weight_map' object")
        for shard in sorted(set(weight_map.values())):
            if not os.path.isfile(os.path.join(path, shard)):
                raise FileNotFoundError(f"{index}: lists shard {shard!r}, which does not exist in {path}")
        return {name: os.path.join(path, shard) for name, shard in weight_map.items()}
    if os.path.isfile(single):
        with safe_open(single, framework="numpy") as f:
            return {name: single for name in f.keys()}
    raise FileNotFoundError(f"{path}: no weights found (expected {SINGLE_FILE} or {INDEX_FILE})")


def _norm_index(index, shape) -> tuple[slice, ...]:
    """A device's index (tuple of slices, possibly shorter than the rank) as explicit unit-step slices."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    out = []
    for sl, n in zip(index, shape):
        start, stop, step = sl.indices(n)
        if step != 1:
            raise ValueError(f"unexpected strided shard index {sl}")
        out.append(slice(start, stop))
    return tuple(out)


def from_pretrained(
    path: str,
    dtype: str | None = None,
    param_dtype: str | None = None,
    mesh: Mesh | None = None,
    rules=None,
    **overrides,
) -> Qwen2:
    """Load a Qwen2/Llama/Qwen3ForCausalLM directory (family from config.json's `model_type`). `dtype`: compute dtype (default float32); `param_dtype`:
    storage dtype (default: same as `dtype`). bf16 checkpoints load as is (no torch). `overrides`:
    further Qwen2Config fields that are not in config.json (e.g. remat).

    Every parameter is built with `jax.make_array_from_callback`: each device's callback reads just
    its shard from the safetensors files (`get_slice`, memory-mapped; per layer for the stacked
    weights). With `mesh`, the shardings are `param_shardings(..., mesh, rules)`, so no device and
    not the host ever holds more than one parameter's shard at a time: a model larger than one
    device loads (works across hosts: each process reads its own devices' shards). Without a mesh
    the parameters go whole to the first device."""
    dtype = dtype or "float32"
    cfg = read_config(path, dtype=dtype, param_dtype=param_dtype or dtype, **overrides)
    files = _weight_files(path)
    pdt = jnp.dtype(cfg.param_dtype)

    # Build the module without allocating random weights, then fill its state from the files.
    abstract = nnx.eval_shape(lambda: Qwen2(cfg, nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    params = state.to_pure_dict()
    shardings = None
    if mesh is not None:
        shardings = param_shardings(params, mesh, rules if rules is not None else DEFAULT_RULES)
    single = SingleDeviceSharding(jax.devices()[0])

    handles: dict[str, object] = {}

    def tensor_slice(name: str):
        file = files.get(name)
        if file is None:
            raise ValueError(f"{path}: weight {name!r} is missing from the checkpoint")
        if file not in handles:
            handles[file] = safe_open(file, framework="numpy")
        h = handles[file]
        if name not in h.keys():
            raise ValueError(f"{file}: weight {name!r} listed in {INDEX_FILE} is not in the file")
        return h.get_slice(name)

    try:
        for spec in weight_specs(cfg):
            want = tuple(_get(params, spec.path).shape)
            per = want[1:] if spec.per_layer else want
            hf_shape = per[::-1] if spec.transpose else per
            names = _hf_names(spec, cfg)
            slices = []
            for name in names:  # every shape checked before anything is read
                sl = tensor_slice(name)
                if tuple(sl.get_shape()) != tuple(hf_shape):
                    raise ValueError(
                        f"{files[name]}: weight {name!r} has shape {tuple(sl.get_shape())}, expected "
                        f"{tuple(hf_shape)} from {CONFIG_FILE}"
                    )
                slices.append(sl)

            memo: dict = {}  # devices holding the same (replicated) shard share one read

            def read(index, spec=spec, want=want, slices=slices, memo=memo):
                idx = _norm_index(index, want)
                key = tuple((x.start, x.stop) for x in idx)
                if key not in memo:
                    memo[key] = _read(spec, slices, idx, pdt)
                return memo[key]

            sharding = _get(shardings, spec.path) if shardings is not None else single
            _set(params, spec.path, jax.make_array_from_callback(want, sharding, read))
            memo.clear()
    finally:
        handles.clear()

    state.replace_by_pure_dict(params)
    return nnx.merge(graphdef, state)


def _read(spec: WeightSpec, slices, idx, dtype):
    """Our parameter's block `idx` (unit-step slices in our layout) read from the HF tensors'
    safetensors slices (one per layer when stacked), transposed back where HF stores [out, in]."""
    layers, inner = (range(len(slices))[idx[0]], idx[1:]) if spec.per_layer else ([0], idx)
    hf_idx = inner[::-1] if spec.transpose else inner
    parts = []
    for i in layers:
        a = np.asarray(slices[i][hf_idx])
        parts.append((a.T if spec.transpose else a).astype(dtype, copy=False))
    return np.stack(parts) if spec.per_layer else parts[0]


# ----------------------------------------------------------------------------- writing
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size must be positive, got {size}")
        return size
    m = _SIZE_RE.match(str(size))
    if not m:
        raise ValueError(f"max_shard_size {size!r} is not a size like 5GB, 500MB or an int of bytes")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "B").upper()])


def _to_host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        # Multi-host sharded parameter: every process must take part in the gather.
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


# Storage dtypes of written checkpoints (safetensors and numpy names).
SAVE_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
               "float16": np.dtype(np.float16)}


def hf_state_dict(model: Qwen2, dtype: str | None = None) -> dict[str, np.ndarray]:
    """Our parameters as HF-named numpy arrays (ordered as HF: per layer, then the rest). A model with
    LoRA adapters gives its merged weights W + (alpha / rank) A B (the adapters themselves are
    `lora.save_peft_adapter`'s); a quantized base (QLoRA) is written dequantized."""
    cfg = model.cfg
    dtype = dtype or cfg.param_dtype
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"cannot save weights as {dtype!r}; choose one of {', '.join(SAVE_DTYPES)}")
    params = nnx.state(model, nnx.Param).to_pure_dict()
    if cfg.lora_rank or cfg.base_quant != "none":  # jnp on the (possibly sharded) arrays, before the gather
        params = merge_lora(params, cfg.lora_scale, cfg.base_quant)
    out_dtype = SAVE_DTYPES[dtype]
    out: dict[str, np.ndarray] = {}
    for spec in weight_specs(cfg):
        value = _to_host(_get(params, spec.path))
        per = list(value) if spec.per_layer else [value]
        for name, a in zip(_hf_names(spec, cfg), per):
            a = a.T if spec.transpose else a
            out[name] = np.ascontiguousarray(a.astype(out_dtype))
    return out


def save_pretrained(model: Qwen2, path: str, max_shard_size: int | str | None = None, dtype: str | None = None):
    """Write config.json (the family's *ForCausalLM, transformers-5 style) + safetensors (+ index when sharded).

    `dtype`: storage dtype of the written tensors ("float32", "bfloat16", "float16"; default: the
    model's param_dtype). A model with LoRA adapters is written merged (`hf_state_dict`): what
    transformers loads is the model that was trained. Parameters may be sharded; on several hosts
    every process must call this, and process 0 writes."""
    cfg = model.cfg
    dtype = dtype or cfg.param_dtype
    tensors = hf_state_dict(model, dtype)  # collective on multi-host meshes: all processes call this
    if jax.process_index() != 0:
        return
    os.makedirs(path, exist_ok=True)
    hf_cfg = cfg.to_hf_config()
    hf_cfg["dtype"] = dtype
    with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(hf_cfg, f, indent=2)
    # A stale index or single file from an earlier save would shadow the new weights.
    for stale in (INDEX_FILE, SINGLE_FILE):
        if os.path.exists(os.path.join(path, stale)):
            os.remove(os.path.join(path, stale))
    metadata = {"format": "pt"}  # transformers refuses safetensors files without a known format

    if max_shard_size is None:
        save_file(tensors, os.path.join(path, SINGLE_FILE), metadata=metadata)
        return
    limit = _parse_size(max_shard_size)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, a in tensors.items():
        if shards[-1] and size + a.nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = a
        size += a.nbytes
    n = len(shards)
    weight_map = {}
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{n:05d}.safetensors"
        save_file(shard, os.path.join(path, fname), metadata=metadata)
        weight_map.update({name: fname for name in shard})
    index = {"metadata": {"total_size": int(sum(a.nbytes for a in tensors.values()))}, "weight_map": weight_map}
    with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
