"""A randomly initialised tiny Qwen2 on a mixed batch of Sokoban and FrozenLake (RAGEN-2's env mix).

    python launch/tpu_train.py --config mix_cpu.py --workdir runs/mix_cpu

Two groups of each environment in every batch (`env.mix`: the counts sum to rollout.num_groups),
one compiled rollout for both; TensorBoard gets train/Sokoban/* and train/FrozenLake/* next to the
batch's train/*, and validation runs the `env.val_set` list (each env with its number of states).
Learns nothing in a few iterations; it exercises the mix end to end on a CPU (and in CI).
"""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.mix = "Sokoban:2,FrozenLake:2"  # or (("Sokoban", 2), ("FrozenLake", 2))
    cfg.env.val_set = "Sokoban:8,FrozenLake:8"
    cfg.model.random_init = True
    cfg.model.preset = "tiny"
    cfg.model.vocab = "task"  # a model vocabulary of just the ids both envs' texts use
    cfg.prompt.max_turns = 2
    cfg.prompt.max_response_tokens = 24
    cfg.rollout.num_groups = 4
    cfg.rollout.group_size = 4
    cfg.rollout.max_context = 768
    cfg.filter.value = 0.5  # 2 of 4 groups = 8 trajectories, from either env
    cfg.batching.mini_batch_size = 4
    cfg.optim.actor_lr = 1e-4
    cfg.optim.critic_lr = 1e-4
    cfg.train.iterations = 4
    cfg.train.val_every = 2
    cfg.train.save_every = 2
    return cfg
