"""Stage 3, the compiled multi-turn rollout (P groups x N episodes in one XLA program).

Public API: `Rollout`, `RolloutConfig`, `Trajectories`, `rollout_metrics`, `format_trajectory`,
`group_seeds_for_iteration`, `init_cache`; `rollout.sampler` (prefill / decode / generate), `rollout.teachers`.
"""

from ragen_jax.rollout.metrics import format_trajectory, rollout_metrics
from ragen_jax.rollout.rollout import Rollout, group_seeds_for_iteration, init_cache
from ragen_jax.rollout.types import RolloutConfig, Trajectories

__all__ = ["Rollout", "RolloutConfig", "Trajectories", "format_trajectory", "group_seeds_for_iteration",
           "init_cache", "rollout_metrics"]
