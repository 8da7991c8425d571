"""Sokoban text: grid codes (jittable), the symbol sets and the instruction with its legend."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import numpy as np

from envs_jax import coords
from envs_jax.sokoban.types import (
    BOX, BOX_ON_TARGET, CELL_NAMES, COORD_LABELS, FLOOR, INSTRUCTIONS, PLAYER, PLAYER_ON_TARGET,
    SYMBOL_SETS, TARGET, WALL, SokobanState,
)


def render_grid(state: SokobanState) -> jax.Array:
    """int32[H, W] cell codes 0..6 (wall, floor, target, box on target, box, player, player on target).

    Same precedence as the reference renderer: player over box over target over floor.
    """
    h, w = state.walls.shape
    walls = state.walls.reshape(-1)
    targets = state.targets.reshape(-1)
    cells = jnp.arange(h * w, dtype=jnp.int32)
    grid = jnp.where(walls, WALL, jnp.where(targets, TARGET, FLOOR))
    has_box = jnp.any(cells[:, None] == state.boxes[None, :], axis=1)
    grid = jnp.where(has_box, jnp.where(targets, BOX_ON_TARGET, BOX), grid)
    grid = jnp.where(cells == state.player, jnp.where(targets, PLAYER_ON_TARGET, PLAYER), grid)
    return grid.reshape(h, w).astype(jnp.int32)


def symbols(symbol_set: str) -> tuple[str, ...]:
    return SYMBOL_SETS[symbol_set]


def legend(symbol_set: str) -> str:
    """The reference's grid_vocab line, e.g. `#: wall, _: empty, O: target, ...`."""
    return ", ".join(f"{s}: {name}" for s, name in zip(SYMBOL_SETS[symbol_set], CELL_NAMES))


def instructions(symbol_set: str, instruction: str = "standard", observation_format: str = "grid") -> str:
    """env_instruction + the legend of the symbols IN USE (grid format; see coords.instruction_for_format).

    The reference appends "\\nThe meaning of each symbol in the state is:\\n" + legend, then the
    action list; the action list and the action budget belong to the text layer. (The reference's
    NewSymbols prompt showed the standard legend, a bug we do not copy.) RAGEN-2 appends the legend
    only in "grid" format: CoordSokoban's prompt has none.
    """
    return coords.instruction_for_format(INSTRUCTIONS[instruction], observation_format, legend(symbol_set))


def coordinate_masks(state: SokobanState) -> jax.Array:
    """bool[5, H, W]: the cells of each COORD_LABELS line, from the grid codes (jittable).

    Targets lists every target cell, covered or not (the reference's room_fixed == 2).
    """
    grid = render_grid(state)
    return jnp.stack([
        (grid == TARGET) | (grid == BOX_ON_TARGET) | (grid == PLAYER_ON_TARGET),
        grid == BOX,
        grid == BOX_ON_TARGET,
        grid == PLAYER,
        grid == PLAYER_ON_TARGET,
    ])


def coordinate_entities(state: SokobanState) -> list[tuple[str, list[tuple[int, int]]]]:
    """Host side, from the state arrays (not the grid codes), as the reference's
    collect_entity_coordinates does from room_fixed / room_state."""
    targets = np.asarray(state.targets)
    h, w = targets.shape
    boxes = np.zeros(h * w, bool)
    boxes[np.asarray(state.boxes)] = True
    boxes = boxes.reshape(h, w)
    player = np.zeros(h * w, bool)
    player[int(state.player)] = True
    player = player.reshape(h, w)
    masks = (targets, boxes & ~targets, boxes & targets, player & ~targets, player & targets)
    return [(label, coords.cells_of(m)) for label, m in zip(COORD_LABELS, masks)]
