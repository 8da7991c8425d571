"""Sudoku on device (RAGEN-2's `sudoku`: SimpleSudoku, MediumSudoku; ragen/env/sudoku).

Rules (the reference's):
- grid_size 4, 9 or 16 (boxes of sqrt(grid_size)). Reset fills a random solution by randomised
  backtracking (cells in row-major order, a fresh random digit order each time a cell is entered
  going forward, as its `fill_grid`), then empties `int(n * n * f)` uniformly random cells,
  f = 0.4 / 0.5 / 0.6 for difficulty easy / medium / hard. The puzzle may have several solutions;
  the drawn one is `solution`.
- An action places a digit: index (row * n + col) * n + (digit - 1), written "row,col,digit"
  (1-based, the reference's positional format). Every action counts as a step.
- Placing on a given cell, or a digit already in the cell's row, column or box (the cell's own
  current digit included), is invalid: reward `invalid_action_score` (-0.1), nothing changes and
  the episode never ends on it. Otherwise the digit is placed (a placed digit may be overwritten):
  reward 1.0 if it is the solution's digit, else 0.5, plus `completion_bonus` (10) when the grid is
  full (no placement ever makes a conflict, so full = solved). The episode ends on a valid
  placement that solves the grid or reaches `max_steps` (81) steps; RAGEN's env manager cuts
  it at max_actions_per_traj (20 SimpleSudoku, 30 MediumSudoku) = `max_steps_in_episode`.
- The reference takes free text in six forms ("place 5 at row 2 col 3", "(2,3,5)", "2,3,5", ...) and
  pays -0.1 for text it cannot parse or numbers out of range: the text layer reads the six forms into
  these indices (ragen_jax/text/placement.py) and gives an unreadable piece the format penalty (such
  answers never reach the env as an action).
The state keeps the last action's outcome (`feedback`, `last`) for the reference's feedback lines.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces

from envs_jax.base import AgentEnv

GRID_SIZES = (4, 9, 16)
REMOVED_FRACTION = {"easy": 0.4, "medium": 0.5, "hard": 0.6}
RENDER_FORMATS = ("simple", "detailed", "with_feedback")
# Outcome of the last action (state.feedback).
NO_FEEDBACK, GIVEN_CELL, CONFLICT, CORRECT, VALID_NOT_SOLUTION = range(5)
# The reference's config/envs.yaml env_instruction of SimpleSudoku and MediumSudoku (a YAML literal block).
ENV_INSTRUCTION = (
    "You are solving a Sudoku puzzle. Fill in the grid so that every row, column, and 3x3 box contains the "
    "numbers 1-9 without repetition.\n"
    "Initial cells are shown in [brackets] and cannot be modified. Empty cells are shown as dots (.).\n"
    "Place numbers one at a time using the format: <answer>place 5 at row 2 col 3</answer> or "
    "<answer>2,3,5</answer>\n"
    "The environment will provide feedback on valid/invalid moves and show conflicts if any occur.\n"
)


@struct.dataclass
class SudokuState:
    grid: jax.Array  # int32[n, n] current digits, 0 = empty
    given: jax.Array  # bool[n, n] the puzzle's initial cells
    solution: jax.Array  # int32[n, n] the drawn solution
    feedback: jax.Array  # int32 outcome of the last action (NO_FEEDBACK ... VALID_NOT_SOLUTION)
    last: jax.Array  # int32[3] (row, col, digit) of the last action, 0-based row and col
    time: jax.Array  # int32
    done: jax.Array  # bool


@struct.dataclass
class SudokuParams:
    grid_size: int = struct.field(pytree_node=False, default=9)
    difficulty: str = struct.field(pytree_node=False, default="easy")
    max_steps: int = struct.field(pytree_node=False, default=81)  # the reference env's own limit (text, done)
    max_steps_in_episode: int = struct.field(pytree_node=False, default=20)  # max_actions_per_traj
    render_format: str = struct.field(pytree_node=False, default="with_feedback")
    show_conflicts: bool = struct.field(pytree_node=False, default=True)
    show_valid_numbers: bool = struct.field(pytree_node=False, default=True)
    correct_placement_score: float = 1.0
    invalid_action_score: float = -0.1
    completion_bonus: float = 10.0
    # Bounds of the in-graph backtracking (a fill that runs out falls back to a relabelled pattern grid).
    fill_iterations: int = struct.field(pytree_node=False, default=20_000)
    solve_iterations: int = struct.field(pytree_node=False, default=200_000)


# ---- pure rule functions ------------------------------------------------------------------------
def _peers(n: int, row, col) -> jax.Array:
    b = int(round(n ** 0.5))
    rows, cols = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    return (rows == row) | (cols == col) | ((rows // b == row // b) & (cols // b == col // b))


def used_digits(grid: jax.Array, row, col) -> jax.Array:
    """bool[n + 1]: digits present in the cell's row, column or box (index 0 = empty, ignore)."""
    n = grid.shape[0]
    return jnp.zeros(n + 1, bool).at[jnp.where(_peers(n, row, col), grid, 0).reshape(-1)].set(True)


