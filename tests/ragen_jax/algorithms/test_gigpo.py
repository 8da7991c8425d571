"""GiGPO against an independent plain-Python port of verl-agent's `compute_gigpo_outcome_advantage`
(ref_gigpo.py). The JAX side works on episode rows with turn ends and keys."""

import functools
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algorithms import advantages as A
from ragen_jax.algorithms import gigpo as G
from tests.ragen_jax.algorithms.ref_gigpo import EPS, port_gigpo


# ------------------------------------------------------------------------------ JAX layout
def layout(episodes, k, d, rng):
    """Episode rows: each turn = 1-2 env tokens then 1-3 sampled tokens; score on the last sampled
    token. -> (token_rewards, mask, turn_end, turn_reward, state_key [B, K, D], token turn ids)."""
    t = k * 5
    b = len(episodes)
    tok_r = np.zeros((b, t), np.float32)
    mask = np.zeros((b, t), bool)
    turn_end = np.full((b, k), -1, np.int32)
    turn_r = np.zeros((b, k), np.float32)
    key = np.full((b, k, d), -7, np.int32)  # invalid turns' keys equal each other: must not group
    tid = np.full((b, t), -1)
    for i, (_, score, turns) in enumerate(episodes):
        pos = 0
        for j, (obs, r) in enumerate(turns):
            pos += rng.randint(1, 2)
            n = rng.randint(1, 3)
            mask[i, pos:pos + n] = True
            tid[i, pos:pos + n] = j
            pos += n
            turn_end[i, j] = pos - 1
            turn_r[i, j] = r
            key[i, j] = obs
        if turns:
            tok_r[i, turn_end[i, len(turns) - 1]] = score
    return tok_r, mask, turn_end, turn_r, key, tid


@functools.lru_cache(maxsize=None)
def _compiled(n, gamma, weight, norm, cross_steps):
    return jax.jit(functools.partial(G.gigpo, group_size=n, step_weight=weight, norm=norm, gamma=gamma, eps=EPS,
                                     cross_steps=cross_steps))


def run_jax(episodes, n, k, d, gamma, weight, norm, rng, cross_steps=True):
    tok_r, mask, turn_end, turn_r, key, tid = layout(episodes, k, d, rng)
    adv, ret, metrics = _compiled(n, gamma, weight, norm, cross_steps)(
        jnp.asarray(tok_r), jnp.asarray(mask), jnp.asarray(turn_end), jnp.asarray(turn_r), jnp.asarray(key))
    return np.asarray(adv), np.asarray(ret), tid, metrics


def check(episodes, n, k, d, gamma, weight, norm, rng, cross_steps=True, atol=2e-4):
    want = port_gigpo(episodes, gamma, weight, norm == "none", cross_steps)
    adv, ret, tid, _ = run_jax(episodes, n, k, d, gamma, weight, norm, rng, cross_steps)
    bad = 0
    for i, per_turn in enumerate(want):
        for j, w in enumerate(per_turn):
            got = adv[i][tid[i] == j]
            bad += int(not np.allclose(got, w, atol=atol, rtol=1e-4))
        bad += int(np.any(adv[i][tid[i] < 0] != 0))
    np.testing.assert_array_equal(adv, ret)
    return bad


def obs(*words):
    return tuple(words)


