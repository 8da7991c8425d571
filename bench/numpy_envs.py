"""Plain-Python/numpy implementations of the environments and their text, for the throughput baseline.

These are written from the reference's rules (RAGEN's envs on top of gym-sokoban / gymnasium, see
docs/environments.md and the behaviour spec), NOT from the JAX code, so that tests can cross-check
the two step by step. They are what a host-side agent loop does per env step:

    env step (Python) -> state text -> conversation segment text -> tokenizer.encode(segment)
    answer ids -> tokenizer.decode -> `re` parse -> action

Randomness is drawn from a `random.Random` (the reference uses Python's `random` / numpy's RNG);
`apply_*` functions take the realised draw as an argument so tests can feed the JAX env's draws.
Only data is imported: the reference's texts (Bandit state template) and the cube's move gathers.
"""

from __future__ import annotations

import math
import random
import re
from typing import Optional, Sequence

import numpy as np

from envs_jax.bandit import STATE_TEMPLATE as BANDIT_TEMPLATE
from envs_jax.rubiks_cube import ACTION_NAMES as CUBE_ACTIONS
from envs_jax.rubiks_cube import move_table as CUBE_MOVE_TABLE

# ---------------------------------------------------------------------------------------------------
# Conversation text (RAGEN ctx_manager wording; see ragen_jax/text/conversation.py for the JAX side)
# ---------------------------------------------------------------------------------------------------
THINK_FORMAT = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
ANSWER_RE = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)


def reward_text(reward: float) -> str:
    """A turn reward printed from a 0.01 grid (float32 cents, half-to-even, like the device)."""
    cents = int(np.round(np.float32(reward) * np.float32(100.0)))
    cents = min(max(cents, -10000), 10000)
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{whole}" if frac == 0 else f"{sign}{whole}.{frac:02d}".rstrip("0")


def segment_text(state_text: str, turn: int, actions_left: int, prev_reward: float, prev_closed: bool = True,
                 max_words: int = 100) -> str:
    """The text appended before assistant turn `turn` (think mode), as the host would build it."""
    head = ""
    if turn > 1:
        head = ("" if prev_closed else "<|im_end|>") + f"\n<|im_start|>user\nReward:\n{reward_text(prev_reward)}\n\n"
    return (f"{head}Turn {turn}:\nState:\n{state_text}\nYou have {actions_left} actions left. "
            f"Always output: {THINK_FORMAT} with no extra text. Strictly follow this format. "
            f"Max response length: {max_words} words (tokens).\n<|im_end|>\n<|im_start|>assistant\n<think>")


def answer_pieces(text: str, max_actions: int = 5) -> list[str]:
    """The reference's answer pieces: regex, split on '||', stripped, the empty ones dropped."""
    m = ANSWER_RE.search(text)
    if m is None:
        return []
    return [p.strip() for p in m.group(2).split("||") if p.strip()][:max_actions]


def parse_answer(text: str, action_names: Sequence[str], max_actions: int = 5) -> list[int]:
    """The reference's answer parse: the pieces looked up by name, case-insensitively."""
    lookup = {n.lower(): i for i, n in enumerate(action_names)}
    return [lookup[p.lower()] for p in answer_pieces(text, max_actions) if p.lower() in lookup]


# ---------------------------------------------------------------------------------------------------
# Sokoban (gym-sokoban rules as RAGEN uses them)
# ---------------------------------------------------------------------------------------------------
SOKOBAN_ACTIONS = ("Up", "Down", "Left", "Right")
SOKOBAN_MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))
# wall, floor, target, box on target, box, player, player on target
SOKOBAN_SYMBOLS = {"standard": "#_O√XPS", "new": "W.GCBA@"}


