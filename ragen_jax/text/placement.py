"""Sudoku's answer pieces read in the reference's six free-text forms inside jit.

The reference (ragen/env/sudoku/env.py `parse_action`) reads each action piece `a = piece.strip().lower()`:
    for p in REFERENCE_PATTERNS:                      # in this order; the first that matches wins
        m = re.search(p, a)
        if m: groups = map(int, m.groups()); (num, row, col) if "place" in a or "at" in a else (row, col, num)
              valid iff 1 <= row, col, num <= grid size (1-based); a later pattern is not tried
"at" anywhere (e.g. in "what") switches the order of the positional forms too: the reference's quirk,
kept. `placement_of` is that code on the host, with one declared difference: only ASCII digits are
digits here (the reference's `\\d` and `int()` also take other Unicode decimal digits, e.g. "٣");
`\\s` keeps Python's meaning (every `str.isspace()` character, parse.py's `whitespace_cover`).

In-graph, per row (O(bytes), no host round trip, vmappable): why the regex search reduces to fixed
atom sequences. Every `\\d+` and `\\s+`/`\\s*` of the six patterns is followed by a character of another
class (or ends the pattern), so greedy matching always takes the whole digit or whitespace run, and a
leftmost match starts at a digit run's first digit (the run end decides the rest). So the buffer is
cut into atoms: each digit run (value saturated at SATURATED from 3 significant digits; leading zeros
allowed) and each other non-whitespace byte (ASCII letters lowered: no non-ASCII character lowercases
to a pattern character), each flagged with "whitespace before it". A pattern is then a fixed sequence
of atoms with "whitespace required / forbidden / either" flags (`\\s+` / nothing / `\\s*`), matched at
every atom by shifted comparisons. A match never crosses a piece's edge: the atoms next to a piece are
`|` or the edges of the answer's buffer (its start, the zeros after it), which no pattern contains.
Cost: elementwise ops, one prefix max scan, one prefix sum, two scatters (the atom stream), masked
min / any reductions over [k, N], and 5 gathers per piece slot (prefix scans cost about 30x an
elementwise op on the CPU: a [k, N] reduction is cheaper); N is the answer's buffer (parse.py point 1).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.sudoku import action_names
from ragen_jax.text.parse import Parsed, Parser, occurs, parsed_from_pieces, shift, unshift, whitespace_cover

REFERENCE_PATTERNS = (
    r"place\s+(\d+)\s+at\s+row\s+(\d+)\s+col\s+(\d+)",
    r"place\s+(\d+)\s+at\s+\((\d+),\s*(\d+)\)",
    r"place\s+(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"\((\d+),\s*(\d+),\s*(\d+)\)",
    r"(\d+),\s*(\d+),\s*(\d+)",
)
# ASCII digits only (the declared difference); \s stays Unicode.
_HOST_PATTERNS = tuple(re.compile(p.replace(r"\d", "[0-9]")) for p in REFERENCE_PATTERNS)

DIGITS = 256  # atom code of a digit run (other atoms: their lowered byte)
SATURATED = 1000  # value of a run with >= 3 significant digits: out of range for every grid size
_NONE = 511  # code of the atom slots past the last atom: matches nothing
# An element: (atom code, whitespace before it: True required, False forbidden, None either).
_W, _A = True, None
_PLACE_AT = ((ord("p"), _A), (ord("l"), False), (ord("a"), False), (ord("c"), False), (ord("e"), False),
             (DIGITS, _W), (ord("a"), _W), (ord("t"), False))
_ROW_COL = ((ord("r"), _W), (ord("o"), False), (ord("w"), False), (DIGITS, _W), (ord("c"), _W),
            (ord("o"), False), (ord("l"), False), (DIGITS, _W))
_PAREN_PAIR = ((ord("("), _W), (DIGITS, False), (ord(","), False), (DIGITS, _A), (ord(")"), False))
_PAIR = ((DIGITS, _W), (ord(","), False), (DIGITS, _A))
_NUM_AT = ((DIGITS, _A), (ord("a"), _W), (ord("t"), False))
_TRIPLE = ((DIGITS, _A), (ord(","), False), (DIGITS, _A), (ord(","), False), (DIGITS, _A))
_PAREN_TRIPLE = ((ord("("), _A), (DIGITS, False), (ord(","), False), (DIGITS, _A), (ord(","), False),
                 (DIGITS, _A), (ord(")"), False))
# REFERENCE_PATTERNS as segments of atoms (a shared segment is matched once).
PATTERN_SEGMENTS = ((_PLACE_AT, _ROW_COL), (_PLACE_AT, _PAREN_PAIR), (_PLACE_AT, _PAIR), (_NUM_AT, _PAIR),
                    (_PAREN_TRIPLE,), (_TRIPLE,))
# Atom offsets of the three groups in each pattern.
GROUP_OFFSETS = np.array([[i for i, (c, _) in enumerate(sum(p, ())) if c == DIGITS] for p in PATTERN_SEGMENTS],
                         np.int32)


# ---- host reference ------------------------------------------------------------------------------
def placement_of(piece: str, n: int) -> tuple[int, int, int] | None:
    """(row, col, num), 1-based, of one answer piece by the reference's rules; None if unreadable or
    out of range for an n x n grid."""
    a = piece.strip().lower()
    for pattern in _HOST_PATTERNS:
        m = pattern.search(a)
        if m:
            g = [int(x) for x in m.groups()]
            row, col, num = (g[1], g[2], g[0]) if ("place" in a or "at" in a) else g
            return (row, col, num) if 1 <= row <= n and 1 <= col <= n and 1 <= num <= n else None
    return None


# ---- in-graph ------------------------------------------------------------------------------------


def atoms(buf: jax.Array):
    """(atoms int32 [N], atoms_before int32 [N + 1], lowered int32 [N]): the atom stream packed as
    value * 1024 + whitespace_before * 512 + code (_NONE past the end), the number of atoms that start
    before each byte position, and the bytes with ASCII letters lowered."""
    n = buf.shape[0]
    pos = jnp.arange(n, dtype=jnp.int32)
    b = buf.astype(jnp.int32)
    low = jnp.where((b >= 65) & (b <= 90), b + 32, b)
    space = whitespace_cover(buf)
    digit = (b >= 48) & (b <= 57)
    prev = [shift(digit, k, False) for k in (1, 2, 3)]
    start = ~space & ~(digit & prev[0])
    run_end = digit & ~unshift(digit, 1, False)
    # A run's value from its last three digits; saturated when the latest non-digit-or-non-zero-digit
    # byte at or before pos - 3 is a non-zero digit of the run (one scan: the scans are the slow ops).
    value = b - 48 + jnp.where(prev[0], 10 * (shift(b, 1, 48) - 48), 0) + jnp.where(
        prev[0] & prev[1], 100 * (shift(b, 2, 48) - 48), 0)
    event = jax.lax.cummax(jnp.where(~digit | (b != 48), 2 * pos + (digit & (b != 48)), -2))
    saturated = prev[0] & prev[1] & prev[2] & ((shift(event, 3, 0) & 1) != 0)
    value = jnp.where(saturated, SATURATED, value)
    # Two scatters (an atom's code and whitespace flag at its first byte, a run's value at its last)
    # instead of a third scan to carry the flag to the run's end.
    counted = jnp.cumsum(start.astype(jnp.int32))
    head = jnp.where(digit, DIGITS, low) + 512 * shift(space, 1, False)
    stream = jnp.full((n,), _NONE, jnp.int32).at[jnp.where(start, counted - 1, n)].set(head, mode="drop")
    stream = stream.at[jnp.where(run_end, counted - 1, n)].add(value * 1024, mode="drop")
    return stream, jnp.concatenate([jnp.zeros((1,), jnp.int32), counted]), low


def pattern_matches(stream: jax.Array) -> jax.Array:
    """bool [6, N]: REFERENCE_PATTERNS[p] matches starting at atom j."""
    code, space = stream & 511, (stream & 512) != 0
    elements, segments = {}, {}

    def element(e):
        if e not in elements:
            c, w = e
            elements[e] = (code == c) & (True if w is None else (space if w else ~space))
        return elements[e]

    def segment(seg):
        if seg not in segments:
            m = element(seg[0])
            for t, e in enumerate(seg[1:], 1):
                m = m & unshift(element(e), t, False)
            segments[seg] = m
        return segments[seg]

    rows = []
    for segs in PATTERN_SEGMENTS:
        m, at = segment(segs[0]), len(segs[0])
        for seg in segs[1:]:
            m, at = m & unshift(segment(seg), at, False), at + len(seg)
        rows.append(m)
    return jnp.stack(rows)


def read_placements(buf: jax.Array, starts, ends, n: int):
    """(readable bool [k], action int32 [k]) of the pieces buf[starts:ends) for an n x n grid."""
    stream, before, low = atoms(buf)
    size = stream.shape[0]
    a0, a1 = before[starts], before[ends]
    # Masked reductions over [k, N] (elementwise, cheap) instead of prefix scans (slow on CPU).
    pos = jnp.arange(size, dtype=jnp.int32)
    hit = occurs(low, b"at") | occurs(low, b"place")
    swap = jnp.any(hit[None, :] & (pos[None, :] >= starts[:, None]) & (pos[None, :] < ends[:, None]), axis=1)
    # The first pattern with a match in the piece, then its leftmost match: the least p * N + j over
    # the piece's atoms j, p the first pattern matching at j (any atom matching the winner has it first).
    matches = pattern_matches(stream)
    p_first = jnp.argmax(jnp.concatenate([matches, jnp.ones((1, size), bool)]), axis=0).astype(jnp.int32)
    inside = (pos[None, :] >= a0[:, None]) & (pos[None, :] < a1[:, None])  # [k, N] atoms of each piece
    best = jnp.min(jnp.where(inside, (p_first * size + pos)[None, :], matches.shape[0] * size), axis=1)
    p, m = best // size, best % size
    found = p < matches.shape[0]
    offsets = jnp.asarray(GROUP_OFFSETS)[jnp.minimum(p, len(GROUP_OFFSETS) - 1)]
    g = stream[jnp.minimum(m[:, None] + offsets, size - 1)] >> 10  # [k, 3]
    row = jnp.where(swap, g[:, 1], g[:, 0])
    col = jnp.where(swap, g[:, 2], g[:, 1])
    num = jnp.where(swap, g[:, 0], g[:, 2])
    in_range = (row >= 1) & (row <= n) & (col >= 1) & (col <= n) & (num >= 1) & (num <= n)
    readable = found & in_range
    return readable, jnp.where(readable, ((row - 1) * n + col - 1) * n + num - 1, 0).astype(jnp.int32)


class PlacementParser(Parser):
    """A Parser for Sudoku: each kept piece is read in the reference's six forms (module docstring)
    into the env's action index ((row - 1) * n + col - 1) * n + num - 1, the index of the name
    "row,col,num" (envs_jax.sudoku.action_names); an unreadable piece is an invalid action."""

    def __init__(self, tokenizer, grid_size: int, max_actions_per_turn: int, think: bool = True,
                 max_tokens: int = 400, emit_ids=None):
        if not isinstance(grid_size, int) or not 1 <= grid_size <= 99:
            raise ValueError(f"grid_size must be an int in 1..99 (the saturated digit values), got {grid_size!r}")
        self.grid_size = grid_size
        super().__init__(tokenizer, action_names(grid_size), max_actions_per_turn, think=think,
                         max_tokens=max_tokens, emit_ids=emit_ids)

    def read_pieces(self, buf, starts, ends, kept, ok) -> Parsed:
        readable, action = read_placements(buf, starts, ends, self.grid_size)
        return parsed_from_pieces(readable, action, kept, ok)

    def parse_text(self, text: str) -> Parsed:
        k, n = self.max_actions_per_turn, self.grid_size
        actions = np.full((k,), -1, np.int32)
        pieces = self.text_pieces(text)
        if pieces is None:
            return Parsed(actions, np.int32(0), np.bool_(False), np.bool_(False))
        cells = [placement_of(p, n) for p in pieces]
        valid = [((r - 1) * n + c - 1) * n + d - 1 for r, c, d in (x for x in cells if x is not None)]
        actions[: len(valid)] = valid
        return Parsed(actions, np.int32(len(valid)), np.bool_(True), np.bool_(len(valid) < len(cells)))


__all__ = ["DIGITS", "GROUP_OFFSETS", "PATTERN_SEGMENTS", "PlacementParser", "REFERENCE_PATTERNS", "SATURATED",
           "atoms", "pattern_matches", "placement_of", "read_placements"]
