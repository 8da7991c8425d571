"""StarPO-S rollout filter: keep the groups whose rewards vary most (pure, jittable, static shapes).

Input: `reward [B]` = raw trajectory reward incl. format penalties, BEFORE any normalisation (the
reference's GRPO mode accidentally filtered on normalised scores; we do not). Rows are ordered
group-major (row b in group b // N), as `Trajectories` are. Per group g the score is the SAMPLE std
(torch `.std()`, ddof = 1; N = 1 -> 0) of its N rewards, as the reference's `RewardRolloutFilter`.

Two filters, both returning static shapes (the number of kept groups is a Python int):
- `filter_groups` (reference strategy "top_k"): keep k groups with the largest (or smallest) std,
  k = floor(ratio * P) (the reference's `int(ratio * P)`; "ceil" optional), clamped to [1, P];
  ratio >= 1 keeps every group in its original order.
- `filter_groups_variance_cover` (reference strategy "top_p", `top_p_prob_mode="linear"`): keep the
  largest-std groups until their std sum reaches `fraction * total - 0.01`, at most `k_max` of them.

Ties: groups with exactly equal std keep their index order (a stable sort), so the lowest group index
wins a tie, for both "largest" and "smallest".
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from ragen_jax.algorithms.advantages import _check_group_size, group_std

FILTER_SELECT = ("largest", "smallest")
FILTER_ROUNDING = ("floor", "ceil")


@struct.dataclass
class GroupFilter:
    """Which groups a filter kept. k = number of kept slots (static)."""

    groups: jax.Array  # [k] int32: kept group indices (by rank: best first; ratio >= 1: 0..P-1)
    rows: jax.Array  # [k * N] int32: rows of those groups, group by group (gather trajectories with it)
    group_used: jax.Array  # [k] bool: slot really used (always True for `filter_groups`)
    row_weight: jax.Array  # [k * N] float32: 1 for rows of used groups, 0 otherwise (loss weight)
    metrics: dict  # float32 scalars, keys "rollout/..."


def num_kept_groups(num_groups: int, ratio: float, rounding: str = "floor") -> int:
    """Static k = floor/ceil(ratio * P) clamped to [1, P]; ratio >= 1 -> P.

    ratio * P is rounded to 9 decimals first, so 0.3 * 10 = 3.0000000000000004 gives 3 either way.
    """
    if rounding not in FILTER_ROUNDING:
        raise ValueError(f"unknown filter rounding {rounding!r}; valid: {', '.join(FILTER_ROUNDING)}")
    if not ratio > 0:
        raise ValueError(f"filter ratio must be > 0, got {ratio}")
    if ratio >= 1:
        return num_groups
    x = round(ratio * num_groups, 9)
    k = math.floor(x) if rounding == "floor" else math.ceil(x)
    return max(1, min(num_groups, k))


def group_reward_stats(reward: jax.Array, group_size: int) -> dict:
    """reward [B] -> per-group std (sample), mean, max: each [P]."""
    _check_group_size(reward.shape[0], group_size)
    g = reward.astype(jnp.float32).reshape(-1, group_size)
    return {"std": group_std(g), "mean": g.mean(-1), "max": g.max(-1)}


def _rows(groups: jax.Array, group_size: int) -> jax.Array:
    return (groups[:, None] * group_size + jnp.arange(group_size, dtype=jnp.int32)).reshape(-1)


def _rank(score: jax.Array, select: str) -> jax.Array:
    if select not in FILTER_SELECT:
        raise ValueError(f"unknown filter selection {select!r}; valid: {', '.join(FILTER_SELECT)}")
    # Stable argsort: equal scores keep index order, so the lowest group index wins ties.
    key = -score if select == "largest" else score
    return jnp.argsort(key, stable=True).astype(jnp.int32)


def _metrics(stats: dict, groups: jax.Array, used: jax.Array) -> dict:
    w = used.astype(jnp.float32)
    cnt = jnp.sum(w)

    def chosen_mean(x):
        return jnp.sum(x[groups] * w) / jnp.maximum(cnt, 1.0)

    std = stats["std"]
    return {
        "rollout/in_group_std": std.mean(),
        "rollout/in_group_std_max": std.max(),
        "rollout/in_group_mean": stats["mean"].mean(),
        "rollout/in_group_max": stats["max"].mean(),
        "rollout/chosen_in_group_std": chosen_mean(std),
        "rollout/chosen_in_group_std_max": jnp.max(jnp.where(used, std[groups], -jnp.inf)).clip(0.0),
        "rollout/chosen_in_group_mean": chosen_mean(stats["mean"]),
        "rollout/chosen_in_group_max": chosen_mean(stats["max"]),
        "rollout/filter_kept_count": cnt,
        "rollout/filter_kept_ratio": cnt / std.shape[0],
        "rollout/filter_zero_count": jnp.sum(std <= 1e-10).astype(jnp.float32),
    }


def filter_groups(reward: jax.Array, group_size: int, ratio: float = 0.25, *,
                  select: str = "largest", rounding: str = "floor") -> GroupFilter:
    """Top-k groups by in-group reward std (StarPO-S). reward [B] -> GroupFilter with k static.

    k = num_kept_groups(P, ratio, rounding); ratio >= 1 keeps all groups in order 0..P-1.
    Default ratio 0.25: 2 of 8 groups (32 of 128 trajectories).
    Metrics: rollout/in_group_std (mean over all groups), rollout/in_group_std_max, the
    rollout/chosen_* counterparts over the kept groups, group reward mean/max, kept count/ratio.
    """
    stats = group_reward_stats(reward, group_size)
    p = stats["std"].shape[0]
    k = num_kept_groups(p, ratio, rounding)
    if k == p and ratio >= 1:
        _rank(stats["std"], select)  # still validate `select`
        groups = jnp.arange(p, dtype=jnp.int32)
    else:
        groups = _rank(stats["std"], select)[:k]
    used = jnp.ones((k,), bool)
    rows = _rows(groups, group_size)
    return GroupFilter(groups=groups, rows=rows, group_used=used,
                       row_weight=jnp.ones(rows.shape, jnp.float32), metrics=_metrics(stats, groups, used))


def filter_groups_variance_cover(reward: jax.Array, group_size: int, fraction: float = 0.9, *,
                                 k_max: int | None = None, measure: str = "std",
                                 selection_eps: float = 0.01) -> GroupFilter:
    """Keep the highest-spread groups until they cover `fraction` of the total spread.

    reward [B] -> GroupFilter with k_max slots (default P): `groups` [k_max] are the k_max groups of
    largest score (ties: lowest index first), `group_used` [k_max] marks the selected prefix,
    `row_weight` [k_max * N] is 0 on rows of unused slots (their loss weight).

    Score s_g = in-group std (measure "std", what the reference's "reward_variance" metric actually
    ranks by) or its square (measure "var", the literal "fraction of reward variance"). Walking the
    groups in decreasing s_g, group i is used iff the sum of the previous ones is still below
    `fraction * sum(s) - selection_eps` and s_i > 0 (the reference's linear top-p rule). Consequences
    kept from the reference: groups with s = 0 are never used, so when every group has equal rewards
    nothing is used (all weights 0: the update is a no-op). Differences: at most k_max groups are used
    (static shape; the reference has no cap), and fraction >= 1 marks every slot used, as the
    reference keeps everything for a value >= 1.
    """
    if measure not in ("std", "var"):
        raise ValueError(f"unknown variance-cover measure {measure!r}; valid: std, var")
    if not fraction > 0:
        raise ValueError(f"variance-cover fraction must be > 0, got {fraction}")
    stats = group_reward_stats(reward, group_size)
    p = stats["std"].shape[0]
    k_max = p if k_max is None else k_max
    if not isinstance(k_max, int) or isinstance(k_max, bool) or not 1 <= k_max <= p:
        raise ValueError(f"k_max must be an integer in [1, {p}] (the number of groups), got {k_max!r}")
    score = stats["std"] if measure == "std" else jnp.square(stats["std"])
    order = _rank(score, "largest")
    groups = order[:k_max]
    if fraction >= 1:
        used = jnp.ones((k_max,), bool)
    else:
        sorted_score = score[groups]
        threshold = fraction * jnp.sum(score) - selection_eps
        before = jnp.cumsum(sorted_score) - sorted_score
        used = (before < threshold) & (sorted_score > 0)
    rows = _rows(groups, group_size)
    row_weight = jnp.repeat(used, group_size).astype(jnp.float32)
    return GroupFilter(groups=groups, rows=rows, group_used=used, row_weight=row_weight,
                       metrics=_metrics(stats, groups, used))


def gather_rows(tree, rows: jax.Array):
    """Gathers rows [R] (axis 0) of every array leaf of a pytree (e.g. `Trajectories`) -> R rows."""
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), tree)
