"""New tokens attending to a KV cache they are not written into yet, reading only the filled slots
(`attention.cached_attention`, `read_filled`, `Qwen2Config.decode_bound`; `Qwen2.extend` +
`KVCache.append`).

Independent truth: the einsum attention over the WHOLE masked cache (`attention.xla_attention`, itself
checked against transformers in test_model.py) after writing the new tokens at their slots
(end + cumsum(valid) - 1) and masking by the cache rule (a query sees the slots <= its own): for both
cache layouts ([B, S, nKV, D] and the per-layer decode layout [B, nKV, S, D]), the xla and chunked
kernels, float32 and bfloat16, ragged fills, empty rows, rows without a used query, and a row whose
cache is full. That the reads are bounded is checked by behaviour: slots past what any row filled hold
NaN, which poisons any attention that reads them (0 * NaN in the value product). At the model level:
`extend` then `append` equals the in-place call (write first, `filled_read`); and the bounded decode
program holds no second cache.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings, strategies as st

from ragen_jax.models import KVCache, Qwen2, Qwen2Config, with_config
from ragen_jax.models.attention import (FILL_GROWTH, FILL_MIN_CAPACITY, cached_attention, fill_buckets, filled_read,
                                        read_filled, visible_mask,
                                        xla_attention)

S = 300  # capacity: buckets 128, 256, 300 at block 128
TOL = {"float32": dict(rtol=1e-5, atol=1e-5), "bfloat16": dict(rtol=0, atol=4e-2)}


@given(capacity=st.integers(1, 5000), block=st.sampled_from([16, 64, 128, 256]))
@settings(max_examples=200, deadline=None)
def test_fill_buckets_are_block_multiples_growing_by_at_most_the_factor(capacity, block):
    sizes = fill_buckets(capacity, block, min_capacity=0)
    assert sizes[-1] == capacity and list(sizes) == sorted(set(sizes))
    for prev, n in zip(sizes, sizes[1:-1]):
        assert n % block == 0 and n - prev >= block
        assert n <= max(prev + block, math.ceil(prev * FILL_GROWTH / block) * block)
    assert all(n % block == 0 for n in sizes[:-1]) and (len(sizes) == 1 or sizes[0] == block)


_chosen = jax.jit(lambda n: read_filled(lambda size: jnp.int32(size), needed=n, sizes=fill_buckets(S, 128, min_capacity=0),
                                        operands=()))


@given(needed=st.integers(-3, 400))
@settings(max_examples=100, deadline=None)
def test_read_filled_runs_the_smallest_bucket_that_holds_the_need(needed):
    sizes = fill_buckets(S, 128, min_capacity=0)
    got = int(_chosen(jnp.int32(needed)))
    want = next((n for n in sizes if n >= needed), sizes[-1])
    assert got == want


def _case(t, dtype, seed=0):
    """q [B,T,6,8], new k/v [B,T,2,8], a cache [B,S,2,8] whose slots from 256 on hold NaN (no row with a
    used query filled more than 140: the 256-slot bucket holds them all), ends, valid. Row 3 has no used query (its end 290 is ignored),
    row 0 is empty, row 4 fills past 128 so the 256 bucket is read."""
    rng = np.random.default_rng(seed)
    b = 6
    q = rng.standard_normal((b, t, 6, 8)).astype(np.float32)
    k, v = (rng.standard_normal((b, t, 2, 8)).astype(np.float32) for _ in range(2))
    ck, cv = (rng.standard_normal((b, S, 2, 8)).astype(np.float32) for _ in range(2))
    end = np.array([0, 5, 77, 290, 140, 64], np.int32)
    valid = np.ones((b, t), bool)
    valid[3] = False
    valid[5, t // 2:] = False  # ragged
    valid[1, 0] = t == 1  # a gap before the first valid token (prefill with left padding)
    poisoned = ck.copy(), cv.copy()
    for a in poisoned:
        a[:, 256:] = np.nan
    c = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    return c(q), c(k), c(v), (c(ck), c(cv)), (c(poisoned[0]), c(poisoned[1])), jnp.asarray(end), jnp.asarray(valid)


def _truth(q, k, v, cache, end, valid):
    """The cache rule as the einsum over every slot: write, then mask slots > the query's own."""
    b, t = valid.shape
    pos = end[:, None] + jnp.cumsum(valid, axis=1) - 1
    slot = jnp.where(valid, pos, S)
    rows = jnp.arange(b)[:, None]
    ck = cache[0].at[rows, slot].set(k, mode="drop")
    cv = cache[1].at[rows, slot].set(v, mode="drop")
    return xla_attention(q, ck, cv, visible_mask(None, pos, S))


