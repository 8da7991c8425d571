"""The decoder in Flax NNX (Qwen2 / Qwen2.5, Llama 3.x and Qwen3: one model, family switches in the
config), with a compact KV cache.

Parameter tree (per-layer weights are stacked on a leading `L` axis so the layer loop is one
`lax.scan`: compile time does not grow with depth, and the KV cache is carried through the loop and
updated in place):

    model/embed_tokens/embedding                  [V, H]
    model/layers/input_layernorm/scale            [L, H]
    model/layers/self_attn/{q,k,v}_proj/kernel    [L, H, heads*head_dim]   (+ bias: qwen2; attention_bias)
    model/layers/self_attn/o_proj/kernel          [L, heads*head_dim, H]   (+ bias: attention_bias)
    model/layers/self_attn/{q,k}_norm/scale       [L, head_dim]            (qwen3 only)
    model/layers/post_attention_layernorm/scale   [L, H]
    model/layers/mlp/{gate,up}_proj/kernel        [L, H, I]
    model/layers/mlp/down_proj/kernel             [L, I, H]                (+ biases: mlp_bias)
    model/norm/scale                              [H]
    lm_head/kernel                                [H, V]   (only when embeddings are untied)

Kernels are stored `[in, out]` (HF stores `[out, in]`; weights.py holds the mapping table).

Cache rule (docs/design.md): a call writes its VALID tokens compactly at slots
`end[b] + cumsum(valid[b]) - 1`, advances `end[b]` by the number of valid tokens, and a query attends
to every slot `<=` its own slot; slot == RoPE position. Without a cache, positions are
`cumsum(valid) - 1` and query q attends to keys k <= q with valid[k].

Jitting pure functions over the parameters (what the sampler and trainer do):

    graphdef, params = nnx.split(model)

    @jax.jit
    def step(params, tokens, valid, cache):
        model = nnx.merge(graphdef, params)
        hidden, cache = model(tokens, valid, cache)
        return model.logits(hidden[:, -1]), cache

`forward(graphdef, params, tokens, valid, cache)` below is exactly that (without the jit).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from ragen_jax.models.attention import attention, cached_attention, fill_buckets, filled_read
from ragen_jax.models.qwen2 import decode as decode_weights
from ragen_jax.models.quant import kernel as quant_kernel
from ragen_jax.models.qwen2.config import REMAT_POLICIES, Qwen2Config

f32 = jnp.float32


def unrolled_decode(cfg: Qwen2Config, cache: "KVCache") -> bool:
    """Whether a single-token step unrolls the layers (`cfg.decode_unroll`: faster decode, at the cost
    of one per-layer copy of the layer weights in the compute dtype alive while a program decodes; off,
    the scan re-slices the stacked weights every token). Only on XLA:CPU (where a sliced weight is copied
    before every dot) and only with a 32-bit cache: the 16-bit cache's CPU write (`_write_kv`) is in
    place inside the layer scan but not once unrolled, where XLA keeps a second full cache copy alive,
    which costs more memory than the unroll saves time at rollout sizes (bench/results/memory.json)."""
    k = cache.k[0] if isinstance(cache, LayerKVCache) else cache.k
    return cfg.decode_unroll and jax.default_backend() == "cpu" and k.dtype.itemsize >= 4


# ----------------------------------------------------------------------------- KV cache
KV_QUANT = ("none", "int8")  # rollout.kv_cache_quant


def quantize_kv(x: jax.Array, scale_dtype=f32) -> tuple[jax.Array, jax.Array]:
    """int8 codes of keys or values [..., head_dim] with one scale per token and head (the last axis
    reduced): scale = max |x| / 127 (stored in `scale_dtype`), code = round(x / scale) in [-127, 127],
    computed with the float32 scale; an all-zero vector gets scale 0 and codes 0."""
    xf = x.astype(f32)
    scale = jnp.max(jnp.abs(xf), axis=-1) / 127.0
    q = jnp.round(xf / jnp.where(scale == 0, 1.0, scale)[..., None])
    return jnp.clip(q, -127, 127).astype(jnp.int8), scale.astype(scale_dtype)


def dequantize_kv(q: jax.Array, scale: jax.Array) -> jax.Array:
    """Keys or values in the scale's dtype from int8 codes [..., head_dim] and scales [...]."""
    return (q.astype(f32) * scale.astype(f32)[..., None]).astype(scale.dtype)


@struct.dataclass
class KVCache:
    """Per-row compact cache. Writes past `max_len` are dropped (end still advances): size it for the
    longest sequence. With `quant="int8"` (rollout.kv_cache_quant) k and v hold int8 codes and
    k_scale / v_scale one scale per token and kv head (`quantize_kv`), in the cache dtype: each layer's
    keys/values are dequantized to that dtype where attention reads them."""

    k: jax.Array  # [L, B, S, n_kv_heads, head_dim], compute dtype (int8 codes when quantized)
    v: jax.Array  # [L, B, S, n_kv_heads, head_dim]
    end: jax.Array  # [B] int32: number of slots filled (== next RoPE position)
    k_scale: jax.Array | None = None  # [L, B, S, n_kv_heads]: the int8 cache's scales; None: a float cache
    v_scale: jax.Array | None = None

    @classmethod
    def init(cls, cfg: Qwen2Config, batch: int, max_len: int, dtype=None, quant: str = "none") -> "KVCache":
        dtype = jnp.dtype(dtype or cfg.dtype)
        shape = (cfg.num_hidden_layers, batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
        end = jnp.zeros((batch,), jnp.int32)
        if quant == "none":
            return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), end=end)
        if quant != "int8":
            raise ValueError(f"unknown KV cache quantization {quant!r}; choose one of {', '.join(KV_QUANT)}")
        codes, scales = jnp.zeros(shape, jnp.int8), jnp.zeros(shape[:-1], dtype)
        return cls(k=codes, v=codes, end=end, k_scale=scales, v_scale=scales)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def append(self, new: NewKV) -> "KVCache":
        """The cache with `new`'s valid tokens written at each row's end (the cache rule), end advanced."""
        valid = new.valid
        pos = self.end[:, None] + jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
        slot = _slots(pos, valid, self.max_len)
        rows = jnp.arange(self.batch)[:, None]
        k, v, ks, vs = self.k, self.v, self.k_scale, self.v_scale
        for li in range(k.shape[0]):  # per layer: XLA:CPU's 16-bit scatter workaround is per layer (`_write_kv`)
            k, ks = _write_layer_kv(k, ks, li, rows, slot, new.k[li])
            v, vs = _write_layer_kv(v, vs, li, rows, slot, new.v[li])
        return KVCache(k=k, v=v, end=self.end + jnp.sum(valid, axis=1, dtype=jnp.int32), k_scale=ks, v_scale=vs)


