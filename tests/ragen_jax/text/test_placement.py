"""Sudoku's six answer forms read inside jit (ragen_jax/text/placement.py) against the reference.

Truth (independent of the module): the reference's turn regex, `split("||")` and strip, then
`RefSudoku.parse_action` (envs_py/sudoku.py, the port of ragen/env/sudoku) on each kept
piece. Inputs: whole `<think>..</think><answer>..</answer>` turns of adversarial pieces (the six forms
with random numbers, whitespace, case and mutations; tokens from an alphabet of digits, long digit
runs, leading zeros, spaces, tabs, line breaks, non-ASCII spaces, commas, parentheses, the words
place/at/row/col in any case, `|`), encoded by the Qwen tokenizer and parsed by one compiled, vmapped
program: by hypothesis and by a seeded batch (SUDOKU_FORMS_N turns, default 2,048). Also: an episode
whose actions are written in the six forms gets the port's rewards, and non-ASCII digits (the one
declared difference) are unreadable on both host and device.
"""

from __future__ import annotations

import os
import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs_jax import sudoku as sd
from ragen_jax.text.placement import PlacementParser, placement_of
from ragen_jax.text.tokenizer import token_bytes_table
from envs_py import sudoku as ref

K, T, B, SHORT = 5, 160, 64, 8  # pieces kept per turn, tokens per turn, turns per call, bytes per id
FORMS = ("place {d} at row {r} col {c}", "place {d} at ({r},{c})", "place {d} at {r},{c}", "{d} at {r},{c}",
         "({r},{c},{d})", "{r},{c},{d}")
SPACES = (" ", " ", "  ", "\t", "\n", "\u3000", "\x1c", "\x0b", "\u00a0")
ALPHABET = ("0", "1", "5", "9", "12", "007", "0003", "99999999999999999999", " ", "\t", "\n", "\u3000", ",",
            ",", "(", ")", "place", "at", "row", "col", "PLACE", "At", "ROW", "cOl", "|", "x", "a", "t", "p",
            "\u00e9", "wh")


@pytest.fixture(scope="module")
def qwen():
    from ragen_jax.text.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def short_ids(qwen):
    """The ids of at most SHORT bytes: the parser's `emit_ids`, so its buffer is T * SHORT bytes (every
    generated turn is checked to use only these ids; exact for them, parse.py)."""
    _, lengths = token_bytes_table(qwen)
    return np.flatnonzero(np.asarray(lengths) <= SHORT)


@pytest.fixture(scope="module")
def parser(qwen, short_ids):
    return PlacementParser(qwen, 9, K, think=True, max_tokens=T, emit_ids=short_ids)


@pytest.fixture(scope="module")
def parse_batch(parser):
    return jax.jit(jax.vmap(parser.parse))


def number(rng: random.Random) -> str:
    r = rng.random()
    return (str(rng.randint(1, 9)) if r < 0.6 else str(rng.randint(0, 20)) if r < 0.75
            else "0" * rng.randint(1, 3) + str(rng.randint(0, 9)) if r < 0.9 else "9" * rng.randint(3, 24))


def piece(rng: random.Random) -> str:
    """One of the six forms (respaced, recased, mutated) or a string of alphabet tokens."""
    if rng.random() < 0.7:
        s = rng.choice(FORMS).format(d=number(rng), r=number(rng), c=number(rng))
        s = re.sub(" ", lambda _: rng.choice(SPACES) if rng.random() < 0.3 else " ", s)
        s = re.sub(",", lambda _: "," + rng.choice(("", "", " ", "  ", "\t", "\u3000")), s)
        s = "".join(ch.upper() if rng.random() < 0.1 else ch for ch in s)
        toks = re.findall(r"[0-9]+|[a-z]+|.", s, re.I | re.S)
        for _ in range(rng.choice((0, 0, 1, 2, 3))):
            i = rng.randint(0, len(toks))
            if rng.random() < 0.5 and i < len(toks):
                del toks[i]
            else:
                toks.insert(i, rng.choice(ALPHABET + SPACES))
        return "".join(toks)
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 14)))


