"""2x2 Rubik's cube (Pocket Cube) on device (RAGEN-2's `rubikscube`, ragen/env/rubikscube).

Rules (the reference's):
- 24 stickers, four per face in the order U, L, F, R, B, D (colours W, O, G, R, B, Y); a face's
  stickers are [0, 1] over [2, 3] as the face is seen from outside (U with the back edge on top,
  D with the front edge on top, the side faces with U on top).
- Twelve actions, in the reference's order (its ids 1..12 are our indices 0..11):
  U, U', D, D', L, L', R, R', F, F', B, B' (a letter turns that face 90 degrees clockwise as seen
  looking at it, a prime counter-clockwise).
- Reset scrambles the solved cube with `scramble_depth` uniformly random actions (RAGEN-2's
  envs.yaml: 1 for `rubikscube`; its config default is 5). A scramble may undo itself.
- Solved = every face one colour (any orientation of the whole cube). Reward 1.0 on the move that
  solves it, else 0; the episode ends when solved or after `max_steps_in_episode` (20) moves.
  Every move is effective.
- The reference's B move is mis-wired: it sends the back face's edge stickers 22 and 23 (and 13, 15)
  to each other's places, so its twelve moves reach all 24! sticker arrangements instead of a real
  2x2's 88,179,840 (3,674,160 positions times 24 orientations). `moves="correct"` (the default)
  uses a real B; `moves="reference"` reproduces the reference's. U, D, L, R and F are the same in both.
The optimal solver (`solve`) is a breadth-first search over canonical move sequences in the
quarter-turn metric (U U is two moves), up to `solver_depth` moves.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces

from envs_jax.base import AgentEnv
from envs_jax.sokoban.solver import Solution

ACTION_NAMES = ("U", "U'", "D", "D'", "L", "L'", "R", "R'", "F", "F'", "B", "B'")
MOVE_SETS = ("correct", "reference")
FACE_NAMES = ("Up (U):    ", "Left (L):  ", "Front (F): ", "Right (R): ", "Back (B):  ", "Down (D):  ")
COLORS = ("W", "O", "G", "R", "B", "Y")
# The reference's config/envs.yaml env_instruction of rubikscube (a YAML literal block, final newline kept).
ENV_INSTRUCTION = (
    "You are solving a 2x2 Rubik's Cube (Pocket Cube). The goal is to restore the cube so that each of the faces "
    "consists of a single, unique color.\n"
    "Available actions use standard Singmaster notation for face rotations: U, U', D, D', L, L', R, R', F, F', B, "
    "B'.\n"
    "- Faces: U (Up), D (Down), L (Left), R (Right), F (Front), B (Back).\n"
    "- Modifiers: A letter alone means 90° clockwise (e.g., 'R'). A letter with prime (') means 90° "
    "counter-clockwise (e.g., \"R'\").\n"
    "Respond with a sequence of actions separated by \"||\".\n"
    "Example: <answer>U</answer>\n"
)
SOLVED = np.repeat(np.arange(6), 4).astype(np.int32)
# Clockwise quarter turns as gathers: new_stickers = stickers[perm]. Derived from a 3-D model of the
# stickers (positions and normals rotated about the face's axis); U, D, L, R, F equal the reference's.
_BASE_PERMS = {
    "U": [2, 0, 3, 1, 8, 9, 6, 7, 12, 13, 10, 11, 16, 17, 14, 15, 4, 5, 18, 19, 20, 21, 22, 23],
    "D": [0, 1, 2, 3, 4, 5, 18, 19, 8, 9, 6, 7, 12, 13, 10, 11, 16, 17, 14, 15, 22, 20, 23, 21],
    "L": [19, 1, 17, 3, 6, 4, 7, 5, 0, 9, 2, 11, 12, 13, 14, 15, 16, 22, 18, 20, 8, 21, 10, 23],
    "R": [0, 9, 2, 11, 4, 5, 6, 7, 8, 21, 10, 23, 14, 12, 15, 13, 3, 17, 1, 19, 20, 18, 22, 16],
    "F": [0, 1, 7, 5, 4, 20, 6, 21, 10, 8, 11, 9, 2, 13, 3, 15, 16, 17, 18, 19, 14, 12, 22, 23],
    "B": [13, 15, 2, 3, 1, 5, 0, 7, 8, 9, 10, 11, 12, 23, 14, 22, 18, 16, 19, 17, 20, 21, 4, 6],
}
# The reference's _move_B: stickers 13/15 and 22/23 take each other's sources.
REFERENCE_B = [13, 15, 2, 3, 1, 5, 0, 7, 8, 9, 10, 11, 12, 22, 14, 23, 18, 16, 19, 17, 20, 21, 6, 4]
_OPPOSITE = {"U": "D", "D": "U", "L": "R", "R": "L", "F": "B", "B": "F"}


def move_table(moves: str = "correct") -> np.ndarray:
    """int32[12, 24]: the gather of each action, in ACTION_NAMES order."""
    rows = []
    for face in "UDLRFB":
        perm = np.asarray(REFERENCE_B if (face == "B" and moves == "reference") else _BASE_PERMS[face])
        rows += [perm, perm[perm][perm]]  # a prime is three quarter turns
    return np.stack(rows).astype(np.int32)


def is_solved(stickers: jax.Array) -> jax.Array:
    faces = stickers.reshape(stickers.shape[:-1] + (6, 4))
    return jnp.all(faces == faces[..., :1], axis=(-2, -1))


@functools.lru_cache(maxsize=None)
def canonical_sequences(depth: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Per length k = 1..depth, the move sequences of length k a shortest solution needs to try:
    (parent index into length k-1, last move, sequences int32[n, k]).

    Kept: per face at most one run X, X' or X X (longer runs or X X' are shorter another way; X' X'
    equals X X), and of two commuting opposite faces only the order U D, L R, F B. Every position
    at quarter-turn distance d has such a sequence of length d.
    """
    faces = [a[0] for a in ACTION_NAMES]
    # A level entry: (sequence, its last face's run as a tuple of action indices, face before that run).
    level, out = [((), (), "")], []
    for _ in range(depth):
        parents, moves, seqs, nxt = [], [], [], []
        for i, (seq, run, before) in enumerate(level):
            for a, face in enumerate(faces):
                if run and faces[run[0]] == face:
                    if not (len(run) == 1 and run[0] == a and a % 2 == 0):  # only X X extends a run
                        continue
                    new_run, new_before = run + (a,), before
                else:
                    last = faces[run[0]] if run else ""
                    if last and _OPPOSITE[last] == face and "UDLRFB".index(face) < "UDLRFB".index(last):
                        continue
                    if last and _OPPOSITE[last] == face and before == face:
                        continue
                    new_run, new_before = (a,), last
                parents.append(i)
                moves.append(a)
                seqs.append(seq + (a,))
                nxt.append((seq + (a,), new_run, new_before))
        out.append((np.asarray(parents, np.int32), np.asarray(moves, np.int32), np.asarray(seqs, np.int32)))
        level = nxt
    return tuple(out)


