"""Solver teachers against independent truths: the tokenizer's own encoding and the reference parser
(regex) for the answer texts, a plain-Python Sokoban + BFS for replayed demonstrations, a numpy value
iteration for FrozenLake, and a binomial bound for the Bandit arm frequency."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from ragen_jax.models.qwen2.sharding import make_mesh
from ragen_jax.rollout import Rollout, RolloutConfig
from ragen_jax.rollout.teachers import TEACHERS, get_teacher
from ragen_jax.rollout.teachers import AnswerTable
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.text.tokenizer import IM_END, load_tokenizer
from envs_jax.frozen_lake import rows_from_state
from envs_py.frozen_lake import dynamics
from envs_py.sokoban import RefSokoban, bfs_length, room_codes


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _resets(te, seeds):
    """Host states of `reset_env(PRNGKey(seed))` for every seed, in one compiled call (op by op, a
    Sokoban reset compiled hundreds of tiny programs)."""
    return jax.device_get(jax.jit(te.reset_rows)(jnp.asarray(seeds, jnp.int32)))


def _te(tok, name, **prompt):
    env, params = envs_jax.make(name)
    return TextEnv(env, params, tok, PromptConfig(**prompt))


# ------------------------------------------------------------------------------------ answer texts
@pytest.mark.parametrize("name,think", [("Sokoban", True), ("Sokoban", False), ("FrozenLake", True), ("Bandit", True)])
def test_answer_ids_are_the_tokenizers_encoding_and_parse_back(tok, name, think):
    prompt = dict(think=think, max_response_tokens=32)
    if name == "Bandit":
        prompt.update(max_turns=1, max_actions_per_turn=1)
    te = _te(tok, name, **prompt)
    table = get_teacher(name, te).table
    assert table.max_actions == te.max_actions_per_turn  # 32 tokens hold 5 actions
    # Every count the table supports (FrozenLake/Bandit teachers use 1, the table can write more).
    rng = np.random.default_rng(0)
    k = table.max_actions
    acts = rng.integers(0, len(te.action_names), (48, k)).astype(np.int32)
    nums = rng.integers(1, k + 1, 48).astype(np.int32)
    ids, lengths = jax.jit(jax.vmap(table.ids))(acts, nums)
    ids, lengths = np.asarray(ids), np.asarray(lengths)
    for a, n, row, length in zip(acts, nums, ids, lengths):
        want = [te.action_names[i] for i in a[:n]]
        text = table.text(a[:n])
        head = (table.thought + "</think><answer>") if think else ""
        assert text == head + " || ".join(want) + "</answer><|im_end|>"
        assert row[:length].tolist() == tok.encode(text[: -len("<|im_end|>")], add_special_tokens=False) + [IM_END]
        assert tok.decode(row[:length].tolist(), skip_special_tokens=False) == text
        parsed = te.parse_text(te.config.forced_prefix + text)
        assert [te.action_names[i] for i in parsed.actions[: int(parsed.num_actions)]] == want[: te.max_actions_per_turn]
        assert bool(parsed.format_ok) and not bool(parsed.has_invalid)


def test_tables_fit_the_budget_or_fail_clearly(tok):
    names = ("Up", "Down", "Left", "Right")
    t = AnswerTable(tok, names, think=True, thought=" I push the box toward the target.", max_tokens=24, max_actions=5)
    def longest(k):  # the tokenizer's longest k-action answer (one name repeated)
        return max(len(tok.encode(t.text((a,) * k), add_special_tokens=False)) for a in range(len(names)))

    assert longest(t.max_actions) <= 24 < longest(t.max_actions + 1)  # as many actions as always fit, no more
    with pytest.raises(ValueError, match="max_response_tokens=8 cannot hold"):
        AnswerTable(tok, names, think=True, thought=" I push the box toward the target.", max_tokens=8, max_actions=5)
    te = _te(tok, "FrozenLake", max_response_tokens=32)
    envs_jax.register(dataclasses.replace(envs_jax.get_spec("FrozenLake"), name="NoTeacher", teacher=""))
    try:
        with pytest.raises(ValueError, match="no solver teacher for environment 'NoTeacher'"):
            get_teacher("NoTeacher", te)
    finally:
        envs_jax.unregister("NoTeacher")
    with pytest.raises(ValueError, match="the Sokoban teacher needs a SokobanEnv"):
        get_teacher("Sokoban", te)


def test_every_teacher_kind_has_a_teacher(tok):
    """The rollout side covers every kind a record may name, and each built-in env gets its kind's
    teacher with its record's thought."""
    assert set(TEACHERS) == set(envs_jax.TEACHER_KINDS)
    for name in ("Sokoban", "FrozenLake", "Bandit"):
        spec = envs_jax.get_spec(name)
        teacher = get_teacher(name, _te(tok, name, max_turns=1, max_actions_per_turn=1, max_response_tokens=32))
        assert type(teacher) is TEACHERS[spec.teacher] and teacher.kind == spec.teacher
        assert teacher.table.thought == spec.teacher_thought


