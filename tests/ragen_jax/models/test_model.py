"""Qwen2 forward / KV cache against the PyTorch transformers reference (tests/fixtures/qwen2_*).

The fixtures (made by scripts/make_parity_fixture.py with torch) hold the HF logits for a LEFT-padded
batch, the logits of each row run alone, and HF greedy `generate` continuations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import KVCache, Qwen2, Qwen2Config, Qwen2Critic, critic_from_policy, from_pretrained

from .helpers import VARIANTS, fixture_dir, logits_nocache, logits_step, reference, right_padded

ATOL = 1e-5


@pytest.fixture(scope="module", params=VARIANTS)
def loaded(request):
    model = from_pretrained(fixture_dir(request.param))
    graphdef, params = nnx.split(model)
    return model, graphdef, params, reference(request.param)


def test_logits_match_reference_left_padding(loaded):
    _, g, p, ref = loaded
    valid = ref["attention_mask"].astype(bool)
    logits = np.asarray(logits_nocache(g, p, ref["input_ids"], valid))
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits[valid], ref["logits"][valid], rtol=0, atol=ATOL)


def test_logits_match_reference_without_padding(loaded):
    # Each row alone in HF (no padding at all) == our right-padded batch at the valid positions.
    _, g, p, ref = loaded
    ids, valid = right_padded(ref)
    logits = np.asarray(logits_nocache(g, p, ids, valid))
    np.testing.assert_allclose(logits[valid], ref["logits_single"][valid], rtol=0, atol=ATOL)


def test_cache_prefill_equals_reference_and_advances_end(loaded):
    model, g, p, ref = loaded
    valid = ref["attention_mask"].astype(bool)
    cache = KVCache.init(model.cfg, batch=3, max_len=24)
    logits, cache = logits_step(g, p, ref["input_ids"], valid, cache)
    np.testing.assert_allclose(np.asarray(logits)[valid], ref["logits"][valid], rtol=0, atol=ATOL)
    np.testing.assert_array_equal(np.asarray(cache.end), ref["lengths"])
    # Compact layout: slots >= end were never written.
    k = np.asarray(cache.k)
    for b, n in enumerate(ref["lengths"]):
        assert np.all(k[:, b, n:] == 0) and np.any(k[:, b, :n] != 0)


def test_greedy_decode_with_cache_reproduces_hf_generate(loaded):
    model, g, p, ref = loaded
    b, n_new = ref["greedy"].shape
    valid = ref["attention_mask"].astype(bool)
    cache = KVCache.init(model.cfg, batch=b, max_len=24)
    logits, cache = logits_step(g, p, ref["input_ids"], valid, cache)
    tok = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    out = [tok]
    for _ in range(n_new - 1):
        logits, cache = logits_step(g, p, tok[:, None], jnp.ones((b, 1), bool), cache)
        tok = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        out.append(tok)
    np.testing.assert_array_equal(np.stack(out, 1), ref["greedy"])
    np.testing.assert_array_equal(np.asarray(cache.end), ref["lengths"] + n_new - 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ragged_multi_segment_appends_equal_one_shot(loaded, seed):
    # Each row's tokens are spread over 6 chunks of width 4 at random positions (left, right and
    # interior padding, empty chunks); outputs at valid positions must equal the HF logits of the
    # row run alone, i.e. the cache holds every row contiguously from slot 0.
    model, g, p, ref = loaded
    ids, valid = right_padded(ref)
    rng = np.random.default_rng(seed)
    n_chunks, width = 6, 4
    toks = np.zeros((3, n_chunks * width), np.int32)
    mask = np.zeros((3, n_chunks * width), bool)
    for b, n in enumerate(ref["lengths"]):
        where = np.sort(rng.choice(n_chunks * width, size=n, replace=False))
        toks[b, where] = ids[b, :n]
        mask[b, where] = True
        # Garbage pads, including ids outside the vocabulary (which must not produce NaN).
        toks[b, ~mask[b]] = rng.integers(-3, model.cfg.vocab_size + 3, (~mask[b]).sum())
    cache = KVCache.init(model.cfg, batch=3, max_len=16)
    got = []
    for c in range(n_chunks):
        sl = slice(c * width, (c + 1) * width)
        logits, cache = logits_step(g, p, toks[:, sl], mask[:, sl], cache)
        got.append(np.asarray(logits))
    got = np.concatenate(got, axis=1)
    for b, n in enumerate(ref["lengths"]):
        np.testing.assert_allclose(got[b][mask[b]], ref["logits_single"][b, :n], rtol=0, atol=ATOL)
    np.testing.assert_array_equal(np.asarray(cache.end), ref["lengths"])
    # The no-cache path follows the same rule (positions cumsum(valid) - 1, gaps skipped).
    whole = np.asarray(logits_nocache(g, p, toks, mask))
    for b, n in enumerate(ref["lengths"]):
        np.testing.assert_allclose(whole[b][mask[b]], ref["logits_single"][b, :n], rtol=0, atol=ATOL)


def test_bf16_compute_close_to_f32_reference():
    ref = reference("tied")
    model = from_pretrained(fixture_dir("tied"), dtype="bfloat16")
    assert model.model.layers.mlp.up_proj.kernel[...].dtype == jnp.bfloat16
    g, p = nnx.split(model)
    valid = ref["attention_mask"].astype(bool)
    cache = KVCache.init(model.cfg, batch=3, max_len=16)
    assert cache.k.dtype == jnp.bfloat16
    logits, cache = logits_step(g, p, ref["input_ids"], valid, cache)
    err = np.abs(np.asarray(logits)[valid] - ref["logits"][valid])
    # bf16 has 8 mantissa bits: errors of a few percent of the logit scale, but no more.
    scale = np.abs(ref["logits"][valid]).max()
    assert logits.dtype == jnp.float32 and err.max() < 0.1 * scale, (err.max(), scale)
    assert err.max() > 0  # really computed in bf16


def test_decode_step_has_no_quadratic_intermediate():
    # A T=1 decode step over an S-slot cache must not build anything with two S-sized dims.
    cfg = Qwen2Config.from_preset("tiny", vocab_size=64, num_hidden_layers=3)
    g, p = nnx.split(nnx.eval_shape(lambda: Qwen2(cfg, nnx.Rngs(0))))
    s = 97
    cache = jax.eval_shape(lambda: KVCache.init(cfg, batch=2, max_len=s))

    def step(p, tok, valid, cache):
        return logits_step.__wrapped__(g, p, tok, valid, cache)

    jaxpr = jax.make_jaxpr(step)(p, jnp.zeros((2, 1), jnp.int32), jnp.ones((2, 1), bool), cache)
    shapes = []

    def walk(jx):
        for eqn in jx.eqns:
            shapes.extend(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    assert any(s in sh for sh in shapes)  # the cache is really there
    assert not [sh for sh in shapes if sh.count(s) >= 2]


@pytest.mark.parametrize("policy", ["full", "dots"])
def test_remat_gives_same_gradients_and_left_padding_grads_are_finite(policy):
    cfg = Qwen2Config.from_preset("tiny", vocab_size=64, remat_policy=policy)
    tokens = jax.random.randint(jax.random.key(0), (2, 6), 0, 64)
    valid = jnp.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], bool)

    def grads(remat):
        g, params = nnx.split(Qwen2(cfg.replace(remat=remat), nnx.Rngs(0)))

        def loss(params):
            m = nnx.merge(g, params)
            logits = m.logits(m(tokens, valid)[0])
            return jnp.sum(jnp.where(valid[..., None], jax.nn.log_softmax(logits), 0.0))

        return jax.jit(jax.grad(loss))(params)

    a, b = grads(False), grads(True)
    scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(a))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert np.all(np.isfinite(x)) and np.all(np.isfinite(y))
        # Same math, another fusion/summation order: float32 rounding relative to the largest gradient.
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6 * max(scale, 1.0))


@pytest.mark.parametrize("seed", range(4))
def test_shared_prefix_forward_equals_the_full_sequence(loaded, seed):
    # Truth: the no-cache forward of prefix + row (checked against HF above), at the row's positions.
    model, g, p, _ = loaded
    rng = np.random.default_rng(seed)
    v = model.cfg.vocab_size
    n_pre, t, b = int(rng.integers(1, 9)), int(rng.integers(2, 9)), 3
    prefix = rng.integers(0, v, n_pre)
    rows = rng.integers(0, v, (b, t))
    lengths = rng.integers(1, t + 1, b)
    valid = np.arange(t)[None] < lengths[:, None]  # right padding, as the trainers batch
    full = np.asarray(logits_nocache(g, p, np.concatenate([np.tile(prefix, (b, 1)), rows], 1),
                                     np.concatenate([np.ones((b, n_pre), bool), valid], 1)))[:, n_pre:]

    @jax.jit
    def with_prefix(params, prefix, rows, valid):
        m = nnx.merge(g, params)
        return m.logits(m(rows, valid, prefix=m.prefix_kv(prefix))[0])

    got = np.asarray(with_prefix(p, prefix, rows, valid))
    np.testing.assert_allclose(got[valid], full[valid], rtol=0, atol=ATOL)


def test_shared_prefix_gradients_equal_the_full_sequence_gradients():
    # The prefix is computed once and broadcast: its gradient must be the sum over the rows.
    cfg = Qwen2Config.from_preset("tiny", vocab_size=64)
    g, params = nnx.split(Qwen2(cfg, nnx.Rngs(1)))
    prefix = jax.random.randint(jax.random.key(0), (5,), 0, 64)
    rows = jax.random.randint(jax.random.key(1), (3, 6), 0, 64)
    valid = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]], bool)

    def nll(logits, tokens, valid):
        lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], -1)[..., 0]
        return -jnp.sum(jnp.where(valid[:, 1:], lp, 0.0))

    def full(params):
        m = nnx.merge(g, params)
        tokens = jnp.concatenate([jnp.tile(prefix, (3, 1)), rows], 1)
        v = jnp.concatenate([jnp.ones((3, 5), bool), valid], 1)
        return nll(m.logits(m(tokens, v)[0])[:, 5:], rows, valid)

    def shared(params):
        m = nnx.merge(g, params)
        return nll(m.logits(m(rows, valid, prefix=m.prefix_kv(prefix))[0]), rows, valid)

    (la, ga), (lb, gb) = jax.jit(jax.value_and_grad(full))(params), jax.jit(jax.value_and_grad(shared))(params)
    np.testing.assert_allclose(la, lb, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="cannot be combined"):
        nnx.merge(g, params)(rows, valid, KVCache.init(cfg, 3, 16), prefix=nnx.merge(g, params).prefix_kv(prefix))


def test_critic_from_policy_copies_trunk_and_adds_f32_value_head():
    policy = from_pretrained(fixture_dir("untied"))
    ref = reference("untied")
    ids, valid = right_padded(ref)
    critic = critic_from_policy(policy, rngs=nnx.Rngs(3))
    assert isinstance(critic, Qwen2Critic)
    run = nnx.jit(lambda c, p: (c(ids, valid), p(ids, valid)[0]))
    values, hidden = map(np.asarray, run(critic, policy))
    w = np.asarray(critic.value_head.kernel[...])
    bias = np.asarray(critic.value_head.bias[...])
    assert values.shape == ids.shape and values.dtype == np.float32 and w.shape == (policy.cfg.hidden_size, 1)
    np.testing.assert_allclose(values, hidden @ w[:, 0] + bias[0], rtol=1e-5, atol=1e-5)
    # A separate copy: changing the policy leaves the critic alone; share_trunk shares.
    shared = critic_from_policy(policy, share_trunk=True)
    policy.model.norm.scale[...] = policy.model.norm.scale[...] * 2.0
    values2, hidden2 = map(np.asarray, run(critic, policy))
    np.testing.assert_array_equal(values2, values)
    assert not np.allclose(hidden2, hidden)
    assert shared.model.norm.scale is policy.model.norm.scale


def test_fresh_model_shapes_and_dtypes():
    cfg = Qwen2Config.from_preset("tiny", vocab_size=128, tie_word_embeddings=False, param_dtype="bfloat16")
    model = Qwen2(cfg, nnx.Rngs(0))
    g, p = nnx.split(model)
    hidden = jax.eval_shape(lambda p: nnx.merge(g, p)(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3), bool)), p)
    assert hidden[1] is None and hidden[0].shape == (2, 3, 64) and hidden[0].dtype == jnp.float32
    logits = jax.eval_shape(lambda p, h: nnx.merge(g, p).logits(h), p, hidden[0])
    assert logits.shape == (2, 3, 128) and logits.dtype == jnp.float32
    assert model.lm_head.kernel[...].shape == (64, 128) and model.lm_head.kernel[...].dtype == jnp.bfloat16
    assert model.model.layers.self_attn.k_proj.kernel[...].shape == (2, 64, 32)
    assert not hasattr(model.model.layers.self_attn.o_proj, "bias")


def test_bad_inputs_raise_clear_errors():
    cfg = Qwen2Config.from_preset("tiny", vocab_size=64)
    model = Qwen2(cfg, nnx.Rngs(0))
    with pytest.raises(ValueError, match="valid shape"):
        model(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 4), bool))
    with pytest.raises(ValueError, match=r"tokens must be \[batch, time\]"):
        model(jnp.zeros((3,), jnp.int32), jnp.ones((3,), bool))
    with pytest.raises(ValueError, match="KV cache shape"):
        model(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3), bool), KVCache.init(cfg, batch=5, max_len=8))
