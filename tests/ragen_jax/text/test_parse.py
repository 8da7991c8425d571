"""The in-graph parser against the Python regex reference (and hand-computed values).

Every check runs the jitted, vmapped `Parser.parse` over a whole batch for all parser
configurations at once (one compilation per batch shape) and compares field by field with
`Parser.parse_text(tokenizer.decode(ids[:length]))`, which is the reference's own code.
"""

import functools

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragen_jax.text.parse import Parsed, Parser, format_penalty_applies
from ragen_jax.text.tokenizer import IM_END, bytes_to_unicode, load_tokenizer

SOKOBAN = ("Up", "Down", "Left", "Right")
FROZEN_LAKE = ("Left", "Down", "Right", "Up")
BANDIT = ("Phoenix", "Dragon")
KELVIN_NAMES = ("Kick", "Walk", "k")  # exercises the U+212A (KELVIN SIGN -> "k") folding

# (name, action names, max actions per turn, think)
CONFIGS = (
    ("sokoban_think_5", SOKOBAN, 5, True),
    ("frozenlake_nothink_5", FROZEN_LAKE, 5, False),
    ("bandit_think_1", BANDIT, 1, True),
    ("bandit_nothink_1", BANDIT, 1, False),
    ("kelvin_think_5", KELVIN_NAMES, 5, True),
)
B, T = 48, 96  # the one batch shape of the equivalence tests


@functools.lru_cache(maxsize=None)
def tok():
    return load_tokenizer()


@functools.lru_cache(maxsize=None)
def parsers():
    return {name: Parser(tok(), names, k, think=think, max_tokens=T) for name, names, k, think in CONFIGS}


@functools.lru_cache(maxsize=None)
def run_all():
    ps = parsers()
    return jax.jit(jax.vmap(lambda ids, n: {name: p.parse(ids, n) for name, p in ps.items()}))


@functools.lru_cache(maxsize=None)
def byte_ids():
    vocab = tok().get_vocab()
    return np.array([vocab[c] for _, c in sorted(bytes_to_unicode().items())], np.int32)


def raw_ids(data: bytes) -> list[int]:
    """Ids spelling `data` byte by byte (no normalisation; any bytes, also invalid UTF-8)."""
    return [int(byte_ids()[b]) for b in data]


def to_batch(rows):
    """rows: list of (ids, length) -> padded [B, T] ids and [B] lengths (extra rows empty)."""
    assert len(rows) <= B
    ids = np.full((B, T), IM_END, np.int32)
    lens = np.zeros((B,), np.int32)
    for i, (r, n) in enumerate(rows):
        r = list(r)[:T]
        ids[i, : len(r)] = r
        lens[i] = n
    return ids, lens


def reference(parser, ids, length):
    n = int(np.clip(length, 0, len(ids)))
    return parser.parse_text(tok().decode([int(x) for x in ids[:n]]))


def assert_same(got: Parsed, want: Parsed, msg):
    assert np.array_equal(np.asarray(got.actions), want.actions), msg
    assert int(got.num_actions) == int(want.num_actions), msg
    assert bool(got.format_ok) == bool(want.format_ok), msg
    assert bool(got.has_invalid) == bool(want.has_invalid), msg
    assert bool(format_penalty_applies(got)) == bool(format_penalty_applies(want)), msg


def check_batch(rows):
    ids, lens = to_batch(rows)
    out = run_all()(ids, lens)
    for name, p in parsers().items():
        res = out[name]
        for i in range(len(rows)):
            got = jax.tree.map(lambda x: x[i], res)
            want = reference(p, ids[i], lens[i])
            assert_same(got, want, f"{name}: {tok().decode([int(x) for x in ids[i, : max(lens[i], 0)]])!r}")
    return out


# ------------------------------------------------------------------------------------------------
# (a) texts from a grammar of fragments, tokenised with the real tokenizer
# ------------------------------------------------------------------------------------------------

TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
PARTIAL = ["<think", "</thi", "</ans", "<answer", "answer>", "think>", "</", "<", ">", "/", "<answer/>", "</ think>"]
WHITESPACE = [" ", "  ", "\n", "\t", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u2000",
              "\u2003", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
NOT_WHITESPACE = ["\u200b", "\u180e", "\ufeff", "\u2060", "\x00", "\x1b", "\x7f", "\ufffd"]
SEPARATORS = ["||", "|", " | ", "|||", " || ", "||||", "| |"]
TRICKY = ["\u212a", "\u0130", "\u017f", "\u00df", "\u212b", "ｕｐ", "UP", "uP", "jump", "Upp", "Up.", "<|im_end|>",
          "<|endoftext|>", "#", "_", "√", "123"]
NAMES = sorted(set(SOKOBAN + FROZEN_LAKE + BANDIT + KELVIN_NAMES))


@st.composite
def names_random_case(draw):
    name = draw(st.sampled_from(NAMES))
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.swapcase() if f else c for c, f in zip(name, flips))


