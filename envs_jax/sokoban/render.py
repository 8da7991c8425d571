"""Sokoban text: grid codes (jittable), the symbol sets and the instruction with its legend."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from envs_jax.sokoban.types import (
    BOX, BOX_ON_TARGET, CELL_NAMES, ENV_INSTRUCTION, FLOOR, PLAYER, PLAYER_ON_TARGET, SYMBOL_SETS,
    TARGET, WALL, SokobanState,
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


def instructions(symbol_set: str) -> str:
    """env_instruction + the legend of the symbols IN USE.

    The reference appends "\\nThe meaning of each symbol in the state is:\\n" + legend, then the
    action list; the action list and the action budget belong to the text layer. (The reference's
    NewSymbols prompt showed the standard legend, a bug we do not copy.)
    """
    return ENV_INSTRUCTION + "\nThe meaning of each symbol in the state is:\n" + legend(symbol_set)
