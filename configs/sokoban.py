"""StarPO-S on Sokoban with Qwen2.5-0.5B-Instruct: the reference defaults (behaviour spec 4-7).

    python launch/tpu_train.py --config sokoban.py --workdir runs/sokoban \
        --config.model.path=/path/to/Qwen2.5-0.5B-Instruct
"""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "Sokoban"
    cfg.env.val_envs = ("NewSymbolsSokoban", "LargerSokoban")
    cfg.model.dtype = "bfloat16"  # compute; params and optimizer stay float32
    cfg.rollout.cache_dtype = "bfloat16"
    return cfg
