"""The 2x2 cube in plain Python, written from the reference's code (RAGEN-2 ragen/env/rubikscube/env.py
and config.py): its twelve quarter turns as the reference writes them (`ReferenceMoves`), its text,
and `fixed_b` swapping in a real B turn written in the reference's style (the reference's B is
mis-wired). The scramble is an input (reference action ids 1..12 drawn by the caller).
"""

from __future__ import annotations

import random
from typing import Optional

import numpy as np

ACTION_LOOKUP = {1: "U", 2: "U'", 3: "D", 4: "D'", 5: "L", 6: "L'", 7: "R", 8: "R'", 9: "F", 10: "F'",
                 11: "B", 12: "B'"}
ACTION_NAMES = tuple(ACTION_LOOKUP.values())  # action index a is the reference's id a + 1
COLORS = {0: "W", 1: "O", 2: "G", 3: "R", 4: "B", 5: "Y"}
FACES = (("Up (U):    ", 0), ("Left (L):  ", 1), ("Front (F): ", 2), ("Right (R): ", 3), ("Back (B):  ", 4),
         ("Down (D):  ", 5))
SOLVED = [i for i in range(6) for _ in range(4)]


class ReferenceMoves:
    """The reference's move functions on a 24-sticker list (`state`), verbatim in their style."""

    def __init__(self, fixed_b=False, state=None):
        self.fixed_b = fixed_b
        self.state = list(SOLVED if state is None else state)

    def apply_action(self, action):
        """`action`: a reference id 1..12 (odd: a clockwise turn; even: three of them)."""
        turns, base_act = (3, action - 1) if action % 2 == 0 else (1, action)
        move = {1: self.move_u, 3: self.move_d, 5: self.move_l, 7: self.move_r, 9: self.move_f, 11: self.move_b}
        for _ in range(turns):
            move[base_act]()

    def rotate_face_clockwise(self, face_idx):
        base, s = face_idx * 4, self.state
        tmp = s[base + 0]
        s[base + 0] = s[base + 2]
        s[base + 2] = s[base + 3]
        s[base + 3] = s[base + 1]
        s[base + 1] = tmp

    def apply_action(self, action):
        turns, base_act = (3, action - 1) if action % 2 == 0 else (1, action)
        move = {1: self.move_u, 3: self.move_d, 5: self.move_l, 7: self.move_r, 9: self.move_f, 11: self.move_b}
        for _ in range(turns):
            move[base_act]()

    def move_u(self):
        self.rotate_face_clockwise(0)
        s = self.state
        t0, t1 = s[8], s[9]
        s[8], s[9] = s[12], s[13]
        s[12], s[13] = s[16], s[17]
        s[16], s[17] = s[4], s[5]
        s[4], s[5] = t0, t1

    def move_d(self):
        self.rotate_face_clockwise(5)
        s = self.state
        t0, t1 = s[10], s[11]
        s[10], s[11] = s[6], s[7]
        s[6], s[7] = s[18], s[19]
        s[18], s[19] = s[14], s[15]
        s[14], s[15] = t0, t1

    def move_l(self):
        self.rotate_face_clockwise(1)
        s = self.state
        t0, t2 = s[0], s[2]
        s[0], s[2] = s[19], s[17]
        s[19], s[17] = s[20], s[22]
        s[20], s[22] = s[8], s[10]
        s[8], s[10] = t0, t2

    def move_r(self):
        self.rotate_face_clockwise(3)
        s = self.state
        t1, t3 = s[1], s[3]
        s[1], s[3] = s[9], s[11]
        s[9], s[11] = s[21], s[23]
        s[21], s[23] = s[18], s[16]
        s[18], s[16] = t1, t3

    def move_f(self):
        self.rotate_face_clockwise(2)
        s = self.state
        t2, t3 = s[2], s[3]
        s[2], s[3] = s[7], s[5]
        s[7], s[5] = s[21], s[20]
        s[21], s[20] = s[12], s[14]
        s[12], s[14] = t2, t3

    def move_b(self):
        self.rotate_face_clockwise(4)
        s = self.state
        t0, t1 = s[0], s[1]
        if self.fixed_b:  # the back face's top row goes to L's outer column, L's to D's back row, ...
            s[0], s[1] = s[13], s[15]
            s[13], s[15] = s[23], s[22]
            s[23], s[22] = s[6], s[4]
            s[6], s[4] = t0, t1
        else:  # the reference's
            s[0], s[1] = s[13], s[15]
            s[13], s[15] = s[22], s[23]
            s[22], s[23] = s[6], s[4]
            s[6], s[4] = t0, t1


