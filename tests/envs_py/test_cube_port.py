"""envs_py's cube (the host side of bench.envs' rubikscube row) against the JAX env:
the same moves give the same stickers, rewards, done flags and text on random episodes."""

from __future__ import annotations

import random

import jax
import numpy as np

import envs_jax
import envs_py as npe


def test_numpy_cube_steps_and_text_equal_the_env():
    env, params = envs_jax.make("rubikscube", scramble_depth=4, max_steps_in_episode=6)
    host = npe.rubiks_cube.Cube(params.max_steps_in_episode, params.moves)
    rng = random.Random(0)
    step = jax.jit(env.step_env, static_argnums=3)
    for e in range(6):
        _, st = env.reset_env(jax.random.PRNGKey(e), params)
        hs = npe.rubiks_cube.from_jax(st)
        for _ in range(7):
            a = rng.randrange(12)
            _, st, r, done, _ = step(jax.random.PRNGKey(0), st, a, params)
            hs, hr, hdone, _ = host.step(hs, a)
            assert hs.stickers == np.asarray(st.stickers).tolist() and hr == float(r) and hdone == bool(st.done)
            assert host.render(hs) == env.render_text(st, params)