class SokobanState:
    """A room: layout as nested lists of bools; boxes as a list of (row, col) in box order."""

    __slots__ = ("walls", "targets", "boxes", "player", "time", "done")

    def __init__(self, walls, targets, boxes, player, time=0, done=False):
        self.walls = [list(map(bool, r)) for r in walls]
        self.targets = [list(map(bool, r)) for r in targets]
        self.boxes = [tuple(b) for b in boxes]
        self.player = tuple(player)
        self.time, self.done = int(time), bool(done)

    def copy(self) -> "SokobanState":
        s = SokobanState.__new__(SokobanState)
        s.walls, s.targets, s.boxes = self.walls, self.targets, list(self.boxes)
        s.player, s.time, s.done = self.player, self.time, self.done
        return s


class NpSokoban:
    answer_format = "action"  # step(state, action index); Countdown's port reads text (step_text)

    def __init__(self, num_boxes: int = 1, max_steps: int = 10, symbols: str = "standard"):
        self.num_boxes, self.max_steps = num_boxes, max_steps
        self.symbols = SOKOBAN_SYMBOLS[symbols]
        self.action_names = SOKOBAN_ACTIONS

    def on_target(self, s: SokobanState) -> int:
        return sum(1 for (r, c) in s.boxes if s.targets[r][c])

    def step(self, s: SokobanState, action: int, rng: Optional[random.Random] = None):
        """-> (state, reward, done, info); the state is updated in place."""
        if s.done:
            return s, 0.0, s.done, {"action_is_effective": False, "success": self.on_target(s) == self.num_boxes}
        dr, dc = SOKOBAN_MOVES[action]
        pr, pc = s.player
        nxt, beyond = (pr + dr, pc + dc), (pr + 2 * dr, pc + 2 * dc)
        before = self.on_target(s)
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
        after = self.on_target(s)
        solved = after == self.num_boxes
        reward = -0.1 + (1.0 if after > before else 0.0) - (1.0 if after < before else 0.0) + (10.0 if solved else 0.0)
        s.time += 1
        s.done = solved or s.time >= self.max_steps
        return s, reward, s.done, {"action_is_effective": moved, "success": solved}

    def render(self, s: SokobanState) -> str:
        sym = self.symbols
        rows = []
        for r, (wrow, trow) in enumerate(zip(s.walls, s.targets)):
            line = []
            for c, (w, t) in enumerate(zip(wrow, trow)):
                if (r, c) == s.player:
                    line.append(sym[6] if t else sym[5])
                elif (r, c) in s.boxes:
                    line.append(sym[3] if t else sym[4])
                elif w:
                    line.append(sym[0])
                else:
                    line.append(sym[2] if t else sym[1])
            rows.append("".join(line))
        return "\n".join(rows)


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
                dr, dc = SOKOBAN_MOVES[action % 4]
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
            options = [(p[0] + dr, p[1] + dc) for dr, dc in SOKOBAN_MOVES]
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


def sokoban_from_jax(state) -> SokobanState:
    """One (unbatched) envs_jax SokobanState -> SokobanState (flat cells -> (row, col))."""
    walls = np.asarray(state.walls)
    w = walls.shape[1]
    boxes = [divmod(int(b), w) for b in np.asarray(state.boxes)]
    return SokobanState(walls, np.asarray(state.targets), boxes, divmod(int(state.player), w),
                        int(state.time), bool(state.done))


# ---------------------------------------------------------------------------------------------------
# FrozenLake (gymnasium FrozenLake-v1, slippery, RAGEN's random start/goal)
# ---------------------------------------------------------------------------------------------------
FROZEN_LAKE_ACTIONS = ("Left", "Down", "Right", "Up")
_FL_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))


class FrozenLakeState:
    __slots__ = ("holes", "start", "goal", "pos", "time", "done")

    def __init__(self, holes, start, goal, pos=None, time=0, done=False):
        self.holes = [list(map(bool, r)) for r in holes]
        self.start, self.goal = tuple(start), tuple(goal)
        self.pos = self.start if pos is None else tuple(pos)
        self.time, self.done = int(time), bool(done)

    def copy(self) -> "FrozenLakeState":
        s = FrozenLakeState.__new__(FrozenLakeState)
        s.holes, s.start, s.goal, s.pos, s.time, s.done = self.holes, self.start, self.goal, self.pos, self.time, self.done
        return s