# ------------------------------------------------------------------------------------ Sokoban
def test_sokoban_demos_replay_to_bfs_optimal_solutions(tok):
    # The demo rollout of tests/ragen_jax/trainer/test_sft.py (same shapes and mesh: one compilation).
    te = _te(tok, "Sokoban", max_turns=2, max_response_tokens=32)
    teacher = get_teacher("Sokoban", te)
    seeds = np.arange(50000, 50008)
    mesh = make_mesh(data=1, devices=jax.devices()[:1])
    traj = jax.device_get(Rollout(None, te, RolloutConfig(num_groups=8, group_size=1, max_context=512), mesh=mesh,
                                  teacher=teacher)(None, jax.random.PRNGKey(0), seeds))
    checked = 0
    starts = _resets(te, seeds)
    for r, seed in enumerate(seeds):
        st = jax.tree.map(lambda x: x[r], starts)
        fixed, state = room_codes(np.asarray(st.walls).tolist(), np.asarray(st.targets).tolist(),
                                  np.asarray(st.boxes).tolist(), int(st.player))
        optimal = bfs_length(fixed, state)
        # Each turn's assistant text, decoded from the demo tokens (runs of loss mask 1).
        n = int(traj.length[r])
        ids, mask = traj.tokens[r, :n], traj.loss_mask[r, :n]
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
        turns = [tok.decode(ids[a:b].tolist(), skip_special_tokens=False) for a, b in zip(edges[::2], edges[1::2])]
        assert len(turns) == int(traj.num_turns[r]) and int(mask.sum()) == int(traj.response_length[r])
        ref = RefSokoban(fixed, state, num_boxes=1, max_steps=10)
        total_reward, executed = 0.0, 0
        for text in turns:
            p = te.parse_text("<think>" + text)
            assert bool(p.format_ok) and not bool(p.has_invalid)
            for a in p.actions[: int(p.num_actions)]:
                if ref.done:
                    break
                rew, _, _ = ref.step(int(a))
                total_reward += rew
                executed += 1
        if optimal is not None and optimal <= 10:
            checked += 1
            assert ref.done and executed == optimal, (seed, executed, optimal)
            assert bool(traj.success[r])
            np.testing.assert_allclose(traj.reward[r], -0.1 * optimal + 1.0 + 10.0, atol=1e-4)
            np.testing.assert_allclose(total_reward, -0.1 * optimal + 1.0 + 10.0, atol=1e-4)
    assert checked >= 6


# ------------------------------------------------------------------------------------ FrozenLake
def _q_values(rows, k, slip=2.0 / 3.0):
    """Q[cell, action] with k actions left (k >= 1), plain dynamic programming over the reference table."""
    n = len(rows)
    dyn = dynamics(rows, slip)
    flat = "".join(rows)
    v = np.array([1.0 if ch == "G" else 0.0 for ch in flat])
    for _ in range(k):
        q = np.array([[sum(p * v[nr * n + nc] for p, (nr, nc) in dyn[(c, a)]) for a in range(4)] for c in range(n * n)])
        v = np.where([ch == "G" for ch in flat], 1.0, np.where([ch == "H" for ch in flat], 0.0, q.max(axis=1)))
    return q


