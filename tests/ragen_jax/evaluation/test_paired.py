"""ragen_jax/evaluation/paired.py: exact McNemar p-values against hand-computed values and against the
"sum of all outcomes no more likely than the observed one" definition of a two-sided exact test."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest

from ragen_jax.evaluation.paired import mcnemar_exact, paired_change


@pytest.mark.parametrize("gained,lost,p", [
    (0, 0, 1.0),                 # no discordant state: no evidence
    (1, 0, 1.0),                 # 2 * 1/2
    (5, 0, 2 / 32),              # 2 * C(5,0) / 2^5
    (0, 6, 2 / 64),
    (3, 1, 2 * (1 + 4) / 16),    # 0.625
    (10, 2, 2 * (1 + 12 + 66) / 4096),  # 0.03857...
    (2, 2, 1.0),                 # 2 * 11/16 > 1: capped
    (20, 5, 2 * sum(comb(25, i) for i in range(6)) / 2 ** 25),
])
def test_hand_computed(gained, lost, p):
    assert mcnemar_exact(gained, lost) == pytest.approx(p, rel=1e-12)
    assert mcnemar_exact(lost, gained) == pytest.approx(p, rel=1e-12)  # two-sided: symmetric


def test_matches_the_likelihood_ordering_definition():
    # Two-sided exact binomial test (p = 1/2): the probability of every split no more likely than
    # the one observed. For the symmetric binomial this equals min(1, 2 * lower tail).
    for n in range(0, 40):
        pmf = [Fraction(comb(n, i), 2 ** n) for i in range(n + 1)]
        for g in range(n + 1):
            want = sum(q for q in pmf if q <= pmf[g])
            assert mcnemar_exact(g, n - g) == pytest.approx(float(want), rel=1e-12, abs=1e-300)


def test_large_counts_do_not_underflow():
    p = mcnemar_exact(600, 400)
    assert 0.0 < p < 1e-9


def test_paired_change_counts_flips():
    before = [1, 1, 0, 0, 1, 0, 0, 1]
    after = [1, 0, 1, 1, 1, 1, 0, 1]
    r = paired_change(before, after)
    assert (r["gained"], r["lost"], r["states"]) == (3, 1, 8)
    assert r["before"] == 0.5 and r["after"] == 0.75 and r["change"] == 0.25
    assert r["p_value"] == pytest.approx(0.625)


def test_bad_input():
    with pytest.raises(ValueError, match="same states"):
        paired_change([1, 0], [1])
    with pytest.raises(ValueError, match="0 or 1"):
        paired_change([0.5], [1.0])
    with pytest.raises(ValueError, match="at least one"):
        paired_change([], [])
    with pytest.raises(ValueError, match="whole number"):
        mcnemar_exact(-1, 2)
    with pytest.raises(ValueError, match="whole number"):
        mcnemar_exact(1.5, 2)


# ------------------------------------------------------------------------- k rollouts per state
import itertools  # noqa: E402

import numpy as np  # noqa: E402

from ragen_jax.evaluation import paired  # noqa: E402
from ragen_jax.evaluation.paired import bootstrap_interval, paired_rates, signflip_test, wilcoxon_test  # noqa: E402

st = pytest.importorskip("scipy.stats")


def _brute(weights, observed) -> float:
    """P(|sum s_i w_i| >= |observed|) over all 2^n sign patterns, counted one by one."""
    hits = sum(abs(sum(s * w for s, w in zip(signs, weights))) >= abs(observed)
               for signs in itertools.product((-1, 1), repeat=len(weights)))
    return hits / 2 ** len(weights)


@pytest.mark.parametrize("seed", range(6))
def test_signflip_equals_enumeration_and_scipy_permutation_test(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 6))
    d = rng.integers(-k, k + 1, size=int(rng.integers(4, 12)))
    nz = d[d != 0]
    p, method = signflip_test(d)
    assert method == "exact"
    assert p == pytest.approx(_brute(np.abs(nz), int(d.sum())), rel=1e-12)
    ref = st.permutation_test((d.astype(float), np.zeros(d.size)), lambda x, y, axis: np.sum(x - y, axis=axis),
                              permutation_type="samples", n_resamples=np.inf, alternative="two-sided")
    assert p == pytest.approx(ref.pvalue, rel=1e-9)


def test_wilcoxon_equals_scipy_without_ties_and_enumeration_with_them():
    rng = np.random.default_rng(0)
    for n in (5, 9, 14):  # distinct |d|, no zeros: scipy's exact distribution
        d = rng.permutation(np.arange(1, n + 1)) * rng.choice([-1, 1], n)
        assert wilcoxon_test(d)[0] == pytest.approx(st.wilcoxon(d, method="exact").pvalue, rel=1e-12)
    for _ in range(5):  # ties and zeros: zeros dropped, midranks (scipy's rankdata), every sign pattern
        d = rng.integers(-3, 4, size=12)
        nz = d[d != 0]
        r2 = (2 * st.rankdata(np.abs(nz))).astype(int)
        assert wilcoxon_test(d)[0] == pytest.approx(_brute(r2, int((np.sign(nz) * r2).sum())), rel=1e-12)


def test_one_rollout_per_state_is_mcnemar():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(1, 60))
        b, a = rng.integers(0, 2, n).tolist(), rng.integers(0, 2, n).tolist()
        r, old = paired_rates(b, a, 1), paired_change(b, a)
        for key in ("states", "before", "after", "gained", "lost", "p_value"):
            assert r[key] == old[key], key
        assert r["change"] == pytest.approx(old["change"], abs=1e-15)  # one division instead of two
        # The sign-flip law of +-1 differences is the binomial: the general test gives the same number.
        assert signflip_test(np.asarray(a) - np.asarray(b))[0] == pytest.approx(old["p_value"], rel=1e-9)


def test_rates_hand_computed():
    # 4 states x 4 rollouts: before 1/4, 2/4, 0, 4/4; after 3/4, 2/4, 1/4, 4/4 -> differences (in
    # rollouts) 2, 0, 1, 0: mean gain 3/16; sign flips of {2, 1}: sums 3, 1, -1, -3 -> P(|S| >= 3) = 1/2.
    r = paired_rates([0.25, 0.5, 0.0, 1.0], [0.75, 0.5, 0.25, 1.0], 4)
    assert (r["before"], r["after"], r["change"]) == (7 / 16, 10 / 16, 3 / 16)
    assert (r["improved"], r["worsened"], r["unchanged"]) == (2, 0, 2)
    assert r["p_value"] == 0.5 and r["p_method"] == "exact"
    assert r["wilcoxon_p"] == 0.5  # ranks 2 and 1: W+ - W- in {3, 1, -1, -3} likewise
    assert "gained" not in r  # flips are a one-rollout notion


def test_bootstrap_interval_hand_computed():
    # Differences (0, 0, 0, 1): a resample's mean is X/4, X ~ Binomial(4, 1/4); P(X <= 0) = 0.316 > 0.025
    # and P(X <= 2) = 0.949 < 0.975 <= P(X <= 3) = 0.996: the 95% percentile interval is [0, 3/4].
    assert bootstrap_interval(np.array([0.0, 0.0, 0.0, 1.0]), resamples=20000) == [0.0, 0.75]
    assert bootstrap_interval(np.full(7, 0.25)) == [0.25, 0.25]
    a = paired_rates([0.5, 0.0, 1.0], [1.0, 0.5, 1.0], 2)
    assert a["ci95"] == paired_rates([0.5, 0.0, 1.0], [1.0, 0.5, 1.0], 2)["ci95"]  # fixed seed: reproducible


def test_swapping_the_evaluations_negates_the_gain_and_keeps_p():
    rng = np.random.default_rng(2)
    b, a = rng.integers(0, 9, 40) / 8, rng.integers(0, 9, 40) / 8
    r, s = paired_rates(b, a, 8), paired_rates(a, b, 8)
    assert r["change"] == -s["change"] and r["p_value"] == pytest.approx(s["p_value"], rel=1e-12)
    assert r["wilcoxon_p"] == pytest.approx(s["wilcoxon_p"], rel=1e-12)
    assert r["ci95"][0] <= r["change"] <= r["ci95"][1]


def test_monte_carlo_beyond_the_exact_limit(monkeypatch):
    rng = np.random.default_rng(3)
    d = rng.integers(-2, 4, 60)
    exact = signflip_test(d)[0]
    monkeypatch.setattr(paired, "EXACT_WORK_LIMIT", 0)
    p, method = signflip_test(d)
    assert method == f"monte carlo, {paired.MONTE_CARLO_FLIPS} sign patterns"
    assert abs(p - exact) < 4 * np.sqrt(exact * (1 - exact) / paired.MONTE_CARLO_FLIPS) + 1e-5


def test_bad_rates():
    with pytest.raises(ValueError, match="not a fraction j/4 of 4 rollouts"):
        paired_rates([0.5, 0.3], [0.5, 0.5], 4)
    with pytest.raises(ValueError, match="samples_per_state must be a positive integer"):
        paired_rates([0.5], [0.5], 0)
    with pytest.raises(ValueError, match="same states"):
        paired_rates([0.5], [0.5, 1.0], 2)
    with pytest.raises(ValueError, match="not a fraction j/2"):
        paired_rates([1.5], [0.5], 2)
