"""`Parser(emit_ids=...)`: a byte buffer bounded by the longest token that can occur (a task
vocabulary) instead of the vocabulary's longest, with exactly the results of the Python regex
reference (`parse_text` on the decoded text) for ids drawn from that set."""

import jax
import numpy as np
import pytest

from ragen_jax.text.parse import Parser

from .test_parse import NAMES, SEPARATORS, SOKOBAN, TAGS, WHITESPACE, assert_same, reference, tok

T = 64


def _task_ids():
    t = tok()
    texts = TAGS + SEPARATORS + WHITESPACE[:6] + list(NAMES) + [" " + n for n in NAMES] + [n.lower() for n in NAMES]
    texts += ["I think", " I", " should", " go", ".", ",", "<think></think><answer></answer>"]
    return sorted({i for s in texts for i in t.encode(s)})


def test_emit_ids_bound_is_smaller_and_parses_exactly():
    ids_set = _task_ids()
    rng = np.random.default_rng(3)
    t = tok()
    prefix = t.encode("<think>")
    rows = []
    for r in range(32):
        if r % 2:  # well-formed turns: think, answer with actions and separators
            text = "<think> I should go " + " || ".join(rng.choice(list(NAMES), size=rng.integers(1, 4))) + \
                "</think> <answer>" + " || ".join(rng.choice(list(SOKOBAN), size=rng.integers(1, 6))) + "</answer>"
            ids = t.encode(text)
        else:  # random strings over the task vocabulary
            ids = prefix + list(rng.choice(ids_set, size=T - len(prefix)))
        ids = np.asarray(ids[:T], np.int32)
        rows.append((np.pad(ids, (0, T - len(ids))), len(ids)))
    ids = np.stack([r[0] for r in rows])
    lens = np.asarray([r[1] for r in rows], np.int32)
    # The set the model can emit: the task vocabulary plus whatever the well-formed turns tokenised to.
    ids_set = sorted(set(ids_set) | {int(i) for row, n in rows for i in row[:n]})
    full = Parser(tok(), SOKOBAN, 5, think=True, max_tokens=T)
    small = Parser(tok(), SOKOBAN, 5, think=True, max_tokens=T, emit_ids=ids_set)
    lengths = [len(tok().decode([i]).encode("utf-8")) for i in ids_set]
    assert full.token_max_bytes == 128
    assert small.token_max_bytes == max(lengths) < 40  # the longest task token, from the tokenizer
    assert small.max_bytes == T * small.token_max_bytes
    got_small = jax.jit(jax.vmap(small.parse))(ids, lens)
    got_full = jax.jit(jax.vmap(full.parse))(ids, lens)
    for i in range(len(rows)):
        want = reference(full, ids[i], lens[i])
        text = t.decode([int(x) for x in ids[i, : lens[i]]])
        assert_same(jax.tree.map(lambda x: x[i], got_small), want, f"emit_ids: {text!r}")
        assert_same(jax.tree.map(lambda x: x[i], got_full), want, f"full: {text!r}")
    assert int(np.sum(np.asarray(got_small.format_ok))) >= 16  # the well-formed half did match


def test_ids_outside_emit_ids_decode_to_nothing():
    small = Parser(tok(), SOKOBAN, 5, emit_ids=_task_ids(), max_tokens=4)
    inside = _task_ids()[5]
    outside = next(i for i in range(1000, 2000) if i not in set(_task_ids()))
    buf, n = jax.jit(small.decode_bytes)(np.asarray([inside, outside, inside, -1], np.int32), 4)
    want = tok().decode([inside]).encode("utf-8") * 2
    assert int(n) == len(want) and bytes(np.asarray(buf)[: int(n)]) == want


def test_emit_ids_errors():
    with pytest.raises(ValueError, match="emit_ids"):
        Parser(tok(), SOKOBAN, 5, emit_ids=[])
    with pytest.raises(ValueError, match="emit_ids"):
        Parser(tok(), SOKOBAN, 5, emit_ids=[-1, 5])
