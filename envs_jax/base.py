"""The shared shape of every ragen-jax environment: gymnax 1.0 API plus text and episode rules.

Multi-turn LLM episodes need an episode that ENDS and stays ended (the rollout keeps stepping a
whole batch with masks), so `step_env` here never auto-resets; gymnax's own `step` still does, for
users of the plain gymnax API. Subclasses implement `transition` (the rules) and the text hooks;
time-keeping, truncation and the freeze of ended episodes live here, once.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import environment

from envs_jax import coords


class AgentEnv(environment.Environment):
    """Base class. Every state is a struct.dataclass with `time` (executed actions) and `done`; every
    params has `max_steps_in_episode` (the base truncates there, and the text layer's default action
    budget is it).

    Everything the text layer (ragen_jax/text/text_env.py), the rollout and the registry use of an
    environment is declared here, with its default: what a subclass does not override behaves as
    documented, and nothing outside envs_jax/ asks whether an env has a method.
    """

    # How the text layer reads the agent's answer: "names" (action names separated by " || ", the
    # default: any finite set of answers), "expression" (Countdown's arithmetic) or "placement"
    # (Sudoku's free-text placements). Each is a parser the text layer owns (`TextEnv.make_parser`).
    answer_format: str = "names"
    # Override names `envs_jax.make(name, **overrides)` accepts besides the params' fields (resolved by
    # `resolve_overrides`).
    override_aliases: tuple[str, ...] = ()

    # ---- to implement in subclasses -------------------------------------------------------------
    def transition(self, key: jax.Array, state: Any, action: jax.Array, params: Any):
        """One executed action on a live episode -> (new_state, reward, terminated, info).

        `info` holds at least `action_is_effective` (bool). `time`/`done` are handled by the base.
        """
        raise NotImplementedError

    def is_success(self, state: Any, params: Any) -> jax.Array:
        raise NotImplementedError

    def action_names(self, params: Any) -> tuple[str, ...]:
        """Action names in action-index order, as the agent must write them (matched ignoring case)."""
        raise NotImplementedError

    def instructions(self, params: Any) -> str:
        """The environment-specific part of the first user message (description, symbol legend)."""
        raise NotImplementedError

    def symbols(self, params: Any) -> tuple[str, ...]:
        """The strings that `render_grid` indices refer to."""
        raise NotImplementedError

    def render_grid(self, state: Any, params: Any) -> jax.Array:
        """int32[H, W] indices into `symbols(params)`; jittable. The text is rows joined by newline."""
        raise NotImplementedError

    def valid_actions(self, state: Any, params: Any) -> jax.Array | None:
        """bool[len(action_names)]: the action names `state` accepts (jittable); the text layer drops the
        others and penalises the turn (BanditPairs: only the episode's own pair). None (the default):
        every name in every state, and nothing is dropped."""
        return None

    def cell_symbol_sets(self, params: Any) -> list[list[tuple[int, ...]]] | None:
        """[H][W] tuples of the symbol indices each grid cell can show: keeps the text layer's row
        tables small (Sokoban's border is always wall). None (the default): every symbol anywhere."""
        return None

    def lists_actions(self, params: Any) -> bool | None:
        """Whether the first user message lists the action names (the reference does where the env's
        config has an `action_lookup`); None: the text layer's default (grid envs and named slot envs)."""
        return None

    # ---- configuration (optional) ------------------------------------------------------------------
    def resolve_overrides(self, overrides: dict) -> dict:
        """Overrides as `make` received them -> params fields (aliases, list-valued forms). Default: as given."""
        return dict(overrides)

    def validate_params(self, params: Any) -> None:
        """Raise ValueError (one sentence naming the bad field) for parameters the env cannot honour.
        Default: every value accepted."""

    # ---- coordinate observations (optional; see envs_jax/coords.py) ------------------------------
    def observation_format(self, params: Any) -> str:
        """"grid" (the symbol grid), "grid_coord" (coordinates, then the grid), "coord", or "slots"
        (a state text assembled from `text_slots`, no grid: the cube, 2048, Sudoku, Countdown)."""
        return "grid"

    def text_slots(self, params: Any) -> tuple[tuple[str, ...], ...]:
        """"slots" format: the alternatives of each slot of the state text; the state text is one
        alternative of each slot, in order, its final newline included."""
        raise NotImplementedError

    def text_slot_index(self, state: Any, params: Any) -> jax.Array:
        """"slots" format: int32[len(text_slots)], which alternative each slot shows (jittable)."""
        raise NotImplementedError

    def coordinate_labels(self, params: Any) -> tuple[str, ...]:
        """Labels of the coordinate lines, in the reference's order (empty: no coordinate text)."""
        return ()

    def coordinate_budget(self, params: Any) -> tuple[int, int]:
        """(most non-empty lines, most listed cells in all lines) a state can show: the text layer's
        static token budget for the coordinate block."""
        raise NotImplementedError

    def coordinate_masks(self, state: Any, params: Any) -> jax.Array:
        """bool[K, H, W]: the cells each coordinate line lists (jittable), K = len(coordinate_labels)."""
        raise NotImplementedError

    def coordinate_entities(self, state: Any, params: Any) -> list[tuple[str, list[tuple[int, int]]]]:
        """Host side: (label, cells in row-major order) per line, computed as the reference does."""
        raise NotImplementedError

    # ---- extra state lines (optional, not the reference's) -----------------------------------------
    def extra_lines(self, params: Any) -> tuple[tuple[str, ...], ...]:
        """Lines shown after the state, each one text out of a fixed tuple of alternatives (no
        newline): the text layer tokenizes every alternative once. Empty (the default): none."""
        return ()

    def extra_line_index(self, state: Any, params: Any) -> jax.Array:
        """int32[len(extra_lines)]: which alternative each line shows (jittable)."""
        raise NotImplementedError

    def extra_line_texts(self, state: Any, params: Any) -> list[str]:
        """Host side: the texts of the extra lines, written directly (the reference for the index)."""
        raise NotImplementedError

    # ---- shared ----------------------------------------------------------------------------------
    def grid_text(self, state: Any, params: Any) -> str:
        """The symbol grid as text: rows joined by newlines (host side)."""
        grid = np.asarray(jax.device_get(self.render_grid(state, params)))
        syms = self.symbols(params)
        return "\n".join("".join(syms[int(c)] for c in row) for row in grid)

    def render_text(self, state: Any, params: Any) -> str:
        """The reference's text of the state in the env's observation format (host side), then the
        env's extra lines, if any."""
        fmt = self.observation_format(params)
        text = self.grid_text(state, params)
        if fmt != "grid":
            h, w = np.asarray(jax.device_get(self.render_grid(state, params))).shape
            text = coords.observation_text(fmt, self.coordinate_entities(state, params), h, w, text)
        if self.extra_lines(params):
            text = "\n".join([text, *self.extra_line_texts(state, params)])
        return text

    def step_env(self, key, state, action, params):
        new_state, reward, terminated, info = self.transition(key, state, action, params)
        time = state.time + 1
        truncated = time >= params.max_steps_in_episode
        new_state = new_state.replace(time=time, done=jnp.logical_or(terminated, truncated))
        # An episode that already ended ignores the action entirely: state, reward and flags frozen.
        ended = jnp.asarray(state.done)
        out_state = jax.tree.map(lambda old, new: jnp.where(ended, old, new), state, new_state)
        reward = jnp.where(ended, 0.0, jnp.asarray(reward, jnp.float32))
        info = {k: jnp.where(ended, jnp.zeros_like(v), v) for k, v in info.items()}
        info["success"] = self.is_success(out_state, params)
        terminated = jnp.where(ended, False, terminated)
        return self.get_obs(out_state, params), out_state, reward, terminated, info

    def get_obs(self, state, params=None, key=None):
        return self.render_grid(state, params)

    def is_terminated(self, state, params) -> jax.Array:
        return jnp.asarray(state.done)

    def is_truncated(self, state, params) -> jax.Array:
        return state.time >= params.max_steps_in_episode

    @property
    def num_actions(self) -> int:
        raise NotImplementedError
