"""2x2 cube vs the plain-Python reference port (envs_py/rubiks_cube.py): 1,000 random
episodes side by side (stickers, rewards, done flags, text) with each move set; the group the moves
generate (sympy's Schreier-Sims orders, corner pieces, the known distance counts); the BFS solver
against a host BFS."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sympy.combinatorics import Permutation, PermutationGroup

import envs_jax
from envs_jax import rubiks_cube as rc
from envs_py import rubiks_cube as ref

ENV = rc.RubiksCube()
T = 22  # > max_steps_in_episode: the freeze after the end is exercised too
# The 8 corner pieces as sticker triples (U L F R B D faces, stickers [0 1; 2 3] seen from outside).
CORNERS = [{2, 5, 8}, {3, 9, 12}, {1, 13, 16}, {0, 4, 17}, {7, 10, 20}, {11, 14, 21}, {15, 18, 23}, {6, 19, 22}]


def _episodes(params, n, seed):
    @jax.jit
    def run(key):
        k_reset, k_act, k_step = jax.random.split(key, 3)
        resets = jax.random.split(k_reset, n)
        scramble = jax.vmap(rc.scramble_actions, (0, None))(resets, params)
        _, state = jax.vmap(ENV.reset_env, (0, None))(resets, params)

        def step(s, a):
            _, s2, r, term, info = jax.vmap(ENV.step_env, (None, 0, 0, None))(k_step, s, a, params)
            return s2, (s2.stickers, s2.time, s2.done, r, term, info["success"], info["action_is_effective"])

        actions = jax.random.randint(k_act, (T, n), 0, 12)
        return scramble, state, actions, jax.lax.scan(step, state, actions)[1]

    return jax.device_get(run(jax.random.PRNGKey(seed)))


@pytest.mark.parametrize("moves,depth", [("correct", 1), ("reference", 3)])
def test_random_episodes_match_the_reference(moves, depth):
    params = rc.RubiksCubeParams(moves=moves, scramble_depth=depth)
    n = 500
    scramble, state, actions, (stickers, time, dones, rewards, terms, succ, eff) = _episodes(params, n, depth)
    mismatches, solved = 0, 0
    for e in range(n):
        r = ref.RefCube(max_steps=20, fixed_b=moves == "correct")
        text = r.reset([int(a) + 1 for a in scramble[e]])
        s0 = jax.tree.map(lambda x: x[e], state)
        mismatches += not (list(s0.stickers) == r.state and ENV.render_text(s0, params) == text)
        for t in range(T):
            if t and dones[t - 1, e]:
                break
            text, reward, done, info = r.step(int(actions[t, e]) + 1)
            st = rc.RubiksCubeState(stickers=stickers[t, e], time=time[t, e], done=dones[t, e])
            ok = (list(stickers[t, e]) == r.state and float(rewards[t, e]) == reward and bool(dones[t, e]) == done
                  and bool(terms[t, e]) == info["success"] and bool(succ[t, e]) == info["success"]
                  and bool(eff[t, e]) and ENV.render_text(st, params) == text)
            mismatches += not ok
            solved += info["success"]
    assert mismatches == 0
    assert solved > 20  # the solved ending is exercised, not only truncation


def _group(moves):
    return PermutationGroup([Permutation(list(p)) for p in rc.move_table(moves)])


def test_correct_moves_generate_the_real_2x2_group():
    assert _group("correct").order() == 88_179_840  # 3,674,160 positions x 24 orientations
    assert _group("reference").order() == 620_448_401_733_239_439_360_000  # 24!: the reference's B
    for p in rc.move_table("correct"):
        q = np.arange(24)
        for k in range(4):
            q = q[p]
            assert (q == np.arange(24)).all() == (k == 3)  # order 4
        # A corner piece goes to a corner piece (p is a gather: the new sticker i comes from p[i]).
        assert all({int(p[i]) for i in c} in CORNERS for c in CORNERS)
    b_ref = rc.move_table("reference")[10]
    assert not all({int(b_ref[i]) for i in c} in CORNERS for c in CORNERS)


def test_distance_counts_with_one_corner_fixed():
    """U, U', R, R', F, F' keep the D-L-B corner in place: BFS from solved gives the known quarter-turn
    distance counts of the 2x2's 3,674,160 positions."""
    table = rc.move_table("correct")[[0, 1, 6, 7, 8, 9]]
    start = tuple(rc.SOLVED)
    seen, frontier, counts = {start}, [start], [1]
    for _ in range(6):
        nxt = []
        for s in frontier:
            arr = np.asarray(s)
            for p in table:
                t = tuple(arr[p])
                if t not in seen:
                    seen.add(t)
                    nxt.append(t)
        frontier = nxt
        counts.append(len(nxt))
    assert counts == [1, 6, 27, 120, 534, 2256, 8969]


def _host_bfs_length(stickers, moves, max_depth):
    table = rc.move_table(moves)
    solved = lambda s: all(len(set(s[4 * f:4 * f + 4])) == 1 for f in range(6))
    start = tuple(int(x) for x in stickers)
    if solved(start):
        return 0
    seen, frontier = {start}, [start]
    for d in range(1, max_depth + 1):
        nxt = []
        for s in frontier:
            arr = np.asarray(s)
            for p in table:
                t = tuple(arr[p].tolist())
                if solved(t):
                    return d
                if t not in seen:
                    seen.add(t)
                    nxt.append(t)
        frontier = nxt
    return -1


@pytest.mark.parametrize("moves", ["correct", "reference"])
def test_bfs_solver_is_optimal(moves):
    params = rc.RubiksCubeParams(moves=moves, scramble_depth=5, solver_depth=5)
    keys = jax.random.split(jax.random.PRNGKey(7), 24)
    _, states = jax.vmap(ENV.reset_env, (0, None))(keys, params)
    sol = jax.device_get(jax.jit(jax.vmap(ENV.solve, (0, None)))(states, params))
    table = rc.move_table(moves)
    lengths = []
    for e in range(24):
        want = _host_bfs_length(states.stickers[e], moves, 5)
        assert sol.solvable[e] and int(sol.length[e]) == want
        s = np.asarray(states.stickers[e])
        for a in sol.actions[e][: sol.length[e]]:
            s = s[table[a]]
        assert bool(rc.is_solved(jnp.asarray(s)))
        lengths.append(want)
    assert max(lengths) >= 4  # deep positions are exercised


def test_solver_reports_what_it_cannot_reach():
    s = jnp.asarray(rc.SOLVED)
    for a in (0, 6, 8):  # U R F: three quarter turns away
        s = s[jnp.asarray(rc.move_table())[a]]
    sol = rc.solve(s, max_depth=2)
    assert not bool(sol.solvable) and int(sol.length) == 0 and (np.asarray(sol.actions) == -1).all()
    sol = rc.solve(s, max_depth=3)
    assert bool(sol.solvable) and int(sol.length) == 3
    for a in np.asarray(sol.actions):  # e.g. F' L' F': any orientation of the solved cube counts
        s = s[jnp.asarray(rc.move_table())[a]]
    assert bool(rc.is_solved(s))


def test_registered_and_validated():
    env, params = envs_jax.make("rubikscube")
    assert isinstance(env, rc.RubiksCube) and env.action_names(params)[:2] == ("U", "U'")
    assert (params.scramble_depth, params.max_steps_in_episode, params.moves) == (1, 20, "correct")
    assert envs_jax.make("rubikscube", moves="reference")[1].moves == "reference"
    with pytest.raises(ValueError, match="moves must be one of correct, reference"):
        envs_jax.make("rubikscube", moves="broken")