@struct.dataclass
class NewKV:
    """Keys/values of tokens run after a cache without writing it (`Qwen2.extend`), to be written
    later with `KVCache.append`: lets a caller choose, per call, where the keys/values come from (a
    conditional around a computation that writes the cache in place makes XLA copy the cache)."""

    k: jax.Array  # [L, B, T, n_kv_heads, head_dim]
    v: jax.Array
    valid: jax.Array  # [B, T] bool: the tokens that are written (compactly, from each row's end)


@struct.dataclass
class LayerKVCache:
    """The KV cache as the unrolled single-token decode reads it (`decode_layout`): one [B, nKV, S, D]
    buffer per layer. On XLA:CPU a layer's keys/values sliced out of the stacked [L, B, S, nKV, D]
    cache are copied (and transposed for the attention dots) on every token; separate per-layer
    buffers in this order are read by the dots in place. Same contents as `stacked()`."""

    k: tuple  # L x [B, n_kv_heads, S, head_dim]
    v: tuple  # L x [B, n_kv_heads, S, head_dim]
    end: jax.Array  # [B] int32

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def stacked(self) -> KVCache:
        return KVCache(k=jnp.stack([a.swapaxes(1, 2) for a in self.k]),
                       v=jnp.stack([a.swapaxes(1, 2) for a in self.v]), end=self.end)


def decode_layout(cache, cfg: Qwen2Config):
    """The cache in the layout `cfg`'s single-token decode steps read fastest: a `LayerKVCache` where
    the decode is unrolled (`unrolled_decode`) and `cfg.layer_cache`, else unchanged. `stacked_layout`
    converts back. One copy of the cache each way per call, instead of one per layer and token."""
    if not isinstance(cache, KVCache) or not unrolled_decode(cfg, cache) or not cfg.layer_cache:
        return cache
    n = cache.k.shape[0]
    return LayerKVCache(k=tuple(cache.k[i].swapaxes(1, 2) for i in range(n)),
                        v=tuple(cache.v[i].swapaxes(1, 2) for i in range(n)), end=cache.end)


def stacked_layout(cache):
    """Inverse of `decode_layout`."""
    return cache.stacked() if isinstance(cache, LayerKVCache) else cache


@struct.dataclass
class PrefixKV:
    """Keys/values of one token prefix shared by a whole batch (e.g. the constant system prompt and
    instructions every episode starts with): computed once by `Qwen2.prefix_kv`, differentiable, so
    training on prefix + rows costs one prefix forward instead of one per row.

    Grouped (`Qwen2Trunk.group_prefix_forward`): G prefixes of up to P slots, `lengths[g]` filled,
    each shared by the rows of one group (episodes that start from the same state share their first
    observation); `for_rows(row_group)` says which prefix each row of the next call continues."""

    k: jax.Array  # [L, P, n_kv_heads, head_dim]; grouped: [L, G, P, n_kv_heads, head_dim]
    v: jax.Array
    lengths: jax.Array | None = None  # [G] int32: the filled slots of each group's prefix (grouped)
    row_group: jax.Array | None = None  # [R] int32: each row's prefix (grouped)

    @property
    def length(self) -> int:
        return self.k.shape[-3]

    @property
    def grouped(self) -> bool:
        return self.lengths is not None

    def for_rows(self, row_group: jax.Array) -> "PrefixKV":
        return self.replace(row_group=jnp.asarray(row_group, jnp.int32))


