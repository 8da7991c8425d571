"""Attention with a choice of kernel: one function, `attention(q, k, v, ...)`, for every layout the
model uses (training / prefill rows, a shared prefix, KV-cache appends, single-token decode).

The rule every implementation computes (docs/design.md, "Cache semantics"):

    query t of row b sees key slot j  iff  kv_valid[b, j]  and  j <= q_slot[b, t]

`q_slot=None` is the self-attention layout of the no-cache forward: the queries are the LAST T of the
S key slots (q_slot = S - T + t; the first S - T slots are a prefix every row shares, `PrefixKV`).
With a KV cache, `q_slot` is each query's cache slot (== its RoPE position) and `kv_valid` is None.

Implementations (`model.attention`, `IMPLEMENTATIONS`):
  xla      the einsum path: [B, heads, T, S] float32 scores. The exact reference.
  chunked  blockwise online softmax (flash-style) in plain JAX with its own backward (custom_vjp):
           memory O(T x block) forward and backward; blocks no query can see are skipped. Any backend.
  cudnn    `jax.nn.dot_product_attention(implementation="cudnn")`: causal + per-row lengths. GPU,
           bf16/fp16, no shared prefix; assumes right-padded rows (valid tokens contiguous from slot
           0), which is what every trainer passes (`valid = arange(T) < length`).
  splash   the Pallas TPU splash-attention kernel: causal mask (offset = prefix length) + segment ids
           (1 valid, 0 padding; exact for any padding pattern). Off TPU it runs in the Pallas
           interpreter (slow; for tests only); which one is decided per lowering platform. Over
           several devices it runs in a shard_map over the context mesh (`partitioned`; the
           trainers trace their programs with `sharding.on_mesh`).
  auto     per call: decode and short sequences -> xla; no-cache rows -> cudnn on GPU (bf16/fp16,
           head_dim a multiple of 8 up to 128, no prefix), splash on TPU (one device, or traced on a
           context mesh), chunked elsewhere once a
           row's score matrix reaches `CHUNKED_MIN_SCORES`; cache appends of more than one token ->
           chunked from that size on (cudnn/splash have no per-row query offset).
An explicit cudnn/splash is used where its layout fits and the call falls back to the `auto` choice
otherwise (cudnn with a shared prefix, any kernel for cache appends).

New tokens and a KV cache (`cached_attention`): the new tokens attend to the cache's filled slots and
to each other, the cache only read (the caller writes the new keys/values afterwards). The cache part
reads only the slots below the largest filled length of a row with a used query; `read_filled` runs it
on the smallest of a few static slot counts (`fill_buckets`: block multiples growing by at most
`FILL_GROWTH`) that holds them, through one `lax.switch`: a decode step at 256 filled slots of a
3,600-slot cache reads 256 slots, not 3,600, with shapes that stay static (docs/experiments/decode.md).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

f32 = jnp.float32

IMPLEMENTATIONS = ("auto", "xla", "chunked", "cudnn", "splash")
# Finite rather than -inf: a query with no visible key (left padding) then gets a garbage but finite
# distribution instead of NaN, which would otherwise leak into gradients through `where`.
MASK_VALUE = -1e30
# `auto` switches from xla to chunked once one row-head's score matrix (T x S) has this many entries:
# below it xla's [B, heads, T, S] buffers are small and its few large matmuls are faster; above it
# they dominate activation memory (bench/results/attention.json has the speed ratio and memory).
CHUNKED_MIN_SCORES = 512 * 512
# Query and key block of the chunked kernel (Qwen2Config.attention_block). Small blocks keep a
# block's scores in cache on CPU (bench/results/attention.json compares 128/256/512).
DEFAULT_BLOCK = 128
_CUDNN_DTYPES = ("bfloat16", "float16")
# Consecutive `fill_buckets` sizes grow by at most this factor (and by at least one block): a call
# reads at most 25% more slots than it needs, with ~13 buckets for a 3,600-slot cache.
FILL_GROWTH = 1.25
# Caches under this many slots are read whole: each bucket is one more attention branch per layer to
# compile (decode programs compiled ~2x slower with 4 buckets at 512 slots), for at most a few hundred
# slots saved per step.
FILL_MIN_CAPACITY = 1024


# ----------------------------------------------------------------------------- choice
def check_available(implementation: str, dtype, backend: str | None = None, interpret_ok: bool = True,
                    query_backend: bool = True) -> None:
    """Raise ValueError (one sentence naming the fix) when `implementation` cannot run here.
    `interpret_ok=False`: splash off TPU (the slow Pallas interpreter) counts as unavailable.
    `query_backend=False` checks only what the config decides (name, dtype): config validation runs
    before a multi-host launcher has joined its cluster, when the backend must not be started yet."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is unknown; choose one of "
                         f"{', '.join(IMPLEMENTATIONS)}")
    if implementation == "cudnn" and jnp.dtype(dtype).name not in _CUDNN_DTYPES:
        raise ValueError(f"attention implementation 'cudnn' needs a bfloat16/float16 compute dtype, got "
                         f"{jnp.dtype(dtype).name}; set model.dtype=bfloat16 or use 'auto'/'chunked'")
    if implementation not in ("cudnn", "splash") or not (query_backend or backend):
        return
    backend = backend or jax.default_backend()
    if implementation == "cudnn" and backend != "gpu":
        raise ValueError(f"attention implementation 'cudnn' runs only on a GPU (this backend is {backend!r}); "
                         "use 'auto' or 'chunked'")
    if implementation == "splash" and backend != "tpu" and not interpret_ok:
        raise ValueError(f"attention implementation 'splash' runs only on a TPU (this backend is {backend!r}; "
                         "elsewhere only in the slow Pallas interpreter); use 'auto' or 'chunked'")


