"""Sokoban as a jittable gymnax environment with the RAGEN (gym-sokoban) rules and texts."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from gymnax.environments import spaces

from envs_jax.base import AgentEnv
from envs_jax.sokoban import render
from envs_jax.sokoban.generator import generate_room
from envs_jax.sokoban.solver import Solution, solve
from envs_jax.sokoban.types import (
    ACTION_NAMES, COORD_LABELS, WALL, SokobanConfig, SokobanParams, SokobanState, flat_deltas,
)


class SokobanEnv(AgentEnv):
    """Push every box onto a target. Actions 0..3 = Up, Down, Left, Right.

    Rewards (gym-sokoban): step_reward per executed action, +/-1 when the number of boxes on
    targets goes up/down, +10 when all are on targets (the episode then terminates).
    """

    def __init__(self, config: SokobanConfig | None = None):
        super().__init__()
        self.config = config or SokobanConfig()
        self.config.validate()

    @property
    def default_params(self) -> SokobanParams:
        return SokobanParams()

    @property
    def name(self) -> str:
        return "Sokoban"

    @property
    def num_actions(self) -> int:
        return 4

    def action_space(self, params=None):
        return spaces.Discrete(4)

    def observation_space(self, params=None):
        h, w = self.config.dim_room
        return spaces.Box(0, 6, (h, w), jnp.int32)

    # ---- episode ---------------------------------------------------------------------------------
    def reset_env(self, key, params):
        room = generate_room(key, params, self.config)
        state = SokobanState(walls=room.walls, targets=room.targets, boxes=room.boxes, player=room.player,
                             time=jnp.int32(0), done=jnp.bool_(False))
        return self.get_obs(state, params), state

    def boxes_on_target(self, state: SokobanState) -> jax.Array:
        return jnp.sum(state.targets.reshape(-1)[state.boxes], dtype=jnp.int32)

    def transition(self, key, state: SokobanState, action, params):
        w = self.config.dim_room[1]
        walls = state.walls.reshape(-1)
        d = flat_deltas(w)[jnp.asarray(action, jnp.int32)]
        n_cells = walls.shape[0]
        nxt = jnp.clip(state.player + d, 0, n_cells - 1)
        nxt2 = jnp.clip(state.player + 2 * d, 0, n_cells - 1)
        box_here = state.boxes == nxt
        has_box = jnp.any(box_here)
        can_push = ~walls[nxt2] & ~jnp.any(state.boxes == nxt2)
        move = ~walls[nxt] & (~has_box | can_push)
        boxes = jnp.where(box_here & move, nxt2, state.boxes)
        new = state.replace(boxes=boxes, player=jnp.where(move, nxt, state.player))
        before, after = self.boxes_on_target(state), self.boxes_on_target(new)
        success = after == self.config.num_boxes
        reward = (params.step_reward
                  + jnp.where(after > before, params.box_on_target_reward, 0.0)
                  + jnp.where(after < before, params.box_off_target_reward, 0.0)
                  + jnp.where(success, params.finish_reward, 0.0))
        return new, reward, success, {"action_is_effective": move}

    def is_success(self, state, params):
        return self.boxes_on_target(state) == self.config.num_boxes

    # ---- text ------------------------------------------------------------------------------------
    def action_names(self, params=None) -> tuple[str, ...]:
        return ACTION_NAMES

    def symbols(self, params=None) -> tuple[str, ...]:
        return render.symbols(self.config.symbols)

    def cell_symbol_sets(self, params=None) -> list[list[tuple[int, ...]]]:
        """Symbols each cell can show (the text layer builds its row tables from this): the border
        is always wall, inner cells anything."""
        h, w = self.config.dim_room
        every = tuple(range(len(self.symbols(params))))
        return [[(WALL,) if r in (0, h - 1) or c in (0, w - 1) else every for c in range(w)] for r in range(h)]

    def instructions(self, params=None) -> str:
        return render.instructions(self.config.symbols, self.config.instruction, self.config.observation_format)

    def observation_format(self, params=None) -> str:
        return self.config.observation_format

    def coordinate_labels(self, params=None) -> tuple[str, ...]:
        return COORD_LABELS if self.config.observation_format != "grid" else ()

    def coordinate_budget(self, params=None) -> tuple[int, int]:
        # Lines: Targets, Boxes and/or Boxes on target, one of the two player lines. Cells: every
        # target, every box (in one of the two box lines), the player.
        n = self.config.num_boxes
        return 4, 2 * n + 1

    def coordinate_masks(self, state, params=None):
        return render.coordinate_masks(state)

    def coordinate_entities(self, state, params=None):
        return render.coordinate_entities(state)

    def render_grid(self, state, params=None):
        return render.render_grid(state)

    # ---- solver ----------------------------------------------------------------------------------
    def solve(self, state: SokobanState, params=None) -> Solution:
        """Shortest solution from `state` (jittable): (actions[max_len] padded with -1, length, solvable)."""
        return solve(state.walls, state.targets, state.boxes, state.player, self.config.solver_max_len)


_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(SokobanConfig))
_PARAM_FIELDS = tuple(f.name for f in dataclasses.fields(SokobanParams))

PRESETS = {
    # num_candidates (K) x search_depth (D) tuned so the BFS-optimal solution lengths match the
    # reference's (bench/sokoban_difficulty.py): 6x6 median 4 / mean ~4.0, 8x8 median 6 / mean ~6.0.
    # (The reference's exhaustive DFS uses depths 300 and 10; random sequences need other D.)
    "Sokoban": dict(dim_room=(6, 6), num_boxes=1, num_candidates=64, search_depth=40),
    # ~46% of 8x8 two-box tries score 0 (vs 14% for 6x6), hence more tries before the fallback.
    "LargerSokoban": dict(dim_room=(8, 8), num_boxes=2, num_candidates=192, search_depth=14, gen_tries=16),
    # Same rooms as Sokoban, only the symbols differ (the reference also used DFS depth 30 here).
    "NewSymbolsSokoban": dict(dim_room=(6, 6), num_boxes=1, num_candidates=64, search_depth=40, symbols="new"),
    # RAGEN-2's CoordSokoban: SimpleSokoban's rooms shown as coordinates + grid, with its own instruction.
    "CoordSokoban": dict(dim_room=(6, 6), num_boxes=1, num_candidates=64, search_depth=40,
                         observation_format="grid_coord", instruction="coord"),
}


def make_sokoban(name: str = "Sokoban", **overrides) -> tuple[SokobanEnv, SokobanParams]:
    """(env, params) for a PRESETS name ("Sokoban", "LargerSokoban", ...); overrides may name any
    SokobanConfig field (static: shapes, search sizes, symbols) or SokobanParams field (dynamic)."""
    if name not in PRESETS:
        raise ValueError(f"unknown Sokoban variant {name!r}; valid: {', '.join(PRESETS)}.")
    unknown = sorted(set(overrides) - set(_CONFIG_FIELDS) - set(_PARAM_FIELDS))
    if unknown:
        raise ValueError(f"unknown Sokoban parameter(s) {', '.join(map(repr, unknown))}; valid: "
                         f"{', '.join(_CONFIG_FIELDS + _PARAM_FIELDS)}.")
    cfg_kw = dict(PRESETS[name])
    cfg_kw.update({k: v for k, v in overrides.items() if k in _CONFIG_FIELDS})
    if "dim_room" in cfg_kw:
        cfg_kw["dim_room"] = tuple(int(x) for x in cfg_kw["dim_room"])
    env = SokobanEnv(SokobanConfig(**cfg_kw))
    params = SokobanParams(**{k: v for k, v in overrides.items() if k in _PARAM_FIELDS})
    return env, params
