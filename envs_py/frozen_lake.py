"""FrozenLake in plain Python, written from the reference's rules (RAGEN ragen/env/frozen_lake on top of
gymnasium FrozenLake-v1, RAGEN's random start and goal; RAGEN-2's coordinate texts). Maps are rows of
'S' 'F' 'H' 'G'. The slip is an input (the realised direction) or drawn from a `random.Random`, so the
JAX env and this port can be compared step by step on the same draws. Also: the reference's map
generator, and exact values of a policy and of the optimum (memoised expectimax over the slips).
"""

from __future__ import annotations

import functools
import random

import numpy as np

ACTION_NAMES = ("Left", "Down", "Right", "Up")
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


class FrozenLakeState:
    """The map (holes as booleans, start and goal cells) and the player's cell, as (row, col)."""

    __slots__ = ("holes", "start", "goal", "pos", "time", "done")

    def __init__(self, holes, start, goal, pos=None, time=0, done=False):
        self.holes = [list(map(bool, r)) for r in holes]
        self.start, self.goal = tuple(start), tuple(goal)
        self.pos = self.start if pos is None else tuple(pos)
        self.time, self.done = int(time), bool(done)

    @classmethod
    def from_rows(cls, rows) -> "FrozenLakeState":
        cells = [(r, c, ch) for r, row in enumerate(rows) for c, ch in enumerate(row)]
        (start,), (goal,) = ([(r, c) for r, c, ch in cells if ch == k] for k in "SG")
        return cls([[ch == "H" for ch in row] for row in rows], start, goal)

    def letter(self, cell=None) -> str:
        r, c = self.pos if cell is None else cell
        return "S" if (r, c) == self.start else "G" if (r, c) == self.goal else "H" if self.holes[r][c] else "F"

    def rows(self) -> list[str]:
        n = len(self.holes)
        return ["".join(self.letter((r, c)) for c in range(n)) for r in range(n)]

    def copy(self) -> "FrozenLakeState":
        s = FrozenLakeState.__new__(FrozenLakeState)
        s.holes, s.start, s.goal, s.pos, s.time, s.done = self.holes, self.start, self.goal, self.pos, self.time, self.done
        return s


class FrozenLake:
    """The rules: the intended direction with probability 1 - slip, else one of the two perpendicular
    ones; a move off the map stays put; reward 1 on the goal; the goal or a hole ends the episode."""

    answer_format = "action"  # step(state, action index)

    def __init__(self, slip: float = 2.0 / 3.0, max_steps: int = 10):
        self.slip, self.max_steps = slip, max_steps
        self.action_names = ACTION_NAMES

    def realised_direction(self, action: int, u: float) -> int:
        """The slippery draw: intended w.p. 1-slip, else one of the two perpendicular directions."""
        if u < 1.0 - self.slip:
            return action
        return (action - 1) % 4 if u < 1.0 - self.slip / 2.0 else (action + 1) % 4

    def step(self, s: FrozenLakeState, action: int, rng: random.Random):
        return self.apply_direction(s, self.realised_direction(action, rng.random()))

    def apply_direction(self, s: FrozenLakeState, direction: int):
        """The realised move -> (state, reward, done, info); the state is updated in place."""
        if s.done:
            return s, 0.0, True, {"action_is_effective": False, "success": s.pos == s.goal}
        n = len(s.holes)
        new = inc(*s.pos, direction, n, n)
        moved = new != s.pos
        s.pos = new
        on_goal = new == s.goal
        s.time += 1
        s.done = on_goal or s.holes[new[0]][new[1]] or s.time >= self.max_steps
        return s, float(on_goal), s.done, {"action_is_effective": moved, "success": on_goal}

    @staticmethod
    def render(s: FrozenLakeState, observation_format: str = "grid") -> str:
        """RAGEN-2's FrozenLakeEnv._render_text (start shown as frozen, the player's symbol by its cell)."""
        desc = s.rows()
        codes = [[MAP_LOOKUP["F" if ch == "S" else ch] for ch in row] for row in desc]
        codes[s.pos[0]][s.pos[1]] = {"H": 4, "G": 5}.get(s.letter(), 0)
        grid = "\n".join("".join(GRID_LOOKUP[c] for c in row) for row in codes)
        if observation_format == "grid":
            return grid
        coords = format_coordinate_render(collect_entity_coordinates(desc, s.pos), (len(desc), len(desc)))
        if observation_format == "coord":
            return coords
        return "Coordinates: \n" + coords + "\n" + "Grid Map: \n" + grid


class FrozenLakeRef:
    """One episode on a fixed map as the reference's env object plays it: `step` takes the realised
    direction (after slipping) and returns (reward, terminated, action_is_effective); an ended episode
    ignores the action. The rules are `FrozenLake`'s."""

    def __init__(self, rows, max_steps=10):
        self.state = FrozenLakeState.from_rows(rows)
        self.n = len(rows)
        self.rules = FrozenLake(max_steps=max_steps)

    row = property(lambda self: self.state.pos[0], lambda self, r: self._place(r, self.state.pos[1]))
    col = property(lambda self: self.state.pos[1], lambda self, c: self._place(self.state.pos[0], c))
    time = property(lambda self: self.state.time)
    done = property(lambda self: self.state.done)

    def _place(self, r, c):
        self.state.pos = (r, c)

    @property
    def letter(self):
        return self.state.letter()

    @property
    def pos(self):
        return self.row * self.n + self.col

    def success(self):
        return self.letter == "G"

    def step(self, direction):
        if self.state.done:
            return 0.0, False, False
        _, reward, _, info = self.rules.apply_direction(self.state, direction)
        return reward, self.letter in "GH", info["action_is_effective"]

    def render(self, observation_format="grid"):
        return self.rules.render(self.state, observation_format)


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


def from_jax(state) -> FrozenLakeState:
    """One (unbatched) JAX FrozenLake state (flat cells -> (row, col))."""
    hole = np.asarray(state.hole)
    n = hole.shape[0]
    return FrozenLakeState(hole, divmod(int(state.start), n), divmod(int(state.goal), n),
                           divmod(int(state.pos), n), int(state.time), bool(state.done))