def turn(rng: random.Random, qwen) -> str:
    pieces = [piece(rng) if rng.random() < 0.9 else rng.choice(("", " ")) for _ in range(rng.randint(1, 7))]
    while True:
        answer = "".join(p + rng.choice(("||", " || ", "|||", "||\n")) for p in pieces[:-1]) + pieces[-1]
        text = f"<think>ok</think>{rng.choice(('', ' ', chr(10)))}<answer>{answer}</answer>"
        if len(qwen.encode(text, add_special_tokens=False)) <= T:
            return text
        pieces = pieces[:-1] or ["1,2,3"]


def truth(text: str):
    """(actions, format_ok, has_invalid) by the reference's regex, split and RefSudoku.parse_action."""
    m = re.search(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", text, re.DOTALL)
    if m is None:
        return [], False, False
    pieces = [p.strip() for p in m.group(2).split("||") if p.strip()][:K]
    port = ref.RefSudoku(np.zeros((9, 9), int), np.zeros((9, 9), int))
    actions = []
    for p in pieces:
        ok, r, c, d = port.parse_action(p)
        if ok:
            actions.append((r * 9 + c) * 9 + d - 1)
    return actions, True, len(actions) < len(pieces)


def batch_mismatches(texts, qwen, parser, parse_batch, short_ids) -> tuple[int, int]:
    """(mismatching turns, readable pieces) over up to B turns (those over T tokens are cut to T tokens
    and compared as their decoded text: the parser reads exactly the ids it gets)."""
    ids, lengths = np.zeros((B, T), np.int32), np.zeros((B,), np.int32)
    for i, text in enumerate(texts):
        row = qwen.encode(text, add_special_tokens=False)
        if len(row) > T:
            row = row[:T]
            texts[i] = qwen.decode(row)
        assert np.isin(row, short_ids).all(), text
        ids[i, : len(row)], lengths[i] = row, len(row)
    out = jax.device_get(parse_batch(jnp.asarray(ids), jnp.asarray(lengths)))
    bad = readable = 0
    for i, text in enumerate(texts):
        actions, ok, invalid = truth(text)
        host = parser.parse_text(text)
        want = actions + [-1] * (K - len(actions))
        same = (list(out.actions[i]) == want and bool(out.format_ok[i]) == ok and bool(out.has_invalid[i]) == invalid
                and list(host.actions) == want and bool(host.has_invalid) == invalid)
        bad += not same
        readable += len(actions)
    return bad, readable


HYP_TOKENS = ALPHABET + SPACES + tuple(f.format(d=5, r=2, c=3) for f in FORMS) + (
    "place 5 at ", "row 2 col 3", "at 2,", "(2,", "3)", ", ", ",\t", "02", "10", "16")
hyp_piece = st.lists(st.sampled_from(HYP_TOKENS), max_size=10).map("".join)
hyp_turn = st.tuples(st.lists(hyp_piece, min_size=1, max_size=7), st.sampled_from(("||", " || ", "|||", "||\n")))


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(hyp_turn, min_size=1, max_size=B))
def test_forms_parse_as_the_reference_hypothesis(qwen, parser, parse_batch, short_ids, turns):
    texts = [f"<think>ok</think><answer>{sep.join(pieces)}</answer>" for pieces, sep in turns]
    assert batch_mismatches(texts, qwen, parser, parse_batch, short_ids)[0] == 0


