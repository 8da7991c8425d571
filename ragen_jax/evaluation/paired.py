"""Paired before/after comparison of two evaluations on the same states.

Two evaluations of a policy on the same fixed initial states are paired: a state's outcome depends
on the state (some rooms are easy), so the change is measured state by state, and an
independent-samples standard error, which ignores the pairing, is far too wide.

- `paired_change` (one rollout per state, outcomes 0 or 1): the exact McNemar test. Under "no
  change" each discordant state is equally likely to have flipped either way, so the number that
  improved is Binomial(discordant, 1/2).
- `paired_rates` (k rollouts per state, rates in {0, 1/k, ..., 1}): the per-state differences
  d_i = after_i - before_i, tested with the paired permutation (sign-flip) test on their sum: under
  "no change" the two evaluations of a state are exchangeable, so each d_i is as likely to be +|d_i|
  as -|d_i|. Its exact null distribution is a convolution over the distinct |d_i| (at most k of
  them, each a binomial at its own stride), so no enumeration of 2^n sign patterns is needed; with
  k = 1 it is McNemar's test. The Wilcoxon signed-rank test (midranks, zero differences dropped) is
  computed the same way, exactly, and reported beside it. The mean gain gets a bootstrap percentile
  interval over states (a fixed seed: the same numbers on every run).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# Exact null distributions are built on an integer grid of this many cells times (convolution steps);
# beyond it (thousands of states with large k) the p-value is a Monte Carlo estimate of
# MONTE_CARLO_FLIPS random sign patterns (stated in the result's `p_method`).
EXACT_WORK_LIMIT = 3 * 10**8
MONTE_CARLO_FLIPS = 100_000
BOOTSTRAP_RESAMPLES = 10_000


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value for `gained` states that flipped fail -> success and `lost`
    that flipped success -> fail: min(1, 2 * P[Binomial(gained + lost, 1/2) <= min(gained, lost)]).
    No discordant state gives 1.0."""
    for name, v in (("gained", gained), ("lost", lost)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a whole number >= 0 (a count of states), got {v!r}")
    n, k = gained + lost, min(gained, lost)
    if n == 0:
        return 1.0
    # Exact integer tail, one division: no float underflow for large n.
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2 ** n)


def _check_pair(before: Sequence[float], after: Sequence[float]) -> None:
    if len(before) != len(after):
        raise ValueError(f"paired comparison needs the same states before and after, got {len(before)} "
                         f"and {len(after)} per-state results; evaluate both on the same num_states")
    if not len(before):
        raise ValueError("paired comparison needs at least one state")


def paired_change(before: Sequence[float], after: Sequence[float]) -> dict:
    """Compare per-state success lists (same states, same order; one rollout per state: 0 or 1).

    Returns {"states", "before", "after", "change" (after - before success rate), "gained"
    (fail -> success), "lost" (success -> fail), "p_value" (exact McNemar, two-sided)}.
    """
    _check_pair(before, after)
    for v in list(before) + list(after):
        if v not in (0, 1, 0.0, 1.0):
            raise ValueError(f"per-state success must be 0 or 1 (one rollout per state), got {v!r}; "
                             "evaluate with rollouts_per_state=1, or compare rates with paired_rates")
    gained = sum(1 for b, a in zip(before, after) if not b and a)
    lost = sum(1 for b, a in zip(before, after) if b and not a)
    n = len(before)
    sb, sa = sum(map(float, before)) / n, sum(map(float, after)) / n
    return {"states": n, "before": sb, "after": sa, "change": sa - sb, "gained": gained, "lost": lost,
            "p_value": mcnemar_exact(gained, lost)}


