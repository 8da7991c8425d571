"""Where the reference's regex finds the answer, read from token ids with tables built once.

The regex (parse.py) is `<think>(.*?)</think>\\s*<answer>(.*?)</answer>` (think mode) or
`<answer>(.*?)</answer>`, searched in the decoded text. Its leftmost match (parse.py, point 3) is
found by a deterministic automaton reading the bytes left to right:

    think mode:  SEEK_THINK (prefixes of "<think>") -> SEEK_CLOSE (prefixes of "</think>") -> GAP
                 (a whitespace run: whole whitespace characters, parse.py point 2, or a prefix of
                 "<answer>") -> IN_ANSWER (prefixes of "</answer>") -> DONE
    no-think:    SEEK_ANSWER (prefixes of "<answer>") -> IN_ANSWER -> DONE

Any other byte in GAP ends the run: back to SEEK_CLOSE (where a `<` starts a new "</think>"; every tag
has its only `<` first, so a failed prefix restarts at `<` or at nothing). The automaton enters
IN_ANSWER at the `>` of the matched "<answer>" and DONE at the `>` of the first "</answer>" after it,
so the answer is the bytes in between; no DONE means no match.

A token is a fixed byte string, so per token id and state the automaton's state after the token and
the offsets in the token where it entered IN_ANSWER / DONE are a table computed once per tokenizer
(numpy over all ids, memoised); ids with equal rows share a class (a few thousand), so the program
holds one small int per id and a [classes, states] table. In-graph, per row: one scan over the T ids,
one gather per id, gives the answer's byte span and whether the regex matched, without decoding a byte.
"""

from __future__ import annotations

import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np

# Python's str.isspace() characters as UTF-8 (parse.py, point 2): the ASCII ones, then each multi-byte
# one as (lead, second) -> accepted third bytes (None: a two-byte character).
_WS_ASCII = tuple(range(9, 14)) + tuple(range(28, 33))
_WS_MULTI = {(0xC2, 0x85): None, (0xC2, 0xA0): None, (0xE1, 0x9A): (0x80,),
             (0xE2, 0x80): tuple(range(0x80, 0x8B)) + (0xA8, 0xA9, 0xAF), (0xE2, 0x81): (0x9F,),
             (0xE3, 0x80): (0x80,)}
