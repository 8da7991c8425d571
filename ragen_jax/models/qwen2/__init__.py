"""The decoder in Flax NNX for three HF families (qwen2: Qwen2/Qwen2.5, llama: Llama 3.x / SmolLM2,
qwen3): config + presets, model + KV cache, HF weight I/O, sharding rules. `Decoder` / `DecoderConfig`
are family-neutral names of `Qwen2` / `Qwen2Config` (one class each; the family is `cfg.model_type`)."""

from ragen_jax.models.qwen2.config import FAMILIES, PRESETS, Qwen2Config
from ragen_jax.models.qwen2.model import (
    KVCache,
    NewKV,
    PrefixKV,
    Qwen2,
    Qwen2Critic,
    Qwen2Trunk,
    critic_from_policy,
    forward,
    logits_fn,
    with_config,
)
from ragen_jax.models.qwen2.sharding import (
    DEFAULT_RULES,
    batch_sharding,
    cache_sharding,
    make_mesh,
    on_mesh,
    param_shardings,
)
from ragen_jax.models.qwen2.weights import WEIGHT_MAP, from_pretrained, read_config, save_pretrained

Decoder = Qwen2
DecoderConfig = Qwen2Config

__all__ = [
    "DEFAULT_RULES",
    "FAMILIES",
    "Decoder",
    "DecoderConfig",
    "PRESETS",
    "WEIGHT_MAP",
    "KVCache",
    "NewKV",
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
    "on_mesh",
    "param_shardings",
    "read_config",
    "save_pretrained",
    "with_config",
]