def solved(stickers) -> bool:
    return all(len(set(stickers[i * 4:(i + 1) * 4])) == 1 for i in range(6))


class CubeState:
    __slots__ = ("stickers", "time", "done")

    def __init__(self, stickers, time=0, done=False):
        self.stickers, self.time, self.done = list(stickers), int(time), bool(done)

    def copy(self) -> "CubeState":
        return CubeState(self.stickers, self.time, self.done)


class Cube:
    """The rules: each action permutes the stickers (the reference's moves, as gathers); reward 1 and
    the end when every face is one colour; truncated after `max_steps` moves."""

    answer_format = "action"  # step(state, action index)

    def __init__(self, max_steps: int = 20, moves: str = "correct"):
        self.max_steps = max_steps
        # Each move's gather: where every sticker comes from (the reference's move run on the labels 0..23).
        self.perms = []
        for action in range(1, 13):
            labels = ReferenceMoves(moves == "correct", range(24))
            labels.apply_action(action)
            self.perms.append(labels.state)
        self.action_names = ACTION_NAMES

    def step(self, s: CubeState, action: int, rng: Optional[random.Random] = None):
        """-> (state, reward, done, info) for action index `action` (reference id + 1); in place."""
        if s.done:
            return s, 0.0, True, {"action_is_effective": False, "success": solved(s.stickers)}
        s.stickers = [s.stickers[i] for i in self.perms[action]]
        s.time += 1
        ok = solved(s.stickers)
        s.done = ok or s.time >= self.max_steps
        return s, float(ok), s.done, {"action_is_effective": True, "success": ok}

    def render(self, s: CubeState) -> str:
        c = [COLORS[x] for x in s.stickers]
        lines = ["=== Rubik's Cube 2x2 State ===", f"Step: {s.time}/{self.max_steps}", ""]
        lines += [f"{label}[{c[4 * f]}, {c[4 * f + 1]}]\n [{c[4 * f + 2]}, {c[4 * f + 3]}]" for label, f in FACES]
        if not s.done:
            lines += ["", "Available Actions:", ", ".join(ACTION_NAMES), "\nWhat is your next move?"]
        else:
            lines += ["", f"=== Game Over: {'Cube Solved!' if solved(s.stickers) else 'Max steps reached.'} ==="]
        return "\n".join(lines)


class RefCube(ReferenceMoves):
    """One episode as the reference's env object plays it: `reset(scramble ids)`, `step(id)` ->
    (text, reward, done, info), on the rules of `Cube`."""

    def __init__(self, max_steps=20, fixed_b=False):
        super().__init__(fixed_b)
        self.rules = Cube(max_steps, "correct" if fixed_b else "reference")
        self.max_steps = max_steps
        self.current_step = 0

    def reset(self, scramble):
        """scramble: reference action ids (1..12)."""
        self.state, self.current_step = list(SOLVED), 0
        for action in scramble:
            self.apply_action(action)
        return self.rules.render(CubeState(self.state))

    def step(self, action):
        s = CubeState(self.state, self.current_step)
        _, reward, done, info = self.rules.step(s, action - 1)
        self.state, self.current_step = s.stickers, s.time
        return self.rules.render(s), reward, done, {**info, "action_is_valid": True}


def from_jax(state) -> CubeState:
    return CubeState(np.asarray(state.stickers).tolist(), int(state.time), bool(state.done))
