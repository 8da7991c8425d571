"""Bi-arm Bandit vs the plain-Python reference (envs_py/bandit.py) and its statistics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs_jax
from envs_jax.bandit import Bandit, BanditParams, draw_jackpot
from envs_py import bandit as ref

ENV = Bandit()
PARAMS = BanditParams()
TEST_PARAMS = BanditParams(low_name="Trader", high_name="Librarian")
N = 4096


@jax.jit
def _episodes(keys, actions, params):
    """Reset + two steps (the second must be ignored) for a batch of envs (jit + vmap)."""

    def one(key, action):
        k_reset, k1, k2 = jax.random.split(key, 3)
        obs0, s0 = ENV.reset_env(k_reset, params)
        obs1, s1, r1, t1, i1 = ENV.step_env(k1, s0, action, params)
        _, s2, r2, t2, i2 = ENV.step_env(k2, s1, 1 - action, params)
        return dict(
            obs0=obs0, obs1=obs1, s0=s0, s1=s1, s2=s2, r1=r1, t1=t1, r2=r2, t2=t2,
            jackpot=draw_jackpot(k1, params), info1=i1, info2=i2,
        )

    return jax.vmap(one)(keys, actions)


@pytest.fixture(scope="module", params=["train", "test"])
def run(request):
    params = PARAMS if request.param == "train" else TEST_PARAMS
    keys = jax.random.split(jax.random.key(5), N)
    actions = jax.random.bernoulli(jax.random.key(6), 0.5, (N,)).astype(jnp.int32)
    return params, np.asarray(actions), jax.device_get(_episodes(keys, actions, params))


def test_episodes_match_reference(run):
    params, actions, out = run
    names = ENV.action_names(params)
    for i in range(N):
        high_first = bool(out["s0"].high_first[i])
        game = ref.BanditRef(params.low_name, params.high_name, high_first)
        text = ENV.symbols(params)[int(out["obs0"][i, 0, 0])]
        assert text == game.render()
        # The agent answers with the arm's name (any case); the env sees its action index.
        reward, done, success = game.step(names[actions[i]].upper(), bool(out["jackpot"][i]))
        assert abs(float(out["r1"][i]) - reward) < 1e-7
        assert bool(out["t1"][i]) == done and bool(out["s1"].done[i]) == done
        assert bool(out["info1"]["success"][i]) == success
        assert bool(out["info1"]["action_is_effective"][i])
        assert int(out["s1"].time[i]) == 1
        # (b) The ended episode ignores the second pull entirely.
        assert float(out["r2"][i]) == game.step(names[1 - actions[i]], True)[0] == 0.0
        assert not bool(out["t2"][i]) and not bool(out["info2"]["action_is_effective"][i])
        assert bool(out["info2"]["success"][i]) == success
    for field in ("high_first", "arm", "time", "done"):
        np.testing.assert_array_equal(getattr(out["s2"], field), getattr(out["s1"], field))
    # The text does not change after the pull (the reward is reported by the text layer).
    np.testing.assert_array_equal(out["obs1"], out["obs0"])


def test_statistics(run):
    params, actions, out = run
    high = actions == 1
    # Order randomised at every reset: about 50/50 (sigma 0.8%).
    assert abs(out["s0"].high_first.mean() - 0.5) < 0.03
    # High arm pays 1.0 with probability 0.25, else 0.0; low arm always 0.1.
    r = out["r1"]
    assert set(np.unique(r[high]).round(6)) <= {0.0, 1.0}
    assert abs(r[high].mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / high.sum())
    np.testing.assert_allclose(r[~high], 0.1, rtol=1e-6)
    np.testing.assert_array_equal(out["info1"]["success"], high)


def test_jackpot_probability_is_a_parameter():
    keys = jax.random.split(jax.random.key(9), 20_000)
    for p in (0.0, 0.1, 0.9, 1.0):
        freq = jax.vmap(draw_jackpot, in_axes=(0, None))(keys, PARAMS.replace(high_prob=p)).mean()
        assert abs(float(freq) - p) < 0.015


def test_names_and_texts():
    assert ENV.action_names(PARAMS) == ("Phoenix", "Dragon")
    assert ENV.action_names(TEST_PARAMS) == ("Trader", "Librarian")
    assert ENV.instructions(PARAMS) == ""  # the reference's env_instruction for Bandit is empty
    low_first, high_first = ENV.symbols(TEST_PARAMS)
    assert "named Trader and Librarian\n" in low_first and "named Librarian and Trader\n" in high_first
    assert low_first.endswith("output like <answer> Trader </answer> or <answer> Librarian </answer>.\n")
    assert PARAMS.max_steps_in_episode == 1 and ENV.num_actions == 2


@settings(max_examples=40, deadline=None)
@given(
    low=st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=12),
    high=st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=12),
)
def test_texts_for_any_names(low, high):
    params = BanditParams(low_name=low, high_name=high)
    assert ENV.symbols(params) == (ref.BanditRef(low, high, False).render(), ref.BanditRef(low, high, True).render())


# ---- RAGEN-2's name pairs --------------------------------------------------------------------------
@pytest.mark.parametrize("split", ["train", "test"])
def test_name_pairs_match_reference(split):
    """BanditPairs / BanditPairsTest: the pair and the order are drawn per reset; each state text is
    the reference's for that pair and order; a pull of the state's own arm is the reference's step;
    a name of another pair pulls nothing (the reference does not execute it)."""
    env, params = envs_jax.make("BanditPairs" if split == "train" else "BanditPairsTest")
    pairs = ref.ARM_NAMES[split]
    names = env.action_names(params)
    assert names == tuple(n for pair in pairs for n in pair)
    keys = jax.random.split(jax.random.key(15), N)
    any_name = np.asarray(jax.random.randint(jax.random.key(16), (N,), 0, len(names)))
    # Half the answers name an arm of the state's own pair (as a policy would), half any name.
    # (_episodes resets from the first third of each key: the pairs are known in advance.)
    pair = np.asarray(jax.vmap(lambda k: env.reset_env(jax.random.split(k, 3)[0], params)[1].pair)(keys))
    own = np.asarray(jax.random.bernoulli(jax.random.key(17), 0.5, (N,)))
    acts = np.where(own, 2 * pair + any_name % 2, any_name)
    out = jax.device_get(_episodes(keys, jnp.asarray(acts), params))
    np.testing.assert_array_equal(out["s0"].pair, pair)
    for i in range(N):
        lo, hi = pairs[int(out["s0"].pair[i])]
        game = ref.BanditRef(lo, hi, bool(out["s0"].high_first[i]))
        assert env.symbols(params)[int(out["obs0"][i, 0, 0])] == game.render()
        got = ref.ragen2_step(game, names[acts[i]].lower(), bool(out["jackpot"][i]))
        if got is None:
            assert float(out["r1"][i]) == 0.0 and not bool(out["t1"][i])
            assert not bool(out["info1"]["success"][i]) and not bool(out["info1"]["action_is_effective"][i])
            assert int(out["s1"].arm[i]) == -1
        else:
            reward, done, success = got
            assert abs(float(out["r1"][i]) - reward) < 1e-7 and bool(out["t1"][i]) == done
            assert bool(out["info1"]["success"][i]) == success and bool(out["info1"]["action_is_effective"][i])
        assert bool(out["s1"].done[i])  # one action per episode either way (max_steps_in_episode=1)
        valid = np.asarray(env.valid_actions(jax.tree.map(lambda x: x[i], out["s0"]), params))
        assert list(np.flatnonzero(valid)) == [2 * int(out["s0"].pair[i]), 2 * int(out["s0"].pair[i]) + 1]
    assert (~own & (acts // 2 != out["s0"].pair)).sum() > N // 4  # foreign names were exercised
    # Uniform pair draw (each count within 5 sigma) and a fair order, independent of the pair.
    counts = np.bincount(out["s0"].pair, minlength=len(pairs))
    p = 1 / len(pairs)
    assert np.all(np.abs(counts - N * p) < 5 * np.sqrt(N * p * (1 - p))), counts
    assert abs(out["s0"].high_first.mean() - 0.5) < 0.03
    for k in range(len(pairs)):
        hf = out["s0"].high_first[out["s0"].pair == k]
        assert abs(hf.mean() - 0.5) < 5 * 0.5 / np.sqrt(len(hf))


def test_arm_action_and_fixed_names_unchanged():
    env, params = envs_jax.make("BanditPairs")
    _, s = env.reset_env(jax.random.key(3), params)
    for arm in (0, 1):
        a = int(env.arm_action(s, arm, params))
        assert a // 2 == int(s.pair) and a % 2 == arm
        _, s2, _, _, info = env.step_env(jax.random.key(4), s, a, params)
        assert int(s2.arm) == arm and bool(info["success"]) == (arm == 1)
    # The fixed names: one "pair", the order drawn from the whole key exactly as before pairs existed.
    keys = jax.random.split(jax.random.key(5), 64)
    _, states = jax.vmap(ENV.reset_env, in_axes=(0, None))(keys, PARAMS)
    np.testing.assert_array_equal(states.high_first, jax.vmap(lambda k: jax.random.bernoulli(k, 0.5))(keys))
    assert not np.any(states.pair)
    assert int(ENV.arm_action(jax.tree.map(lambda x: x[0], states), 1, PARAMS)) == 1
