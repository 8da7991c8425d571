"""Sokoban state, parameters, static configuration and the fixed texts of the reference.

Positions are FLAT cell indices `row * width + col` (int32): a step is then a handful of scalar
gathers and compares, and a batch of states is a few small arrays, cheap to vmap and to carry
through a multi-turn rollout. Walls and targets are the fixed layout of the room.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import environment

from envs_jax import coords

# Action index order of the reference (its lookup is 1:Up 2:Down 3:Left 4:Right, shifted to 0-based).
ACTION_NAMES = ("Up", "Down", "Left", "Right")
# (row, col) offset per action.
ACTION_DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1))

# Grid codes of the reference renderer (gym-sokoban room_state codes plus 6 = player on target).
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)
CELL_NAMES = ("wall", "empty", "target", "box on target", "box", "player", "player on target")
SYMBOL_SETS = {
    "standard": ("#", "_", "O", "√", "X", "P", "S"),
    # The reference's SokobanDifferentGridVocab grid_lookup.
    "new": ("W", ".", "G", "C", "B", "A", "@"),
}

# config/envs.yaml `env_instruction` of SimpleSokoban / LargerSokoban / SokobanDifferentGridVocab.
ENV_INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
    "targets. When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box. The answer should be a "
    "sequence of actions, like <answer>Right || Right || Up</answer>"
)
# RAGEN-2's config/envs.yaml `env_instruction` of CoordSokoban, verbatim: a YAML literal block, so its
# line breaks, trailing spaces and final newline are part of the text. The corner "(5, 5)" is fixed
# text in the reference whatever dim_room is.
COORD_ENV_INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\n"
    "You are provided with a symbol grid and the zero-indexed coordinates of the player, each box, and each target. \n"
    "Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5). \n"
    "When you are exactly next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box.\n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.\n"
)
INSTRUCTIONS = {"standard": ENV_INSTRUCTION, "coord": COORD_ENV_INSTRUCTION}
# The reference's coordinate lines (collect_entity_coordinates + format_coordinate_render), in its order.
COORD_LABELS = ("Targets", "Boxes", "Boxes on target", "Player", "Player on target")


@struct.dataclass
class SokobanState(environment.EnvState):
    walls: jax.Array    # bool[H, W], True = wall (the border is always wall)
    targets: jax.Array  # bool[H, W]
    boxes: jax.Array    # int32[num_boxes] flat cell of each box
    player: jax.Array   # int32 flat cell of the player
    time: jax.Array     # int32 executed actions
    done: jax.Array     # bool


@struct.dataclass
class SokobanParams(environment.EnvParams):
    """Dynamic (traced) parameters: changing them never recompiles."""

    max_steps_in_episode: int = 10
    step_reward: float = -0.1           # gym-sokoban penalty_for_step
    box_on_target_reward: float = 1.0   # reward_box_on_target
    box_off_target_reward: float = -1.0  # penalty_box_off_target
    finish_reward: float = 10.0         # reward_finished
    # Room generation (reference generate_room / room_topology_generation / add_random_player_movement).
    p_change_direction: float = 0.35
    jitter_move_prob: float = 0.5           # probability the player jitters at all ...
    jitter_move_prob_close: float = 0.8     # ... when the box displacement score is 1
    jitter_continue_prob: float = 0.5


@dataclasses.dataclass(frozen=True)
class SokobanConfig:
    """Static configuration: it fixes array shapes and loop lengths, so it lives on the env."""

    dim_room: tuple[int, int] = (6, 6)
    num_boxes: int = 1
    symbols: str = "standard"         # "standard" or "new"
    num_candidates: int = 64          # K reverse-play sequences per topology (vmapped)
    search_depth: int = 40            # D pull moves per sequence
    gen_tries: int = 8                # topologies drawn before the deterministic fallback
    jitter_max_steps: int = 3
    solver_max_len: int = 100         # BFS depth limit (reference MAX_DEPTH) = padded path length
    # RAGEN-2's observation_format: "grid", "grid_coord" (coordinates, then the grid) or "coord"
    # (envs_jax/coords.py). Static: it changes the segment's token budget.
    observation_format: str = "grid"
    instruction: str = "standard"     # env instruction text: "standard" (SimpleSokoban) or "coord" (CoordSokoban)

    @property
    def num_gen_steps(self) -> int:
        # gym-sokoban: num_gen_steps = int(1.7 * (dim_room[0] + dim_room[1])).
        return int(1.7 * (self.dim_room[0] + self.dim_room[1]))

    def validate(self) -> None:
        h, w = self.dim_room
        if h < 5 or w < 5:
            raise ValueError(f"dim_room {self.dim_room} is too small; both sides must be >= 5 (a wall border around a 3x3 interior).")
        if self.num_boxes < 1:
            raise ValueError(f"num_boxes must be >= 1, got {self.num_boxes}.")
        if self.num_boxes > w - 2:
            raise ValueError(f"num_boxes={self.num_boxes} does not fit dim_room {self.dim_room}; at most width-2={w - 2} boxes are supported.")
        if self.symbols not in SYMBOL_SETS:
            raise ValueError(f"unknown symbols {self.symbols!r}; valid: {', '.join(SYMBOL_SETS)}.")
        coords.check_format(self.observation_format)
        if self.instruction not in INSTRUCTIONS:
            raise ValueError(f"unknown instruction {self.instruction!r}; valid: {', '.join(INSTRUCTIONS)}.")
        for name in ("num_candidates", "search_depth", "gen_tries", "solver_max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.jitter_max_steps < 0:
            raise ValueError(f"jitter_max_steps must be >= 0, got {self.jitter_max_steps}.")


def flat_deltas(width: int) -> jnp.ndarray:
    """Flat-index offset of each action for a room of the given width."""
    return jnp.array([dr * width + dc for dr, dc in ACTION_DELTAS], jnp.int32)