# ----------------------------------------------------------------------------- pure pieces
def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """HF Qwen2RMSNorm: normalise in float32, cast back, then scale."""
    dtype = x.dtype
    x32 = x.astype(f32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale.astype(dtype) * x32.astype(dtype)


def rope_inv_freq(cfg: Qwen2Config) -> np.ndarray:
    """[head_dim / 2] float32 rope frequencies, computed on the host in float32 as transformers does
    (`_compute_default_rope_parameters`, `_compute_llama3_parameters`): a compile-time constant."""
    d = cfg.head_dim
    inv = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(np.float32)
    if cfg.rope_type == "default":
        return inv
    factor, low, high = (np.float32(x) for x in (cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor))
    old_len = np.float32(cfg.rope_original_max_position_embeddings)
    wavelen = np.float32(2 * math.pi) / inv
    # Long wavelengths (beyond the original context / low) are slowed by `factor`, short ones kept,
    # and the band between interpolated smoothly.
    scaled = np.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(pos: jax.Array, cfg: Qwen2Config) -> tuple[jax.Array, jax.Array]:
    """cos/sin [..., head_dim] in float32 for integer positions (HF rope, duplicated halves)."""
    freqs = pos.astype(f32)[..., None] * jnp.asarray(rope_inv_freq(cfg))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, heads, head_dim]; cos/sin [B, T, head_dim]. HF `rotate_half` convention."""
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def dense_layer(x, p, lora_scale: float = 0.0, matmul_dtype: str | None = None, quant: str = "none"):
    """`quant`: the model's base_quant; a quantized kernel (`kernel_q` + `kernel_scale`) is dequantized
    here, per layer and per call, so only one layer's float kernel exists at a time (and the
    rematerialised backward dequantizes it again instead of keeping it)."""
    if matmul_dtype is None:
        if "kernel_t" in p:  # [out, in]: the decode path's per-layer copy (`decode.layer_weights`)
            y = jnp.einsum("...i,oi->...o", x, p["kernel_t"].astype(x.dtype))
        else:
            y = x @ quant_kernel(p, quant, x.dtype)
    else:  # rounded operands, float32 accumulation and output (Qwen2Config.matmul_dtype)
        xm = x.astype(matmul_dtype)
        if "kernel_t" in p:
            y = jnp.einsum("...i,oi->...o", xm, p["kernel_t"].astype(matmul_dtype), preferred_element_type=f32)
        else:
            y = jnp.einsum("...i,io->...o", xm, quant_kernel(p, quant, matmul_dtype), preferred_element_type=f32)
        y = y.astype(x.dtype)
    if "lora_a" in p:  # applied on the fly: the frozen base is never copied into merged weights
        y = y + ((x @ p["lora_a"].astype(x.dtype)) @ p["lora_b"].astype(x.dtype)) * jnp.asarray(lora_scale, x.dtype)
    if "bias" in p:
        y = y + p["bias"].astype(x.dtype)
    return y


def _attn_in(cfg: Qwen2Config, p, x, cos, sin):
    """Pre-norm + q/k/v projections + RoPE for one layer."""
    b, t, _ = x.shape
    h = rms_norm(x, p["input_layernorm"]["scale"], cfg.rms_norm_eps)
    a, s, mm, qz = p["self_attn"], cfg.lora_scale, cfg.matmul_dtype, cfg.base_quant
    q = dense_layer(h, a["q_proj"], s, mm, qz).reshape(b, t, cfg.num_attention_heads, cfg.head_dim)
    k = dense_layer(h, a["k_proj"], s, mm, qz).reshape(b, t, cfg.num_key_value_heads, cfg.head_dim)
    v = dense_layer(h, a["v_proj"], s, mm, qz).reshape(b, t, cfg.num_key_value_heads, cfg.head_dim)
    if cfg.qk_norm:  # Qwen3: per-head RMSNorm over head_dim, before rope
        q = rms_norm(q, a["q_norm"]["scale"], cfg.rms_norm_eps)
        k = rms_norm(k, a["k_norm"]["scale"], cfg.rms_norm_eps)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _attn_out_mlp(cfg: Qwen2Config, p, x, attn):
    s, mm, qz = cfg.lora_scale, cfg.matmul_dtype, cfg.base_quant
    x = x + dense_layer(attn, p["self_attn"]["o_proj"], s, mm, qz)
    h = rms_norm(x, p["post_attention_layernorm"]["scale"], cfg.rms_norm_eps)
    m = p["mlp"]
    gate, up = dense_layer(h, m["gate_proj"], s, mm, qz), dense_layer(h, m["up_proj"], s, mm, qz)
    return x + dense_layer(jax.nn.silu(gate) * up, m["down_proj"], s, mm, qz)


def _write_kv(cache: jax.Array, li, rows, slots, new: jax.Array) -> jax.Array:
    """cache[li, rows, slots] = new for the stacked [L, B, S, ...] cache; slots >= S are dropped.

    One scatter into the stack, in place, except on XLA:CPU with a 16-bit cache: XLA:CPU has no
    bfloat16/float16 scatter and converts the whole operand (every layer's cache) to float32 and back
    around it, two full-cache float32 copies per layer and token. There the scatter goes into this
    layer's slice as same-width integers (bit-exact) and the slice is written back in place.
    """
    new = new.astype(cache.dtype)
    if cache.dtype.itemsize >= 4 or jax.default_backend() != "cpu":
        return cache.at[li, rows, slots].set(new, mode="drop")
    bits = jnp.dtype(f"uint{8 * cache.dtype.itemsize}")
    layer = jax.lax.bitcast_convert_type(jax.lax.dynamic_index_in_dim(cache, li, 0, keepdims=False), bits)
    layer = layer.at[rows, slots].set(jax.lax.bitcast_convert_type(new, bits), mode="drop")
    return jax.lax.dynamic_update_index_in_dim(cache, jax.lax.bitcast_convert_type(layer, cache.dtype), li, 0)


def _write_layer_kv(cache: jax.Array, scale, li, rows, slots, new: jax.Array):
    """`_write_kv` of one layer's new keys or values; an int8 cache (`scale` not None) gets their codes
    and scales (`quantize_kv`). Returns (cache, scale)."""
    if scale is None:
        return _write_kv(cache, li, rows, slots, new), None
    q, sc = quantize_kv(new, scale.dtype)
    return _write_kv(cache, li, rows, slots, q), _write_kv(scale, li, rows, slots, sc)


def _layer_kv(cache: jax.Array, scale, li) -> jax.Array:
    """Layer `li`'s keys or values [B, S, n_kv, D] of the stacked cache, dequantized where it is int8."""
    a = jax.lax.dynamic_index_in_dim(cache, li, axis=0, keepdims=False)
    if scale is None:
        return a
    return dequantize_kv(a, jax.lax.dynamic_index_in_dim(scale, li, axis=0, keepdims=False))


def _is_16bit_float(a) -> bool:
    return jnp.issubdtype(a.dtype, jnp.floating) and a.dtype.itemsize == 2


def scan_layers(layer, carry, layers, *rest):
    """`jax.lax.scan(layer, carry, (layers, *rest))` over the stacked [L, ...] weights, for forwards
    no gradient flows through (the cached path; the no-cache path with `inference=True`).

    On XLA:CPU, 16-bit float weights are scanned as same-width integers (bit-exact) and reinterpreted
    inside the layer: XLA:CPU has no bfloat16/float16 dynamic-slice, so its float normalisation slices
    the WHOLE stacked weight as float32 in the loop body, and loop-invariant code motion then hoists
    that conversion out of the rollout's loops: a float32 copy of every layer's weights (twice a 16-bit
    model) alive for the whole program; the integer view costs one 16-bit copy instead. A forward that is
    differentiated cannot scan integers for its trained weights: a LoRA model's training forward uses
    `scan_frozen_base`, full training the plain scan. GPU/TPU slice 16-bit arrays natively and scan
    them as they are."""
    if jax.default_backend() != "cpu":
        return jax.lax.scan(layer, carry, (layers, *rest))
    dtypes = jax.tree.map(lambda a: a.dtype, layers)

    def narrow(a):
        return jax.lax.bitcast_convert_type(a, jnp.uint16) if _is_16bit_float(a) else a

    def body(c, xs):
        p = jax.tree.map(lambda a, d: a if a.dtype == d else jax.lax.bitcast_convert_type(a, d), xs[0], dtypes)
        return layer(c, (p, *xs[1:]))

    return jax.lax.scan(body, carry, (jax.tree.map(narrow, layers), *rest))


def _is_quantized_base(path, a) -> bool:
    """Whether a stacked layer leaf belongs to a quantized base (models/quant.py): its integer codes or
    the scales (and GGUF Q4_1 mins) beside them."""
    return jnp.issubdtype(a.dtype, jnp.integer) or getattr(path[-1], "key", None) in ("kernel_scale", "kernel_min")


def _as_dtype(a, dtype):
    """`a` (a slice of a frozen leaf: its integer view, or the leaf itself) in the leaf's dtype."""
    return a if a.dtype == dtype else jax.lax.bitcast_convert_type(a, dtype)


def scan_frozen_base(layer, carry, layers, rest, remat_policy):
    """The rematerialised training forward's layer scan of a LoRA model on XLA:CPU (see `scan_layers`):
    the frozen 16-bit base is held as same-width integers, closed over (not scanned: a scanned input
    would be stacked again as a residual for the backward) and sliced per layer inside the
    rematerialised layer; the trained (float32) leaves are scanned as usual. Only for LoRA: there
    every 16-bit leaf is frozen, and an integer view carries no gradient. Without remat the plain scan
    measured the same memory, so it keeps that. A quantized base's codes (integers) and scales are
    frozen too and closed over the same way (they need no integer view)."""
    paths, tree = jax.tree_util.tree_flatten_with_path(layers)
    leaves = [a for _, a in paths]
    frozen = {i: jax.lax.bitcast_convert_type(a, jnp.uint16) if _is_16bit_float(a) else a
              for i, (path, a) in enumerate(paths) if _is_16bit_float(a) or _is_quantized_base(path, a)}
    dtypes = [a.dtype for a in leaves]
    trained = [a for i, a in enumerate(leaves) if i not in frozen]

    def body(c, xs):
        li, trained_li, *r = xs
        it = iter(trained_li)
        p = [_as_dtype(jax.lax.dynamic_index_in_dim(frozen[i], li, 0, keepdims=False), dtypes[i])
             if i in frozen else next(it) for i in range(len(leaves))]
        return layer(c, (jax.tree.unflatten(tree, p), *r))

    n_layers = leaves[0].shape[0]
    return jax.lax.scan(jax.checkpoint(body, policy=remat_policy), carry,
                        (jnp.arange(n_layers, dtype=jnp.int32), trained, *rest))


def decoder_stack(cfg: Qwen2Config, layers, x, valid, cache: KVCache | None, prefix: "PrefixKV | None" = None,
                  return_kv: bool = False, inference: bool = False, write: bool = True):
    """Run all layers. `layers` is the pure dict of stacked [L, ...] arrays. Returns (x, cache), or
    (x, (k, v)) with every layer's keys/values [L, B, T, n_kv, hd] when `return_kv` (no cache), or
    with a cache and `write=False` (x, `NewKV`): the cache only read (`Qwen2.extend`).

    `prefix` (no-cache path only): keys/values of a prefix SHARED by every row, computed once
    (`Qwen2.prefix_kv`); the rows then start at RoPE position P and attend to all P prefix slots
    before their own causal, valid keys. Exactly the full-sequence forward of prefix + row.

    Attention uses `cfg.attention` (models/attention.py: the kernel is chosen per call from the
    layout, shapes, dtype and backend; single-token decode always takes the cheap xla path)."""
    if cache is None:
        return _full_sequence_stack(cfg, layers, x, valid, prefix, return_kv, inference)
    return _cached_stack(cfg, layers, x, valid, cache, write)


def _full_sequence_stack(cfg: Qwen2Config, layers, x, valid, prefix, return_kv: bool, inference: bool):
    """`decoder_stack` without a cache: every layer over the whole sequence (training, scoring)."""
    b = x.shape[0]
    attend = functools.partial(attention, implementation=cfg.attention, block=cfg.attention_block)
    p_len = 0 if prefix is None else prefix.length
    grouped = prefix is not None and prefix.grouped
    if grouped and prefix.row_group is None:
        raise ValueError("a grouped prefix needs for_rows(row_group): which group's prefix each row continues")
    # Each row's prefix slots (all P, or its group's filled ones) and its RoPE positions after them.
    filled = prefix.lengths[prefix.row_group][:, None] if grouped else jnp.full((b, 1), p_len, jnp.int32)
    pos = filled + jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
    # Self-attention layout: query t sees the row's prefix slots and its valid keys <= t.
    kv_valid = valid if prefix is None else jnp.concatenate([jnp.arange(p_len)[None, :] < filled, valid], axis=1)
    cos, sin = rope_cos_sin(pos, cfg)

    def rows_of(pk):
        """The prefix keys (or values) of every row: its group's, or the one prefix broadcast."""
        return pk[prefix.row_group] if grouped else jnp.broadcast_to(pk, (b, *pk.shape))

    def layer(x, xs):
        p, pk, pv = xs
        q, k, v = _attn_in(cfg, p, x, cos, sin)
        keys, vals = k, v
        if prefix is not None:  # [P, nKV, D] per row: the prefix is computed once
            keys = jnp.concatenate([rows_of(pk).astype(k.dtype), k], axis=1)
            vals = jnp.concatenate([rows_of(pv).astype(v.dtype), v], axis=1)
        out = attend(q, keys, vals, kv_valid, q_valid=valid)
        return _attn_out_mlp(cfg, p, x, out), ((k, v) if return_kv else None)

    rest = (None, None) if prefix is None else (prefix.k, prefix.v)
    if inference:  # no gradient flows through this forward (e.g. the old-log-prob pass)
        return scan_layers(layer, x, layers, *rest)
    if cfg.lora_rank and cfg.remat and jax.default_backend() == "cpu":  # 16-bit leaves: the frozen base
        return scan_frozen_base(layer, x, layers, rest, REMAT_POLICIES[cfg.remat_policy])
    if cfg.remat:
        layer = jax.checkpoint(layer, policy=REMAT_POLICIES[cfg.remat_policy])
    x, kv = jax.lax.scan(layer, x, (layers, *rest))
    return x, kv


def _cached_stack(cfg: Qwen2Config, layers, x, valid, cache, write: bool = True):
    """`decoder_stack` with a cache: prefill or decode. `write` (the decode step, a turn's prefill):
    each layer writes its new keys/values into the cache first and then reads the filled slots back
    (`filled_read`). `write=False` (`Qwen2.extend`): the cache is only read, the new tokens attend to
    its filled slots and to each other (`attention.cached_attention`), and (x, `NewKV`) is returned
    for `KVCache.append`."""
    b, t, _ = x.shape
    s = cache.max_len
    n_new = jnp.sum(valid, axis=1, dtype=jnp.int32)
    pos = cache.end[:, None] + jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1  # slot == RoPE position
    slot = _slots(pos, valid, s)
    rows = jnp.arange(b)[:, None]
    cos, sin = rope_cos_sin(pos, cfg)
    # Both orders read only the slots some row has filled, in static buckets (attention.py
    # `read_filled`): decode cost follows the filled cache, not its capacity. Write-then-read where
    # the cache is written in place: read-then-write made XLA:CPU copy every layer's keys/values in
    # the token loop (12 capacity-sized copies against 4 at 2 layers; 1.79x the floor instead of 1.06x,
    # docs/experiments/decode.md).
    sizes = fill_buckets(s, cfg.attention_block) if cfg.decode_bound else (s,)
    attend = functools.partial(cached_attention, end=cache.end, valid=valid, implementation=cfg.attention,
                               block=cfg.attention_block, sizes=sizes)
    read = functools.partial(filled_read, q_slot=pos, q_valid=valid, sizes=sizes, implementation=cfg.attention,
                             block=cfg.attention_block)

    if isinstance(cache, LayerKVCache):
        if not write:
            raise ValueError("a LayerKVCache is written in place by the decode loop; extend() takes a KVCache")
        return _decode_layer_cache(cfg, layers, x, cache, rows, slot, cos, sin, n_new, read)

    def layer(carry, xs):
        x, ck, cv, cks, cvs = carry  # cks / cvs: an int8 cache's scales (None for a float cache)
        p, li = xs
        q, k, v = _attn_in(cfg, p, x, cos, sin)
        if write:  # only the new rows, into the loop-carried stacked cache (in place), then read back
            ck, cks = _write_layer_kv(ck, cks, li, rows, slot, k)
            cv, cvs = _write_layer_kv(cv, cvs, li, rows, slot, v)
            out = read(q, _layer_kv(ck, cks, li), _layer_kv(cv, cvs, li))
        else:  # the cache as it was: the bucket choice around this read alone holds no write
            out = attend(q, k, v, _layer_kv(ck, cks, li), _layer_kv(cv, cvs, li))
        return (_attn_out_mlp(cfg, p, x, out), ck, cv, cks, cvs), (None if write else (k, v))

    # No remat here: the cached path is inference (remat would only keep per-layer cache copies alive).
    carry = (x, cache.k, cache.v, getattr(cache, "k_scale", None), getattr(cache, "v_scale", None))
    if write and (t == 1 or cfg.prefill_unroll) and unrolled_decode(cfg, cache):
        # Single-token decode runs inside the sampler's token loop. A scan over the stacked [L, ...]
        # weights slices (copies) every layer's weights on every token before its matmuls (XLA:CPU
        # does not fuse a slice into a dot), tripling the memory traffic of a step that is bound by
        # streaming the weights. Static per-layer slices are loop-invariant, but XLA's loop-invariant
        # code motion leaves a bare slice in the loop ("cheap"); behind an optimization barrier it
        # hoists it: one copy per layer (cast to the compute dtype, which every use does anyway) per
        # program run instead of one per token (docs/experiments/decode.md).
        dt = jnp.dtype(cfg.dtype)
        for li in range(cfg.num_hidden_layers):
            p = jax.lax.optimization_barrier(decode_weights.layer_weights(layers, li, dt, cfg.matmul_dtype, cfg.decode_transposed))
            carry, _ = layer(carry, (p, jnp.int32(li)))
        new = None
    else:
        li = jnp.arange(cfg.num_hidden_layers, dtype=jnp.int32)
        carry, new = scan_layers(layer, carry, layers, li)
    x, ck, cv, cks, cvs = carry
    if not write:
        return x, NewKV(k=new[0], v=new[1], valid=valid)
    return x, KVCache(k=ck, v=cv, end=cache.end + n_new, k_scale=cks, v_scale=cvs)


def _slots(pos, valid, s: int):
    """Cache slots of new tokens at `pos`: invalid tokens (and overflow past S) target slot S, which
    the writes' mode="drop" discards."""
    return jnp.where(valid & (pos >= 0) & (pos < s), pos, s)


def _decode_layer_cache(cfg: Qwen2Config, layers, x, cache: LayerKVCache, rows, slot, cos, sin, n_new, read):
    """`decoder_stack` on a per-layer cache: the unrolled layers (hoisted weights, as for `KVCache`),
    each writing its new keys/values into its own [B, nKV, S, D] buffer and then reading its filled
    slots back (`read`: `filled_read` of the call)."""
    if x.shape[1] != 1 or not unrolled_decode(cfg, cache):
        raise ValueError("a LayerKVCache is for single-token decode steps on the unrolled path; convert it "
                         "with stacked_layout(cache) for longer appends")
    dt = jnp.dtype(cfg.dtype)
    ks, vs = list(cache.k), list(cache.v)
    for li in range(cfg.num_hidden_layers):
        p = jax.lax.optimization_barrier(decode_weights.layer_weights(layers, li, dt, cfg.matmul_dtype, cfg.decode_transposed))
        q, k, v = _attn_in(cfg, p, x, cos, sin)
        # [B, 1, nKV, D] rows into [B, nKV, S, D] at each row's slot; slot S is dropped.
        ks[li] = ks[li].at[rows, :, slot].set(k.astype(ks[li].dtype), mode="drop")
        vs[li] = vs[li].at[rows, :, slot].set(v.astype(vs[li].dtype), mode="drop")
        x = _attn_out_mlp(cfg, p, x, read(q, ks[li], vs[li], heads_first=True))
    return x, LayerKVCache(k=tuple(ks), v=tuple(vs), end=cache.end + n_new)


def _check_inputs(cfg: Qwen2Config, tokens, valid, cache):
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, time], got shape {tuple(tokens.shape)}")
    if tuple(valid.shape) != tuple(tokens.shape):
        raise ValueError(f"valid shape {tuple(valid.shape)} must equal tokens shape {tuple(tokens.shape)}")
    if isinstance(cache, LayerKVCache):
        want = (tokens.shape[0], cfg.num_key_value_heads, cache.max_len, cfg.head_dim)
        if len(cache.k) != cfg.num_hidden_layers or any(tuple(a.shape) != want for a in (*cache.k, *cache.v)):
            raise ValueError(f"per-layer KV cache does not match model/batch: want {cfg.num_hidden_layers} "
                             f"buffers of {want}")
    elif cache is not None:
        want = (cfg.num_hidden_layers, tokens.shape[0], cache.max_len, cfg.num_key_value_heads, cfg.head_dim)
        if tuple(cache.k.shape) != want:
            raise ValueError(f"KV cache shape {tuple(cache.k.shape)} does not match model/batch {want}")