class NpFrozenLake:
    answer_format = "action"  # step(state, action index); Countdown's port reads text (step_text)

    def __init__(self, slip: float = 2.0 / 3.0, max_steps: int = 10):
        self.slip, self.max_steps = slip, max_steps
        self.action_names = FROZEN_LAKE_ACTIONS

    def realised_direction(self, action: int, u: float) -> int:
        """The slippery draw: intended w.p. 1-slip, else one of the two perpendicular directions."""
        if u < 1.0 - self.slip:
            return action
        return (action - 1) % 4 if u < 1.0 - self.slip / 2.0 else (action + 1) % 4

    def step(self, s: FrozenLakeState, action: int, rng: random.Random):
        return self.apply_direction(s, self.realised_direction(action, rng.random()))

    def apply_direction(self, s: FrozenLakeState, direction: int):
        if s.done:
            return s, 0.0, True, {"action_is_effective": False, "success": s.pos == s.goal}
        n = len(s.holes)
        dr, dc = _FL_MOVES[direction]
        r, c = s.pos
        new = (min(max(r + dr, 0), n - 1), min(max(c + dc, 0), n - 1))
        moved = new != s.pos
        s.pos = new
        on_goal = new == s.goal
        s.time += 1
        s.done = on_goal or s.holes[new[0]][new[1]] or s.time >= self.max_steps
        return s, float(on_goal), s.done, {"action_is_effective": moved, "success": on_goal}

    def render(self, s: FrozenLakeState) -> str:
        rows = []
        for r, hrow in enumerate(s.holes):
            line = []
            for c, hole in enumerate(hrow):
                if (r, c) == s.pos:
                    line.append("√" if s.pos == s.goal else "X" if hole else "P")
                elif (r, c) == s.goal:
                    line.append("G")
                else:
                    line.append("O" if hole else "_")
            rows.append("".join(line))
        return "\n".join(rows)


def frozen_lake_from_jax(state) -> FrozenLakeState:
    hole = np.asarray(state.hole)
    n = hole.shape[0]
    return FrozenLakeState(hole, divmod(int(state.start), n), divmod(int(state.goal), n),
                           divmod(int(state.pos), n), int(state.time), bool(state.done))


# ---------------------------------------------------------------------------------------------------
# Bi-arm Bandit
# ---------------------------------------------------------------------------------------------------
class BanditState:
    __slots__ = ("high_first", "arm", "time", "done")

    def __init__(self, high_first, arm=-1, time=0, done=False):
        self.high_first, self.arm, self.time, self.done = bool(high_first), int(arm), int(time), bool(done)

    def copy(self) -> "BanditState":
        return BanditState(self.high_first, self.arm, self.time, self.done)


class NpBandit:
    answer_format = "action"  # step(state, action index); Countdown's port reads text (step_text)

    def __init__(self, low_name="Phoenix", high_name="Dragon", low_reward=0.1, high_reward=1.0,
                 high_fail_reward=0.0, high_prob=0.25, max_steps: int = 1):
        self.low_name, self.high_name = low_name, high_name
        self.low_reward, self.high_reward, self.high_fail_reward = low_reward, high_reward, high_fail_reward
        self.high_prob, self.max_steps = high_prob, max_steps
        self.action_names = (low_name, high_name)

    def step(self, s: BanditState, action: int, rng: random.Random):
        return self.apply_draw(s, action, rng.random() < self.high_prob)

    def apply_draw(self, s: BanditState, action: int, jackpot: bool):
        if s.done:
            return s, 0.0, True, {"action_is_effective": False, "success": s.arm == 1}
        s.arm = 1 if action >= 1 else 0
        if s.arm == 1:
            reward = self.high_reward if jackpot else self.high_fail_reward
        else:
            reward = self.low_reward
        s.time += 1
        s.done = True
        return s, reward, True, {"action_is_effective": True, "success": s.arm == 1}

    def render(self, s: BanditState) -> str:
        a, b = (self.high_name, self.low_name) if s.high_first else (self.low_name, self.high_name)
        return BANDIT_TEMPLATE.format(name_a=a, name_b=b)


