"""The CPU demo, FrozenLake stages (launch/demo.py): multi-turn RL with feedback after every action.

4x4 random maps, slip 2/3 (the reference's), 10 actions. The optimal policy with feedback after
every action succeeds about 49% of the time, a random one about 22% (tests/envs_jax/test_frozen_lake.py).
Stage 1 warm-starts on the value-iteration teacher's demonstrations (one action per turn,
ragen_jax/rollout/teachers.py), kept short on purpose; stage 2 is StarPO-S RL from that export.
Every value that differs from the reference default (ragen_jax/experiment/config.py) is set here, with why.
"""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "FrozenLake"
    cfg.model.random_init = True  # see configs/demo_cpu.py
    cfg.model.preset = "tiny"
    cfg.model.vocab = "task"
    cfg.model.critic = "none"  # GRPO: group-normalised advantages need no critic
    # One action per turn, ten turns: the env's 10 actions, each with the new state as feedback
    # (the teacher is optimal only with feedback after every action; several blind actions per
    # turn would lose to the slips).
    cfg.prompt.max_turns = 10
    cfg.prompt.max_actions_per_turn = 1
    # No-think answers ("Left</answer>"): a turn is ~5 generated tokens instead of ~20, so ten
    # turns of decoding fit the CPU budget; the thought would be the teacher's fixed sentence anyway.
    cfg.prompt.think = False
    cfg.prompt.max_response_tokens = 8
    # RAGEN-2's single-turn context (window 1): each turn sees the prompt and its own state only. The
    # state is Markov (the map and the player are on the grid), so no information is lost, and a
    # turn costs its own ~75 tokens in the rollout, SFT and update instead of the whole conversation:
    # the FrozenLake stages take about a third of the CPU time of the full history (docs/experiments/demo.md).
    cfg.prompt.context_window_mode = "single_turn"
    cfg.prompt.max_context_window = 1
    cfg.rollout.max_context = 1024  # the record of 10 turns: a 152-token prefix, then ~75 per turn
    cfg.rollout.num_groups = 8
    cfg.rollout.group_size = 8
    cfg.advantage.estimator = "grpo"
    cfg.advantage.reward_norm = "mean_std"
    cfg.filter.value = 0.5  # keep 4 of 8 groups
    cfg.batching.mini_batch_size = 32  # one optimizer step per iteration
    cfg.optim.actor_lr = 3e-4  # tiny random-init model; 1e-4 left success unchanged (docs/experiments/demo.md)
    cfg.mesh.data = 1  # one device
    cfg.train.iterations = 20
    cfg.train.val_every = 0  # launch/demo.py evaluates after each stage
    cfg.train.collapse_every = 0  # see configs/demo_cpu.py
    cfg.train.save_every = 20
    cfg.train.log_samples = 1
    cfg.sft.num_demos = 1024
    cfg.sft.epochs = 3
    cfg.sft.batch_size = 32
    cfg.sft.lr = 3e-3
    cfg.sft.save_every = 1000
    # Demos are 1 to 10 turns (~80 tokens each): wide buckets, so fewer step widths to compile.
    cfg.sft.length_bucket = 256
    return cfg
