"""Sokoban in plain Python, written from the reference's rules (gym-sokoban SokobanEnv._push/_move/
_calc_reward as RAGEN's SokobanEnv.step/render wrap them; RAGEN-2's coordinate texts), plus the
reference's room generator (gym-sokoban generate_room + RAGEN's player jitter) and a plain BFS like its
get_shortest_action_path.

gym-sokoban's code grids: room_fixed 0 wall / 1 floor / 2 target; room_state additionally 3 box on
target / 4 box off target / 5 player (6: the player on a target, in renders only).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Optional

import numpy as np

ACTION_NAMES = ("Up", "Down", "Left", "Right")
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # in action order
CHANGE = dict(enumerate(MOVES))
STANDARD = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
SYMBOL_SETS = {"standard": STANDARD, "new": dict(enumerate("W.GCBA@"))}


class SokobanState:
    """A room: walls and targets as nested lists of bools; boxes as (row, col) in box order; the count
    of boxes on targets as the reference last scored it (gym-sokoban's boxes_on_target, 0 at reset)."""

    __slots__ = ("walls", "targets", "boxes", "player", "time", "done", "on_target")

    def __init__(self, walls, targets, boxes, player, time=0, done=False, on_target=0):
        self.walls = [list(map(bool, r)) for r in walls]
        self.targets = [list(map(bool, r)) for r in targets]
        self.boxes = [tuple(b) for b in boxes]
        self.player = tuple(player)
        self.time, self.done, self.on_target = int(time), bool(done), int(on_target)

    def copy(self) -> "SokobanState":
        s = SokobanState.__new__(SokobanState)
        s.walls, s.targets, s.boxes = self.walls, self.targets, list(self.boxes)
        s.player, s.time, s.done, s.on_target = self.player, self.time, self.done, self.on_target
        return s

    def codes(self) -> tuple[list[list[int]], list[list[int]]]:
        """(room_fixed, room_state) code grids."""
        fixed = [[0 if w else (2 if t else 1) for w, t in zip(wr, tr)] for wr, tr in zip(self.walls, self.targets)]
        state = [row[:] for row in fixed]
        for r, c in self.boxes:
            state[r][c] = 3 if fixed[r][c] == 2 else 4
        state[self.player[0]][self.player[1]] = 5
        return fixed, state


class Sokoban:
    """The rules: a move into a wall or into a box that cannot be pushed stays put; reward -0.1 per
    action, +1 / -1 as the count of boxes on targets rises / falls, +10 when every box is on one; the
    episode ends solved or after `max_steps` actions."""

    answer_format = "action"  # step(state, action index)

    def __init__(self, num_boxes: int = 1, max_steps: int = 10, symbols: str = "standard"):
        self.num_boxes, self.max_steps = num_boxes, max_steps
        self.lookup = SYMBOL_SETS[symbols]
        self.action_names = ACTION_NAMES

    @staticmethod
    def boxes_on_targets(s: SokobanState) -> int:
        return sum(1 for (r, c) in s.boxes if s.targets[r][c])

    def step(self, s: SokobanState, action: int, rng: Optional[random.Random] = None):
        """-> (state, reward, done, info); the state is updated in place."""
        if s.done:
            return s, 0.0, s.done, {"action_is_effective": False,
                                    "success": self.boxes_on_targets(s) == self.num_boxes}
        dr, dc = MOVES[action]
        pr, pc = s.player
        nxt, beyond = (pr + dr, pc + dc), (pr + 2 * dr, pc + 2 * dc)
        moved = False
        if not s.walls[nxt[0]][nxt[1]]:
            if nxt in s.boxes:
                if not s.walls[beyond[0]][beyond[1]] and beyond not in s.boxes:
                    s.boxes[s.boxes.index(nxt)] = beyond
                    moved = True
            else:
                moved = True
        if moved:
            s.player = nxt
        on = self.boxes_on_targets(s)
        solved = on == self.num_boxes
        reward = -0.1 + (1.0 if on > s.on_target else 0.0) - (1.0 if on < s.on_target else 0.0) + (10.0 if solved else 0.0)
        s.on_target = on
        s.time += 1
        s.done = solved or s.time >= self.max_steps
        return s, reward, s.done, {"action_is_effective": moved, "success": solved}

    def render(self, s: SokobanState, observation_format: str = "grid", lookup=None) -> str:
        """RAGEN-2's SokobanEnv._render_text in its three observation formats."""
        lookup = self.lookup if lookup is None else lookup
        fixed, state = s.codes()
        grid = "\n".join("".join(lookup[6 if (v == 5 and fixed[r][c] == 2) else v] for c, v in enumerate(row))
                         for r, row in enumerate(state))
        if observation_format == "grid":
            return grid
        coords = format_coordinate_render(collect_entity_coordinates(state, fixed), (len(state), len(state[0])))
        if observation_format == "coord":
            return coords
        return "Coordinates: \n" + coords + "\n" + "Grid Map: \n" + grid


class RefSokoban:
    """One episode as the reference's env object plays it, from gym-sokoban code grids, with an action
    budget (RAGEN's max_actions_per_traj): `step(action) -> (reward, terminated, info)`, an ended
    episode ignoring the action. The rules are `Sokoban`'s."""

    def __init__(self, room_fixed, room_state, num_boxes, max_steps=10):
        walls = [[v == 0 for v in row] for row in room_fixed]
        targets = [[v == 2 for v in row] for row in room_fixed]
        cells = [(r, c, v) for r, row in enumerate(room_state) for c, v in enumerate(row)]
        player = next((r, c) for r, c, v in cells if v == 5)
        # gym-sokoban's reset counts no box on a target (generated rooms start with none on).
        self.state = SokobanState(walls, targets, [(r, c) for r, c, v in cells if v in (3, 4)], player)
        self.rules = Sokoban(num_boxes, max_steps)

    done = property(lambda self: self.state.done)
    player = property(lambda self: self.state.player)

    def step(self, action):
        if self.state.done:
            return 0.0, False, {"action_is_effective": False, "success": self.all_on_target()}
        _, reward, _, info = self.rules.step(self.state, action)
        return reward, info["success"], info

    def all_on_target(self):
        return self.rules.boxes_on_targets(self.state) == self.rules.num_boxes

    def render(self, lookup=STANDARD, observation_format="grid"):
        return self.rules.render(self.state, observation_format, lookup)


def collect_entity_coordinates(room_state, room_fixed):
    """RAGEN-2's sokoban/utils.py collect_entity_coordinates (index origin 0; walls not rendered)."""
    h, w = len(room_state), len(room_state[0])
    cells = [(r, c) for r in range(h) for c in range(w)]  # row-major, as np.argwhere
    coords = {
        "targets": [(r, c) for r, c in cells if room_fixed[r][c] == 2],
        "boxes_on_target": [(r, c) for r, c in cells if room_state[r][c] == 3],
        "boxes": [(r, c) for r, c in cells if room_state[r][c] == 4],
    }
    players = [(r, c) for r, c in cells if room_state[r][c] == 5]
    coords["player"] = [p for p in players if room_fixed[p[0]][p[1]] != 2]
    coords["player_on_target"] = [p for p in players if room_fixed[p[0]][p[1]] == 2]
    return coords


def format_coordinate_render(entity_coords, board_shape):
    """RAGEN-2's sokoban/utils.py format_coordinate_render (index origin 0)."""
    rows, cols = board_shape
    lines = [f"Board size: {rows} rows x {cols} cols (zero-indexed)."]
    ordered_labels = [
        ("walls", "Walls"),
        ("targets", "Targets"),
        ("boxes", "Boxes"),
        ("boxes_on_target", "Boxes on target"),
        ("player", "Player"),
        ("player_on_target", "Player on target"),
    ]
    for key, label in ordered_labels:
        coords = entity_coords.get(key, [])
        if not coords:
            continue
        coord_str = ", ".join(f"({r}, {c})" for r, c in coords)
        lines.append(f"{label}: {coord_str}")
    return "\n".join(lines)


# ---- reference-like room generator (gym-sokoban generate_room + RAGEN's player jitter) ----------------
_MASKS = (
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
    ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
)
_WALK = ((1, 0), (0, 1), (-1, 0), (0, -1))


def _topology(rng: random.Random, h: int, w: int, num_steps: int, p_change: float) -> np.ndarray:
    level = np.zeros((h, w), bool)
    direction = rng.choice(_WALK)
    pos = [rng.randint(1, h - 1), rng.randint(1, w - 1)]
    for _ in range(num_steps):
        if rng.random() < p_change:
            direction = rng.choice(_WALK)
        pos = [max(min(pos[0] + direction[0], h - 2), 1), max(min(pos[1] + direction[1], w - 2), 1)]
        level[pos[0] - 1:pos[0] + 2, pos[1] - 1:pos[1] + 2] |= np.array(rng.choice(_MASKS), bool)
    level[[0, -1], :] = False
    level[:, [0, -1]] = False
    return level


class _ReverseSearch:
    """gym-sokoban's reverse_playing: DFS over pull moves keeping the best-scoring state.

    Score = box_swaps x sum of Manhattan box displacements, 0 unless every target is uncovered
    (neither a box nor the player on it). Visited states are skipped (set of (player, boxes)).
    """

    def __init__(self, floor, targets, max_depth: int, max_states: int = 300_000):
        self.floor, self.targets = floor, targets
        self.max_depth, self.max_states = max_depth, max_states
        self.seen: set = set()
        self.best = (-1, None, None)

    def score(self, player, boxes, swaps):
        covered = player in self.targets or any(b in self.targets for b in boxes)
        if covered:
            return 0
        return swaps * sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, self.targets))

    def run(self, player, boxes):
        stack = [(player, tuple(boxes), 0, -1, self.max_depth)]
        # Iterative DFS in the recursion's order (actions pushed in reverse so action 0 runs first).
        while stack:
            player, boxes, swaps, last, ttl = stack.pop()
            ttl -= 1
            if ttl <= 0 or len(self.seen) >= self.max_states:
                continue
            key = (player, boxes)
            if key in self.seen:
                continue
            self.seen.add(key)
            s = self.score(player, boxes, swaps)
            if s > self.best[0]:
                self.best = (s, player, boxes)
            for action in range(7, -1, -1):  # 0-3 move+pull, 4-7 move only
                dr, dc = MOVES[action % 4]
                nxt = (player[0] + dr, player[1] + dc)
                if not self.floor[nxt] or nxt in boxes:
                    continue
                new_boxes, pulled = boxes, last
                if action < 4:
                    behind = (player[0] - dr, player[1] - dc)
                    if behind in boxes:
                        i = boxes.index(behind)
                        new_boxes = boxes[:i] + (player,) + boxes[i + 1:]
                        pulled = i
                # gym-sokoban passes the OLD last_pull down the recursion (its quirk, kept).
                stack.append((nxt, new_boxes, swaps + (pulled != last), last, ttl))
        return self.best