# ------------------------------------------------------------------------------- k samples per state
def _counts(rates: Sequence[float], k: int, what: str) -> np.ndarray:
    """Per-state success counts (integers 0..k) from rates that must be multiples of 1/k."""
    r = np.asarray(rates, dtype=np.float64)
    c = np.rint(r * k)
    bad = ~np.isfinite(r) | (np.abs(r * k - c) > 1e-6) | (c < 0) | (c > k)
    if bad.any():
        v = r[np.argmax(bad)]
        raise ValueError(f"{what}: per-state success {v!r} is not a fraction j/{k} of {k} rollouts; give "
                         f"samples_per_state equal to the evaluation's rollouts_per_state")
    return c.astype(np.int64)


def _null_tail(weights: np.ndarray, observed: int) -> tuple[float, str]:
    """Two-sided p of a signed sum S = sum_i s_i * w_i (w_i > 0 integers, signs +-1 with probability
    1/2 each, independently) being at least as far from 0 as `observed`: P(|S| >= |observed|).

    Exact: S = 2T - W with T = sum over distinct weights w of w * Binomial(m_w, 1/2), W = sum w_i;
    T's law is built by adding one weight class at a time (m_w + 1 shifted copies). Monte Carlo
    (MONTE_CARLO_FLIPS patterns, seed 0) when that grid work would exceed EXACT_WORK_LIMIT."""
    if weights.size == 0:
        return 1.0, "exact"
    total = int(weights.sum())
    values, mult = np.unique(weights, return_counts=True)
    if (total + 1) * int(mult.sum() + len(values)) <= EXACT_WORK_LIMIT:
        pmf = np.zeros(total + 1)
        pmf[0], top = 1.0, 0
        for w, m in zip(values.tolist(), mult.tolist()):
            new = np.zeros_like(pmf)
            binom = [math.comb(m, j) / 2**m for j in range(m + 1)]
            for j, pj in enumerate(binom):
                if pj:
                    new[j * w: j * w + top + 1] += pj * pmf[: top + 1]
            pmf, top = new, top + w * m
        s = np.abs(2 * np.arange(total + 1) - total)
        # Integer comparison: the equal-to-observed cells are in, whatever the float rounding.
        return min(1.0, float(pmf[s >= abs(observed)].sum())), "exact"
    rng = np.random.default_rng(0)
    hits, done, chunk = 0, 0, max(1, 2**22 // weights.size)
    while done < MONTE_CARLO_FLIPS:
        b = min(chunk, MONTE_CARLO_FLIPS - done)
        signs = rng.integers(0, 2, size=(b, weights.size), dtype=np.int8) * 2 - 1
        hits += int((np.abs(signs @ weights) >= abs(observed)).sum())
        done += b
    return (hits + 1) / (MONTE_CARLO_FLIPS + 1), f"monte carlo, {MONTE_CARLO_FLIPS} sign patterns"


def _midranks2(a: np.ndarray) -> np.ndarray:
    """Twice the midranks of `a` (1-based; ties share the mean of their ranks), as integers."""
    order = np.argsort(a, kind="stable")
    ranks2 = np.empty(a.size, dtype=np.int64)
    sa = a[order]
    i = 0
    while i < sa.size:
        j = i
        while j + 1 < sa.size and sa[j + 1] == sa[i]:
            j += 1
        ranks2[order[i: j + 1]] = (i + 1) + (j + 1)  # 2 x mean of ranks i+1 .. j+1
        i = j + 1
    return ranks2


def signflip_test(diffs: Sequence[int]) -> tuple[float, str]:
    """Paired permutation test of integer per-state differences: two-sided p of their sum under
    random signs, and how it was computed ("exact" or the Monte Carlo size)."""
    d = np.asarray(diffs, dtype=np.int64)
    nz = np.abs(d[d != 0])
    return _null_tail(nz, int(d.sum()))


def wilcoxon_test(diffs: Sequence[int]) -> tuple[float, str]:
    """Wilcoxon signed-rank test (zero differences dropped, tied |d| share midranks), exact
    conditional on the ties: two-sided p of W+ - W- under random signs, and how it was computed."""
    d = np.asarray(diffs, dtype=np.int64)
    d = d[d != 0]
    if d.size == 0:
        return 1.0, "exact"
    r2 = _midranks2(np.abs(d))
    return _null_tail(r2, int((np.sign(d) * r2).sum()))


def bootstrap_interval(diffs: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                       confidence: float = 0.95) -> list[float]:
    """Percentile bootstrap interval of the mean of `diffs` (states resampled with replacement)."""
    diffs = np.asarray(diffs, dtype=np.float64)
    if diffs.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    rng = np.random.default_rng(seed)
    n = diffs.size
    means = np.empty(resamples)
    step = max(1, 2**22 // n)
    for i in range(0, resamples, step):
        b = min(step, resamples - i)
        means[i: i + b] = diffs[rng.integers(0, n, size=(b, n))].mean(axis=1)
    a = (1.0 - confidence) / 2
    lo, hi = np.quantile(means, [a, 1 - a])
    return [float(lo), float(hi)]


def paired_rates(before: Sequence[float], after: Sequence[float], samples_per_state: int = 1, *,
                 resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict:
    """Compare per-state success rates (same states, same order; `samples_per_state` = k rollouts
    each, so every rate is j/k).

    Returns {"states", "samples_per_state", "before", "after", "change" (the mean gain),
    "ci95" ([lo, hi], bootstrap percentile interval of the mean gain, `resamples` resamples of the
    states, `seed`), "improved" / "worsened" / "unchanged" (states whose rate rose / fell / stayed),
    "p_value" (the paired permutation test on the per-state differences, two-sided), "p_method"
    ("exact" or the Monte Carlo size), "wilcoxon_p", "wilcoxon_method", "test"}. With k = 1 it also
    holds "gained" and "lost", and p_value is `mcnemar_exact`'s (the same test: the sign-flip law of
    +-1 differences is McNemar's binomial).
    """
    _check_pair(before, after)
    k = samples_per_state
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"samples_per_state must be a positive integer (rollouts per state), got {k!r}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples!r}")
    cb, ca = _counts(before, int(k), "before"), _counts(after, int(k), "after")
    d = ca - cb
    n = d.size
    out = {"states": n, "samples_per_state": int(k), "before": float(cb.sum() / (n * k)),
           "after": float(ca.sum() / (n * k)), "change": float(d.sum() / (n * k)),
           "ci95": bootstrap_interval(d / k, resamples=resamples, seed=seed),
           "improved": int((d > 0).sum()), "worsened": int((d < 0).sum()), "unchanged": int((d == 0).sum())}
    if k == 1:
        out.update(gained=out["improved"], lost=out["worsened"],
                   p_value=mcnemar_exact(out["improved"], out["worsened"]), p_method="exact")
    else:
        out["p_value"], out["p_method"] = signflip_test(d)
    out["wilcoxon_p"], out["wilcoxon_method"] = wilcoxon_test(d)
    out["test"] = "paired permutation (sign-flip) on per-state success rates" + (" = McNemar" if k == 1 else "")
    return out


def format_paired(pc: dict) -> str:
    """One line: rates, the mean gain with its interval, the states' changes and the p-values."""
    lo, hi = pc["ci95"]
    k = pc["samples_per_state"]
    moved = (f"{pc['gained']} gained / {pc['lost']} lost" if k == 1 else
             f"{pc['improved']} states up / {pc['worsened']} down")
    return (f"{pc['before']:.3f} -> {pc['after']:.3f} ({pc['change']:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]) on "
            f"{pc['states']} states x {k}: {moved}, p = {pc['p_value']:.2g}"
            f"{' (McNemar)' if k == 1 else ' (paired permutation)'}, Wilcoxon p = {pc['wilcoxon_p']:.2g}")


__all__ = ["mcnemar_exact", "paired_change", "paired_rates", "signflip_test", "wilcoxon_test",
           "bootstrap_interval", "format_paired"]
