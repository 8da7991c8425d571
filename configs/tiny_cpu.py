"""A randomly initialised tiny Qwen2 on Sokoban: the whole training loop in a minute on a CPU.

Learns nothing in a few iterations; it exists to exercise every part (rollout, filter, PPO with a
critic, checkpoints, TensorBoard) quickly, in CI and on a laptop.
"""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "Sokoban"
    cfg.model.random_init = True
    cfg.model.preset = "tiny"
    # A model vocabulary of just the ids the task uses (mapped in-graph): 100x cheaper output layer.
    cfg.model.vocab = "task"
    cfg.prompt.max_turns = 2
    cfg.prompt.max_response_tokens = 24
    cfg.rollout.num_groups = 4
    cfg.rollout.group_size = 4
    cfg.rollout.max_context = 768
    cfg.filter.value = 0.5  # 2 of 4 groups = 8 trajectories
    cfg.batching.mini_batch_size = 4  # 2 optimizer steps per iteration
    cfg.optim.actor_lr = 1e-4
    cfg.optim.critic_lr = 1e-4
    cfg.train.iterations = 4
    cfg.train.val_every = 2
    cfg.train.val_size = 8
    cfg.train.save_every = 2
    return cfg
