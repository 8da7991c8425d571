"""SmolLM2-135M-Instruct on Countdown (RAGEN's `Countdown`: one answer, an expression over the task's
numbers): format warm start on the solver's expressions, then StarPO-S RL.

    bash scripts/gpu_learn.sh                        # on a lent GPU, after Sokoban and FrozenLake (docs/experiments/pretrained.md)

Single turn like configs/smollm2_bandit.py; the answer budget covers the warm start's thought and an
expression of four numbers with room to spare.
"""

from ragen_jax.experiment.config import Config
from ragen_jax.models.gguf import SMOLLM2_135M_INSTRUCT


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "Countdown"
    cfg.model.path = SMOLLM2_135M_INSTRUCT
    cfg.model.dtype = "float32"  # see configs/smollm2_bandit.py
    cfg.rollout.cache_dtype = "float32"
    cfg.model.critic = "none"  # GRPO: one answer per episode
    cfg.prompt.max_turns = 1
    cfg.prompt.max_actions_per_turn = 1
    cfg.prompt.max_response_tokens = 64
    cfg.rollout.max_context = 512
    cfg.rollout.num_groups = 8
    cfg.rollout.group_size = 8
    cfg.advantage.estimator = "grpo"
    cfg.advantage.reward_norm = "mean_std"
    cfg.filter.value = 0.5
    cfg.batching.mini_batch_size = 32
    cfg.optim.actor_lr = 1e-5
    cfg.mesh.data = 1
    cfg.train.iterations = 10
    cfg.train.val_every = 0
    cfg.train.collapse_every = 0
    cfg.train.save_every = 10
    cfg.train.log_samples = 1
    cfg.sft.num_demos = 256
    cfg.sft.epochs = 1
    cfg.sft.batch_size = 16
    cfg.sft.lr = 1e-4  # see configs/smollm2_bandit.py
    cfg.sft.lr_schedule = "cosine"
    cfg.sft.save_every = 1000
    return cfg
