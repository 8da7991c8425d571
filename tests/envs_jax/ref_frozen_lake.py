"""Plain-Python FrozenLake written from the reference's rules (RAGEN ragen/env/frozen_lake on top of
gymnasium FrozenLake-v1), independent of the JAX code. Maps are rows of 'S' 'F' 'H' 'G'.

Randomness is taken as an input (the realised move direction), so the JAX env and this reference
can be compared step by step on the same draws.
"""

from __future__ import annotations

import functools

import numpy as np

LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
GRID_LOOKUP = {0: "P", 1: "_", 2: "O", 3: "G", 4: "X", 5: "√"}
MAP_LOOKUP = {"P": 0, "F": 1, "H": 2, "G": 3}


def inc(row, col, a, nrow, ncol):
    """gymnasium's move: clamp at the border."""
    if a == LEFT:
        col = max(col - 1, 0)
    elif a == DOWN:
        row = min(row + 1, nrow - 1)
    elif a == RIGHT:
        col = min(col + 1, ncol - 1)
    elif a == UP:
        row = max(row - 1, 0)
    return row, col


def is_valid(board) -> bool:
    """The reference's DFS: is 'G' reachable from 'S' without stepping on 'H'?"""
    n = len(board)
    (sr, sc), = [(r, c) for r in range(n) for c in range(n) if board[r][c] == "S"]
    frontier, seen = [(sr, sc)], set()
    while frontier:
        r, c = frontier.pop()
        if (r, c) in seen:
            continue
        seen.add((r, c))
        for dr, dc in [(1, 0), (0, 1), (-1, 0), (0, -1)]:
            rn, cn = r + dr, c + dc
            if 0 <= rn < n and 0 <= cn < n:
                if board[rn][cn] == "G":
                    return True
                if board[rn][cn] != "H":
                    frontier.append((rn, cn))
    return False


def generate_random_map(rng: np.random.Generator, size=4, p=0.8):
    """The reference's generator: redraw holes, start and goal until distinct and connected."""
    while True:
        board = rng.choice(["F", "H"], (size, size), p=[p, 1 - p])
        sr, sc = rng.integers(size, size=2)
        gr, gc = rng.integers(size, size=2)
        if (sr, sc) != (gr, gc):
            board[sr][sc], board[gr][gc] = "S", "G"
            if is_valid(board):
                return ["".join(row) for row in board]


class FrozenLakeRef:
    """One episode on a fixed map. `step` takes the realised direction (after slipping)."""

    def __init__(self, rows, max_steps=10):
        self.desc = [list(r) for r in rows]
        self.n = len(rows)
        (self.row, self.col), = [(r, c) for r in range(self.n) for c in range(self.n) if self.desc[r][c] == "S"]
        self.max_steps = max_steps
        self.time = 0
        self.done = False

    @property
    def letter(self):
        return self.desc[self.row][self.col]

    @property
    def pos(self):
        return self.row * self.n + self.col

    def success(self):
        return self.letter == "G"

    def step(self, direction):
        """-> (reward, terminated, action_is_effective). Ended episodes ignore the action."""
        if self.done:
            return 0.0, False, False
        prev = (self.row, self.col)
        self.row, self.col = inc(self.row, self.col, direction, self.n, self.n)
        reward = float(self.letter == "G")
        terminated = self.letter in "GH"
        self.time += 1
        self.done = terminated or self.time >= self.max_steps
        return reward, terminated, prev != (self.row, self.col)

    def render(self):
        """The reference's text render (start shown as frozen, player symbols by its cell)."""
        room = [[("F" if ch == "S" else ch) for ch in row] for row in self.desc]
        codes = [[MAP_LOOKUP[ch] for ch in row] for row in room]
        codes[self.row][self.col] = 4 if self.letter == "H" else 5 if self.letter == "G" else 0
        return "\n".join("".join(GRID_LOOKUP[c] for c in row) for row in codes)


def _dynamics(rows, slip):
    """Successor list per (cell, action): [(prob, next_cell)], the reference's slippery table."""
    n = len(rows)
    out = {}
    for r in range(n):
        for c in range(n):
            for a in range(4):
                moves = [((a - 1) % 4, slip / 2), (a, 1.0 - slip), ((a + 1) % 4, slip / 2)]
                out[(r * n + c, a)] = [(p, inc(r, c, d, n, n)) for d, p in moves if p > 0]
    return out


def expectimax(rows, steps, slip=2.0 / 3.0):
    """Brute-force optimal success probability from the start with `steps` actions (memoised tree)."""
    n = len(rows)
    dyn = _dynamics(rows, slip)

    @functools.lru_cache(maxsize=None)
    def value(r, c, k):
        if rows[r][c] == "G":
            return 1.0
        if rows[r][c] == "H" or k == 0:
            return 0.0
        return max(sum(p * value(rn, cn, k - 1) for p, (rn, cn) in dyn[(r * n + c, a)]) for a in range(4))

    (sr, sc), = [(r, c) for r in range(n) for c in range(n) if rows[r][c] == "S"]
    return value(sr, sc, steps)


def policy_value(rows, policy, steps, slip=2.0 / 3.0):
    """Exact success probability of a policy: policy(cell, actions_left) -> action, or None = uniform."""
    n = len(rows)
    dyn = _dynamics(rows, slip)

    @functools.lru_cache(maxsize=None)
    def value(r, c, k):
        if rows[r][c] == "G":
            return 1.0
        if rows[r][c] == "H" or k == 0:
            return 0.0

        def q(a):
            return sum(p * value(rn, cn, k - 1) for p, (rn, cn) in dyn[(r * n + c, a)])

        if policy is None:
            return sum(q(a) for a in range(4)) / 4.0
        return q(policy(r * n + c, k))

    (sr, sc), = [(r, c) for r in range(n) for c in range(n) if rows[r][c] == "S"]
    return value(sr, sc, steps)
