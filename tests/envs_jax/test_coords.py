"""RAGEN-2's coordinate observations (`CoordSokoban`, `CoordFrozenLake`, `observation_format`).

Truths: the plain-Python ports of RAGEN-2's `collect_entity_coordinates` / `format_coordinate_render`
/ `_render_text` in envs_py/sokoban.py and envs_py/frozen_lake.py, fed with states from the
envs' own reset and step (random play, hypothesis-drawn seeds); RAGEN-2's config/envs.yaml
instruction blocks parsed by a YAML parser (its literal-block rules decide the trailing spaces and
newlines); and the in-graph masks recomputed on the host.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import envs_jax
from envs_jax import coords
from envs_jax.frozen_lake import rows_from_state, state_from_rows
from envs_py import frozen_lake as ref_fl
from envs_py.sokoban import STANDARD, RefSokoban, room_codes

BATCH, STEPS = 48, 10

# RAGEN-2 config/envs.yaml, the two env_instruction entries exactly as written there (indentation,
# trailing spaces and all); yaml.safe_load applies the literal-block rules.
ENVS_YAML = """\
CoordSokoban:
    env_instruction: |
      You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.
      You are provided with a symbol grid and the zero-indexed coordinates of the player, each box, and each target. 
      Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5). 
      When you are exactly next to a box, you can push it by moving in the same direction. 
      You cannot push a box through a wall, and you cannot pull a box.
      The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.
    max_tokens: 120
CoordFrozenLake:
    env_instruction: |
      You are solving the FrozenLake puzzle. The observation includes both a symbol grid and zero-indexed coordinates for the start, goal, player, and any holes.
      Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5).
      Beware that the ice is slippery, so the agent might slide and end up in an unintended tile.
      Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.
    max_tokens: 120
"""


@functools.lru_cache(maxsize=None)
def _env(name, fmt):
    return envs_jax.make(name, observation_format=fmt)


@functools.lru_cache(maxsize=None)
def _play(name, fmt):
    """jit(keys -> states [STEPS + 1, BATCH]): reset, then uniformly random actions."""
    env, params = _env(name, fmt)

    def run(key):
        k_reset, k_act, k_step = jax.random.split(key, 3)
        _, s0 = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(k_reset, BATCH), params)
        acts = jax.random.randint(k_act, (STEPS, BATCH), 0, env.num_actions)

        def step(s, x):
            a, k = x
            s = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(jax.random.split(k, BATCH), s, a, params)[1]
            return s, s

        _, ss = jax.lax.scan(step, s0, (acts, jax.random.split(k_step, STEPS)))
        return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), s0, ss)

    return jax.jit(run)


def _states(name, fmt, seed):
    """Host (numpy) states from the env's own reset and random steps, flattened to a list."""
    tree = jax.device_get(_play(name, fmt)(jax.random.key(seed)))
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), tree)
    n = flat.time.shape[0]
    return [jax.tree.map(lambda x: x[i], flat) for i in range(n)]


def _sokoban_ref(state, num_boxes):
    fixed, room = room_codes(np.asarray(state.walls), np.asarray(state.targets), np.asarray(state.boxes),
                             int(state.player))
    return RefSokoban(fixed, room, num_boxes)


def _frozen_lake_ref(state):
    game = ref_fl.FrozenLakeRef(rows_from_state(state))
    game.row, game.col = divmod(int(state.pos), game.n)
    return game


def _check_masks(env, s, params):
    """The in-graph masks list the same cells (row-major) as the host entities, within the budget."""
    masks = np.asarray(env.coordinate_masks(s, params))
    for m, (label, cells) in zip(masks, env.coordinate_entities(s, params)):
        assert coords.cells_of(m) == cells, label
    lines, cells = env.coordinate_budget(params)
    assert masks.any(axis=(1, 2)).sum() <= lines and masks.sum() <= cells


@pytest.mark.parametrize("fmt", ["grid_coord", "coord"])
@pytest.mark.parametrize("name,num_boxes", [("Sokoban", 1), ("LargerSokoban", 2)])
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_sokoban_coordinate_text_is_the_references(name, num_boxes, fmt, seed):
    env, params = _env(name, fmt)
    seen = set()
    for s in _states(name, fmt, seed):
        game = _sokoban_ref(s, num_boxes)
        text = env.render_text(s, params)
        assert text == game.render(STANDARD, fmt)
        seen.update(line.split(":")[0] for line in text.split("\n"))
        _check_masks(env, s, params)
    # Random play reaches boxes on targets and the player on a target (else this test were vacuous).
    assert {"Targets", "Boxes", "Player"} <= seen
    if fmt == "grid_coord":
        assert {"Coordinates", "Grid Map"} <= seen


