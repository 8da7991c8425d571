"""Plain-Python Sudoku written from the reference's code (RAGEN ragen/env/sudoku/env.py, utils.py,
config.py), independent of the JAX code. The puzzle and its solution are taken as inputs (the
reference draws them with Python's `random`); actions are the reference's free-text strings.
"""

from __future__ import annotations

import re

import numpy as np


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


class RefSudoku:
    def __init__(self, initial, solution, max_steps=81, scores=(1.0, -0.1, 10.0)):
        self.initial_grid, self.solution_grid = np.array(initial), np.array(solution)
        self.current_grid = self.initial_grid.copy()
        self.grid_size = self.initial_grid.shape[0]
        self.max_steps, self.num_steps, self.last_action_feedback = max_steps, 0, ""
        self.correct, self.invalid, self.bonus = scores

    def parse_action(self, action):
        action = action.strip().lower()
        patterns = [r'place\s+(\d+)\s+at\s+row\s+(\d+)\s+col\s+(\d+)', r'place\s+(\d+)\s+at\s+\((\d+),\s*(\d+)\)',
                    r'place\s+(\d+)\s+at\s+(\d+),\s*(\d+)', r'(\d+)\s+at\s+(\d+),\s*(\d+)',
                    r'\((\d+),\s*(\d+),\s*(\d+)\)', r'(\d+),\s*(\d+),\s*(\d+)']
        for pattern in patterns:
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
        self.num_steps += 1
        ok, row, col, num = self.parse_action(action)
        assert ok, action
        if self.initial_grid[row, col] != 0:
            self.last_action_feedback = f"❌ Cannot modify initial cell at ({row+1},{col+1})"
            return self.render(), self.invalid, False, {"action_is_effective": False, "success": False}
        g = self.current_grid
        if not is_valid_placement(g, row, col, num):
            conflicts = []
            if num in g[row, :]:
                conflicts.append(f"row {row+1}")
            if num in g[:, col]:
                conflicts.append(f"column {col+1}")
            b = box_size(self.grid_size)
            br, bc = (row // b) * b, (col // b) * b
            if num in g[br:br + b, bc:bc + b]:
                conflicts.append(f"box ({br//b+1},{bc//b+1})")
            self.last_action_feedback = f"❌ Invalid placement: {num} conflicts with {', '.join(conflicts)}"
            valid = get_valid_numbers(g, row, col)
            if valid:
                self.last_action_feedback += f"\n   Valid numbers for ({row+1},{col+1}): {sorted(valid)}"
            return self.render(), self.invalid, False, {"action_is_effective": False, "success": False}
        g[row, col] = num
        if num == self.solution_grid[row, col]:
            self.last_action_feedback = f"✓ Correct! Placed {num} at ({row+1},{col+1})"
            reward = self.correct
        else:
            self.last_action_feedback = f"⚠ Placed {num} at ({row+1},{col+1}) - Valid but not optimal"
            reward = self.correct * 0.5
        solved = is_solved(g)
        if solved:
            self.last_action_feedback += "\n🎉 Congratulations! Puzzle solved!"
            reward += self.bonus
        done = solved or self.num_steps >= self.max_steps
        return self.render(), reward, done, {"action_is_effective": True, "success": solved}

    def render(self):
        """The reference's render_format "with_feedback" with show_conflicts and show_valid_numbers."""
        g = self.current_grid
        conflicts = find_conflicts(g)
        out = ["=" * 50, "SUDOKU PUZZLE", "=" * 50, format_grid_with_conflicts(g, self.initial_grid, conflicts), "",
               "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty"]
        if self.last_action_feedback:
            out += ["", self.last_action_feedback]
        every = conflicts["row"] | conflicts["col"] | conflicts["box"]
        if every:
            out += ["", "⚠ CONFLICTS DETECTED:"] + [f"  - Cell ({r+1},{c+1}): {g[r, c]}" for r, c in sorted(every)]
        empty = list(zip(*np.where(g == 0)))
        if empty and len(empty) <= 10:
            out += ["", "💡 VALID NUMBERS FOR EMPTY CELLS:"]
            for r, c in empty[:10]:
                if self.initial_grid[r, c] == 0:
                    valid = get_valid_numbers(g, r, c)
                    if valid:
                        out.append(f"  - ({r+1},{c+1}): {sorted(valid)}")
        filled, initial = np.count_nonzero(g), np.count_nonzero(self.initial_grid)
        out += ["", f"Progress: {filled}/{self.grid_size ** 2} cells filled ({initial} initial, {filled - initial} placed)",
                f"Steps: {self.num_steps}/{self.max_steps}"]
        return "\n".join(out)