def solve(stickers: jax.Array, moves: str = "correct", max_depth: int = 5) -> Solution:
    """A shortest action sequence (quarter-turn metric) to a solved cube, searched up to
    `max_depth` moves (jittable, vmappable). Already solved: length 0; none found: solvable False."""
    table = jnp.asarray(move_table(moves))
    frontier = stickers[None, :]
    found, length = is_solved(stickers), jnp.int32(0)
    actions = jnp.full((max_depth,), -1, jnp.int32)
    for k, (parent, last, seqs) in enumerate(canonical_sequences(max_depth), start=1):
        frontier = jnp.take_along_axis(frontier[parent], table[last], axis=1)
        solved = is_solved(frontier)
        here = (~found) & jnp.any(solved)
        plan = jnp.pad(jnp.asarray(seqs)[jnp.argmax(solved)], (0, max_depth - k), constant_values=-1)
        actions = jnp.where(here, plan, actions)
        length = jnp.where(here, k, length)
        found = found | here
    return Solution(actions, length.astype(jnp.int32), found)


def face_lines(stickers) -> list[str]:
    """The reference's six face lines of a sticker array (host side)."""
    s = np.asarray(stickers)
    return [f"{FACE_NAMES[f]}[{COLORS[s[4 * f]]}, {COLORS[s[4 * f + 1]]}]\n [{COLORS[s[4 * f + 2]]}, "
            f"{COLORS[s[4 * f + 3]]}]" for f in range(6)]


def observation_text(stickers, step: int, max_steps: int, done: bool) -> str:
    """The reference's observation text (host side)."""
    lines = ["=== Rubik's Cube 2x2 State ===", f"Step: {step}/{max_steps}", "", *face_lines(stickers), ""]
    if not done:
        lines += ["Available Actions:", ", ".join(ACTION_NAMES), "\nWhat is your next move?"]
    else:
        message = "Cube Solved!" if bool(np.asarray(is_solved(jnp.asarray(stickers)))) else "Max steps reached."
        lines.append(f"=== Game Over: {message} ===")
    return "\n".join(lines)


# ---- the environment -----------------------------------------------------------------------------
@struct.dataclass
class RubiksCubeState:
    stickers: jax.Array  # int32[24] colour per sticker
    time: jax.Array  # int32
    done: jax.Array  # bool


@struct.dataclass
class RubiksCubeParams:
    scramble_depth: int = struct.field(pytree_node=False, default=1)  # RAGEN-2 envs.yaml rubikscube
    max_steps_in_episode: int = struct.field(pytree_node=False, default=20)  # its max_steps
    moves: str = struct.field(pytree_node=False, default="correct")
    solver_depth: int = struct.field(pytree_node=False, default=5)  # the search bound of `solve`


