"""Turn-block compaction of single-turn records (PromptConfig.context_window_mode="single_turn"):
every turn is scored as its own row behind the shared prompt prefix (`TurnBlocks`), the rows of turns
never taken are skipped (`over_taken_blocks`), and per-block values land back on record columns
(`fold_columns`). Used by the trainer's log-prob and value passes (`step.sequence_logprobs`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class TurnBlocks:
    """How single-turn records are scored (PromptConfig.context_window_mode="single_turn"): every
    turn of a row was generated seeing only the shared prompt prefix and its own block (segment +
    answer), so the trainer runs each block as its own row behind the prefix, whose keys and values
    are computed once. `start` [K, M]: each turn's block position in the record, -1 for turns not
    taken (`Trajectories.turn_start`). Static: the prefix length P (the same ids begin every row) and
    the block width W (the longest segment + the answer budget)."""

    start: jax.Array
    prefix: int = struct.field(pytree_node=False)
    width: int = struct.field(pytree_node=False)
    # Skip the block rows of turns never taken (`over_taken_blocks`). Episodes end early (at the
    # goal, a hole, a solved room), so a large share of the K x M blocks is padding; off only to
    # compare against the plain pass over every block.
    skip_untaken: bool = struct.field(pytree_node=False, default=True)
    shards: int = struct.field(pytree_node=False, default=1)  # the rows' data-parallel shards

    @property
    def num_chunks(self) -> int:
        """Chunks `over_taken_blocks` cuts the K x M block rows into: one per turn slot (K rows
        each, the plain pass's batch when M = 1); 1 (no skipping) when `skip_untaken` is off."""
        return self.start.shape[1] if self.skip_untaken else 1

    def unfold(self, tokens, valid):
        """[K, T] records -> (block ids [K*M, W], block valid [K*M, W], absolute position of every
        block token [K, M, W], T for slots past the block's end)."""
        k, t = tokens.shape
        start = self.start
        length = jnp.sum(valid, axis=1, dtype=jnp.int32)
        # Turns are taken in order: a block ends where the next taken turn starts, else at the end.
        nxt = jnp.concatenate([start[:, 1:], jnp.full((k, 1), -1, start.dtype)], axis=1)
        stop = jnp.where(nxt >= 0, nxt, length[:, None])
        n = jnp.where(start >= 0, jnp.clip(stop - start, 0, self.width), 0)
        j = jnp.arange(self.width, dtype=jnp.int32)
        ok = j < n[..., None]
        pos = jnp.where(ok, start[..., None] + j, t)
        ids = tokens[jnp.arange(k)[:, None, None], jnp.minimum(pos, t - 1)]
        m = start.shape[1]
        return ids.reshape(k * m, self.width), ok.reshape(k * m, self.width), pos


def over_taken_blocks(fn, ids, ok, n_chunks: int, shards: int = 1):
    """`fn(ids [c, W], ok [c, W]) -> tree of [c, ...]` over all block rows [B, W], computing only the
    chunks that hold a taken block (one with a valid slot). The rows are cut into `shards` contiguous
    parts (the batch's data-parallel shards: each device keeps its own rows, so the chunks stay
    partitioned as the plain pass is); within each part the taken rows move to the front (stable),
    and the parts are cut into `n_chunks` chunks; a `lax.scan` walks the chunks with a `lax.cond` that
    skips a chunk past every part's last taken row (zeros out; XLA runs only the branch taken, also in
    the backward pass). Outputs come back in the original row order. Exact: a row is computed as in
    the plain pass (rows do not interact) and a skipped row's outputs are never read (`fold_columns`
    drops every slot of an untaken block)."""
    b = ids.shape[0]
    if n_chunks <= 1 or b % (n_chunks * shards):
        return fn(ids, ok)
    per = b // shards
    c = per // n_chunks  # rows of one chunk in each part
    taken = jnp.any(ok, axis=1).reshape(shards, per)
    order = jnp.argsort(~taken, axis=1, stable=True)  # [shards, per], indices within the part
    n_taken = jnp.max(jnp.sum(taken, axis=1, dtype=jnp.int32))

    def chunked(a):  # [B, ...] -> [n_chunks, shards * c, ...] in the taken-first order of each part
        a = jnp.take_along_axis(a.reshape((shards, per) + a.shape[1:]),
                                order.reshape((shards, per) + (1,) * (a.ndim - 1)), axis=1)
        a = a.reshape((shards, n_chunks, c) + a.shape[2:]).swapaxes(0, 1)
        return a.reshape((n_chunks, shards * c) + a.shape[3:])

    xs = (chunked(ids), chunked(ok))
    shapes = jax.eval_shape(fn, xs[0][0], xs[1][0])

    def skip(i, o):
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(_, x):
        i, ids_c, ok_c = x
        return None, jax.lax.cond(i * c < n_taken, fn, skip, ids_c, ok_c)

    _, out = jax.lax.scan(body, None, (jnp.arange(n_chunks, dtype=jnp.int32),) + xs)
    inverse = jnp.argsort(order, axis=1)

    def unchunked(a):  # inverse of `chunked`
        a = a.reshape((n_chunks, shards, c) + a.shape[2:]).swapaxes(0, 1).reshape((shards, per) + a.shape[2:])
        a = jnp.take_along_axis(a, inverse.reshape((shards, per) + (1,) * (a.ndim - 2)), axis=1)
        return a.reshape((b,) + a.shape[2:])

    return jax.tree.map(unchunked, out)


def fold_columns(per_block, pos, shift: int, width: int):
    """Per-block-row values [K*M, W - shift] back onto record columns [K, width]: block slot j lands
    on column pos[j + shift] - shift. Targets use shift 1 (column t is about token t+1, computed at
    slot j from the block's token j+1); values shift 0. Slots past a block's end sit at position T
    and are dropped. Columns outside every block stay 0 (they are never sampled tokens: a block's
    first token is its segment's)."""
    k, m, _ = pos.shape
    vals = per_block.reshape(k, m, -1)
    cols = pos[:, :, shift:] - shift
    out = jnp.zeros((k, width), vals.dtype)
    return out.at[jnp.arange(k)[:, None, None], cols].set(vals, mode="drop")


__all__ = ["TurnBlocks", "fold_columns", "over_taken_blocks"]
