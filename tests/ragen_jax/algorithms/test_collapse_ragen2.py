"""RAGEN-2 collapse metrics we had not logged (retrieval@k, marginal_std_seq, mi_zscore_seq, the EMA
variants) against a numpy port of RAGEN's `CollapseDetector._compute_metrics_for_pairs` /
`_compute_retrieval_accuracy` / `_update_ema_std`, on the valid rows and columns only (as RAGEN sees
them); top-k ties broken by the lower column (torch.topk leaves them unspecified)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algorithms import collapse as C


def ragen_port(logp_sum, n_tokens, col, sig, ema_store, decay=0.9, eps=1e-3):
    """logp_sum [M, N] over the N sampled prompts, col [M] in 0..N-1, sig [N] prompt signature ids."""
    n = logp_sum.shape[1]
    cross = logp_sum / np.maximum(n_tokens, 1)[:, None]

    def stats(x):
        matched = x[np.arange(len(col)), col]
        mx = x.max(1, keepdims=True)
        marginal = (mx[:, 0] + np.log(np.exp(x - mx).sum(1))) - math.log(n)
        return matched, marginal

    matched, marginal = stats(cross)
    matched_s, marginal_s = stats(logp_sum)
    out = {}
    k_max = min(8, n)
    topk = np.argsort(-cross, axis=1, kind="stable")[:, :k_max]
    true_sig = sig[col]
    counts = np.bincount(sig)
    chance = float((counts[true_sig] / n).mean())
    for k in (2, 4, 8):
        k_eff = min(k, k_max)
        acc = float((sig[topk[:, :k_eff]] == true_sig[:, None]).any(1).mean())
        out[f"retrieval_accuracy@{k}"] = acc
        out[f"retrieval_chance_level@{k}"] = min(1.0, chance * k_eff)
        out[f"retrieval_above_chance@{k}"] = acc - min(1.0, chance * k_eff)
    std, std_seq = marginal.std(), marginal_s.std()
    out["marginal_std"], out["marginal_std_seq"] = std, std_seq
    out["mi_zscore"] = float(((matched - marginal) / (std + eps)).mean())
    out["mi_zscore_seq"] = float(((matched_s - marginal_s) / (std_seq + eps)).mean())
    for key, cur in (("std", std), ("seq", std_seq)):
        ema_store[key] = cur if key not in ema_store else decay * ema_store[key] + (1 - decay) * cur
    out["marginal_std_ema"], out["marginal_std_ema_seq"] = ema_store["std"], ema_store["seq"]
    out["mi_zscore_ema"] = float(((matched - marginal) / (ema_store["std"] + eps)).mean())
    out["mi_zscore_ema_seq"] = float(((matched_s - marginal_s) / (ema_store["seq"] + eps)).mean())
    return out


def case(rng, m_pad, p):
    """A padded [m_pad, p] problem: random valid columns (>= 2), valid rows, signatures with repeats."""
    col_valid = rng.random(p) < 0.8
    col_valid[rng.choice(p, 2, replace=False)] = True
    valid_cols = np.flatnonzero(col_valid)
    m = rng.integers(1, m_pad + 1)
    row_valid = np.arange(m_pad) < m
    col = rng.choice(valid_cols, m_pad).astype(np.int32)
    sig_of = rng.integers(0, max(1, p - 2), p)  # some prompts identical
    same = sig_of[:, None] == sig_of[None, :]
    ties = rng.random() < 0.5
    logp = (rng.integers(-6, 0, (m_pad, p)) * 2.0) if ties else rng.normal(-20, 4, (m_pad, p))
    n_tok = rng.integers(0, 6, m_pad)
    if ties:
        n_tok = np.full(m_pad, 2)
    return logp.astype(np.float32), n_tok, col, row_valid, col_valid, same, sig_of


KEYS = ["retrieval_accuracy@2", "retrieval_accuracy@4", "retrieval_accuracy@8", "retrieval_chance_level@2",
        "retrieval_chance_level@4", "retrieval_chance_level@8", "retrieval_above_chance@2", "retrieval_above_chance@4",
        "retrieval_above_chance@8", "marginal_std", "marginal_std_seq", "mi_zscore", "mi_zscore_seq",
        "marginal_std_ema", "marginal_std_ema_seq", "mi_zscore_ema", "mi_zscore_ema_seq"]


def test_random_cases_match_the_ragen_port_with_ema_over_steps():
    rng = np.random.default_rng(0)
    mismatches = []
    for trial in range(60):
        store, ema = {}, None
        for step in range(3):  # the EMA carried over three metric steps
            logp, n_tok, col, row_valid, col_valid, same, sig_of = case(rng, 10, 12)
            args = (jnp.asarray(logp), jnp.asarray(n_tok), jnp.asarray(col), jnp.asarray(row_valid),
                    jnp.asarray(col_valid), jnp.asarray(same))
            base = C.collapse_metrics(*args)
            ema = C.ema_update(ema, base)
            got = {k.split("/", 1)[1]: float(v) for k, v in C.collapse_metrics(*args, ema=ema).items()}
            vc = np.flatnonzero(col_valid)
            remap = {c: j for j, c in enumerate(vc)}
            rows = np.flatnonzero(row_valid)
            _, sig = np.unique(sig_of[vc], return_inverse=True)
            want = ragen_port(logp[rows][:, vc].astype(np.float64), n_tok[rows],
                              np.array([remap[c] for c in col[rows]]), sig, store)
            for k in KEYS:
                if not got[k] == pytest.approx(want[k], rel=2e-4, abs=2e-4):
                    mismatches.append((trial, step, k, got[k], want[k]))
    assert not mismatches, mismatches[:5]


def test_hand_values_retrieval_at_k_and_seq_zscore():
    # 3 prompts, all distinct; 2 reasonings of one token each.
    # row 0 (from x2): log-probs [-1, -2, -3] -> rank of x2 is 3: @2 miss, @4/@8 hit (k_eff = 3).
    # row 1 (from x0): [-1, -1, -5] -> tie between x0 and x1, x0 ranks first: @2 hit.
    logp = jnp.array([[-1.0, -2.0, -3.0], [-1.0, -1.0, -5.0]])
    m = {k.split("/", 1)[1]: float(v) for k, v in C.collapse_metrics(
        logp, jnp.array([1, 1]), jnp.array([2, 0]), jnp.ones(2, bool), jnp.ones(3, bool)).items()}
    assert m["retrieval_accuracy"] == 0.5
    assert m["retrieval_accuracy@2"] == 0.5 and m["retrieval_accuracy@4"] == 1.0 and m["retrieval_accuracy@8"] == 1.0
    assert m["retrieval_chance_level@2"] == pytest.approx(2 / 3) and m["retrieval_chance_level@4"] == 1.0
    marg = np.array([np.logaddexp.reduce([-1, -2, -3]), np.logaddexp.reduce([-1, -1, -5])]) - math.log(3)
    d = np.array([-3.0, -1.0]) - marg
    assert m["marginal_std_seq"] == pytest.approx(float(marg.std()), rel=1e-5)
    assert m["mi_zscore_seq"] == pytest.approx(float(np.mean(d / (marg.std() + 1e-3))), rel=1e-5)
    # EMA: first step starts at the value; the second blends 0.9 old + 0.1 new.
    e1 = C.ema_update(None, {"collapse/marginal_std": 2.0, "collapse/marginal_std_seq": 4.0})
    e2 = C.ema_update(e1, {"collapse/marginal_std": 1.0, "collapse/marginal_std_seq": 0.0})
    assert e1 == (2.0, 4.0) and e2 == pytest.approx((1.9, 3.6))
