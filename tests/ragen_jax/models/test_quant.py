"""The quantized frozen base (models/quant.py, QLoRA): the codes and scales against independent
truths (llama.cpp's Q4_0 and Q8_0 as the `gguf` package computes them, numpy's nearest NF4 level),
and the quantized model against the dequantize-then-float model: a float LoRA model whose
kernels are the dequantized ones gives the same logits (within 1e-5 relative) on every forward path,
and the same adapter gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import KVCache, Qwen2, Qwen2Config, with_config
from ragen_jax.models.lora import LoRAParam, add_lora
from ragen_jax.models.quant import NF4_TABLE, Q8_BLOCK, dequantize, projections, quantize, quantize_base

CFG = Qwen2Config.from_preset("tiny")
RANK, ALPHA = 4, 8.0
MODES = ("int8", "nf4", "int4")


def _weights(shape, seed=0):
    return np.random.default_rng(seed).normal(0, 0.05, shape).astype(np.float32)


# ----------------------------------------------------------------------------- codes and scales
def test_int4_block32_is_llama_cpp_q4_0():
    """With GGUF's block of 32, int4 is Q4_0: the same packed bytes per block, and (with the scale
    rounded to float16, as GGUF stores it) the same dequantized weights as the gguf package."""
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    n_in, n_out = 128, 6
    w = _weights((n_in, n_out), 1)
    q, scale = quantize(jnp.asarray(w), "int4", block=32)
    raw = gguf_quants.quantize(np.ascontiguousarray(w.T), GGMLQuantizationType.Q4_0)  # rows = output columns
    blocks = raw.reshape(n_out, n_in // 32, 18)  # per block: float16 scale, 16 bytes of codes
    np.testing.assert_array_equal(np.asarray(q).reshape(n_in // 32, 16, n_out).transpose(2, 0, 1), blocks[..., 2:])
    d = blocks[..., :2].copy().view(np.float16)[..., 0]  # [out, nb]
    np.testing.assert_array_equal(np.asarray(scale).astype(np.float16).T, d)
    want = gguf_quants.dequantize(raw, GGMLQuantizationType.Q4_0).reshape(n_out, n_in).T
    got = dequantize(q, jnp.asarray(np.asarray(scale).astype(np.float16).astype(np.float32)), "int4")
    np.testing.assert_array_equal(np.asarray(got), want)


def test_nf4_is_the_nearest_level_of_each_block():
    n_in, n_out, block = 128, 5, 64
    w = _weights((2, n_in, n_out), 2)
    q, scale = quantize(jnp.asarray(w), "nf4", block)
    wb = w.reshape(2, n_in // block, block, n_out)
    absmax = np.abs(wb).max(axis=2)
    codes = np.abs((wb / absmax[:, :, None])[..., None] - NF4_TABLE).argmin(-1)
    want = (NF4_TABLE[codes] * absmax[:, :, None]).reshape(w.shape)
    np.testing.assert_allclose(np.asarray(dequantize(q, scale, "nf4")), want, rtol=1e-6, atol=0)
    assert q.dtype == jnp.uint8 and q.shape == (2, n_in // 2, n_out) and scale.shape == (2, n_in // block, n_out)
    # QLoRA's levels: 16 sorted values with an exact 0 and +-1 at the ends.
    assert len(NF4_TABLE) == 16 and np.all(np.diff(NF4_TABLE) > 0) and 0.0 in NF4_TABLE
    assert NF4_TABLE[0] == -1.0 and NF4_TABLE[-1] == 1.0


def test_int8_is_llama_cpp_q8_0():
    """int8 is Q8_0: the gguf package's quantizer (llama.cpp's reference rule) gives the same codes and,
    rounded to float16 as GGUF stores it, the same scale for every block of 32 input rows of a column,
    and the same dequantized weights. The weights are chosen so that any other rule gives other codes:
    the four blocks of a column differ in magnitude 64-fold (one scale per column would zero most of
    the smallest block), a column and a block are all zero, and one block holds exact ties (x / scale =
    k + 1/2), which roundf takes away from zero where jnp.round's half to even would not."""
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    n_in, n_out, nb = 128, 7, 128 // Q8_BLOCK
    w = _weights((2, n_in, n_out), 3) * np.repeat(np.float32([1, 4, 0.25, 16]), Q8_BLOCK)[:, None]
    w[0, :, 2] = 0.0
    w[1, 32:64, 4] = 0.0
    # max 127 / 64: the scale is exactly 1 / 64, so these are ties at 126.5, 2.5, -2.5, 0.5, -0.5, 1.5.
    ties = np.float32([127, -126.5, 2.5, -2.5, 0.5, -0.5, 1.5, 3.0]) / 64
    w[1, 64:72, 5] = ties
    w[1, 72:96, 5] = 0.0
    q, scale = quantize(jnp.asarray(w), "int8")
    assert q.dtype == jnp.int8 and q.shape == w.shape and scale.shape == (2, nb, n_out)
    np.testing.assert_array_equal(np.asarray(q)[1, 64:72, 5], [127, -127, 3, -3, 1, -1, 2, 3])
    rows = np.ascontiguousarray(w.transpose(0, 2, 1).reshape(-1, n_in))  # gguf rows = output columns
    raw = gguf_quants.quantize(rows, GGMLQuantizationType.Q8_0)
    blocks = raw.reshape(2, n_out, nb, 34)  # per block: float16 scale, 32 int8 codes
    np.testing.assert_array_equal(np.asarray(q).reshape(2, nb, Q8_BLOCK, n_out).transpose(0, 3, 1, 2),
                                  blocks[..., 2:].view(np.int8))
    d = blocks[..., :2].copy().view(np.float16)[..., 0].transpose(0, 2, 1)  # [2, nb, out]
    np.testing.assert_array_equal(np.asarray(scale).astype(np.float16), d)
    # Before the float16 rounding the scale is llama.cpp's float32 d = amax / 127.
    absmax = np.abs(w.reshape(2, nb, Q8_BLOCK, n_out)).max(axis=2)
    np.testing.assert_array_equal(np.asarray(scale), absmax / np.float32(127))
    want = gguf_quants.dequantize(raw, GGMLQuantizationType.Q8_0).reshape(2, n_out, n_in).transpose(0, 2, 1)
    got = dequantize(q, jnp.asarray(d.astype(np.float32)), "int8")
    np.testing.assert_array_equal(np.asarray(got), want)
    assert not np.any(want[0, :, 2]) and not np.any(want[1, 32:64, 4])
    # Compiled, as quantize_base runs it (where XLA would turn the division by 127 into a multiplication
    # an ulp off for some blocks): 2,048 more blocks, the same scales and codes as Q8_0's.
    w = _weights((4096, 16), 6)
    q, scale = jax.jit(quantize, static_argnums=1)(jnp.asarray(w), "int8")
    blocks = gguf_quants.quantize(np.ascontiguousarray(w.T), GGMLQuantizationType.Q8_0).reshape(16, -1, 34)
    np.testing.assert_array_equal(np.asarray(q).reshape(-1, Q8_BLOCK, 16).transpose(2, 0, 1), blocks[..., 2:].view(np.int8))
    np.testing.assert_array_equal(np.asarray(scale), np.abs(w.reshape(-1, Q8_BLOCK, 16)).max(axis=1) / np.float32(127))


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_error_is_at_most_half_a_step(mode):
    """Round-to-nearest on a uniform grid: every weight inside the grid is within half a step of its
    value. Q4_0's grid is -8..7 steps with the block's extreme at -8, so weights of the other sign
    beyond 7.5 steps are clipped to 7 (within one step)."""
    w = _weights((256, 16), 4)
    q, scale = quantize(jnp.asarray(w), mode)
    err = np.abs(np.asarray(dequantize(q, scale, mode)) - w)
    d = np.repeat(np.asarray(scale), Q8_BLOCK if mode == "int8" else 64, axis=0)
    inside = np.ones(w.shape, bool) if mode == "int8" else (w / d <= 7.5)
    assert np.all(err[inside] <= np.abs(d[inside]) / 2 * (1 + 1e-5))
    assert np.all(err <= np.abs(d) * (1 + 1e-5))


