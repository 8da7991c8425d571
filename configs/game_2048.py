"""StarPO-S on RAGEN-2's 2048 (envs.yaml `game_2048`: 4x4, spawn 2 with p 0.9 else 4, log reward,
max_actions_per_traj 700 = the env's max_steps_in_episode, max_tokens 8192; its config.py:
size 4, two_prob 0.9, use_log_reward, invalid_act_score -0.1). The reference's other settings (turns,
actions per turn) are the base config's; its instruction asks for a single action per turn, which is
what the `expectimax` teacher writes. The -0.1 for a move that changes nothing is paid in log mode too
(`noop_rule="promised"`; `--config.env.overrides.noop_rule=reference` gives the reference's 0.0).

    python launch/tpu_train.py --config configs/game_2048.py --workdir runs/game_2048 \\
        --config.model.path=/path/to/Qwen2.5-0.5B-Instruct
"""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "game_2048"  # Game2048Params defaults: the reference's
    cfg.prompt.max_response_words = 8192  # envs.yaml max_tokens (the hint only; the token budget stays)
    cfg.model.dtype = "bfloat16"
    cfg.rollout.cache_dtype = "bfloat16"
    return cfg
