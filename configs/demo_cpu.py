"""The CPU demo, Sokoban stages (launch/demo.py): a tiny Qwen2 with the real Qwen2.5 tokenizer.

Stage 1 (launch/sft.py semantics): supervised warm start on BFS-solver demonstrations.
Stage 2 (launch/tpu_train.py semantics, `model.init_from` = the SFT run): StarPO-S RL.
launch/demo.py sets `model.init_from` for stage 2 and shrinks everything further under --quick.
Every value that differs from the reference default (ragen_jax/experiment/config.py) is set here, with why.
"""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "Sokoban"  # 6x6, one box: the paper's main task
    # -- model: small enough to train on 2 CPU cores in minutes, same architecture as Qwen2.5.
    cfg.model.random_init = True  # no pretrained checkpoint on a CPU box; the warm start replaces it
    cfg.model.preset = "tiny"  # hidden 64, 2 layers, GQA 4/2 heads, tied embeddings
    # Only the ~few hundred Qwen ids the task's texts use: the 151,936-row embedding/head would
    # dominate compute and memory of a 64-wide model. Texts are still tokenised by Qwen2.5.
    cfg.model.vocab = "task"
    cfg.model.critic = "none"  # GRPO needs no critic: half the compute of PPO with a separate critic
    # -- prompt: short answers. The templated demo thought + 5 actions fit in ~30 tokens, so a
    # 400-token budget would only spend decode steps on padding.
    cfg.prompt.max_turns = 5
    cfg.prompt.max_actions_per_turn = 5
    cfg.prompt.max_response_tokens = 40
    # RAGEN-2's single-turn context (window 1): a turn sees the prompt and the current room only. A
    # room is Markov, and a later turn then looks like the first turns the warm start learned from
    # (with the whole history, a turn after a failed plan was malformed a third of the time), and the
    # trainer scores one turn's tokens instead of the conversation's (docs/experiments/demo.md).
    cfg.prompt.context_window_mode = "single_turn"
    cfg.prompt.max_context_window = 1
    cfg.rollout.max_context = 768  # the record of up to 5 turns: a ~170-token prefix, then ~110 per turn
    # -- rollout: P x N smaller than the reference's 8 x 16 (CPU time), still groups for GRPO.
    cfg.rollout.num_groups = 8
    cfg.rollout.group_size = 8
    # -- algorithm: GRPO with per-group mean/std normalisation (no critic to warm up in a short run).
    cfg.advantage.estimator = "grpo"
    cfg.advantage.reward_norm = "mean_std"
    cfg.filter.value = 0.5  # keep 4 of 8 groups: fewer groups than the reference, so keep more
    # Two epochs of two mini-batches of 16: four optimizer steps per rollout, so the PPO ratio moves
    # off 1 and the clip acts; with one on-policy step per rollout RL left the warm start unchanged.
    cfg.batching.ppo_epochs = 2
    cfg.batching.mini_batch_size = 16
    # A tiny randomly initialised model needs a far larger step than a pretrained 0.5B (1e-6).
    cfg.optim.actor_lr = 1e-4  # 5e-5 moved too little; 2e-4 and more lost states (docs/experiments/demo.md)
    cfg.optim.critic_lr = 1e-4
    cfg.mesh.data = 1  # one device (a real 2-core box has one; the tests simulate 8)
    # Single-turn turns make an iteration cheap (~2.5 s alone). The gain keeps growing past 210
    # iterations on three of the four published warm starts: 300 took their k = 8 gains from
    # +5.8 / +8.7 / +5.3 / +7.8 to +9.0 / +9.1 / +5.6 / +11.5 points, every one p < 0.01
    # (docs/experiments/demo.md, "Levers measured on the way").
    cfg.train.iterations = 300
    cfg.train.val_every = 0  # launch/demo.py evaluates after each stage (one compiled eval rollout)
    # No RAGEN-2 collapse diagnostics (logged under collapse/, not in the demo's curves): the RL result
    # is the same without them (they draw no training randomness), and on 2 cores they are a sizeable
    # share of the RL stage's CPU time (docs/experiments/demo.md, "Sokoban RL").
    cfg.train.collapse_every = 0
    cfg.train.save_every = 300
    cfg.train.log_samples = 1
    # -- SFT: the reference warm-started on ~1k BFS solutions. A from-scratch 64-wide model first
    # learns the format and a state-blind plan (loss plateau ~0.28, ~18% success); reading the grid
    # starts only after ~600-900 steps of batch 32 and keeps improving with more steps (docs/experiments/demo.md:
    # 8192 demos, constant lr: 35% at step 960, 51% at 1920, 61% at 2240, 58% at 2540; a cosine
    # decay over 2032 steps stopped at 45%). Fresh demos are cheap (~10 s per 8192), so many rather
    # than many epochs. The shared prompt prefix and length buckets (sft.shared_prefix,
    # sft.length_bucket, on by default) make a step ~4x cheaper; this stage is still most of the demo.
    cfg.sft.num_demos = 8192
    cfg.sft.epochs = 9
    cfg.sft.batch_size = 32
    cfg.sft.lr = 3e-3
    cfg.sft.save_every = 1000  # checkpoints only at the end: the demo is short and restartable
    return cfg