def test_quantized_kernels_need_whole_blocks():
    """The fix each error names is a mode that fits: int8 (blocks of 32) for a 4-bit misfit of 96 rows,
    the float base where not even 32 divides the input size."""
    with pytest.raises(ValueError, match="multiple of the block size 64.*base_quant=int8 "):
        quantize(jnp.zeros((96, 8)), "nf4")
    with pytest.raises(ValueError, match="multiple of the block size 64.*base_quant=none "):
        quantize(jnp.zeros((80, 8)), "int4")
    with pytest.raises(ValueError, match="input size \\(48\\) to be a multiple of Q8_0's block size 32; "
                                         "use model.base_quant=none"):
        quantize(jnp.zeros((2, 48, 8)), "int8")
    with pytest.raises(ValueError, match="unknown base quantization 'fp8'"):
        quantize(jnp.zeros((64, 8)), "fp8")


# ----------------------------------------------------------------------------- the model
def _lora_model(param_dtype="float32"):
    """A tiny LoRA model with non-zero adapters (so they matter in the comparisons)."""
    model = Qwen2(CFG.replace(param_dtype=param_dtype), nnx.Rngs(0))
    add_lora(model, RANK, ALPHA, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(5)
    for _, dense in projections(model):
        dense.lora_b[...] = jnp.asarray(rng.normal(0, 0.05, dense.lora_b.shape), jnp.float32)
    return model


@functools.lru_cache(maxsize=None)
def _pair(mode: str, param_dtype: str = "float32"):
    """(quantized model, its dequantize-then-float twin): the same adapters and other weights, float
    kernels equal to the dequantized codes (float32)."""
    quantized = _lora_model(param_dtype)
    reference = _lora_model(param_dtype)
    quantize_base(quantized, mode)
    reference = with_config(reference, param_dtype="float32")
    for (_, dq), (_, dr) in zip(projections(quantized), projections(reference)):
        original = np.asarray(dr.kernel[...], np.float32)
        dr.kernel = nnx.Param(dequantize(dq.kernel_q[...], dq.kernel_scale[...], mode, jnp.float32))
        assert not np.array_equal(np.asarray(dr.kernel[...]), original)  # the twin is not the unquantized model
    assert quantized.cfg.base_quant == mode and quantized.model.cfg.base_quant == mode
    return quantized, reference


def _tokens(b=2, t=9, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, (b, t)).astype(np.int32)
    valid = np.ones((b, t), bool)
    valid[1, 6:] = False  # a right-padded row
    return tokens, valid


@functools.partial(jax.jit, static_argnums=(0, 4))
def _logits(graphdef, params, tokens, valid, inference):
    model = nnx.merge(graphdef, params)
    hidden, _ = model(tokens, valid, inference=inference)
    return model.logits(hidden)


@functools.partial(jax.jit, static_argnums=0)
def _cached_logits(graphdef, params, tokens, valid):
    """Prefill the first 5 tokens into a cache, then decode the rest one token at a time."""
    model = nnx.merge(graphdef, params)
    cache = KVCache.init(model.cfg, tokens.shape[0], 16, "float32")
    hidden, cache = model(tokens[:, :5], valid[:, :5], cache)
    out = [model.logits(hidden)]
    for t in range(5, tokens.shape[1]):
        hidden, cache = model(tokens[:, t:t + 1], valid[:, t:t + 1], cache)
        out.append(model.logits(hidden))
    return jnp.concatenate(out, axis=1)


def _close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ["train", "train-remat", "inference", "cached", "cached-scan"])
def test_logits_equal_the_dequantize_then_float_forward(mode, path):
    quantized, reference = _pair(mode)
    changes = {"train-remat": dict(remat=True), "cached-scan": dict(decode_unroll=False)}.get(path, {})
    tokens, valid = _tokens()
    outs = []
    for model in (quantized, reference):
        graphdef, params = nnx.split(with_config(model, **changes))
        if path.startswith("cached"):
            outs.append(_cached_logits(graphdef, params, tokens, valid))
        else:
            outs.append(_logits(graphdef, params, tokens, valid, path == "inference"))
    _close(*outs)