def test_sokoban_every_category_is_rendered():
    """Hand-made states covering the rarer lines (boxes on target, player on target)."""
    env, params = envs_jax.make("CoordSokoban")
    rows = ["######", "#PX_O#", "#_√__#", "######", "######", "######"]
    walls = np.array([[ch == "#" for ch in r] for r in rows])
    targets = np.array([[ch in "O√S" for ch in r] for r in rows])
    boxes = [r * 6 + c for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "X√"]
    state = envs_jax.sokoban.SokobanState(walls=jnp.asarray(walls), targets=jnp.asarray(targets),
                                          boxes=jnp.asarray(boxes[:1], jnp.int32), player=jnp.int32(7),
                                          time=jnp.int32(0), done=jnp.bool_(False))
    # num_boxes=1 env: one box at (1, 2); the "√" cell is then an empty target. Player walks onto it.
    text = env.render_text(state.replace(player=jnp.int32(14)), params)
    assert text.split("Grid Map")[0] == (
        "Coordinates: \nBoard size: 6 rows x 6 cols (zero-indexed).\n"
        "Targets: (1, 4), (2, 2)\nBoxes: (1, 2)\nPlayer on target: (2, 2)\n")
    pushed = state.replace(boxes=jnp.asarray([10], jnp.int32), player=jnp.int32(9))
    assert env.render_text(pushed, params).split("Grid Map")[0] == (
        "Coordinates: \nBoard size: 6 rows x 6 cols (zero-indexed).\n"
        "Targets: (1, 4), (2, 2)\nBoxes on target: (1, 4)\nPlayer: (1, 3)\n")
    for s in (state, pushed):
        assert env.render_text(s, params) == _sokoban_ref(s, 1).render(STANDARD, "grid_coord")


@pytest.mark.parametrize("fmt", ["grid_coord", "coord"])
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_frozen_lake_coordinate_text_is_the_references(fmt, seed):
    env, params = _env("FrozenLake", fmt)
    seen = set()
    for s in _states("FrozenLake", fmt, seed):
        text = env.render_text(s, params)
        assert text == _frozen_lake_ref(s).render(fmt)
        seen.update(line.split(":")[0] for line in text.split("\n"))
        _check_masks(env, s, params)
    assert {"Start", "Goal", "Player", "Holes"} <= seen
    assert {"Player on goal", "Player in hole"} & seen  # random play ends somewhere, mostly in holes


def test_frozen_lake_hand_states():
    env, params = envs_jax.make("CoordFrozenLake")
    state = state_from_rows(["SFFH", "FHFF", "FFFF", "HFFG"])
    assert env.render_text(state, params) == (
        "Coordinates: \nBoard size: 4 rows x 4 cols (zero-indexed).\nStart: (0, 0)\nGoal: (3, 3)\n"
        "Player: (0, 0)\nHoles: (0, 3), (1, 1), (3, 0)\nGrid Map: \nP__O\n_O__\n____\nO__G")
    lines = env.render_text(state.replace(pos=jnp.int32(5)), params).split("\n")
    assert lines[4:6] == ["Player in hole: (1, 1)", "Holes: (0, 3), (1, 1), (3, 0)"]
    lines = env.render_text(state.replace(pos=jnp.int32(15)), params).split("\n")
    assert lines[3:5] == ["Goal: (3, 3)", "Player on goal: (3, 3)"]
    no_holes = state_from_rows(["SFFF", "FFFF", "FFFF", "FFFG"])
    assert "Holes" not in env.render_text(no_holes, params)
    big, big_params = envs_jax.make("FrozenLake", size=12, observation_format="coord")
    text = big.render_text(state_from_rows(["S" + "F" * 11] + ["F" * 12] * 10 + ["F" * 10 + "HG"]), big_params)
    assert text == ("Board size: 12 rows x 12 cols (zero-indexed).\nStart: (0, 0)\nGoal: (11, 11)\n"
                    "Player: (0, 0)\nHoles: (11, 10)")


def test_instructions_are_ragen2s():
    want = yaml.safe_load(ENVS_YAML)
    env, params = envs_jax.make("CoordSokoban")
    assert env.instructions(params) == want["CoordSokoban"]["env_instruction"]
    assert env.instructions(params).endswith("</answer>.\n")  # the literal block's final newline
    env, params = envs_jax.make("CoordFrozenLake")
    assert env.instructions(params) == want["CoordFrozenLake"]["env_instruction"]
    # ctx_manager: the symbol legend only in "grid" format, the coordinate hint only in "coord".
    hint = ("\nStates are provided as coordinate lists using zero-based indexing with the format (row, col) "
            "for each entity type: Walls, Targets, Boxes, Boxes on target, Player, and Player on target "
            "when applicable.")
    for name in ("Sokoban", "FrozenLake"):
        grid_env, grid_params = envs_jax.make(name)
        base = grid_env.instructions(grid_params).split("\nThe meaning of each symbol")[0]
        env, params = envs_jax.make(name, observation_format="grid_coord")
        assert env.instructions(params) == base
        env, params = envs_jax.make(name, observation_format="coord")
        assert env.instructions(params) == base + hint
    env, params = envs_jax.make("Sokoban", instruction="coord", observation_format="grid")
    assert env.instructions(params).startswith(want["CoordSokoban"]["env_instruction"] + "\nThe meaning of")


def test_grid_format_is_unchanged():
    """The default format renders exactly the grid, as before coordinates existed."""
    for name in ("Sokoban", "FrozenLake", "Bandit"):
        env, params = envs_jax.make(name)
        assert env.observation_format(params) == "grid" and env.coordinate_labels(params) == ()
        _, s = env.reset_env(jax.random.key(0), params)
        assert env.render_text(s, params) == env.grid_text(s, params)
