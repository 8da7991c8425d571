"""RAGEN-2's main-table Sokoban run (PPO, "filter" column) with Qwen2.5-3B-Instruct.

    python launch/tpu_train.py --config sokoban_v2.py --workdir runs/sokoban_v2 \
        --config.model.path=/path/to/Qwen2.5-3B-Instruct

Where each setting comes from (RAGEN repository, mll-lab-nu/RAGEN):
- scripts/runs/run_main_table_diff_algo.sh (PPO, filter) and docs/experiment_main_table.md: PPO =
  GAE + token-mean loss, no KL; filter = top_p 0.9, top_p_prob_mode softmax, type largest, metric
  reward_variance (our reward_std), include_zero True, filter_loss_scaling none; 400 steps;
  model Qwen2.5-3B-Instruct.
- config/base.yaml: clip 0.2 / 0.28, entropy_coeff 0.001, actor lr 1e-6, critic lr 1e-5,
  ppo_mini_batch_size 32, 8 groups x 16 rollouts, max_turn 5, max_actions_per_turn 2, response
  length 400 tokens per turn, max_model_len 3600, temperature 1 (validation 0.5), format penalty
  -0.1, test_freq 10, validation 512 states x 1 (seed 123), training seeds from 10000,
  collapse_detection (every 5 steps and at step 1, 64 pairs), rollout_filter_empty_stop_steps 5.
- config/envs.yaml CoordSokoban: 6x6, 1 box, coordinates + grid observations, its instruction,
  max_tokens 120 (the "Max response length" hint), 10 actions per episode.
- docs/guide_filtering_and_loss_scaling.md: the reward-variance stop (10 steps below 0.1 x the mean
  of the first 10) and the validation-success stop (below 1% for 5 validations), always on in
  RAGEN's trainer; here train.stop_* (off by default elsewhere).
"""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "CoordSokoban"  # RAGEN-2 trains and validates on coordinate observations
    cfg.env.val_envs = ()
    cfg.model.preset = "qwen2.5-3b"
    cfg.model.dtype = "bfloat16"  # compute; params and optimizer stay float32
    cfg.rollout.cache_dtype = "bfloat16"

    cfg.prompt.max_turns = 5
    cfg.prompt.max_actions_per_turn = 2
    cfg.prompt.max_response_words = 120
    cfg.prompt.max_response_tokens = 400
    cfg.rollout.num_groups = 8
    cfg.rollout.group_size = 16
    cfg.rollout.max_context = 3600

    cfg.advantage.estimator = "gae"
    cfg.loss.agg = "token-mean"
    cfg.loss.eps_low, cfg.loss.eps_high = 0.2, 0.28
    cfg.loss.entropy_coef = 0.001
    cfg.loss.kl_coef = 0.0
    cfg.filter.strategy = "top_p"
    cfg.filter.top_p_mode = "softmax"
    cfg.filter.value = 0.9
    cfg.filter.select = "largest"
    cfg.filter.metric = "reward_std"
    cfg.filter.include_zero = True
    cfg.filter.loss_scaling = "none"
    cfg.batching.mini_batch_size = 32  # up to 128 rows (all 8 groups, unselected ones weight 0): 4 steps at most

    cfg.optim.actor_lr = 1e-6
    cfg.optim.critic_lr = 1e-5

    cfg.train.iterations = 400
    cfg.train.val_every = 10
    cfg.train.val_size = 512
    cfg.train.val_temperature = 0.5
    cfg.train.collapse_every = 5
    cfg.train.collapse_samples = 64
    cfg.train.stop_empty_filter = 5
    cfg.train.stop_std_fraction, cfg.train.stop_std_window = 0.1, 10
    cfg.train.stop_val_success, cfg.train.stop_val_count = 0.01, 5
    return cfg