def test_bf16_base_logits_equal_the_dequantize_then_float_forward():
    """A bfloat16 base stores bfloat16 scales (the CPU integer-view paths slice them): the twin's
    float32 kernels are the dequantized codes with those scales."""
    quantized, reference = _pair("nf4", "bfloat16")
    assert quantized.model.layers.mlp.up_proj.kernel_scale.dtype == jnp.bfloat16
    tokens, valid = _tokens()
    for changes, inference in ((dict(remat=True), False), ({}, True)):
        outs = [_logits(*nnx.split(with_config(m, **changes)), tokens, valid, inference)
                for m in (quantized, reference)]
        _close(*outs)


@pytest.mark.parametrize("mode", ["int8", "nf4"])
def test_adapter_gradients_equal_the_dequantize_then_float_model(mode):
    """The rematerialised training forward (the frozen base closed over and sliced per layer) gives
    the adapters the gradient the float model gives them."""
    tokens, valid = _tokens()

    def grads(model):
        graphdef, adapters, base = nnx.split(with_config(model, remat=True), LoRAParam, ...)

        def loss(adapters):
            logits = _logits.__wrapped__(graphdef, nnx.merge_state(adapters, base), tokens, valid, False)
            return jnp.mean(jax.nn.log_softmax(logits)[..., 3] * valid)

        return jax.jit(jax.grad(loss))(adapters)

    got, want = (grads(m) for m in _pair(mode))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        _close(g, w)
