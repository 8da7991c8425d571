"""bench/envs.py runs, and the host implementations it compares against (envs_py/)
agree with the JAX environments step by step, which makes the throughput comparison a comparison
of the same work. The numpy envs are written from the reference's rules, not from the JAX code."""

from __future__ import annotations

import collections
import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from bench import envs as bench
import envs_py as npe
from envs_jax.bandit import draw_jackpot
from envs_jax.frozen_lake import FrozenLakeState, slip_direction
from envs_jax.sokoban import SokobanState

STEPS = 12  # > max_steps_in_episode (10): the freeze of ended episodes is exercised too


@pytest.fixture(scope="module")
def tokenizer():
    from ragen_jax.text.tokenizer import load_tokenizer

    return load_tokenizer()


def test_bench_core_runs(tokenizer):
    setup = bench.Setup("FrozenLake", tokenizer)
    r = bench.bench_steps(setup, batch=2, inner_steps=2, repeats=1, numpy_max_steps=4)
    assert r["env_steps_per_call"] == 4 and r["numpy_steps"] == 4
    for k in ("compile_s", "jax_call_s", "jax_steps_per_s", "numpy_steps_per_s", "ratio"):
        assert math.isfinite(r[k]) and r[k] >= 0, k  # measured: reported, not bounded (a bound is the machine's speed)
    # The answers parse to their first action both ways (the benchmark relies on it).
    for i, text in enumerate(setup.answers):
        assert npe.parse_answer(text, setup.text_env.action_names) == [i, (i + 1) % 4]
        assert list(setup.text_env.parse_text(text).actions[:2]) == [i, (i + 1) % 4]


def _compare_steps(env, params, jax_states, np_env, np_states, actions, keys, draws, np_apply, to_np):
    """Step both sides STEPS times on the same actions/draws; compare state, reward and flags."""
    step = jax.jit(jax.vmap(env.step_env, in_axes=(0, 0, 0, None)))
    s = jax_states
    for t in range(STEPS):
        _, s, r, _, info = step(keys[t], s, actions[t], params)
        r, eff, succ = np.asarray(r), np.asarray(info["action_is_effective"]), np.asarray(info["success"])
        for b, ns in enumerate(np_states):
            ns, nr, ndone, ninfo = np_apply(ns, int(actions[t, b]), draws[t][b])
            one = to_np(jax.tree.map(lambda x: x[b], s))
            for field in type(ns).__slots__:
                assert getattr(one, field) == getattr(ns, field), (t, b, field)
            assert abs(float(r[b]) - nr) < 1e-5, (t, b)
            assert bool(eff[b]) == ninfo["action_is_effective"], (t, b)
            assert bool(succ[b]) == ninfo["success"], (t, b)
            assert env.render_text(jax.tree.map(lambda x: x[b], s), params) == np_env.render(ns)


def test_sokoban_numpy_matches_jax():
    env, params = envs_jax.make("Sokoban")
    rng = random.Random(0)
    rooms = [npe.generate_sokoban_room(rng) for _ in range(8)]
    w = 6
    flat = lambda rc: rc[0] * w + rc[1]  # noqa: E731
    jax_states = jax.tree.map(lambda *x: jnp.stack(x), *[
        SokobanState(walls=jnp.asarray(np.array(r.walls)), targets=jnp.asarray(np.array(r.targets)),
                     boxes=jnp.asarray([flat(b) for b in r.boxes], jnp.int32), player=jnp.int32(flat(r.player)),
                     time=jnp.int32(0), done=jnp.bool_(False)) for r in rooms])
    np_env = npe.sokoban.Sokoban(num_boxes=1, max_steps=10)
    actions = np.random.default_rng(0).integers(0, 4, (STEPS, 8)).astype(np.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), STEPS * 8).reshape(STEPS, 8, -1)
    draws = [[None] * 8] * STEPS
    np_states = [r.copy() for r in rooms]
    _compare_steps(env, params, jax_states, np_env, np_states, actions, keys, draws,
                   lambda s, a, d: np_env.step(s, a), npe.sokoban.from_jax)
    # The random actions pushed boxes and solved some rooms, so the rules were really exercised.
    assert any(s.boxes != r.boxes for s, r in zip(np_states, rooms))
    assert any(np_env.boxes_on_targets(s) == 1 for s in np_states)


def test_frozen_lake_numpy_matches_jax():
    env, params = envs_jax.make("FrozenLake", seeded_slips=False)  # slips from the step keys below
    rs = np.random.default_rng(1)
    n, b = 4, 16
    holes = rs.random((b, n, n)) < 0.3
    start, goal = rs.integers(0, n * n, b), rs.integers(0, n * n, b)
    goal = np.where(goal == start, (start + 1) % (n * n), goal)
    for i in range(b):
        holes[i].reshape(-1)[[start[i], goal[i]]] = False
    jax_states = FrozenLakeState(hole=jnp.asarray(holes), start=jnp.asarray(start, jnp.int32),
                                 goal=jnp.asarray(goal, jnp.int32), pos=jnp.asarray(start, jnp.int32),
                                 time=jnp.zeros(b, jnp.int32), done=jnp.zeros(b, bool),
                                 slip_key=jax.random.split(jax.random.PRNGKey(0), b))
    np_states = [npe.frozen_lake.FrozenLakeState(holes[i], divmod(int(start[i]), n), divmod(int(goal[i]), n)) for i in range(b)]
    np_env = npe.frozen_lake.FrozenLake(slip=float(params.slip), max_steps=10)
    actions = rs.integers(0, 4, (STEPS, b)).astype(np.int32)
    keys = jax.random.split(jax.random.PRNGKey(1), STEPS * b).reshape(STEPS, b, -1)
    # The realised slippery direction of each step, fed to the numpy env.
    dirs = np.asarray(jax.vmap(jax.vmap(slip_direction, in_axes=(0, 0, None)), in_axes=(0, 0, None))(
        keys, jnp.asarray(actions), params.slip))
    assert len(set(dirs.reshape(-1).tolist())) == 4
    _compare_steps(env, params, jax_states, np_env, np_states, actions, keys, dirs.tolist(),
                   lambda s, a, d: np_env.apply_direction(s, d), npe.frozen_lake.from_jax)