# ----------------------------------------------------------------------------- modules
def _normal(rngs: nnx.Rngs, shape, dtype, std=0.02):
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, f32).astype(dtype))


class Dense(nnx.Module):
    """Linear layer with an optional leading stack axis; kernel stored [*stack, in, out]."""

    def __init__(self, din, dout, *, stack=(), bias: bool, param_dtype, rngs: nnx.Rngs):
        self.kernel = _normal(rngs, (*stack, din, dout), param_dtype)
        if bias:
            self.bias = nnx.Param(jnp.zeros((*stack, dout), param_dtype))


class Norm(nnx.Module):
    def __init__(self, shape, param_dtype):
        self.scale = nnx.Param(jnp.ones(shape, param_dtype))


class Attention(nnx.Module):
    def __init__(self, cfg: Qwen2Config, stack, rngs: nnx.Rngs):
        h, hd, pd = cfg.hidden_size, cfg.head_dim, cfg.param_dtype
        qkv, o = cfg.qkv_bias, cfg.o_bias
        self.q_proj = Dense(h, cfg.num_attention_heads * hd, stack=stack, bias=qkv, param_dtype=pd, rngs=rngs)
        self.k_proj = Dense(h, cfg.num_key_value_heads * hd, stack=stack, bias=qkv, param_dtype=pd, rngs=rngs)
        self.v_proj = Dense(h, cfg.num_key_value_heads * hd, stack=stack, bias=qkv, param_dtype=pd, rngs=rngs)
        self.o_proj = Dense(cfg.num_attention_heads * hd, h, stack=stack, bias=o, param_dtype=pd, rngs=rngs)
        if cfg.qk_norm:
            self.q_norm = Norm((*stack, hd), pd)
            self.k_norm = Norm((*stack, hd), pd)


