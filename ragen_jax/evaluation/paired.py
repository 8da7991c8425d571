"""Paired before/after comparison of two evaluations on the same states (exact McNemar test).

Two evaluations of a policy on the same fixed initial states with the same sampling key are paired:
a state that both solve (or both fail) says nothing about the change, only the states that flipped
do. Under "no change", each discordant state is equally likely to have flipped either way, so the
number that improved is Binomial(discordant, 1/2); the two-sided exact McNemar p-value is the
probability, under that law, of a split at least as uneven as the one seen. An independent-samples
standard error ignores the pairing and is far too wide when most states keep their outcome.
"""

from __future__ import annotations

import math
from typing import Sequence


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value for `gained` states that flipped fail -> success and `lost`
    that flipped success -> fail: min(1, 2 * P[Binomial(gained + lost, 1/2) <= min(gained, lost)]).
    No discordant state gives 1.0."""
    for name, v in (("gained", gained), ("lost", lost)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a whole number >= 0 (a count of states), got {v!r}")
    n, k = gained + lost, min(gained, lost)
    if n == 0:
        return 1.0
    # Exact integer tail, one division: no float underflow for large n.
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2 ** n)


def paired_change(before: Sequence[float], after: Sequence[float]) -> dict:
    """Compare per-state success lists (same states, same order; one rollout per state: 0 or 1).

    Returns {"states", "before", "after", "change" (after - before success rate), "gained"
    (fail -> success), "lost" (success -> fail), "p_value" (exact McNemar, two-sided)}.
    """
    if len(before) != len(after):
        raise ValueError(f"paired comparison needs the same states before and after, got {len(before)} "
                         f"and {len(after)} per-state results; evaluate both on the same num_states")
    if not before:
        raise ValueError("paired comparison needs at least one state")
    for v in list(before) + list(after):
        if v not in (0, 1, 0.0, 1.0):
            raise ValueError(f"per-state success must be 0 or 1 (one rollout per state), got {v!r}; "
                             "evaluate with rollouts_per_state=1")
    gained = sum(1 for b, a in zip(before, after) if not b and a)
    lost = sum(1 for b, a in zip(before, after) if b and not a)
    n = len(before)
    sb, sa = sum(map(float, before)) / n, sum(map(float, after)) / n
    return {"states": n, "before": sb, "after": sa, "change": sa - sb, "gained": gained, "lost": lost,
            "p_value": mcnemar_exact(gained, lost)}


__all__ = ["mcnemar_exact", "paired_change"]