def test_bandit_numpy_matches_jax():
    env, params = envs_jax.make("Bandit")
    b = 16
    keys0 = jax.random.split(jax.random.PRNGKey(2), b)
    _, jax_states = jax.vmap(env.reset_env, in_axes=(0, None))(keys0, params)
    np_states = [npe.bandit.from_jax(jax.tree.map(lambda x: x[i], jax_states)) for i in range(b)]
    assert len({s.high_first for s in np_states}) == 2
    np_env = npe.bandit.Bandit()
    actions = np.random.default_rng(2).integers(0, 2, (STEPS, b)).astype(np.int32)
    keys = jax.random.split(jax.random.PRNGKey(3), STEPS * b).reshape(STEPS, b, -1)
    jackpots = np.asarray(jax.vmap(jax.vmap(draw_jackpot, in_axes=(0, None)), in_axes=(0, None))(keys, params))
    for s in np_states:  # the host's own text of the reset state equals the env's
        assert "Phoenix" in np_env.render(s)
    _compare_steps(env, params, jax_states, np_env, np_states, actions, keys, jackpots.tolist(),
                   lambda s, a, d: np_env.apply_draw(s, a, d), npe.bandit.from_jax)


def test_numpy_segment_text_and_parse_match_text_layer(tokenizer):
    from ragen_jax.text.conversation import PromptConfig
    from ragen_jax.text.text_env import TextEnv

    env, params = envs_jax.make("Sokoban")
    te = TextEnv(env, params, tokenizer, PromptConfig())
    room = npe.generate_sokoban_room(random.Random(5))
    w = 6
    state = SokobanState(walls=jnp.asarray(np.array(room.walls)), targets=jnp.asarray(np.array(room.targets)),
                         boxes=jnp.asarray([b[0] * w + b[1] for b in room.boxes], jnp.int32),
                         player=jnp.int32(room.player[0] * w + room.player[1]), time=jnp.int32(0), done=jnp.bool_(False))
    grid = npe.sokoban.Sokoban().render(room)
    for turn, left, reward, closed in [(1, 10, 0.0, True), (2, 7, -0.3, True), (3, 1, 10.9, False), (5, 0, -1.1, True)]:
        assert te.render_text(state, turn, left, reward, closed) == npe.segment_text(grid, turn, left, reward, closed)
    names = te.action_names
    texts = ["<think>x</think> <answer>up || LEFT||right</answer>", "<think></think><answer>Up</answer>",
             "<answer>Up</answer>", "<think>a</think>\n<answer> Down || jump || Left </answer>",
             "<think>a</think><answer>Up||Up||Up||Up||Up||Left</answer>"]
    for t in texts:
        p = te.parse_text(t)
        assert list(p.actions[: int(p.num_actions)]) == npe.parse_answer(t, names), t


def _bfs_solvable(env: npe.sokoban.Sokoban, room: npe.sokoban.SokobanState, max_depth: int = 40) -> bool:
    start = room.copy()
    start.time, start.done = -10**6, False  # never truncated during the search
    frontier = collections.deque([(start, 0)])
    seen = {(start.player, tuple(start.boxes))}
    while frontier:
        s, d = frontier.popleft()
        if d >= max_depth:
            continue
        for a in range(4):
            n = s.copy()
            _, _, _, info = env.step(n, a)
            if info["success"]:
                return True
            key = (n.player, tuple(n.boxes))
            if key not in seen:
                seen.add(key)
                frontier.append((n, d + 1))
    return False


@pytest.mark.parametrize("dim,boxes", [((6, 6), 1), ((8, 8), 2)])
def test_numpy_room_generator_makes_valid_solvable_rooms(dim, boxes):
    """The host generator (the reference's method) only makes legal, unsolved, solvable rooms."""
    env = npe.sokoban.Sokoban(num_boxes=boxes)
    rng = random.Random(7)
    for _ in range(10 if boxes == 1 else 4):
        room = npe.generate_sokoban_room(rng, dim, boxes, search_depth=300 if boxes == 1 else 10)
        walls = np.array(room.walls)
        assert walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()
        cells = [room.player, *room.boxes]
        assert len(set(cells)) == len(cells) and not any(walls[c] for c in cells)
        assert np.array(room.targets).sum() == boxes and not any(room.targets[r][c] for r, c in room.boxes)
        assert _bfs_solvable(env, room)