# ------------------------------------------------------------------------------ hand-made sets
def test_golden_hand_values():
    # One group of 2 episodes, gamma 0.5, norm "none" (verl-agent mean_norm), weight 1.
    # ep0: turns (A, r=0), (B, r=1) score 1; ep1: turn (A, r=0) score 0.
    # Episode (cross steps): rows' scores [1, 1, 0] -> mean 2/3: A_ep0 = 1/3, A_ep1 = -2/3.
    # Step returns: ep0 [0.5, 1], ep1 [0]. Anchor A = {0.5, 0} mean 0.25 -> +0.25 / -0.25; B alone -> 0.
    eps = [(0, 1.0, [(obs(1), 0.0), (obs(2), 1.0)]), (0, 0.0, [(obs(1), 0.0)])]
    rng = random.Random(0)
    adv, _, tid, m = run_jax(eps, 2, 2, 1, 0.5, 1.0, "none", rng)
    np.testing.assert_allclose(adv[0][tid[0] == 0], 1 / 3 + 0.25, rtol=1e-6)
    np.testing.assert_allclose(adv[0][tid[0] == 1], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(adv[1][tid[1] == 0], -2 / 3 - 0.25, rtol=1e-6)
    assert float(m["gigpo/anchor_groups_per_group"]) == pytest.approx(2.0)
    assert float(m["gigpo/shared_turn_fraction"]) == pytest.approx(2 / 3)
    # step advantages over valid turns: [0.25, 0, -0.25] -> population std sqrt(1/24)
    assert float(m["gigpo/step_advantage_std"]) == pytest.approx((1 / 24) ** 0.5, rel=1e-5)
    # "std": episode sample std of [1, 1, 0] = sqrt(1/3); anchor A std of [0.5, 0] = sqrt(0.125).
    adv, *_ = run_jax(eps, 2, 2, 1, 0.5, 1.0, "std", random.Random(0))
    s_ep, s_a = (1 / 3) ** 0.5, 0.125 ** 0.5
    np.testing.assert_allclose(adv[0][tid[0] == 0], (1 / 3) / (s_ep + EPS) + 0.25 / (s_a + EPS), rtol=1e-5)
    np.testing.assert_allclose(adv[1][tid[1] == 0], (-2 / 3) / (s_ep + EPS) - 0.25 / (s_a + EPS), rtol=1e-5)


@pytest.mark.parametrize("norm", ["std", "none"])
def test_identical_states_at_different_turns(norm):
    # Observation 5 is seen at turn 0 of ep0, turn 2 of ep1 and twice within ep2 (a revisit).
    eps = [(0, 1.0, [(obs(5), 0.0), (obs(1), 1.0)]),
           (0, 0.0, [(obs(3), 0.0), (obs(4), 0.0), (obs(5), -0.1)]),
           (0, 0.5, [(obs(5), 0.0), (obs(2), 0.0), (obs(5), 0.5)]),
           (1, 1.0, [(obs(5), 1.0)]),  # another group: its observation 5 is a different anchor group
           (1, 0.0, [(obs(6), 0.0), (obs(6), 0.0)]),
           (1, 0.0, []),  # no turn at all
           ]
    eps = eps[:3] + [(0, 0.0, [(obs(9), 0.0)])] + eps[3:] + [(1, 1.0, [(obs(5), 1.0)])]
    for cross in (True, False):
        assert check(eps, 4, 3, 1, 0.9, 1.0, norm, random.Random(1), cross_steps=cross) == 0


def test_no_shared_states_gives_episode_advantage_only():
    eps = [(0, float(i % 2), [(obs(10 * i + j), float(j)) for j in range(1 + i % 3)]) for i in range(6)]
    eps = [(i // 3, s, t) for i, (_, s, t) in enumerate(eps)]
    assert check(eps, 3, 3, 1, 0.95, 1.0, "std", random.Random(2)) == 0
    adv0, *_ = run_jax(eps, 3, 3, 1, 0.95, 0.0, "std", random.Random(2))
    adv1, _, _, m = run_jax(eps, 3, 3, 1, 0.95, 1.0, "std", random.Random(2))
    np.testing.assert_allclose(adv0, adv1, atol=1e-6)  # every step term is 0
    assert float(m["gigpo/shared_turn_fraction"]) == 0.0
    assert float(m["gigpo/step_advantage_std"]) == 0.0


def test_all_states_shared():
    rng = random.Random(3)
    eps = [(i // 4, rng.choice([0.0, 1.0]),
            [(obs(7, 7), rng.choice([0.0, 1.0, -0.1])) for _ in range(rng.randint(1, 3))]) for i in range(8)]
    assert check(eps, 4, 3, 2, 0.95, 1.0, "std", random.Random(4)) == 0
    _, _, _, m = run_jax(eps, 4, 3, 2, 0.95, 1.0, "std", random.Random(4))
    assert float(m["gigpo/anchor_groups_per_group"]) == 1.0
    assert float(m["gigpo/shared_turn_fraction"]) == 1.0


def test_multiword_keys_need_every_word_equal():
    # Keys (1, 2) and (1, 3) share a word but are different observations.
    eps = [(0, 1.0, [(obs(1, 2), 1.0)]), (0, 0.0, [(obs(1, 3), 0.0)])]
    _, _, _, m = run_jax(eps, 2, 1, 2, 0.95, 1.0, "std", random.Random(5))
    assert float(m["gigpo/shared_turn_fraction"]) == 0.0
    assert check(eps, 2, 1, 2, 0.95, 1.0, "std", random.Random(5)) == 0


# ------------------------------------------------------------------------------ random sets
CONFIGS = [  # (P, N, K, D, gamma, weight, norm, cross_steps)
    (2, 4, 3, 1, 0.95, 1.0, "std", True),
    (3, 2, 4, 2, 1.0, 1.0, "none", True),
    (1, 5, 2, 1, 0.5, 0.7, "std", False),
    (2, 3, 4, 1, 0.9, 1.0, "none", False),
]


def test_random_episode_sets_match_port():
    rng = random.Random(1234)
    mismatches, total = 0, 0
    for p, n, k, d, gamma, weight, norm, cross in CONFIGS:
        for _ in range(250):
            alphabet = rng.randint(1, 4)
            eps = []
            for b in range(p * n):
                n_turns = rng.choice([0] + [rng.randint(1, k)] * 6)
                turns = [(tuple(rng.randrange(alphabet) for _ in range(d)), rng.choice([0.0, 1.0, -0.1, 0.5, 10.0]))
                         for _ in range(n_turns)]
                eps.append((b // n, rng.choice([0.0, 1.0, -0.1, 2.5, sum(r for _, r in turns)]), turns))
            mismatches += check(eps, n, k, d, gamma, weight, norm, rng, cross_steps=cross)
            total += 1
    assert total == 1000 and mismatches == 0


def test_metrics_count_only_groups_with_turns():
    # Group 0: turns with keys (1, 2 | 1) -> 2 distinct observations; group 1: no valid turn (a group
    # the filter dropped): it does not count in the average over groups.
    valid = jnp.array([[True, True], [True, False], [False, False], [False, False]])
    key = jnp.array([[[1], [2]], [[1], [0]], [[1], [1]], [[1], [1]]], jnp.int32)
    st, cnt = G.step_advantages(key, jnp.zeros((4, 2)), valid, 2, 0.9, "std", EPS)
    m = G.gigpo_metrics(st, cnt, valid, 2)
    assert float(m["gigpo/anchor_groups_per_group"]) == 2.0
    assert float(m["gigpo/shared_turn_fraction"]) == pytest.approx(2 / 3)


# ------------------------------------------------------------------------------ registry / errors
def test_registered_estimator_and_jit():
    eps = [(0, 1.0, [(obs(1), 0.0), (obs(2), 1.0)]), (0, 0.0, [(obs(1), 0.0)])]
    tok_r, mask, turn_end, turn_r, key, _ = layout(eps, 2, 1, random.Random(0))
    f = jax.jit(lambda *a: A.compute_advantages("gigpo", a[0], a[1], turn_end=a[2], turn_reward=a[3], state_key=a[4],
                                                group_size=2, options={"norm": "none", "gamma": 0.5},
                                                with_metrics=True))
    adv, ret, m = f(*map(jnp.asarray, (tok_r, mask, turn_end, turn_r, key[..., 0])))  # [B, K] keys
    want, *_ = G.gigpo(jnp.asarray(tok_r), jnp.asarray(mask), jnp.asarray(turn_end), jnp.asarray(turn_r),
                       jnp.asarray(key), 2, norm="none", gamma=0.5)
    np.testing.assert_allclose(adv, want, atol=1e-7)
    assert set(m) == {"gigpo/anchor_groups_per_group", "gigpo/shared_turn_fraction", "gigpo/step_advantage_std"}
    assert not A.ESTIMATORS["gigpo"].needs_critic and A.ESTIMATORS["gigpo"].options is G.GiGPOOptions


def test_bad_arguments_one_sentence():
    z = jnp.zeros((2, 4))
    m = jnp.ones((2, 4), bool)
    te = jnp.array([[3], [3]])
    with pytest.raises(ValueError, match="the .gigpo. estimator needs turn_reward, state_key"):
        A.compute_advantages("gigpo", z, m, turn_end=te, group_size=2)
    with pytest.raises(ValueError, match="norm='z' is not valid; choose one of 'std', 'none'"):
        A.compute_advantages("gigpo", z, m, turn_end=te, turn_reward=jnp.zeros((2, 1)),
                             state_key=jnp.zeros((2, 1), jnp.int32), group_size=2, options={"norm": "z"})
    with pytest.raises(ValueError, match="'steps' are not options of the 'gigpo' estimator; valid: weight, norm, gamma"):
        A.compute_advantages("gigpo", z, m, options={"steps": 2})
    with pytest.raises(ValueError, match="gamma must be a number in"):
        G.gigpo(z, m, te, jnp.zeros((2, 1)), jnp.zeros((2, 1), jnp.int32), 2, gamma=1.5)
    with pytest.raises(ValueError, match="state_key"):
        G.gigpo(z, m, te, jnp.zeros((2, 1)), jnp.zeros((2, 3), jnp.int32), 2)
