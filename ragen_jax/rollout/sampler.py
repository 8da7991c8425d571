"""Autoregressive sampling with a KV cache, as pure functions usable inside any jitted program.

`prefill` and `decode` contain no `jax.jit` of their own: the multi-turn rollout calls them inside its
single compiled program (prefill the observation, decode the answer, prefill the next observation on
the same cache, ...). `generate` is the jitted convenience wrapper for one prompt batch.

The model is duck-typed: any object with `model(tokens [B,T], valid [B,T], cache) -> (hidden, cache)`
and `model.logits(hidden) -> [B,T,V] float32`, i.e. a `ragen_jax.models.Qwen2` (possibly obtained with
`nnx.merge` inside the caller's jit). The cache follows the design.md rule: only VALID tokens are
written (compactly, at `cache.end[b]` onwards), so feeding `valid=False` leaves a row untouched.

Log-probabilities: `SampleOutput.logprobs[b, t]` is `log_softmax(logits / temperature)[token]`,
i.e. under the temperature-scaled policy BEFORE top-k / top-p filtering (with `greedy=True` the same
formula is used with the given temperature, 1.0 by default). At temperature 1 this is exactly the
policy log-probability the trainer recomputes, and it never is -inf for a token that was sampled.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Callable, Sequence

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ragen_jax.models.qwen2.model import KVCache, decode_layout, stacked_layout
from ragen_jax.text.tokenizer import ENDOFTEXT, IM_END, chat_ids

# `SampleOutput.stopped_by` codes.
STOP_NONE = 0  # row was inactive (generated nothing) or had budget 0
STOP_EOS = 1  # sampled one of `stop_ids`
STOP_STRING = 2  # the decoded bytes completed one of the stop strings
STOP_BUDGET = 3  # reached its per-row token budget

_NO_BYTE = -1  # filler in the rolling byte window; never equals a real byte (0..255)


@flax.struct.dataclass
class SampleOutput:
    tokens: jax.Array  # [B, N] int32; pad_id after a row stopped
    logprobs: jax.Array | None  # [B, N] float32; 0 after a row stopped; None with logprobs=False
    lengths: jax.Array  # [B] int32, generated tokens including the stop token
    cache: Any  # KVCache holding prompt + all generated tokens of every row
    stopped_by: jax.Array  # [B] int32, one of STOP_*


@flax.struct.dataclass
class StopTable:
    """Arrays for in-graph stop-string detection (traced arguments, not constants)."""

    token_bytes: jax.Array  # [V, Lmax] uint8
    token_len: jax.Array  # [V] int32
    patterns: jax.Array  # [n, Smax] int32, padded with _NO_BYTE
    pattern_len: jax.Array  # [n] int32


def make_stop_table(stop_strings: Sequence[str], token_bytes) -> StopTable:
    """Build a `StopTable` from stop strings and `token_bytes_table(tok)` = (bytes [V,Lmax], lengths [V])."""
    if isinstance(stop_strings, str):
        raise ValueError("stop_strings must be a sequence of strings, not a single string")
    if not stop_strings:
        raise ValueError("make_stop_table needs at least one stop string")
    if token_bytes is None:
        raise ValueError("stop strings need token_bytes=(bytes [V,Lmax], lengths [V]) from token_bytes_table(tok)")
    table, lens = token_bytes
    encoded = [s.encode("utf-8") for s in stop_strings]
    if any(len(e) == 0 for e in encoded):
        raise ValueError("stop strings must not be empty")
    smax = max(len(e) for e in encoded)
    pats = np.full((len(encoded), smax), _NO_BYTE, np.int32)
    for i, e in enumerate(encoded):
        pats[i, : len(e)] = np.frombuffer(e, np.uint8)
    return StopTable(
        token_bytes=jnp.asarray(table, jnp.uint8),
        token_len=jnp.asarray(lens, jnp.int32),
        patterns=jnp.asarray(pats),
        pattern_len=jnp.asarray([len(e) for e in encoded], jnp.int32),
    )


# --------------------------------------------------------------------------------------------------
# prefill


def last_valid_index(valid: jax.Array) -> jax.Array:
    """Index of each row's last valid position; T-1 for rows with no valid position."""
    t = valid.shape[1]
    return (t - 1 - jnp.argmax(valid[:, ::-1], axis=1)).astype(jnp.int32)


