"""The per-layer KV-cache layout of the unrolled decode (`LayerKVCache`, `decode_layout`) and the
[out, in] decode kernels (`decode.layer_weights`) compute what the stacked cache and the layer scan
compute.

Independent truths: the layer scan over the stacked cache with the einsum attention
(`attention.xla_attention`, itself checked against transformers in test_model.py) on the same
inputs; the layout conversion is checked against plain numpy transposes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import KVCache, Qwen2, Qwen2Config, with_config
from ragen_jax.models.qwen2 import decode as qdecode
from ragen_jax.models.qwen2.model import LayerKVCache, decode_layout, stacked_layout


def _cfg(**kw):
    return Qwen2Config.from_preset("tiny", num_hidden_layers=3, **kw)


def test_decode_layout_round_trip_is_a_transpose_per_layer():
    cfg = _cfg()
    k = np.random.default_rng(0).standard_normal((3, 2, 7, cfg.num_key_value_heads, cfg.head_dim)).astype(np.float32)
    cache = KVCache(k=jnp.asarray(k), v=jnp.asarray(-k), end=jnp.array([3, 5], jnp.int32))
    lc = decode_layout(cache, cfg)
    assert isinstance(lc, LayerKVCache) and len(lc.k) == 3 and lc.max_len == 7 and lc.batch == 2
    for li in range(3):
        np.testing.assert_array_equal(np.asarray(lc.k[li]), k[li].transpose(0, 2, 1, 3))
        np.testing.assert_array_equal(np.asarray(lc.v[li]), -k[li].transpose(0, 2, 1, 3))
    back = stacked_layout(lc)
    np.testing.assert_array_equal(np.asarray(back.k), k)
    np.testing.assert_array_equal(np.asarray(back.end), [3, 5])
    # A 16-bit cache keeps the stacked layout (its decode is the layer scan); so does a disabled unroll.
    c16 = KVCache.init(cfg, batch=2, max_len=4, dtype="bfloat16")
    assert decode_layout(c16, cfg) is c16
    c32 = KVCache.init(cfg, batch=2, max_len=4, dtype="float32")
    assert decode_layout(c32, cfg.replace(decode_unroll=False)) is c32
    assert decode_layout(c32, cfg.replace(layer_cache=False)) is c32


def _decode(model, layer_cache: bool, steps, transposed=True):
    """Prefill 5 ids per row into a stacked cache, then decode `steps` single tokens, with the cache in
    the per-layer layout (the sampler's) or kept stacked (the layer scan's path)."""
    graphdef, params = nnx.split(with_config(model, decode_unroll=layer_cache, decode_transposed=transposed))

    @jax.jit
    def go(params):
        m = nnx.merge(graphdef, params)
        b = 3
        cache = KVCache.init(m.cfg, batch=b, max_len=12, dtype="float32")
        toks = jnp.arange(5 * b, dtype=jnp.int32).reshape(b, 5) * 7 + 3
        h, cache = m(toks, jnp.ones_like(toks, bool), cache)
        hs = [h[:, -1]]
        cache = decode_layout(cache, m.cfg)
        assert isinstance(cache, LayerKVCache) == layer_cache
        for tok, valid in steps:
            h, cache = m(jnp.asarray(tok, jnp.int32)[:, None], jnp.asarray(valid)[:, None], cache)
            hs.append(h[:, 0])
        return jnp.stack(hs, 1), m.logits(h[:, 0]), stacked_layout(cache)

    return jax.tree.map(np.asarray, go(params))


@pytest.mark.parametrize("transposed", [True, False])
def test_per_layer_cache_decode_equals_layer_scan(transposed):
    model = Qwen2(_cfg(), nnx.Rngs(3))
    # Row 1 skips the second step (valid=False): its cache row and `end` must not move then; row 2
    # runs past the cache end on the last steps (writes dropped, end still advances).
    steps = [([11, 12, 13], [True, True, True]), ([21, 22, 23], [True, False, True]),
             ([31, 32, 33], [True, True, True])] + [([40 + i] * 3, [False, False, True]) for i in range(6)]
    h_ref, l_ref, c_ref = _decode(model, False, steps)
    h, logits, c = _decode(model, True, steps, transposed)
    np.testing.assert_allclose(h, h_ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(logits, l_ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(c.end, [8, 7, 14])
    np.testing.assert_array_equal(c.end, c_ref.end)
    for got, want in ((c.k, c_ref.k), (c.v, c_ref.v)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        assert not got[:, 1, 7:].any() and not got[:, 0, 8:].any()
        assert all(got[li, 2, :12].any() for li in range(3))


def test_layer_weights_transposes_kernels_only():
    cfg = _cfg()
    model = Qwen2(cfg, nnx.Rngs(0))
    layers = nnx.state(model.model.layers, nnx.Param).to_pure_dict()
    p = qdecode.layer_weights(layers, 2, jnp.float32)
    np.testing.assert_array_equal(np.asarray(p["mlp"]["gate_proj"]["kernel_t"]),
                                  np.asarray(layers["mlp"]["gate_proj"]["kernel"][2]).T)
    np.testing.assert_array_equal(np.asarray(p["self_attn"]["q_proj"]["bias"]),
                                  np.asarray(layers["self_attn"]["q_proj"]["bias"][2]))
    assert "kernel" not in p["self_attn"]["o_proj"]
    plain = qdecode.layer_weights(layers, 2, jnp.float32, transposed=False)  # config decode_transposed=False
    np.testing.assert_array_equal(np.asarray(plain["mlp"]["gate_proj"]["kernel"]),
                                  np.asarray(layers["mlp"]["gate_proj"]["kernel"][2]))
    assert "kernel_t" not in plain["self_attn"]["o_proj"]


def test_per_layer_cache_rejects_multi_token_appends():
    cfg = _cfg()
    model = Qwen2(cfg, nnx.Rngs(0))
    lc = decode_layout(KVCache.init(cfg, batch=2, max_len=8, dtype="float32"), cfg)
    with pytest.raises(ValueError, match="single-token"):
        model(jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), bool), lc)
