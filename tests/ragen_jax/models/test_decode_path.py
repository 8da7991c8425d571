"""The single-token decode path (layer loop unrolled, `DECODE_UNROLL`) computes what the layer scan
computes: the same hidden states and the same cache writes, token after token, with rows that skip a
step (valid=False) left untouched. A 16-bit cache on CPU keeps the layer scan (its write is in place
only there).

The independent truth is the scan path (the one prefill and training use, itself checked against
transformers in test_model.py) run on the same inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import KVCache, Qwen2, Qwen2Config, with_config
from ragen_jax.models.qwen2 import model as qwen2_model

from .helpers import greedy_decode_hlo


def _run(model, unroll: bool, cache_dtype, steps):
    """Prefill 5 ids, then decode `steps` single tokens; returns every hidden state and the cache."""
    graphdef, params = nnx.split(with_config(model, decode_unroll=unroll))

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


def test_decode_unrolls_only_with_a_32bit_cache_on_cpu():
    cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=2)
    assert jax.default_backend() == "cpu"
    assert qwen2_model.unrolled_decode(cfg, KVCache.init(cfg, batch=1, max_len=4, dtype="float32"))
    assert not qwen2_model.unrolled_decode(cfg, KVCache.init(cfg, batch=1, max_len=4, dtype="bfloat16"))
    assert not qwen2_model.unrolled_decode(cfg.replace(decode_unroll=False),
                                            KVCache.init(cfg, batch=1, max_len=4, dtype="float32"))


@pytest.mark.parametrize("cache_dtype", ["float32"])
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


def test_token_loop_carries_hoisted_layer_weights():
    """The performance property itself, read from the compiled program: the sampler's token loop
    carries each layer's weights as its own buffer (sliced once, before the loop), so no step
    copies weights out of the stacked [L, ...] arrays. With the layer scan it carries the stacks."""
    cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=3, intermediate_size=136)  # [64, 136]: unique
    model = Qwen2(cfg, nnx.Rngs(0))

    def token_loop_signature(unroll):
        return greedy_decode_hlo(with_config(model, decode_unroll=unroll))[1]

    unrolled, scanned = token_loop_signature(True), token_loop_signature(False)
    # gate and up kernels of each of the 3 layers as separate buffers, stored [out, in] = [136, 64]
    # (decode.layer_weights); the down kernel [64, 136]
    assert unrolled.count("f32[136,64]") == 2 * cfg.num_hidden_layers
    assert unrolled.count("f32[64,136]") == cfg.num_hidden_layers
    assert "f32[3,64,136]" not in unrolled
    assert scanned.count("f32[136,64]") == 0 and "f32[3,64,136]" in scanned
    # The cache: one [B, nKV, S, D] buffer per layer for keys and for values (model.decode_layout),
    # not the stacked [L, B, S, nKV, D] one the scan carries.
    per_layer = f"f32[2,{cfg.num_key_value_heads},12,{cfg.head_dim}]"
    stacked = f"f32[3,2,12,{cfg.num_key_value_heads},{cfg.head_dim}]"
    assert unrolled.count(per_layer) == 2 * cfg.num_hidden_layers and stacked not in unrolled
    assert per_layer not in scanned and stacked in scanned


@pytest.mark.parametrize("path", ["cache", "inference"])
def test_16bit_weights_are_scanned_without_a_float32_copy(path):
    """XLA:CPU slices a stacked bfloat16 weight as float32 (and hoists that conversion: a float32 copy
    of every layer) unless the layer scan of a forward without gradient (the cached path, or
    `inference=True`) reads it as same-width integers (`scan_layers`). Truth: the plain `lax.scan` over the same bf16 weights gives the same bits
    (hidden states and cache), and its compiled program holds 2 more bytes per weight than ours
    (XLA's own memory_analysis of the two programs)."""
    cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=4, intermediate_size=512, param_dtype="bfloat16",
                                  dtype="bfloat16")
    model = Qwen2(cfg, nnx.Rngs(0))
    layers = nnx.state(model.model.layers, nnx.Param).to_pure_dict()
    toks = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) * 5 + 1
    x = model.model.embed_inputs(toks, jnp.ones_like(toks, bool))

    def plain(layer, carry, layers, *rest):
        return jax.lax.scan(layer, carry, (layers, *rest))

    def run(scan):
        old = qwen2_model.scan_layers
        qwen2_model.scan_layers = scan
        try:
            def f(layers, x):
                valid = jnp.ones(x.shape[:2], bool)
                if path == "cache":
                    cache = KVCache.init(cfg, batch=2, max_len=8, dtype="bfloat16")
                    h, cache = qwen2_model.decoder_stack(cfg, layers, x, valid, cache)
                    out = (h, cache.k, cache.v)
                else:
                    out = (qwen2_model.decoder_stack(cfg, layers, x, valid, None, inference=True)[0],)
                return jax.tree.map(lambda a: jax.lax.bitcast_convert_type(a, jnp.uint16)
                                    if a.dtype == jnp.bfloat16 else a, out)

            compiled = jax.jit(f).lower(layers, x).compile()
            return [np.asarray(a) for a in compiled(layers, x)], compiled.memory_analysis().temp_size_in_bytes
        finally:
            qwen2_model.scan_layers = old

    got, ours = run(qwen2_model.scan_layers)
    want, theirs = run(plain)
    for g, w in zip(got, want):  # compared as bits
        np.testing.assert_array_equal(g, w)
    n = sum(a.size for a in jax.tree.leaves(layers))
    # The float32 copy (4 bytes per weight) is gone; what remains is one same-width integer view of the
    # stacks (2 bytes per weight), which XLA:CPU materialises once.
    assert theirs - ours >= 0.9 * 2 * n


