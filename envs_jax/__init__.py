"""Environment registry: `make(name, **overrides) -> (env, params)`.

Names follow the reference's config/envs.yaml tags (RAGEN v1's, plus RAGEN-2's Coord* tags).
Sokoban lives in `envs_jax.sokoban` and is imported only when asked for, so the light environments
work without it.
"""

from __future__ import annotations

import dataclasses

from envs_jax.bandit import ARM_NAME_PAIRS, Bandit, BanditParams
from envs_jax.frozen_lake import FrozenLake, FrozenLakeParams

_LOCAL = {
    "Bandit": lambda: (Bandit(), BanditParams()),
    "BanditTest": lambda: (Bandit(), BanditParams(low_name="Trader", high_name="Librarian")),
    "FrozenLake": lambda: (FrozenLake(), FrozenLakeParams()),
    # RAGEN-2's Bandit / BanditTest: a (low, high) name pair drawn per reset from its train / test list.
    "BanditPairs": lambda: (Bandit(), BanditParams(name_pairs=ARM_NAME_PAIRS["train"])),
    "BanditPairsTest": lambda: (Bandit(), BanditParams(name_pairs=ARM_NAME_PAIRS["test"])),
    # RAGEN-2's CoordFrozenLake: coordinates + grid, its instruction, and its envs.yaml success_rate 0.8.
    "CoordFrozenLake": lambda: (FrozenLake(), FrozenLakeParams(
        observation_format="grid_coord", instruction="coord", slip=0.2)),
}
_SOKOBAN = ("Sokoban", "LargerSokoban", "NewSymbolsSokoban", "CoordSokoban")


def registered_envs() -> tuple[str, ...]:
    """All names `make` accepts."""
    return tuple(_LOCAL) + _SOKOBAN


def make(name: str, **overrides):
    """The environment and its parameters for a registered name; `overrides` replace parameters.

    Raises ValueError for an unknown name, an unknown parameter name, or an invalid value.
    """
    if name in _SOKOBAN:
        from envs_jax.sokoban import make_sokoban  # lazy: heavy, and built separately

        return make_sokoban(name, **overrides)
    if name not in _LOCAL:
        raise ValueError(f"unknown environment {name!r}; valid: {', '.join(registered_envs())}")
    env, params = _LOCAL[name]()
    valid = [f.name for f in dataclasses.fields(params)] + list(getattr(env, "override_aliases", ()))
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(map(repr, unknown))} for {name}; valid: {', '.join(valid)}"
        )
    if hasattr(env, "resolve_overrides"):  # aliases (FrozenLake success_rate) and list-valued overrides
        overrides = env.resolve_overrides(overrides)
    params = params.replace(**overrides)
    env.validate_params(params)
    return env, params


__all__ = ["make", "registered_envs", "Bandit", "BanditParams", "FrozenLake", "FrozenLakeParams"]
