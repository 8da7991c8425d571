"""Reasoning-collapse diagnostics: the MI / entropy / retrieval math on hand-made log-prob matrices,
the compiled cross pass against a per-pair computation with a tiny model, copy / ignore policies end
to end (stub log-prob functions), and the host extraction of first-turn reasoning from token bytes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.algorithms.collapse import collapse_metrics
from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.text.tokenizer import load_tokenizer
from ragen_jax.trainer import collapse as C
from ragen_jax.trainer.step import sequence_logprobs


def _m(d):
    return {k.split("/")[1]: float(v) for k, v in d.items()}


def test_hand_computed_two_by_two():
    # z0 from x0, z1 from x1; log p(z_i | x_j), 2 tokens each.
    logp = jnp.array([[-1.0, -3.0], [-4.0, -2.0]])
    m = _m(collapse_metrics(logp, jnp.array([2, 2]), jnp.array([0, 1]), jnp.array([True, True]),
                            jnp.array([True, True])))
    matched = np.array([-1.0, -2.0])
    marginal = np.array([np.logaddexp(-1, -3), np.logaddexp(-4, -2)]) - math.log(2)
    assert m["mi_seq_estimate"] == pytest.approx(float(np.mean(matched - marginal)), rel=1e-6)
    assert m["conditional_entropy_seq_est"] == pytest.approx(1.5, rel=1e-6)
    assert m["reasoning_entropy_seq_est"] == pytest.approx(float(-marginal.mean()), rel=1e-6)
    marginal_t = np.array([np.logaddexp(-0.5, -1.5), np.logaddexp(-2, -1)]) - math.log(2)
    assert m["mi_estimate"] == pytest.approx(float(np.mean(matched / 2 - marginal_t)), rel=1e-6)
    assert m["conditional_entropy_est"] == pytest.approx(0.75, rel=1e-6)
    assert m["mi_upper_bound"] == pytest.approx(math.log(2))
    assert m["retrieval_accuracy"] == 1.0 and m["retrieval_chance_level"] == 0.5
    assert m["num_pairs"] == 2 and m["num_prompts"] == 2


def test_copying_policy_reaches_log_n_and_ignoring_policy_zero():
    rng = np.random.default_rng(0)
    m_rows, n = 4000, 8
    col = jnp.asarray(rng.integers(0, n, m_rows))
    ones = jnp.ones(m_rows, bool)
    # Copies the prompt: the true prompt explains z (log-prob 0), any other makes it 30 nats less likely.
    copy = jnp.where(jax.nn.one_hot(col, n) > 0, 0.0, -30.0)
    mc = _m(collapse_metrics(copy, jnp.full(m_rows, 10), col, ones, jnp.ones(n, bool)))
    assert mc["mi_seq_estimate"] == pytest.approx(math.log(n), abs=1e-4)
    assert mc["retrieval_accuracy"] == 1.0 and mc["retrieval_chance_level"] == pytest.approx(1 / n)
    # Ignores the prompt: the same log-prob under every prompt, up to noise unrelated to the prompt.
    base = jnp.asarray(rng.normal(-20.0, 3.0, (m_rows, 1)))
    ignore = base + 1e-3 * jnp.asarray(rng.normal(size=(m_rows, n)))
    mi = _m(collapse_metrics(ignore, jnp.full(m_rows, 10), col, ones, jnp.ones(n, bool)))
    assert abs(mi["mi_seq_estimate"]) < 1e-3 and mi["mi_upper_bound"] == pytest.approx(math.log(n))
    assert mi["retrieval_accuracy"] == pytest.approx(1 / n, abs=0.02)
    assert mi["conditional_entropy_seq_est"] == pytest.approx(mi["reasoning_entropy_seq_est"], abs=1e-3)


def test_padding_rows_unsampled_columns_and_identical_prompts():
    logp = jnp.array([[-1.0, -9.0, 50.0, -5.0], [-6.0, -2.0, 50.0, -1.0], [7.0, 7.0, 7.0, 7.0]])
    col = jnp.array([0, 1, 0])
    row_valid = jnp.array([True, True, False])  # the third row is padding
    col_valid = jnp.array([True, True, False, True])  # group 2 had no sampled pair: left out
    same = jnp.array([[1, 0, 0, 0], [0, 1, 0, 1], [0, 0, 1, 0], [0, 1, 0, 1]], bool)  # x1 == x3
    m = _m(collapse_metrics(logp, jnp.array([1, 1, 1]), col, row_valid, col_valid, same))
    assert m["num_prompts"] == 3 and m["num_pairs"] == 2
    # Row 1's best column is 3, whose prompt equals its own x1: correct.
    assert m["retrieval_accuracy"] == 1.0
    assert m["retrieval_chance_level"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    marginal = np.array([np.logaddexp.reduce([-1, -9, -5]), np.logaddexp.reduce([-6, -2, -1])]) - math.log(3)
    assert m["mi_seq_estimate"] == pytest.approx(float(np.mean(np.array([-1, -2]) - marginal)), rel=1e-6)


# ------------------------------------------------------------------------------------ the compiled pass
V, T = 48, 24


def _plan(m, p, rng):
    tokens = rng.integers(3, V, size=(p * 2, T)).astype(np.int32)
    plan = {"row": rng.integers(0, p * 2, m).astype(np.int32), "z_start": rng.integers(6, 12, m).astype(np.int32),
            "z_len": rng.integers(0, 6, m).astype(np.int32), "rep": (np.arange(p) * 2).astype(np.int32),
            "x_len": rng.integers(2, 8, p).astype(np.int32)}
    return tokens, plan


@pytest.mark.parametrize("prefix,tail,block,pad_rows", [(0, 0, 4, 1), (2, 0, 4, 1), (0, 6, 4, 1), (2, 6, 7, 6),
                                                        (0, 3, 4, 1), (0, 6, 16, 0)])
def test_cross_logprobs_match_a_per_pair_computation(prefix, tail, block, pad_rows, monkeypatch):
    """Truth: each pair [x_j | z_i] scored on its own. `prefix`: the prompts' shared first tokens run
    once per block (the probe's prompt prefix). `tail`: each block runs each of its prompts once and
    the rows only their reasonings (blocks straddling prompts, padding rows): every block fits the
    grouped shape; tail 3 < the longest reasoning (5): some blocks do not and take the per-row path."""
    from ragen_jax.trainer.group_prefix import split_groups

    fits = []
    real = C.sequence_logprobs

    def spy(graphdef, params, x, v, **kw):  # records whether each block took the grouped path
        if kw.get("groups") is not None:
            jax.debug.callback(lambda f: fits.append(bool(f)), split_groups(x, v, *kw["groups"]).fits)
        return real(graphdef, params, x, v, **kw)

    monkeypatch.setattr(C, "sequence_logprobs", spy)
    rng = np.random.default_rng(1)
    graph, params = nnx.split(Qwen2(Qwen2Config.from_preset("tiny").replace(vocab_size=V), rngs=nnx.Rngs(0)))
    m, p, width = 5, 3, 14
    tokens, plan = _plan(m, p, rng)
    tokens[:, :prefix] = tokens[0, :prefix]  # every x_j (x_len >= 2) starts with the same `prefix` ids
    fn = jax.jit(lambda prm, tok, pl: C.cross_logprobs(graph, prm, tok, pl, width=width, block=block,
                                                       pad_rows=pad_rows, pad_id=0, temperature=0.7, prefix=prefix,
                                                       tail=tail))
    got = np.asarray(fn(params, jnp.asarray(tokens), {k: jnp.asarray(v) for k, v in plan.items()}))
    n_blocks = -(-(m * p + pad_rows) // block)
    if tail:
        assert len(fits) == n_blocks and (all(fits) if tail >= plan["z_len"].max() else not all(fits)), fits
    else:
        assert fits == []
    # Each pair on its own: [x | z] right-padded to one width (one compilation), log-probs of z summed.
    naive = jax.jit(lambda prm, seq, valid: real(graph, prm, seq, valid, temperature=0.7)[0])
    for i in range(m):
        for j in range(p):
            x = tokens[plan["rep"][j], :plan["x_len"][j]]
            z = tokens[plan["row"][i], plan["z_start"][i]:plan["z_start"][i] + plan["z_len"][i]]
            seq = np.zeros((1, width), np.int32)
            seq[0, :len(x) + len(z)] = np.concatenate([x, z])
            lp = np.asarray(naive(params, jnp.asarray(seq), jnp.asarray(np.arange(width)[None] < len(x) + len(z))))
            want = float(np.sum(lp[0, len(x) - 1:len(x) + len(z) - 1]))
            assert got[i, j] == pytest.approx(want, abs=2e-4), (i, j)


def test_probe_blocks_share_each_prompt():
    """Column-major rows: a block of 4 of 5 x 3 pairs (+1 padding row) holds at most 2 prompts, and
    with tail 6 every block fits the grouped shape, each prompt's tokens counted once per block."""
    from ragen_jax.trainer.group_prefix import GroupShape, split_groups
    assert C.prompts_per_block(5, 3, 4, 1) == 2 and C.prompts_per_block(5, 3, 5, 0) == 1
    assert C.prompts_per_block(5, 3, 7, 6) == 2 and C.prompts_per_block(2, 4, 8, 0) == 4
    tokens, plan = _plan(5, 3, np.random.default_rng(1))
    ids, valid = C.build_rows(jnp.asarray(tokens), *(jnp.asarray(plan[k]) for k in
                                                      ("row", "z_start", "z_len", "rep", "x_len")), 14, 0)
    ids, valid = np.asarray(ids), np.asarray(valid)
    for r in range(15):  # column-major: row j * M + i is [x_j | z_i]
        j, i = divmod(r, 5)
        x = tokens[plan["rep"][j], :plan["x_len"][j]]
        z = tokens[plan["row"][i], plan["z_start"][i]:plan["z_start"][i] + plan["z_len"][i]]
        assert ids[r, :valid[r].sum()].tolist() == np.concatenate([x, z]).tolist() and valid[r, :len(x) + len(z)].all()
    col = np.arange(15) // 5
    for s in range(0, 15, 4):
        g = split_groups(jnp.asarray(ids[s:s + 4]), jnp.asarray(valid[s:s + 4]), jnp.asarray(col[s:s + 4]), 2,
                         GroupShape(width=14, tail=6))
        assert bool(g.fits) and np.all(np.asarray(g.start) >= plan["x_len"][col[s:s + 4]])


def _stub(kind, lag):
    """A log-prob function of a policy that copies the token `lag` positions back ("copy": log 0.9
    when the next token equals it, log 0.1/(V-1) otherwise) or ignores the context ("ignore": a
    fixed unigram distribution)."""
    unigram = jax.nn.log_softmax(jnp.linspace(0.0, 3.0, V))

    def fn(graphdef, params, tokens, valid, chunk=128, vocab=None, temperature=1.0, inference=False, prefix=0,
           groups=None):
        nxt = tokens[:, 1:]
        if kind == "ignore":
            return unigram[nxt], jnp.zeros(nxt.shape)
        back = jnp.concatenate([jnp.zeros((tokens.shape[0], lag), tokens.dtype), tokens[:, :-lag]], axis=1)[:, 1:]
        return jnp.where(nxt == back, math.log(0.9), math.log(0.1 / (V - 1))), jnp.zeros(nxt.shape)
    return fn


@pytest.mark.parametrize("kind", ["copy", "ignore"])
def test_copy_and_ignore_policies_through_the_pass(kind, monkeypatch):
    # P groups with distinct prompts of 6 tokens; each group's 2 reasonings copy the group's prompt.
    p, lx, lz = 4, 6, 6
    rng = np.random.default_rng(2)
    prompts = rng.permutation(np.arange(3, V))[:p * lx].reshape(p, lx).astype(np.int32)
    tokens = np.zeros((2 * p, T), np.int32)
    for r in range(2 * p):
        g = r // 2
        tokens[r, :lx] = prompts[g]
        tokens[r, lx:lx + lz] = prompts[g]
    plan = {"row": np.arange(2 * p, dtype=np.int32), "z_start": np.full(2 * p, lx, np.int32),
            "z_len": np.full(2 * p, lz, np.int32), "col": (np.arange(2 * p) // 2).astype(np.int32),
            "row_valid": np.ones(2 * p, bool), "rep": (np.arange(p) * 2).astype(np.int32),
            "x_len": np.full(p, lx, np.int32), "col_valid": np.ones(p, bool), "same_prompt": np.eye(p, dtype=bool)}
    monkeypatch.setattr(C, "sequence_logprobs", _stub(kind, lx))
    out = C.metrics_program(None, None, jnp.asarray(tokens), {k: jnp.asarray(v) for k, v in plan.items()},
                             width=lx + lz, block=8, pad_rows=0, pad_id=0)
    m = _m(out)
    if kind == "copy":
        # Matched: lz tokens at log 0.9; other prompts share no token: lz at log(0.1/47).
        gap = lz * (math.log(0.9) - math.log(0.1 / (V - 1)))
        want = math.log(p) - math.log(1 + (p - 1) * math.exp(-gap))
        assert m["mi_seq_estimate"] == pytest.approx(want, rel=1e-5) and m["mi_seq_estimate"] > 0.99 * math.log(p)
        assert m["retrieval_accuracy"] == 1.0
    else:
        assert m["mi_seq_estimate"] == pytest.approx(0.0, abs=1e-5) and m["mi_estimate"] == pytest.approx(0.0, abs=1e-6)
        assert m["retrieval_accuracy"] == pytest.approx(m["retrieval_chance_level"]) == pytest.approx(1 / p)


# ------------------------------------------------------------------------------------ host extraction
def test_first_turn_reasoning_from_token_bytes():
    tok = load_tokenizer()
    pieces = C.token_pieces(tok)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = enc("<|im_start|>user\nState: #_P#<|im_end|>\n<|im_start|>assistant\n<think>")
    turns = [" push the box right</think><answer>Right</answer><|im_end|>",  # a reasoning
             "   </think><answer>Up</answer><|im_end|>",  # blank: none
             " thinking without an end <answer>Up</answer>"]  # no </think>: none
    rows = []
    for t1 in turns:
        ids = prompt + enc(t1) + enc("\n<|im_start|>user\nReward: 0\n<|im_end|>\n") + enc(" ok</think>")
        rows.append(ids)
    width = max(map(len, rows)) + 2
    tokens = np.zeros((3, width), np.int32)
    mask = np.zeros((3, width), bool)
    for r, ids in enumerate(rows):
        tokens[r, :len(ids)] = ids
        n1 = len(enc(turns[r]))
        mask[r, len(prompt):len(prompt) + n1] = True
        mask[r, len(ids) - len(enc(" ok</think>")):len(ids)] = True  # turn 2 has a reasoning
    spans = C.reasoning_spans(tokens, mask, np.array([len(x) for x in rows]), pieces)
    np.testing.assert_array_equal(spans["first_valid"], [True, False, False])
    np.testing.assert_array_equal(spans["x_len"], [len(prompt)] * 3)
    z = tokens[0, spans["z_start"][0]:spans["z_start"][0] + spans["z_len"][0]]
    assert tok.decode(z.tolist()).strip() == "push the box right"
    assert b"</" not in b"".join(pieces[i] for i in z)
    np.testing.assert_array_equal(spans["turns"], [2, 2, 2])
    np.testing.assert_array_equal(spans["turns_with_reasoning"], [2, 1, 1])


def test_sample_pairs_columns_and_prompt_equality():
    spans = {"first_valid": np.array([1, 1, 0, 1, 1, 1], bool), "x_len": np.array([3, 3, 3, 3, 2, 2]),
             "z_start": np.array([3, 3, 3, 3, 2, 2]), "z_len": np.array([2, 1, 0, 4, 1, 3])}
    tokens = np.array([[1, 2, 3, 9, 9], [1, 2, 3, 8, 8], [4, 5, 6, 7, 7], [4, 5, 6, 7, 7], [1, 2, 0, 0, 0],
                       [1, 2, 0, 0, 0]], np.int32)
    group = np.array([0, 0, 1, 1, 2, 2])
    plan = C.sample_pairs(spans, tokens, group, 3, 8, np.random.default_rng(0), x_cap=8, z_cap=3)
    np.testing.assert_array_equal(plan["row"][:5], [0, 1, 3, 4, 5])  # all 5 valid rows, padded to 8
    np.testing.assert_array_equal(plan["row_valid"], [1, 1, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(plan["z_len"][:5], [2, 1, 3, 1, 3])  # capped at z_cap
    np.testing.assert_array_equal(plan["col"][:5], [0, 0, 1, 2, 2])
    np.testing.assert_array_equal(plan["rep"], [0, 2, 4])
    np.testing.assert_array_equal(plan["x_len"], [3, 3, 2])
    assert plan["col_valid"].all() and not plan["same_prompt"][0, 2] and plan["same_prompt"].trace() == 3
    few = C.sample_pairs(spans, tokens, group, 3, 2, np.random.default_rng(0), x_cap=8, z_cap=3)
    assert few["row_valid"].all() and len(set(few["row"].tolist())) == 2
