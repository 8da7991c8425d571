"""On-device room generation: validity, determinism, variety and solvability (checked with the BFS
solver, whose optimal lengths are checked against a plain-Python BFS)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs_jax.sokoban import SokobanState, make_sokoban
from envs_jax.sokoban.generator import fallback_room
from envs_py.sokoban import bfs_length, room_codes

N_SMALL = 4096  # >= 2,000 rooms, and the jit+vmap scale the rollout uses
N_LARGE = 48


def _pipeline(env, params):
    """One compiled program: reset a batch, solve each room, replay the solution through step_env."""
    replay_params = params.replace(max_steps_in_episode=1000)  # no truncation while replaying

    def one(key):
        _, s0 = env.reset_env(key, params)
        sol = env.solve(s0, params)

        def step(carry, a):
            s, ret = carry
            _, s2, r, _, _ = env.step_env(key, s, jnp.maximum(a, 0), replay_params)
            keep = a >= 0  # -1 = padding after the solution
            s2 = jax.tree.map(lambda x, y: jnp.where(keep, y, x), s, s2)
            return (s2, ret + jnp.where(keep, r, 0.0)), None

        (s_end, ret), _ = jax.lax.scan(step, (s0, jnp.float32(0.0)), sol.actions)
        return s0, sol, env.is_success(s_end, params), ret

    return jax.jit(jax.vmap(one))


@pytest.fixture(scope="module")
def small():
    env, params = make_sokoban("Sokoban")
    keys = jax.random.split(jax.random.key(0), N_SMALL)
    run = _pipeline(env, params)
    return env, params, keys, run, jax.device_get(run(keys))


@pytest.fixture(scope="module")
def large():
    env, params = make_sokoban("LargerSokoban", solver_max_len=40)
    keys = jax.random.split(jax.random.key(1), N_LARGE)
    return env, params, jax.device_get(_pipeline(env, params)(keys))


def _check_rooms(s0, n_boxes):
    walls, targets, boxes, player = (np.asarray(x) for x in (s0.walls, s0.targets, s0.boxes, s0.player))
    b, h, w = walls.shape
    assert walls[:, 0, :].all() and walls[:, -1, :].all() and walls[:, :, 0].all() and walls[:, :, -1].all()
    assert (targets.reshape(b, -1).sum(1) == n_boxes).all()
    wf, tf = walls.reshape(b, -1), targets.reshape(b, -1)
    rows = np.arange(b)[:, None]
    assert not wf[rows, boxes].any(), "box on a wall"
    assert not tf[rows, boxes].any(), "a box starts on a target"  # the reference's score demands it
    assert not wf[np.arange(b), player].any(), "player on a wall"
    assert not (boxes == player[:, None]).any(), "player on a box"
    if n_boxes > 1:
        assert (np.sort(boxes, 1)[:, 1:] != np.sort(boxes, 1)[:, :-1]).all(), "two boxes share a cell"
    assert not np.asarray(s0.done).any() and (np.asarray(s0.time) == 0).all()


def test_small_rooms_valid_and_varied(small):
    env, params, keys, run, (s0, sol, success, ret) = small
    _check_rooms(s0, 1)
    rooms = {(np.asarray(s0.walls[i]).tobytes(), np.asarray(s0.targets[i]).tobytes(), int(s0.boxes[i, 0]),
              int(s0.player[i])) for i in range(N_SMALL)}
    # 6x6 topologies repeat often (the reference's walk gives ~900 distinct ones per 4,096 draws).
    assert len(rooms) > 0.7 * N_SMALL
    # Jitter: the player does not always start next to the box.
    w = env.config.dim_room[1]
    adjacent = np.isin(np.asarray(s0.player) - np.asarray(s0.boxes[:, 0]), [1, -1, w, -w])
    assert 0.2 < adjacent.mean() < 0.95


def test_small_rooms_solvable_and_solution_replays(small):
    env, params, keys, run, (s0, sol, success, ret) = small
    length = np.asarray(sol.length)
    assert np.asarray(sol.solvable).all()
    assert (length >= 1).all()  # the box never starts on its target
    assert np.asarray(success).all()
    # -0.1 per action, +1 box onto target, +10 finish (the sum of on/off rewards telescopes to +N).
    np.testing.assert_allclose(np.asarray(ret), -0.1 * length + 1 + 10, atol=1e-4)
    acts = np.asarray(sol.actions)
    assert ((acts >= 0) == (np.arange(acts.shape[1])[None] < length[:, None])).all()
    # Difficulty resembles the reference's (median 4, mean 4.04, 99.8% within 10 actions).
    assert 3 <= np.median(length) <= 5 and 3.4 < length.mean() < 4.7 and (length <= 10).mean() > 0.98


def test_bfs_lengths_are_optimal_vs_python_bfs(small, large):
    for env_s, s0, sol, idx in ((small[0], small[4][0], small[4][1], range(40)),
                                (large[0], large[2][0], large[2][1], range(4))):
        for i in idx:
            fixed, state = room_codes(np.asarray(s0.walls[i]), np.asarray(s0.targets[i]),
                                      np.asarray(s0.boxes[i]), int(s0.player[i]))
            assert bfs_length(fixed, state) == int(sol.length[i]), i


def test_same_key_same_room(small):
    env, params, keys, run, (s0, *_rest) = small
    again = jax.device_get(run(keys))[0]
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), s0, again))
    # Unbatched, separately compiled reset gives the same rooms as the batched one.
    reset = jax.jit(env.reset)
    for i in (0, 1, 777):
        _, s = reset(keys[i], params)
        for a, b in zip(jax.tree.leaves(jax.device_get(s)), jax.tree.leaves(jax.tree.map(lambda x: x[i], s0))):
            assert np.array_equal(a, b), i


def test_large_rooms_valid_and_solvable(large):
    env, params, (s0, sol, success, ret) = large
    _check_rooms(s0, 2)
    length = np.asarray(sol.length)
    assert np.asarray(sol.solvable).all() and np.asarray(success).all() and (length >= 1).all()
    np.testing.assert_allclose(np.asarray(ret), -0.1 * length + 2 + 10, atol=1e-4)


def test_fallback_room_is_valid_and_solvable():
    for dim, n in (((6, 6), 1), ((5, 7), 3)):
        floor, targets, boxes, player = fallback_room(dim, n)
        tg = np.zeros(dim[0] * dim[1], bool)
        tg[targets] = True
        fixed, state = room_codes(~floor, tg.reshape(dim), boxes, player)
        assert bfs_length(fixed, state) is not None


def test_generation_survives_degenerate_settings():
    # One tiny candidate and one try: many rooms take the fallback; all must be valid and solvable.
    env, params = make_sokoban("Sokoban", num_candidates=1, search_depth=1, gen_tries=1)
    keys = jax.random.split(jax.random.key(3), 64)
    s0 = jax.device_get(jax.jit(jax.vmap(lambda k: env.reset_env(k, params)[1]))(keys))
    _check_rooms(s0, 1)
    _, _, fb_boxes, _ = fallback_room((6, 6), 1)
    assert 0 < (np.asarray(s0.boxes[:, 0]) == fb_boxes[0]).sum() < 64
    for i in range(64):
        fixed, state = room_codes(s0.walls[i], s0.targets[i], s0.boxes[i], int(s0.player[i]))
        assert bfs_length(fixed, state) is not None, i