def test_frozen_lake_teacher_takes_an_optimal_action_for_the_actions_it_can_still_take(tok):
    te = _te(tok, "FrozenLake", max_response_tokens=32)  # 5 turns, 10 actions
    teacher = get_teacher("FrozenLake", te)
    rng = np.random.default_rng(1)
    cases = []
    starts = _resets(te, np.arange(24))
    for seed in range(24):
        st = jax.tree.map(lambda x: x[seed], starts)
        free = np.flatnonzero(~np.asarray(st.hole).reshape(-1) & (np.arange(16) != int(st.goal)))
        st = st.replace(pos=np.int32(rng.choice(free)), time=np.int32(rng.integers(0, 10)))
        cases.append((st, int(rng.integers(1, 6))))
    states = jax.tree.map(lambda *xs: np.stack(xs), *[c[0] for c in cases])
    turns = jnp.asarray([c[1] for c in cases])
    ids, lengths = jax.jit(jax.vmap(teacher, in_axes=(0, 0, None)))(states, turns, jax.random.PRNGKey(0))
    for (st, turn), row, n in zip(cases, np.asarray(ids), np.asarray(lengths)):
        p = te.parse_text("<think>" + tok.decode(row[:n].tolist(), skip_special_tokens=False))
        assert int(p.num_actions) == 1  # one action per turn: no blind moves after a slip
        rows = rows_from_state(st)
        horizon = min(10 - int(st.time), 5 - turn + 1)
        q = _q_values(rows, horizon)[int(st.pos)]
        assert q[int(p.actions[0])] >= q.max() - 1e-6, (rows, int(st.pos), horizon, q, int(p.actions[0]))


@pytest.mark.parametrize("seeded", [True, False])
def test_frozen_lake_group_rows_share_their_slips_through_the_rollout(tok, seeded):
    """The N rows of a group reset from one seed; with seeded slips (the reference: one np_random per
    seed) the deterministic teacher's rows of a group play the same episode move for move, while
    groups differ; with slips from the rollout's per-row keys they do not."""
    env, params = envs_jax.make("FrozenLake", seeded_slips=seeded)
    te = TextEnv(env, params, tok, PromptConfig(max_turns=10, max_actions_per_turn=1, think=False,
                                                max_response_tokens=8))
    teacher = get_teacher("FrozenLake", te)
    mesh = make_mesh(data=1, devices=jax.devices()[:1])
    cfg = RolloutConfig(num_groups=6, group_size=4, max_context=1024)
    traj = jax.device_get(Rollout(None, te, cfg, mesh=mesh, teacher=teacher)(
        None, jax.random.PRNGKey(0), np.arange(700, 706)))
    rows = [(traj.tokens[r, :traj.length[r]].tolist(), float(traj.reward[r])) for r in range(24)]
    groups = [rows[g * 4:(g + 1) * 4] for g in range(6)]
    same = [all(r == grp[0] for r in grp) for grp in groups]
    assert all(same) if seeded else not all(same)
    assert len({tuple(grp[0][0]) for grp in groups}) == 6