def scramble_actions(key: jax.Array, params: RubiksCubeParams) -> jax.Array:
    """int32[scramble_depth]: the reset's uniformly random actions."""
    return jax.random.randint(key, (params.scramble_depth,), 0, 12, jnp.int32)


class RubiksCube(AgentEnv):
    """The 2x2 cube; `success` = solved."""

    @property
    def default_params(self) -> RubiksCubeParams:
        return RubiksCubeParams()

    @property
    def num_actions(self) -> int:
        return 12

    def action_space(self, params=None):
        return spaces.Discrete(12)

    def observation_space(self, params=None):
        return spaces.Box(0, 5, (6, 4), jnp.int32)

    def validate_params(self, params: RubiksCubeParams) -> None:
        """Raise ValueError for parameters the env cannot honour."""
        if not isinstance(params.scramble_depth, int) or params.scramble_depth < 0:
            raise ValueError(f"scramble_depth must be an int >= 0, got {params.scramble_depth!r}")
        if not isinstance(params.max_steps_in_episode, int) or params.max_steps_in_episode < 1:
            raise ValueError(f"max_steps_in_episode must be an int >= 1, got {params.max_steps_in_episode!r}")
        if params.moves not in MOVE_SETS:
            raise ValueError(f"moves must be one of {', '.join(MOVE_SETS)}, got {params.moves!r}")
        if not isinstance(params.solver_depth, int) or not 1 <= params.solver_depth <= 7:
            raise ValueError(f"solver_depth must be an int in [1, 7] (its search grows ~9x per move), "
                             f"got {params.solver_depth!r}")

    def reset_env(self, key, params):
        table = jnp.asarray(move_table(params.moves))
        stickers, _ = jax.lax.scan(lambda s, a: (s[table[a]], None), jnp.asarray(SOLVED),
                                   scramble_actions(key, params))
        state = RubiksCubeState(stickers=stickers, time=jnp.int32(0), done=jnp.bool_(False))
        return self.get_obs(state, params), state

    def transition(self, key, state, action, params):
        stickers = state.stickers[jnp.asarray(move_table(params.moves))[action]]
        solved = is_solved(stickers)
        return state.replace(stickers=stickers), solved.astype(jnp.float32), solved, \
            {"action_is_effective": jnp.bool_(True)}

    def is_success(self, state, params):
        return is_solved(state.stickers)

    def action_names(self, params) -> tuple[str, ...]:
        return ACTION_NAMES

    def instructions(self, params) -> str:
        return ENV_INSTRUCTION

    def symbols(self, params) -> tuple[str, ...]:
        return COLORS

    def render_grid(self, state, params):
        return state.stickers.reshape(6, 4)

    # The text layer assembles the observation from slots: the step line, one per face (6^4
    # alternatives each), then the action list or the game-over line. Every slot ends in a newline
    # before visible text, where Qwen's pre-tokenizer cuts anyway; the blank lines after the step line
    # and the Down face belong to their slot, as "]\n\n" and "0\n\n" are single pre-tokens.
    def observation_format(self, params) -> str:
        return "slots"

    def text_slots(self, params) -> tuple[tuple[str, ...], ...]:
        """Alternatives per slot of `observation_text` + "\n" (the final newline included)."""
        head = tuple(f"=== Rubik's Cube 2x2 State ===\nStep: {t}/{params.max_steps_in_episode}\n\n"
                     for t in range(params.max_steps_in_episode + 1))
        faces = tuple(tuple(f"{FACE_NAMES[f]}[{a}, {b}]\n [{c}, {d}]\n" + ("\n" if f == 5 else "")
                            for a in COLORS for b in COLORS for c in COLORS for d in COLORS) for f in range(6))
        tail = ("Available Actions:\n" + ", ".join(ACTION_NAMES) + "\n\nWhat is your next move?\n",
                "=== Game Over: Cube Solved! ===\n", "=== Game Over: Max steps reached. ===\n")
        return (head, *faces, tail)

    def text_slot_index(self, state, params) -> jax.Array:
        """int32 [8]: each slot's alternative for `state` (jittable)."""
        head = jnp.clip(state.time, 0, params.max_steps_in_episode)
        faces = state.stickers.reshape(6, 4) @ jnp.asarray([216, 36, 6, 1], jnp.int32)
        tail = jnp.where(state.done, jnp.where(is_solved(state.stickers), 1, 2), 0)
        return jnp.concatenate([head[None], faces, tail[None]]).astype(jnp.int32)

    def render_text(self, state, params) -> str:
        s = jax.device_get(state)
        return observation_text(s.stickers, int(s.time), params.max_steps_in_episode, bool(s.done))

    def solve(self, state, params) -> Solution:
        """A shortest plan from the current state (`solve` above, up to `params.solver_depth` moves)."""
        return solve(state.stickers, params.moves, params.solver_depth)