class MLP(nnx.Module):
    def __init__(self, cfg: Qwen2Config, stack, rngs: nnx.Rngs):
        h, i, pd, bias = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype, cfg.mlp_bias
        self.gate_proj = Dense(h, i, stack=stack, bias=bias, param_dtype=pd, rngs=rngs)
        self.up_proj = Dense(h, i, stack=stack, bias=bias, param_dtype=pd, rngs=rngs)
        self.down_proj = Dense(i, h, stack=stack, bias=bias, param_dtype=pd, rngs=rngs)


class DecoderLayers(nnx.Module):
    """All decoder layers, parameters stacked on a leading [L] axis."""

    def __init__(self, cfg: Qwen2Config, rngs: nnx.Rngs):
        stack = (cfg.num_hidden_layers,)
        self.input_layernorm = Norm((*stack, cfg.hidden_size), cfg.param_dtype)
        self.self_attn = Attention(cfg, stack, rngs)
        self.post_attention_layernorm = Norm((*stack, cfg.hidden_size), cfg.param_dtype)
        self.mlp = MLP(cfg, stack, rngs)


class Embed(nnx.Module):
    def __init__(self, cfg: Qwen2Config, rngs: nnx.Rngs):
        self.embedding = _normal(rngs, (cfg.vocab_size, cfg.hidden_size), cfg.param_dtype)


