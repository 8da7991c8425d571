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
