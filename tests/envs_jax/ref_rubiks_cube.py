"""Plain-Python 2x2 cube written from the reference's code (RAGEN ragen/env/rubikscube/env.py and
config.py), independent of the JAX code. The scramble is taken as an input (the action ids drawn by
the caller). `fixed_b=True` swaps in a real B turn, written in the reference's style; otherwise the
reference's mis-wired B is kept.
"""

from __future__ import annotations

ACTION_LOOKUP = {1: "U", 2: "U'", 3: "D", 4: "D'", 5: "L", 6: "L'", 7: "R", 8: "R'", 9: "F", 10: "F'",
                 11: "B", 12: "B'"}
COLORS = {0: "W", 1: "O", 2: "G", 3: "R", 4: "B", 5: "Y"}


class RefCube:
    def __init__(self, max_steps=20, fixed_b=False):
        self.max_steps, self.fixed_b = max_steps, fixed_b
        self.solved_state = [i for i in range(6) for _ in range(4)]
        self.state = list(self.solved_state)
        self.current_step = 0

    def reset(self, scramble):
        """scramble: reference action ids (1..12)."""
        self.state = list(self.solved_state)
        self.current_step = 0
        for action in scramble:
            self.apply_action(action)
        return self.render(done=False)

    def step(self, action):
        info = {"action_is_effective": True, "action_is_valid": True, "success": False}
        self.apply_action(action)
        self.current_step += 1
        is_solved = all(len(set(self.state[i * 4:(i + 1) * 4])) == 1 for i in range(6))
        truncated = self.current_step >= self.max_steps
        done = is_solved or truncated
        if is_solved:
            reward, msg = 1.0, "Cube Solved!"
            info["success"] = True
        elif truncated:
            reward, msg = 0.0, "Max steps reached."
        else:
            reward, msg = 0.0, ""
        return self.render(done=done, result_msg=msg), float(reward), done, info

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

    def render(self, done=False, result_msg=""):
        def get_face_str(face_idx):
            c = [COLORS[self.state[face_idx * 4 + i]] for i in range(4)]
            return f"[{c[0]}, {c[1]}]\n       [{c[2]}, {c[3]}]"

        lines = ["=== Rubik's Cube 2x2 State ===", f"Step: {self.current_step}/{self.max_steps}", ""]
        for label, face in (("Up (U):    ", 0), ("Left (L):  ", 1), ("Front (F): ", 2), ("Right (R): ", 3),
                            ("Back (B):  ", 4), ("Down (D):  ", 5)):
            lines.append(f"{label}{get_face_str(face).strip().replace('       ', ' ')}")
        if not done:
            lines += ["", "Available Actions:", "U, U', D, D', L, L', R, R', F, F', B, B'", "\nWhat is your next move?"]
        else:
            lines += ["", f"=== Game Over: {result_msg} ==="]
        return "\n".join(lines)
