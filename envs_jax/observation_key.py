"""An exact, jittable key of what a state shows the agent (GiGPO's anchor observation).

The observation text of a state (`BaseGridEnv.render_text`) is a function of three arrays: the symbol
grid `render_grid`, the coordinate masks (observation formats other than "grid") and the extra-line
indices (envs with extra lines). Their concatenation, flattened to int32, is the key: two states give
equal keys iff they render the same text, with no hash collisions (GiGPO compares keys word by word).
Time, the RNG key and other hidden fields are left out, as verl-agent's anchor observation (the env's
text observation) leaves them out.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def observation_key(env: Any, state: Any, params: Any) -> jax.Array:
    """int32 [D] key of one (unbatched) state; D is static for an env and its params. vmap it over rows."""
    parts = [env.render_grid(state, params).reshape(-1).astype(jnp.int32)]
    if env.observation_format(params) != "grid":
        parts.append(env.coordinate_masks(state, params).reshape(-1).astype(jnp.int32))
    if env.extra_lines(params):
        parts.append(env.extra_line_index(state, params).reshape(-1).astype(jnp.int32))
    return jnp.concatenate(parts)


__all__ = ["observation_key"]
