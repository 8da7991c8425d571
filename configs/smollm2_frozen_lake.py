"""SmolLM2-135M-Instruct on FrozenLake (4x4, slippery): format warm start on the value-iteration teacher, then RL.

    python launch/demo.py --workdir runs/smollm2 --model smollm2 --skip-bandit --skip-sokoban

Sized for a 2-core CPU like configs/smollm2_sokoban.py.
"""

from ragen_jax.experiment.config import Config
from ragen_jax.models.gguf import SMOLLM2_135M_INSTRUCT


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "FrozenLake"
    cfg.model.path = SMOLLM2_135M_INSTRUCT
    cfg.model.dtype = "float32"  # see configs/smollm2_bandit.py
    cfg.rollout.cache_dtype = "float32"
    cfg.model.critic = "none"
    cfg.prompt.max_turns = 10
    cfg.prompt.max_actions_per_turn = 1
    cfg.prompt.think = False  # one action name per turn: the warm start's answer is the action alone
    cfg.prompt.max_response_tokens = 8
    cfg.prompt.context_window_mode = "single_turn"
    cfg.prompt.max_context_window = 1
    cfg.rollout.max_context = 1024
    cfg.rollout.num_groups = 4
    cfg.rollout.group_size = 4
    cfg.advantage.estimator = "grpo"
    cfg.advantage.reward_norm = "mean_std"
    cfg.filter.value = 0.5
    cfg.batching.mini_batch_size = 8
    cfg.optim.actor_lr = 3e-5  # see configs/smollm2_bandit.py
    cfg.mesh.data = 1
    cfg.train.iterations = 8
    cfg.train.val_every = 0
    cfg.train.collapse_every = 0
    cfg.train.save_every = 8
    cfg.train.log_samples = 1
    cfg.sft.num_demos = 64
    cfg.sft.epochs = 1
    cfg.sft.batch_size = 8
    cfg.sft.lr = 1e-4
    cfg.sft.lr_schedule = "cosine"
    cfg.sft.save_every = 1000
    cfg.sft.length_bucket = 256
    return cfg