FRAGMENT = st.one_of(
    st.sampled_from(TAGS),
    st.sampled_from(TAGS),
    st.sampled_from(PARTIAL),
    st.sampled_from(WHITESPACE),
    st.sampled_from(NOT_WHITESPACE),
    st.sampled_from(SEPARATORS),
    st.sampled_from(TRICKY),
    names_random_case(),
    names_random_case(),
    st.text(max_size=4),
    st.tuples(st.sampled_from(["|", " ", "\u3000", "x", "Up||"]), st.integers(2, 40)).map(lambda t: t[0] * t[1]),
)


@st.composite
def grammar_row(draw):
    frags = draw(st.lists(FRAGMENT, max_size=24))
    # A plausible skeleton half of the time, so that matches are common.
    if draw(st.booleans()):
        prefix = ["<think>"] if draw(st.booleans()) else ["<answer>"]
        frags = prefix + frags
    mode = draw(st.sampled_from(["whole", "pieces", "raw"]))
    if mode == "whole":
        ids = tok().encode("".join(frags))
    elif mode == "pieces":  # a different, equally valid tokenisation of the same text
        ids = [i for f in frags for i in tok().encode(f)]
    else:  # byte by byte: no NFC, so e.g. the Kelvin sign survives
        ids = [i for f in frags for i in (raw_ids(f.encode()) if draw(st.booleans()) else tok().encode(f))]
    ids = ids[:T]
    length = len(ids) if draw(st.integers(0, 9)) else draw(st.integers(-2, T + 2))
    return ids, length


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(grammar_row(), min_size=B, max_size=B))
def test_grammar_texts_match_regex(rows):
    check_batch(rows)


# ------------------------------------------------------------------------------------------------
# (b) random token ids: garbage, special tokens, split and invalid UTF-8
# ------------------------------------------------------------------------------------------------


def test_random_ids_match_regex():
    rng = np.random.default_rng(1234)
    t = tok()
    useful = [i for s in TAGS + PARTIAL + SEPARATORS + WHITESPACE + list(NAMES) + ["up", "LEFT", " Down"]
              for i in t.encode(s)]
    bytes_of_interest = raw_ids(bytes([0x20, 0x7C, 0xC2, 0x85, 0xA0, 0xE1, 0x9A, 0x80, 0xE2, 0x81, 0x9F, 0x84,
                                       0xAA, 0xA8, 0xE3, 0xF0, 0xBF, 0xFF, 0x3C, 0x3E]))
    specials = list(range(151643, 151665))
    for _ in range(3):
        rows = []
        for _ in range(B):
            n = int(rng.integers(0, T + 1))
            kind = rng.integers(0, 4, size=n)
            ids = np.where(
                kind == 0,
                rng.integers(0, 151665, size=n),
                np.where(kind == 1, rng.choice(useful, size=n),
                         np.where(kind == 2, rng.choice(bytes_of_interest, size=n), rng.choice(specials, size=n))),
            )
            if rng.random() < 0.5:  # start like a real turn
                ids = np.concatenate([t.encode("<think>" if rng.random() < 0.5 else "<answer>"), ids])[:T]
            rows.append((ids.tolist(), len(ids) if rng.random() < 0.9 else int(rng.integers(-1, T + 1))))
        check_batch(rows)


def test_decode_bytes_matches_table():
    p = parsers()["sokoban_think_5"]
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 151936, size=(4, T)).astype(np.int32)
    ids[0, 5] = -3  # outside the table: no bytes
    lens = np.array([T, 10, 0, -1], np.int32)
    buf, total = jax.jit(jax.vmap(p.decode_bytes))(ids, lens)
    from ragen_jax.text.tokenizer import token_bytes_table

    table, lengths = token_bytes_table(tok())
    for r in range(4):
        want = b"".join(bytes(table[i, : lengths[i]]) for i in ids[r, : max(lens[r], 0)] if 0 <= i < len(lengths))
        assert int(total[r]) == len(want)
        assert bytes(np.asarray(buf[r, : len(want)])) == want
        assert not np.asarray(buf[r, len(want) :]).any()
    assert buf.shape[1] == T * p.token_max_bytes == T * 128


