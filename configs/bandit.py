"""StarPO-S on the bi-arm Bandit (single turn, single action), validated also on the test arm names."""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "Bandit"
    cfg.env.val_envs = ("BanditTest",)
    cfg.prompt.max_turns = 1
    cfg.prompt.max_actions_per_turn = 1
    cfg.prompt.max_response_tokens = 500  # the reference's Bandit response budget
    cfg.model.dtype = "bfloat16"
    cfg.rollout.cache_dtype = "bfloat16"
    return cfg
