"""The single-token decode path (layer loop unrolled, `DECODE_UNROLL`) computes what the layer scan
computes: the same hidden states and the same cache writes, token after token, for float32 and a
bfloat16 cache, with rows that skip a step (valid=False) left untouched.

The independent truth is the scan path (the one prefill and training use, itself checked against
transformers in test_model.py) run on the same inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import KVCache, Qwen2, Qwen2Config
from ragen_jax.models.qwen2 import model as qwen2_model


def _run(model, unroll: bool, cache_dtype, steps):
    """Prefill 5 ids, then decode `steps` single tokens; returns every hidden state and the cache."""
    graphdef, params = nnx.split(model)
    old = qwen2_model.DECODE_UNROLL
    qwen2_model.DECODE_UNROLL = unroll
    try:
        @jax.jit
        def go(params):
            m = nnx.merge(graphdef, params)
            b = 3
            cache = KVCache.init(m.cfg, batch=b, max_len=12, dtype=cache_dtype)
            toks = jnp.arange(5 * b, dtype=jnp.int32).reshape(b, 5) * 7 + 3
            h, cache = m(toks, jnp.ones_like(toks, bool), cache)
            hs = [h[:, -1]]
            for tok, valid in steps:
                h, cache = m(jnp.asarray(tok, jnp.int32)[:, None], jnp.asarray(valid)[:, None], cache)
                hs.append(h[:, 0])
            return jnp.stack(hs, 1), cache

        return jax.tree.map(np.asarray, go(params))
    finally:
        qwen2_model.DECODE_UNROLL = old


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_unrolled_decode_equals_layer_scan(cache_dtype):
    cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=3)
    model = Qwen2(cfg, nnx.Rngs(1))
    # Row 1 skips the second step (valid=False): its cache row and `end` must not move then.
    steps = [([11, 12, 13], [True, True, True]), ([21, 22, 23], [True, False, True]),
             ([31, 32, 33], [True, True, True])]
    h_scan, c_scan = _run(model, False, cache_dtype, steps)
    h_unroll, c_unroll = _run(model, True, cache_dtype, steps)
    np.testing.assert_allclose(h_unroll, h_scan, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(c_unroll.end, [8, 7, 8])
    np.testing.assert_array_equal(c_unroll.end, c_scan.end)
    for got, want in ((c_unroll.k, c_scan.k), (c_unroll.v, c_scan.v)):
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-6, atol=1e-6)
        # Slots past each row's end were never written (the cache starts as zeros).
        assert not got[:, 1, 7:].any() and not got[:, 0, 8:].any()
        # Every layer got its own keys/values (a wrong static index would leave a layer empty).
        assert all(got[li, :, :7].any() for li in range(cfg.num_hidden_layers))
