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

    def render(self, observation_format="grid"):
        """RAGEN-2's FrozenLakeEnv._render_text (start shown as frozen, player symbols by its cell)."""
        room = [[("F" if ch == "S" else ch) for ch in row] for row in self.desc]
        codes = [[MAP_LOOKUP[ch] for ch in row] for row in room]
        codes[self.row][self.col] = 4 if self.letter == "H" else 5 if self.letter == "G" else 0
        grid = "\n".join("".join(GRID_LOOKUP[c] for c in row) for row in codes)
        if observation_format == "grid":
            return grid
        coords = format_coordinate_render(collect_entity_coordinates(self.desc, (self.row, self.col)),
                                          (self.n, self.n))
        if observation_format == "coord":
            return coords
        return "Coordinates: \n" + coords + "\n" + "Grid Map: \n" + grid


def collect_entity_coordinates(desc, player_pos):
    """RAGEN-2's frozen_lake/utils.py collect_entity_coordinates (index origin 0)."""
    n_rows, n_cols = len(desc), len(desc[0])
    cells = [(r, c) for r in range(n_rows) for c in range(n_cols)]  # row-major, as np.argwhere
    coords = {}
    for key, letter in (("start", "S"), ("goal", "G"), ("holes", "H")):
        found = [(r, c) for r, c in cells if desc[r][c] == letter]
        if found:
            coords[key] = found
    tile = desc[player_pos[0]][player_pos[1]]
    if tile == "G":
        coords["player_on_goal"] = [tuple(player_pos)]
    elif tile == "H":
        coords["player_in_hole"] = [tuple(player_pos)]
    else:
        coords["player"] = [tuple(player_pos)]
    return coords


def format_coordinate_render(entity_coords, board_shape):
    """RAGEN-2's frozen_lake/utils.py format_coordinate_render (index origin 0)."""
    rows, cols = board_shape
    lines = [f"Board size: {rows} rows x {cols} cols (zero-indexed)."]
    ordered_labels = [
        ("start", "Start"),
        ("goal", "Goal"),
        ("player", "Player"),
        ("player_on_goal", "Player on goal"),
        ("player_in_hole", "Player in hole"),
        ("holes", "Holes"),
    ]
    for key, label in ordered_labels:
        coords = entity_coords.get(key, [])
        if not coords:
            continue
        lines.append(f"{label}: " + ", ".join(f"({r}, {c})" for r, c in coords))
    return "\n".join(lines)


def transition_probs(action, slip=None, success_rate=None):
    """[(direction, prob)] of the realised move for an intended `action`.

    `slip`: RAGEN v1 / gymnasium < 1.0 (1 - slip intended, slip / 2 each perpendicular side).
    `success_rate`: gymnasium >= 1.0 FrozenLakeEnv as RAGEN-2 configures it: for b in
    [(a - 1) % 4, a, (a + 1) % 4], p = success_rate if b == a else (1 - success_rate) / 2.
    """
    if success_rate is not None:
        fail = (1.0 - success_rate) / 2.0
        return [(b, success_rate if b == action else fail) for b in ((action - 1) % 4, action, (action + 1) % 4)]
    return [((action - 1) % 4, slip / 2), (action, 1.0 - slip), ((action + 1) % 4, slip / 2)]


def dynamics(rows, slip, success_rate=None):
    """Successor list per (cell, action): [(prob, next_cell)], the reference's slippery table."""
    n = len(rows)
    out = {}
    for r in range(n):
        for c in range(n):
            for a in range(4):
                moves = transition_probs(a, slip, success_rate)
                out[(r * n + c, a)] = [(p, inc(r, c, d, n, n)) for d, p in moves if p > 0]
    return out


def expectimax(rows, steps, slip=2.0 / 3.0, success_rate=None):
    """Brute-force optimal success probability from the start with `steps` actions (memoised tree).
    `success_rate` (RAGEN-2's parameter), when given, replaces `slip`."""
    n = len(rows)
    dyn = dynamics(rows, slip, success_rate)

    @functools.lru_cache(maxsize=None)
    def value(r, c, k):
        if rows[r][c] == "G":
            return 1.0
        if rows[r][c] == "H" or k == 0:
            return 0.0
        return max(sum(p * value(rn, cn, k - 1) for p, (rn, cn) in dyn[(r * n + c, a)]) for a in range(4))

    (sr, sc), = [(r, c) for r in range(n) for c in range(n) if rows[r][c] == "S"]
    return value(sr, sc, steps)


def policy_value(rows, policy, steps, slip=2.0 / 3.0, success_rate=None):
    """Exact success probability of a policy: policy(cell, actions_left) -> action, or None = uniform."""
    n = len(rows)
    dyn = dynamics(rows, slip, success_rate)

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
