"""SmolLM2-135M-Instruct on Sokoban (6x6, one box): format warm start on BFS demonstrations, then StarPO-S RL.

    python launch/demo.py --workdir runs/smollm2 --model smollm2 --skip-bandit --skip-frozen-lake

Sized for a 2-core CPU, where one update row of this 135M model costs seconds: few demonstrations
(the warm start teaches the answer format and the action names, not planning) and a short RL stage.
"""

from ragen_jax.experiment.config import Config
from ragen_jax.models.gguf import SMOLLM2_135M_INSTRUCT


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "Sokoban"
    cfg.model.path = SMOLLM2_135M_INSTRUCT
    cfg.model.dtype = "float32"  # see configs/smollm2_bandit.py
    cfg.rollout.cache_dtype = "float32"
    cfg.model.critic = "none"  # GRPO: group-normalised advantages need no critic
    cfg.prompt.max_turns = 5
    cfg.prompt.max_actions_per_turn = 5
    cfg.prompt.max_response_tokens = 40
    cfg.prompt.context_window_mode = "single_turn"
    cfg.prompt.max_context_window = 1
    cfg.rollout.max_context = 768
    cfg.rollout.num_groups = 4
    cfg.rollout.group_size = 4
    cfg.advantage.estimator = "grpo"
    cfg.advantage.reward_norm = "mean_std"
    cfg.filter.value = 0.5  # StarPO-S: the 2 of 4 groups with the highest reward spread
    cfg.batching.mini_batch_size = 8  # one optimizer step per iteration
    cfg.optim.actor_lr = 3e-5  # see configs/smollm2_bandit.py
    cfg.mesh.data = 1
    cfg.train.iterations = 8
    cfg.train.val_every = 0  # launch/demo.py evaluates after each stage
    cfg.train.collapse_every = 0
    cfg.train.save_every = 8
    cfg.train.log_samples = 1
    cfg.sft.num_demos = 64
    cfg.sft.epochs = 1
    cfg.sft.batch_size = 8
    cfg.sft.lr = 1e-4  # see configs/smollm2_bandit.py
    cfg.sft.lr_schedule = "cosine"
    cfg.sft.save_every = 1000
    return cfg
