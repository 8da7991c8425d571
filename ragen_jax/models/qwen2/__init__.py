"""Qwen2 / Qwen2.5 in Flax NNX: config + presets, model + KV cache, HF weight I/O, sharding rules."""

from ragen_jax.models.qwen2.config import PRESETS, Qwen2Config
from ragen_jax.models.qwen2.model import (
    KVCache,
    PrefixKV,
    Qwen2,
    Qwen2Critic,
    Qwen2Trunk,
    critic_from_policy,
    forward,
    logits_fn,
)
from ragen_jax.models.qwen2.sharding import (
    DEFAULT_RULES,
    batch_sharding,
    cache_sharding,
    make_mesh,
    param_shardings,
)
from ragen_jax.models.qwen2.weights import WEIGHT_MAP, from_pretrained, read_config, save_pretrained

__all__ = [
    "DEFAULT_RULES",
    "PRESETS",
    "WEIGHT_MAP",
    "KVCache",
    "PrefixKV",
    "Qwen2",
    "Qwen2Config",
    "Qwen2Critic",
    "Qwen2Trunk",
    "batch_sharding",
    "cache_sharding",
    "critic_from_policy",
    "forward",
    "from_pretrained",
    "logits_fn",
    "make_mesh",
    "param_shardings",
    "read_config",
    "save_pretrained",
]
