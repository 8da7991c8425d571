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
    """Base class. Every state is a struct.dataclass with `time` (executed actions) and `done`."""

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

    def lists_actions(self, params: Any) -> bool | None:
        """Whether the first user message lists the action names (the reference does where the env's
        config has an `action_lookup`); None: the text layer's default (grid envs and named slot envs)."""
        return None

    # ---- coordinate observations (optional; see envs_jax/coords.py) ------------------------------
    def observation_format(self, params: Any) -> str:
        """"grid" (the symbol grid), "grid_coord" (coordinates, then the grid) or "coord"."""
        return "grid"

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