def digit_used(grid: jax.Array, row, col, digit) -> jax.Array:
    """bool: `digit` (>= 1) is in the cell's row, column or box; `used_digits(...)[digit]` without the
    scatter, which XLA:CPU runs element by element (it was most of a step's cost)."""
    return jnp.any(_peers(grid.shape[0], row, col) & (grid == digit))


def backtrack(grid: jax.Array, key: jax.Array | None, max_iters: int):
    """Fill the empty cells of `grid` by depth-first search in row-major order -> (grid, ok).

    key None: digits tried in increasing order (a solver); otherwise a fresh random order each time
    a cell is entered going forward (the reference's randomised fill). ok = every cell filled within
    `max_iters` iterations (a puzzle without solution or out of iterations gives ok False).
    """
    n = grid.shape[0]
    cells = n * n
    fixed = grid.reshape(-1) != 0

    def body(c):
        flat, order, ptr, pos, forward, it = c
        r, col = pos // n, pos % n
        fresh = forward & ~fixed[pos]
        new_order = jnp.arange(1, n + 1) if key is None else jax.random.permutation(jax.random.fold_in(key, it),
                                                                                     jnp.arange(1, n + 1))
        order = order.at[pos].set(jnp.where(fresh, new_order, order[pos]))
        ptr = ptr.at[pos].set(jnp.where(fresh, 0, ptr[pos]))
        cleared = flat.at[pos].set(0)
        ok = ~used_digits(cleared.reshape(n, n), r, col)[order[pos]] & (jnp.arange(n) >= ptr[pos])
        k = jnp.argmax(ok)
        place = ~fixed[pos] & jnp.any(ok)
        step_back = ~fixed[pos] & ~jnp.any(ok)
        flat = jnp.where(place, cleared.at[pos].set(order[pos, k]), jnp.where(step_back, cleared, flat))
        ptr = ptr.at[pos].set(jnp.where(place, k + 1, ptr[pos]))
        direction = jnp.where(fixed[pos], jnp.where(forward, 1, -1), jnp.where(place, 1, -1))
        return flat, order, ptr, pos + direction, direction > 0, it + 1

    def cond(c):
        return (c[3] >= 0) & (c[3] < cells) & (c[5] < max_iters)

    init = (grid.reshape(-1).astype(jnp.int32), jnp.zeros((cells, n), jnp.int32), jnp.zeros(cells, jnp.int32),
            jnp.int32(0), jnp.bool_(True), jnp.int32(0))
    flat, _, _, pos, _, _ = jax.lax.while_loop(cond, body, init)
    return flat.reshape(n, n), pos == cells


