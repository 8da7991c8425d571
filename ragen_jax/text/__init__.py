"""Stage 1, the in-graph text layer: conversation texts, per-turn token segments rendered inside jit, parsing.

`TextEnv(env, params, tokenizer, PromptConfig(...))` is the entry point (see text_env.py for the
segment contract with the rollout).
"""

from ragen_jax.text.conversation import PromptConfig, format_reward
from ragen_jax.text.text_env import TextEnv

__all__ = ["PromptConfig", "TextEnv", "format_reward"]
