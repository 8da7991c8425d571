"""2048 in plain Python, written from the reference's code (RAGEN-2 ragen/env/game_2048/env.py and
config.py). Tiles are plain values (0 = empty), the board a list of rows. The spawn is drawn from a
`random.Random`, or placed by the caller (`Ref2048.place`), so the JAX env and this port can be stepped
side by side on the same draws.
"""

from __future__ import annotations

import functools
import math
import random

import numpy as np

ACTION_LOOKUP = {0: "Up", 1: "Right", 2: "Down", 3: "Left"}
ACTION_NAMES = tuple(ACTION_LOOKUP.values())
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


def slide(grid, action):
    """A move on a copy of `grid` -> (slid grid, merged sum, moved)."""
    out = [row[:] for row in grid]
    reward, moved = move_sim(out, action)
    return out, reward, moved


def move_reward(merged: int, moved: bool, use_log_reward: bool = True, promised_noop: bool = True) -> float:
    """The reference's reward of a move: log2(merged + 1) / 10 in log mode (the raw sum otherwise);
    -0.1 for a move that changes nothing, except in the reference's log branch, which gives 0.0
    (`promised_noop=False`)."""
    raw = float(merged) if moved else INVALID_ACT_SCORE
    if not use_log_reward:
        return raw
    if raw > 0:
        return float(math.log2(raw + 1.0)) * 0.1
    return INVALID_ACT_SCORE if (promised_noop and not moved) else 0.0


class Game2048State:
    """Tile values (0 = empty) as a list of rows, the score and the move count."""

    def __init__(self, grid, score=0, time=0, done=False):
        self.grid, self.score, self.time, self.done = [list(r) for r in grid], int(score), int(time), bool(done)

    def copy(self) -> "Game2048State":
        return Game2048State(self.grid, self.score, self.time, self.done)


class Game2048:
    """The rules: a move slides and merges; a tile (2 with probability `two_prob`, else 4) spawns on a
    random empty cell after a move that changed the board; the game ends without a valid move or
    after `max_steps` moves; reward `move_reward`."""

    answer_format = "action"  # step(state, action index)

    def __init__(self, max_steps: int = 700, two_prob: float = 0.9, promised_noop: bool = True):
        self.max_steps, self.two_prob, self.promised_noop = max_steps, two_prob, promised_noop
        self.action_names = ACTION_NAMES

    def step(self, s: Game2048State, action: int, rng: random.Random):
        """-> (new state, reward, done, info)."""
        grid, merged, moved = slide(s.grid, action)
        s = s.copy()
        s.time += 1
        if moved:
            empty = [(r, c) for r, row in enumerate(grid) for c, v in enumerate(row) if v == 0]
            r, c = empty[rng.randrange(len(empty))]
            grid[r][c] = 2 if rng.random() < self.two_prob else 4
            s.grid, s.score = grid, s.score + merged
        ended = moved and is_terminal(s.grid)
        s.done = ended or s.time >= self.max_steps
        success = ended and max(max(row) for row in s.grid) >= 2048
        return s, move_reward(merged, moved, True, self.promised_noop), s.done, {"action_is_effective": moved,
                                                                              "success": success}

    @staticmethod
    def render(s: Game2048State) -> str:
        lines = ["Current 2048 Grid:"] + [f"Row {i + 1}: [{', '.join(str(int(x)) for x in row)}]"
                                         for i, row in enumerate(s.grid)]
        valid = valid_actions(s.grid)
        text = ", ".join(f"{a}({ACTION_LOOKUP[a]})" for a in valid) if valid else "None"
        lines += ["", f"Valid Actions: {text}.", "Goal: Merge same numbers to reach 2048.",
                  f"Current Score: {s.score}", "What is your next move?"]
        return "\n".join(lines)


class Ref2048:
    """One game as the reference's env object plays it, with the spawn placed by the caller: `step_move`
    (the part of a step before the spawn) and `step_finish` (after it). `promised_noop=True` pays -0.1
    for a move that changes nothing in log mode too (the reference's log branch gives 0.0)."""

    def __init__(self, size=4, use_log_reward=True, promised_noop=False):
        self.size, self.use_log_reward, self.promised_noop = size, use_log_reward, promised_noop
        self.grid = [[0] * size for _ in range(size)]
        self.score = 0

    def place(self, r, c, value):
        assert self.grid[r][c] == 0 and value in (2, 4)
        self.grid[r][c] = value

    def step_move(self, action):
        """-> (moved, merged sum); the board is slid in place."""
        reward_merge, moved = move_sim(self.grid, action)
        return moved, reward_merge

    def step_finish(self, moved, reward_merge):
        """-> (reward, terminated, info) once the caller has spawned (if moved)."""
        terminated = moved and is_terminal(self.grid)
        if moved:
            self.score += reward_merge
        info = {"action_is_effective": moved, "success": terminated and max(max(row) for row in self.grid) >= 2048}
        return move_reward(reward_merge, moved, self.use_log_reward, self.promised_noop), terminated, info

    def render(self):
        return Game2048.render(Game2048State(self.grid, self.score))


def from_jax(state) -> Game2048State:
    board = np.asarray(state.board)
    return Game2048State([[int(2 ** v) if v else 0 for v in row] for row in board], int(state.score),
                         int(state.time), bool(state.done))