def resolve(implementation: str, *, t: int, s: int, self_layout: bool, dtype, head_dim: int,
            backend: str | None = None, n_devices: int | None = None, on_mesh: bool | None = None) -> str:
    """The kernel one call uses (static: shapes, dtype, backend, device count and whether the call is
    traced on a context mesh, `on_mesh`; None reads it: `sharding.on_mesh`)."""
    backend = backend or jax.default_backend()
    n_devices = jax.device_count() if n_devices is None else n_devices
    on_mesh = not jax.sharding.get_abstract_mesh().empty if on_mesh is None else on_mesh
    prefix = s != t
    if implementation == "cudnn" and self_layout and not prefix:
        return "cudnn"
    if implementation == "splash" and self_layout:
        return "splash"
    if implementation in ("xla", "chunked"):
        return implementation
    # auto, or an explicit cudnn/splash whose layout does not fit this call.
    if t == 1:
        return "xla"  # decode: [B, heads, 1, S] scores are already O(S)
    if self_layout and implementation == "auto":
        if backend == "gpu" and jnp.dtype(dtype).name in _CUDNN_DTYPES and head_dim % 8 == 0 and head_dim <= 128 \
                and not prefix:
            return "cudnn"
        # Over several devices splash runs in a shard_map built from the context mesh (`partitioned`:
        # XLA cannot partition a Mosaic call); a program traced without one runs chunked there.
        if backend == "tpu" and (n_devices == 1 or on_mesh):
            return "splash"
    return "chunked" if t * s >= CHUNKED_MIN_SCORES else "xla"


