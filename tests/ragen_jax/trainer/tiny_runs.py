"""Trainer configs shared by several test files of tests/ragen_jax/trainer/.

The test session shares one persistent compilation cache (tests/conftest.py): tests that build a
Trainer from the same config compile its rollout and prepare programs once per session, whichever
file runs first. So files whose truths do not depend on the knobs below use these lists as they are
(add overrides after them only where a test needs another program)."""

# A one-turn Bandit run at temperature 0.5 with a critic, every group kept (filter_ratio 1 keeps the
# rows in order): the rollout's recorded log-probs against the trainer's recomputed ones
# (test_step.py, non-LoRA; test_lora_trainer.py, fresh and non-zero adapters).
BANDIT_T05 = ("env.name=Bandit", "prompt.max_turns=1", "prompt.max_actions_per_turn=1",
              "prompt.max_response_tokens=12", "rollout.max_context=256", "rollout.num_groups=2",
              "rollout.group_size=4", "rollout.temperature=0.5", "filter.value=1.0", "batching.mini_batch_size=8",
              "mesh.data=1", "train.val_every=0")