def bandit_from_jax(state) -> BanditState:
    return BanditState(bool(state.high_first), int(state.arm), int(state.time), bool(state.done))


# ---------------------------------------------------------------------------------------------------
# 2x2 cube (RAGEN-2's rubikscube; the sticker gathers of its twelve moves are imported as data)
# ---------------------------------------------------------------------------------------------------
CUBE_COLORS = "WOGRBY"
CUBE_FACES = ("Up (U):    ", "Left (L):  ", "Front (F): ", "Right (R): ", "Back (B):  ", "Down (D):  ")


class CubeState:
    __slots__ = ("stickers", "time", "done")

    def __init__(self, stickers, time=0, done=False):
        self.stickers, self.time, self.done = list(stickers), int(time), bool(done)

    def copy(self) -> "CubeState":
        return CubeState(self.stickers, self.time, self.done)


class NpCube:
    answer_format = "action"  # step(state, action index); Countdown's port reads text (step_text)

    def __init__(self, max_steps: int = 20, moves: str = "correct"):
        self.max_steps = max_steps
        self.perms = [list(map(int, row)) for row in CUBE_MOVE_TABLE(moves)]
        self.action_names = CUBE_ACTIONS

    @staticmethod
    def solved(st) -> bool:
        return all(st[4 * f] == st[4 * f + 1] == st[4 * f + 2] == st[4 * f + 3] for f in range(6))

    def step(self, s: CubeState, action: int, rng: Optional[random.Random] = None):
        if s.done:
            return s, 0.0, True, {"action_is_effective": False, "success": self.solved(s.stickers)}
        s.stickers = [s.stickers[i] for i in self.perms[action]]
        s.time += 1
        ok = self.solved(s.stickers)
        s.done = ok or s.time >= self.max_steps
        return s, float(ok), s.done, {"action_is_effective": True, "success": ok}

    def render(self, s: CubeState) -> str:
        c = [CUBE_COLORS[x] for x in s.stickers]
        lines = ["=== Rubik's Cube 2x2 State ===", f"Step: {s.time}/{self.max_steps}", ""]
        lines += [f"{CUBE_FACES[f]}[{c[4 * f]}, {c[4 * f + 1]}]\n [{c[4 * f + 2]}, {c[4 * f + 3]}]" for f in range(6)]
        if not s.done:
            lines += ["", "Available Actions:", ", ".join(CUBE_ACTIONS), "\nWhat is your next move?"]
        else:
            lines += ["", f"=== Game Over: {'Cube Solved!' if self.solved(s.stickers) else 'Max steps reached.'} ==="]
        return "\n".join(lines)


def cube_from_jax(state) -> CubeState:
    return CubeState(np.asarray(state.stickers).tolist(), int(state.time), bool(state.done))