def attention(q: jax.Array, k: jax.Array, v: jax.Array, kv_valid: jax.Array | None = None,
              q_slot: jax.Array | None = None, q_valid: jax.Array | None = None, *,
              implementation: str = "auto", block: int = DEFAULT_BLOCK) -> jax.Array:
    """Grouped-query attention without repeating k/v. q [B, T, nH, D], k/v [B, S, nKV, D] -> [B, T, nH*D].

    kv_valid [B, S] bool (None: all), q_slot [B, T] int (None: self-attention layout, see the module
    docstring). q_valid [B, T] bool (optional): the queries whose outputs are used; the others' outputs
    are unspecified but finite (lets the chunked kernel skip padding). Scores and softmax in float32.
    """
    b, t, nh, d = q.shape
    s, nkv = k.shape[1], k.shape[2]
    if nh % nkv:
        raise ValueError(f"query heads ({nh}) must be a multiple of key/value heads ({nkv})")
    if q_slot is None and s < t:
        raise ValueError(f"self-attention layout needs at least as many key slots ({s}) as queries ({t})")
    check_available(implementation, q.dtype)
    impl = resolve(implementation, t=t, s=s, self_layout=q_slot is None, dtype=q.dtype, head_dim=d)
    if impl == "cudnn":
        return cudnn_attention(q, k, v, kv_valid).reshape(b, t, nh * d)
    if impl == "splash":
        return partitioned(_splash_per_platform, q, k, v, kv_valid).reshape(b, t, nh * d)
    if q_slot is None:
        q_slot = jnp.broadcast_to(jnp.arange(s - t, s, dtype=jnp.int32), (b, t))
    if impl == "chunked":
        return chunked_attention(q, k, v, kv_valid, q_slot, q_valid, block=block).reshape(b, t, nh * d)
    return xla_attention(q, k, v, visible_mask(kv_valid, q_slot, s))


def visible_mask(kv_valid: jax.Array | None, q_slot: jax.Array, s: int) -> jax.Array:
    """The rule as a [B, T, S] bool mask."""
    mask = jnp.arange(s)[None, None, :] <= q_slot[:, :, None]
    return mask if kv_valid is None else mask & kv_valid[:, None, :]


# ----------------------------------------------------------------------------- filled reads
def fill_buckets(capacity: int, block: int = DEFAULT_BLOCK, min_capacity: int = FILL_MIN_CAPACITY) -> tuple[int, ...]:
    """The static slot counts `read_filled` chooses from for a cache of `capacity` slots: multiples of
    `block`, each at most `FILL_GROWTH` times (and at least one block more than) the previous, ending
    with `capacity` itself; `capacity` alone below `min_capacity`."""
    if capacity < min_capacity:
        return (capacity,)
    sizes, n = [], block
    while n < capacity:
        sizes.append(n)
        n = max(n + block, _round_up(math.ceil(n * FILL_GROWTH), block))
    return (*sizes, capacity)


def read_filled(fn, *, needed: jax.Array, sizes: tuple[int, ...], operands: tuple):
    """`fn(n, *operands)` for the smallest static `n` in `sizes` with n >= `needed` (the last size when
    none is): one `lax.switch` whose branches slice their keys/values to n slots. Exact when every key
    slot >= `needed` is masked for every used query (`cached_attention`: the largest filled length of
    a row with a used query)."""
    if len(sizes) == 1:
        return fn(sizes[0], *operands)
    idx = jnp.minimum(jnp.searchsorted(jnp.asarray(sizes, jnp.int32), needed, side="left"), len(sizes) - 1)
    return jax.lax.switch(idx, [functools.partial(fn, n) for n in sizes], *operands)


def filled_read(q, cache_k, cache_v, *, q_slot, q_valid, sizes: tuple[int, ...], heads_first: bool = False,
                implementation: str = "auto", block: int = DEFAULT_BLOCK) -> jax.Array:
    """Attention of T new tokens ALREADY WRITTEN into a cache at their slots `q_slot` [B, T]: query t
    sees the slots <= q_slot[b, t] (the cache rule). Reads only the smallest of `sizes` that holds the
    largest slot of a used query (`q_valid`); the chunked kernel (long appends) skips the blocks past
    its queries by itself and reads the whole cache. q [B, T, nH, D]; cache_k/v [B, S, nKV, D]
    (`heads_first`: [B, nKV, S, D], the per-layer decode layout). -> [B, T, nH * D]."""
    b, t, nh, d = q.shape
    s = cache_k.shape[2 if heads_first else 1]
    needed = jnp.max(jnp.where(q_valid, q_slot + 1, 0)).astype(jnp.int32)
    if heads_first:
        def part(n, ck, cv):
            o, _ = _part(q, ck[:, :, :n], cv[:, :, :n], visible_mask(None, q_slot, n), heads_first=True)
            return o.astype(q.dtype).reshape(b, t, nh * d)
    else:
        if resolve(implementation, t=t, s=s, self_layout=False, dtype=q.dtype, head_dim=d) == "chunked":
            sizes = (s,)

        def part(n, ck, cv):
            return attention(q, ck[:, :n], cv[:, :n], None, q_slot=q_slot, q_valid=q_valid,
                             implementation=implementation, block=block)
    return read_filled(part, needed=needed, sizes=sizes, operands=(cache_k, cache_v))