# ------------------------------------------------------------------------------------ Bandit
def test_bandit_teacher_picks_the_high_arm_with_the_given_probability(tok):
    te = _te(tok, "Bandit", max_turns=1, max_actions_per_turn=1, max_response_tokens=32)
    st = te.env.reset_env(jax.random.PRNGKey(0), te.env_params)[1]
    keys = jax.random.split(jax.random.PRNGKey(3), 4000)
    for p_high in (0.0, 0.3, 1.0):
        teacher = get_teacher("Bandit", te, high_prob=p_high)
        ids, lengths = jax.jit(jax.vmap(teacher, in_axes=(None, None, 0)))(st, 1, keys)
        ids, lengths = np.asarray(ids), np.asarray(lengths)
        # Distinct rows decoded once; each must name exactly one arm.
        rows, counts = np.unique(ids, axis=0, return_counts=True)
        high = 0
        for row, c in zip(rows, counts):
            n = int(lengths[(ids == row).all(axis=1)][0])
            parsed = te.parse_text("<think>" + tok.decode(row[:n].tolist(), skip_special_tokens=False))
            assert int(parsed.num_actions) == 1
            high += c * int(parsed.actions[0] == 1)  # action 1 = the high-risk arm
        sigma = np.sqrt(4000 * p_high * (1 - p_high))
        assert abs(high - 4000 * p_high) <= 5 * sigma + 1e-9
    with pytest.raises(ValueError, match="high_prob must be in"):
        get_teacher("Bandit", te, high_prob=1.5)


def test_bandit_pairs_teacher_names_the_states_own_arms(tok):
    """With RAGEN-2's name pairs (an arm name list of 24) the teacher names an arm of the state's own
    pair, the high one with the given probability."""
    te = _te(tok, "BanditPairs", max_turns=1, max_actions_per_turn=1, max_response_tokens=32)
    keys = jax.random.split(jax.random.PRNGKey(4), 600)
    states = jax.vmap(te.env.reset_env, in_axes=(0, None))(keys, te.env_params)[1]
    teacher = get_teacher("BanditPairs", te, high_prob=0.5)
    ids, lengths = jax.device_get(jax.jit(jax.vmap(teacher, in_axes=(0, None, 0)))(states, 1, keys))
    pairs = np.asarray(states.pair)
    assert len(set(pairs.tolist())) == 12
    high = 0
    for i in range(len(keys)):
        parsed = te.parse_text("<think>" + tok.decode(ids[i, :lengths[i]].tolist(), skip_special_tokens=False))
        assert int(parsed.num_actions) == 1 and int(parsed.actions[0]) // 2 == pairs[i]
        high += int(parsed.actions[0]) % 2
    assert abs(high - 300) <= 5 * np.sqrt(600 * 0.25)


def test_teacher_texts_hold_only_envs_the_text_layer_renders():
    """The task vocabulary (model.vocab='task') is built from teacher_texts(): an env registered
    without a text layer must not change it (it would change every existing run's vocabulary)."""
    from ragen_jax.rollout.teachers import teacher_texts
    expected = {" I push the box toward the target.", " I avoid the holes and head for the goal.",
                " I choose an arm by what its name suggests."}
    heads = {t[: -len("</think><answer>")] for t in teacher_texts() if t.endswith("</think><answer>")}
    assert heads == expected | {""}
    no_text = dataclasses.replace(envs_jax.get_spec("SimpleSudoku"), name="NoTextLayer", teacher="bfs",
                                  teacher_thought=" A thought no run may see.", text_layer=False)
    envs_jax.register(no_text)
    try:
        assert not any(" A thought no run may see." in t for t in teacher_texts())
    finally:
        envs_jax.unregister("NoTextLayer")


# ------------------------------------------------------------------------------------ 2048
def _py_board_value(grid):
    """The teacher's board value in plain Python: snake-weighted tiles + 0.25 * max tile * empty share."""
    n = len(grid)
    order = [[r * n + (c if r % 2 == 0 else n - 1 - c) for c in range(n)] for r in range(n)]
    flat = [v for row in grid for v in row]
    snake = sum(grid[r][c] * 4.0 ** (-order[r][c] / 2.0) for r in range(n) for c in range(n))
    return snake + 0.25 * max(flat) * sum(v == 0 for v in flat) / len(flat)


