"""Group filters (StarPO-S / RAGEN-2 adaptive filtering): pure, jittable, static shapes.

A rollout batch is P groups of N trajectories (row b in group b // N, as `Trajectories`). A filter
scores every group with a METRIC, picks groups with a STRATEGY, and returns a `GroupFilter`: S
static slots of groups (`groups [S]`, their rows `rows [S*N]`) and which slots are really used
(`group_used [S]`, `row_weight [S*N]`, 0 on rows that must not train). RAGEN shrinks the batch to
the kept groups (and pads it back by copying random samples); we keep a static number of rows and
give the dropped ones weight 0, so nothing recompiles when the number of kept groups changes.

Metrics (`FILTER_METRICS`, per group over its N trajectories; RAGEN's names in brackets):
- reward_std   ["reward_variance"] sample std (torch `.std()`, ddof 1; N = 1 -> 0) of the raw
               trajectory rewards (incl. format penalties, before any normalisation);
- reward_mean  ["reward"] their mean;
- entropy_mean ["entropy"] mean of the per-trajectory mean token entropy (over sampled tokens);
- entropy_std  ["entropy_variance"] sample std of the per-trajectory entropies;
- length       ["length"] mean number of sampled tokens (RAGEN ranks length filters by the mean).

Candidates: with `include_zero=False` groups whose score satisfies |score| <= 1e-10 are removed
before the strategy runs (RAGEN); no candidate left -> nothing is selected.

Strategies (`FILTER_STRATEGIES`) on the candidates, `key` = score ("largest") or -score ("smallest"):
- top_k:     k = floor(value * P) groups of largest key, clamped to [1, P] and to the number of
             candidates (RAGEN `max(1, min(int(value * P), candidates))`). value * P is rounded to 9
             decimals first: RAGEN's `int(0.29 * 100)` is 28 (float error), ours 29. `rounding="ceil"`
             is ours (not in RAGEN). value >= 1 keeps every candidate.
- top_k_abs: k = floor(value) groups, clamped the same way.
- top_p:     value >= 1: every candidate. mode "softmax": probabilities softmax(key) over the
             candidates, sorted descending; keep the first `searchsorted(cumsum, value) + 1` (the
             first index whose cumulative probability reaches value, plus one; at most all
             candidates): always >= 1 group when there is a candidate. Equal keys over all
             candidates keep what RAGEN keeps, by its arithmetic: float32 probabilities 1/n summed
             in double by torch's CPU cumsum, each sum stored as float32, against the float32
             value (`tied_top_p_table`; where that differs from the value as written, e.g. 25 groups
             at 0.8 keep 21 where 4/5 of 25 is 20: docs/algorithms.md). mode "linear": walk the
             candidates in descending-key order, stop before a group when the cumulative SCORE
             already reaches `value * sum(scores) - selection_eps` or when its score is <= 0;
             keep the walked groups only if their sum reached that threshold, else NOTHING (all-zero
             scores select nothing: threshold -eps is reached by the empty walk).
- min_p:     "largest": keep score >= value * max(score) - 1e-10; "smallest": keep
             score <= min(score) / (value + 1e-10) + 1e-10 (RAGEN's rules on the raw scores).

Ties: groups with equal keys are ordered by index (a stable sort), the lowest index first; RAGEN
uses torch's unstable sort/topk, whose tie order is unspecified. Sums (cumulative scores,
softmax) are float32; RAGEN's linear walk accumulates in Python floats, so a threshold hit within
float rounding may go the other way.

Slots (static): top_k / top_k_abs use k slots; top_p / min_p use `max_groups` slots (0 = all P).
When more groups are selected than there are slots (a `max_groups` cap: RAGEN has none), the
lowest-ranked selected ones are dropped. With S < P the slots are the groups in rank order (best
first, selected before unselected); with S = P they are the groups in index order (the rows come
back unchanged) and `group_used` marks the selected ones.

The legacy `filter_groups` (top-k by reward std) and `filter_groups_variance_cover` (top-p linear
with a cap) are kept as thin wrappers of `filter_by_spec`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ragen_jax.algorithms.advantages import check_group_size, group_std

FILTER_SELECT = ("largest", "smallest")
FILTER_ROUNDING = ("floor", "ceil")
TOP_P_MODES = ("linear", "softmax")
ZERO_EPS = 1e-10  # RAGEN: |score| <= 1e-10 counts as zero (include_zero, filter_zero_count, min_p)
SELECTION_EPS = 0.01  # RAGEN rollout_filter_selection_eps: linear top-p threshold = value * sum - eps


# ----------------------------------------------------------------------------------- registries
def _grouped(x: jax.Array, n: int) -> jax.Array:
    check_group_size(x.shape[0], n)
    return x.astype(jnp.float32).reshape(-1, n)


# name -> (per-trajectory input it reads, per-group score function [P, N] -> [P]).
FILTER_METRICS: dict[str, tuple[str, Callable]] = {
    "reward_std": ("reward", group_std),
    "reward_mean": ("reward", lambda g: g.mean(-1)),
    "entropy_mean": ("entropy", lambda g: g.mean(-1)),
    "entropy_std": ("entropy", group_std),
    "length": ("length", lambda g: g.mean(-1)),
}


def _take_top_k(k_static: int):
    def take(ctx):
        return ctx["pos"] < jnp.minimum(k_static, ctx["n_cand"])
    return take


def _take_top_p(ctx):
    spec, pos, n_cand = ctx["spec"], ctx["pos"], ctx["n_cand"]
    cand_sorted = pos < n_cand
    if spec.value >= 1:
        return cand_sorted
    if spec.top_p_mode == "softmax":
        table = tied_top_p_table(pos.shape[0], spec.value)
        return pos < softmax_top_p_count(ctx["key_sorted"], cand_sorted, n_cand, spec.value, table)
    # linear: the walk over candidates in key order, on the raw scores.
    s = ctx["score_sorted"]
    threshold = spec.value * jnp.sum(jnp.where(cand_sorted, s, 0.0)) - spec.selection_eps
    before = jnp.cumsum(jnp.where(cand_sorted, s, 0.0)) - jnp.where(cand_sorted, s, 0.0)
    step_ok = cand_sorted & (before < threshold) & (s > 0)
    walked = jnp.cumprod(step_ok.astype(jnp.int32)).astype(bool)  # the loop breaks at the first failure
    reached = jnp.sum(jnp.where(walked, s, 0.0)) >= threshold
    return walked & reached


def tied_top_p_table(num_groups: int, value: float) -> jax.Array:
    """int32 [P + 1]: entry n = how many of n equal candidates' cumulative probabilities fall below
    `value`, as RAGEN's filter computes them: torch's float32 softmax gives each 1/n rounded to float32,
    torch's CPU cumsum adds them in double (exact here: at most P terms of 24 bits) and stores each
    sum as float32, and searchsorted compares with the value cast to float32. The softmax top-p cutoff
    when all n candidates have equal keys."""
    v = np.float32(value)
    out = [0]
    for n in range(1, num_groups + 1):
        p = np.float64(np.float32(1.0) / np.float32(n))
        out.append(int(np.sum((np.arange(1, n + 1, dtype=np.float64) * p).astype(np.float32) < v)))
    return jnp.asarray(out, jnp.int32)


def softmax_top_p_count(key_sorted: jax.Array, cand_sorted: jax.Array, n_cand: jax.Array, value,
                        table: jax.Array) -> jax.Array:
    """How many candidates softmax top-p keeps: the first sorted index whose cumulative probability
    reaches `value`, plus one (torch.searchsorted, left side), at most all candidates. key_sorted [P]
    (candidates first, descending), `table` = `tied_top_p_table(P, value)`.

    Ties follow RAGEN's arithmetic: when every candidate has the same key the count comes from the
    table (a float32 running sum of 1/n drifts below RAGEN's double-accumulated one: 24 equal groups at
    0.5 kept 13, RAGEN 12). Otherwise the sum is float32, taken run by run of equal keys (before-run sum
    + rank in run x p), so tied groups share one probability and a run adds no rounding of its own.
    """
    p = key_sorted.shape[0]
    pos = jnp.arange(p)
    logits = jnp.where(cand_sorted, key_sorted, -jnp.inf)
    probs = jnp.where(cand_sorted, jax.nn.softmax(logits), 0.0)
    new_run = jnp.concatenate([jnp.ones((1,), bool), key_sorted[1:] != key_sorted[:-1]])
    run_start = jax.lax.cummax(jnp.where(new_run, pos, 0))
    before = (jnp.cumsum(probs) - probs)[run_start]
    cum = before + (pos - run_start + 1).astype(jnp.float32) * probs
    float_cutoff = jnp.sum((cum < value) & cand_sorted)
    keys = jnp.where(cand_sorted, key_sorted, key_sorted[0])
    all_tied = jnp.all(keys == key_sorted[0])
    cutoff = jnp.where(all_tied, table[n_cand], float_cutoff)
    return jnp.minimum(cutoff + 1, n_cand)


def _take_min_p(ctx):
    spec, s, cand = ctx["spec"], ctx["score_sorted"], ctx["pos"] < ctx["n_cand"]
    if spec.select == "largest":
        threshold = jnp.max(jnp.where(cand, s, -jnp.inf)) * spec.value
        return cand & (s >= threshold - ZERO_EPS)
    threshold = jnp.min(jnp.where(cand, s, jnp.inf)) / (spec.value + ZERO_EPS)
    return cand & (s <= threshold + ZERO_EPS)


def _floor_value(x: float) -> int:
    return math.floor(round(x, 9))


# name -> (static slot count (spec, P) -> S, selection ctx -> taken [P] in rank order).
FILTER_STRATEGIES: dict[str, tuple[Callable, Callable]] = {
    "top_k": (lambda spec, p: num_kept_groups(p, spec.value, spec.rounding), None),
    "top_k_abs": (lambda spec, p: max(1, min(p, _floor_value(spec.value))), None),
    "top_p": (lambda spec, p: spec.max_groups or p, _take_top_p),
    "min_p": (lambda spec, p: spec.max_groups or p, _take_min_p),
}

# Advantage scale from the kept fraction of groups (RAGEN actor.filter_loss_scaling).
LOSS_SCALINGS: dict[str, Callable] = {
    "none": lambda r: jnp.ones_like(r),
    "linear": lambda r: r,
    "sqrt": jnp.sqrt,
}


def _names(d) -> str:
    return ", ".join(d)


@dataclasses.dataclass(frozen=True)
class FilterSpec:
    """One filter setting (static: part of the compiled program). Validated on construction
    (ValueError naming the field and the valid options)."""

    strategy: str = "top_k"
    value: float = 0.25
    select: str = "largest"
    metric: str = "reward_std"
    include_zero: bool = True
    top_p_mode: str = "linear"
    max_groups: int = 0  # slots of top_p / min_p (0 = all groups)
    rounding: str = "floor"  # top_k: floor (RAGEN's int()) or ceil of value * P
    selection_eps: float = SELECTION_EPS

    def __post_init__(self):
        for field, value, valid in (("strategy", self.strategy, FILTER_STRATEGIES),
                                    ("metric", self.metric, FILTER_METRICS),
                                    ("select", self.select, FILTER_SELECT),
                                    ("top_p_mode", self.top_p_mode, TOP_P_MODES),
                                    ("rounding", self.rounding, FILTER_ROUNDING)):
            if value not in valid:
                raise ValueError(f"unknown filter {field} {value!r}; valid: {_names(valid)}")
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) or not self.value > 0:
            raise ValueError(f"filter value must be a number > 0, got {self.value!r}")
        if self.strategy == "top_k_abs" and self.value < 1:
            raise ValueError(f"filter value of top_k_abs is a number of groups >= 1, got {self.value!r}")
        if isinstance(self.max_groups, bool) or not isinstance(self.max_groups, int) or self.max_groups < 0:
            raise ValueError(f"filter max_groups must be a whole number >= 0 (0: all groups), got {self.max_groups!r}")
        if not isinstance(self.include_zero, bool):
            raise ValueError(f"filter include_zero must be True or False, got {self.include_zero!r}")

    @property
    def input_name(self) -> str:
        """The per-trajectory input the metric reads: "reward", "entropy" or "length"."""
        return FILTER_METRICS[self.metric][0]

    def slots(self, num_groups: int) -> int:
        """S: static number of group slots (rows = S x N); at most P."""
        if self.max_groups > num_groups:
            raise ValueError(f"filter max_groups={self.max_groups} exceeds the {num_groups} groups of a batch")
        return min(num_groups, FILTER_STRATEGIES[self.strategy][0](self, num_groups))

    def kept_rows(self, num_groups: int, group_size: int) -> int:
        """Rows the update trains on per iteration (static): the group slots x group_size. The config's
        rules, the mesh check and the compiled step all read this one definition."""
        return self.slots(num_groups) * group_size


@struct.dataclass
class GroupFilter:
    """Which groups a filter kept. S = number of slots (static)."""

    groups: jax.Array  # [S] int32: group of each slot (S < P: rank order, best first; S = P: 0..P-1)
    rows: jax.Array  # [S * N] int32: rows of those groups, group by group (gather trajectories with it)
    group_used: jax.Array  # [S] bool: slot's group was selected (trains)
    row_weight: jax.Array  # [S * N] float32: 1 for rows of used groups, 0 otherwise (loss weight)
    kept_fraction: jax.Array  # float32: used groups / P (RAGEN filter_kept_ratio; loss scaling)
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
    g = _grouped(reward, group_size)
    return {"std": group_std(g), "mean": g.mean(-1), "max": g.max(-1)}


def group_scores(spec: FilterSpec, inputs: dict, group_size: int) -> jax.Array:
    """Per-group score [P] of `spec.metric` from per-trajectory inputs {"reward"|"entropy"|"length": [B]}."""
    name, fn = FILTER_METRICS[spec.metric]
    if name not in inputs:
        raise ValueError(f"filter metric {spec.metric!r} needs the per-trajectory {name!r}")
    return fn(_grouped(inputs[name], group_size))


def _rank_order(score: jax.Array, cand: jax.Array, select: str) -> jax.Array:
    """Candidates first, then by key descending, ties by index (lexsort: last key is primary)."""
    key = score if select == "largest" else -score
    idx = jnp.arange(score.shape[0])
    return jnp.lexsort((idx, -key, ~cand)).astype(jnp.int32)


def select_groups(score: jax.Array, spec: FilterSpec) -> tuple[jax.Array, jax.Array]:
    """score [P] -> (selected [P] bool, rank order [P] int32: candidates by key, best first)."""
    s = score.astype(jnp.float32)
    p = s.shape[0]
    cand = jnp.ones((p,), bool) if spec.include_zero else jnp.abs(s) > ZERO_EPS
    order = _rank_order(s, cand, spec.select)
    key = s if spec.select == "largest" else -s
    ctx = {"spec": spec, "pos": jnp.arange(p), "n_cand": jnp.sum(cand), "score_sorted": s[order],
           "key_sorted": key[order]}
    slots_fn, take_fn = FILTER_STRATEGIES[spec.strategy]
    if take_fn is None:  # top_k / top_k_abs: the k best candidates, k uncapped by the slot count
        k = num_kept_groups(p, spec.value, spec.rounding) if spec.strategy == "top_k" else slots_fn(spec, p)
        take_fn = _take_top_k(k)
    taken_sorted = take_fn(ctx)
    selected = jnp.zeros((p,), bool).at[order].set(taken_sorted)
    return selected, order


def _rows(groups: jax.Array, group_size: int) -> jax.Array:
    return (groups[:, None] * group_size + jnp.arange(group_size, dtype=jnp.int32)).reshape(-1)


def _metrics(stats: dict, score: jax.Array, selected: jax.Array, groups: jax.Array, used: jax.Array) -> dict:
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
        "rollout/filter_score_mean": score.mean(),
        "rollout/chosen_filter_score_mean": chosen_mean(score),
        "rollout/filter_kept_count": cnt,
        "rollout/filter_kept_ratio": cnt / std.shape[0],
        "rollout/filter_selected_count": jnp.sum(selected).astype(jnp.float32),
        "rollout/filter_zero_count": jnp.sum(jnp.abs(score) <= ZERO_EPS).astype(jnp.float32),
        "rollout/empty_after_filter": (cnt == 0).astype(jnp.float32),
    }


def filter_by_spec(spec: FilterSpec, inputs: dict, group_size: int) -> GroupFilter:
    """Apply a filter. `inputs`: per-trajectory arrays [B]; "reward" is required (the reward
    metrics are always logged), "entropy"/"length" when the metric reads them."""
    stats = group_reward_stats(inputs["reward"], group_size)
    score = group_scores(spec, inputs, group_size)
    p = score.shape[0]
    s = spec.slots(p)
    selected, order = select_groups(score, spec)
    if s == p:
        groups = jnp.arange(p, dtype=jnp.int32)
    else:
        # Selected groups are a prefix of the rank order (every strategy keeps the best candidates).
        groups = order[:s]
    used = selected[groups]
    rows = _rows(groups, group_size)
    row_weight = jnp.repeat(used, group_size).astype(jnp.float32)
    return GroupFilter(groups=groups, rows=rows, group_used=used, row_weight=row_weight,
                       kept_fraction=jnp.sum(used).astype(jnp.float32) / p,
                       metrics=_metrics(stats, score, selected, groups, used))


def filter_groups(reward: jax.Array, group_size: int, ratio: float = 0.25, *,
                  select: str = "largest", rounding: str = "floor") -> GroupFilter:
    """V1 StarPO-S: top-k groups by in-group reward std; k = num_kept_groups(P, ratio, rounding)
    static, every slot used; ratio >= 1 keeps all groups in order 0..P-1."""
    spec = FilterSpec(strategy="top_k", value=ratio, select=select, rounding=rounding)
    return filter_by_spec(spec, {"reward": reward}, group_size)


def filter_groups_variance_cover(reward: jax.Array, group_size: int, fraction: float = 0.9, *,
                                 k_max: int | None = None, selection_eps: float = SELECTION_EPS) -> GroupFilter:
    """V1 "variance_cover" = top-p linear on the reward std, at most k_max slots (default P):
    keep the largest-std groups until their std sum reaches `fraction * total - selection_eps`
    (zero-std groups never; all-equal rewards: nothing)."""
    p = reward.shape[0] // group_size
    k_max = p if k_max is None else k_max
    if not isinstance(k_max, int) or isinstance(k_max, bool) or not 1 <= k_max <= p:
        raise ValueError(f"k_max must be an integer in [1, {p}] (the number of groups), got {k_max!r}")
    spec = FilterSpec(strategy="top_p", value=fraction, top_p_mode="linear", max_groups=k_max,
                      selection_eps=selection_eps)
    return filter_by_spec(spec, {"reward": reward}, group_size)


def loss_scale(kept_fraction: jax.Array, mode: str) -> jax.Array:
    """Advantage multiplier of `filter_loss_scaling`: 1, the kept fraction, or its square root."""
    if mode not in LOSS_SCALINGS:
        raise ValueError(f"unknown filter loss scaling {mode!r}; valid: {_names(LOSS_SCALINGS)}")
    return LOSS_SCALINGS[mode](jnp.asarray(kept_fraction, jnp.float32))


def soft_reweight(scores: jax.Array, group_size: int, used: jax.Array, eps: float = 1e-6) -> jax.Array:
    """RAGEN soft advantage reweighting: per-slot weight std_g / (max std over used groups + eps).

    scores [S * N]: the trajectory scores the advantages are computed from (after reward
    normalisation), slot-major; used [S]. std = sample std (ddof 1); a group of one trajectory
    has std 1 (verl's GRPO convention), so N = 1 gives weight ~1. Unused slots get weight 0.
    """
    g = _grouped(scores, group_size)
    std = group_std(g) if group_size > 1 else jnp.ones((g.shape[0],), jnp.float32)
    max_std = jnp.max(jnp.where(used, std, 0.0))
    return jnp.where(used, std / (max_std + eps), 0.0)


def gather_rows(tree, rows: jax.Array):
    """Gathers rows [R] (axis 0) of every array leaf of a pytree (e.g. `Trajectories`) -> R rows."""
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), tree)


__all__ = ["FILTER_METRICS", "FILTER_ROUNDING", "FILTER_SELECT", "FILTER_STRATEGIES", "FilterSpec", "GroupFilter",
           "LOSS_SCALINGS", "SELECTION_EPS", "TOP_P_MODES", "ZERO_EPS", "filter_by_spec", "filter_groups",
           "filter_groups_variance_cover", "gather_rows", "group_reward_stats", "group_scores", "loss_scale",
           "num_kept_groups", "select_groups", "soft_reweight", "softmax_top_p_count",
           "tied_top_p_table"]