# ----------------------------------------------------------------------------- cache + new tokens
def cached_attention(q, k, v, cache_k, cache_v, end, valid, *, sizes: tuple[int, ...] | None = None,
                     heads_first: bool = False, implementation: str = "auto", block: int = DEFAULT_BLOCK) -> jax.Array:
    """Attention of T new tokens appended to a KV cache that does not hold them yet: query t sees the
    cache's filled slots j < end[b] and the new tokens i <= t with valid[b, i]. That is the cache rule
    (docs/design.md) for new tokens written at slots end[b] + cumsum(valid[b]) - 1, computed without
    writing them first, so the cache is only READ here (the caller writes when it likes, and a
    conditional around this call holds no in-place update: no copy of the cache).

    q [B, T, nH, D]; k, v [B, T, nKV, D] (the new tokens'); cache_k/v [B, S, nKV, D] (`heads_first`:
    [B, nKV, S, D], the per-layer decode layout); end [B] int32; valid [B, T] bool. -> [B, T, nH * D].
    Two softmax parts merged by their log-sum-exp: the cache part reads only the slots some row has
    filled (`sizes`: the static slot counts of `read_filled`, default the whole capacity; the chunked
    kernel instead skips its blocks past every row's end), the new part is T x T.
    """
    b, t, nh, d = q.shape
    s = cache_k.shape[2 if heads_first else 1]
    new_o, new_lse = _part(q, k, v, _causal(valid), heads_first=False)
    impl = resolve(implementation, t=t, s=s, self_layout=False, dtype=q.dtype, head_dim=d)
    if impl == "chunked" and not heads_first:
        # q_slot = end - 1: the kernel's loop stops at the last filled block of any row.
        slot = jnp.broadcast_to((end - 1)[:, None], (b, t))
        args, tp = _blocked(q, cache_k, cache_v, jnp.arange(s)[None, :] < end[:, None], slot, valid, block)
        o, lse = _flash_forward(*args)  # [nq, B, bq, nKV, G, D], [nq, B, nKV, G, bq]
        c_o = o.swapaxes(0, 1).reshape(b, tp, *o.shape[3:])[:, :t].astype(f32)
        c_lse = lse.transpose(1, 0, 4, 2, 3).reshape(b, tp, *lse.shape[2:4])[:, :t]
    else:
        def part(n, ck, cv):
            ck, cv = (ck[:, :, :n], cv[:, :, :n]) if heads_first else (ck[:, :n], cv[:, :n])
            return _part(q, ck, cv, jnp.broadcast_to((jnp.arange(n)[None, :] < end[:, None])[:, None], (b, t, n)),
                         heads_first=heads_first)

        needed = jnp.max(jnp.where(jnp.any(valid, axis=1), end, 0)).astype(jnp.int32)
        c_o, c_lse = read_filled(part, needed=needed, sizes=sizes or (s,), operands=(cache_k, cache_v))
    m = jnp.maximum(c_lse, new_lse)
    wc, wn = jnp.exp(c_lse - m), jnp.exp(new_lse - m)
    out = (c_o * wc[..., None] + new_o * wn[..., None]) / (wc + wn)[..., None]
    return out.astype(q.dtype).reshape(b, t, nh * d)


def _causal(valid: jax.Array) -> jax.Array:
    """[B, T, T] bool: new token t sees new token i <= t when valid[b, i]."""
    t = valid.shape[1]
    return (jnp.arange(t)[None, :] <= jnp.arange(t)[:, None])[None] & valid[:, None, :]


