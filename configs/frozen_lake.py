"""StarPO-S on FrozenLake with Qwen2.5-0.5B-Instruct (reference defaults)."""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "FrozenLake"
    cfg.model.dtype = "bfloat16"
    cfg.rollout.cache_dtype = "bfloat16"
    return cfg
