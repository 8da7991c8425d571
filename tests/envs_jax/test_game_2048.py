"""2048 vs the plain-Python reference port (envs_py/game_2048.py): 1,000 random episodes
stepped side by side (boards, rewards, done flags, text), the spawn distribution, the reward rules,
and the expectimax teacher."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import game_2048 as g
from envs_py import game_2048 as ref

ENV = g.Game2048()
N_EPISODES, T, MAX_STEPS = 1000, 160, 150  # some episodes end by the rules, the rest are truncated


@jax.jit
def _random_episodes(key):
    params = g.Game2048Params(max_steps_in_episode=MAX_STEPS)
    k_reset, k_act, k_step = jax.random.split(key, 3)
    _, state = jax.vmap(ENV.reset_env, (0, None))(jax.random.split(k_reset, N_EPISODES), params)

    def step(s, xs):
        a, k = xs
        _, s2, r, term, info = jax.vmap(ENV.step_env, (0, 0, 0, None))(k, s, a, params)
        moved = jax.vmap(g.slide)(s.board, a)[0]
        return s2, (s2.board, s2.score, s2.done, r, term, info["success"], info["action_is_effective"],
                    moved, jax.vmap(g.valid_moves)(s2.board))

    actions = jax.random.randint(k_act, (T, N_EPISODES), 0, 4)
    keys = jax.random.split(k_step, T * N_EPISODES).reshape(T, N_EPISODES, -1)
    _, out = jax.lax.scan(step, state, (actions, keys))
    return state, actions, out


@pytest.fixture(scope="module")
def episodes():
    state, actions, out = _random_episodes(jax.random.PRNGKey(0))
    return jax.device_get(state), np.asarray(actions), [np.asarray(x) for x in out]


def _values(board):
    return [[int(v) for v in row] for row in g.tiles(board)]


def test_random_episodes_match_the_reference(episodes):
    state, actions, (boards, scores, dones, rewards, terms, succ, eff, _, valid) = episodes
    mismatches, ended_by_rules, steps = 0, 0, 0
    # Python lists, converted once: ~140k steps index them (numpy scalar reads cost several times more).
    tiles = g.tiles(boards).tolist()
    actions, scores, rewards = actions.tolist(), scores.tolist(), rewards.tolist()
    dones, terms, succ, eff = dones.tolist(), terms.tolist(), succ.tolist(), eff.tolist()
    for e in range(N_EPISODES):
        r = ref.Ref2048(promised_noop=True)
        start = _values(state.board[e])
        assert sum(v != 0 for row in start for v in row) == 2
        for i in range(4):
            for j in range(4):
                if start[i][j]:
                    r.place(i, j, start[i][j])
        for t in range(T):
            if t >= MAX_STEPS or (t and dones[t - 1][e]):
                break
            moved, merge = r.step_move(actions[t][e])
            ours = tiles[t][e]
            if moved:  # the spawn: the one cell that the reference's slid board leaves empty and ours fills
                new = [(i, j) for i in range(4) for j in range(4) if r.grid[i][j] == 0 and ours[i][j]]
                assert len(new) == 1, (e, t)
                r.place(*new[0], ours[new[0][0]][new[0][1]])
            reward, done, info = r.step_finish(moved, merge)
            steps += 1
            ok = (ours == r.grid and scores[t][e] == r.score and abs(rewards[t][e] - reward) < 1e-6
                  and terms[t][e] == done and dones[t][e] == (done or t + 1 >= MAX_STEPS)
                  and succ[t][e] == info["success"] and eff[t][e] == moved
                  and g.observation_text(boards[t, e], scores[t][e], valid[t, e]) == r.render())
            mismatches += not ok
            ended_by_rules += done
    assert mismatches == 0
    assert steps > 100_000 and ended_by_rules > 100  # both endings exercised


def test_render_text_is_the_references(episodes):
    state, actions, (boards, scores, *_, valid) = episodes
    s = g.Game2048State(board=jnp.asarray(boards[40, 3]), score=jnp.int32(scores[40, 3]), time=jnp.int32(41),
                        done=jnp.bool_(False))
    assert ENV.render_text(s, ENV.default_params) == g.observation_text(boards[40, 3], scores[40, 3], valid[40, 3])
    full = np.array([[1, 2, 1, 2], [2, 1, 2, 1], [1, 2, 1, 2], [2, 1, 2, 1]])
    text = ENV.render_text(s.replace(board=jnp.asarray(full), score=jnp.int32(7)), ENV.default_params)
    assert text == ("Current 2048 Grid:\nRow 1: [2, 4, 2, 4]\nRow 2: [4, 2, 4, 2]\nRow 3: [2, 4, 2, 4]\n"
                    "Row 4: [4, 2, 4, 2]\n\nValid Actions: None.\nGoal: Merge same numbers to reach 2048.\n"
                    "Current Score: 7\nWhat is your next move?")


def test_spawn_distribution(episodes):
    """Spawned tiles are 2 with probability 0.9 and land uniformly on the empty cells."""
    _, _, (boards, *_, moved_boards, _) = episodes
    before = moved_boards.reshape(-1, 16)
    after = boards.reshape(-1, 16)
    spawned = (before == 0) & (after != 0)
    rows = spawned.sum(1) == 1
    assert rows.sum() > 50_000
    cell = spawned[rows].argmax(1)
    value = after[rows][np.arange(rows.sum()), cell]
    assert abs((value == 1).mean() - 0.9) < 0.005
    empties = before[rows] == 0
    rank = np.array([np.flatnonzero(e).tolist().index(c) for e, c in zip(empties, cell)])
    count = empties.sum(1)
    checked = 0
    for e in range(2, 16):  # per number of empty cells, each rank among them is equally likely
        ranks = rank[count == e]
        if len(ranks) < 2000:
            continue
        freq = np.bincount(ranks, minlength=e) / len(ranks)
        assert np.abs(freq - 1 / e).max() < 5 * np.sqrt((1 / e) * (1 - 1 / e) / len(ranks)), e
        checked += 1
    assert checked >= 8


def test_merge_rule_and_rewards_by_hand():
    b = jnp.asarray([[1, 1, 1, 1], [2, 2, 3, 0], [0, 0, 0, 0], [1, 0, 1, 2]], jnp.int32)
    left, raw, moved = g.slide(b, g.LEFT)
    assert np.asarray(left).tolist() == [[2, 2, 0, 0], [3, 3, 0, 0], [0, 0, 0, 0], [2, 2, 0, 0]]
    assert int(raw) == 4 + 4 + 8 + 4 and bool(moved)
    right = np.asarray(g.slide(b, g.RIGHT)[0]).tolist()
    assert right == [[0, 0, 2, 2], [0, 0, 3, 3], [0, 0, 0, 0], [0, 0, 2, 2]]
    assert np.asarray(g.slide(jnp.asarray([[1], [1], [2], [0]]).repeat(4, 1), g.DOWN)[0])[:, 0].tolist() == [0, 0, 2, 2]
    p = g.Game2048Params()
    assert abs(float(g.move_reward(jnp.int32(4), True, p)) - 0.1 * np.log2(5)) < 1e-6
    assert float(g.move_reward(jnp.int32(0), True, p)) == 0.0  # a move without merges
    assert abs(float(g.move_reward(jnp.int32(0), False, p)) + 0.1) < 1e-7  # promised penalty
    assert float(g.move_reward(jnp.int32(0), False, p.replace(noop_rule="reference"))) == 0.0
    raw_p = p.replace(use_log_reward=False)
    assert float(g.move_reward(jnp.int32(12), True, raw_p)) == 12.0
    assert abs(float(g.move_reward(jnp.int32(0), False, raw_p)) + 0.1) < 1e-7


@pytest.mark.parametrize("rule,log", [("promised", True), ("reference", True), ("promised", False),
                                      ("reference", False)])
def test_noop_rule_matches_the_reference_port(rule, log):
    """The env stepped under each no-op rule and reward mode gives the port's reward (`promised_noop`:
    -0.1 for a move that changes nothing in log mode too; the reference's log branch: 0.0), flags and
    board, on random boards (the spawn copied from the env into the port) half of whose moves change
    nothing (every row packed to the left without a merge, moved Left)."""
    params = g.Game2048Params(noop_rule=rule, use_log_reward=log)
    step = jax.jit(ENV.step_env, static_argnums=3)
    rng = np.random.default_rng(5)
    noops = 0
    for i in range(40):
        if i % 2:
            board = np.zeros((4, 4), np.int32)
            for row in range(4):
                k = int(rng.integers(1, 5))
                board[row, :k] = rng.permutation(np.arange(1, 9))[:k]  # distinct: no merge
            action = g.LEFT
        else:
            board = np.where(rng.random((4, 4)) < 0.5, 0, rng.integers(1, 4, (4, 4))).astype(np.int32)
            action = int(rng.integers(4))
        state = g.Game2048State(board=jnp.asarray(board), score=jnp.int32(0), time=jnp.int32(0),
                                done=jnp.bool_(False))
        _, new, reward, terminated, info = step(jax.random.PRNGKey(i), state, action, params)
        port = ref.Ref2048(use_log_reward=log, promised_noop=rule == "promised")
        port.grid = _values(board)
        moved, merged = port.step_move(action)
        after = _values(new.board)
        if moved:  # the env's spawn, placed into the port
            (r, c), = [(r, c) for r in range(4) for c in range(4) if port.grid[r][c] != after[r][c]]
            port.place(r, c, after[r][c])
        want, want_term, want_info = port.step_finish(moved, merged)
        assert port.grid == after and float(reward) == pytest.approx(want, abs=1e-6)
        assert (bool(terminated), bool(info["action_is_effective"])) == (want_term, want_info["action_is_effective"])
        noops += not moved
    assert noops >= 20


@jax.jit
def _teacher_games(key):
    params = g.Game2048Params()
    k_reset, k_play = jax.random.split(key)
    _, state = jax.vmap(ENV.reset_env, (0, None))(jax.random.split(k_reset, 8), params)

    def step(s, k):
        a = jax.vmap(ENV.teacher_action, (None, 0, None))(k, s, params)
        _, s2, r, _, info = jax.vmap(ENV.step_env, (0, 0, 0, None))(jax.random.split(k, 8), s, a, params)
        return s2, info["action_is_effective"] | s.done

    return jax.lax.scan(step, state, jax.random.split(k_play, 500))


def test_expectimax_teacher_plays_well():
    """In 500 moves the teacher never wastes a move and builds a 256 tile or more in every game."""
    state, effective = _teacher_games(jax.random.PRNGKey(1))
    assert bool(np.all(effective))
    assert int(np.min(np.max(np.asarray(state.board), axis=(1, 2)))) >= 8


def test_registered_and_validated():
    env, params = envs_jax.make("game_2048")
    assert isinstance(env, g.Game2048) and env.action_names(params) == ("Up", "Right", "Down", "Left")
    assert params.max_steps_in_episode == 700
    assert envs_jax.make("game_2048", noop_rule="reference")[1].noop_rule == "reference"
    with pytest.raises(ValueError, match="noop_rule must be one of promised, reference"):
        envs_jax.make("game_2048", noop_rule="zero")
    with pytest.raises(ValueError, match="success_tile must be a power of two"):
        envs_jax.make("game_2048", success_tile=1000)


def test_valid_moves_on_dense_boards_match_the_reference():
    """`valid_moves` decides from neighbour pairs without sliding: held to the reference's move test on
    boards of every fill level, full boards with and without equal neighbours included (the random
    episodes above reach few of those)."""
    rng = np.random.default_rng(7)
    n = 4000
    boards = rng.integers(1, 5, (n, 4, 4)) * (rng.random((n, 4, 4)) < rng.random((n, 1, 1)) * 1.2)
    valid = np.asarray(jax.jit(jax.vmap(g.valid_moves))(jnp.asarray(boards, jnp.int32)))
    full_stuck = 0
    for b, v in zip(boards, valid):
        expected = set(ref.valid_actions(_values(b)))
        assert {a for a in range(4) if v[a]} == expected, b
        full_stuck += not expected
    assert full_stuck > 20  # boards with no valid move are among them