class Qwen2Trunk(nnx.Module):
    """Embeddings + decoder layers + final norm (HF `Qwen2Model`)."""

    def __init__(self, cfg: Qwen2Config, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_tokens = Embed(cfg, rngs)
        self.layers = DecoderLayers(cfg, rngs)
        self.norm = Norm((cfg.hidden_size,), cfg.param_dtype)

    def embed_inputs(self, tokens, valid):
        cfg = self.cfg
        # Padding ids may be anything (-1, >= vocab): jnp.take would return NaN rows for them, and
        # NaN values of masked keys still poison valid outputs (0 * NaN) in the value matmul.
        ids = jnp.where(valid, jnp.clip(tokens.astype(jnp.int32), 0, cfg.vocab_size - 1), 0)
        return jnp.take(self.embed_tokens.embedding[...], ids, axis=0).astype(jnp.dtype(cfg.dtype))

    def __call__(self, tokens, valid, cache: KVCache | None = None, prefix: PrefixKV | None = None,
                 inference: bool = False):
        cfg = self.cfg
        tokens = jnp.asarray(tokens)
        valid = jnp.asarray(valid).astype(bool)
        _check_inputs(cfg, tokens, valid, cache)
        if prefix is not None and cache is not None:
            raise ValueError("a shared prefix and a KV cache cannot be combined: the prefix is for the "
                             "no-cache (training) forward")
        layers = nnx.state(self.layers, nnx.Param).to_pure_dict()
        x, cache = decoder_stack(cfg, layers, self.embed_inputs(tokens, valid), valid, cache, prefix, inference=inference)
        return rms_norm(x, self.norm.scale[...], cfg.rms_norm_eps), cache

    def extend(self, tokens, valid, cache: KVCache):
        """`__call__` with a cache that is only read: (hidden [B, T, H], `NewKV` of the tokens); then
        `cache.append(new)` equals the cache `__call__` returns."""
        cfg = self.cfg
        tokens, valid = jnp.asarray(tokens), jnp.asarray(valid).astype(bool)
        _check_inputs(cfg, tokens, valid, cache)
        layers = nnx.state(self.layers, nnx.Param).to_pure_dict()
        x, new = decoder_stack(cfg, layers, self.embed_inputs(tokens, valid), valid, cache, write=False)
        return rms_norm(x, self.norm.scale[...], cfg.rms_norm_eps), new

    def prefix_kv(self, prefix_tokens) -> PrefixKV:
        """Keys/values of a prefix every row of a later `__call__(..., prefix=)` shares. [P] ids."""
        return self.prefix_forward(prefix_tokens)[1]

    def group_prefix_forward(self, tokens, lengths, inference: bool = False) -> tuple[jax.Array, PrefixKV]:
        """(final hidden states [G, P, H], grouped keys/values) of G prefixes `tokens` [G, P] of which
        the first `lengths[g]` ids are real: each is shared by the rows of one group
        (`PrefixKV.for_rows`)."""
        tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths, jnp.int32)
        if tokens.ndim != 2 or lengths.shape != tokens.shape[:1]:
            raise ValueError(f"group prefixes are tokens [G, P] with lengths [G], got {tuple(tokens.shape)} and "
                             f"{tuple(lengths.shape)}")
        valid = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
        layers = nnx.state(self.layers, nnx.Param).to_pure_dict()
        x, (k, v) = decoder_stack(self.cfg, layers, self.embed_inputs(tokens, valid), valid, None, return_kv=True,
                                  inference=inference)
        return rms_norm(x, self.norm.scale[...], self.cfg.rms_norm_eps), PrefixKV(k=k, v=v, lengths=lengths)

    def prefix_forward(self, prefix_tokens, inference: bool = False) -> tuple[jax.Array, PrefixKV]:
        """(final hidden states [P, H], keys/values) of a prefix that rows share: what scoring a record
        needs of its prefix, computed once for the batch instead of once per row. [P] ids."""
        tokens = jnp.asarray(prefix_tokens)
        if tokens.ndim != 1:
            raise ValueError(f"a shared prefix is one token sequence [P], got shape {tuple(tokens.shape)}")
        tokens = tokens[None]
        valid = jnp.ones(tokens.shape, bool)
        layers = nnx.state(self.layers, nnx.Param).to_pure_dict()
        x, (k, v) = decoder_stack(self.cfg, layers, self.embed_inputs(tokens, valid), valid, None, return_kv=True,
                                  inference=inference)
        return rms_norm(x[0], self.norm.scale[...], self.cfg.rms_norm_eps), PrefixKV(k=k[:, 0], v=v[:, 0])


