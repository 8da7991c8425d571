"""Coordinate observations (RAGEN-2's `observation_format`): the host texts, one definition.

RAGEN-2 (`ragen/env/sokoban/utils.py`, `ragen/env/frozen_lake/utils.py`: `format_coordinate_render`;
the envs' `_render_text`) can show a state as

    "grid"        the symbol grid (RAGEN v1's only form);
    "coord"       `Board size: H rows x W cols (zero-indexed).` then one line per non-empty entity
                  category, `Label: (r, c), (r, c)` with the cells in row-major order;
    "grid_coord"  `Coordinates: \\n` + the coord text + `\\n` + `Grid Map: \\n` + the grid.

(The trailing spaces of `Coordinates: ` and `Grid Map: ` are the reference's.) The strings below are
what the envs' host `render_text` prints and what the text layer tokenizes into its in-graph tables
(ragen_jax/text/render.py `CoordTable`); the pieces are cut where Qwen's pre-tokenizer always
splits (before a digit, after `(`, after a newline), which the text tests check against the
tokenizer over many random states.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

FORMATS = ("grid", "grid_coord", "coord")
COORDINATES_HEADER = "Coordinates: \n"
GRID_HEADER = "Grid Map: \n"
# ctx_manager._init_prefix_lookup appends this to the env instruction in "coord" format (instead of
# the symbol legend, which it appends in "grid" format only). Verbatim, Sokoban's names included
# also for FrozenLake: the reference uses one hint for every env.
COORD_HINT = (
    "\nStates are provided as coordinate lists using zero-based indexing with the format (row, col) "
    "for each entity type: Walls, Targets, Boxes, Boxes on target, Player, and Player on target "
    "when applicable."
)


def check_format(fmt) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"observation_format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def board_line(height: int, width: int) -> str:
    return f"Board size: {height} rows x {width} cols (zero-indexed)."


def cell_text(row: int, col: int) -> str:
    return f"{row}, {col}"


def cells_of(mask) -> list[tuple[int, int]]:
    """(row, col) of the True cells of a 2-D mask, row-major (numpy's argwhere order)."""
    return [(int(r), int(c)) for r, c in np.argwhere(np.asarray(mask))]


def coordinate_text(entities: Sequence[tuple[str, Sequence[tuple[int, int]]]], height: int, width: int) -> str:
    """The reference's format_coordinate_render: board line, then `Label: (r, c), ...` per non-empty entry."""
    lines = [board_line(height, width)]
    for label, cells in entities:
        if len(cells):
            lines.append(f"{label}: " + ", ".join(f"({cell_text(r, c)})" for r, c in cells))
    return "\n".join(lines)


def observation_text(fmt: str, entities, height: int, width: int, grid_text: str) -> str:
    """The state text in observation format `fmt` (the reference envs' `_render_text`)."""
    if fmt == "grid":
        return grid_text
    coords = coordinate_text(entities, height, width)
    if fmt == "coord":
        return coords
    return COORDINATES_HEADER + coords + "\n" + GRID_HEADER + grid_text


def instruction_for_format(instruction: str, fmt: str, legend: str) -> str:
    """The reference's env instruction for a format: + the symbol legend ("grid") or the coord hint ("coord")."""
    if fmt == "grid":
        return instruction + "\nThe meaning of each symbol in the state is:\n" + legend
    if fmt == "coord":
        return instruction + COORD_HINT
    return instruction
