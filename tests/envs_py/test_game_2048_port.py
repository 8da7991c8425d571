"""envs_py's 2048 (the host side of bench.envs' game_2048 row) against the JAX env on
random boards: the same move gives the same slid board, merged sum, reward and effectiveness, the
spawn lands on an empty cell of the slid board, and the host text equals the env's."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
import envs_py as npe
from envs_jax import game_2048 as g


def test_numpy_2048_steps_and_text_equal_the_env():
    env, params = envs_jax.make("game_2048")
    host = npe.game_2048.Game2048(params.max_steps_in_episode, params.two_prob)
    rng, nrng = random.Random(0), np.random.default_rng(0)
    step = jax.jit(env.step_env, static_argnums=3)
    slide = jax.jit(g.slide)
    for i in range(60):
        full = i % 5 == 0  # full boards: few or no moves
        board = np.where((nrng.random((4, 4)) < nrng.uniform(0.1, 0.8)) & (not full), 0,
                         nrng.integers(1, 6, (4, 4))).astype(np.int32)
        st = g.Game2048State(board=jnp.asarray(board), score=jnp.int32(rng.randrange(5000)), time=jnp.int32(3),
                             done=jnp.bool_(False))
        hs = npe.game_2048.from_jax(st)
        assert host.render(hs) == env.render_text(st, params)
        a = rng.randrange(4)
        slid, raw, moved = jax.device_get(slide(st.board, a))
        grid, hraw, hmoved = npe.game_2048.slide(hs.grid, a)
        assert (grid, hraw, hmoved) == ([[int(2 ** v) if v else 0 for v in row] for row in slid], int(raw), bool(moved))
        _, new, r, _, info = step(jax.random.PRNGKey(i), st, a, params)
        hnew, hr, _, hinfo = host.step(hs, a, rng)
        assert abs(hr - float(r)) < 1e-6 and hinfo["action_is_effective"] == bool(info["action_is_effective"])
        spawned = [(r_, c) for r_ in range(4) for c in range(4) if hnew.grid[r_][c] != grid[r_][c]]
        assert len(spawned) == int(hmoved) and all(grid[r_][c] == 0 and hnew.grid[r_][c] in (2, 4) for r_, c in spawned)
        assert hnew.score == int(new.score)