# ------------------------------------------------------------------------------------------------
# (c) hand-written cases with hand-computed results
# ------------------------------------------------------------------------------------------------

# (config, text or raw bytes, expected actions, format_ok, has_invalid)
HAND = [
    ("sokoban_think_5", "<think>x</think> <answer> up || LEFT || jump </answer>", [0, 2], True, True),
    ("sokoban_think_5", "<think>x</think>\n\n<answer>Right</answer>", [3], True, False),
    ("sokoban_think_5", "<think>x</think><answer>Up", [], False, False),
    ("sokoban_think_5", "<think>a</think> b <answer>Up</answer>", [], False, False),
    ("sokoban_think_5", "<think>a</think>b</think>\u3000\n<answer>Down</answer>", [1], True, False),
    ("sokoban_think_5", "<think></think><answer>Up|||Down</answer>", [0], True, True),  # "|Down"
    ("sokoban_think_5", "<think></think><answer>Up||||Down</answer>", [0, 1], True, False),
    ("sokoban_think_5", "<think></think><answer></answer>", [], True, False),
    ("sokoban_think_5", "<think><think>x</think><answer>Up</answer>", [0], True, False),
    ("sokoban_think_5", "<think>x</think><answer>Up</answer><answer>Down</answer>", [0], True, False),
    ("sokoban_think_5", "<answer>Up</answer>", [], False, False),
    ("sokoban_think_5", "<think>x</think><ANSWER>Up</ANSWER>", [], False, False),
    ("sokoban_think_5", "<think>x</think><answer>\u200bUp</answer>", [], True, True),
    ("sokoban_think_5", "<think>x</think><answer>\x85Up\x85||\x1fdown\u2029</answer>", [0, 1], True, False),
    ("sokoban_think_5", "<think>x</think><answer>Up||Up||Left||Down||Right||Up</answer>", [0, 0, 2, 1, 3], True, False),
    ("sokoban_think_5", "<think>x</think><answer>Up||Up||jump||Down||Right||Up</answer>", [0, 0, 1, 3], True, True),
    ("sokoban_think_5", "<think>x</think><answer>U p</answer>", [], True, True),
    ("frozenlake_nothink_5", "<think>x</think><answer>left || UP</answer>", [0, 3], True, False),
    ("frozenlake_nothink_5", "<answer> || \xa0 ||</answer>", [], True, False),
    ("frozenlake_nothink_5", "<answer>down</answer", [], False, False),
    ("bandit_nothink_1", "<answer>phoenix</answer>", [0], True, False),
    ("bandit_nothink_1", "<answer>Dragon || Phoenix</answer>", [1], True, False),
    ("bandit_think_1", "<think>hmm</think><answer>jump || Dragon</answer>", [], True, True),
    ("bandit_think_1", "<think>hmm</think>  <answer>  || DRAGON</answer>", [1], True, False),
    ("kelvin_think_5", b"<think></think><answer>\xe2\x84\xaaICK || wal\xe2\x84\xaa||\xe2\x84\xaa</answer>", [0, 1, 2],
     True, False),
    ("sokoban_think_5", "</think><answer>Up</answer>", [], False, False),
    ("sokoban_think_5", "</think><answer>Up</answer><think>x</think><answer>Down</answer>", [1], True, False),
    ("sokoban_think_5", "<think></think><answer>Up</answer>", [0], True, False),
    ("sokoban_think_5", "<think></think><answer><think>x</think><answer>Up</answer>", [], True, True),
    ("sokoban_think_5", b"<think></think><answer>\xe2\x80Up</answer>", [], True, True),
    ("sokoban_think_5", b"<think></think><answer>\xf0\xe2\x80\x80Up</answer>", [], True, True),
    ("sokoban_think_5", b"<think></think><answer>\xe2\x80\x80Up\xc2</answer>", [], True, True),
    ("sokoban_think_5", b"<think></think><answer>\xe2\x80\x80Up\xe3\x80\x80</answer>", [0], True, False),
    ("sokoban_think_5", b"<think></think>\xe2\x80\x8b<answer>Up</answer>", [], False, False),  # U+200B
    ("sokoban_think_5", b"<think></think>\xc2<answer>Up</answer>", [], False, False),  # U+FFFD
]


def _hand_ids(text):
    return raw_ids(text) if isinstance(text, bytes) else tok().encode(text)


