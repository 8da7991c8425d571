"""Qwen2 / Qwen2.5 in Flax NNX: config + presets, model + KV cache, HF weight I/O, sharding rules."""

from ragen_jax.models.qwen2.config import PRESETS, Qwen2Config
from ragen_jax.models.qwen2.model import (
    KVCache,
    Qwen2,
    Qwen2Critic,
    Qwen2Trunk,
    critic_from_policy,
    forward,
    logits_fn,
)

__all__ = [
    "PRESETS",
    "KVCache",
    "Qwen2",
    "Qwen2Config",
    "Qwen2Critic",
    "Qwen2Trunk",
    "critic_from_policy",
    "forward",
    "logits_fn",
]
