"""Sudoku vs the plain-Python reference port (envs_py/sudoku.py): 1,000 random episodes
side by side (grids, rewards, done flags, text), the in-graph generator, the backtracking solver and
the teacher."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import sudoku as sd
from envs_py import sudoku as ref

ENV = sd.Sudoku()


def _random_actions(key, state, n):
    """A mix that reaches every outcome: uniformly random actions, an empty cell with its solution digit,
    an empty cell with a random digit."""
    k_kind, k_any, k_cell, k_digit = jax.random.split(key, 4)
    empty = (state.grid.reshape(-1) == 0)
    cell = jax.random.categorical(k_cell, jnp.where(empty, 0.0, -1e9))
    digit = jnp.where(jax.random.bernoulli(k_digit), state.solution.reshape(-1)[cell],
                      jax.random.randint(k_digit, (), 1, n + 1))
    return jnp.where(jax.random.bernoulli(k_kind, 0.3), jax.random.randint(k_any, (), 0, n ** 3),
                     cell * n + digit - 1).astype(jnp.int32)


def _episodes(params, n_eps, steps, seed):
    @jax.jit
    def run(key):
        k_reset, k_play = jax.random.split(key)
        _, state = jax.vmap(ENV.reset_env, (0, None))(jax.random.split(k_reset, n_eps), params)

        def step(s, k):
            keys = jax.random.split(k, n_eps)
            a = jax.vmap(_random_actions, (0, 0, None))(keys, s, params.grid_size)
            _, s2, r, term, info = jax.vmap(ENV.step_env, (0, 0, 0, None))(keys, s, a, params)
            return s2, (a, s2, r, term, info["success"], info["action_is_effective"])

        return state, jax.lax.scan(step, state, jax.random.split(k_play, steps))[1]

    return jax.device_get(run(jax.random.PRNGKey(seed)))


@pytest.mark.parametrize("size,max_steps,steps,n_eps", [(9, 81, 20, 300), (4, 12, 16, 700)])
def test_random_episodes_match_the_reference(size, max_steps, steps, n_eps):
    params = sd.SudokuParams(grid_size=size, max_steps=max_steps, max_steps_in_episode=steps)
    state, (actions, states, rewards, terms, succ, eff) = _episodes(params, n_eps, steps, size)
    mismatches, outcomes = 0, set()
    names = sd.action_names(size)
    for e in range(n_eps):
        s0 = jax.tree.map(lambda x: x[e], state)
        r = ref.RefSudoku(s0.grid, s0.solution, max_steps=max_steps)
        mismatches += ENV.render_text(s0, params) != r.render()
        for t in range(steps):
            if t and states.done[t - 1, e]:
                break
            text, reward, done, info = r.step(names[int(actions[t, e])])
            st = jax.tree.map(lambda x: x[t, e], states)
            ok = ((np.asarray(st.grid) == r.current_grid).all() and abs(float(rewards[t, e]) - reward) < 1e-6
                  and bool(terms[t, e]) == done and bool(st.done) == (done or t + 1 >= steps)
                  and bool(succ[t, e]) == info["success"] and bool(eff[t, e]) == info["action_is_effective"]
                  and ENV.render_text(st, params) == text)
            mismatches += not ok
            outcomes.add(int(st.feedback))
            outcomes.add("solved" if info["success"] else "max_steps" if done else "")
    assert mismatches == 0
    want = {sd.GIVEN_CELL, sd.CONFLICT, sd.CORRECT, sd.VALID_NOT_SOLUTION}
    assert want <= outcomes and (size == 9 or {"solved", "max_steps"} <= outcomes)


def _valid_full(grid):
    n = grid.shape[0]
    b = int(round(n ** 0.5))
    want = set(range(1, n + 1))
    boxes = [grid[i:i + b, j:j + b].reshape(-1) for i in range(0, n, b) for j in range(0, n, b)]
    return all(set(x.tolist()) == want for x in [*grid, *grid.T, *boxes])


@pytest.mark.parametrize("size,difficulty,count", [(9, "easy", 200), (9, "medium", 200), (4, "hard", 200),
                                                   (16, "easy", 4)])
def test_generated_puzzles(size, difficulty, count):
    params = sd.SudokuParams(grid_size=size, difficulty=difficulty)
    keys = jax.random.split(jax.random.PRNGKey(3), count)
    puzzles, solutions = jax.device_get(jax.jit(jax.vmap(sd.generate, (0, None)))(keys, params))
    removed = int(size * size * sd.REMOVED_FRACTION[difficulty])
    for p, s in zip(puzzles, solutions):
        assert _valid_full(s)
        assert (p == 0).sum() == removed and ((p == s) | (p == 0)).all()
    if size < 16:  # (16x16: no such check, so its second backtracking search is not run)
        fills = jax.device_get(jax.jit(jax.vmap(lambda k: sd.backtrack(jnp.zeros((size, size), jnp.int32), k,
                                                                        params.fill_iterations)[1]))(keys))
        assert fills.all()  # the randomised backtracking finishes (no fallback grid)
        distinct = len({s.tobytes() for s in solutions})  # a 4x4 has 288 solutions: ~144 distinct in 200 draws
        assert distinct == count if size == 9 else distinct > 120


def test_backtracking_solver_solves():
    params = sd.SudokuParams(difficulty="hard")
    keys = jax.random.split(jax.random.PRNGKey(5), 64)
    _, states = jax.jit(jax.vmap(ENV.reset_env, (0, None)))(keys, params)
    # One puzzle after the other (lax.map), not vmapped: a vmapped search loop runs every lane until the
    # slowest puzzle is solved (64 x the longest search); the solver and its answers are the same.
    grids, ok = jax.device_get(jax.jit(lambda s: jax.lax.map(lambda x: ENV.solve(x, params), s))(states))
    assert ok.all()
    for g, p in zip(grids, np.asarray(states.grid)):
        assert _valid_full(g) and ((g == p) | (p == 0)).all()
    grid, ok = sd.backtrack(jnp.asarray(_contradiction()), None, 10_000)
    assert not bool(ok)


def _contradiction():
    """A 9x9 grid whose cell (0, 0) has no possible digit: row 0 holds 1-8, column 0 holds 9."""
    g = np.zeros((9, 9), np.int32)
    g[0, 1:] = np.arange(1, 9)
    g[4, 0] = 9
    return g


def test_teacher_solves_with_full_reward():
    params = sd.SudokuParams(grid_size=4, max_steps_in_episode=16)

    @jax.jit
    def play(key):
        _, s = ENV.reset_env(key, params)

        def step(s, _):
            _, s2, r, _, info = ENV.step_env(key, s, ENV.teacher_action(key, s, params), params)
            return s2, r

        return jax.lax.scan(step, s, None, length=6)

    state, rewards = play(jax.random.PRNGKey(0))
    assert bool(state.done) and bool(ENV.is_success(state, params))
    assert np.asarray(rewards).tolist() == [1.0] * 5 + [11.0]  # 6 cells emptied (4x4 easy), the last completes


def test_registered_and_validated():
    env, params = envs_jax.make("SimpleSudoku")
    assert isinstance(env, sd.Sudoku) and len(env.action_names(params)) == 729
    assert env.action_names(params)[:2] == ("1,1,1", "1,1,2")
    assert (params.difficulty, params.max_steps, params.max_steps_in_episode) == ("easy", 81, 20)
    _, params = envs_jax.make("MediumSudoku")
    assert (params.difficulty, params.max_steps_in_episode) == ("medium", 30)
    with pytest.raises(ValueError, match="grid_size must be one of 4, 9, 16"):
        envs_jax.make("SimpleSudoku", grid_size=5)


def test_conflicts_and_refusals_equal_the_references_scan():
    """The env's conflict cells (what its text marks *N*) and its in-graph refusal of a digit already in
    the cell's row, column or box equal the reference's: its per-digit numpy scan (find_conflicts_numpy,
    which the port's faster find_conflicts must also equal) and its is_valid_placement, on random grids
    of every size with repeats in rows, columns and boxes."""
    rng = np.random.default_rng(11)
    used = jax.jit(jax.vmap(sd.digit_used, in_axes=(None, 0, 0, 0)))
    for n in (4, 9, 16):
        for _ in range(100):
            g = rng.integers(0, n + 1, (n, n))
            g[rng.random((n, n)) < rng.random()] = 0
            scan = ref.find_conflicts_numpy(g)
            assert ref.find_conflicts(g) == scan, g
            assert sd.conflict_cells(g) == scan["row"] | scan["col"] | scan["box"], g
            r, c, d = rng.integers(0, n, 32), rng.integers(0, n, 32), rng.integers(1, n + 1, 32)
            refused = np.asarray(used(jnp.asarray(g, jnp.int32), jnp.asarray(r), jnp.asarray(c), jnp.asarray(d)))
            want = [not ref.is_valid_placement(g, int(a), int(b), int(x)) for a, b, x in zip(r, c, d)]
            assert refused.tolist() == want, g
