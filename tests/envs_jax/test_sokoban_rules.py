"""Sokoban step rules, rewards, flags and text against the plain-Python reference (envs_py/sokoban.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs_jax.sokoban import SokobanState, make_sokoban
from envs_jax.sokoban.types import SYMBOL_SETS
from envs_py.sokoban import RefSokoban, bfs_length, room_codes

H = W = 6
N_ACTIONS = 13  # > max_steps_in_episode (10): covers truncation and the frozen steps after it
BATCH = 16


def _episode(env, params):
    def run(state, actions):
        def step(s, a):
            _, s2, r, term, info = env.step_env(jax.random.key(0), s, a, params)
            return s2, (env.render_grid(s2, params), r, term, s2.done, info["success"], info["action_is_effective"])
        return jax.lax.scan(step, state, actions)[1]
    return jax.jit(jax.vmap(run))


ENVS = {n: make_sokoban("Sokoban", num_boxes=n) for n in (1, 2)}
RUNS = {n: _episode(*ENVS[n]) for n in (1, 2)}


@st.composite
def rooms(draw, num_boxes):
    """A 6x6 room with a wall border, some interior walls, player, boxes off targets, targets."""
    cells = draw(st.permutations(range(16)))
    n_walls = draw(st.integers(0, 5))
    flat = [(1 + c // 4) * W + 1 + c % 4 for c in cells]
    player, boxes = flat[0], flat[1:1 + num_boxes]
    targets = flat[1 + num_boxes:1 + 2 * num_boxes]
    first_action = None
    if draw(st.booleans()):  # often: player, box 0 and its target in a line, so pushes and wins happen
        a = draw(st.integers(0, 3))
        d = (-W, W, -1, 1)[a]
        b = boxes[0]
        line = (b - d, b + d)
        if all(0 < c % W < W - 1 and 0 < c // W < H - 1 and c not in boxes for c in line):
            player = line[0]
            targets = [line[1]] + [t for t in targets[1:] if t not in line]
            targets += [c for c in flat[1 + num_boxes:] if c not in (player, *targets, *boxes)][: num_boxes - len(targets)]
            first_action = a
    used = {player, *boxes, *targets}
    walls_in = [c for c in flat[1 + 2 * num_boxes:] if c not in used][:n_walls]
    walls = np.ones((H, W), bool)
    walls[1:-1, 1:-1] = False
    for c in walls_in:
        walls[c // W, c % W] = True
    tg = np.zeros((H, W), bool)
    for t in targets:
        tg[t // W, t % W] = True
    actions = draw(st.lists(st.integers(0, 3), min_size=N_ACTIONS, max_size=N_ACTIONS))
    if first_action is not None and draw(st.booleans()):
        actions[0] = first_action
    return walls, tg, np.array(boxes, np.int32), player, np.array(actions, np.int32)


def _check_batch(num_boxes, batch):
    env, params = ENVS[num_boxes]
    state = SokobanState(
        walls=jnp.asarray(np.stack([b[0] for b in batch])), targets=jnp.asarray(np.stack([b[1] for b in batch])),
        boxes=jnp.asarray(np.stack([b[2] for b in batch])), player=jnp.asarray([b[3] for b in batch], jnp.int32),
        time=jnp.zeros(len(batch), jnp.int32), done=jnp.zeros(len(batch), bool))
    actions = jnp.asarray(np.stack([b[4] for b in batch]))
    grids, rewards, terms, dones, succ, eff = jax.device_get(RUNS[num_boxes](state, actions))
    syms = env.symbols(params)
    for i, (walls, tg, boxes, player, acts) in enumerate(batch):
        ref = RefSokoban(*room_codes(walls, tg, boxes, player), num_boxes, max_steps=10)
        for t, a in enumerate(acts):
            r, term, info = ref.step(int(a))
            text = "\n".join("".join(syms[c] for c in row) for row in grids[i, t])
            assert text == ref.render(), (i, t)
            assert rewards[i, t] == pytest.approx(r, abs=1e-5), (i, t)
            assert bool(terms[i, t]) == term, (i, t)
            assert bool(dones[i, t]) == ref.done, (i, t)
            assert bool(succ[i, t]) == info["success"], (i, t)
            assert bool(eff[i, t]) == info["action_is_effective"], (i, t)


@settings(max_examples=25, deadline=None)
@given(st.lists(rooms(1), min_size=BATCH, max_size=BATCH))
def test_rules_match_reference_one_box(batch):
    _check_batch(1, batch)


@settings(max_examples=15, deadline=None)
@given(st.lists(rooms(2), min_size=BATCH, max_size=BATCH))
def test_rules_match_reference_two_boxes(batch):
    _check_batch(2, batch)


def _hand_state(rows, n_boxes):
    """State from a picture: # wall, _ floor, O target, X box, P player, √ box on target, S player on target."""
    walls = np.array([[ch == "#" for ch in r] for r in rows])
    tg = np.array([[ch in "O√S" for ch in r] for r in rows])
    w = len(rows[0])
    boxes = [r * w + c for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "X√"]
    player = next(r * w + c for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "PS")
    assert len(boxes) == n_boxes
    return SokobanState(walls=jnp.asarray(walls), targets=jnp.asarray(tg), boxes=jnp.asarray(boxes, jnp.int32),
                        player=jnp.int32(player), time=jnp.int32(0), done=jnp.bool_(False))


