"""Advantages: golden hand-computed values, plus plain-Python references on random cases."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algorithms import advantages as A

T, F = True, False


def test_token_rewards_trajectory_and_turn_placement():
    mask = jnp.array([[F, T, T, F, T, T, F], [F, F, F, F, F, F, F], [T, F, F, F, F, F, F]])
    turn_end = jnp.array([[2, 5, -1], [-1, -1, -1], [0, -1, -1]])
    turn_reward = jnp.array([[0.5, 1.0, 7.0], [9.0, 9.0, 9.0], [-0.1, 0.0, 0.0]])
    reward = jnp.array([3.0, 4.0, -0.1])
    traj = A.token_rewards(mask, turn_end, turn_reward, reward)
    want = np.zeros((3, 7))
    want[0, 5] = 3.0  # last sampled token; row 1 has none -> reward dropped; row 2 at position 0
    want[2, 0] = -0.1
    np.testing.assert_allclose(traj, want, atol=1e-7)
    turn = A.token_rewards(mask, turn_end, turn_reward, reward, mode="turn")
    want = np.zeros((3, 7))
    want[0, 2], want[0, 5], want[2, 0] = 0.5, 1.0, -0.1  # turn_end -1 must not wrap to position T-1
    np.testing.assert_allclose(turn, want, atol=1e-7)
    with pytest.raises(ValueError, match="unknown reward placement 'x'"):
        A.token_rewards(mask, turn_end, turn_reward, reward, mode="x")


def test_normalizations_hand_values():
    r = jnp.array([1.0, 2.0, 3.0, 5.0, 5.0, 5.0, 0.0, 0.0, 3.0])
    np.testing.assert_allclose(A.normalize_rewards(r, 3, "identity"), r)
    np.testing.assert_allclose(A.normalize_rewards(r, 3, "mean"), [-1, 0, 1, 0, 0, 0, -1, -1, 2], atol=1e-6)
    # sample std: group 0 -> 1, group 1 -> 0 (-> exactly 0), group 2 -> sqrt(3)
    s3 = math.sqrt(3.0)
    want = [-1 / (1 + 1e-6), 0, 1 / (1 + 1e-6), 0, 0, 0, -1 / (s3 + 1e-6), -1 / (s3 + 1e-6), 2 / (s3 + 1e-6)]
    np.testing.assert_allclose(A.normalize_rewards(r, 3, "mean_std"), want, rtol=1e-6, atol=1e-7)
    # std below 1e-6 counts as zero spread
    tiny = jnp.array([1.0, 1.0 + 1e-7, 1.0, 1.0])
    np.testing.assert_array_equal(A.normalize_rewards(tiny, 4, "mean_std"), np.zeros(4))
    # group size 1: left alone (the reference skips normalisation)
    np.testing.assert_allclose(A.normalize_rewards(r, 1, "mean_std"), r)


def test_asym_clip_bounds():
    # One outlier a among N-1 zeros: sample std = |a| / sqrt(N), so z_outlier = (N-1)/sqrt(N) = 3.75
    # for N = 16 (clipped to 3) and z_others = -1/sqrt(N) = -0.25; mirrored for a negative outlier.
    g0 = np.zeros(16); g0[3] = 10.0
    g1 = np.zeros(16); g1[0] = -2.0
    out = np.asarray(A.normalize_rewards(jnp.asarray(np.concatenate([g0, g1])), 16, "asym_clip"))
    want0 = np.full(16, -0.25); want0[3] = 3.0
    want1 = np.full(16, 0.25); want1[0] = -1.0
    np.testing.assert_allclose(out, np.concatenate([want0, want1]), rtol=1e-5)
    ms = np.asarray(A.normalize_rewards(jnp.asarray(np.concatenate([g0, g1])), 16, "mean_std"))
    assert ms[3] == pytest.approx(3.75, rel=1e-5) and ms[16] == pytest.approx(-3.75, rel=1e-5)


def test_normalization_errors():
    with pytest.raises(ValueError, match="unknown reward normalization 'zscore'; valid: asym_clip, identity"):
        A.normalize_rewards(jnp.zeros(4), 2, "zscore")
    with pytest.raises(ValueError, match="not a multiple of group_size 3"):
        A.normalize_rewards(jnp.zeros(4), 3, "mean")
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        A.get_estimator("ppo")


# A row with masked tokens at 1, 2, 4, 5 (the gap at 3 is environment text), V = .1 .2 .3 .4 there
# (values off the mask are garbage and must be ignored), reward 3 on the last sampled token.
GAP_MASK = jnp.array([[F, T, T, F, T, T, F]])
GAP_V = jnp.array([[9.0, 0.1, 0.2, 9.0, 0.3, 0.4, 9.0]])
GAP_R = jnp.array([[0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0]])


def test_gae_gamma_lambda_one_is_return_minus_value():
    adv, ret = A.gae(GAP_R, GAP_V, GAP_MASK)
    np.testing.assert_allclose(adv, [[0, 2.9, 2.8, 0, 2.7, 2.6, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0, 3, 3, 0, 3, 3, 0]], atol=1e-6)


def test_gae_gamma_09_lambda_08_with_gap():
    # By hand, backwards over the masked tokens (gamma*lam = 0.72):
    #   t=5: delta = 3 - .4 = 2.6;             A = 2.6
    #   t=4: delta = .9*.4 - .3 = .06;         A = .06 + .72*2.6   = 1.932
    #   t=2: delta = .9*.3 - .2 = .07 (skips the gap at 3); A = .07 + .72*1.932 = 1.46104
    #   t=1: delta = .9*.2 - .1 = .08;         A = .08 + .72*1.46104 = 1.1319488
    adv, ret = A.gae(GAP_R, GAP_V, GAP_MASK, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv, [[0, 1.1319488, 1.46104, 0, 1.932, 2.6, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0, 1.2319488, 1.66104, 0, 2.232, 3.0, 0]], atol=1e-6)


def _ref_gae_row(r, v, m, gamma, lam):
    """Plain GAE over the compressed sequence of masked tokens."""
    idx = [i for i in range(len(m)) if m[i]]
    adv = np.zeros(len(m))
    last, nv = 0.0, 0.0
    for i in reversed(idx):
        delta = r[i] + gamma * nv - v[i]
        last = delta + gamma * lam * last
        adv[i], nv = last, v[i]
    return adv


_gae_jit = jax.jit(A.gae, static_argnums=(3, 4))


def test_gae_random_matches_compressed_reference():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(6, 13)).astype(np.float32)
    v = rng.normal(size=(6, 13)).astype(np.float32)
    m = rng.random((6, 13)) < 0.6
    m[5] = False  # an empty row
    adv, ret = _gae_jit(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), 0.95, 0.9)
    for b in range(6):
        want = _ref_gae_row(r[b], v[b], m[b], 0.95, 0.9)
        np.testing.assert_allclose(adv[b], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret[b], np.where(m[b], want + v[b], 0.0), rtol=1e-5, atol=1e-5)


def test_bilevel_gae_hand_values():
    # Turn ends 2 and 5 with turn rewards .5 and 1; gamma_h = .95, gamma = lam = 1.
    #   turn 1: delta = 1 - .4 = .6, A = .6, G = 1.0
    #   turn 0: delta = .5 + .95*.4 - .2 = .68, A = .68 + .95*.6 = 1.25, G = 1.45
    #   tokens: t5: 1 - .4 = .6; t4: (0 + .4 - .3) + .6 = .7; t2: 1.45 - .2 = 1.25; t1: (.2 - .1) + 1.25
    r = jnp.array([[0.0, 0.0, 0.5, 0.0, 0.0, 1.0, 0.0]])
    adv, ret = A.bilevel_gae(r, GAP_V, GAP_MASK, jnp.array([[2, 5, -1]]), high_level_gamma=0.95)
    np.testing.assert_allclose(adv, [[0, 1.35, 1.25, 0, 0.7, 0.6, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0, 1.45, 1.45, 0, 1.0, 1.0, 0]], atol=1e-6)


def _ref_bilevel_row(r, v, m, gamma, lam, hg):
    """Transcription of the reference loop (turn ends = positions with nonzero reward)."""
    eos = [i for i in range(len(r)) if r[i] != 0]
    adv = np.zeros(len(r)); ret = np.zeros(len(r)); upd = np.array(r, dtype=np.float64)
    last = 0.0
    for i in range(len(eos) - 1, -1, -1):
        nv = v[eos[i + 1]] if i < len(eos) - 1 else 0.0
        last = upd[eos[i]] + hg * nv - v[eos[i]] + hg * lam * last
        adv[eos[i]] = last
    for p in eos:
        upd[p] = adv[p] + v[p]
    valid = [i for i in range(len(m)) if m[i]]
    last = 0.0
    for j in range(len(valid) - 1, -1, -1):
        c = valid[j]
        if c not in eos:
            nv = v[valid[j + 1]]
        else:
            nv, last = 0.0, 0.0
        last = upd[c] + gamma * nv - v[c] + gamma * lam * last
        adv[c] = last
        ret[c] = last + v[c]
    return adv, ret


def test_bilevel_gae_random_matches_reference_loop():
    rng = np.random.default_rng(1)
    bsz, t, k = 4, 16, 4
    m = np.zeros((bsz, t), bool); te = -np.ones((bsz, k), np.int64); r = np.zeros((bsz, t), np.float32)
    for b in range(bsz):
        pos, n_turns = 0, 1 + b % k
        for j in range(n_turns):
            pos += int(rng.integers(1, 3))  # environment tokens
            ln = int(rng.integers(1, 3))
            m[b, pos:pos + ln] = True
            pos += ln
            te[b, j] = pos - 1
            r[b, pos - 1] = rng.choice([-1.0, 0.5, 1.0])  # nonzero so the reference sees every turn end
    v = rng.normal(size=(bsz, t)).astype(np.float32)
    adv, ret = A.bilevel_gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), jnp.asarray(te), 0.9, 0.8, 0.95)
    for b in range(bsz):
        wa, wr = _ref_bilevel_row(r[b], np.where(m[b], v[b], 0.0), m[b], 0.9, 0.8, 0.95)
        np.testing.assert_allclose(adv[b], wa, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret[b], wr, rtol=1e-5, atol=1e-5)


def _group_batch():
    # 2 groups x 3 rollouts, trajectory rewards [1, 2, 3] and [0, 0, 3]; uneven masks.
    mask = jnp.array([[T, T, F, F], [F, T, T, T], [T, F, F, F], [T, T, T, T], [F, F, T, F], [T, T, F, F]])
    reward = jnp.array([1.0, 2.0, 3.0, 0.0, 0.0, 3.0])
    tr = A.token_rewards(mask, -jnp.ones((6, 1), jnp.int32), jnp.zeros((6, 1)), reward)
    return mask, tr


@pytest.mark.parametrize("name, want", [
    # grpo: group 0 mean 2, sample std 1; group 1 mean 1, sample std sqrt(3)
    ("grpo", [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6),
              -1 / (math.sqrt(3) + 1e-6), -1 / (math.sqrt(3) + 1e-6), 2 / (math.sqrt(3) + 1e-6)]),
    ("drgrpo", [-1.0, 0.0, 1.0, -1.0, -1.0, 2.0]),
    # rloo: s_i - mean of the other two
    ("rloo", [1 - 2.5, 2 - 2.0, 3 - 1.5, 0 - 1.5, 0 - 1.5, 3 - 0.0]),
])
def test_group_estimators_2x3(name, want):
    mask, tr = _group_batch()
    adv, ret = A.compute_advantages(name, tr, mask, group_size=3)
    np.testing.assert_allclose(adv, np.where(mask, np.asarray(want)[:, None], 0.0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ret, adv)


def test_whiten_hand_values():
    x = jnp.array([[1.0, 2.0, 100.0], [3.0, -50.0, 4.0]])
    m = jnp.array([[T, T, F], [T, F, T]])
    # masked values 1, 2, 3, 4: mean 2.5, unbiased variance 5/3
    s = math.sqrt(5.0 / 3.0 + 1e-8)
    want = np.array([[-1.5 / s, -0.5 / s, 0.0], [0.5 / s, 0.0, 1.5 / s]])
    np.testing.assert_allclose(A.whiten(x, m), want, rtol=1e-6)
    np.testing.assert_allclose(A.whiten(x, m, shift_mean=False), np.where(m, want + 2.5, 0.0), rtol=1e-6)


def test_compute_advantages_gae_whitens_and_keeps_returns_raw():
    adv, ret = A.compute_advantages("gae", GAP_R, GAP_MASK, values=GAP_V)
    raw = np.array([2.9, 2.8, 2.7, 2.6])
    want = (raw - raw.mean()) / math.sqrt(raw.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(np.asarray(adv)[0, [1, 2, 4, 5]], want, rtol=1e-4)
    np.testing.assert_allclose(ret, [[0, 3, 3, 0, 3, 3, 0]], atol=1e-6)
    with pytest.raises(ValueError, match="'gae' estimator needs critic values"):
        A.compute_advantages("gae", GAP_R, GAP_MASK)