# ---------------------------------------------------------------------------------------------------
# The host-side agent step the benchmark times
# ---------------------------------------------------------------------------------------------------
def host_steps(env, states: list, answers: Sequence[Sequence[int]], tokenizer, num_steps: int,
               rng: random.Random, max_turns: int = 5) -> int:
    """Run `num_steps` env steps round-robin over `states` (updated in place); returns a checksum.

    One step: decode a randomly chosen answer's ids, regex-parse it, execute its first action (or
    score its first piece, for an env with `step_text`),
    restore the episode's initial state when it ended (so every step is a live one, as on the
    JAX side), render the next segment text and tokenize it.
    """
    inits = [s.copy() for s in states]
    names, max_steps = env.action_names, env.max_steps
    # An env that reads free text (Countdown) is stepped with the first answer piece, as the reference
    # passes its pieces to an env without an action lookup.
    takes_text = env.answer_format == "text"
    checksum = 0
    b = len(states)
    for i in range(num_steps):
        j = i % b
        s = states[j]
        text = tokenizer.decode(answers[rng.randrange(len(answers))])
        if takes_text:
            pieces = answer_pieces(text)
            s, reward, done, _ = env.step_text(s, pieces[0] if pieces else "", rng)
        else:
            actions = parse_answer(text, names)
            s, reward, done, _ = env.step(s, actions[0] if actions else 0, rng)
        if done:
            s = inits[j].copy()
        states[j] = s
        turn = min(s.time + 1, max_turns)
        seg = segment_text(env.render(s), turn, max_steps - s.time, reward)
        checksum += len(tokenizer.encode(seg, add_special_tokens=False))
    return checksum


# ---------------------------------------------------------------------------------- Sudoku
class SudokuState:
    """Fields named as envs_jax.sudoku.SudokuState's, so its host `observation_text` renders it."""

    def __init__(self, grid, given, solution, feedback=0, last=(0, 0, 0), time=0, done=False):
        self.grid, self.given, self.solution = np.array(grid), np.array(given), np.array(solution)
        self.feedback, self.last, self.time, self.done = feedback, tuple(last), time, done

    def copy(self) -> "SudokuState":
        return SudokuState(self.grid, self.given, self.solution, self.feedback, self.last, self.time, self.done)


