"""Attention kernels (ragen_jax/models/attention.py) against the `xla` einsum path, the reference.

Every implementation that runs on CPU (chunked; splash in the Pallas interpreter; the cudnn call's
arguments through jax's own reference implementation of the same call) must equal `xla` in values
and in gradients wrt q, k, v at the queries whose outputs are used, for the layouts the model uses:
grouped-query heads, right and left padding, the SFT shared prefix, KV-cache appends at ragged
per-row offsets. Then the whole tiny model: logits and parameter gradients with attention="chunked"
(small blocks, so every call spans several) equal attention="xla".

Tolerances: float32 atol 2e-5 on outputs / 5e-5 on gradients (values and gradients are O(1); the
kernels differ only in summation order). bfloat16: both sides round probabilities and products
to bf16 at different points, so atol 4e-2 on O(1) values (a few bf16 ulps).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragen_jax.models import KVCache, Qwen2, Qwen2Config
from ragen_jax.models.attention import (
    CHUNKED_MIN_SCORES,
    IMPLEMENTATIONS,
    attention,
    check_available,
    cudnn_attention,
    resolve,
)
from ragen_jax.experiment.config import Config, ConfigError, ModelConfig
from ragen_jax.experiment.build import build_policy

f32 = jnp.float32
TOL = {jnp.float32: dict(out=2e-5, grad=5e-5), jnp.bfloat16: dict(out=4e-2, grad=4e-2)}


def _inputs(seed, b, t, s, nh, nkv, d, dtype):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (b, t, nh, d), f32).astype(dtype)
    k = jax.random.normal(ks[1], (b, s, nkv, d), f32).astype(dtype)
    v = jax.random.normal(ks[2], (b, s, nkv, d), f32).astype(dtype)
    w = jax.random.normal(ks[3], (b, t, nh * d), f32)  # cotangent of the output
    return q, k, v, w


def _value_and_grads(q, k, v, w, q_valid, **kw):
    """attention output and d(sum(out * w over used queries))/d(q, k, v)."""

    def f(q, k, v):
        out = attention(q, k, v, q_valid=q_valid, **kw)
        return jnp.sum(jnp.where(q_valid[..., None], out.astype(f32) * w, 0.0)), out

    (_, out), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def _assert_same(ref, got, q_valid, dtype):
    (o_ref, g_ref), (o, g) = ref, got
    m = np.asarray(q_valid)
    np.testing.assert_allclose(np.asarray(o, np.float32)[m], np.asarray(o_ref, np.float32)[m],
                               rtol=0, atol=TOL[dtype]["out"])
    for name, a, b in zip("qkv", g_ref, g):
        np.testing.assert_allclose(np.asarray(b, np.float32), np.asarray(a, np.float32), rtol=0,
                                   atol=TOL[dtype]["grad"], err_msg=f"d/d{name}")


def _self_case(seed, dtype, *, b=3, t=21, p=0, nh=4, nkv=2, d=8, left=False):
    """Self-attention layout: P shared-prefix slots then T row slots; ragged padding."""
    q, k, v, w = _inputs(seed, b, t, p + t, nh, nkv, d, dtype)
    lengths = np.array([t, max(1, t // 2), 1][:b])
    idx = np.arange(t)[None]
    valid = jnp.asarray(idx >= (t - lengths)[:, None] if left else idx < lengths[:, None])
    kv_valid = jnp.concatenate([jnp.ones((b, p), bool), valid], axis=1)
    return (q, k, v, w), dict(kv_valid=kv_valid), valid


def _cache_case(seed, dtype, *, b=3, t=9, s=40, nh=6, nkv=2, d=8):
    """KV-cache append: rows already hold `end` slots, append ragged valid tokens (holes included)."""
    q, k, v, w = _inputs(seed, b, t, s, nh, nkv, d, dtype)
    end = jnp.array([0, 5, 23][:b], jnp.int32)
    valid = jnp.asarray(np.random.default_rng(seed).random((b, t)) < 0.7).at[:, 0].set(True)
    q_slot = end[:, None] + jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
    return (q, k, v, w), dict(kv_valid=None, q_slot=q_slot), valid


# (layout, dtype, block): block 4 spans many blocks (skipping, partial last blocks), 512 is one block.
CHUNKED_CASES = [("right", jnp.float32, 4), ("left", jnp.float32, 4), ("prefix", jnp.float32, 4),
                 ("cache", jnp.float32, 4), ("cache", jnp.float32, 16), ("right", jnp.float32, 512),
                 ("prefix", jnp.bfloat16, 4), ("cache", jnp.bfloat16, 4)]


@pytest.mark.parametrize("layout,dtype,block", CHUNKED_CASES,
                         ids=[f"{la}-{jnp.dtype(dt).name}-{bl}" for la, dt, bl in CHUNKED_CASES])
def test_chunked_equals_xla(layout, dtype, block):
    if layout == "cache":
        args, kw, qv = _cache_case(0, dtype)
    else:
        args, kw, qv = _self_case(0, dtype, p=7 if layout == "prefix" else 0, left=layout == "left")
    ref = _value_and_grads(*args, qv, implementation="xla", **kw)
    got = _value_and_grads(*args, qv, implementation="chunked", block=block, **kw)
    _assert_same(ref, got, qv, dtype)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), b=st.integers(1, 3), t=st.integers(1, 24), p=st.integers(0, 9),
       nkv=st.sampled_from([1, 2]), groups=st.sampled_from([1, 3]), block=st.sampled_from([3, 8, 64]),
       left=st.booleans())
def test_chunked_equals_xla_random_shapes(seed, b, t, p, nkv, groups, block, left):
    args, kw, qv = _self_case(seed, jnp.float32, b=b, t=t, p=p, nh=nkv * groups, nkv=nkv, d=4, left=left)
    ref = _value_and_grads(*args, qv, implementation="xla", **kw)
    got = _value_and_grads(*args, qv, implementation="chunked", block=block, **kw)
    _assert_same(ref, got, qv, jnp.float32)


@pytest.mark.parametrize("layout,dtype", [("right", jnp.float32), ("left", jnp.bfloat16), ("prefix", jnp.float32)],
                         ids=["right-f32", "left-bf16", "prefix-f32"])
def test_splash_in_the_pallas_interpreter_equals_xla(layout, dtype):
    # Segment ids (valid 1, padding 0) make splash exact for any padding pattern; the causal offset
    # is the prefix length. T=130 is not a lane multiple: exercises the padding to 256.
    args, kw, qv = _self_case(1, dtype, b=2, t=130, p=5 if layout == "prefix" else 0, nh=4, nkv=2, d=16,
                              left=layout == "left")
    ref = _value_and_grads(*args, qv, implementation="xla", **kw)
    got = _value_and_grads(*args, qv, implementation="splash", **kw)
    _assert_same(ref, got, qv, dtype)


def test_cudnn_call_arguments_equal_xla_for_right_padded_rows():
    dtype = jnp.bfloat16  # the only kind of call cudnn gets
    # cuDNN itself needs a GPU; its call (causal + per-row lengths, no mask) runs here through jax's
    # reference implementation of the very same `dot_product_attention` arguments.
    (q, k, v, w), kw, qv = _self_case(2, dtype, t=19)
    ref = _value_and_grads(q, k, v, w, qv, implementation="xla", **kw)

    def f(q, k, v):
        out = cudnn_attention(q, k, v, kw["kv_valid"], _implementation="xla").reshape(w.shape)
        return jnp.sum(jnp.where(qv[..., None], out.astype(f32) * w, 0.0)), out

    (_, out), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    _assert_same(ref, (out, grads), qv, dtype)


def test_auto_choice_per_backend_and_layout():
    big = int(np.sqrt(CHUNKED_MIN_SCORES)) + 1
    kw = dict(dtype=jnp.bfloat16, head_dim=64)
    # decode: one query against the cache, the cheap path everywhere
    for backend in ("cpu", "gpu", "tpu"):
        assert resolve("auto", t=1, s=4096, self_layout=False, backend=backend, **kw) == "xla"
    # training rows
    assert resolve("auto", t=big, s=big, self_layout=True, backend="gpu", **kw) == "cudnn"
    assert resolve("auto", t=64, s=64, self_layout=True, backend="gpu", **kw) == "cudnn"
    assert resolve("auto", t=big, s=big, self_layout=True, backend="tpu", n_devices=1, **kw) == "splash"
    # several TPU devices and no context mesh to build splash's shard_map from: chunked
    # (test_attention_sharded.py: splash on a context mesh)
    assert resolve("auto", t=big, s=big, self_layout=True, backend="tpu", n_devices=8, **kw) == "chunked"
    assert resolve("auto", t=big, s=big, self_layout=True, backend="cpu", **kw) == "chunked"
    assert resolve("auto", t=64, s=64, self_layout=True, backend="cpu", **kw) == "xla"
    # float32 on GPU (cuDNN flash needs bf16/fp16) and a shared prefix (no per-row offset in cuDNN)
    assert resolve("auto", t=big, s=big, self_layout=True, backend="gpu", dtype=f32, head_dim=64) == "chunked"
    assert resolve("auto", t=big, s=big + 40, self_layout=True, backend="gpu", **kw) == "chunked"
    assert resolve("auto", t=big, s=big + 40, self_layout=True, backend="tpu", n_devices=1, **kw) == "splash"
    # multi-token cache appends: no cudnn/splash (per-row query offsets), chunked once large
    assert resolve("auto", t=big, s=big, self_layout=False, backend="gpu", **kw) == "chunked"
    assert resolve("auto", t=8, s=64, self_layout=False, backend="tpu", **kw) == "xla"
    # explicit kernels outside their layout fall back to the auto choice for that call
    assert resolve("cudnn", t=1, s=4096, self_layout=False, backend="gpu", **kw) == "xla"
    assert resolve("splash", t=big, s=big, self_layout=False, backend="tpu", **kw) == "chunked"
    assert resolve("chunked", t=1, s=8, self_layout=False, backend="cpu", **kw) == "chunked"


def test_unavailable_kernels_fail_with_one_sentence():
    with pytest.raises(ValueError, match="only on a GPU"):
        check_available("cudnn", jnp.bfloat16, backend="cpu")
    with pytest.raises(ValueError, match="bfloat16/float16"):
        check_available("cudnn", jnp.float32, backend="gpu")
    with pytest.raises(ValueError, match="only on a TPU"):
        check_available("splash", jnp.float32, backend="cpu", interpret_ok=False)
    check_available("splash", jnp.float32, backend="cpu")  # the interpreter is fine for tests
    q = jnp.zeros((1, 4, 2, 8), jnp.bfloat16)
    with pytest.raises(ValueError, match="only on a GPU"):  # at trace time, before anything runs
        attention(q, q, q, implementation="cudnn")
    # The config: the list of names comes from attention.py, availability is checked up front.
    assert ModelConfig().attention in IMPLEMENTATIONS
    with pytest.raises(ConfigError, match="model.attention"):
        ModelConfig(random_init=True, attention="flash").validate()
    with pytest.raises(ConfigError, match="model.attention: .*bfloat16"):
        ModelConfig(random_init=True, attention="cudnn").validate()  # float32 compute
    gpu_only = ModelConfig(random_init=True, preset="tiny", attention="cudnn", dtype="bfloat16")
    gpu_only.validate()  # the config alone is fine: the backend is checked once the devices exist
    cfg = Config()
    cfg.model = gpu_only
    with pytest.raises(ConfigError, match="model.attention: .*only on a GPU"):
        build_policy(cfg)  # before any parameter is created
    with pytest.raises(ValueError, match="Qwen2Config.attention"):
        Qwen2Config.from_preset("tiny", attention="flash")


def test_remat_default_is_on_from_half_a_billion_up():
    assert not ModelConfig(random_init=True, preset="tiny").use_remat
    assert not ModelConfig(random_init=True, preset="small").use_remat  # the other demo shape
    assert ModelConfig(random_init=True, preset="qwen2.5-0.5b").use_remat
    assert ModelConfig(random_init=True, preset="qwen2.5-3b").use_remat
    assert not ModelConfig(random_init=True, preset="qwen2.5-3b", remat=False).use_remat
    assert ModelConfig(random_init=True, preset="tiny", remat=True).use_remat


def test_chunked_backward_does_not_store_the_score_matrix():
    # Compile-time memory (no wall clock): the gradient of the chunked kernel at T=2048 needs far
    # less temporary memory than one [B, heads, T, T] float32 score matrix, which xla holds.
    b, t, nh, nkv, d = 1, 2048, 2, 1, 16
    q = jax.ShapeDtypeStruct((b, t, nh, d), f32)
    kv = jax.ShapeDtypeStruct((b, t, nkv, d), f32)

    def temp_bytes(impl):
        def loss(q, k, v):
            return jnp.sum(attention(q, k, v, implementation=impl, block=128))

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile().memory_analysis().temp_size_in_bytes

    scores = b * nh * t * t * 4
    assert temp_bytes("xla") >= scores
    assert temp_bytes("chunked") < scores / 8


# ----------------------------------------------------------------------------- the whole model
CFG = Qwen2Config.from_preset("tiny", vocab_size=97)


def _model(attention_impl, **kw):
    return Qwen2(CFG.replace(attention=attention_impl, attention_block=4, **kw), nnx.Rngs(0))


def _rows(seed, t=13):
    """Four rows: full, right-padded, left-padded, one token."""
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (4, t)))
    idx = np.arange(t)
    valid = np.stack([idx >= 0, idx < 7, idx >= t - 5, idx < 1])
    return tokens, jnp.asarray(valid)


def _logprob_loss(graphdef, tokens, valid, prefix_tokens=None):
    def loss(params):
        m = nnx.merge(graphdef, params)
        prefix = None if prefix_tokens is None else m.prefix_kv(prefix_tokens)
        logits = m.logits(m(tokens, valid, None, prefix=prefix)[0])
        logp = jax.nn.log_softmax(logits)[:, :-1]
        tgt = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return jnp.sum(jnp.where(valid[:, 1:] & valid[:, :-1], tgt, 0.0)), logits

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


@pytest.mark.parametrize("case", ["padding", "prefix"])
def test_model_logits_and_param_grads_chunked_equal_xla(case):
    tokens, valid = _rows(3)
    prefix = jnp.asarray([5, 9, 11, 2, 40, 7]) if case == "prefix" else None
    out = {}
    for impl in ("xla", "chunked"):
        g, params = nnx.split(_model(impl))
        out[impl] = _logprob_loss(g, tokens, valid, prefix)(params)
    (_, lx), gx = out["xla"]
    (_, lc), gc = out["chunked"]
    m = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(lc)[m], np.asarray(lx)[m], rtol=0, atol=2e-5)
    for a, b in zip(jax.tree.leaves(gx), jax.tree.leaves(gc)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=2e-6)


def test_model_ragged_multi_turn_cache_appends_chunked_equal_xla():
    # Prefill rows of different lengths, then two appends of different per-row lengths (the
    # multi-turn rollout): every valid position's logits and the cache equal the xla model's.
    b, turns = 3, [(9, [9, 4, 1]), (6, [2, 6, 0]), (5, [5, 1, 3])]
    results = {}
    for impl in ("xla", "chunked"):
        model = _model(impl)
        g, params = nnx.split(model)
        step = jax.jit(lambda p, x, v, c, g=g: (lambda m, out: (m.logits(out[0]), out[1]))(
            nnx.merge(g, p), nnx.merge(g, p)(x, v, c)))
        cache = KVCache.init(model.cfg, batch=b, max_len=24)
        outs = []
        for i, (t, lens) in enumerate(turns):
            r = np.random.default_rng(10 + i)
            tokens = jnp.asarray(r.integers(0, CFG.vocab_size, (b, t)))
            valid = jnp.arange(t)[None] < jnp.asarray(lens)[:, None]
            logits, cache = step(params, tokens, valid, cache)
            outs.append((np.asarray(logits), np.asarray(valid)))
        results[impl] = (outs, cache)
    for (lx, m), (lc, _) in zip(results["xla"][0], results["chunked"][0]):
        np.testing.assert_allclose(lc[m], lx[m], rtol=0, atol=2e-5)
    cx, cc = results["xla"][1], results["chunked"][1]
    np.testing.assert_array_equal(np.asarray(cx.end), np.asarray(cc.end))
    np.testing.assert_allclose(np.asarray(cc.k), np.asarray(cx.k), rtol=0, atol=2e-5)


def test_model_bf16_chunked_and_splash_within_bf16_rounding_of_xla():
    # Truth: the float32 xla model. The bf16 xla model differs from it by bf16 rounding; the bf16
    # chunked / splash models may differ by no more than twice that (plus 1e-3 absolute).
    tokens, valid = _rows(5, t=11)
    logits = {}
    for impl, dtype in (("xla", "float32"), ("xla", "bfloat16"), ("chunked", "bfloat16"), ("splash", "bfloat16")):
        g, params = nnx.split(_model(impl, dtype=dtype))
        fn = jax.jit(lambda p, g=g: (lambda m: m.logits(m(tokens, valid)[0]))(nnx.merge(g, p)))
        logits[impl, dtype] = np.asarray(fn(params))[np.asarray(valid)]
    truth = logits["xla", "float32"]
    rounding = np.abs(logits["xla", "bfloat16"] - truth).max()
    assert 0 < rounding < 1e-2
    for impl in ("chunked", "splash"):
        assert np.abs(logits[impl, "bfloat16"] - truth).max() <= 2 * rounding + 1e-3, impl