class Qwen2(nnx.Module):
    """The causal LM of every family (Qwen2/Llama/Qwen3ForCausalLM, `cfg.model_type`). `model(tokens, valid, cache) -> (hidden [B,T,H], cache)`; `model.logits(hidden)`."""

    def __init__(self, cfg: Qwen2Config, rngs: nnx.Rngs):
        self.cfg = cfg
        self.model = Qwen2Trunk(cfg, rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = Dense(cfg.hidden_size, cfg.vocab_size, bias=False, param_dtype=cfg.param_dtype, rngs=rngs)

    def __call__(self, tokens, valid, cache: KVCache | None = None, prefix: PrefixKV | None = None,
                 inference: bool = False):
        """`inference=True`: no gradient will flow through this call (memory layout choice only)."""
        return self.model(tokens, valid, cache, prefix, inference=inference)

    def prefix_kv(self, prefix_tokens) -> PrefixKV:
        return self.model.prefix_kv(prefix_tokens)

    def extend(self, tokens, valid, cache: KVCache):
        return self.model.extend(tokens, valid, cache)

    def logits(self, hidden: jax.Array, head: jax.Array | None = None) -> jax.Array:
        """[..., H] -> float32 [..., V]; float32 accumulation whatever the compute dtype.
        `head`: the weight from `head_weight()`, made once outside a token loop."""
        dt = self.cfg.matmul_dtype or hidden.dtype
        w = self.head_weight(barrier=False) if head is None else head
        spec = "...h,vh->...v" if self.cfg.tie_word_embeddings else "...h,hv->...v"
        return jnp.einsum(spec, hidden.astype(dt), w.astype(dt), preferred_element_type=f32)

    def head_weight(self, barrier: bool = True) -> jax.Array:
        """The vocabulary head's weight in the matmul dtype. A token loop takes it once before the loop
        (`barrier`: XLA does not hoist a convert out of the loop's conditional body, and converting the
        [V, H] matrix every step would stream it three times)."""
        w = self.model.embed_tokens.embedding[...] if self.cfg.tie_word_embeddings else self.lm_head.kernel[...]
        if self.cfg.matmul_dtype is not None:
            w = w.astype(self.cfg.matmul_dtype)
        return jax.lax.optimization_barrier(w) if barrier else w


class Qwen2Critic(nnx.Module):
    """Value model: Qwen2 trunk + float32 Linear(hidden -> 1). `critic(tokens, valid) -> values [B, T]`."""

    def __init__(self, cfg: Qwen2Config, rngs: nnx.Rngs):
        self.cfg = cfg
        self.model = Qwen2Trunk(cfg, rngs)
        # Like HF *ForTokenClassification(num_labels=1) as used by verl critics: N(0, 0.02) kernel, zero bias.
        self.value_head = Dense(cfg.hidden_size, 1, bias=True, param_dtype="float32", rngs=rngs)

    def __call__(self, tokens, valid, inference: bool = False, prefix: PrefixKV | None = None) -> jax.Array:
        hidden, _ = self.model(tokens, valid, None, prefix, inference=inference)
        return self.values(hidden)

    def values(self, hidden: jax.Array) -> jax.Array:
        """[..., H] final hidden states -> float32 [...] values."""
        return dense_layer(hidden.astype(f32), nnx.state(self.value_head, nnx.Param).to_pure_dict())[..., 0]

    def prefix_kv(self, prefix_tokens) -> PrefixKV:
        return self.model.prefix_kv(prefix_tokens)


def critic_from_policy(policy: Qwen2, rngs: nnx.Rngs | None = None, share_trunk: bool = False) -> Qwen2Critic:
    """A critic whose trunk starts from the policy's weights.

    Default: a separate copy (the reference trains policy and critic as two models). With
    `share_trunk=True` the critic references the very same trunk module (shared parameters).
    """
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    critic = nnx.eval_shape(lambda: Qwen2Critic(policy.cfg, nnx.Rngs(0)))
    critic.model = policy.model if share_trunk else nnx.clone(policy.model)
    critic.value_head = Dense(policy.cfg.hidden_size, 1, bias=True, param_dtype="float32", rngs=rngs)
    return critic


def with_config(model, **changes):
    """A copy of `model` (same parameter arrays, not copied) whose config, wherever a module stores it
    (the LM and its trunk), has `changes`: e.g. `with_config(policy, decode_unroll=False)` for the
    layer-scan decode. Compiled programs key on the config, so each setting compiles its own program."""
    graphdef, state = nnx.split(model)
    out = nnx.merge(graphdef, state)
    for _, node in nnx.iter_graph(out):
        if isinstance(node, nnx.Module) and isinstance(getattr(node, "cfg", None), Qwen2Config):
            node.cfg = node.cfg.replace(**changes)
    return out


# ----------------------------------------------------------------------------- functional helpers
def forward(graphdef, params, tokens, valid, cache: KVCache | None = None):
    """Pure forward over split params: `graphdef, params = nnx.split(model)`."""
    return nnx.merge(graphdef, params)(tokens, valid, cache)


def logits_fn(graphdef, params, hidden):
    return nnx.merge(graphdef, params).logits(hidden)