def test_forms_parse_as_the_reference_seeded(qwen, parser, parse_batch, short_ids):
    n = int(os.environ.get("SUDOKU_FORMS_N", 2048))
    rng = random.Random(34)
    bad = readable = 0
    for _ in range(max(1, n // B)):
        b, r = batch_mismatches([turn(rng, qwen) for _ in range(B)], qwen, parser, parse_batch, short_ids)
        bad, readable = bad + b, readable + r
    assert bad == 0 and readable > n // 2  # the forms are well represented, not only junk


def test_examples_and_quirks(parser):
    cases = {"place 5 at row 2 col 3": (2, 3, 5), "place 5 at (2,3)": (2, 3, 5), "place 5 at 2, 3": (2, 3, 5),
             "5 at 2,3": (2, 3, 5), "(2,3,5)": (2, 3, 5), "2,3,5": (2, 3, 5), "2, 3,\t5": (2, 3, 5),
             "what about 2,3,5": (3, 5, 2),  # "at" anywhere: (num, row, col)
             "002,03,0005": (2, 3, 5), "10,1,1": None, "2,3": None, "place 5 at row 2": None,
             "2,3,\u0665": None}  # ARABIC-INDIC FIVE: the declared difference (the port reads 5)
    for text, want in cases.items():
        assert placement_of(text, 9) == want, text
    assert ref.RefSudoku(np.zeros((9, 9), int), np.zeros((9, 9), int)).parse_action("2,3,\u0665") == (True, 1, 2, 5)
    text = "<think>ok</think><answer>" + " || ".join(cases) + "</answer>"
    want = [((r - 1) * 9 + c - 1) * 9 + d - 1 for r, c, d in (v for v in cases.values() if v)][:K]
    assert list(parser.parse_text(text).actions) == want + [-1] * (K - len(want))


def test_an_episode_in_the_six_forms_gets_the_ports_rewards(qwen, parser, parse_batch):
    """B SimpleSudoku episodes, 20 steps: each action (random cell and digit, sometimes out of range)
    written in a random form, parsed in-graph and stepped on device; the port steps the text."""
    params = sd.SudokuParams(max_steps_in_episode=20)
    env, rng = sd.Sudoku(), random.Random(7)
    _, states = jax.jit(jax.vmap(env.reset_env, (0, None)))(jax.random.split(jax.random.PRNGKey(3), B), params)
    step = jax.jit(jax.vmap(env.step_env, (None, 0, 0, None)))
    host = jax.device_get(states)
    ports = [ref.RefSudoku(host.grid[e], host.solution[e]) for e in range(B)]
    bad = readable = 0
    for _ in range(20):
        texts, ids = [], np.zeros((B, T), np.int32)
        for e, port in enumerate(ports):
            empty = np.argwhere(port.current_grid == 0)
            r, c = empty[rng.randrange(len(empty))] + 1 if len(empty) and rng.random() < 0.8 else (
                rng.randint(1, 10), rng.randint(1, 9))
            d = port.solution_grid[r - 1, c - 1] if rng.random() < 0.5 and r <= 9 else rng.randint(1, 10)
            texts.append(rng.choice(FORMS).format(r=r, c=c, d=d))
            row = qwen.encode(f"<think>ok</think><answer>{texts[-1]}</answer>", add_special_tokens=False)
            ids[e, : len(row)] = row
        lengths = jnp.asarray((ids != 0).sum(1))
        out = parse_batch(jnp.asarray(ids), lengths)
        _, stepped, reward, _, _ = step(jax.random.PRNGKey(0), states, jnp.maximum(out.actions[:, 0], 0), params)
        took = out.num_actions == 1  # an unreadable piece is no action (the format penalty instead)
        states = jax.tree.map(lambda a, b: jnp.where(took.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), stepped, states)
        got, grids, reward = jax.device_get((out, states.grid, reward))
        for e, port in enumerate(ports):
            ok = port.parse_action(texts[e])[0]
            bad += ok != (int(got.num_actions[e]) == 1)
            if ok:
                readable += 1
                _, want, _, _ = port.step(texts[e])
                bad += abs(want - float(reward[e])) > 1e-6 or not (port.current_grid == grids[e]).all()
    assert bad == 0 and readable > B * 10
