"""Environment registry: `make(name, **overrides) -> (env, params)` and one record per environment
(`get_spec(name) -> EnvSpec`, envs_jax/registry.py) that every consumer reads.

Names follow the reference's config/envs.yaml tags (RAGEN v1's, plus RAGEN-2's Coord* tags).
"""

from __future__ import annotations

from envs_jax.bandit import Bandit, BanditParams
from envs_jax.frozen_lake import FrozenLake, FrozenLakeParams
from envs_jax.registry import (TEACHER_KINDS, EnvSpec, dataclass_build, default_eval_suite, get_spec, make, register,
                               registered_envs, unregister)

__all__ = ["make", "registered_envs", "get_spec", "register", "unregister", "default_eval_suite", "dataclass_build",
           "EnvSpec", "TEACHER_KINDS", "Bandit", "BanditParams", "FrozenLake", "FrozenLakeParams"]
