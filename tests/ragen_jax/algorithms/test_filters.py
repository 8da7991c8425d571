"""StarPO-S rollout filter: top-k by in-group std, ties, rounding, variance cover; static shapes."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algorithms import filters as Fl

# 5 groups x 3 rollouts. Sample stds: g0 0, g1 1, g2 0, g3 1 (same values as g1, another order:
# an exact tie), g4 sqrt(3).
REWARDS = jnp.array([0, 0, 0, 0, 1, 2, 1, 1, 1, 2, 1, 0, 0, 0, 3], jnp.float32)
STD = np.array([0.0, 1.0, 0.0, 1.0, math.sqrt(3.0)])
N = 3


def _rows(groups):
    return np.concatenate([np.arange(g * N, g * N + N) for g in groups])


@pytest.mark.parametrize("ratio, select, rounding, want", [
    (0.4, "largest", "floor", [4, 1]),  # tie g1 / g3 -> the lower index g1
    (0.6, "largest", "floor", [4, 1, 3]),
    (0.5, "largest", "floor", [4, 1]),  # 2.5 -> 2
    (0.5, "largest", "ceil", [4, 1, 3]),  # 2.5 -> 3
    (0.1, "largest", "floor", [4]),  # 0.5 -> 0, at least one group is kept
    (0.4, "smallest", "floor", [0, 2]),  # tie at 0 -> index order
    (0.8, "smallest", "floor", [0, 2, 1, 3]),
    (1.0, "largest", "floor", [0, 1, 2, 3, 4]),  # ratio 1 keeps everything in order
])
def test_filter_groups_topk(ratio, select, rounding, want):
    out = Fl.filter_groups(REWARDS, N, ratio, select=select, rounding=rounding)
    np.testing.assert_array_equal(out.groups, want)
    np.testing.assert_array_equal(out.rows, _rows(want))
    assert out.group_used.shape == (len(want),) and bool(out.group_used.all())
    np.testing.assert_array_equal(out.row_weight, np.ones(len(want) * N))


def test_filter_metrics():
    out = Fl.filter_groups(REWARDS, N, 0.4)
    m = {k: float(v) for k, v in out.metrics.items()}
    assert m["rollout/in_group_std"] == pytest.approx(STD.mean(), rel=1e-6)
    assert m["rollout/in_group_std_max"] == pytest.approx(math.sqrt(3.0), rel=1e-6)
    assert m["rollout/chosen_in_group_std"] == pytest.approx((math.sqrt(3.0) + 1) / 2, rel=1e-6)
    assert m["rollout/chosen_in_group_std_max"] == pytest.approx(math.sqrt(3.0), rel=1e-6)
    assert m["rollout/in_group_mean"] == pytest.approx(float(np.mean(REWARDS)), rel=1e-6)
    assert m["rollout/in_group_max"] == pytest.approx((0 + 2 + 1 + 2 + 3) / 5, rel=1e-6)
    assert m["rollout/filter_kept_count"] == 2 and m["rollout/filter_zero_count"] == 2


def test_all_equal_rewards():
    out = Fl.filter_groups(jnp.full((12,), -0.1), 3, 0.5)
    np.testing.assert_array_equal(out.groups, [0, 1])
    assert float(out.metrics["rollout/in_group_std"]) == 0.0
    assert float(out.metrics["rollout/chosen_in_group_std"]) == 0.0


def test_num_kept_groups_rounding():
    assert Fl.num_kept_groups(8, 0.25) == 2  # the StarPO-S default: 2 of 8
    assert Fl.num_kept_groups(10, 0.3, "ceil") == 3  # 0.3 * 10 = 3.0000000000000004 must not ceil to 4
    assert Fl.num_kept_groups(8, 0.3, "floor") == 2 and Fl.num_kept_groups(8, 0.3, "ceil") == 3
    assert Fl.num_kept_groups(8, 2.0) == 8
    with pytest.raises(ValueError, match="unknown filter rounding 'round'; valid: floor, ceil"):
        Fl.num_kept_groups(8, 0.5, "round")
    with pytest.raises(ValueError, match="filter ratio must be > 0"):
        Fl.num_kept_groups(8, 0.0)
    with pytest.raises(ValueError, match="unknown filter selection 'middle'"):
        Fl.filter_groups(REWARDS, N, 0.4, select="middle")
    with pytest.raises(ValueError, match="not a multiple of group_size 4"):
        Fl.filter_groups(REWARDS, 4, 0.4)


@pytest.mark.parametrize("fraction, k_max, want_groups, want_used", [
    # total std = 2 + sqrt(3) = 3.732; sorted desc [1.732 (g4), 1 (g1), 1 (g3), 0, 0]
    (0.5, None, [4, 1, 3, 0, 2], [1, 1, 0, 0, 0]),  # threshold 1.856: cum-before 0, 1.732 < it; 2.732 not
    (0.9, None, [4, 1, 3, 0, 2], [1, 1, 1, 0, 0]),  # threshold 3.349; zero-std groups are never used
    (0.9, 2, [4, 1], [1, 1]),  # capped at k_max
    (1.0, 3, [4, 1, 3], [1, 1, 1]),  # fraction >= 1 keeps every slot
    (0.3, 3, [4, 1, 3], [1, 0, 0]),
])
def test_variance_cover(fraction, k_max, want_groups, want_used):
    out = Fl.filter_groups_variance_cover(REWARDS, N, fraction, k_max=k_max)
    np.testing.assert_array_equal(out.groups, want_groups)
    np.testing.assert_array_equal(out.group_used, np.asarray(want_used, bool))
    np.testing.assert_array_equal(out.rows, _rows(want_groups))
    np.testing.assert_array_equal(out.row_weight, np.repeat(want_used, N))
    used = [g for g, u in zip(want_groups, want_used) if u]
    assert float(out.metrics["rollout/filter_kept_count"]) == len(used)
    assert float(out.metrics["rollout/chosen_in_group_std"]) == pytest.approx(STD[used].mean(), rel=1e-6)


def test_variance_cover_measure_var_and_all_equal():
    # var: [0, 1, 0, 1, 3], total 5; fraction 0.5 -> threshold 2.49: g4 (before 0) used, g1 (before 3) not
    out = Fl.filter_groups_variance_cover(REWARDS, N, 0.5, measure="var")
    np.testing.assert_array_equal(out.group_used, [1, 0, 0, 0, 0])
    flat = Fl.filter_groups_variance_cover(jnp.ones((12,)), 3, 0.9, k_max=2)
    assert not bool(flat.group_used.any()) and float(flat.row_weight.sum()) == 0.0
    assert float(flat.metrics["rollout/chosen_in_group_std"]) == 0.0
    with pytest.raises(ValueError, match=r"k_max must be an integer in \[1, 5\]"):
        Fl.filter_groups_variance_cover(REWARDS, N, 0.5, k_max=6)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _jit_filter(reward, n, ratio):
    out = Fl.filter_groups(reward, n, ratio)
    return out.groups, out.rows


def test_random_topk_matches_numpy_reference_under_jit():
    rng = np.random.default_rng(0)
    p, n = 8, 4
    for _ in range(30):
        r = rng.integers(0, 3, size=p * n).astype(np.float32) * 0.5 - 0.1  # small alphabet: many ties
        groups, rows = _jit_filter(jnp.asarray(r), n, 0.25)
        std = r.reshape(p, n).std(axis=1, ddof=1)
        want = sorted(range(p), key=lambda g: (-std[g], g))[:2]  # largest std, lowest index on ties
        # compare by std value; an exact-tie group must win by index
        np.testing.assert_allclose(std[np.asarray(groups)], std[want], rtol=1e-6)
        np.testing.assert_array_equal(r[np.asarray(rows)], r.reshape(p, n)[np.asarray(groups)].reshape(-1))


def test_gather_rows_on_a_pytree():
    tree = {"tokens": jnp.arange(15 * 2).reshape(15, 2), "reward": REWARDS}
    out = Fl.filter_groups(REWARDS, N, 0.4)
    got = Fl.gather_rows(tree, out.rows)
    np.testing.assert_array_equal(got["reward"], [0, 0, 3, 0, 1, 2])
    np.testing.assert_array_equal(got["tokens"][:, 0], _rows([4, 1]) * 2)