def pattern_solution(key: jax.Array, n: int) -> jax.Array:
    """A valid full grid (the shifted pattern) with randomly relabelled digits: the fill's fallback."""
    b = int(round(n ** 0.5))
    r, c = np.arange(n)[:, None], np.arange(n)[None, :]
    base = (b * (r % b) + r // b + c) % n
    return (jax.random.permutation(key, n)[jnp.asarray(base)] + 1).astype(jnp.int32)


def generate(key: jax.Array, params: SudokuParams):
    """(puzzle, solution) int32[n, n]: the reference's randomised fill, then `int(n*n*f)` cells emptied."""
    n = params.grid_size
    k_fill, k_fallback, k_cells = jax.random.split(key, 3)
    solution, ok = backtrack(jnp.zeros((n, n), jnp.int32), k_fill, params.fill_iterations)
    solution = jnp.where(ok, solution, pattern_solution(k_fallback, n))
    removed = int(n * n * REMOVED_FRACTION[params.difficulty])
    emptied = jnp.zeros(n * n, bool).at[jax.random.permutation(k_cells, n * n)[:removed]].set(True)
    return jnp.where(emptied.reshape(n, n), 0, solution), solution


def decode(action: jax.Array, n: int):
    """(row, col, digit) of an action index (0-based row and col, digit 1..n)."""
    return action // (n * n), (action // n) % n, action % n + 1


def action_names(n: int) -> tuple[str, ...]:
    return tuple(f"{r + 1},{c + 1},{d + 1}" for r in range(n) for c in range(n) for d in range(n))


# ---- the reference's text (host side) -------------------------------------------------------------
def conflict_cells(grid: np.ndarray) -> set:
    """Cells whose digit repeats in their row, column or box (the reference's find_conflicts)."""
    n = grid.shape[0]
    b = int(round(n ** 0.5))
    out = set()
    for r in range(n):
        for c in range(n):
            v = grid[r, c]
            if v and ((grid[r] == v).sum() > 1 or (grid[:, c] == v).sum() > 1
                      or (grid[r // b * b:r // b * b + b, c // b * b:c // b * b + b] == v).sum() > 1):
                out.add((r, c))
    return out


def valid_numbers(grid: np.ndarray, r: int, c: int) -> list[int]:
    """Host side (rendering is per step in tests: numpy, not eager jax ops)."""
    if grid[r, c]:
        return []
    b = int(round(grid.shape[0] ** 0.5))
    used = set(grid[r].tolist()) | set(grid[:, c].tolist()) | set(
        grid[r // b * b:r // b * b + b, c // b * b:c // b * b + b].reshape(-1).tolist())
    return [d for d in range(1, grid.shape[0] + 1) if d not in used]


def grid_text(grid: np.ndarray, given: np.ndarray, conflicts: set, simple: bool) -> str:
    n = grid.shape[0]
    b = int(round(n ** 0.5))
    lines = []
    for i in range(n):
        if i and i % b == 0:
            lines.append("-" * (n * (2 if simple else 3) + b - 1))
        row = ""
        for j in range(n):
            row += "| " if j and j % b == 0 else ""
            v = int(grid[i, j])
            if simple:
                row += (str(v) if v else ".") + " "
            else:
                row += " . " if v == 0 else f"[{v}]" if given[i, j] else f"*{v}*" if (i, j) in conflicts else f" {v} "
        lines.append(row.rstrip())
    return "\n".join(lines)


def feedback_text(grid: np.ndarray, kind: int, last) -> str:
    """The reference's last_action_feedback from the stored outcome (grid: after the action)."""
    r, c, d = (int(x) for x in last)
    n = grid.shape[0]
    b = int(round(n ** 0.5))
    if kind == GIVEN_CELL:
        return f"❌ Cannot modify initial cell at ({r + 1},{c + 1})"
    if kind == CONFLICT:
        where = [name for name, hit in ((f"row {r + 1}", d in grid[r]), (f"column {c + 1}", d in grid[:, c]),
                 (f"box ({r // b + 1},{c // b + 1})", d in grid[r // b * b:r // b * b + b, c // b * b:c // b * b + b]))
                 if hit]
        text = f"❌ Invalid placement: {d} conflicts with {', '.join(where)}"
        valid = valid_numbers(grid, r, c)
        return text + (f"\n   Valid numbers for ({r + 1},{c + 1}): {valid}" if valid else "")
    if kind in (CORRECT, VALID_NOT_SOLUTION):
        text = (f"✓ Correct! Placed {d} at ({r + 1},{c + 1})" if kind == CORRECT
                else f"⚠ Placed {d} at ({r + 1},{c + 1}) - Valid but not optimal")
        return text + ("\n🎉 Congratulations! Puzzle solved!" if not (grid == 0).any() else "")
    return ""


def observation_text(state, params: SudokuParams) -> str:
    """The reference's render in `params.render_format` of a single (host) state."""
    grid, given = np.asarray(state.grid), np.asarray(state.given)
    if params.render_format == "simple":
        return grid_text(grid, given, set(), simple=True)
    conflicts = conflict_cells(grid)
    out = ["=" * 50, "SUDOKU PUZZLE", "=" * 50, grid_text(grid, given, conflicts, simple=False), "",
           "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty"]
    feedback = feedback_text(grid, int(state.feedback), np.asarray(state.last))
    if feedback:
        out += ["", feedback]
    if params.render_format == "detailed":
        return "\n".join(out)
    if params.show_conflicts and conflicts:
        out += ["", "⚠ CONFLICTS DETECTED:", *(f"  - Cell ({r + 1},{c + 1}): {grid[r, c]}" for r, c in sorted(conflicts))]
    empty = list(zip(*np.where(grid == 0)))
    if params.show_valid_numbers and empty and len(empty) <= 10:
        out += ["", "💡 VALID NUMBERS FOR EMPTY CELLS:"]
        out += [f"  - ({r + 1},{c + 1}): {v}" for r, c in empty[:10] if not given[r, c]
                for v in [valid_numbers(grid, r, c)] if v]
    filled, initial = int(np.count_nonzero(grid)), int(given.sum())
    out += ["", f"Progress: {filled}/{grid.size} cells filled ({initial} initial, {filled - initial} placed)",
            f"Steps: {int(state.time)}/{params.max_steps}"]
    return "\n".join(out)


# ---- the reference's text as slots (the text layer assembles it in-graph) ------------------------
# Why these cuts. Every piece ends where Qwen's pre-tokenizer always splits: right after a digit (a
# digit is a pre-token of its own), after a cell's "." (always followed by its space), before a "\n"
# that follows a letter, or after the "\n"s that a punctuation run absorbs (")\n\n" is one
# pre-token, so every section after the legend carries the blank line that follows it). Grid piece
# (i, j) runs from just after cell (i, j-1)'s digit or dot through cell (i, j)'s, so it depends on
# the previous cell's closing character and its own kind only. Conflicts never show: a conflicting
# placement is refused, so "*N*" and "CONFLICTS DETECTED" cannot occur.
VALID_LINES = 10  # the reference lists valid numbers only when at most 10 cells are empty
LEGEND = "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty"
BANNER = "=" * 50 + "\nSUDOKU PUZZLE\n" + "=" * 50 + "\n"
SOLVED_LINE = "\n🎉 Congratulations! Puzzle solved!"
NOT_OPTIMAL = " - Valid but not optimal"


def digit_list_text(mask: int, n: int) -> str:
    """The reference's list of valid numbers for a bit mask (bit d-1 = digit d)."""
    return str([d for d in range(1, n + 1) if mask >> (d - 1) & 1])


def conflict_places(r: int, c: int, mask: int, n: int) -> str:
    b = int(round(n ** 0.5))
    names = (f"row {r + 1}", f"column {c + 1}", f"box ({r // b + 1},{c // b + 1})")
    return ", ".join(w for k, w in enumerate(names) if mask >> k & 1)


def cell_alternatives(params: SudokuParams, i: int, j: int) -> tuple[str, ...]:
    """Grid piece (i, j), index prev * (1 + 2n) + kind: prev 1 when cell (i, j-1) is given (it closes
    with "]"), kind 0 empty, d a given d, n + d a placed d. The last piece carries the legend and the
    blank line after it."""
    n = params.grid_size
    b = int(round(n ** 0.5))
    lead = (BANNER if i == j == 0 else "") + ("-" * (3 * n + b - 1) + "\n" if j == 0 and i and i % b == 0 else "")
    sep = "| " if j and j % b == 0 else ""
    out = []
    for prev in (0, 1):
        for kind in range(1 + 2 * n):
            d = (kind - 1) % n + 1
            text = lead + ("" if j == 0 else "]" if prev else " ") + sep
            text += " ." if kind == 0 else f"[{d}" if kind <= n else f" {d}"
            if j == n - 1:
                text += ("]" if 0 < kind <= n else "") + "\n"
                text += f"\n{LEGEND}\n\n" if i == n - 1 else ""
            out.append(text)
    return tuple(out)


def feedback_alternatives(params: SudokuParams) -> tuple[tuple[str, ...], ...]:
    """Three slots: the head up to "(" (a conflict's whole first line, see feedback_index), "r,c",
    and the rest with the blank line after it."""
    n = params.grid_size
    head = ["", "❌ Cannot modify initial cell at ("]
    head += [f"✓ Correct! Placed {d} at (" for d in range(1, n + 1)]
    head += [f"⚠ Placed {d} at (" for d in range(1, n + 1)]
    head += [f"❌ Invalid placement: {d} conflicts with {conflict_places(r, c, mask, n)}"
             + ("\n   Valid numbers for (" if listed else "\n\n")
             for r in range(n) for c in range(n) for d in range(1, n + 1) for mask in range(1, 8)
             for listed in (0, 1)]
    where = [""] + [f"{r + 1},{c + 1}" for r in range(n) for c in range(n)]
    rest = ["", ")\n\n", f"){SOLVED_LINE}\n\n", f"){NOT_OPTIMAL}\n\n", f"){NOT_OPTIMAL}{SOLVED_LINE}\n\n"]
    rest += [f"): {digit_list_text(m, n)}\n\n" for m in range(1, 2 ** n)]
    return tuple(head), tuple(where), tuple(rest)


def valid_alternatives(params: SudokuParams) -> tuple[tuple[str, ...], ...]:
    """The header ("" / lines follow / no line follows), then per listed cell "  - (r,c" and
    "): [..]\n" ("\n\n" after the last one)."""
    n = params.grid_size
    header = ("", "💡 VALID NUMBERS FOR EMPTY CELLS:\n", "💡 VALID NUMBERS FOR EMPTY CELLS:\n\n")
    cell = ("",) + tuple(f"  - ({r + 1},{c + 1}" for r in range(n) for c in range(n))
    lists = ("",) + tuple(f"): {digit_list_text(m, n)}\n" + ("\n" if last else "")
                          for m in range(1, 2 ** n) for last in (0, 1))
    return (header, *((cell, lists) * VALID_LINES))


def progress_alternatives(params: SudokuParams) -> tuple[tuple[str, ...], ...]:
    cells = params.grid_size ** 2
    counts = range(cells + 1)
    return (tuple(f"Progress: {k}" for k in counts), tuple(f"/{cells} cells filled ({k}" for k in counts),
            tuple(f" initial, {k}" for k in counts),
            tuple(f" placed)\nSteps: {t}" for t in range(params.max_steps + 1)), (f"/{params.max_steps}\n",))


def text_slots(params: SudokuParams) -> tuple[tuple[str, ...], ...]:
    """Alternatives per slot of the `with_feedback` text, its final newline included (see above)."""
    if params.render_format != "with_feedback":
        raise ValueError(f"the text layer renders Sudoku's render_format 'with_feedback' (the reference's for its "
                         f"tags), got {params.render_format!r}; set render_format='with_feedback'")
    n = params.grid_size
    cells = tuple(cell_alternatives(params, i, j) for i in range(n) for j in range(n))
    return (*cells, *feedback_alternatives(params), *valid_alternatives(params), *progress_alternatives(params))


def valid_masks(grid: jax.Array) -> jax.Array:
    """int32[n * n]: bit d-1 set when digit d can go in the (empty) cell; 0 for filled cells."""
    n = grid.shape[0]
    cells = jnp.arange(n * n)
    used = jax.vmap(lambda k: used_digits(grid, k // n, k % n))(cells)[:, 1:]
    bits = jnp.sum(jnp.where(used, 0, 1 << jnp.arange(n)), axis=1)
    return jnp.where(grid.reshape(-1) == 0, bits, 0).astype(jnp.int32)


def feedback_index(state: SudokuState, masks: jax.Array, params: SudokuParams) -> jax.Array:
    """int32[3]: the feedback slots' alternatives."""
    n = params.grid_size
    b = int(round(n ** 0.5))
    r, c, d = state.last[0], state.last[1], state.last[2]
    kind, grid = state.feedback, state.grid
    full = jnp.all(grid != 0)
    rows, cols = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    hits = jnp.stack([jnp.any(grid[r] == d), jnp.any(grid[:, c] == d),
                      jnp.any((grid == d) & (rows // b == r // b) & (cols // b == c // b))])
    place = jnp.sum(hits * jnp.array([1, 2, 4])) - 1
    listed = masks[r * n + c]
    conflict_head = 2 + 2 * n + (((r * n + c) * n + d - 1) * 7 + place) * 2 + (listed > 0)
    head = jnp.select([kind == GIVEN_CELL, kind == CORRECT, kind == VALID_NOT_SOLUTION, kind == CONFLICT],
                      [1, 1 + d, 1 + n + d, conflict_head], 0)
    shown = (kind != NO_FEEDBACK) & ((kind != CONFLICT) | (listed > 0))
    rest = jnp.select([kind == GIVEN_CELL, kind == CORRECT, kind == VALID_NOT_SOLUTION, kind == CONFLICT],
                      [1, 1 + full, 3 + full, 4 + listed], 0)
    return jnp.stack([head, jnp.where(shown, 1 + r * n + c, 0), jnp.where(shown, rest, 0)])


def valid_index(state: SudokuState, masks: jax.Array, params: SudokuParams) -> jax.Array:
    """int32[1 + 2 * VALID_LINES]: the valid-numbers block's alternatives."""
    n = params.grid_size
    empty = jnp.sum(state.grid == 0)
    show = (empty >= 1) & (empty <= VALID_LINES) & params.show_valid_numbers
    listed = show & (masks > 0)  # empty cells are never given; all of them are among the first 10
    count = jnp.sum(listed)
    cells = jnp.nonzero(listed, size=VALID_LINES, fill_value=0)[0]
    line = jnp.arange(VALID_LINES)
    live = line < count
    cell = jnp.where(live, 1 + cells, 0)
    lists = jnp.where(live, 1 + 2 * (masks[cells] - 1) + (line == count - 1), 0)
    header = jnp.where(show, jnp.where(count > 0, 1, 2), 0)
    return jnp.concatenate([header[None], jnp.stack([cell, lists], axis=1).reshape(-1)])


def text_slot_index(state: SudokuState, params: SudokuParams) -> jax.Array:
    """int32[len(text_slots(params))]: each slot's alternative for `state` (jittable)."""
    n = params.grid_size
    g = state.grid
    kind = jnp.where(g == 0, 0, jnp.where(state.given, g, n + g))
    prev = jnp.pad(state.given[:, :-1], ((0, 0), (1, 0))).astype(jnp.int32)
    masks = valid_masks(g)
    filled = jnp.sum(g != 0)
    initial = jnp.sum(state.given)
    progress = jnp.stack([filled, initial, filled - initial, jnp.clip(state.time, 0, params.max_steps), 0])
    return jnp.concatenate([(prev * (1 + 2 * n) + kind).reshape(-1), feedback_index(state, masks, params),
                            valid_index(state, masks, params), progress]
                           ).astype(jnp.int32)


# ---- the environment -----------------------------------------------------------------------------
class Sudoku(AgentEnv):
    """Sudoku; `success` = the grid is full (and so solved)."""

    @property
    def default_params(self) -> SudokuParams:
        return SudokuParams()

    @property
    def num_actions(self) -> int:
        return self.default_params.grid_size ** 3

    def action_space(self, params=None):
        return spaces.Discrete((params or self.default_params).grid_size ** 3)

    def observation_space(self, params=None):
        n = (params or self.default_params).grid_size
        return spaces.Box(0, n, (n, n), jnp.int32)

    def validate_params(self, params: SudokuParams) -> None:
        """Raise ValueError for parameters the env cannot honour."""
        if params.grid_size not in GRID_SIZES:
            raise ValueError(f"grid_size must be one of 4, 9, 16, got {params.grid_size!r}")
        if params.difficulty not in REMOVED_FRACTION:
            raise ValueError(f"difficulty must be one of easy, medium, hard, got {params.difficulty!r}")
        if params.render_format not in RENDER_FORMATS:
            raise ValueError(f"render_format must be one of {', '.join(RENDER_FORMATS)}, got {params.render_format!r}")
        for name in ("max_steps", "max_steps_in_episode", "fill_iterations", "solve_iterations"):
            value = getattr(params, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    def reset_env(self, key, params):
        puzzle, solution = generate(key, params)
        state = SudokuState(grid=puzzle, given=puzzle != 0, solution=solution, feedback=jnp.int32(NO_FEEDBACK),
                            last=jnp.zeros(3, jnp.int32), time=jnp.int32(0), done=jnp.bool_(False))
        return self.get_obs(state, params), state

    def transition(self, key, state, action, params):
        r, c, d = decode(action, params.grid_size)
        given = state.given[r, c]
        conflict = digit_used(state.grid, r, c, d)
        valid = ~given & ~conflict
        grid = jnp.where(valid, state.grid.at[r, c].set(d), state.grid)
        correct = d == state.solution[r, c]
        solved = valid & jnp.all(grid != 0)
        reward = jnp.where(valid, jnp.where(correct, 1.0, 0.5) * params.correct_placement_score, params.invalid_action_score)
        reward = reward + jnp.where(solved, params.completion_bonus, 0.0)
        feedback = jnp.where(given, GIVEN_CELL, jnp.where(conflict, CONFLICT,
                                                          jnp.where(correct, CORRECT, VALID_NOT_SOLUTION)))
        new = state.replace(grid=grid, feedback=feedback.astype(jnp.int32),
                            last=jnp.stack([r, c, d]).astype(jnp.int32))
        terminated = valid & (solved | (state.time + 1 >= params.max_steps))
        return new, reward, terminated, {"action_is_effective": valid}

    def is_success(self, state, params):
        return jnp.all(state.grid != 0)

    # The text layer reads each answer piece in the reference's six free-text forms
    # (ragen_jax/text/placement.py) into the index of its "row,col,digit" name.
    answer_format = "placement"

    def action_names(self, params) -> tuple[str, ...]:
        return action_names(params.grid_size)

    def instructions(self, params) -> str:
        return ENV_INSTRUCTION

    def symbols(self, params) -> tuple[str, ...]:
        return (".",) + tuple(str(d) for d in range(1, params.grid_size + 1))

    def render_grid(self, state, params):
        return state.grid

    # The text layer assembles the reference's text from slot tables (TextEnv "slots").
    def lists_actions(self, params) -> bool:
        return False  # the reference's Sudoku has no action_lookup: its 729 "row,col,digit" names stay unlisted

    def observation_format(self, params) -> str:
        return "slots"

    def text_slots(self, params) -> tuple[tuple[str, ...], ...]:
        return text_slots(params)

    def text_slot_index(self, state, params) -> jax.Array:
        return text_slot_index(state, params)

    def render_text(self, state, params) -> str:
        return observation_text(jax.device_get(state), params)

    def solve(self, state, params):
        """Backtracking solution of the current grid, digits tried in increasing order -> (grid, ok)
        (jittable). It may differ from `state.solution` where the puzzle has several."""
        return backtrack(state.grid, None, params.solve_iterations)

    def teacher_action(self, key, state, params):
        """The first empty cell in row-major order with the drawn solution's digit (full reward)."""
        n = params.grid_size
        cell = jnp.argmax(state.grid.reshape(-1) == 0)
        return (cell * n + state.solution.reshape(-1)[cell] - 1).astype(jnp.int32)