def generate_sokoban_room(rng: random.Random, dim_room=(6, 6), num_boxes: int = 1, search_depth: int = 300,
                          tries: int = 4, p_change: float = 0.35) -> SokobanState:
    """A solvable room by the reference's method (host-side): topology, placement, reverse search, jitter."""
    h, w = dim_room
    num_steps = int(1.7 * (h + w))
    # gym-sokoban raises after `tries` zero-score topologies and RAGEN's reset catches that and
    # starts over with a new seed; the same, as a loop.
    for attempt in range(1000 * tries):
        floor = _topology(rng, h, w, num_steps, p_change)
        cells = [tuple(x) for x in np.argwhere(floor)]
        if len(cells) <= num_boxes + 1:
            continue
        chosen = rng.sample(cells, num_boxes + 1)
        player, targets = chosen[0], chosen[1:]
        score, p, boxes = _ReverseSearch(floor, targets, search_depth).run(player, targets)
        if score > 0:
            break
    else:
        raise RuntimeError(f"room generation failed: {1000 * tries} topologies all scored 0")
    # RAGEN's add_random_player_movement: up to 3 non-pushing moves to unvisited free cells.
    disp = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
    if rng.random() <= (0.8 if disp == 1 else 0.5):
        visited = [p]
        for _ in range(3):
            options = [(p[0] + dr, p[1] + dc) for dr, dc in MOVES]
            options = [q for q in options if floor[q] and q not in boxes and q not in visited]
            if not options:
                break
            p = rng.choice(options)
            visited.append(p)
            if rng.random() > 0.5:
                break
    tgrid = np.zeros((h, w), bool)
    for t in targets:
        tgrid[t] = True
    return SokobanState(~floor, tgrid, boxes, p)