@pytest.mark.parametrize("t,dtype,impl,heads_first", [
    (1, "float32", "xla", False), (1, "float32", "xla", True), (1, "bfloat16", "xla", True),
    (9, "float32", "xla", False), (9, "float32", "chunked", False), (9, "bfloat16", "chunked", False)])
def test_cached_attention_equals_the_einsum_over_the_whole_cache(t, dtype, impl, heads_first):
    q, k, v, cache, poisoned, end, valid = _case(t, dtype)
    want = _truth(q, k, v, cache, end, valid)
    sizes = fill_buckets(S, 128, min_capacity=0)

    def run(c):
        ck, cv = (x.swapaxes(1, 2) for x in c) if heads_first else c
        return jax.jit(lambda *a: cached_attention(*a, sizes=sizes, heads_first=heads_first, implementation=impl,
                                                   block=64))(q, k, v, ck, cv, end, valid)

    got = run(poisoned)
    used = np.asarray(valid)
    assert np.isfinite(np.asarray(got, np.float32)[used]).all()
    np.testing.assert_allclose(np.asarray(got, np.float32)[used], np.asarray(want, np.float32)[used], **TOL[dtype])
    if impl == "xla":  # the same poisoned cache read whole is NaN: the test tells the two apart
        whole = jax.jit(lambda *a: cached_attention(*a, heads_first=heads_first, implementation=impl))
        ck, cv = (x.swapaxes(1, 2) for x in poisoned) if heads_first else poisoned
        assert not np.isfinite(np.asarray(whole(q, k, v, ck, cv, end, valid), np.float32)[used]).all()


@pytest.mark.parametrize("t,dtype,impl,heads_first", [
    (1, "float32", "xla", False), (1, "float32", "xla", True), (1, "bfloat16", "xla", True),
    (9, "float32", "xla", False), (9, "float32", "chunked", False)])
def test_filled_read_after_the_write_equals_the_einsum_over_the_whole_cache(t, dtype, impl, heads_first):
    """The in-place order (decode steps, a turn's prefill): the new tokens written first, then only the
    bucket that holds the last used query's slot read; the slots past it hold NaN."""
    q, k, v, cache, poisoned, end, valid = _case(t, dtype)
    want = _truth(q, k, v, cache, end, valid)
    pos = end[:, None] + jnp.cumsum(valid, axis=1) - 1
    slot, rows = jnp.where(valid, pos, S), jnp.arange(6)[:, None]
    ck, cv = (c.at[rows, slot].set(x, mode="drop") for c, x in zip(poisoned, (k, v)))
    if heads_first:
        ck, cv = ck.swapaxes(1, 2), cv.swapaxes(1, 2)
    read = functools.partial(filled_read, q_slot=pos, q_valid=valid, sizes=fill_buckets(S, 128, min_capacity=0),
                             heads_first=heads_first, implementation=impl, block=64)
    got = np.asarray(jax.jit(read)(q, ck, cv), np.float32)
    used = np.asarray(valid)
    np.testing.assert_allclose(got[used], np.asarray(want, np.float32)[used], **TOL[dtype])


def test_a_full_cache_is_read_to_its_last_slot():
    q, k, v, cache, _, _, _ = _case(1, "float32")
    end = jnp.asarray([S - 1, 3, 0, 200, 299, 1], jnp.int32)  # rows 0 and 4 write the last slot
    valid = jnp.ones((6, 1), bool)
    got = cached_attention(q, k, v, *cache, end, valid, sizes=fill_buckets(S, 128, min_capacity=0))
    np.testing.assert_allclose(got, _truth(q, k, v, cache, end, valid), **TOL["float32"])


def _model(**kw):
    return Qwen2(Qwen2Config.from_preset("tiny", num_hidden_layers=2, attention_block=128, **kw), rngs=nnx.Rngs(3))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_extend_then_append_equals_the_in_place_call(dtype):
    model = _model()
    cfg = model.cfg
    rng = np.random.default_rng(1)
    prompt = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, 20)), jnp.int32)
    cache = KVCache.init(cfg, 3, 64, dtype)
    graphdef, params = nnx.split(model)
    seg = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, 7)), jnp.int32)
    seg_valid = jnp.asarray(np.arange(7)[None] < np.array([7, 0, 4])[:, None])

    @jax.jit
    def both(params, cache):
        m = nnx.merge(graphdef, params)
        _, cache = m(prompt, jnp.asarray(np.arange(20)[None] < np.array([20, 9, 1])[:, None]), cache)
        h_in_place, c_in_place = m(seg, seg_valid, cache)
        h, new = m.extend(seg, seg_valid, cache)
        return h_in_place, c_in_place, h, cache.append(new)

    h0, c0, h1, c1 = both(params, cache)
    ok = np.asarray(seg_valid)
    # The in-place call writes first and reads its own keys/values back from the cache (rounded to the
    # cache dtype); extend merges them unrounded by log-sum-exp: equal to rounding, not bitwise.
    tol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(h1, np.float32)[ok], np.asarray(h0, np.float32)[ok], **tol)
    np.testing.assert_array_equal(np.asarray(c1.end), np.asarray(c0.end))
    np.testing.assert_allclose(np.asarray(c1.k, np.float32), np.asarray(c0.k, np.float32), **tol)
    np.testing.assert_allclose(np.asarray(c1.v, np.float32), np.asarray(c0.v, np.float32), **tol)


