"""Sampler tests: cached generation against a cache-free reference, stop rules, sampling statistics.

One tiny random Qwen2 (vocab 512) with large random weights, so that greedy continuations vary and
distributions are far from uniform. The truth for every check is independent of the cache path:
a full re-forward without cache (`model(tokens, valid, None)`), Python string search, or
softmax probabilities computed in numpy.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.rollout import sampler as S
from ragen_jax.models import KVCache, Qwen2, Qwen2Config

V = 512
N = 10  # new tokens in most tests


@pytest.fixture(scope="module")
def model():
    cfg = Qwen2Config.from_preset("tiny", vocab_size=V)
    graphdef, state = nnx.split(Qwen2(cfg, nnx.Rngs(0)))
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    keys = jax.random.split(jax.random.key(1), len(flat))
    # The default init (std 0.02) gives a model that repeats its last token forever; large weights
    # give varied greedy continuations, so token-by-token comparisons can actually fail.
    leaves = []
    for k, (path, x) in zip(keys, flat):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            leaves.append(x)
        elif "embedding" in name:
            leaves.append(jax.random.normal(k, x.shape, x.dtype))
        elif "kernel" in name:
            leaves.append(jax.random.normal(k, x.shape, x.dtype) * 3.0 / np.sqrt(x.shape[-2]))
        else:
            leaves.append(jax.random.normal(k, x.shape, x.dtype) * 0.1)
    return nnx.merge(graphdef, jax.tree.unflatten(jax.tree.structure(state), leaves))


@nnx.jit
def _full_logits(model, tokens, valid):
    hidden, _ = model(tokens, valid, None)
    return model.logits(hidden)


def reference_greedy(model, prompts, n):
    """Cache-free greedy: re-run the whole sequence each step, argmax at the last real token."""
    b = len(prompts)
    width = max(len(p) for p in prompts) + n
    buf = np.zeros((b, width), np.int32)
    lens = np.array([len(p) for p in prompts])
    for i, p in enumerate(prompts):
        buf[i, : len(p)] = p
    out, logps = np.zeros((b, n), np.int32), np.zeros((b, n), np.float32)
    for t in range(n):
        valid = np.arange(width)[None, :] < lens[:, None]
        logits = np.asarray(_full_logits(model, jnp.asarray(buf), jnp.asarray(valid)))
        last = logits[np.arange(b), lens - 1]
        nxt = last.argmax(-1)
        logps[:, t] = jax.nn.log_softmax(last, -1)[np.arange(b), nxt]
        out[:, t] = nxt
        buf[np.arange(b), lens] = nxt
        lens = lens + 1
    return out, logps


def teacher_forced_logprobs(model, prompts, gen, lengths, temperature):
    """log_softmax(logits / T) of each generated token, from one cache-free forward."""
    b, n = gen.shape
    width = max(len(p) for p in prompts) + n
    buf = np.zeros((b, width), np.int32)
    valid = np.zeros((b, width), bool)
    for i, p in enumerate(prompts):
        seq = list(p) + list(gen[i, : lengths[i]])
        buf[i, : len(seq)] = seq
        valid[i, : len(seq)] = True
    logp = np.asarray(jax.nn.log_softmax(_full_logits(model, jnp.asarray(buf), jnp.asarray(valid)) / temperature))
    out = np.zeros((b, n), np.float32)
    for i, p in enumerate(prompts):
        for t in range(lengths[i]):
            out[i, t] = logp[i, len(p) + t - 1, gen[i, t]]
    return out


def pad(prompts, width, left):
    b = len(prompts)
    tokens = np.full((b, width), 7, np.int32)  # pad id deliberately a real token: masking must hide it
    valid = np.zeros((b, width), bool)
    for i, p in enumerate(prompts):
        sl = slice(width - len(p), width) if left else slice(0, len(p))
        tokens[i, sl] = p
        valid[i, sl] = True
    return jnp.asarray(tokens), jnp.asarray(valid)


PROMPTS = [[5, 17, 300, 42, 9, 11], [100], [1, 2, 3], [400, 401, 402, 403, 404, 405, 406, 407]]
WIDTH = 9


@pytest.fixture(scope="module")
def greedy_ref(model):
    return reference_greedy(model, PROMPTS, N)


def gen(model, tokens, valid, **kw):
    kw.setdefault("stop_ids", ())
    return S.generate(model, tokens, valid, jax.random.key(0), max_new_tokens=N, **kw)


@pytest.mark.parametrize("left", [True, False])
def test_greedy_matches_cache_free_reference(model, greedy_ref, left):
    ref_tok, ref_logp = greedy_ref
    assert len({tuple(r) for r in ref_tok}) == len(PROMPTS)  # the test model is not degenerate
    out = gen(model, *pad(PROMPTS, WIDTH, left), greedy=True)
    np.testing.assert_array_equal(out.tokens, ref_tok)
    np.testing.assert_allclose(out.logprobs, ref_logp, atol=2e-4)
    np.testing.assert_array_equal(out.lengths, N)
    np.testing.assert_array_equal(out.stopped_by, S.STOP_BUDGET)
    # The cache holds prompt + all generated tokens (the last one included).
    np.testing.assert_array_equal(out.cache.end, [len(p) + N for p in PROMPTS])


@pytest.mark.parametrize("kw", [dict(greedy=True), dict(temperature=0.7), dict(temperature=0.7, top_k=5)])
def test_without_logprobs_same_tokens_and_none(model, greedy_ref, kw):
    """logprobs=False changes nothing that is sampled (greedy skips the vocabulary masses, sampling
    still draws from them), and says so with None rather than numbers that look like log-probs."""
    tokens, valid = pad(PROMPTS, WIDTH, True)
    full = S.generate(model, tokens, valid, jax.random.key(5), max_new_tokens=N, stop_ids=(67,), **kw)
    bare = S.generate(model, tokens, valid, jax.random.key(5), max_new_tokens=N, stop_ids=(67,), logprobs=False, **kw)
    assert bare.logprobs is None and full.logprobs is not None
    np.testing.assert_array_equal(bare.tokens, full.tokens)
    np.testing.assert_array_equal(bare.lengths, full.lengths)
    np.testing.assert_array_equal(bare.stopped_by, full.stopped_by)
    np.testing.assert_array_equal(bare.cache.end, full.cache.end)
    if kw.get("greedy"):  # against the cache-free reference, not only against ourselves
        stop = np.cumsum(greedy_ref[0] == 67, axis=1) - (greedy_ref[0] == 67) == 0
        np.testing.assert_array_equal(np.where(stop, greedy_ref[0], S.ENDOFTEXT), bare.tokens)


def test_sampled_logprobs_match_teacher_forcing(model):
    tokens, valid = pad(PROMPTS, WIDTH, left=True)
    out = S.generate(model, tokens, valid, jax.random.key(3), max_new_tokens=N, temperature=0.7, stop_ids=(67,))
    gen_tok, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    assert 0 < lengths.min() and lengths.max() <= N
    want = teacher_forced_logprobs(model, PROMPTS, gen_tok, lengths, 0.7)
    np.testing.assert_allclose(out.logprobs, want, atol=2e-4)
    for i, n in enumerate(lengths):
        assert np.all(gen_tok[i, n:] == S.ENDOFTEXT)
        assert (gen_tok[i, n - 1] == 67) == (out.stopped_by[i] == S.STOP_EOS)


def test_stop_ids_give_per_row_lengths(model, greedy_ref):
    ref_tok, _ = greedy_ref
    stop = (int(ref_tok[0, 3]), int(ref_tok[3, 6]))
    out = gen(model, *pad(PROMPTS, WIDTH, True), greedy=True, stop_ids=stop)
    for i in range(len(PROMPTS)):
        hits = [t for t in range(N) if ref_tok[i, t] in stop]
        n = hits[0] + 1 if hits else N
        assert out.lengths[i] == n
        np.testing.assert_array_equal(out.tokens[i, :n], ref_tok[i, :n])
        np.testing.assert_array_equal(out.tokens[i, n:], S.ENDOFTEXT)
        np.testing.assert_array_equal(out.logprobs[i, n:], 0.0)
        assert out.stopped_by[i] == (S.STOP_EOS if hits else S.STOP_BUDGET)
        assert out.cache.end[i] == len(PROMPTS[i]) + n
    assert out.lengths[0] <= 4


def test_top_k_1_and_tiny_top_p_equal_greedy(model, greedy_ref):
    ref_tok, _ = greedy_ref
    tokens, valid = pad(PROMPTS, WIDTH, False)
    np.testing.assert_array_equal(gen(model, tokens, valid, top_k=1).tokens, ref_tok)
    np.testing.assert_array_equal(gen(model, tokens, valid, top_p=1e-6).tokens, ref_tok)


# ------------------------------------------------------------------ decode with active / budget / segments


@functools.partial(nnx.jit, static_argnames=("n", "stop_ids"))
def _prefill_decode(model, cache, tokens, valid, active, budget, key, n, stop_ids=()):
    logits, cache = S.prefill(model, cache, tokens, valid)
    out = S.decode(model, cache, logits, key, max_new_tokens=n, budget=budget, active=active, greedy=True, stop_ids=stop_ids)
    return cache, out


def _cache_row(cache, r):
    return cache.k[:, r], cache.v[:, r], cache.end[r]


def test_inactive_rows_and_budgets(model, greedy_ref):
    ref_tok, _ = greedy_ref
    tokens, valid = pad(PROMPTS, WIDTH, True)
    cache = KVCache.init(model.cfg, batch=4, max_len=WIDTH + N)
    active = jnp.array([True, False, True, False])
    budget = jnp.array([3, N, N, 5], jnp.int32)
    before, out = _prefill_decode(model, cache, tokens, valid, active, budget, jax.random.key(0), N)
    np.testing.assert_array_equal(out.lengths, [3, 0, N, 0])
    np.testing.assert_array_equal(out.stopped_by, [S.STOP_BUDGET, S.STOP_NONE, S.STOP_BUDGET, S.STOP_NONE])
    np.testing.assert_array_equal(out.tokens[0, :3], ref_tok[0, :3])
    np.testing.assert_array_equal(out.tokens[2], ref_tok[2])
    toks = np.asarray(out.tokens)
    np.testing.assert_array_equal(toks[0, 3:], S.ENDOFTEXT)
    np.testing.assert_array_equal(toks[[1, 3]], S.ENDOFTEXT)
    np.testing.assert_array_equal(np.asarray(out.logprobs)[[1, 3]], 0.0)
    for r in (1, 3):  # inactive: cache rows bit-identical to after prefill
        chex.assert_trees_all_equal(_cache_row(out.cache, r), _cache_row(before, r))
        assert before.end[r] == len(PROMPTS[r])
    np.testing.assert_array_equal(np.asarray(out.cache.end)[[0, 2]], [len(PROMPTS[0]) + 3, len(PROMPTS[2]) + N])


def test_all_inactive_generates_nothing(model):
    tokens, valid = pad(PROMPTS, WIDTH, True)
    cache = KVCache.init(model.cfg, batch=4, max_len=WIDTH + N)
    before, out = _prefill_decode(model, cache, tokens, valid, jnp.zeros(4, bool), jnp.full(4, N), jax.random.key(0), N)
    np.testing.assert_array_equal(out.lengths, 0)
    np.testing.assert_array_equal(out.tokens, S.ENDOFTEXT)
    chex.assert_trees_all_equal(out.cache, before)  # keys, values and ends untouched


def test_multi_segment_equals_full_prompt(model):
    """prefill A, decode, prefill B (ragged, left-padded), decode == generate from A + gen + B."""
    seg1 = [[5, 6, 7], [9], [300, 301, 302, 303], [44, 45]]
    seg2 = [[11, 12], [13, 14, 15], [16], [17, 18, 19]]
    n1, n2 = 4, 5
    cache = KVCache.init(model.cfg, batch=4, max_len=4 + n1 + 3 + n2)
    t1, v1 = pad(seg1, 4, left=True)
    budget = jnp.full(4, n1, jnp.int32)
    _, out1 = _prefill_decode(model, cache, t1, v1, jnp.ones(4, bool), budget, jax.random.key(0), n1)
    t2, v2 = pad(seg2, 3, left=True)
    _, out2 = _prefill_decode(model, out1.cache, t2, v2, jnp.ones(4, bool), jnp.full(4, n2, jnp.int32), jax.random.key(0), n2)
    full = [a + list(np.asarray(out1.tokens[i])) + b for i, (a, b) in enumerate(zip(seg1, seg2))]
    ref, _ = reference_greedy(model, full, n2)
    np.testing.assert_array_equal(out2.tokens, ref)
    np.testing.assert_array_equal(out2.cache.end, [len(f) + n2 for f in full])


# ------------------------------------------------------------------ stop strings


def _fake_token_bytes(seed, vocab=V, lmax=4, alphabet=b"ab<"):
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, lmax + 1, vocab).astype(np.int32)
    lens[:3] = 0  # some tokens decode to nothing (e.g. unknown specials)
    table = np.zeros((vocab, lmax), np.uint8)
    for v in range(vocab):
        table[v, : lens[v]] = rng.choice(np.frombuffer(alphabet, np.uint8), lens[v])
    return table, lens


def _first_stop(seq, table, lens, stops):
    """Python truth: number of tokens until the decoded bytes first contain a stop string."""
    text = b""
    for t, tok in enumerate(seq):
        text += table[tok, : lens[tok]].tobytes()
        if any(s in text for s in stops):
            return t + 1
    return None


def _span(seq, table, lens, stops):
    """How many trailing tokens of `seq` the completed stop string covers."""
    for k in range(1, len(seq) + 1):
        if any(st in b"".join(table[t, : lens[t]].tobytes() for t in seq[-k:]) for st in stops):
            return k
    raise AssertionError("no stop string in seq")


@functools.partial(jax.jit, static_argnames=("steps",))
def _scan_stop(stop_table, toks, steps):
    w = stop_table.patterns.shape[1] - 1

    def body(carry, tok):
        window, done_at, t = carry
        window, hit = S.stop_string_step(window, tok, stop_table)
        done_at = jnp.where((done_at < 0) & hit, t + 1, done_at)
        return (window, done_at, t + 1), None

    init = (jnp.full((toks.shape[0], w), -1, jnp.int32), jnp.full(toks.shape[0], -1), 0)
    (_, done_at, _), _ = jax.lax.scan(body, init, toks.T)
    return done_at


@pytest.mark.parametrize("stops", [("ab<a",), ("<<", "baab", "a<b<a")])
def test_stop_string_detector_matches_python_search(stops):
    table, lens = _fake_token_bytes(0)
    st = S.make_stop_table(stops, (table, lens))
    toks = np.random.default_rng(1).integers(0, V, (2000, 12)).astype(np.int32)
    got = np.asarray(_scan_stop(st, jnp.asarray(toks), 12))
    enc = [s.encode() for s in stops]
    want = np.array([_first_stop(r, table, lens, enc) or -1 for r in toks])
    np.testing.assert_array_equal(got, want)
    # Cases that matter are present: stops spanning >= 3 tokens and rows that never stop.
    spans = [_span(toks[i, : want[i]], table, lens, enc) for i in range(len(toks)) if want[i] > 0]
    assert max(spans) >= 3 and (want == -1).any()


def test_generate_stops_on_string_across_tokens(model, greedy_ref):
    ref_tok, _ = greedy_ref
    table, lens = _fake_token_bytes(5, alphabet=b"xyz")
    lens[ref_tok[:, 3:6]] = np.maximum(lens[ref_tok[:, 3:6]], 1)
    # Stop string = last byte of row 2's token 3 + all of token 4 + first byte of token 5.
    t3, t4, t5 = ref_tok[2, 3:6]
    stop = table[t3, lens[t3] - 1 : lens[t3]].tobytes() + table[t4, : lens[t4]].tobytes() + table[t5, :1].tobytes()
    out = gen(model, *pad(PROMPTS, WIDTH, True), greedy=True, stop_strings=(stop.decode(),), token_bytes=(table, lens))
    spans = []
    for i in range(len(PROMPTS)):
        n = _first_stop(ref_tok[i], table, lens, [stop])
        assert out.lengths[i] == (n or N)
        assert out.stopped_by[i] == (S.STOP_STRING if n else S.STOP_BUDGET)
        np.testing.assert_array_equal(out.tokens[i, : out.lengths[i]], ref_tok[i, : out.lengths[i]])
        if n:
            spans.append(_span(ref_tok[i, :n], table, lens, [stop]))
    assert out.lengths[2] <= 6 and max(spans) >= 2


# ------------------------------------------------------------------ sampling statistics


@functools.partial(jax.jit, static_argnames=("top_k", "use_top_p"))
def _sample_many(logits, key, temperature, top_p, top_k, use_top_p):
    return S.sample_token(logits, key, temperature, top_p, greedy=False, top_k=top_k, use_top_p=use_top_p)


@pytest.mark.parametrize(
    "temperature,top_p,top_k",
    [(1.0, 1.0, 0), (0.6, 1.0, 0), (1.0, 1.0, 5), (1.0, 0.7, 0), (1.3, 0.6, 8)],
)
def test_sampled_frequencies_match_target_distribution(temperature, top_p, top_k):
    v, m = 24, 40000
    logits = np.random.default_rng(2).normal(0, 1.5, v).astype(np.float32)
    batch = jnp.broadcast_to(jnp.asarray(logits), (m, v))
    tok, logp = _sample_many(batch, jax.random.key(7), jnp.float32(temperature), jnp.float32(top_p), top_k, top_p < 1)
    tok = np.asarray(tok)
    # Target in numpy: temperature softmax, then top-k, then nucleus over the remaining mass.
    p = np.exp(logits / temperature - np.max(logits / temperature))
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(v, bool)
    k = top_k or v
    mass = 0.0
    renorm = p[order[:k]].sum()
    for j in order[:k]:
        if mass < top_p:
            keep[j] = True
        mass += p[j] / renorm
    target = np.where(keep, p, 0.0)
    target /= target.sum()
    counts = np.bincount(tok, minlength=v)
    assert counts[~keep].sum() == 0
    e = target[keep] * m
    chi2 = ((counts[keep] - e) ** 2 / e).sum()
    df = keep.sum() - 1
    assert chi2 < df + 6 * np.sqrt(2 * df) + 10, (chi2, df)
    # Log-probs are under the temperature-scaled, UNFILTERED distribution.
    np.testing.assert_allclose(logp, np.log(p)[tok], atol=1e-5)


@functools.partial(jax.jit, static_argnames=("greedy", "c1", "c2", "logprob"))
def _select_many(logits, key, temperature, greedy, c1, c2, logprob=True):
    return S.select_token(logits, key, temperature, greedy=greedy, c1=c1, c2=c2, logprob=logprob)


@pytest.mark.parametrize("c1,c2", [(16, 4), (8, 8), (24, 3)])
def test_chunked_select_is_exact(c1, c2):
    """Two-level inverse-CDF sampling and chunked argmax, incl. a shifted, partly masked last chunk."""
    v, m = 24, 40000
    logits = np.random.default_rng(4).normal(0, 1.5, v).astype(np.float32)
    logits[[5, 17]] = logits.max() + 1.0  # a tie for the maximum: the first index must win
    tok, logp = _select_many(jnp.broadcast_to(jnp.asarray(logits), (m, v)), jax.random.key(9), jnp.float32(0.8), False, c1, c2)
    p = np.exp(logits / 0.8 - np.max(logits / 0.8))
    p /= p.sum()
    counts = np.bincount(np.asarray(tok), minlength=v)
    chi2 = ((counts - p * m) ** 2 / (p * m)).sum()
    assert chi2 < (v - 1) + 6 * np.sqrt(2 * (v - 1)) + 10, chi2
    np.testing.assert_allclose(logp, np.log(p)[tok], atol=1e-5)
    g_tok, g_logp = _select_many(jnp.asarray(logits)[None], jax.random.key(0), jnp.float32(0.8), True, c1, c2)
    assert int(g_tok[0]) == 5
    np.testing.assert_allclose(g_logp[0], np.log(p[5]), atol=1e-5)
    # Greedy without the log-prob: the same first argmax (numpy's), over rows with ties and -inf.
    rows = np.random.default_rng(5).integers(-3, 3, (64, v)).astype(np.float32)
    rows[::7, ::3] = -np.inf
    b_tok, b_logp = _select_many(jnp.asarray(rows), jax.random.key(0), jnp.float32(0.8), True, c1, c2, logprob=False)
    assert b_logp is None
    np.testing.assert_array_equal(b_tok, rows.argmax(axis=1))


# ------------------------------------------------------------------ compilation and errors


def test_no_recompilation_for_new_prompts_or_weights(model, monkeypatch):
    # Fresh program cache, and a program that raises if traced twice (chex counts the traces).
    chex.clear_trace_counter()
    monkeypatch.setattr(S, "_GENERATE_FNS", {})
    monkeypatch.setattr(S, "generate_impl", chex.assert_max_traces(S.generate_impl, n=1))
    events = []

    def listener(name, *a, **k):
        if "compile" in name and "backend" in name:
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        rng = np.random.default_rng(0)

        def call(m, **kw):
            t = jnp.asarray(rng.integers(0, V, (3, 5)), jnp.int32)
            v = jnp.asarray(rng.random((3, 5)) < 0.8)
            kw = {"max_new_tokens": 3, "temperature": 0.9, "stop_ids": (), **kw}
            return S.generate(m, t, v, jax.random.key(int(rng.integers(1 << 30))), **kw)

        jax.block_until_ready(call(model).tokens)
        compiles = len(events)
        jax.block_until_ready(call(model).tokens)
        jax.block_until_ready(call(model, temperature=1.3).tokens)  # a traced setting
        other = Qwen2(model.cfg, nnx.Rngs(5))  # new weights, same shapes
        jax.block_until_ready(call(other).tokens)
        assert len(events) == compiles
        # The check can fail: a new static setting is a new program, traced once more.
        with pytest.raises(AssertionError, match="traced > 1 times"):
            call(model, max_new_tokens=4)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(temperature=0.0), "temperature"),
        (dict(cache_len=3), "cache_len"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(stop_strings=("x",)), "token_bytes"),
        (dict(stop_strings="x", token_bytes=(np.zeros((V, 1), np.uint8), np.ones(V, np.int32))), "sequence"),
    ],
)
def test_bad_arguments_raise_clear_errors(model, kw, msg):
    kw = {"max_new_tokens": 2, **kw}
    tokens, valid = pad(PROMPTS, WIDTH, True)
    with pytest.raises(ValueError, match=msg):
        S.generate(model, tokens, valid, jax.random.key(0), **kw)


@pytest.fixture(scope="module")
def model_bf16_matmuls(model):
    """The same weights with `matmul_dtype="bfloat16"`: projections and the head round their operands."""
    graphdef, state = nnx.split(model)
    cfg = model.cfg.replace(matmul_dtype="bfloat16")
    return nnx.merge(nnx.split(nnx.eval_shape(lambda: Qwen2(cfg, nnx.Rngs(0))))[0], state)


def test_bf16_matmul_sampler_matches_its_cache_free_reference(model, model_bf16_matmuls):
    """With bf16 matmuls the decode path (hoisted bf16 per-layer kernels, head cast once before the token
    loop) computes what the cache-free training forward of the same config computes: greedy tokens
    equal, log-probs equal, and sampled log-probs equal teacher forcing (rollout = trainer log-probs)."""
    m = model_bf16_matmuls
    ref_tok, ref_logp = reference_greedy(m, PROMPTS, N)
    out = gen(m, *pad(PROMPTS, WIDTH, True), greedy=True)
    np.testing.assert_array_equal(out.tokens, ref_tok)
    np.testing.assert_allclose(out.logprobs, ref_logp, atol=2e-4)
    tokens, valid = pad(PROMPTS, WIDTH, left=True)
    out = S.generate(m, tokens, valid, jax.random.key(3), max_new_tokens=N, temperature=0.7, stop_ids=(67,))
    want = teacher_forced_logprobs(m, PROMPTS, np.asarray(out.tokens), np.asarray(out.lengths), 0.7)
    np.testing.assert_allclose(out.logprobs, want, atol=2e-4)
    # The rounding is real but small: logits move by a little against the float32 model.
    full = np.asarray(_full_logits(m, tokens, valid))
    f32 = np.asarray(_full_logits(model, tokens, valid))
    diff = np.abs(full - f32)[np.asarray(valid)]
    assert 0 < diff.max() < 0.05 * np.abs(f32).max()
