"""Sudoku in plain Python, written from the reference's code (RAGEN-2 ragen/env/sudoku/env.py, utils.py,
config.py): placements, their feedback lines and the "with_feedback" render. The puzzle and its
solution are inputs (the reference draws them with Python's `random`); actions are the reference's
free-text strings (`RefSudoku`) or action indices (r * n + c) * n + d - 1 (`Sudoku`, the benchmarks').
"""

from __future__ import annotations

import re

import numpy as np

# Outcome of a placement (the order of the JAX state's `feedback` codes, which `from_jax` reads).
NO_FEEDBACK, GIVEN_CELL, CONFLICT, CORRECT, VALID_NOT_SOLUTION = range(5)
PATTERNS = [r'place\s+(\d+)\s+at\s+row\s+(\d+)\s+col\s+(\d+)', r'place\s+(\d+)\s+at\s+\((\d+),\s*(\d+)\)',
            r'place\s+(\d+)\s+at\s+(\d+),\s*(\d+)', r'(\d+)\s+at\s+(\d+),\s*(\d+)',
            r'\((\d+),\s*(\d+),\s*(\d+)\)', r'(\d+),\s*(\d+),\s*(\d+)']


def box_size(n):
    return int(np.sqrt(n))


def is_valid_placement(grid, row, col, num):
    b = box_size(grid.shape[0])
    if num in grid[row, :] or num in grid[:, col]:
        return False
    br, bc = (row // b) * b, (col // b) * b
    return num not in grid[br:br + b, bc:bc + b]


def get_valid_numbers(grid, row, col):
    if grid[row, col] != 0:
        return set()
    n, b = grid.shape[0], box_size(grid.shape[0])
    nums = set(range(1, n + 1)) - (set(grid[row, :]) - {0}) - (set(grid[:, col]) - {0})
    br, bc = (row // b) * b, (col // b) * b
    return nums - (set(grid[br:br + b, bc:bc + b].flatten()) - {0})


def find_conflicts(grid):
    """The reference's conflict sets: cells whose digit repeats in their row, column or box. Counted on
    Python lists (the same sets as the reference's per-digit np.where / np.argwhere scans, which cost
    ~2 ms a grid over the ~6,000 grids the side-by-side test renders)."""
    n, b = grid.shape[0], box_size(grid.shape[0])
    g = grid.tolist()
    out = {"row": set(), "col": set(), "box": set()}

    def repeated(cells, key):
        values = [g[r][c] for r, c in cells]
        for num in {v for v in values if 1 <= v <= n and values.count(v) > 1}:
            out[key] |= {cell for cell, v in zip(cells, values) if v == num}

    for i in range(n):
        repeated([(i, c) for c in range(n)], "row")
        repeated([(r, i) for r in range(n)], "col")
    for br in range(b):
        for bc in range(b):
            repeated([(br * b + r, bc * b + c) for r in range(b) for c in range(b)], "box")
    return out


def find_conflicts_numpy(grid):
    """The reference's own scan, kept to check find_conflicts against (tests/envs_jax/test_sudoku.py)."""
    n, b = grid.shape[0], box_size(grid.shape[0])
    out = {"row": set(), "col": set(), "box": set()}
    for i in range(n):
        for num in range(1, n + 1):
            pos = np.where(grid[i, :] == num)[0]
            if len(pos) > 1:
                out["row"] |= {(i, int(p)) for p in pos}
            pos = np.where(grid[:, i] == num)[0]
            if len(pos) > 1:
                out["col"] |= {(int(p), i) for p in pos}
    for br in range(b):
        for bc in range(b):
            box = grid[br * b:br * b + b, bc * b:bc * b + b]
            for num in range(1, n + 1):
                pos = np.argwhere(box == num)
                if len(pos) > 1:
                    out["box"] |= {(br * b + int(p[0]), bc * b + int(p[1])) for p in pos}
    return out


def is_solved(grid):
    return not np.any(grid == 0) and not any(find_conflicts(grid).values())


def format_grid_with_conflicts(grid, initial, conflicts):
    n, b = grid.shape[0], box_size(grid.shape[0])
    every = conflicts["row"] | conflicts["col"] | conflicts["box"]
    lines = []
    for i, row in enumerate(grid):
        if i > 0 and i % b == 0:
            lines.append("-" * (n * 3 + b - 1))
        s = ""
        for j, val in enumerate(row):
            if j > 0 and j % b == 0:
                s += "| "
            s += " . " if val == 0 else f"[{val}]" if initial[i, j] != 0 else f"*{val}*" if (i, j) in every else f" {val} "
        lines.append(s.rstrip())
    return "\n".join(lines)


def placement(grid, initial, solution, row, col, num):
    """The outcome of placing `num` at (row, col) on `grid` (before the placement) -> (kind, the
    reference's last_action_feedback; for a valid placement its text without the solved line)."""
    if initial[row, col] != 0:
        return GIVEN_CELL, f"❌ Cannot modify initial cell at ({row+1},{col+1})"
    if not is_valid_placement(grid, row, col, num):
        conflicts = []
        if num in grid[row, :]:
            conflicts.append(f"row {row+1}")
        if num in grid[:, col]:
            conflicts.append(f"column {col+1}")
        b = box_size(grid.shape[0])
        br, bc = (row // b) * b, (col // b) * b
        if num in grid[br:br + b, bc:bc + b]:
            conflicts.append(f"box ({br//b+1},{bc//b+1})")
        text = f"❌ Invalid placement: {num} conflicts with {', '.join(conflicts)}"
        valid = get_valid_numbers(grid, row, col)
        if valid:
            text += f"\n   Valid numbers for ({row+1},{col+1}): {sorted(valid)}"
        return CONFLICT, text
    if num == solution[row, col]:
        return CORRECT, f"✓ Correct! Placed {num} at ({row+1},{col+1})"
    return VALID_NOT_SOLUTION, f"⚠ Placed {num} at ({row+1},{col+1}) - Valid but not optimal"


SOLVED_LINE = "\n🎉 Congratulations! Puzzle solved!"


class SudokuState:
    """The puzzle (given cells), its solution, the current grid, the steps taken and the last feedback."""

    def __init__(self, initial, solution, grid=None, time=0, feedback="", done=False):
        self.initial, self.solution = np.array(initial), np.array(solution)
        self.grid = self.initial.copy() if grid is None else np.array(grid)
        self.time, self.feedback, self.done = int(time), feedback, bool(done)

    def copy(self) -> "SudokuState":
        return SudokuState(self.initial, self.solution, self.grid, self.time, self.feedback, self.done)


class Sudoku:
    """The rules: a given cell or a conflicting digit scores `invalid` and changes nothing; a valid
    digit is placed and scores `correct` (half of it when it is not the solution's), plus `bonus`
    when the grid is solved. The episode ends solved, or after `max_actions` placements (RAGEN's
    max_actions_per_traj); the text counts steps against the env's own `max_steps`."""

    answer_format = "action"  # step(state, action index)

    def __init__(self, grid_size=9, max_steps=81, max_actions=None, scores=(1.0, -0.1, 10.0)):
        self.n, self.text_max_steps = grid_size, max_steps
        self.max_steps = max_steps if max_actions is None else max_actions
        self.correct, self.invalid, self.bonus = scores
        self.action_names = tuple(f"{r + 1},{c + 1},{d + 1}" for r in range(grid_size) for c in range(grid_size)
                                  for d in range(grid_size))

    def place(self, s: SudokuState, row, col, num):
        """-> (reward, solved, info); the state is updated in place."""
        s.time += 1
        kind, s.feedback = placement(s.grid, s.initial, s.solution, row, col, num)
        if kind in (GIVEN_CELL, CONFLICT):
            s.done = s.time >= self.max_steps
            return self.invalid, False, {"action_is_effective": False, "success": False}
        s.grid[row, col] = num
        reward = self.correct if kind == CORRECT else self.correct * 0.5
        solved = is_solved(s.grid)
        if solved:
            s.feedback += SOLVED_LINE
            reward += self.bonus
        s.done = solved or s.time >= self.max_steps
        return reward, solved, {"action_is_effective": True, "success": solved}

    def step(self, s: SudokuState, action: int, rng=None):
        """-> (new state, reward, done, info) for action index (r * n + c) * n + d - 1."""
        s = s.copy()
        n = self.n
        reward, _, info = self.place(s, action // (n * n), action // n % n, action % n + 1)
        return s, reward, s.done, info

    def render(self, s: SudokuState) -> str:
        """The reference's render_format "with_feedback" with show_conflicts and show_valid_numbers."""
        g = s.grid
        conflicts = find_conflicts(g)
        out = ["=" * 50, "SUDOKU PUZZLE", "=" * 50, format_grid_with_conflicts(g, s.initial, conflicts), "",
               "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty"]
        if s.feedback:
            out += ["", s.feedback]
        every = conflicts["row"] | conflicts["col"] | conflicts["box"]
        if every:
            out += ["", "⚠ CONFLICTS DETECTED:"] + [f"  - Cell ({r+1},{c+1}): {g[r, c]}" for r, c in sorted(every)]
        empty = list(zip(*np.where(g == 0)))
        if empty and len(empty) <= 10:
            out += ["", "💡 VALID NUMBERS FOR EMPTY CELLS:"]
            for r, c in empty[:10]:
                if s.initial[r, c] == 0:
                    valid = get_valid_numbers(g, r, c)
                    if valid:
                        out.append(f"  - ({r+1},{c+1}): {sorted(valid)}")
        filled, initial = np.count_nonzero(g), np.count_nonzero(s.initial)
        out += ["", f"Progress: {filled}/{self.n ** 2} cells filled ({initial} initial, {filled - initial} placed)",
                f"Steps: {s.time}/{self.text_max_steps}"]
        return "\n".join(out)


class RefSudoku:
    """One episode as the reference's env object plays it: free-text actions (`parse_action`),
    `step(text) -> (render, reward, done, info)`, on the rules of `Sudoku`."""

    def __init__(self, initial, solution, max_steps=81, scores=(1.0, -0.1, 10.0)):
        self.state = SudokuState(initial, solution)
        self.grid_size = self.state.initial.shape[0]
        self.rules = Sudoku(self.grid_size, max_steps, scores=scores)

    current_grid = property(lambda self: self.state.grid)
    solution_grid = property(lambda self: self.state.solution)
    initial_grid = property(lambda self: self.state.initial)

    def parse_action(self, action):
        action = action.strip().lower()
        for pattern in PATTERNS:
            m = re.search(pattern, action)
            if m:
                if 'place' in action or 'at' in action:
                    num, row, col = map(int, m.groups())
                else:
                    row, col, num = map(int, m.groups())
                row, col = row - 1, col - 1
                if not (0 <= row < self.grid_size and 0 <= col < self.grid_size and 1 <= num <= self.grid_size):
                    return False, -1, -1, -1
                return True, row, col, num
        return False, -1, -1, -1

    def step(self, action):
        ok, row, col, num = self.parse_action(action)
        assert ok, action
        reward, solved, info = self.rules.place(self.state, row, col, num)
        # The reference's step ends the episode only after a placement (solved, or its max_steps).
        done = solved or (info["action_is_effective"] and self.state.time >= self.rules.max_steps)
        return self.render(), reward, done, info

    def render(self):
        return self.rules.render(self.state)


def from_jax(state) -> SudokuState:
    """One (unbatched) JAX Sudoku state; its stored outcome (`feedback` code and `last` action) becomes
    the feedback line the reference wrote then (on the grid before that placement)."""
    grid, given = np.asarray(state.grid), np.asarray(state.given)
    initial = np.where(given, grid, 0)
    kind = int(state.feedback)
    text = ""
    if kind != NO_FEEDBACK:
        r, c, d = (int(x) for x in np.asarray(state.last))
        before = grid.copy()
        if kind in (CORRECT, VALID_NOT_SOLUTION):
            before[r, c] = 0
        _, text = placement(before, initial, np.asarray(state.solution), r, c, d)
        if kind in (CORRECT, VALID_NOT_SOLUTION) and is_solved(grid):
            text += SOLVED_LINE
    return SudokuState(initial, np.asarray(state.solution), grid, int(state.time), text, bool(state.done))