@pytest.mark.parametrize("layout,dtype", [("layers", "float32"), ("scan", "bfloat16")])
def test_filled_reads_hold_no_second_cache(layout, dtype):
    """The bucket choice only READS the cache: XLA keeps updating the loop-carried cache in place. (A
    choice around the whole layer stack, whose branches write the cache, made XLA copy all of it:
    temporaries grew by one cache.) Truth: the whole-capacity program's temporaries, compiled from
    abstract shapes (nothing allocated); what may differ is one layer's slice of the cache, which
    XLA:CPU copies before its dot (1/4 of the cache at 4 layers, less at any real size)."""
    from ragen_jax.rollout import sampler

    temp = {}
    for bound in (True, False):
        cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=4, decode_unroll=layout == "layers", decode_bound=bound)
        graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0))))

        def run(state, cache, logits):
            out = sampler.decode(nnx.merge(graphdef, state), cache, logits, jax.random.PRNGKey(0), max_new_tokens=4,
                                 greedy=True, stop_ids=(), pad_id=0, logprobs=False)
            return out.cache

        cache = jax.eval_shape(lambda: KVCache.init(cfg, 16, 3600, dtype))
        logits = jax.ShapeDtypeStruct((16, cfg.vocab_size), jnp.float32)
        ma = jax.jit(run, donate_argnums=(1,)).lower(state, cache, logits).compile().memory_analysis()
        temp[bound] = ma.temp_size_in_bytes
    cache_bytes = 2 * np.prod(cache.k.shape) * jnp.dtype(dtype).itemsize
    assert temp[True] < temp[False] + cache_bytes / 3, (temp, cache_bytes)


def test_the_token_loop_copies_no_cache():
    """Each layer's keys/values are converted to the per-layer decode layout once per call (2 x L
    copies of capacity-sized arrays in the compiled program) and never again inside the token loop.
    Reading the cache before writing the token made XLA:CPU copy each layer's keys/values every token
    (3 x as many capacity-sized copies at 2 layers, ~45% of a tiny decode step at 3,600 slots)."""
    import re

    from ragen_jax.rollout import sampler

    cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=2)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0))))

    def run(state, cache, logits):
        return sampler.decode(nnx.merge(graphdef, state), cache, logits, jax.random.PRNGKey(0), max_new_tokens=4,
                              greedy=True, stop_ids=(), pad_id=0, logprobs=False).tokens

    cache = jax.eval_shape(lambda: KVCache.init(cfg, 8, 3600, "float32"))
    logits = jax.ShapeDtypeStruct((8, cfg.vocab_size), jnp.float32)
    hlo = jax.jit(run).lower(state, cache, logits).compile().as_text()
    # A layer's keys or values: [B, nKV, S, D] (the decode layout) or [B, S, nKV, D].
    shape = r"f32\[8,(2,3600|3600,2),16\]"
    copies = [line for line in hlo.splitlines() if re.search(shape + r"[^ ]* copy\(", line)]
    assert len(copies) == 2 * cfg.num_hidden_layers, copies


def test_bounded_and_whole_capacity_decode_give_the_same_tokens():
    """The model's decode with and without the bucketed reads, through the sampler (prompt rows of
    ragged lengths, one empty): same greedy tokens, log-probs within float32 rounding."""
    from ragen_jax.rollout import sampler

    model = _model()
    rng = np.random.default_rng(2)
    toks = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (4, 150)), jnp.int32)
    valid = jnp.asarray(np.arange(150)[None] < np.array([150, 40, 0, 133])[:, None])
    outs = [sampler.generate(with_config(model, decode_bound=b), toks, valid, jax.random.PRNGKey(0), max_new_tokens=12,
                             cache_len=FILL_MIN_CAPACITY + 76, greedy=True, stop_ids=()) for b in (True, False)]
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_allclose(outs[0].logprobs, outs[1].logprobs, atol=1e-5)


def test_small_caches_are_read_whole():
    """Under FILL_MIN_CAPACITY slots one bucket: the whole cache (no branch to compile per layer)."""
    assert fill_buckets(FILL_MIN_CAPACITY - 1) == (FILL_MIN_CAPACITY - 1,)
    assert len(fill_buckets(FILL_MIN_CAPACITY)) > 1
