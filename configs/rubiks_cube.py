"""StarPO-S on RAGEN-2's 2x2 cube (envs.yaml `rubikscube`): scramble depth 1, 20 moves
(max_steps = max_actions_per_traj), max_tokens 96; the reference's other settings (turns, actions
per turn) are the base config's. `scramble_depth` is an env override: `--config.env.overrides=...`."""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "rubikscube"  # RubiksCubeParams defaults: scramble_depth 1, max_steps_in_episode 20
    cfg.prompt.max_response_words = 96  # envs.yaml max_tokens
    cfg.model.dtype = "bfloat16"
    cfg.rollout.cache_dtype = "bfloat16"
    return cfg