def test_lora_training_forward_keeps_the_frozen_16bit_base_as_integers():
    """A LoRA model's rematerialised training forward on XLA:CPU (`scan_frozen_base`): the same loss and the same
    adapter gradients as the plain layer scan (the truth), and no float32 copy of the bf16 base in
    the compiled gradient program (about 2 bytes per base weight less memory)."""
    from ragen_jax.models.lora import LoRAParam, add_lora

    cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=3, intermediate_size=512, param_dtype="bfloat16",
                                  dtype="bfloat16", remat=True)
    model = Qwen2(cfg, nnx.Rngs(0))
    add_lora(model, 4, 8.0, rngs=nnx.Rngs(1))
    graphdef, adapters, base = nnx.split(model, LoRAParam, ...)
    adapters = jax.tree.map(lambda a: a + 0.01, adapters)  # B != 0: the adapters matter
    toks = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 3 + 1
    valid = jnp.ones_like(toks, bool)

    def loss(adapters, base):
        h, _ = nnx.merge(graphdef, adapters, base)(toks, valid)
        return jnp.mean(jnp.square(h.astype(jnp.float32)))

    def plain(layer, carry, layers, rest, policy):
        return jax.lax.scan(jax.checkpoint(layer, policy=policy), carry, (layers, *rest))

    def run(scan):
        old = qwen2_model.scan_frozen_base
        qwen2_model.scan_frozen_base = scan
        try:
            compiled = jax.jit(jax.value_and_grad(loss)).lower(adapters, base).compile()
            value, grads = compiled(adapters, base)
            return float(value), jax.tree.map(np.asarray, grads), compiled.memory_analysis().temp_size_in_bytes
        finally:
            qwen2_model.scan_frozen_base = old

    v_ours, g_ours, m_ours = run(qwen2_model.scan_frozen_base)
    v_plain, g_plain, m_plain = run(plain)
    assert v_ours == v_plain
    for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_plain)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert max(np.abs(a).max() for a in jax.tree.leaves(g_ours)) > 0
    n_base = sum(a.size for a in jax.tree.leaves(nnx.state(model.model.layers, nnx.Param)) if a.dtype == jnp.bfloat16)
    # The float32 copy (4 bytes per base weight) became one integer view (2 bytes): ~2 bytes saved each.
    assert m_plain - m_ours >= 1.5 * n_base
