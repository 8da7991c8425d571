"""The answer's span read from token ids (text/answer_span.py) and the parser's two buffer sizes
(parse.py point 1), against Python's regex.

Truth: `re.search` of the reference's pattern (written out here) on the decoded text, `parse_text`
(the reference's code) and the token bytes table. The span [a, z) is exact when the regex matches just as often and the text
decoded before a and before z is as long as the decoded text before the answer group's start and end
(a decode cut at an ASCII byte such as `>` or `<` ends where the whole decode does). Rows: test_parse's
grammar of tags, partial tags, every kind of whitespace, separators and names, tokenised whole, in
pieces or byte by byte (invalid UTF-8 included), and rows of long tokens. The parse itself is then
checked row by row against `parse_text` along every path: batches whose answers all fit the small
buffer, batches with a longer one (the exact bound), single rows, a nested vmap and a length shared
by the batch.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragen_jax.text.answer_span import byte_automaton
from ragen_jax.text.parse import ANSWER_BUDGET, Parser
from ragen_jax.text.tokenizer import IM_END, token_bytes_table
from tests.ragen_jax.text.test_parse import SOKOBAN, assert_same, grammar_row, reference, tok

B, T, N = 16, 96, 32  # grouped batch, ids per row (test_parse's grammar rows fit), rows per check
REGEX = {True: re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL),  # the reference's
         False: re.compile(r"<answer>(.*?)</answer>", re.DOTALL)}


@functools.lru_cache(maxsize=None)
def parser(think: bool):
    return Parser(tok(), SOKOBAN, 5, think=think, max_tokens=T)


@functools.lru_cache(maxsize=None)
def programs(think: bool):
    p = parser(think)
    return dict(span=jax.jit(jax.vmap(p.answer_span)), batch=jax.jit(jax.vmap(p.parse)), row=jax.jit(p.parse))


def padded(rows, n=N):
    ids = np.full((n, T), IM_END, np.int32)
    lens = np.zeros((n,), np.int32)
    for i, (r, length) in enumerate(rows):
        r = list(r)[:T]
        ids[i, : len(r)] = r
        lens[i] = length
    return ids, lens


@functools.lru_cache(maxsize=None)
def bytes_table():
    return token_bytes_table(tok())


def text_bytes(ids, length) -> bytes:
    table, lengths = bytes_table()
    return b"".join(bytes(table[i, : lengths[i]]) for i in ids[: max(int(length), 0)] if 0 <= i < len(lengths))


def host_automaton(data: bytes, think: bool):
    """The byte automaton run on the host: (a, z, matched)."""
    nxt, event, done = byte_automaton(think)
    s, a, z = 0, 0, 0
    for i, b in enumerate(data):
        a = i + 1 if event[s, b] == 1 else a
        z = i - 8 if event[s, b] == 2 else z
        s = nxt[s, b]
    return (a, z, True) if s == done else (0, 0, False)


def check_span(rows, think: bool):
    """answer_span (in-graph, from ids) and the host byte automaton against the regex."""
    ids, lens = padded(rows)
    a, z, ok = jax.device_get(programs(think)["span"](ids, lens))
    group = 2 if think else 1
    for i in range(len(rows)):
        data = text_bytes(ids[i], lens[i])
        m = REGEX[think].search(data.decode("utf-8", errors="replace"))
        assert bool(ok[i]) == (m is not None), data
        assert host_automaton(data, think) == (int(a[i]), int(z[i]), bool(ok[i])), data
        if m is not None:
            assert len(data[: a[i]].decode("utf-8", errors="replace")) == m.start(group), data
            assert len(data[: z[i]].decode("utf-8", errors="replace")) == m.end(group), data
            assert data[a[i] - 8: a[i]] == b"<answer>" and data[z[i]: z[i] + 9] == b"</answer>"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(grammar_row(), min_size=N, max_size=N))
def test_span_matches_regex(rows):
    check_span(rows, True)
    check_span(rows, False)


def test_byte_automaton_hand_cases():
    """Hand-computed spans (think mode) in bytes, the whitespace gap's multi-byte characters included."""
    cases = [(b"<think>x</think><answer>Up</answer>", (24, 26, True)),
             (b"<think>a</think>b</think>\xe3\x80\x80\n<answer>Down</answer>", (37, 41, True)),
             (b"<think>a</think>\xe2\x80<answer>Up</answer>", (0, 0, False)),  # a cut U+2000: not whitespace
             (b"<think></think></think> <answer>a</answer>", (32, 33, True)),
             (b"<think></think><answe</think>\t<answer></answer>", (38, 38, True)),
             (b"<answer>Up</answer>", (0, 0, False)), (b"<think>x</think><answer>Up</answer", (0, 0, False))]
    for data, want in cases:
        assert host_automaton(data, True) == want, data
    assert host_automaton(b"x<answer><answer>y</answer>", False) == (9, 18, True)