class NpSudoku:
    """The reference's rules in plain Python (a step of index (r * n + c) * n + d - 1)."""

    answer_format = "action"  # step(state, action index); Countdown's port reads text (step_text)

    def __init__(self, params):
        from envs_jax import sudoku as sd

        self.sd, self.params = sd, params
        self.action_names = sd.action_names(params.grid_size)
        self.max_steps = int(params.max_steps_in_episode)

    def step(self, s: SudokuState, action: int, rng=None):
        sd, n = self.sd, self.params.grid_size
        b = int(round(n ** 0.5))
        r, c, d = action // (n * n), action // n % n, action % n + 1
        s = s.copy()
        g = s.grid
        box = g[r // b * b:r // b * b + b, c // b * b:c // b * b + b]
        conflict = d in g[r] or d in g[:, c] or d in box
        valid = not s.given[r, c] and not conflict
        s.feedback = sd.GIVEN_CELL if s.given[r, c] else sd.CONFLICT if conflict else (
            sd.CORRECT if d == s.solution[r, c] else sd.VALID_NOT_SOLUTION)
        s.last, s.time = (r, c, d), s.time + 1
        reward = float(self.params.invalid_action_score)
        if valid:
            g[r, c] = d
            reward = 1.0 if d == s.solution[r, c] else 0.5
            reward += 10.0 if not (g == 0).any() else 0.0
        s.done = bool(valid and not (g == 0).any()) or s.time >= self.max_steps
        return s, reward, s.done, {}

    def render(self, s: SudokuState) -> str:
        return self.sd.observation_text(s, self.params)


def sudoku_from_jax(state) -> SudokuState:
    s = state
    return SudokuState(np.asarray(s.grid), np.asarray(s.given), np.asarray(s.solution), int(s.feedback),
                       tuple(int(x) for x in np.asarray(s.last)), int(s.time))


# ---------------------------------------------------------------------------------- 2048
G2048_ACTIONS = ("Up", "Right", "Down", "Left")


class Game2048NpState:
    """Tile values (0 = empty) as a list of rows, the score and the move count."""

    def __init__(self, grid, score=0, time=0, done=False):
        self.grid, self.score, self.time, self.done = [list(r) for r in grid], int(score), int(time), bool(done)

    def copy(self) -> "Game2048NpState":
        return Game2048NpState(self.grid, self.score, self.time, self.done)


def slide_2048(grid, action):
    """The reference's _compress_and_merge on a copy -> (grid, merged sum, moved)."""
    n = len(grid)
    axis, reverse = {0: (0, False), 1: (1, True), 2: (0, True), 3: (1, False)}[action]
    out, reward = [r[:] for r in grid], 0
    for fixed in range(n):
        line = [out[i][fixed] for i in range(n)] if axis == 0 else out[fixed][:]
        vals = [v for v in (line[::-1] if reverse else line) if v]
        merged, i = [], 0
        while i < len(vals):
            if i + 1 < len(vals) and vals[i] == vals[i + 1]:
                merged.append(2 * vals[i])
                reward += 2 * vals[i]
                i += 2
            else:
                merged.append(vals[i])
                i += 1
        merged += [0] * (n - len(merged))
        new = merged[::-1] if reverse else merged
        for i in range(n):
            if axis == 0:
                out[i][fixed] = new[i]
            else:
                out[fixed][i] = new[i]
    return out, reward, out != grid


class Np2048:
    """The reference's 2048 rules in plain Python (log reward, -0.1 for a move that changes nothing)."""

    answer_format = "action"  # step(state, action index); Countdown's port reads text (step_text)

    def __init__(self, max_steps: int = 700, two_prob: float = 0.9):
        self.max_steps, self.two_prob, self.action_names = max_steps, two_prob, G2048_ACTIONS

    def valid(self, grid):
        return [a for a in range(4) if slide_2048(grid, a)[2]]

    def step(self, s: Game2048NpState, action: int, rng: random.Random):
        grid, raw, moved = slide_2048(s.grid, action)
        s = s.copy()
        s.time += 1
        if not moved:
            s.done = s.time >= self.max_steps
            return s, -0.1, s.done, {"action_is_effective": False}
        empty = [(r, c) for r, row in enumerate(grid) for c, v in enumerate(row) if v == 0]
        r, c = empty[rng.randrange(len(empty))]
        grid[r][c] = 2 if rng.random() < self.two_prob else 4
        s.grid, s.score = grid, s.score + raw
        s.done = not self.valid(grid) or s.time >= self.max_steps
        return s, (0.1 * math.log2(raw + 1.0) if raw > 0 else 0.0), s.done, {"action_is_effective": True}

    def render(self, s: Game2048NpState) -> str:
        lines = ["Current 2048 Grid:"] + [f"Row {i + 1}: [{', '.join(map(str, row))}]" for i, row in enumerate(s.grid)]
        valid = ", ".join(f"{a}({G2048_ACTIONS[a]})" for a in self.valid(s.grid)) or "None"
        lines += ["", f"Valid Actions: {valid}.", "Goal: Merge same numbers to reach 2048.",
                  f"Current Score: {s.score}", "What is your next move?"]
        return "\n".join(lines)


def game_2048_from_jax(state) -> Game2048NpState:
    board = np.asarray(state.board)
    return Game2048NpState([[int(2 ** v) if v else 0 for v in row] for row in board], int(state.score),
                           int(state.time), bool(state.done))


# ---------------------------------------------------------------------------------- Countdown
# The reference's scores (ragen/env/countdown): the int 1 and the float 0.1, printed as Python prints them.
COUNTDOWN_SCORE, COUNTDOWN_FORMAT_SCORE = 1, 0.1


class CountdownNpState:
    """The task (numbers, target), the answer's reward as the reference returns it, and the flags."""

    def __init__(self, nums, target, reward=0, time=0, done=False):
        self.nums, self.target = [int(x) for x in nums], int(target)
        self.reward, self.time, self.done = reward, int(time), bool(done)

    def copy(self) -> "CountdownNpState":
        return CountdownNpState(self.nums, self.target, self.reward, self.time, self.done)


def countdown_numbers_ok(equation: str, nums) -> bool:
    """The reference's check_format: the integers of the text are exactly the task's numbers."""
    try:
        return sorted(int(n) for n in re.findall(r"\d+", equation)) == sorted(nums)
    except Exception:  # the reference's bare except (int() of a non-ASCII digit run can fail)
        return False


def countdown_value_ok(equation: str, target: int) -> bool:
    """The reference's check_correctness: Python eval without builtins, within 1e-5 of the target."""
    try:
        return abs(eval(equation, {"__builtins__": None}, {}) - target) < 1e-5
    except Exception:  # any error (syntax, division by zero, a tuple minus an int) scores as wrong
        return False


class NpCountdown:
    """The reference's Countdown: one answer (its text) per episode, scored, then done."""

    answer_format = "text"  # step_text(state, the first answer piece)

    def __init__(self, score=COUNTDOWN_SCORE, format_score=COUNTDOWN_FORMAT_SCORE):
        self.score, self.format_score = score, format_score
        self.max_steps, self.action_names = 1, ()

    def reward(self, s: CountdownNpState, answer: str):
        if not countdown_numbers_ok(answer, s.nums):
            return 0
        return self.score if countdown_value_ok(answer, s.target) else self.format_score

    def step_text(self, s: CountdownNpState, answer: str, rng=None):
        """-> (state, reward, done, info) for the answer text (the first stripped answer piece)."""
        if s.done:
            return s, 0.0, True, {"action_is_effective": False, "success": s.reward == self.score}
        s = s.copy()
        s.reward = self.reward(s, answer)
        s.time, s.done = s.time + 1, True
        return s, s.reward, True, {"action_is_effective": s.reward > 0, "success": s.reward == self.score}

    def render(self, s: CountdownNpState) -> str:
        if s.done:
            return f"Your answer get {s.reward} points."
        return f"Target: {s.target}, nums: {s.nums}"


def countdown_from_jax(state) -> CountdownNpState:
    """One (unbatched) envs_jax CountdownState; its float32 reward back to the reference's int / float."""
    r = float(state.reward)
    reward = COUNTDOWN_SCORE if r == 1.0 else 0 if r == 0.0 else COUNTDOWN_FORMAT_SCORE
    nums = np.asarray(state.nums)[: int(state.count)].tolist()
    return CountdownNpState(nums, int(state.target), reward, int(state.time), bool(state.done))


# ---------------------------------------------------------------------------------------------------
# Which port stands beside which registered environment (bench/envs.py and bench/env_rules.py)
# ---------------------------------------------------------------------------------------------------
def host_env(name: str, env, params):
    """The plain-Python port of `name`'s rules with the JAX env's parameters."""
    if name in ("Sokoban", "LargerSokoban"):
        return NpSokoban(env.config.num_boxes, int(params.max_steps_in_episode))
    if name == "FrozenLake":
        return NpFrozenLake(float(params.slip), int(params.max_steps_in_episode))
    if name == "Bandit":
        return NpBandit(params.low_name, params.high_name, float(params.low_reward), float(params.high_reward),
                        float(params.high_fail_reward), float(params.high_prob), int(params.max_steps_in_episode))
    if name == "rubikscube":
        return NpCube(int(params.max_steps_in_episode), params.moves)
    if name in ("SimpleSudoku", "MediumSudoku"):
        return NpSudoku(params)
    if name == "game_2048":
        return Np2048(int(params.max_steps_in_episode), float(params.two_prob))
    if name == "Countdown":
        return NpCountdown()
    raise ValueError(f"no plain-Python port of {name!r} in bench/numpy_envs.py")


def from_jax(name: str):
    """JAX state (one env) -> the port's state, for `name`."""
    return {"Bandit": bandit_from_jax, "FrozenLake": frozen_lake_from_jax, "rubikscube": cube_from_jax,
            "SimpleSudoku": sudoku_from_jax, "MediumSudoku": sudoku_from_jax, "game_2048": game_2048_from_jax,
            "Countdown": countdown_from_jax}.get(name, sokoban_from_jax)