def prefill(model, cache, tokens: jax.Array, valid: jax.Array):
    """Append `tokens` (only where `valid`) to `cache`; return (last_logits [B,V] f32, cache).

    `last_logits[b]` are the next-token logits at row b's last valid token. Rows with no valid token
    write nothing to the cache and their `last_logits` are garbage (logits at position T-1 of a
    pass that saw none of its inputs); callers mask them via `decode(active=...)`.
    Only the B last positions go through the vocabulary head (never [B,T,V]).
    """
    hidden, cache = model(tokens, valid, cache)
    idx = last_valid_index(valid)
    last = jnp.take_along_axis(hidden, idx[:, None, None], axis=1)  # [B,1,H]
    logits = model.logits(last)[:, 0].astype(jnp.float32)
    return logits, cache


def extend(model, cache, tokens: jax.Array, valid: jax.Array):
    """`prefill` with the cache only read (`model.extend`): (last_logits [B, V] f32, NewKV of the
    tokens); `cache.append(new)` then equals `prefill`'s cache."""
    hidden, new = model.extend(tokens, valid, cache)
    idx = last_valid_index(valid)
    last = jnp.take_along_axis(hidden, idx[:, None, None], axis=1)
    return model.logits(last)[:, 0].astype(jnp.float32), new


# --------------------------------------------------------------------------------------------------
# sampling
#
# Plain temperature sampling reads the [B, V] logits chunk by chunk (a [B, C1] block stays in cache)
# and reduces them on the fly to the log-mass of every C2-wide sub-chunk. A sample is then drawn
# exactly by inverse CDF in two levels: a sub-chunk from the sub-chunk masses, then a token inside
# it. This costs one uniform per level per row instead of V Gumbel draws (threefry noise for
# 64 x 151,936 logits costs more than the whole model step on a CPU). Measured per decode step,
# batch 64, tiny shape: categorical + argmax ~8x the cost of the head matmul; this path ~2x. Fusing
# the head matmul into the chunk loop was tried: no gain for hidden 64, 2x slower for hidden 896
# (XLA copies each slice of the head matrix). Greedy needs no masses: `_first_argmax` (one pass,
# no `jnp.argmax`, whose variadic (value, index) reduce is several times slower on XLA:CPU) and, for
# the log-prob, one exp pass. top-k / top-p need sorted values and use `lax.top_k` / a sort.

_C2 = 128  # sub-chunk width (divides 151,936 and 152,064)
_CHUNK_BYTES = 1 << 20  # target size of one f32 [B, C1] logits block