def test_hand_written_cases():
    rows = [(_hand_ids(text), len(_hand_ids(text))) for _, text, *_ in HAND]
    out = check_batch(rows)  # in-graph == regex reference
    for i, (cfg, text, actions, ok, invalid) in enumerate(HAND):
        k = parsers()[cfg].max_actions_per_turn
        got = jax.tree.map(lambda x: np.asarray(x[i]), out[cfg])
        want = np.full((k,), -1)
        want[: len(actions)] = actions
        assert np.array_equal(got.actions, want), (cfg, text)
        assert int(got.num_actions) == len(actions) and bool(got.format_ok) == ok and bool(got.has_invalid) == invalid, (
            cfg, text)
        assert bool(format_penalty_applies(got)) == (invalid or not actions)


ALL_WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + (
    "\u2028\u2029\u202f\u205f\u3000")
LOOKALIKES = "\x00\x1b\x7f\x80\x9f\xad\u180e\u200b\u200c\u2060\u2800\u3164\ufeff\ufffdx"


def test_every_whitespace_character():
    """All of Python's whitespace (str.isspace) and some lookalikes, between the tags and around
    pieces; encoded byte by byte so that NFC cannot replace them (U+2000 -> U+2002)."""
    assert all(c.isspace() for c in ALL_WHITESPACE) and len(ALL_WHITESPACE) == 29
    assert not any(c.isspace() for c in LOOKALIKES)
    cases = []
    for c in ALL_WHITESPACE + LOOKALIKES:
        ws = c.isspace()
        cases.append((f"<think>x</think>{c}<answer>Up</answer>", [0] if ws else [], ws, False))
        cases.append((f"<think></think><answer>{c}Up{c}||{c}Down{c}</answer>", [0, 1] if ws else [], True, not ws))
    for start in range(0, len(cases), B):
        chunk = cases[start : start + B]
        out = check_batch([(raw_ids(text.encode()), len(raw_ids(text.encode()))) for text, *_ in chunk])
        res = out["sokoban_think_5"]
        for i, (text, actions, ok, invalid) in enumerate(chunk):
            assert np.asarray(res.actions)[i, : len(actions)].tolist() == actions, text
            assert int(res.num_actions[i]) == len(actions), text
            assert bool(res.format_ok[i]) == ok and bool(res.has_invalid[i]) == invalid, text


def test_length_and_out_of_table_ids():
    t = tok()
    good = t.encode("<think>x</think><answer>Up</answer>")
    cut = len(t.encode("<think>x</think><answer>Up</ans"))
    odd = t.encode("<think>x</think><answer>") + [151700, -5, 2**30] + t.encode("Up</answer>")
    ids, lens = to_batch([(good, len(good)), (good, cut), (good, 0), (good, -4), (odd, len(odd))])
    res = run_all()(ids, lens)["sokoban_think_5"]
    assert np.asarray(res.format_ok)[:5].tolist() == [True, False, False, False, True]
    assert np.asarray(res.actions)[[0, 4], 0].tolist() == [0, 0]


def test_long_answers():
    """Long inputs (many tokens, long pipe and whitespace runs) with a larger static size."""
    t = tok()
    p = Parser(t, SOKOBAN, 5, think=True, max_tokens=700)
    texts = [
        "<think>" + "x " * 300 + "</think>" + " " * 50 + "<answer>" + " || " * 60 + "Up || down</answer>",
        "<think>x</think><answer>" + "|" * 301 + "Left</answer>",  # odd run: "|Left"
        "<think>x</think><answer>" + "|" * 300 + "Left</answer>",
        "<think>x</think><answer>" + "\u3000" * 200 + "Right" + "\u2003" * 200 + "</answer>",
        "<think>" + "</think> <answer>" * 100 + "Up</answer>",
    ]
    rows = [t.encode(s) for s in texts]
    n = max(len(r) for r in rows)
    assert n <= 700
    ids = np.full((len(rows), 700), IM_END, np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    lens = np.array([len(r) for r in rows], np.int32)
    out = jax.jit(jax.vmap(p.parse))(ids, lens)
    for i in range(len(rows)):
        assert_same(jax.tree.map(lambda x: x[i], out), reference(p, ids[i], lens[i]), texts[i][:80])
    assert np.asarray(out.actions)[:, 0].tolist() == [0, -1, 2, 3, -1]


def test_parser_errors():
    with pytest.raises(ValueError, match="ASCII"):
        Parser(tok(), ("Up", "Ünter"), 5)
    with pytest.raises(ValueError, match="case-insensitively"):
        Parser(tok(), ("Up", "UP"), 5)
    with pytest.raises(ValueError, match="max_actions_per_turn"):
        Parser(tok(), SOKOBAN, 0)
    with pytest.raises(ValueError, match="empty"):
        Parser(tok(), (), 5)
