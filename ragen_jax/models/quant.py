"""A quantized frozen base for LoRA (QLoRA): the decoder layers' projection kernels stored in 8 or 4
bits and dequantized per layer inside the forward (and the rematerialised backward).

    quantize_base(model, "nf4")            # in place: every projection's `kernel` -> `kernel_q` + `kernel_scale`
    w = dequantize(q, scale, "nf4", f32)   # the float kernel the forward multiplies by

Layout (a kernel W [*stack, in, out], stored [in, out] like every kernel of model.py):

- "int8": llama.cpp's Q8_0 rule: blocks of `Q8_BLOCK` (32) consecutive input rows of one output column,
  scale = the block's max |W| / 127, code = roundf(W * (1 / scale)) (half away from zero, as C's roundf:
  the same codes as a GGUF Q8_0 tensor; the input size a multiple of 32). `kernel_q` int8
  [*stack, in, out], `kernel_scale` [*stack, in / 32, out]; W ~ code * scale. Why blocks: with one scale per output channel (the first
  int8 rule) a single large weight coarsens the step of its whole column; SmolLM2 kept 12 of 20
  greedy answers that way, 15 with Q8_0 (bench/qlora_greedy.py, docs/memory.md).
- "nf4" / "int4": blocks of `block` (64, as QLoRA) consecutive input rows of one output column, one
  scale per block, `kernel_scale` [*stack, in / block, out]. Codes 0..15, two per byte: `kernel_q`
  uint8 [*stack, in / 2, out], where byte j of a block holds element j in its low nibble and element
  j + block / 2 in its high nibble (llama.cpp's Q4_0 order, so GGUF blocks map onto it).
  W ~ TABLE[code] * scale:
  - nf4: QLoRA's NormalFloat table (quantiles of a normal distribution, exact 0), scale = the
    block's max |W|, code = the nearest table entry to W / scale;
  - int4: llama.cpp's Q4_0 rule: scale = -(the block's signed value of largest magnitude) / 8,
    code = min(15, trunc(W / scale + 8.5)), value (code - 8) * scale.
- Scales are stored in the float kernel's dtype (bf16 base: bf16 scales); codes are computed with the
  float32 scale, the dequantized weight uses the stored one.

Why in-house and not qwix (google/qwix 0.1.8, what Tunix uses): qwix quantizes by intercepting
`dot_general`/`einsum` calls inside Flax modules and recognises a weight by the identity of the
`nnx.Param` value reaching the op (`flax_util.find_param`). Our decoder keeps every layer's weights
stacked [L, ...] and runs the layers as a `lax.scan` over a pure dict of arrays (`model.dense_layer`),
so the op sees a slice of a scanned array: qwix would take it for an activation. Fitting it would
mean rewriting the forward around per-layer modules; two arrays and one dequantize function are
simpler, and keep the scan, the remat layout and the CPU integer views as they are (docs/memory.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# model.base_quant values: "none" keeps float kernels; "gguf" keeps a .gguf file's own Q4_0 / Q4_1 /
# Q8_0 blocks (`from_gguf_blocks`).
MODES = ("none", "int8", "nf4", "int4", "gguf")
# GGUF block types read as they are: name -> (weights per block, bytes per block).
GGUF_BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34)}
BLOCK = 64  # 4-bit block size along the input axis (QLoRA's; GGUF's Q4_0/Q4_1 use 32)
Q8_BLOCK = 32  # int8 block size along the input axis: llama.cpp's Q8_0 (QK8_0), so GGUF blocks map onto it
# QLoRA's NF4 levels (bitsandbytes `get_4bit_type("nf4")`, the paper's appendix E).
NF4_TABLE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023,
    1.0], np.float32)
INT4_TABLE = np.arange(-8, 8, dtype=np.float32)  # Q4_0: code - 8
TABLES = {"nf4": NF4_TABLE, "int4": INT4_TABLE, "gguf": INT4_TABLE}  # gguf: Q4_0's codes (Q4_1's carry a min)
# The projections whose kernels are quantized: the seven of every decoder layer (models/lora.py
# TARGETS); embeddings, the output head, norms, biases and adapters stay float.
PROJECTIONS = (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")), ("mlp", ("gate_proj", "up_proj", "down_proj")))
f32 = jnp.float32
QUANT_KEYS = ("kernel_q", "kernel_scale", "kernel_min")  # what a quantized kernel is stored as


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown base quantization {mode!r}; choose one of {', '.join(MODES)}")
    return mode


def check_shape(shape, mode: str, block: int = BLOCK) -> None:
    """ValueError naming the problem when a kernel [*stack, in, out] cannot be stored in `mode`."""
    n_in = shape[-2]
    if mode == "int8" and n_in % Q8_BLOCK:
        raise ValueError(f"an int8 kernel needs its input size ({n_in}) to be a multiple of Q8_0's block size "
                         f"{Q8_BLOCK}; use model.base_quant=none for this model")
    if mode in TABLES and (block % 2 or n_in % block):
        fix = "int8" if n_in % Q8_BLOCK == 0 else "none"
        raise ValueError(f"a {mode} kernel needs its input size ({n_in}) to be a multiple of the block "
                         f"size {block} (an even number); use model.base_quant={fix} for this model")


def quantize(w: jax.Array, mode: str, block: int = BLOCK) -> tuple[jax.Array, jax.Array]:
    """(codes, scale) of a float kernel [*stack, in, out] (module docstring); scale in w's dtype. `block`:
    the 4-bit modes' block; int8 always uses Q8_0's `Q8_BLOCK`."""
    check_shape(w.shape, check_mode(mode), block)
    x = w.astype(f32)
    *lead, n_in, n_out = x.shape
    if mode == "int8":  # llama.cpp's quantize_row_q8_0_ref, operation for operation
        xb = x.reshape(*lead, n_in // Q8_BLOCK, Q8_BLOCK, n_out)
        amax = jnp.max(jnp.abs(xb), axis=-2)  # [..., nb, out]
        # XLA rewrites a division by a broadcast constant into a multiplication by its reciprocal, an
        # ulp off Q8_0's amax / 127 for ~5% of blocks (measured); a divisor it cannot prove constant
        # keeps the division (a NaN block stays NaN either way).
        scale = amax / jnp.where(jnp.isnan(amax), 1.0, 127.0)
        inv = jnp.where(scale == 0, 0.0, 1.0 / jnp.where(scale == 0, 1.0, scale))
        v = xb * inv[..., None, :]
        # C's roundf (half away from zero), not jnp.round (half to even): ties give Q8_0's codes. The
        # fraction a - floor(a) is exact, so the tie test is too (floor(a + 0.5) is not, near 0.5).
        a = jnp.abs(v)
        whole = jnp.floor(a)
        codes = jnp.sign(v) * (whole + (a - whole >= 0.5))
        return codes.astype(jnp.int8).reshape(*lead, n_in, n_out), scale.astype(w.dtype)
    xb = x.reshape(*lead, n_in // block, block, n_out)
    if mode == "nf4":
        scale = jnp.max(jnp.abs(xb), axis=-2)  # [..., nb, out]
        ratio = xb / jnp.where(scale == 0, 1.0, scale)[..., None, :]
        mids = (NF4_TABLE[1:] + NF4_TABLE[:-1]) / 2  # nearest level = number of midpoints below
        codes = jnp.searchsorted(jnp.asarray(mids), ratio.reshape(-1)).reshape(xb.shape)
    else:  # int4, llama.cpp's quantize_row_q4_0
        idx = jnp.argmax(jnp.abs(xb), axis=-2)
        signed_max = jnp.take_along_axis(xb, idx[..., None, :], axis=-2)[..., 0, :]
        scale = signed_max / -8.0
        inv = jnp.where(scale == 0, 0.0, 1.0 / jnp.where(scale == 0, 1.0, scale))
        codes = jnp.minimum(15, jnp.trunc(xb * inv[..., None, :] + 8.5))
    codes = codes.astype(jnp.uint8)
    half = block // 2
    packed = codes[..., :half, :] | (codes[..., half:, :] << 4)  # [..., nb, block / 2, out]
    return packed.reshape(*lead, n_in // 2, n_out), scale.astype(w.dtype)


def dequantize(q: jax.Array, scale: jax.Array, mode: str, dtype=f32, minimum: jax.Array | None = None) -> jax.Array:
    """The float kernel [*stack, in, out] of (codes, scale), computed in float32 and cast to `dtype`.
    int8 codes: one scale per block of in / scale.shape[-2] rows (Q8_0's 32, computed or read from
    a GGUF file). 4-bit codes: TABLE[mode][code] * scale, or with `minimum` (GGUF's Q4_1) code * scale + min."""
    *lead, n_rows, n_out = q.shape
    nb = scale.shape[-2]
    s = scale.astype(f32)[..., None, :]
    if q.dtype == jnp.int8:
        w = q.reshape(*lead, nb, n_rows // nb, n_out).astype(f32) * s
        return w.reshape(*lead, n_rows, n_out).astype(dtype)
    qb = q.reshape(*lead, nb, n_rows // nb, n_out)
    codes = jnp.concatenate([qb & 15, qb >> 4], axis=-2)  # [..., nb, block, out]
    if minimum is None:
        w = jnp.asarray(TABLES[mode])[codes.astype(jnp.int32)] * s
    else:  # the order of gguf's Q4_1: d * q + m
        w = codes.astype(f32) * s + minimum.astype(f32)[..., None, :]
    return w.reshape(*lead, 2 * n_rows, n_out).astype(dtype)


def kernel(p: dict, mode: str, dtype) -> jax.Array:
    """A projection's kernel [..., in, out] in `dtype` from its parameter dict: the float `kernel`, or
    the dequantized `kernel_q` / `kernel_scale` (/ `kernel_min`) of a quantized base (`mode`: the
    model's base_quant)."""
    if "kernel_q" in p:
        return dequantize(p["kernel_q"], p["kernel_scale"], mode, dtype, p.get("kernel_min"))
    return p["kernel"].astype(dtype)


def from_gguf_blocks(raw: np.ndarray, qtype: str) -> dict:
    """A GGUF tensor's blocks (`GGUFReader` tensor data: uint8 [out, bytes per row], rows = output
    features, blocks along the input) as this module's arrays, the values unchanged: {"kernel_q":
    codes [in / 2, out] uint8 (4-bit, llama.cpp's nibble order is ours) or [in, out] int8 (Q8_0),
    "kernel_scale": float16 [in / 32, out], and for Q4_1 "kernel_min": float16 [in / 32, out]}.
    `dequantize` of them gives exactly the gguf package's float32 weights (transposed)."""
    if qtype not in GGUF_BLOCKS:
        raise ValueError(f"GGUF block type {qtype} cannot be kept as a quantized base; supported: "
                         f"{', '.join(GGUF_BLOCKS)}")
    per, size = GGUF_BLOCKS[qtype]
    n_out = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n_out, -1, size)  # [out, nb, bytes]
    nb = blocks.shape[1]
    out = {"kernel_scale": blocks[..., 0:2].copy().view(np.float16)[..., 0].T.copy()}
    if qtype == "Q4_1":
        out["kernel_min"] = blocks[..., 2:4].copy().view(np.float16)[..., 0].T.copy()
    body = blocks[..., size - (per if qtype == "Q8_0" else per // 2):]
    if qtype == "Q8_0":
        body = body.view(np.int8)
    # [out, nb, bytes of a block] -> [nb * bytes, out]: byte j of block b is row b * bytes + j.
    out["kernel_q"] = np.ascontiguousarray(body.reshape(n_out, -1).T)
    assert out["kernel_q"].shape[0] == nb * body.shape[-1]
    return out


@functools.partial(jax.jit, static_argnums=(1, 2))
def _quantize_layer(w, mode, block):
    return quantize(w, mode, block)


def _quantize_stacked(w, mode: str, block: int):
    """`quantize` one layer at a time: the float32 temporaries of a 7B MLP kernel are then one layer's
    (~270 MB) instead of the whole stack's (~7.6 GB) while a checkpoint is being quantized."""
    if isinstance(w, jax.ShapeDtypeStruct) or w.ndim < 3:
        return quantize(w, mode, block)
    parts = [_quantize_layer(w[i], mode, block) for i in range(w.shape[0])]
    return jnp.stack([q for q, _ in parts]), jnp.stack([s for _, s in parts])


def projections(model):
    """(name, Dense module) of the seven projections of a Qwen2 / Qwen2Critic trunk's stacked layers."""
    layers = model.model.layers
    for group, names in PROJECTIONS:
        for name in names:
            yield name, getattr(getattr(layers, group), name)


def quantize_base(model, mode: str, block: int = BLOCK) -> None:
    """Store the projections of `model` (a Qwen2 or Qwen2Critic, adapters added or not) in `mode`, in
    place, and record the mode in every config the model holds (the forward reads it from there)."""
    if check_mode(mode) == "none":
        return
    if mode == "gguf":
        raise ValueError("base_quant 'gguf' keeps a .gguf file's own blocks (gguf.quantized_kernels + "
                         "set_quantized); it cannot be computed from float weights")
    for _, dense in projections(model):
        check_shape(dense.kernel.shape, mode, block)
    kernels = {}
    for name, dense in projections(model):
        q, scale = _quantize_stacked(dense.kernel[...], mode, block)
        kernels[name] = {"kernel_q": q, "kernel_scale": scale}
        del dense.kernel  # the float kernel goes before the next one is quantized
    set_quantized(model, kernels, mode)


def set_quantized(model, kernels: dict, mode: str) -> None:
    """Put quantized kernels ({projection name: {"kernel_q", "kernel_scale"[, "kernel_min"]}}, stacked
    over layers) in place of those projections' kernels, in place, and record `mode` in every config
    the model holds. Projections not named keep their float kernel (the forward takes either)."""
    for name, dense in projections(model):
        if name not in kernels:
            continue
        if hasattr(dense, "kernel"):
            del dense.kernel
        for key, value in kernels[name].items():
            setattr(dense, key, nnx.Param(jnp.asarray(value)))
    for _, node in nnx.iter_graph(model):
        cfg = getattr(node, "cfg", None) if isinstance(node, nnx.Module) else None
        if cfg is not None and hasattr(cfg, "base_quant"):
            node.cfg = cfg.replace(base_quant=mode)


def dequantized_state(state: dict, mode: str, dtype=None) -> dict:
    """A pure parameter dict with every quantized kernel replaced by its float `kernel` (in `dtype`,
    default its scale's dtype): the weights of the dequantize-then-float model."""
    def walk(node):
        if not isinstance(node, dict):
            return node
        if "kernel_q" in node:
            out = {k: walk(v) for k, v in node.items() if k not in QUANT_KEYS}
            out["kernel"] = kernel(node, mode, dtype or node["kernel_scale"].dtype)
            return out
        return {k: walk(v) for k, v in node.items()}

    return walk(state)


__all__ = ["BLOCK", "GGUF_BLOCKS", "MODES", "NF4_TABLE", "Q8_BLOCK", "QUANT_KEYS", "check_mode", "check_shape", "dequantize",
           "dequantized_state", "from_gguf_blocks", "kernel", "projections", "quantize", "quantize_base",
           "set_quantized"]