def bfs_length(room_fixed, room_state, max_depth=100):
    """Length of the shortest action sequence putting every box on a target, or None."""
    h, w = len(room_fixed), len(room_fixed[0])
    walls = {(r, c) for r in range(h) for c in range(w) if room_fixed[r][c] == 0}
    targets = frozenset((r, c) for r in range(h) for c in range(w) if room_fixed[r][c] == 2)
    boxes = frozenset((r, c) for r in range(h) for c in range(w) if room_state[r][c] in (3, 4))
    player = next((r, c) for r in range(h) for c in range(w) if room_state[r][c] == 5)
    start = (player, boxes)
    if boxes == targets:
        return 0
    seen = {start}
    queue = deque([(start, 0)])
    while queue:
        (p, bx), d = queue.popleft()
        if d >= max_depth:
            continue
        for dr, dc in CHANGE.values():
            n = (p[0] + dr, p[1] + dc)
            if n in walls:
                continue
            nb = bx
            if n in bx:
                b2 = (n[0] + dr, n[1] + dc)
                if b2 in walls or b2 in bx or not (0 <= b2[0] < h and 0 <= b2[1] < w):
                    continue
                nb = (bx - {n}) | {b2}
            s = (n, nb)
            if s in seen:
                continue
            if nb == targets:
                return d + 1
            seen.add(s)
            queue.append((s, d + 1))
    return None


def room_codes(walls, targets, boxes, player):
    """(room_fixed, room_state) code grids from boolean walls/targets grids and flat box/player cells."""
    h, w = len(walls), len(walls[0])
    fixed = [[0 if walls[r][c] else (2 if targets[r][c] else 1) for c in range(w)] for r in range(h)]
    state = [row[:] for row in fixed]
    for b in boxes:
        r, c = divmod(int(b), w)
        state[r][c] = 3 if fixed[r][c] == 2 else 4
    r, c = divmod(int(player), w)
    state[r][c] = 5
    return fixed, state


def from_jax(state) -> SokobanState:
    """One (unbatched) JAX Sokoban state (flat cells -> (row, col)); the last scored count is the current one."""
    walls = np.asarray(state.walls)
    w = walls.shape[1]
    boxes = [divmod(int(b), w) for b in np.asarray(state.boxes)]
    s = SokobanState(walls, np.asarray(state.targets), boxes, divmod(int(state.player), w),
                     int(state.time), bool(state.done))
    s.on_target = Sokoban.boxes_on_targets(s)
    return s
