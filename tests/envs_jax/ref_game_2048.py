"""Plain-Python 2048 written from the reference's code (RAGEN ragen/env/game_2048/env.py and
config.py), independent of the JAX code. Tiles are plain values (0 = empty), the board a list of rows.

The spawn is taken as an input (cell and value drawn by the caller), so the JAX env and this
reference can be stepped side by side on the same draws.
"""

from __future__ import annotations

import functools
import math

ACTION_LOOKUP = {0: "Up", 1: "Right", 2: "Down", 3: "Left"}
INVALID_ACT_SCORE = -0.1


@functools.lru_cache(maxsize=None)
def _merge_line(line: tuple) -> tuple[list, int]:
    """One line slid towards its start and merged -> (merged line, reward). Memoised on the line's
    values (a pure function; the side-by-side test renders ~130k boards, ~4 simulated moves each)."""
    vals = [v for v in line if v != 0]
    merged, i, reward = [], 0, 0
    while i < len(vals):
        if i + 1 < len(vals) and vals[i] == vals[i + 1]:
            m = vals[i] * 2
            reward += m
            merged.append(m)
            i += 2
        else:
            merged.append(vals[i])
            i += 1
    merged += [0] * (len(line) - len(merged))
    return merged, reward


def compress_and_merge(grid, axis, reverse):
    """The reference's _compress_and_merge, in place on a list of rows -> (reward, moved_any)."""
    size = len(grid)
    reward, moved_any = 0, False
    for fixed in range(size):
        line = [grid[i][fixed] for i in range(size)] if axis == 0 else list(grid[fixed])
        if reverse:
            line = line[::-1]
        merged, line_reward = _merge_line(tuple(line))
        reward += line_reward
        new_line = merged[::-1] if reverse else list(merged)
        before = [grid[i][fixed] for i in range(size)] if axis == 0 else list(grid[fixed])
        if axis == 0:
            for i in range(size):
                grid[i][fixed] = new_line[i]
        else:
            grid[fixed] = list(new_line)
        if before != new_line:
            moved_any = True
    return reward, moved_any


def move_sim(grid, action):
    axis, reverse = {0: (0, False), 1: (1, True), 2: (0, True), 3: (1, False)}[action]
    return compress_and_merge(grid, axis, reverse)


def valid_actions(grid):
    return [a for a in ACTION_LOOKUP if move_sim([row[:] for row in grid], a)[1]]


def is_terminal(grid):
    if any(v == 0 for row in grid for v in row):
        return False
    return not valid_actions(grid)


class Ref2048:
    """The reference env with the spawn drawn outside. `promised_noop=True` pays -0.1 for a move that
    changes nothing in log mode too (the reference's log branch gives 0.0)."""

    def __init__(self, size=4, use_log_reward=True, promised_noop=False):
        self.size, self.use_log_reward, self.promised_noop = size, use_log_reward, promised_noop
        self.grid = [[0] * size for _ in range(size)]
        self.score = 0

    def place(self, r, c, value):
        assert self.grid[r][c] == 0 and value in (2, 4)
        self.grid[r][c] = value

    def step_move(self, action):
        """The part of step before the spawn -> (moved, reward_merge)."""
        reward_merge, moved = move_sim(self.grid, action)
        return moved, reward_merge

    def step_finish(self, moved, reward_merge):
        """The part of step after the caller's spawn (if moved) -> (reward, done, info)."""
        terminated = False
        info = {"action_is_effective": moved, "success": False}
        if not moved:
            raw = INVALID_ACT_SCORE
        else:
            self.score += reward_merge
            raw = float(reward_merge)
            terminated = is_terminal(self.grid)
            if terminated and max(max(row) for row in self.grid) >= 2048:
                info["success"] = True
        final = raw
        if self.use_log_reward:
            if raw > 0:
                final = float(math.log2(raw + 1.0)) * 0.1
            else:
                final = INVALID_ACT_SCORE if (self.promised_noop and not moved) else 0.0
        return final, terminated, info

    def render(self):
        lines = ["Current 2048 Grid:"]
        for i in range(self.size):
            lines.append(f"Row {i + 1}: [{', '.join(str(int(x)) for x in self.grid[i])}]")
        valid = valid_actions(self.grid)
        text = ", ".join(f"{a}({ACTION_LOOKUP[a]})" for a in valid) if valid else "None"
        lines += ["", f"Valid Actions: {text}.", "Goal: Merge same numbers to reach 2048.",
                  f"Current Score: {self.score}", "What is your next move?"]
        return "\n".join(lines)
