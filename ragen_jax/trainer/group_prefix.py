"""Full-context records scored with each group's shared beginning computed once.

The N rows of a group start from the same seed, so they render the same first observation: a row is
the prompt prefix, that first segment, then its own answer (and later turns). Scoring each row whole
runs the shared part N times; here it runs once per group (`Qwen2Trunk.group_prefix_forward`) and the
rows run only what follows it, attending to their group's keys and values (`PrefixKV.for_rows`). The
per-token numbers and the gradients (gathered from every row into the shared part) are those of the
per-row forward.

Which rows share what is read from the rows themselves: a group's shared length is the longest run
of leading tokens every one of its rows has in common with the group's first row (at most `width`),
so rows that part early (a teacher, an env whose first observation is random per row) only share
less. Shapes stay static: every row's part after its group's shared length must fit `tail` tokens
and the call holds at most `min(rows, groups)` groups. When a call's rows do not fit (`GroupedRows.fits`
is false at run time), the caller takes the prompt-prefix path instead (`lax.cond`): same numbers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class GroupShape:
    """Static bounds of group-shared scoring (`StepPrograms(group_prefix=...)`)."""

    width: int  # W: longest shared beginning scored once per group (prompt prefix + first segment)
    tail: int  # every row's tokens after its group's shared beginning, at most


def group_shape(prefix_len: int, max_segment_len: int, max_response: int, max_turns: int, max_len: int):
    """The `GroupShape` of full-context records of the rollout: the shared beginning is the prompt
    prefix and the first segment; after it come the first answer and (max_turns - 1) more segments
    and answers. None for multi-turn records, and when the tail would be no shorter than the record
    after the prompt prefix (nothing to gain)."""
    # Multi-turn records: the grouped and the fallback pass both stay in the update's conditional, and
    # the reference config's update grew 22.6 -> 26.3 GiB (bench/memory.py) for a tail that is most of
    # the record anyway; one-turn episodes (Bandit) are where the shared first segment dominates.
    if max_turns > 1:
        return None
    width = min(max_len, prefix_len + max_segment_len)
    tail = max_response + (max_turns - 1) * (max_segment_len + max_response)
    if tail >= max_len - prefix_len:
        return None
    return GroupShape(width=width, tail=tail)


def group_shape_of(text_env, max_context: int):
    """`group_shape` of the records a Rollout of `text_env` writes at `max_context` tokens, with one
    process or several.

    Several processes on XLA:CPU (gloo) need the passes ordered (`step.after`): each grouped pass sits in
    a `lax.cond` (the fallback for rows that do not fit), XLA:CPU may finish a conditional's branch
    asynchronously while the next collective, ordered after it by start only, already runs, and every
    gloo collective of a device group uses one tag, so two in flight take each other's messages
    ("Received data size doesn't match expected size", docs/testing.md, issue 56). The processes took
    the same decisions; the actor's and the critic's passes ran side by side. Chained, the 2-process
    runs equal the 1-process runs (tests/multihost)."""
    return group_shape(len(text_env.prefix_ids), int(text_env.max_segment_len),
                       int(text_env.config.max_response_tokens), int(text_env.max_turns), int(max_context))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class GroupedRows:
    """The rows of one call split into G group beginnings and per-row tails."""

    fits: jax.Array  # bool: every row's tail fits and every group shares at least one token
    group_ids: jax.Array  # [G, W] int32: each group's first row's first W tokens
    group_len: jax.Array  # [G] int32: each group's shared length (<= W)
    row_group: jax.Array  # [R] int32: each row's group (index into the G)
    start: jax.Array  # [R] int32: each row's shared length = where its tail starts
    tail_ids: jax.Array  # [R, tail] int32
    tail_valid: jax.Array  # [R, tail] bool


def split_groups(ids: jax.Array, valid: jax.Array, group: jax.Array, num_groups: int, shape: GroupShape) -> GroupedRows:
    """Rows `ids`/`valid` [R, T] of groups `group` [R] (ids of at most `num_groups` distinct groups)
    -> `GroupedRows`. Jittable; everything is computed from the rows."""
    r, t = ids.shape
    g = min(r, num_groups)
    width = min(shape.width, t)
    # The distinct groups of this call (padding entries repeat a real one: their work is discarded).
    uniq = jnp.unique(group, size=g, fill_value=group[0])
    row_group = jnp.argmax(group[:, None] == uniq[None, :], axis=1).astype(jnp.int32)
    leader = jnp.argmax(group[None, :] == uniq[:, None], axis=1)
    # Each row's run of leading tokens equal to its group leader's (both valid).
    lead_ids, lead_valid = ids[leader][row_group], valid[leader][row_group]
    same = (ids == lead_ids) & valid & lead_valid
    common = jnp.sum(jnp.cumprod(same.astype(jnp.int32), axis=1), axis=1)
    group_len = jnp.full((g,), width, jnp.int32).at[row_group].min(common.astype(jnp.int32))
    start = group_len[row_group]
    pos = jnp.arange(t)[None, :]
    fits = jnp.all(start >= 1) & ~jnp.any(valid & (pos >= start[:, None] + shape.tail))
    idx = start[:, None] + jnp.arange(shape.tail)[None, :]
    inside = idx < t
    idx = jnp.minimum(idx, t - 1)
    return GroupedRows(fits=fits, group_ids=ids[leader, :width], group_len=group_len, row_group=row_group,
                       start=start, tail_ids=jnp.take_along_axis(ids, idx, axis=1),
                       tail_valid=jnp.take_along_axis(valid, idx, axis=1) & inside)


def grouped_hidden(trunk, rows: GroupedRows, inference: bool = False):
    """(final hidden states of the group beginnings [G, W, H], of each row's tail [R, tail, H])."""
    g_hidden, shared = trunk.group_prefix_forward(rows.group_ids, rows.group_len, inference=inference)
    hidden, _ = trunk(rows.tail_ids, rows.tail_valid, None, shared.for_rows(rows.row_group), inference=inference)
    return g_hidden, hidden


def next_token_inputs(rows: GroupedRows, g_hidden, hidden):
    """The hidden states that predict each row's tail tokens [R, tail, H]: the group's last shared
    position, then the row's own tail positions."""
    last = jnp.take_along_axis(g_hidden[rows.row_group], (rows.start - 1)[:, None, None], axis=1)
    return jnp.concatenate([last, hidden[:, :-1]], axis=1)


def hidden_at(rows: GroupedRows, g_hidden, hidden, pos):
    """Hidden states [R, K, H] of each row at its positions `pos` [R, K] (whole-row coordinates):
    from its group's beginning before the row's `start`, from its own tail from there on. Positions
    past both are clipped to real ones: the caller masks them."""
    g, w, h = g_hidden.shape
    start = rows.start[:, None]
    # A flat gather: no [R, W, H] copy of the group beginnings (nor its scatter in the gradient).
    from_group = g_hidden.reshape(g * w, h)[rows.row_group[:, None] * w + jnp.clip(pos, 0, w - 1)]
    from_tail = jnp.take_along_axis(hidden, jnp.clip(pos - start, 0, hidden.shape[1] - 1)[..., None], axis=1)
    return jnp.where((pos < start)[..., None], from_group, from_tail)


def assemble(rows: GroupedRows, per_group, per_row, width: int, shift: int):
    """Row-aligned columns [R, width] from per-group columns [G, Wg] and per-row tail columns [R, tail]:
    column c is the group's column c while c < start - shift, else the tail's column c - (start - shift)
    (0 past the tail). `shift` = 1 for target-aligned columns (log-probs: column c scores token c+1),
    0 for position-aligned ones."""
    c = jnp.arange(width)[None, :]
    split = (rows.start - shift)[:, None]
    g = jnp.take_along_axis(per_group[rows.row_group], jnp.clip(c, 0, per_group.shape[1] - 1), axis=1)
    j = c - split
    tail = jnp.take_along_axis(per_row, jnp.clip(j, 0, per_row.shape[1] - 1), axis=1)
    return jnp.where(c < split, g, jnp.where(j < per_row.shape[1], tail, 0.0)).astype(per_row.dtype)


__all__ = ["GroupShape", "GroupedRows", "assemble", "group_shape", "group_shape_of", "grouped_hidden", "hidden_at", "next_token_inputs", "split_groups"]
