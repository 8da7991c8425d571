"""Per-turn observation keys for GiGPO's anchor states, computed inside the compiled rollout.

The key of a turn is `envs_jax.observation_key` of the state the agent saw when it wrote the turn:
equal keys iff equal observation text, compared word by word (no hashing, so no collisions). The
rest of a turn's segment (turn number, actions left, the last reward) is left out, as verl-agent's
anchor observation is the environment's text alone: the same board at turns 2 and 4 is one anchor.

A mixed batch (`text.mix.MixedTextEnv`) keys each row by its own member, padded with -1 to the widest
member's width (static shapes); GiGPO compares keys only within a group, and a group is one member.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from envs_jax.observation_key import observation_key
from ragen_jax.text.mix import MixedTextEnv

KEY_PAD = -1  # observation keys are indices >= 0, so the padding never equals a real word


def _member_key_fn(env, params) -> Callable[[Any], jax.Array]:
    return lambda state: observation_key(env, state, params)


def state_key_fn(text_env) -> tuple[Callable[[Any], jax.Array], int]:
    """(key of one (unbatched) state -> int32 [D], D) for a TextEnv or a MixedTextEnv. D is static."""
    if not isinstance(text_env, MixedTextEnv):
        fn = _member_key_fn(text_env.env, text_env.env_params)
        state = jax.eval_shape(lambda: jax.tree.map(lambda x: x[0], text_env.reset_rows(jnp.zeros((1,), jnp.int32))))
        return fn, int(jax.eval_shape(fn, state).shape[0])
    fns, widths = [], []
    for member in text_env.members:
        fn, d = state_key_fn(member)
        fns.append(fn)
        widths.append(d)
    width = max(widths)

    def key(state):
        keys = [jnp.pad(fn(st), (0, width - d), constant_values=KEY_PAD)
                for fn, d, st in zip(fns, widths, state.members)]
        return jnp.stack(keys)[state.env]

    return key, width


__all__ = ["KEY_PAD", "state_key_fn"]
