"""StarPO-S on Countdown (RAGEN's config/_4_countdown.yaml + envs.yaml `Countdown`): one turn with one
answer, an arithmetic expression over the task's numbers, max_tokens 100."""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "Countdown"
    cfg.prompt.max_turns = 1  # agent_proxy.max_turn
    cfg.prompt.max_actions_per_turn = 1
    cfg.prompt.max_response_words = 100  # envs.yaml max_tokens
    cfg.model.dtype = "bfloat16"
    cfg.rollout.cache_dtype = "bfloat16"
    return cfg
