"""Cached attention that reads only the filled slots (`attention.read_filled`, `Qwen2Config.decode_bound`).

Independent truth: the einsum attention over the WHOLE masked cache (`attention.xla_attention` with the
cache rule's mask over all S slots, what `decode_bound=False` computes, itself checked against
transformers in test_model.py), on the same inputs, for every cache layout the model decodes with
(per-layer buffers of the unrolled float32 decode, the stacked cache under the layer scan, a
bfloat16 cache), for ragged fills, rows that ended (no valid query), a row whose cache is full, and
multi-token appends (the xla and chunked kernels). That the reads are really bounded is checked by
behaviour: slots past the largest fill hold NaN, which poisons any attention that reads them (0 * NaN
in the value product) and leaves the bounded one untouched.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings, strategies as st

from ragen_jax.models import KVCache, Qwen2, Qwen2Config, with_config
from ragen_jax.models.attention import FILL_GROWTH, fill_buckets, read_filled, slots_needed

S = 300  # capacity: buckets 128, 256, 300 at block 128
TOL = {"float32": dict(rtol=1e-5, atol=1e-5), "bfloat16": dict(rtol=0, atol=4e-2)}


@given(capacity=st.integers(1, 5000), block=st.sampled_from([16, 64, 128, 256]))
@settings(max_examples=200, deadline=None)
def test_fill_buckets_are_block_multiples_growing_by_at_most_the_factor(capacity, block):
    sizes = fill_buckets(capacity, block)
    assert sizes[-1] == capacity and list(sizes) == sorted(set(sizes))
    for prev, n in zip(sizes, sizes[1:-1]):
        assert n % block == 0 and n - prev >= block
        assert n <= max(prev + block, math.ceil(prev * FILL_GROWTH / block) * block)
    assert all(n % block == 0 for n in sizes[:-1]) and (len(sizes) == 1 or sizes[0] == block)


_chosen = jax.jit(lambda n: read_filled(lambda size: jnp.int32(size), needed=n, sizes=fill_buckets(S, 128),
                                        operands=()))


@given(needed=st.integers(-3, 400))
@settings(max_examples=100, deadline=None)
def test_read_filled_runs_the_smallest_bucket_that_holds_the_need(needed):
    sizes = fill_buckets(S, 128)
    got = int(_chosen(jnp.int32(needed)))
    want = next((n for n in sizes if n >= needed), sizes[-1])
    assert got == want


def test_slots_needed_counts_only_used_queries():
    q_slot = jnp.array([[4, 9], [120, 121], [299, 0]], jnp.int32)
    valid = jnp.array([[True, True], [True, False], [False, False]])
    assert int(slots_needed(q_slot, valid)) == 121
    assert int(slots_needed(q_slot, None)) == 300


def _model(**kw):
    cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=2, attention_block=128, **kw)
    return Qwen2(cfg, rngs=nnx.Rngs(3))


def _cache(cfg, ends, dtype, poison: int | None):
    """A cache of S slots with random keys/values below each row's end, and NaN from `poison` on."""
    b = len(ends)
    shape = (cfg.num_hidden_layers, b, S, cfg.num_key_value_heads, cfg.head_dim)
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    if poison is not None:
        k[:, :, poison:], v[:, :, poison:] = np.nan, np.nan
    return KVCache(k=jnp.asarray(k, dtype), v=jnp.asarray(v, dtype), end=jnp.asarray(ends, jnp.int32))


def _step(model, cache, tokens, valid):
    graphdef, params = nnx.split(model)
    return jax.jit(lambda p, c: nnx.merge(graphdef, p)(tokens, valid, c))(params, cache)


# (layout, cache dtype): per-layer buffers (unrolled f32 decode), the layer scan, a bf16 stacked cache.
LAYOUTS = [("layers", "float32"), ("scan", "float32"), ("scan", "bfloat16")]