def _part(q, k, v, mask, *, heads_first: bool):
    """One softmax part of `cached_attention` (the einsum formula of `xla_attention`, same dtypes):
    (output [B, T, nKV, G, D] float32, log-sum-exp [B, T, nKV, G]) over keys k [B, S, nKV, D]
    (`heads_first`: [B, nKV, S, D]) where mask [B, T, S]."""
    b, t, nh, d = q.shape
    nkv = k.shape[1 if heads_first else 2]
    qg = q.reshape(b, t, nkv, nh // nkv, d)
    kspec = "bksd" if heads_first else "bskd"
    scores = jnp.einsum(f"btkgd,{kspec}->bkgts", qg, k.astype(q.dtype), preferred_element_type=f32) * (d**-0.5)
    scores = jnp.where(mask[:, None, None], scores, MASK_VALUE)
    m = jnp.max(scores, axis=-1)
    p = jnp.exp(scores - m[..., None])
    l = jnp.sum(p, axis=-1)
    # The value product in the compute dtype, as xla_attention's (XLA:CPU has no bf16 x bf16 -> f32 dot here).
    o = jnp.einsum(f"bkgts,{kspec}->btkgd", (p / l[..., None]).astype(q.dtype), v.astype(q.dtype))
    return o.astype(f32), (m + jnp.log(l)).transpose(0, 3, 1, 2)


# ----------------------------------------------------------------------------- xla
def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """q [B, T, nH, D], k/v [B, S, nKV, D], mask [B, T, S] bool -> [B, T, nH * D].
    Scores and softmax in float32; the value matmul in the compute dtype."""
    b, t, nh, d = q.shape
    nkv = k.shape[2]
    q = q.reshape(b, t, nkv, nh // nkv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k.astype(q.dtype), preferred_element_type=f32)
    scores = scores * (d**-0.5)
    scores = jnp.where(mask[:, None, None], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(q.dtype))
    return out.reshape(b, t, nh * d)


# ----------------------------------------------------------------------------- chunked
def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def chunked_attention(q, k, v, kv_valid, q_slot, q_valid=None, *, block: int = DEFAULT_BLOCK) -> jax.Array:
    """The rule with q_slot given explicitly; returns [B, T, nH, D] in q's dtype."""
    b, t, nh, d = q.shape
    args, tp = _blocked(q, k, v, kv_valid, q_slot, q_valid, block)
    out = _flash(*args)  # [nq, B, bq, nKV, G, D]
    return out.swapaxes(0, 1).reshape(b, tp, nh, d)[:, :t]


def _blocked(q, k, v, kv_valid, q_slot, q_valid, block):
    """The chunked kernel's block-major arguments (`_flash`) and the padded query count."""
    b, t, nh, d = q.shape
    s, nkv = k.shape[1], k.shape[2]
    g = nh // nkv
    bq, bk = min(block, t), min(block, s)
    tp, sp = _round_up(t, bq), _round_up(s, bk)
    nq, nk = tp // bq, sp // bk
    k, v = k.astype(q.dtype), v.astype(q.dtype)
    kv_valid = jnp.ones((b, s), bool) if kv_valid is None else jnp.broadcast_to(kv_valid.astype(bool), (b, s))
    q_valid = jnp.ones((b, t), bool) if q_valid is None else jnp.broadcast_to(q_valid.astype(bool), (b, t))
    q_slot = jnp.broadcast_to(q_slot.astype(jnp.int32), (b, t))
    if tp > t:  # padded queries see nothing (slot -1) and are dropped below
        q = jnp.pad(q, ((0, 0), (0, tp - t), (0, 0), (0, 0)))
        q_slot = jnp.pad(q_slot, ((0, 0), (0, tp - t)), constant_values=-1)
        q_valid = jnp.pad(q_valid, ((0, 0), (0, tp - t)))
    if sp > s:
        k = jnp.pad(k, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
        kv_valid = jnp.pad(kv_valid, ((0, 0), (0, sp - s)))
    # Block-major layouts: the loops index the leading axis.
    qb = q.reshape(b, nq, bq, nkv, g, d).swapaxes(0, 1)  # [nq, B, bq, nKV, G, D]
    kb = k.reshape(b, nk, bk, nkv, d).swapaxes(0, 1)  # [nk, B, bk, nKV, D]
    vb = v.reshape(b, nk, bk, nkv, d).swapaxes(0, 1)
    validb = kv_valid.reshape(b, nk, bk).swapaxes(0, 1)  # [nk, B, bk]
    slotb = q_slot.reshape(b, nq, bq).swapaxes(0, 1)  # [nq, B, bq]
    # Which blocks can matter (scalars shared by the batch, so the loops skip work for real):
    # q block i needs key blocks whose first slot is <= the largest slot of its used queries, and
    # only key blocks holding at least one valid key.
    bound = jnp.max(jnp.where(q_valid, q_slot, -1).reshape(b, nq, bq), axis=(0, 2))  # [nq]
    kv_any = jnp.any(validb, axis=(1, 2))  # [nk]
    return (qb, kb, vb, validb, slotb, bound, kv_any, bk), tp


def _block_scores(qi, kj, valid_j, slot_i, j, bk):
    """Masked float32 scores [B, nKV, G, bq, bk] of q block i against key block j, and the mask."""
    d = qi.shape[-1]
    s = jnp.einsum("bqkgd,bskd->bkgqs", qi, kj, preferred_element_type=f32) * (d**-0.5)
    slots = j * bk + jnp.arange(bk, dtype=jnp.int32)
    mask = valid_j[:, None, :] & (slots[None, None, :] <= slot_i[:, :, None])  # [B, bq, bk]
    mask = mask[:, None, None]
    return jnp.where(mask, s, MASK_VALUE), mask


def _flash_forward(q, k, v, valid, slot, bound, kv_any, bk):
    nk = k.shape[0]
    _, b, bq, nkv, g, d = q.shape

    def q_block(_, xs):
        qi, slot_i, bound_i = xs

        def kv_block(j, carry):
            def compute(carry):
                m, l, acc = carry
                s, _ = _block_scores(qi, k[j], valid[j], slot_i, j, bk)
                m_new = jnp.maximum(m, s.max(-1))
                p = jnp.exp(s - m_new[..., None])
                corr = jnp.exp(m - m_new)
                acc = acc * corr[..., None] + jnp.einsum("bkgqs,bskd->bkgqd", p.astype(v.dtype), v[j],
                                                         preferred_element_type=f32)
                return m_new, l * corr + p.sum(-1), acc

            return jax.lax.cond(kv_any[j], compute, lambda c: c, carry)

        init = (jnp.full((b, nkv, g, bq), MASK_VALUE, f32), jnp.zeros((b, nkv, g, bq), f32),
                jnp.zeros((b, nkv, g, bq, d), f32))
        hi = jnp.clip(bound_i // bk + 1, 0, nk)  # key blocks past the last visible slot are skipped
        m, l, acc = jax.lax.fori_loop(0, hi, kv_block, init)
        l = jnp.where(l > 0, l, 1.0)  # queries that saw no block: output 0, not NaN
        o = (acc / l[..., None]).transpose(0, 3, 1, 2, 4).astype(q.dtype)  # [B, bq, nKV, G, D]
        return None, (o, m + jnp.log(l))

    _, (o, lse) = jax.lax.scan(q_block, None, (q, slot, bound))
    return o, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _flash(q, k, v, valid, slot, bound, kv_any, bk):
    return _flash_forward(q, k, v, valid, slot, bound, kv_any, bk)[0]


def _flash_fwd(q, k, v, valid, slot, bound, kv_any, bk):
    o, lse = _flash_forward(q, k, v, valid, slot, bound, kv_any, bk)
    return o, (q, k, v, valid, slot, bound, kv_any, o, lse)


def _flash_bwd(bk, res, do):
    """Flash-attention backward: per key block, loop over the query blocks that see it, recompute
    the probabilities from the saved log-sum-exp, accumulate dK/dV for the block and dQ in place."""
    q, k, v, valid, slot, bound, kv_any, o, lse = res
    nq = q.shape[0]
    d = q.shape[-1]
    scale = d**-0.5
    # delta_i = rowsum(dO * O): the softmax-Jacobian term, [nq, B, nKV, G, bq]
    delta = jnp.sum(do.astype(f32) * o.astype(f32), axis=-1).transpose(0, 1, 3, 4, 2)

    def kv_block(dq, xs):
        kj, vj, valid_j, any_j, j = xs

        def q_block(i, carry):
            def compute(carry):
                dk, dv, dq = carry
                qi, doi = q[i], do[i]
                s, mask = _block_scores(qi, kj, valid_j, slot[i], j, bk)
                p = jnp.where(mask, jnp.exp(s - lse[i][..., None]), 0.0)  # [B, nKV, G, bq, bk]
                dp = jnp.einsum("bqkgd,bskd->bkgqs", doi, vj, preferred_element_type=f32)
                ds = (p * (dp - delta[i][..., None])).astype(q.dtype)
                dv = dv + jnp.einsum("bkgqs,bqkgd->bskd", p.astype(q.dtype), doi, preferred_element_type=f32)
                dk = dk + jnp.einsum("bkgqs,bqkgd->bskd", ds, qi, preferred_element_type=f32) * scale
                dqi = jnp.einsum("bkgqs,bskd->bqkgd", ds, kj, preferred_element_type=f32) * scale
                return dk, dv, dq.at[i].add(dqi)

            return jax.lax.cond(j * bk <= bound[i], compute, lambda c: c, carry)

        zeros = jnp.zeros(kj.shape, f32)
        dk, dv, dq = jax.lax.cond(any_j, lambda dq: jax.lax.fori_loop(0, nq, q_block, (zeros, zeros, dq)),
                                  lambda dq: (zeros, zeros, dq), dq)
        return dq, (dk.astype(kj.dtype), dv.astype(vj.dtype))

    nk = k.shape[0]
    dq, (dk, dv) = jax.lax.scan(kv_block, jnp.zeros(q.shape, f32),
                                (k, v, valid, kv_any, jnp.arange(nk, dtype=jnp.int32)))
    return dq.astype(q.dtype), dk, dv, None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ----------------------------------------------------------------------------- partitioning
def partitioned(kernel, q: jax.Array, k: jax.Array, v: jax.Array, kv_valid: jax.Array | None) -> jax.Array:
    """`kernel(q, k, v, kv_valid) -> [B, T, nH, D]` run shard by shard in a `jax.shard_map` over the
    context mesh (`sharding.on_mesh`): rows over the batch axes, heads over the heads axis where the
    key/value heads divide (a key/value head and its query heads then share a shard), as the model's
    sharding rules place them. A Mosaic kernel (splash) cannot be partitioned by XLA, so over several
    devices it needs this; without a context mesh, or on one device, `kernel` is called as is."""
    from ragen_jax.models.qwen2.sharding import spec_for  # lazy: the model imports this module

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return kernel(q, k, v, kv_valid)
    kv_valid = jnp.ones(k.shape[:2], bool) if kv_valid is None else kv_valid
    kv_spec = spec_for(k.shape, ("batch", None, "kv_heads", None), mesh)
    q_spec = jax.sharding.PartitionSpec(kv_spec[0], None, kv_spec[2], None)
    row_spec = jax.sharding.PartitionSpec(kv_spec[0], None)
    # check_vma off: a pallas_call declares no varying-axes types for its outputs.
    return jax.shard_map(kernel, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, row_spec), out_specs=q_spec,
                         check_vma=False)(q, k, v, kv_valid)


# ----------------------------------------------------------------------------- cudnn
def cudnn_attention(q, k, v, kv_valid, *, _implementation: str = "cudnn") -> jax.Array:
    """Causal self-attention (S == T) with per-row lengths = number of valid tokens (right padding).
    Never a boolean mask: cuDNN would turn it into a full [B, heads, T, S] bias.
    `_implementation="xla"` runs jax's reference of the same call (tests on CPU)."""
    b, t = q.shape[:2]
    lengths = jnp.full((b,), t, jnp.int32) if kv_valid is None else jnp.sum(kv_valid, axis=1, dtype=jnp.int32)
    return jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), scale=q.shape[-1] ** -0.5,
                                        is_causal=True, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                                        implementation=_implementation)


# ----------------------------------------------------------------------------- splash
_SPLASH_LANES = 128  # splash blocks are multiples of the TPU lane width


def splash_attention(q, k, v, kv_valid, *, interpret: bool = False) -> jax.Array:
    """Self-attention layout (the last T of S key slots are the queries) with the splash kernel.
    Returns [B, T, nH, D]."""
    # Pallas (and its TPU kernels) loads only when splash is used: a heavy import CPU/GPU runs skip.
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b, t, nh, d = q.shape
    s, nkv = k.shape[1], k.shape[2]
    g, p = nh // nkv, s - t
    # Pad queries to a lane multiple and keys so that every padded query's own slot exists (it then
    # sees itself: segment 0 == 0, no empty softmax row).
    tp = _round_up(t, _SPLASH_LANES)
    sp = _round_up(p + tp, _SPLASH_LANES)
    blk = next(x for x in (512, 256, 128) if tp % x == 0 and sp % x == 0)
    kv_valid = jnp.ones((b, s), bool) if kv_valid is None else kv_valid.astype(bool)
    kv_valid = jnp.pad(kv_valid, ((0, 0), (0, sp - s)))
    seg_kv = kv_valid.astype(jnp.int32)
    seg_q = seg_kv[:, p: p + tp]
    k, v = k.astype(q.dtype), v.astype(q.dtype)
    q = jnp.pad(q * jnp.asarray(d**-0.5, q.dtype), ((0, 0), (0, tp - t), (0, 0), (0, 0)))
    k = jnp.pad(k, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, sp - s), (0, 0), (0, 0)))
    mask = sa.MultiHeadMask([sa.CausalMask((tp, sp), offset=p) for _ in range(g)])
    sizes = sa.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk, block_kv_dkv=blk,
                          block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
    # One MQA kernel per key/value head (GQA without repeating k/v), vmapped over heads and rows.
    kernel = sa.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)
    qh = q.reshape(b, tp, nkv, g, d).transpose(0, 2, 3, 1, 4)  # [B, nKV, G, tp, D]
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, nKV, sp, D]

    def one(qx, kx, vx, sq, skv):
        return kernel(qx, kx, vx, segment_ids=sa.SegmentIds(q=sq, kv=skv))

    per_head = jax.vmap(one, in_axes=(0, 0, 0, None, None))
    out = jax.vmap(per_head)(qh, kh, vh, seg_q, seg_kv)  # [B, nKV, G, tp, D]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, tp, nh, d)[:, :t].astype(q.dtype)


def _splash_per_platform(q, k, v, kv_valid):
    # The kernel or its interpreter is chosen when the program is LOWERED, for the platform it is
    # lowered for, not from the backend of the tracing process: a TPU program exported from a CPU
    # (`jax.export`, trainer/export.py) then holds the real Pallas kernel.
    return jax.lax.platform_dependent(q, k, v, kv_valid, tpu=functools.partial(splash_attention, interpret=False),
                                      default=functools.partial(splash_attention, interpret=True))


__all__ = [
    "CHUNKED_MIN_SCORES",
    "DEFAULT_BLOCK",
    "FILL_GROWTH",
    "IMPLEMENTATIONS",
    "MASK_VALUE",
    "attention",
    "cached_attention",
    "check_available",
    "chunked_attention",
    "cudnn_attention",
    "fill_buckets",
    "read_filled",
    "resolve",
    "splash_attention",
    "partitioned",
    "visible_mask",
    "xla_attention",
]
