"""Sokoban (RAGEN SimpleSokoban / LargerSokoban / NewSymbols) with on-device room generation."""

from envs_jax.sokoban.env import PRESETS, SokobanEnv, make_sokoban
from envs_jax.sokoban.generator import Room, generate_room
from envs_jax.sokoban.solver import Solution, solve
from envs_jax.sokoban.types import ACTION_NAMES, SokobanConfig, SokobanParams, SokobanState

__all__ = ["PRESETS", "SokobanEnv", "make_sokoban", "Room", "generate_room", "Solution", "solve",
           "ACTION_NAMES", "SokobanConfig", "SokobanParams", "SokobanState"]
