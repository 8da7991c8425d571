"""Reading the model's answer inside jit, with exactly the results of RAGEN's Python regex.

The reference (behaviour spec section 3) does, on the decoded assistant text:

    m = re.search(r"<think>(.*?)</think>\\s*<answer>(.*?)</answer>", text, re.DOTALL)  # think mode
    m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)                          # no-think mode
    pieces = [p.strip() for p in answer.split("||") if p.strip()][:max_actions_per_turn]
    actions = [lookup[p.lower()] for p in pieces if p.lower() in lookup]   # lookup: name.lower() -> index

`Parser.parse_text` is that code. `Parser.parse` computes the same thing on token ids inside jit:

1. The answer's span, then its bytes: an automaton over the ids (text/answer_span.py, tables built
   once per tokenizer) finds the regex's match (point 3) and the answer's byte span [a, z) without
   decoding a byte; only the answer is then decoded (from `token_bytes_table`) into a buffer of
   `answer_budget` bytes (64) when it fits, under vmap when the batch's longest answer fits (one
   branch runs for the whole batch, `_make_dispatch`), else into one of `len(ids) * Lmax` bytes, Lmax
   being the longest token actually present in the table (128 bytes for Qwen2.5), or the longest of
   the ids the caller says can occur (`emit_ids`, e.g. a task vocabulary): an exact bound, so no
   input is ever truncated. Real answers ("Up || Left", "44 - 19 + 35") take the small buffer even
   after a long think part. Ids outside the table (or at positions >= length) contribute nothing.
2. Why bytes suffice although Python works on the text decoded with errors="replace": ASCII bytes
   are never swallowed by a U+FFFD replacement (they are not UTF-8 continuation bytes), so the
   ASCII tags and `|` sit at the same places; and every whitespace character (Python's `\\s` and
   `str.strip()` both use `str.isspace()`) is either an ASCII byte or a multi-byte sequence that
   starts with a lead byte (C2, E1, E2, E3), which always starts a fresh character in the decoder,
   so matching the complete byte pattern finds exactly the decoded whitespace characters, and a
   replacement character never counts as whitespace.
3. The leftmost match (think mode): it starts at the FIRST `<think>` (if any later `<think>` has a
   match, the lazy group can stretch from the first one to the same `</think>`); its think part
   ends at the first `</think>` (at or after the end of `<think>`) followed by whitespace only and
   `<answer>`: `\\s*` is greedy and `<` is not whitespace, so it takes the whole whitespace run;
   the answer ends at the first `</answer>` after that. If there is no such `</answer>`, longer
   think parts can only start the answer later still, so there is no match at all. No-think mode:
   first `<answer>`, then the first `</answer>` after it.
4. `split("||")` is left to right and non-overlapping: in a run of `|` the separators start at
   even offsets from the run start (an odd run leaves one literal `|`; the answer's runs end at its
   edges, a tag's `>` and `<`). A piece's stripped extent runs from its first to its last byte that
   is neither separator nor whitespace ("content"). A content byte starts a non-empty piece iff the
   nearest non-whitespace byte before it is a separator or lies before the answer; it ends one iff
   the nearest non-whitespace byte after it is a separator or lies after the answer. Counting piece
   starts ranks the non-empty pieces; the first `max_actions_per_turn` are kept.
5. Case-insensitive match: action names must be ASCII. The only non-ASCII character whose
   `.lower()` is ASCII is U+212A KELVIN SIGN (-> "k"); when some name contains a "k" the pieces
   are compared in a folded byte stream where that 3-byte character counts as "k".

Cost per row: one scan over the ids with one gather each (the span); the decode of the answer (one
scatter of the token starts, one prefix max, one gather); over the answer's buffer elementwise ops,
three prefix max/min scans, one prefix sum and no gathers (under vmap, gathers and scatters are the
slow ops; the flag each step needs is packed into the low bit of the scanned positions). No host round
trips, no data-dependent shapes. Measured: docs/experiments/environments.md and bench/results/envs*.json.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.text.answer_span import answer_span, token_automaton
from ragen_jax.text.tokenizer import token_bytes_table

ACTION_SEP = "||"
# Bytes of answer read by the fast path (parse.py point 1): real answers ("Up || Left", "44 - 19 + 35")
# are shorter; a longer one is read from the exact bound instead.
ANSWER_BUDGET = 64

# Python's str.isspace() characters (also what re's \s matches in str patterns), as UTF-8 (see
# module docstring, point 2): ASCII 9-13, 28-32; U+0085, U+00A0 (C2 xx); U+1680 (E1 9A 80);
# U+2000-200A, U+2028, U+2029, U+202F (E2 80 xx); U+205F (E2 81 9F); U+3000 (E3 80 80).
_KELVIN = (0xE2, 0x84, 0xAA)  # U+212A, lowercases to ASCII "k"


@flax.struct.dataclass
class Parsed:
    """Result of parsing one assistant turn (numpy values from `parse_text`, jax arrays from `parse`).

    actions:     int32 [max_actions_per_turn], indices into `action_names` of the valid pieces in
                 answer order, -1 padding.
    num_actions: int32 scalar, number of valid actions (entries of `actions` that are >= 0).
    format_ok:   bool scalar, the regex matched.
    has_invalid: bool scalar, some kept piece (one of the first max_actions_per_turn non-empty
                 pieces) named no action. False when the regex did not match.
    """

    actions: jax.Array
    num_actions: jax.Array
    format_ok: jax.Array
    has_invalid: jax.Array
    # An env whose action is free text (Countdown's expression) gets its parsed answer here, a pytree
    # the env's step takes instead of `actions` (text/expression.py); None for named actions.
    answer: Any = None


def format_penalty_applies(parsed: Parsed):
    """The reference's format-penalty rule: the turn had an invalid piece OR no valid action.

    (A turn whose regex did not match has no valid action, so it is penalised too.) Works on the
    results of both `parse` (jax bool) and `parse_text` (numpy bool).
    """
    return parsed.has_invalid | (parsed.num_actions == 0)


def occurs(buf: jax.Array, pattern: bytes) -> jax.Array:
    """bool [N]: `pattern` starts at i. Bytes past the end are 0, which no pattern byte is."""
    n, m = buf.shape[0], len(pattern)
    padded = jnp.concatenate([buf, jnp.zeros((m,), buf.dtype)])
    hit = jnp.ones((n,), bool)
    for j, c in enumerate(pattern):
        hit &= padded[j : j + n] == c
    return hit


def whitespace_cover(buf: jax.Array) -> jax.Array:
    """bool [N]: byte i belongs to a (complete, decodable) whitespace character."""
    n = buf.shape[0]
    b = jnp.concatenate([buf, jnp.zeros((2,), buf.dtype)])
    b0, b1, b2 = b[:n], b[1 : n + 1], b[2 : n + 2]
    w1 = ((b0 >= 9) & (b0 <= 13)) | ((b0 >= 28) & (b0 <= 32))
    w2 = (b0 == 0xC2) & ((b1 == 0x85) | (b1 == 0xA0))
    e2_80 = ((b2 >= 0x80) & (b2 <= 0x8A)) | (b2 == 0xA8) | (b2 == 0xA9) | (b2 == 0xAF)
    w3 = (
        ((b0 == 0xE1) & (b1 == 0x9A) & (b2 == 0x80))
        | ((b0 == 0xE2) & (b1 == 0x80) & e2_80)
        | ((b0 == 0xE2) & (b1 == 0x81) & (b2 == 0x9F))
        | ((b0 == 0xE3) & (b1 == 0x80) & (b2 == 0x80))
    )

    def shift(x, k):  # x[i - k], False before the start
        return jnp.concatenate([jnp.zeros((k,), bool), x[: n - k]])

    return w1 | w2 | w3 | shift(w2, 1) | shift(w3, 1) | shift(w3, 2)


def shift(x, d: int, fill):  # x[i - d]
    return jnp.concatenate([jnp.full((d,), fill, x.dtype), x[: x.shape[0] - d]])


def unshift(x, d: int, fill):  # x[i + d]
    return jnp.concatenate([x[d:], jnp.full((d,), fill, x.dtype)])


def parsed_from_pieces(readable: jax.Array, action: jax.Array, kept, ok) -> Parsed:
    """Parsed from each of the k piece slots' reading (readable bool [k], action int [k]): the valid
    actions of the first `kept` slots in order, and has_invalid when a kept slot is not readable."""
    k = readable.shape[0]
    is_kept = jnp.arange(k) < kept
    valid = is_kept & readable
    out_slot = jnp.where(valid, jnp.cumsum(valid.astype(jnp.int32)) - 1, k)
    actions = jnp.full((k,), -1, jnp.int32).at[out_slot].set(action.astype(jnp.int32), mode="drop")
    return Parsed(actions=actions, num_actions=jnp.sum(valid.astype(jnp.int32)), format_ok=ok,
                  has_invalid=jnp.any(is_kept & ~valid))


class Parser:
    """Parses an assistant turn into action indices, in jit (`parse`) and on the host (`parse_text`).

    Both take the text as it appears after the generation prompt INCLUDING the forced `<think>`
    (think mode) or `<answer>` (no-think mode) prefix: the caller puts the prefix ids in front of
    the sampled ids, so that the same bytes reach both. `parse(ids, length)` reads `ids[:length]`;
    `ids` may have any static length T (e.g. max_tokens = prefix + per-turn budget); its byte
    buffer holds at most T * `token_max_bytes` bytes (see `max_bytes`), and as few as the text needs
    (module docstring, point 1).

    `emit_ids` (optional): every id `parse` can receive, e.g. a task vocabulary's ids
    (`VocabMap.to_qwen`) together with the forced prefix's ids. `token_max_bytes` is then the longest
    of THESE tokens (a much smaller buffer than the vocabulary's 128 bytes per id) and ids outside the
    set decode to no bytes, like ids outside the table: exact for inputs drawn from the set.
    """

    # A subclass that reads free text (text/expression.py) has no action names.
    needs_names = True

    def __init__(self, tokenizer, action_names: tuple[str, ...], max_actions_per_turn: int,
                 think: bool = True, max_tokens: int = 400, emit_ids=None):
        names = tuple(action_names)
        if not names and self.needs_names:
            raise ValueError("action_names is empty; a parser needs at least one action name")
        for n in names:
            if not isinstance(n, str) or not n or not n.isascii():
                raise ValueError(f"action names must be non-empty ASCII strings, got {n!r}")
        lowered = [n.lower() for n in names]
        if len(set(lowered)) != len(lowered):
            raise ValueError(f"action names must differ case-insensitively, got {names}")
        if int(max_actions_per_turn) < 1:
            raise ValueError(f"max_actions_per_turn must be >= 1, got {max_actions_per_turn}")
        if int(max_tokens) < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.action_names = names
        self.max_actions_per_turn = int(max_actions_per_turn)
        self.think = bool(think)
        self.max_tokens = int(max_tokens)
        self._pattern = re.compile(
            r"<think>(.*?)</think>\s*<answer>(.*?)</answer>" if self.think else r"<answer>(.*?)</answer>",
            re.DOTALL,
        )
        self._lookup = {n: i for i, n in enumerate(lowered)}

        table, full_lengths = token_bytes_table(tokenizer)
        lengths = np.asarray(full_lengths)
        self.vocab_size = int(lengths.shape[0])
        if emit_ids is not None:
            # Only these ids can reach `parse` (a model with its own small vocabulary plus the forced
            # prefix): the buffer bound is their longest token, not the whole vocabulary's.
            emit = np.unique(np.asarray(emit_ids, np.int64).reshape(-1))
            if emit.size == 0 or emit[0] < 0:
                raise ValueError("emit_ids must be a non-empty set of token ids >= 0 (or None for every id)")
            allowed = np.zeros(lengths.shape, bool)
            allowed[emit[emit < lengths.shape[0]]] = True
            lengths = np.where(allowed, lengths, 0)
        self.token_max_bytes = int(max(1, lengths.max()))
        # Flat byte store (about 1 MB) instead of the [V, Lmax] table (about 19 MB): it is a
        # constant of every program that parses. Padded by Lmax so that gathers stay in range.
        offsets = (np.cumsum(lengths) - lengths).astype(np.int32)
        mask = np.arange(table.shape[1])[None, :] < lengths[:, None]
        flat = np.concatenate([np.asarray(table)[mask], np.zeros(self.token_max_bytes, np.uint8)])
        self._flat = flat
        self._offsets = offsets
        # uint8 when it fits: a smaller constant in every program that parses.
        self._lengths = lengths.astype(np.uint8 if self.token_max_bytes < 256 else np.int32)

        name_len = max([len(n) for n in lowered], default=1)
        self._name_bytes = np.zeros((len(names), name_len), np.uint8)
        for i, n in enumerate(lowered):
            self._name_bytes[i, : len(n)] = np.frombuffer(n.encode(), np.uint8)
        self._name_lens = np.array([len(n) for n in lowered], np.int32)
        self._fold_kelvin = any("k" in n for n in lowered)
        self._automaton = token_automaton(tokenizer, table, full_lengths, self.think)
        self.answer_budget = ANSWER_BUDGET
        self._dispatch = self._make_dispatch()

    @property
    def max_bytes(self) -> int:
        """Byte-buffer size for `max_tokens` ids: an exact bound, nothing is ever cut off."""
        return self.max_tokens * self.token_max_bytes

    # ---- host reference ------------------------------------------------------------------------
    def text_pieces(self, text: str) -> list[str] | None:
        """The reference's kept answer pieces of a string (Python `re`): stripped, non-empty, the first
        max_actions_per_turn; None when the regex does not match."""
        m = self._pattern.search(text)
        if m is None:
            return None
        answer = m.group(2 if self.think else 1)
        return [p.strip() for p in answer.split(ACTION_SEP) if p.strip()][:self.max_actions_per_turn]

    def parse_text(self, text: str) -> Parsed:
        """The reference parse on a string (Python `re`); numpy values."""
        k = self.max_actions_per_turn
        actions = np.full((k,), -1, np.int32)
        pieces = self.text_pieces(text)
        if pieces is None:
            return Parsed(actions, np.int32(0), np.bool_(False), np.bool_(False))
        idx = [self._lookup.get(p.lower()) for p in pieces]
        valid = [i for i in idx if i is not None]
        actions[: len(valid)] = valid
        return Parsed(actions, np.int32(len(valid)), np.bool_(True), np.bool_(len(valid) < len(idx)))

    # ---- in-graph ------------------------------------------------------------------------------
    def _token_lengths(self, ids, length):
        ids = jnp.asarray(ids).astype(jnp.int32)
        if ids.ndim != 1:
            raise ValueError(f"parse expects one row of ids [T] (vmap for batches), got shape {ids.shape}")
        ok = (jnp.arange(ids.shape[0]) < length) & (ids >= 0) & (ids < self.vocab_size)
        safe = jnp.where(ok, ids, 0)
        return safe, jnp.where(ok, jnp.asarray(self._lengths)[safe].astype(jnp.int32), 0)

    def decode_bytes(self, ids: jax.Array, length: jax.Array, size: int | None = None, begin=0, end=None
                     ) -> tuple[jax.Array, jax.Array]:
        """ids int32 [T] -> (bytes [begin, begin + size) of the text as uint8 [size], the text's length in
        bytes). Bytes at or after `end` (default: the text's end) are 0. Jittable, one row.

        `size` defaults to T * token_max_bytes, the exact bound. Cost O(size + T), not O(T * Lmax): each
        byte position finds its token (the last non-empty one starting at or before it: one scatter of
        the T starts, one prefix max) and reads its byte from the flat store (one gather)."""
        safe, tok_len = self._token_lengths(ids, length)
        t = safe.shape[0]
        size = t * self.token_max_bytes if size is None else int(size)
        start = jnp.cumsum(tok_len) - tok_len
        total = jnp.sum(tok_len)
        end = total if end is None else jnp.minimum(end, total)
        # Tokens starting before `begin` all land on slot 0, where the max keeps the last of them.
        owner = jnp.zeros((size,), jnp.int32).at[jnp.where(tok_len > 0, jnp.maximum(start - begin, 0), size)].max(
            jnp.arange(t, dtype=jnp.int32), mode="drop")
        owner = jax.lax.cummax(owner)
        pos = begin + jnp.arange(size, dtype=jnp.int32)
        base = jnp.asarray(self._offsets)[safe] - start  # flat index of text byte p in token i: base[i] + p
        src = jnp.clip(base[owner] + pos, 0, self._flat.shape[0] - 1)
        return jnp.where(pos < end, jnp.asarray(self._flat)[src], jnp.uint8(0)), total

    def answer_span(self, ids: jax.Array, length: jax.Array):
        """(a, z, matched): the regex's answer is bytes [a, z) of the text (0, 0 when it does not match).
        From the ids alone, with the tables of text/answer_span.py. Jittable, one row."""
        safe, tok_len = self._token_lengths(ids, length)
        return answer_span(*self._automaton, safe, tok_len)

    def _read_window(self, ids, length, size: int, span) -> Parsed:
        """The answer read from a buffer of `size` bytes (exact when it has at most `size` bytes), up to
        `finish`."""
        a, z, ok = span
        buf, _ = self.decode_bytes(ids, length, size, a, z)
        return self.read_pieces(buf, *self.answer_pieces(buf, z - a), ok)

    def finish(self, parsed: Parsed) -> Parsed:
        """What `read_pieces` left to do that no longer needs the byte buffer (a subclass's hook: it runs
        once, after the choice of buffer size, instead of once per size in the compiled program)."""
        return parsed

    def parse(self, ids: jax.Array, length: jax.Array) -> Parsed:
        """ids int32 [T], length int32 scalar -> Parsed (jax arrays). Jittable and vmappable.

        The answer is read from `answer_budget` bytes when it fits (under vmap: when the batch's longest
        answer fits), else from T * token_max_bytes, the exact bound (see `_make_dispatch`)."""
        return self._dispatch(jnp.asarray(ids).astype(jnp.int32), jnp.asarray(length, jnp.int32))

    def _make_dispatch(self):
        """`parse` as a `lax.cond` between the two buffer sizes. Under vmap (custom rule) the batch's longest
        answer chooses, so the cond stays a branch: a plain vmap would turn it into a select that runs
        both sizes for every row."""

        def run(ids, length, batched: bool):
            full = ids.shape[-1] * self.token_max_bytes
            per_row = [functools.partial(self._read_window, size=w)
                       for w in (self.answer_budget, full)[: 2 if full > self.answer_budget else 1]]
            span_of, fns, finish = self.answer_span, per_row, self.finish
            if batched:
                span_of, fns, finish = jax.vmap(span_of), [jax.vmap(f) for f in per_row], jax.vmap(finish)
            span = span_of(ids, length)
            # The small buffer runs outside the cond: XLA:CPU runs a conditional's branch ~1.4x slower
            # (measured), and it is the one real answers take; a longer answer discards its result.
            out = fns[0](ids, length, span=span)
            if len(fns) > 1:
                small = out
                out = jax.lax.cond(jnp.max(span[1] - span[0]) > self.answer_budget,
                                   lambda: fns[1](ids, length, span=span), lambda: small)
            return finish(out)

        @jax.custom_batching.custom_vmap
        def dispatch(ids, length):
            return run(ids, length, False)

        @dispatch.def_vmap
        def batched(axis_size, in_batched, ids, length):
            if not in_batched[0]:
                ids = jnp.broadcast_to(ids, (axis_size,) + ids.shape)
            if not in_batched[1]:
                length = jnp.broadcast_to(length, (axis_size,))
            out = run(ids, length, True)
            return out, jax.tree.map(lambda _: True, out)

        return dispatch

    def answer_pieces(self, buf: jax.Array, n):
        """(starts int32 [k], ends int32 [k], kept) of an answer held in buf[:n] (zeros after it): the
        stripped extents [start, end) of its first k non-empty pieces and how many there are (<= k)."""
        size = buf.shape[0]
        k = self.max_actions_per_turn
        pos = jnp.arange(size, dtype=jnp.int32)
        solid = ~whitespace_cover(buf)
        # "||" separators, left to right and non-overlapping: even offsets in a run of pipes (the
        # answer's runs end at its edges: a tag's > and < outside, zeros after it here).
        pipe = buf == ord("|")
        run_start = jax.lax.cummax(jnp.where(pipe, -1, pos)) + 1
        sep = pipe & unshift(pipe, 1, False) & ((pos - run_start) % 2 == 0)
        sep_byte = sep | shift(sep, 1, False)
        # Nearest solid (non-whitespace) byte before / after each i, with "is a separator byte" packed in
        # the low bit so that no gather is needed (gathers and scatters are the slow ops under vmap).
        key = 2 * pos + sep_byte.astype(jnp.int32)
        prev_key = shift(jax.lax.cummax(jnp.where(solid, key, -1)), 1, -1)
        next_key = unshift(jax.lax.cummin(jnp.where(solid, key, 2 * size), reverse=True), 1, 2 * size)
        content = (pos < n) & solid & ~sep_byte
        first_of_piece = content & ((prev_key < 0) | ((prev_key & 1) != 0))
        last_of_piece = content & (((next_key >> 1) >= n) | ((next_key & 1) != 0))
        rank = jnp.cumsum(first_of_piece.astype(jnp.int32)) - 1  # of the piece, at its bytes
        kept = jnp.minimum(rank[-1] + 1, k)  # number of kept (non-empty) pieces
        slots = jnp.arange(k, dtype=jnp.int32)[:, None]
        starts = jnp.min(jnp.where(first_of_piece & (rank == slots), pos, size), axis=1)  # [k]
        ends = jnp.max(jnp.where(last_of_piece & (rank == slots), pos + 1, 0), axis=1)
        return starts, ends, kept

    def read_pieces(self, buf, starts, ends, kept, ok) -> Parsed:
        """Compare each kept piece [starts, ends) of `buf` with every action name, case-insensitively
        (a free-text subclass reads the pieces its own way)."""
        n, k = buf.shape[0], self.max_actions_per_turn
        if self._fold_kelvin:
            kelvin = occurs(buf, bytes(_KELVIN))
            keep = ~(shift(kelvin, 1, False) | shift(kelvin, 2, False))
            folded = jnp.cumsum(keep.astype(jnp.int32)) - keep  # index in the folded text
            vals = jnp.where(kelvin, jnp.uint8(ord("k")), buf)
            text = jnp.zeros((n,), jnp.uint8).at[jnp.where(keep, folded, n)].set(vals, mode="drop")
            folded = jnp.concatenate([folded, jnp.sum(keep, keepdims=True, dtype=jnp.int32)])
            starts, ends = folded[starts], folded[ends]
        else:
            text = buf
        name_bytes = jnp.asarray(self._name_bytes)  # [A, Ln], lowercase
        name_lens = jnp.asarray(self._name_lens)
        ln = name_bytes.shape[1]
        seg = text[jnp.minimum(starts[:, None] + jnp.arange(ln)[None, :], n - 1)]  # [k, Ln]
        seg = jnp.where((seg >= ord("A")) & (seg <= ord("Z")), seg + 32, seg)
        same = (seg[:, None, :] == name_bytes[None, :, :]) | (jnp.arange(ln)[None, None, :] >= name_lens[None, :, None])
        match = jnp.all(same, axis=-1) & ((ends - starts)[:, None] == name_lens[None, :])  # [k, A]
        return parsed_from_pieces(jnp.any(match, axis=-1), jnp.argmax(match, axis=-1), kept, ok)

    format_penalty_applies = staticmethod(format_penalty_applies)


__all__ = ["ACTION_SEP", "shift", "unshift", "Parsed", "Parser", "format_penalty_applies", "occurs", "parsed_from_pieces",
           "whitespace_cover"]