@pytest.mark.parametrize("layout,dtype", LAYOUTS)
def test_decode_step_equals_the_whole_masked_cache(layout, dtype):
    from ragen_jax.models.qwen2.model import decode_layout, stacked_layout

    model = _model(decode_unroll=layout == "layers")
    # Ragged fills: empty, short, mid-bucket, one row that ended (no valid query: its big end is
    # ignored), the longest live row at 140 (so slots >= 256 are never needed).
    ends = [0, 5, 139, 250, 64]
    valid = jnp.array([[True], [True], [True], [False], [True]])
    tokens = jnp.array([[7], [11], [13], [17], [19]], jnp.int32)
    truth_model = with_config(model, decode_bound=False)
    h_ref, c_ref = _step(truth_model, decode_layout(_cache(model.cfg, ends, dtype, None), model.cfg), tokens, valid)
    # NaN from slot 256 (the bucket above the largest need, 140): the bounded step never reads it.
    h, c = _step(model, decode_layout(_cache(model.cfg, ends, dtype, 256), model.cfg), tokens, valid)
    live = np.asarray(valid[:, 0])
    assert np.isfinite(np.asarray(h, np.float32)[live]).all()
    np.testing.assert_allclose(np.asarray(h, np.float32)[live], np.asarray(h_ref, np.float32)[live], **TOL[dtype])
    c, c_ref = stacked_layout(c), stacked_layout(c_ref)
    np.testing.assert_array_equal(np.asarray(c.end), np.asarray(c_ref.end))
    np.testing.assert_allclose(np.asarray(c.k[:, :, :256], np.float32), np.asarray(c_ref.k[:, :, :256], np.float32),
                               **TOL[dtype])
    # The same poisoned cache through the whole-capacity read is NaN: the test can tell the two apart.
    h_full, _ = _step(truth_model, decode_layout(_cache(model.cfg, ends, dtype, 256), model.cfg), tokens, valid)
    assert not np.isfinite(np.asarray(h_full, np.float32)[live]).all()


@pytest.mark.parametrize("layout,dtype", [LAYOUTS[0], LAYOUTS[2]])
def test_decode_step_with_a_full_cache_reads_every_slot(layout, dtype):
    from ragen_jax.models.qwen2.model import decode_layout

    model = _model(decode_unroll=layout == "layers")
    ends = [S - 1, 3]  # row 0 writes the last slot and sees all S
    tokens, valid = jnp.array([[5], [6]], jnp.int32), jnp.ones((2, 1), bool)
    h_ref, _ = _step(with_config(model, decode_bound=False), decode_layout(_cache(model.cfg, ends, dtype, None),
                                                                            model.cfg), tokens, valid)
    h, _ = _step(model, decode_layout(_cache(model.cfg, ends, dtype, None), model.cfg), tokens, valid)
    np.testing.assert_allclose(np.asarray(h, np.float32), np.asarray(h_ref, np.float32), **TOL[dtype])


@pytest.mark.parametrize("attention", ["xla", "chunked"])
def test_multi_token_append_equals_the_whole_masked_cache(attention):
    model = _model(attention=attention)
    ends = [0, 40, 100, 7]
    t = 24
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (4, t)), jnp.int32)
    lens = np.array([24, 3, 20, 0])  # row 3 appends nothing
    valid = jnp.asarray(np.arange(t)[None] < lens[:, None])
    h_ref, c_ref = _step(with_config(model, decode_bound=False), _cache(model.cfg, ends, "float32", None), tokens, valid)
    h, c = _step(model, _cache(model.cfg, ends, "float32", 128), tokens, valid)  # largest need: 120
    ok = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(h)[ok], np.asarray(h_ref)[ok], **TOL["float32"])
    np.testing.assert_allclose(np.asarray(c.k[:, :, :128]), np.asarray(c_ref.k[:, :, :128]), **TOL["float32"])


@pytest.mark.parametrize("layout,dtype", [LAYOUTS[0], LAYOUTS[2]])
def test_filled_reads_hold_no_second_cache(layout, dtype):
    """The bucket choice only READS the cache: XLA keeps updating the loop-carried cache in place. (A
    choice around the whole layer stack, whose branches write the cache, made XLA copy all of it:
    temporaries grew by one cache.) Truth: the whole-capacity program's temporaries, compiled from
    abstract shapes (nothing allocated)."""
    from ragen_jax.rollout import sampler

    temp = {}
    for bound in (True, False):
        cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=2, decode_unroll=layout == "layers", decode_bound=bound)
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
    assert temp[True] < temp[False] + cache_bytes / 4, (temp, cache_bytes)
