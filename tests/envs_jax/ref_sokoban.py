"""Plain-Python Sokoban written from the reference's rules (gym-sokoban SokobanEnv._push/_move/
_calc_reward, wrapped by RAGEN's SokobanEnv.step/render), plus a plain BFS like the reference's
get_shortest_action_path. It never calls the JAX code: it is the independent truth for the tests.

Rooms use gym-sokoban codes: room_fixed 0 wall / 1 floor / 2 target; room_state additionally
3 box on target / 4 box off target / 5 player.
"""

from __future__ import annotations

from collections import deque

CHANGE = {0: (-1, 0), 1: (1, 0), 2: (0, -1), 3: (0, 1)}  # Up, Down, Left, Right
STANDARD = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}


class RefSokoban:
    """One episode of the reference env with an action budget (RAGEN's max_actions_per_traj)."""

    def __init__(self, room_fixed, room_state, num_boxes, max_steps=10):
        self.fixed = [list(r) for r in room_fixed]
        self.state = [list(r) for r in room_state]
        self.num_boxes = num_boxes
        self.max_steps = max_steps
        self.steps = 0
        self.done = False
        # RAGEN/gym-sokoban reset both set boxes_on_target = 0 (generated rooms start with none on).
        self.boxes_on_target = 0
        self.player = next((r, c) for r, row in enumerate(self.state) for c, v in enumerate(row) if v == 5)

    def _free(self, r, c):
        return self.state[r][c] in (1, 2)

    def _push_or_move(self, action):
        dr, dc = CHANGE[action]
        r, c = self.player
        nr, nc = r + dr, c + dc
        br, bc = nr + dr, nc + dc
        h, w = len(self.state), len(self.state[0])
        if 0 <= br < h and 0 <= bc < w and self.state[nr][nc] in (3, 4) and self._free(br, bc):
            self.state[br][bc] = 3 if self.fixed[br][bc] == 2 else 4
            self.state[nr][nc] = 5
            self.state[r][c] = self.fixed[r][c]
            self.player = (nr, nc)
            return
        if self._free(nr, nc):
            self.state[nr][nc] = 5
            self.state[r][c] = self.fixed[r][c]
            self.player = (nr, nc)

    def all_on_target(self):
        return not any(
            self.state[r][c] == 2 or (self.fixed[r][c] == 2 and self.state[r][c] == 5)
            for r in range(len(self.state)) for c in range(len(self.state[0]))
        )

    def step(self, action):
        """-> (reward, terminated, info) ; an ended episode ignores actions (reward 0, not effective)."""
        if self.done:
            return 0.0, False, {"action_is_effective": False, "success": self.all_on_target()}
        before = self.player
        self._push_or_move(action)
        reward = -0.1
        n_targets = sum(v == 2 for row in self.fixed for v in row)
        empty = sum(
            self.state[r][c] == 2 or (self.fixed[r][c] == 2 and self.state[r][c] == 5)
            for r in range(len(self.state)) for c in range(len(self.state[0]))
        )
        on = n_targets - empty
        if on > self.boxes_on_target:
            reward += 1.0
        elif on < self.boxes_on_target:
            reward -= 1.0
        won = self.all_on_target()
        if won:
            reward += 10.0
        self.boxes_on_target = on
        self.steps += 1
        self.done = won or self.steps >= self.max_steps
        return reward, won, {"action_is_effective": before != self.player, "success": won}

    def render(self, lookup=STANDARD, observation_format="grid"):
        """RAGEN-2's SokobanEnv._render_text in its three observation formats."""
        grid = "\n".join(
            "".join(lookup[6 if (v == 5 and self.fixed[r][c] == 2) else v] for c, v in enumerate(row))
            for r, row in enumerate(self.state)
        )
        if observation_format == "grid":
            return grid
        coords = format_coordinate_render(collect_entity_coordinates(self.state, self.fixed),
                                          (len(self.state), len(self.state[0])))
        if observation_format == "coord":
            return coords
        return "Coordinates: \n" + coords + "\n" + "Grid Map: \n" + grid


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