ENTER, FINISH = 1, 2  # byte events: the answer starts after this byte / the "</answer>" ends at it
_memo: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=None)
def byte_automaton(think: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """(next state int32 [S, 256], event int8 [S, 256], DONE state) of the module docstring's automaton;
    state 0 is the start. Memoised (read-only arrays)."""
    states: dict = {}

    def sid(name):
        return states.setdefault(name, len(states))

    # Name every state first, in a fixed order (the start state is 0).
    first = ("think", 0) if think else ("answer", 0)
    sid(first)
    rules = []  # (state name, byte -> (next name, event))

    def seek(tag: bytes, name: str, done, event=0):
        """States "tag[:k] seen" for k < len(tag): the next tag byte advances, `<` restarts, else nothing."""
        for k in range(len(tag)):
            def step(b, k=k):
                if b == tag[k]:
                    return (done, event) if k + 1 == len(tag) else ((name, k + 1), 0)
                return ((name, 1), 0) if b == ord("<") else ((name, 0), 0)
            rules.append(((name, k), step))

    def broken(b):  # a non-whitespace character in the gap: look for the next "</think>"
        return (("close", 1), 0) if b == ord("<") else (("close", 0), 0)

    if think:
        seek(b"<think>", "think", ("close", 0))
        seek(b"</think>", "close", ("gap",))

        def gap(b):
            if b in _WS_ASCII:
                return ("gap",), 0
            if b in {lead for lead, _ in _WS_MULTI}:
                return ("gap", b), 0
            return (("open", 1), 0) if b == ord("<") else broken(b)
        rules.append((("gap",), gap))
        for lead in sorted({lead for lead, _ in _WS_MULTI}):
            rules.append((("gap", lead), lambda b, lead=lead: (
                (("gap",) if _WS_MULTI[(lead, b)] is None else ("gap", lead, b)), 0) if (lead, b) in _WS_MULTI
                else broken(b)))
        for (lead, second), thirds in _WS_MULTI.items():
            if thirds is not None:
                rules.append((("gap", lead, second), lambda b, t=thirds: (("gap",), 0) if b in t else broken(b)))
        tag = b"<answer>"
        for k in range(1, len(tag)):
            def opening(b, k=k):
                if b == tag[k]:
                    return (("answer_in", 0), ENTER) if k + 1 == len(tag) else (("open", k + 1), 0)
                return (("close", 2), 0) if k == 1 and b == ord("/") else broken(b)
            rules.append((("open", k), opening))
    else:
        seek(b"<answer>", "answer", ("answer_in", 0), ENTER)
    seek(b"</answer>", "answer_in", ("done",), FINISH)
    rules.append((("done",), lambda b: (("done",), 0)))

    for name, _ in rules:
        sid(name)
    nxt = np.zeros((len(states), 256), np.int32)
    event = np.zeros((len(states), 256), np.int8)
    for name, step in rules:
        for b in range(256):
            to, ev = step(b)
            nxt[states[name], b], event[states[name], b] = states[to], ev
    assert len(rules) == len(states), "every named state has its rule"
    nxt.setflags(write=False)
    event.setflags(write=False)
    return nxt, event, states[("done",)]


def token_automaton(tokenizer, table: np.ndarray, lengths: np.ndarray, think: bool):
    """(class int [V], packed int32 [classes * S], S, DONE) for the token bytes table of `tokenizer`.

    packed[c * S + s] = next state | (enter offset + 1) << 8 | (finish offset + 1) << 16, offsets
    within the token (-1: none). Memoised per tokenizer (the table is `token_bytes_table`'s)."""
    key = (think, table.shape)
    try:
        memo = _memo.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: no memo
        memo = {}
    if key not in memo:
        memo[key] = _token_tables(np.asarray(table), np.asarray(lengths), think)
    return memo[key]


def _token_tables(table, lengths, think):
    """Each token's row, built byte by byte as a function of the state: all tokens at once, each step
    mapping (function so far, next byte) to the composed function, and only the distinct pairs are
    composed (there are a few hundred; the tokens are 150k)."""
    nxt, event, done = byte_automaton(think)
    n_states = nxt.shape[0]
    funcs = [(np.arange(n_states, dtype=np.int32), np.full(n_states, -1, np.int32), np.full(n_states, -1, np.int32))]
    index = {funcs[0][0].tobytes() + funcs[0][1].tobytes() + funcs[0][2].tobytes(): 0}
    plain = {}  # (function, byte) -> composed function, for pairs without an event (independent of j)

    def compose(f, b, j):
        state, enter, finish = funcs[f]
        ev = event[state, b]
        if not ev.any() and (f, b) in plain:
            return plain[(f, b)]
        new = (nxt[state, b], np.where(ev == ENTER, j, enter), np.where(ev == FINISH, j, finish))
        key = new[0].tobytes() + new[1].tobytes() + new[2].tobytes()
        if key not in index:
            index[key] = len(funcs)
            funcs.append(new)
        if not ev.any():
            plain[(f, b)] = index[key]
        return index[key]

    func = np.zeros(lengths.shape[0], np.int64)
    for j in range(int(lengths.max(initial=0))):
        rows = np.flatnonzero(lengths > j)
        pairs, inverse = np.unique(func[rows] * 256 + table[rows, j], return_inverse=True)
        func[rows] = np.asarray([compose(int(q) // 256, int(q) % 256, j) for q in pairs])[inverse.reshape(-1)]
    used, cls = np.unique(func, return_inverse=True)
    rows = np.stack([funcs[f][0] | (funcs[f][1] + 1) << 8 | (funcs[f][2] + 1) << 16 for f in used])
    cls = cls.reshape(-1).astype(np.int16 if rows.shape[0] < 2 ** 15 else np.int32)
    return cls, rows.reshape(-1).astype(np.int32), n_states, done


def answer_span(cls: jax.Array, packed: jax.Array, n_states: int, done: int, ids: jax.Array,
                tok_len: jax.Array):
    """(a, z, matched) of one row: the answer is bytes [a, z) of the decoded text when matched.

    ids int32 [T] (any values where tok_len is 0: those ids are skipped, as they decode to nothing),
    tok_len int32 [T] their byte lengths. One scan over T with one gather per id."""
    c = jnp.asarray(cls)[jnp.clip(ids, 0, cls.shape[0] - 1)].astype(jnp.int32) * n_states
    start = jnp.cumsum(tok_len) - tok_len

    def step(carry, x):
        s, a, z = carry
        row, begin, live = x
        e = jnp.asarray(packed)[row + s]
        enter, finish = ((e >> 8) & 255) - 1, (e >> 16) - 1
        a = jnp.where(live & (enter >= 0), begin + enter + 1, a)
        z = jnp.where(live & (finish >= 0), begin + finish - 8, z)  # "</answer>" is 9 bytes
        return (jnp.where(live, e & 255, s), a, z), None

    (s, a, z), _ = jax.lax.scan(step, (jnp.int32(0), jnp.int32(0), jnp.int32(0)), (c, start, tok_len > 0))
    matched = s == done
    return jnp.where(matched, a, 0), jnp.where(matched, z, 0), matched


__all__ = ["ENTER", "FINISH", "answer_span", "byte_automaton", "token_automaton"]