def _chunk_sizes(batch: int, vocab: int, c1: int | None, c2: int | None):
    if c2 is None:
        c2 = next(c for c in (_C2, 64, 32, 16, 8, 4, 2, 1) if vocab % c == 0)
    if vocab % c2:
        raise ValueError(f"sub-chunk {c2} must divide the vocabulary size {vocab}")
    if c1 is None:
        # Chunks keep a [B, C1] block in a CPU core's cache; an accelerator reads the logits at full
        # bandwidth in one pass, and each chunk would be one more loop iteration of small kernels
        # (~74 per token at batch 128 over Qwen's vocabulary), so it takes the vocabulary whole.
        c1 = max(c2, (_CHUNK_BYTES // (4 * batch)) // c2 * c2) if jax.default_backend() == "cpu" else vocab
    c1 = min(c1, vocab // c2 * c2)
    if c1 % c2:
        raise ValueError(f"chunk {c1} must be a multiple of the sub-chunk {c2}")
    return c1, c2


def select_token(logits, key, temperature, *, greedy: bool, logprob: bool = True, c1: int | None = None,
            c2: int | None = None):
    """Greedy or exact categorical choice from softmax(logits / temperature); (token, logprob).

    Greedy: `_first_argmax`, then (with `logprob`) one exp pass for the log-sum-exp shifted by the
    chosen logit; without `logprob` (token, None) and no exp over the vocabulary, which is most of a
    small model's decode step (bench/decode_head.py). Sampling: the chunked loop below.
    """
    logits = logits.astype(jnp.float32)
    b, v = logits.shape
    c1, c2 = _chunk_sizes(b, v, c1, c2)
    if greedy:
        x = logits / temperature
        tok = _first_argmax(x, c2)
        if not logprob:
            return tok, None
        best = jnp.take_along_axis(x, tok[:, None], axis=1)[:, 0]
        safe = jnp.where(jnp.isfinite(best), best, 0.0)  # a row of -inf logits: no NaN from -inf - -inf
        total = safe + jnp.log(jnp.sum(jnp.exp(x - safe[:, None]), axis=1))
        return tok, (best - total).astype(jnp.float32)
    n_chunks = -(-v // c1)
    n_sub = v // c2
    neg_inf = jnp.float32(-jnp.inf)

    def body(i, sub_lse):
        # The last chunk is shifted left to stay in bounds (so V need not be a multiple of C1);
        # its part that an earlier chunk already covered is masked out.
        start = jnp.minimum(i * c1, v - c1)
        pos = start + jnp.arange(c1, dtype=jnp.int32)
        x = jax.lax.dynamic_slice_in_dim(logits, start, c1, axis=1) / temperature
        x = jnp.where(pos[None, :] >= i * c1, x, neg_inf)
        cmax = jnp.max(x, axis=1)
        # Sub-chunk log-masses shifted by the chunk max (not each sub-chunk's own max: one reduction
        # less). A sub-chunk more than ~87 nats below the chunk max underflows to -inf: its
        # probability is below float32 resolution of the chunk's mass anyway.
        safe = jnp.where(jnp.isfinite(cmax), cmax, 0.0)
        e = jnp.exp(x - safe[:, None]).reshape(b, c1 // c2, c2)
        lse = safe[:, None] + jnp.log(jnp.sum(e, axis=2))
        old = jax.lax.dynamic_slice_in_dim(sub_lse, start // c2, c1 // c2, axis=1)
        sub_lse = jax.lax.dynamic_update_slice_in_dim(sub_lse, jnp.logaddexp(old, lse), start // c2, axis=1)
        return sub_lse

    sub_lse = jax.lax.fori_loop(0, n_chunks, body, jnp.full((b, n_sub), neg_inf))
    total = jax.nn.logsumexp(sub_lse, axis=1)
    k1, k2 = jax.random.split(key)
    tiny = jnp.finfo(jnp.float32).tiny
    u1 = jax.random.uniform(k1, (b, 1), minval=tiny)
    u2 = jax.random.uniform(k2, (b, 1), minval=tiny)
    cdf = jnp.cumsum(jnp.exp(sub_lse - total[:, None]), axis=1)
    j = jnp.minimum(jnp.sum(cdf < u1 * cdf[:, -1:], axis=1), n_sub - 1)
    idx = j[:, None] * c2 + jnp.arange(c2, dtype=jnp.int32)[None, :]
    x = jnp.take_along_axis(logits, idx, axis=1) / temperature
    ref = jnp.take_along_axis(sub_lse, j[:, None], axis=1)  # scale by the sub-chunk's own mass
    cdf = jnp.cumsum(jnp.exp(x - jnp.where(jnp.isfinite(ref), ref, total[:, None])), axis=1)
    k = jnp.minimum(jnp.sum(cdf < u2 * cdf[:, -1:], axis=1), c2 - 1)
    tok = jnp.take_along_axis(idx, k[:, None], axis=1)[:, 0]
    logp = jnp.take_along_axis(x, k[:, None], axis=1)[:, 0] - total
    return tok.astype(jnp.int32), logp.astype(jnp.float32)


def _first_argmax(logits, c2: int):
    """`jnp.argmax(logits, axis=1)` (the first maximum wins) in one pass over [B, V] plus small work.

    The pass is a max per C2-wide sub-chunk (a reduce over the minor axis of a free [B, V/C2, C2]
    view, which XLA:CPU vectorises); then the first sub-chunk holding the row max, and the first
    index of the max inside it. jnp.argmax's variadic (value, index) reduce and a max followed by a
    full first-index pass both cost about four times as much here (bench/decode_head.py `argmax`).
    """
    b, v = logits.shape
    sub = logits.reshape(b, v // c2, c2)
    sub_max = jnp.max(sub, axis=2)  # [B, V/C2]
    best = jnp.max(sub_max, axis=1)
    j = jnp.argmax(sub_max == best[:, None], axis=1)  # first sub-chunk holding the max
    block = jnp.take_along_axis(sub, j[:, None, None], axis=1)[:, 0]  # [B, C2]
    k = jnp.argmax(block == best[:, None], axis=1)
    return (j * c2 + k).astype(jnp.int32)


def sample_token(logits, key, temperature, top_p, *, greedy: bool, top_k: int, use_top_p: bool, logprob: bool = True):
    """One token per row from [B,V] logits; returns (token [B] int32, logprob [B] f32 or None).

    The log-prob is None when `logprob` is off: only the greedy path saves work by it, but every
    path returns None then, so the output does not depend on the sampling mode.
    """
    if greedy or (top_k == 0 and not use_top_p):
        tok, logp = select_token(logits, key, temperature, greedy=greedy, logprob=logprob)
        return tok, (logp if logprob else None)
    scaled = logits.astype(jnp.float32) / temperature
    if top_k > 0:
        # lax.top_k is O(V) per row instead of a full-vocabulary sort.
        vals, idx = jax.lax.top_k(scaled, top_k)  # sorted descending
        if use_top_p:
            vals = _nucleus_mask(vals, top_p)
        choice = jax.random.categorical(key, vals, axis=-1)
        tok = jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0]
    else:
        order = jnp.argsort(-scaled, axis=-1)
        vals = _nucleus_mask(jnp.take_along_axis(scaled, order, axis=-1), top_p)
        choice = jax.random.categorical(key, vals, axis=-1)
        tok = jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0]
    tok = tok.astype(jnp.int32)
    if not logprob:
        return tok, None
    # log_softmax at one index: x[tok] - logsumexp(x), without materialising [B,V] log-probs.
    lse = jax.nn.logsumexp(scaled, axis=-1)
    logp = jnp.take_along_axis(scaled, tok[:, None], axis=-1)[:, 0] - lse
    return tok, logp.astype(jnp.float32)


def _nucleus_mask(sorted_vals, top_p):
    """Keep the smallest prefix of descending `sorted_vals` whose probability mass reaches top_p."""
    probs = jax.nn.softmax(sorted_vals, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # The first token is always kept, so top_p -> 0 is greedy rather than an empty distribution.
    keep = (mass_before < top_p) | (jnp.arange(sorted_vals.shape[-1]) == 0)
    return jnp.where(keep, sorted_vals, -jnp.inf)


# --------------------------------------------------------------------------------------------------
# stop strings


def stop_string_step(window, tok, stop: StopTable):
    """Append token bytes to each row's rolling byte window; report rows that completed a stop string.

    window: [B, Smax-1] int32, the row's most recent bytes right-aligned (filler _NO_BYTE).
    A stop string ending anywhere inside the new token's bytes counts, so strings split over several
    tokens and strings followed by more bytes in the same token are both detected.
    """
    smax = stop.patterns.shape[1]
    new = stop.token_bytes[tok].astype(jnp.int32)  # [B, Lmax]
    n_new = stop.token_len[tok]  # [B]
    lmax = new.shape[1]
    pos = jnp.arange(lmax)
    new = jnp.where(pos[None, :] < n_new[:, None], new, _NO_BYTE)
    combined = jnp.concatenate([window, new], axis=1)  # [B, Smax-1+Lmax]
    w = smax - 1
    # end position p = w + j (j over new bytes), pattern i, offset q: byte at p - len_i + 1 + q.
    ends = w + pos  # [Lmax]
    q = jnp.arange(smax)
    starts = ends[None, :] - stop.pattern_len[:, None] + 1  # [n, Lmax], >= 0 because len_i <= smax
    gather_idx = starts[:, :, None] + q[None, None, :]  # [n, Lmax, Smax]
    gather_idx = jnp.clip(gather_idx, 0, combined.shape[1] - 1)
    got = combined[:, gather_idx]  # [B, n, Lmax, Smax]
    need = q[None, :] < stop.pattern_len[:, None]  # [n, Smax]
    eq = (got == stop.patterns[None, :, None, :]) | ~need[None, :, None, :]
    match = jnp.all(eq, axis=-1)  # [B, n, Lmax]
    match = match & (pos[None, None, :] < n_new[:, None, None])
    hit = jnp.any(match, axis=(1, 2))
    # New window: the last w real bytes = combined[n_new : n_new + w].
    if w > 0:
        idx = n_new[:, None] + jnp.arange(w)[None, :]
        window = jnp.take_along_axis(combined, idx, axis=1)
    return window, hit


# --------------------------------------------------------------------------------------------------
# decode


@flax.struct.dataclass
class _Carry:
    """State of the decode loop. B rows, N = max_new_tokens, W = longest stop string - 1 bytes."""

    step: jax.Array  # [] int32: tokens sampled so far (global step; a row samples at a prefix of the steps)
    cache: Any  # KV cache: prompt + every sampled token except the pending ones
    pending: jax.Array  # [B] bool: the row's last sampled token is not yet in the cache
    last: jax.Array  # [B] int32: that token (an in-range dummy where not pending)
    done: jax.Array  # [B] bool: the row has stopped (or never started)
    lengths: jax.Array  # [B] int32: tokens sampled, the stop token included
    tokens: jax.Array  # [B, N+1] int32: sampled ids, pad_id after the row stopped (one spare column)
    logprobs: jax.Array | None  # [B, N+1] f32: their log-probs, 0 after the row stopped; None: not kept
    stopped_by: jax.Array  # [B] int32: STOP_* code
    window: jax.Array  # [B, W] int32: the row's most recent decoded bytes (stop strings)


@dataclasses.dataclass(frozen=True)
class _Picker:
    """How one decode call picks a token per row (fixed for the call; the arrays may be traced)."""

    key: jax.Array  # step t draws with fold_in(key, t)
    temperature: jax.Array  # [] f32
    top_p: jax.Array  # [] f32
    greedy: bool
    top_k: int
    use_top_p: bool
    logprob: bool  # False: no log-prob per token (None), and greedy skips the exp over the vocabulary
    # A model with its own small vocabulary (models.vocab_map.MappedModel) samples an index into its
    # logits; `output_ids` turns it into the token id that is stored, fed back and stop-checked.
    output_ids: Callable | None

    def __call__(self, logits, step):
        """(token [B] int32, logprob [B] f32 or None) from next-token logits [B, V]."""
        tok, logp = sample_token(logits, jax.random.fold_in(self.key, step), self.temperature, self.top_p,
                            greedy=self.greedy, top_k=self.top_k, use_top_p=self.use_top_p, logprob=self.logprob)
        return (tok if self.output_ids is None else self.output_ids(tok)), logp


@dataclasses.dataclass(frozen=True)
class _StopRules:
    """When a row stops (fixed for one decode call)."""

    budget: jax.Array  # [B] int32: per-row token limit
    stop_ids: jax.Array | None  # [k] int32, None: no stop ids
    table: StopTable | None  # None: no stop strings
    pad_id: int  # written after a row stopped


def _initial_carry(cache, active, budget, n: int, rules: _StopRules, logprobs: bool) -> _Carry:
    b = active.shape[0]
    w = rules.table.patterns.shape[1] - 1 if rules.table is not None else 0
    return _Carry(
        step=jnp.zeros((), jnp.int32),
        cache=cache,
        pending=jnp.zeros((b,), bool),
        last=jnp.zeros((b,), jnp.int32),
        done=~active | (budget <= 0),
        lengths=jnp.zeros((b,), jnp.int32),
        # One spare column: the last, feed-only iteration records (nothing) at step n.
        tokens=jnp.full((b, n + 1), rules.pad_id, jnp.int32),
        logprobs=jnp.zeros((b, n + 1), jnp.float32) if logprobs else None,
        stopped_by=jnp.full((b,), STOP_NONE, jnp.int32),
        window=jnp.full((b, w), _NO_BYTE, jnp.int32),
    )


def _record(c: _Carry, tok, logp, rules: _StopRules) -> _Carry:
    """Store the token each unfinished row sampled at step `c.step`; apply the stop rules."""
    live = ~c.done
    tokens = jax.lax.dynamic_update_slice(c.tokens, jnp.where(live, tok, rules.pad_id)[:, None], (0, c.step))
    logprobs = c.logprobs
    if logprobs is not None:
        logprobs = jax.lax.dynamic_update_slice(logprobs, jnp.where(live, logp, 0.0)[:, None], (0, c.step))
    lengths = c.lengths + live.astype(jnp.int32)
    if rules.stop_ids is not None:
        hit_eos = live & jnp.any(tok[:, None] == rules.stop_ids[None, :], axis=1)
    else:
        hit_eos = jnp.zeros_like(live)
    window = c.window
    if rules.table is not None:
        window, hit_str = stop_string_step(c.window, tok, rules.table)
        hit_str = live & hit_str
        window = jnp.where(live[:, None], window, c.window)
    else:
        hit_str = jnp.zeros_like(live)
    hit_budget = live & (lengths >= rules.budget)
    finished = hit_eos | hit_str | hit_budget
    code = jnp.where(hit_eos, STOP_EOS, jnp.where(hit_str, STOP_STRING, STOP_BUDGET))
    return c.replace(
        step=c.step + 1,
        pending=live,
        last=jnp.where(live, tok, 0),  # rows not pending feed an in-range dummy with valid=False
        done=c.done | finished,
        lengths=lengths,
        tokens=tokens,
        logprobs=logprobs,
        stopped_by=jnp.where(finished, code, c.stopped_by),
        window=window,
    )


def _feed_and_sample(model, pick: _Picker, rules: _StopRules, head, c: _Carry) -> _Carry:
    """One loop iteration: write the pending tokens to the cache, sample the next step from their hidden states."""
    hidden, cache = model(c.last[:, None], c.pending[:, None], c.cache)
    c = c.replace(cache=cache)
    b = c.last.shape[0]
    # The final iteration only feeds: skip the vocabulary head when no row samples.
    tok, logp = jax.lax.cond(
        jnp.all(c.done),
        lambda h: (jnp.zeros((b,), jnp.int32), jnp.zeros((b,), jnp.float32) if pick.logprob else None),
        lambda h: pick((model.logits(h[:, None]) if head is None else model.logits(h[:, None], head))[:, 0], c.step),
        hidden[:, 0],
    )
    return _record(c, tok, logp, rules)


def special_ids(model, stop_ids: Sequence[int] | None = None, pad_id: int | None = None,
                tokenizer=None) -> tuple[tuple[int, ...], int]:
    """(stop ids, pad id) of a decode: as given; what is not given comes from `tokenizer` (its
    `chat_ids`: <|im_end|>, eos and <|endoftext|> stop, its pad pads); without a tokenizer, Qwen's
    (<|im_end|>, <|endoftext|>). Qwen's stop ids are refused for a model whose vocabulary is too small
    to hold them (not Qwen's id space: they would never stop it); its pad is not, as the pad only fills
    the output after a row stopped and is never fed to the model here."""
    if stop_ids is None or pad_id is None:
        if tokenizer is not None:
            chat = chat_ids(tokenizer)
            default = (chat.stop, chat.pad)
        else:
            vocab = getattr(getattr(model, "cfg", None), "vocab_size", None)
            if (stop_ids is None and vocab is not None and vocab <= IM_END
                    and not hasattr(model, "output_ids")):
                raise ValueError(f"the model's vocabulary has {vocab} ids, too few for Qwen's default stop ids "
                                 f"({IM_END}, {ENDOFTEXT}): pass tokenizer= (or stop_ids= and pad_id=) from the "
                                 "model's own tokenizer")
            default = ((IM_END, ENDOFTEXT), ENDOFTEXT)
        stop_ids = default[0] if stop_ids is None else stop_ids
        pad_id = default[1] if pad_id is None else pad_id
    return tuple(int(s) for s in stop_ids), int(pad_id)


def decode(
    model,
    cache,
    first_logits: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    budget: jax.Array | None = None,
    active: jax.Array | None = None,
    temperature: float | jax.Array = 1.0,
    top_p: float | jax.Array = 1.0,
    top_k: int = 0,
    greedy: bool = False,
    use_top_p: bool | None = None,
    stop_ids: tuple[int, ...] | None = None,
    stop_table: StopTable | None = None,
    pad_id: int | None = None,
    logprobs: bool = True,
) -> SampleOutput:
    """Sample up to `max_new_tokens` tokens per row in one `lax.while_loop`, carrying the KV cache.

    first_logits [B,V]: next-token logits after the prompt (from `prefill`).
    budget [B] int32: per-row token limit (<= max_new_tokens; default max_new_tokens).
    active [B] bool: rows that generate; inactive rows produce nothing (length 0, pad tokens,
        STOP_NONE) and their cache rows are not touched.
    temperature, top_p: may be traced scalars. top_k, greedy, stop_ids, max_new_tokens are static.
    use_top_p: static switch for nucleus filtering; default `top_p < 1` (needs a concrete top_p).
        When off (and top_k == 0) the vocabulary is never sorted.
    stop_ids, pad_id: static; None: Qwen's (`special_ids`); () disables stop ids.
    stop_table: from `make_stop_table`; None disables stop strings.
    logprobs: static; False returns `logprobs=None` (for callers that discard them, e.g. greedy
        evaluation: greedy decoding then reads each step's logits for the max only, no exp).
    Every sampled token, including the stop token, is written to the cache, so the next segment can be
    appended with `prefill` directly (one model call per generated token, no extra one).
    The loop ends as soon as every row has stopped.
    Step t draws with `fold_in(key, t)`: results are a deterministic function of `key`.
    """
    b = first_logits.shape[0]
    n = int(max_new_tokens)
    if n < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if int(top_k) < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    if use_top_p is None:
        try:
            use_top_p = float(top_p) < 1.0
        except jax.errors.ConcretizationTypeError:
            raise ValueError("top_p is traced: pass use_top_p=True/False explicitly") from None
    budget = jnp.minimum(jnp.asarray(budget if budget is not None else jnp.full((b,), n, jnp.int32), jnp.int32), n)
    active = active if active is not None else jnp.ones((b,), bool)
    chex.assert_rank(first_logits, 2)
    chex.assert_shape([budget, active], (b,))
    chex.assert_type(active, bool)

    pick = _Picker(key=key, temperature=jnp.asarray(temperature, jnp.float32), top_p=jnp.asarray(top_p, jnp.float32),
                   greedy=greedy, top_k=int(top_k), use_top_p=bool(use_top_p) and not greedy, logprob=bool(logprobs),
                   output_ids=getattr(model, "output_ids", None))
    stop_ids, pad_id = special_ids(model, stop_ids, pad_id)
    rules = _StopRules(budget=budget, stop_ids=jnp.asarray(stop_ids, jnp.int32) if stop_ids else None,
                       table=stop_table, pad_id=pad_id)
    # Step 0 samples from the prefill logits; each loop iteration feeds the pending tokens (so the
    # cache ends up holding every sampled token) and samples the next step from their hidden states.
    # The token loop carries the cache in the layout its single-token steps read fastest (per-layer
    # buffers where the decode is unrolled, models/qwen2/model.py `decode_layout`); callers get it back
    # stacked.
    c = _record(_initial_carry(decode_layout(cache, getattr(model, "cfg", None)), active, budget, n, rules, pick.logprob), *pick(first_logits, 0), rules)
    # A head cast to the matmul dtype (Qwen2Config.matmul_dtype) is made once, before the loop.
    head = model.head_weight() if getattr(getattr(model, "cfg", None), "matmul_dtype", None) else None
    c = jax.lax.while_loop(lambda c: jnp.any(c.pending), functools.partial(_feed_and_sample, model, pick, rules, head), c)
    return SampleOutput(tokens=c.tokens[:, :n], logprobs=None if c.logprobs is None else c.logprobs[:, :n], lengths=c.lengths,
                        cache=stacked_layout(c.cache), stopped_by=c.stopped_by)


# --------------------------------------------------------------------------------------------------
# generate: jitted wrapper

_GENERATE_FNS: dict = {}
_GENERATE_LOCK = threading.Lock()


def _make_cache(model, batch: int, max_len: int, dtype):
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        raise ValueError("generate() needs a ragen_jax Qwen2 model (an object with a .cfg Qwen2Config)")
    return KVCache.init(cfg, batch=batch, max_len=max_len, dtype=dtype)


def generate_impl(state, tokens, valid, key, temperature, top_p, stop_table, *, graphdef, statics):
    (max_new_tokens, cache_len, top_k, greedy, use_top_p, stop_ids, pad_id, cache_dtype, logprobs) = statics
    model = nnx.merge(graphdef, state)
    cache = _make_cache(model, tokens.shape[0], cache_len, cache_dtype)
    logits, cache = prefill(model, cache, tokens, valid)
    return decode(
        model,
        cache,
        logits,
        key,
        max_new_tokens=max_new_tokens,
        active=jnp.any(valid, axis=1),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        greedy=greedy,
        use_top_p=use_top_p,
        stop_ids=stop_ids,
        stop_table=stop_table,
        pad_id=pad_id,
        logprobs=logprobs,
    )


def generate(
    model,
    tokens,
    valid,
    key,
    *,
    max_new_tokens: int,
    cache_len: int | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    greedy: bool = False,
    stop_ids: Sequence[int] | None = None,
    stop_strings: Sequence[str] = (),
    token_bytes=None,
    pad_id: int | None = None,
    cache_dtype=None,
    logprobs: bool = True,
    tokenizer=None,
) -> SampleOutput:
    """Prefill `tokens` [B,T] (where `valid`) into a fresh cache and sample up to `max_new_tokens`.

    stop_ids / pad_id not given: from `tokenizer` (give the model's own: SmolLM2's end of turn is
    id 2, Qwen's 151645), else Qwen's ids (`special_ids`).

    Rows with no valid prompt token generate nothing. The compiled program is cached per
    (model graph, shapes, static settings); params, prompts, key, temperature and top_p are traced,
    so new prompts / weights of the same shapes never recompile.
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    valid = jnp.asarray(valid, bool)
    if tokens.ndim != 2 or tokens.shape != valid.shape:
        raise ValueError(f"tokens and valid must both be [B, T]; got {tokens.shape} and {valid.shape}")
    max_new_tokens = int(max_new_tokens)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    need = tokens.shape[1] + max_new_tokens
    cache_len = need if cache_len is None else int(cache_len)
    if cache_len < need:
        raise ValueError(f"cache_len {cache_len} is too small for prompt {tokens.shape[1]} + {max_new_tokens} new tokens")
    stop_table = make_stop_table(stop_strings, token_bytes) if stop_strings else None
    stop_ids, pad_id = special_ids(model, stop_ids, pad_id, tokenizer)
    if greedy:
        temperature = 1.0 if temperature is None or temperature <= 0 else temperature
    statics = (
        max_new_tokens,
        cache_len,
        int(top_k),
        bool(greedy),
        bool(top_p < 1.0) and not greedy,
        stop_ids,
        pad_id,
        None if cache_dtype is None else jnp.dtype(cache_dtype).name,
        bool(logprobs),
    )
    graphdef, state = nnx.split(model)
    fn_key = (graphdef, statics)
    with _GENERATE_LOCK:
        fn = _GENERATE_FNS.get(fn_key)
        if fn is None:
            fn = jax.jit(functools.partial(generate_impl, graphdef=graphdef, statics=statics))
            _GENERATE_FNS[fn_key] = fn
    return fn(
        state,
        tokens,
        valid,
        jnp.asarray(key),
        jnp.asarray(temperature, jnp.float32),
        jnp.asarray(top_p, jnp.float32),
        stop_table,
    )