def long_rows():
    """Rows of long tokens (up to 128 bytes) in the think part, in the answer, and around the tags."""
    t = tok()
    _, lengths = token_bytes_table(t)
    rng = np.random.default_rng(11)
    rows = []
    for min_len, n in ((4, 30), (12, 60), (40, 80), (64, 88)):
        fill = rng.choice(np.flatnonzero(np.asarray(lengths) >= min_len), n).tolist()
        for ids in (t.encode("<think>") + fill + t.encode("</think><answer>Up || down</answer>"),
                    t.encode("<think>x</think> <answer> left ||") + fill[: n - 20] + t.encode("||Right</answer>"),
                    t.encode("<answer>") + fill[:6] + t.encode("|| Up</answer>")):
            rows.append((ids[:T], len(ids[:T])))
    return rows


def check_parse(rows, think: bool, single_rows: bool = True):
    """`parse` equals the reference on each row, in batches whose answers all fit the small buffer, in
    batches with a longer answer (the exact bound), in a mixed batch and (think mode) row by row.
    Returns whether a long answer was seen."""
    p, prog = parser(think), programs(think)
    ids, lens = padded(rows)
    want = [reference(p, ids[i], lens[i]) for i in range(N)]
    a, z, _ = jax.device_get(prog["span"](ids, lens))
    fits = (z - a) <= ANSWER_BUDGET
    text = lambda r: tok().decode(ids[r, : max(lens[r], 0)])  # noqa: E731
    for group in (np.flatnonzero(fits), np.flatnonzero(~fits), np.arange(B)):
        for lo in range(0, len(group), B):
            chunk = group[lo: lo + B]
            out = jax.device_get(prog["batch"](*padded([(ids[r], lens[r]) for r in chunk], B)))
            for j, r in enumerate(chunk):
                assert_same(jax.tree.map(lambda x: x[j], out), want[r], text(r))
    for r in range(0, N, 6) if single_rows else ():
        assert_same(jax.device_get(prog["row"](ids[r], lens[r])), want[r], text(r))
    return not fits.all()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(grammar_row(), min_size=N, max_size=N))
def test_parse_paths_match_regex(rows):
    check_parse(rows, True)


def test_long_answers_take_the_exact_bound():
    rows = long_rows()
    short = [(tok().encode(s), len(tok().encode(s))) for s in ("<think>ok</think><answer>Up || Left</answer>",
                                                              "<answer>down</answer>", "")]
    for think in (True, False):
        assert check_parse(rows + short, think, single_rows=think)
        check_span(rows + short, think)


def test_nested_vmap_and_shared_length():
    p = parser(True)
    rows = long_rows()[:4] + [(tok().encode("<think>a</think><answer>Up||Down</answer>"), 12)] * 4
    ids, lens = padded(rows, 8)
    out = jax.device_get(jax.jit(jax.vmap(jax.vmap(p.parse)))(ids.reshape(2, 4, T), lens.reshape(2, 4)))
    for r in range(8):
        assert_same(jax.tree.map(lambda x: x[r // 4, r % 4], out), reference(p, ids[r], lens[r]), r)
    out = jax.device_get(jax.jit(jax.vmap(p.parse, in_axes=(0, None)))(ids, jnp.int32(30)))
    for r in range(8):
        assert_same(jax.tree.map(lambda x: x[r], out), reference(p, ids[r], 30), r)


def test_decode_window_matches_table():
    """Bytes [begin, begin + size) of the text, zero from `end` on, for windows that start inside tokens."""
    p = parser(True)
    rng = np.random.default_rng(3)
    ids = rng.integers(-2, 151700, size=(4, T)).astype(np.int32)
    lens = np.array([T, 40, 3, 0], np.int32)
    for size, begin, end in ((64, 0, 10**6), (64, 5, 40), (256, 101, 300), (p.max_bytes, 7, 10**6)):
        buf, total = jax.jit(jax.vmap(lambda i, n: p.decode_bytes(i, n, size, begin, end)))(ids, lens)
        for r in range(4):
            data = text_bytes(ids[r], lens[r])
            assert int(total[r]) == len(data)
            want = data[begin: min(begin + size, end)]
            got = bytes(np.asarray(buf[r]))
            assert got[: len(want)] == want and not any(got[len(want):]), (size, begin, r)