def test_hand_computed_push_rewards_and_frozen_end():
    env, params = ENVS[1]
    s = _hand_state(["######", "#PXO_#", "#____#", "#____#", "#____#", "######"], 1)
    step = jax.jit(env.step_env)
    _, s1, r, term, info = step(jax.random.key(0), s, 3, params)  # push the box onto the target
    assert env.render_text(s1, params) == "######\n#_P√_#\n#____#\n#____#\n#____#\n######"
    assert float(r) == pytest.approx(-0.1 + 1.0 + 10.0) and bool(term) and bool(s1.done) and bool(info["success"])
    # Ended: further steps change nothing, reward 0, not effective, still a success.
    for a in range(4):
        _, s2, r2, term2, info2 = step(jax.random.key(0), s1, a, params)
        assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.all(x == y)), s1, s2))
        assert float(r2) == 0.0 and not bool(term2) and not bool(info2["action_is_effective"]) and bool(info2["success"])


def test_truncation_after_ten_actions_then_frozen():
    env, params = ENVS[1]
    s = _hand_state(["######", "#P___#", "#_X__#", "#____#", "#___O#", "######"], 1)
    step = jax.jit(env.step_env)
    for t in range(10):  # bump into the left wall: blocked, no change, but each counts as an action
        _, s, r, term, info = step(jax.random.key(0), s, 2, params)
        assert float(r) == pytest.approx(-0.1) and not bool(info["action_is_effective"]) and not bool(term)
        assert bool(s.done) == (t == 9)
    _, s2, r2, _, info2 = step(jax.random.key(0), s, 3, params)
    assert int(s2.player) == int(s.player) and float(r2) == 0.0 and not bool(info2["action_is_effective"])
    assert int(s2.time) == 10


def test_box_off_target_penalty_and_blocked_push():
    env, params = make_sokoban("LargerSokoban")
    rows = ["########", "#P√_X__#", "#_____O#", "#______#", "#______#", "#______#", "#______#", "########"]
    s = _hand_state(rows, 2)
    step = jax.jit(env.step_env)
    _, s1, r, _, info = step(jax.random.key(0), s, 3, params)  # box leaves its target
    assert float(r) == pytest.approx(-1.1) and bool(info["action_is_effective"])
    _, s2, r, _, info = step(jax.random.key(0), s1, 3, params)  # box into box: blocked
    assert float(r) == pytest.approx(-0.1) and not bool(info["action_is_effective"])
    assert env.render_text(s2, params) == env.render_text(s1, params)


def test_texts_and_symbols():
    env, params = make_sokoban("Sokoban")
    env_n, params_n = make_sokoban("NewSymbolsSokoban")
    assert env.action_names(params) == ("Up", "Down", "Left", "Right")
    assert env.symbols(params) == ("#", "_", "O", "√", "X", "P", "S")
    assert env_n.symbols(params_n) == ("W", ".", "G", "C", "B", "A", "@")
    legend = "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target"
    assert env.instructions(params).startswith("You are solving the Sokoban puzzle.")
    assert env.instructions(params).endswith("\nThe meaning of each symbol in the state is:\n" + legend)
    assert env_n.instructions(params_n).endswith(
        "W: wall, .: empty, G: target, C: box on target, B: box, A: player, @: player on target")
    s = _hand_state(["######", "#S_X_#", "#_√__#", "#_O__#", "#____#", "######"], 2)
    assert env_n.render_text(s, params_n) == "WWWWWW\nW@.B.W\nW.C..W\nW.G..W\nW....W\nWWWWWW"
    assert set(SYMBOL_SETS) == {"standard", "new"}


def test_make_errors():
    with pytest.raises(ValueError, match="unknown Sokoban variant 'Foo'; valid: Sokoban"):
        make_sokoban("Foo")
    with pytest.raises(ValueError, match=r"unknown Sokoban parameter\(s\) 'bogus'; valid: .*num_boxes.*max_steps_in_episode"):
        make_sokoban("Sokoban", bogus=1)
    with pytest.raises(ValueError, match="too small"):
        make_sokoban("Sokoban", dim_room=(4, 6))
    with pytest.raises(ValueError, match="does not fit"):
        make_sokoban("Sokoban", num_boxes=5)
    env, params = make_sokoban("LargerSokoban", max_steps_in_episode=20, search_depth=5)
    assert params.max_steps_in_episode == 20 and env.config.search_depth == 5 and env.config.dim_room == (8, 8)


def test_solver_edge_cases():
    env, params = ENVS[1]
    solve = jax.jit(env.solve)
    corner = _hand_state(["######", "#X___#", "#__P_#", "#___O#", "#____#", "######"], 1)
    sol = solve(corner, params)  # a box in a corner can never move
    assert not bool(sol.solvable) and int(sol.length) == 0 and bool(jnp.all(sol.actions == -1))
    solved = _hand_state(["######", "#√___#", "#__P_#", "#____#", "#____#", "######"], 1)
    sol = solve(solved, params)
    assert bool(sol.solvable) and int(sol.length) == 0
    four = _hand_state(["######", "#_P__#", "#_X__#", "#____#", "#O___#", "######"], 1)
    sol = solve(four, params)
    assert bool(sol.solvable)
    # Replay the returned actions through the env and check optimality against the Python BFS.
    fixed, state = room_codes(np.asarray(four.walls), np.asarray(four.targets), np.asarray(four.boxes), int(four.player))
    assert int(sol.length) == bfs_length(fixed, state)
    s = four
    for a in np.asarray(sol.actions)[: int(sol.length)]:
        _, s, _, _, _ = env.step_env(jax.random.key(0), s, int(a), params)
    assert bool(env.is_success(s, params))
    # Depth limit: with max_len below the optimum the room counts as unsolvable.
    short_env, short_params = make_sokoban("Sokoban", solver_max_len=int(sol.length) - 1)
    assert not bool(jax.jit(short_env.solve)(four, short_params).solvable)