def _py_expectimax_values(grid, two_prob=0.9):
    """Per move: -inf if it changes nothing, else the mean over empty cells of the spawn's expected
    best reply value (ref_game_2048's move rules on tile values)."""
    from envs_py.game_2048 import move_sim

    values = []
    for a in range(4):
        after = [row[:] for row in grid]
        if not move_sim(after, a)[1]:
            values.append(-np.inf)
            continue
        empty = [(r, c) for r, row in enumerate(after) for c, v in enumerate(row) if v == 0]
        total = 0.0
        for r, c in empty:
            for tile, p in ((2, two_prob), (4, 1.0 - two_prob)):
                spawned = [row[:] for row in after]
                spawned[r][c] = tile
                replies = [-1.0]
                for b in range(4):
                    nb = [row[:] for row in spawned]
                    if move_sim(nb, b)[1]:
                        replies.append(_py_board_value(nb))
                total += p * max(replies)
        values.append(total / len(empty))
    return values


def test_2048_teacher_plays_plain_python_expectimax_and_parses_back(tok):
    """On 120 random boards the teacher's answer is the tokenizer's encoding of one move, that move
    parses back from the ids, and it is a best move of a plain-Python depth-2 expectimax (up to
    float32 rounding; moves that change nothing are never named)."""
    from envs_jax.game_2048 import Game2048State

    te = _te(tok, "game_2048", max_response_tokens=32)
    teacher = get_teacher("game_2048", te)
    assert teacher.kind == "expectimax" and teacher.actions_per_turn == 5 and teacher.table.thought == ""
    rng = np.random.default_rng(5)
    n = 120
    empty_p = rng.uniform(0.05, 0.9, (n, 1, 1))
    board = np.where(rng.random((n, 4, 4)) < empty_p, 0, rng.integers(1, 11, (n, 4, 4))).astype(np.int32)
    board[:, 0, 0] = np.where(board[:, 0, 0] == 0, 1, board[:, 0, 0])  # never an empty board
    states = Game2048State(board=jnp.asarray(board), score=jnp.zeros(n, jnp.int32),
                           time=jnp.zeros(n, jnp.int32), done=jnp.zeros(n, bool))
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    ids, lengths = jax.device_get(jax.jit(jax.vmap(teacher, (0, None, 0)))(states, 1, keys))
    prefix = np.asarray(te.forced_prefix_ids, np.int32)  # the forced "<think>" the answer continues
    full = np.concatenate([np.broadcast_to(prefix, (n, len(prefix))), ids], axis=1)
    parsed = jax.device_get(jax.jit(jax.vmap(te.parse))(jnp.asarray(full), jnp.asarray(lengths + len(prefix))))
    checked = 0
    for b in range(n):
        grid = [[int(2 ** v) if v else 0 for v in row] for row in board[b]]
        values = _py_expectimax_values(grid)
        if max(values) == -np.inf:
            continue  # no move changes the board: the game is over, the teacher is never asked
        checked += 1
        assert int(parsed.num_actions[b]) == 1 and not bool(parsed.has_invalid[b])
        move = int(parsed.actions[b, 0])
        assert values[move] >= max(values) - 1e-5 * abs(max(values)), (board[b], values, move)
        want = tok.encode(f"</think><answer>{te.action_names[move]}</answer>", add_special_tokens=False) + [IM_END]
        assert ids[b, : lengths[b]].tolist() == want
    assert checked >= 100


def test_task_vocabulary_holds_every_cube_teacher_answer(tok):
    """model.vocab='task' covers the cube teacher's answers: "U'</answer>" puts "'</" in one token."""
    from ragen_jax.experiment.build import build_vocab
    from ragen_jax.experiment.config import load_config

    cfg = load_config("demo_cpu_frozen_lake.py", ["env.name=rubikscube"])
    te = _te(tok, "rubikscube", think=False, max_response_tokens=8)
    vocab = set(build_vocab(cfg, {"rubikscube": te}, tok).to_qwen.tolist())
    table = get_teacher("rubikscube", te).table
    answers = [tok.encode(table.text((a,))[: -len("<|im_end|>")], add_special_tokens=False) for a in range(12)]
    assert any(tok.decode([i]) == "'</" for ids in answers for i in ids)
    assert all(set(ids) <= vocab for ids in answers)
