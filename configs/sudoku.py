"""StarPO-S on Sudoku (RAGEN's envs.yaml `SimpleSudoku`: 9x9, easy = 32 empty cells, render
`with_feedback`, max_actions_per_traj 20; `MediumSudoku`: 40 empty cells, 30 actions): answers
"row,col,digit" (1-based, the reference's positional format), up to 5 per turn, 5 turns.

    python launch/tpu_train.py --config configs/sudoku.py --workdir runs/sudoku \
        --config.model.path=/path/to/Qwen2.5-0.5B-Instruct
"""

from ragen_jax.experiment.config import Config


def get_config() -> Config:
    cfg = Config()
    cfg.env.name = "SimpleSudoku"
    cfg.env.val_envs = ("MediumSudoku",)
    cfg.model.dtype = "bfloat16"  # compute; params and optimizer stay float32
    cfg.rollout.cache_dtype = "bfloat16"
    return cfg
