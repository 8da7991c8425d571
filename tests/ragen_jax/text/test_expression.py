"""Countdown's answer read inside jit (ragen_jax/text/expression.py) against Python's `ast`.

Truth (written here, independent of the module): the reference's scoring (ragen/env/countdown) with
`eval` restricted to the grammar G of expression.py, read by `ast.parse` and evaluated in `Fraction`s:
numbers by `re.findall(r"[0-9]+")`, reward 0 / 0.1 / 1. Inputs: adversarial strings from a token
alphabet (the task's numbers, other numbers and leading zeros, + - * / ( ), ** and //, spaces, tabs,
form feeds, line breaks, letters, dots, '=', '#', '\\', non-ASCII space), by hypothesis and by a
seeded batch (COUNTDOWN_EXPR_N, default 3,000; 20,000 recorded in docs/environments.md). Also: on
G strings the truth agrees with the reference's float `eval` (the exact fraction loses nothing),
and the whole path (token ids -> Parser regex -> answer -> reward) equals the host path.
"""

from __future__ import annotations

import ast
import os
import random
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs_jax import countdown as cd
from ragen_jax.text import expression as ex
from envs_py import countdown as ref

WIDTH = 96  # bytes per generated piece
OPS = ["+", "-", "*", "/", "(", ")", "**", "//"]
SPACES = [" ", " ", " ", "\t", "\x0c", "\n", "\r"]
BREAKERS = ["=", "x", ".", "e", "_", "#", "\\", "\u00a0", "%", "j"]


def truth(piece: str, nums, target) -> float:
    """The G-restricted reference reward, by ast + Fraction."""
    if sorted(int(x) for x in re.findall(r"[0-9]+", piece)) != sorted(nums):
        return 0
    if "\\" in piece or "#" in piece or re.search(r"[0-9][A-Za-z_.]|[.][0-9]", piece):
        return cd.CountdownParams().format_score
    try:
        value = _value(ast.parse(piece, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
        return cd.CountdownParams().format_score
    return 1 if abs(value - target) < Fraction(1, 100_000) else cd.CountdownParams().format_score


def _value(node) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _value(node.left), _value(node.right)
        return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(node.op)] if not isinstance(
            node.op, ast.Div) else a / b
    raise TypeError("outside G")


def random_piece(rng: random.Random, nums) -> str:
    """A well-formed expression over the numbers (half the time), then mutated token by token."""
    order = list(nums)
    rng.shuffle(order)
    if rng.random() < 0.5:
        expr = str(order[0])
        for x in order[1:]:
            op = rng.choice("+-*/")
            expr = f"({expr} {op} {x})" if rng.random() < 0.5 else f"{expr} {op} {x}"
        toks = re.findall(r"[0-9]+|\S|\s", expr)
    else:
        toks = []
    for _ in range(rng.randint(0, 12) if toks else rng.randint(1, 20)):
        r, i = rng.random(), rng.randint(0, len(toks))
        new = (str(rng.choice(order)) if r < 0.3 else rng.choice(OPS) if r < 0.6 else rng.choice(SPACES)
               if r < 0.8 else rng.choice(["0" + str(rng.choice(order)), str(rng.randint(0, 2000)), "-",
                                           "- -", "(", ")"]) if r < 0.93 else rng.choice(BREAKERS))
        if toks and rng.random() < 0.3:
            del toks[min(i, len(toks) - 1)]
        else:
            toks.insert(i, new)
    return "".join(toks).strip()[:WIDTH - 8]


def task(rng: random.Random):
    k = rng.choice([3, 4])
    nums = [rng.randint(1, 99) for _ in range(k)]
    return nums, abs(sum(n * rng.choice([1, -1]) for n in nums)) % 99 + 1


@jax.jit
def _device_rewards(buf, length, nums, count, target):
    def one(b, n, ns, c, t):
        state = cd.CountdownState(nums=ns, count=c, target=t, signs=jnp.ones_like(ns), reward=jnp.float32(0),
                                  time=jnp.int32(0), done=jnp.bool_(False))
        return cd.answer_reward(state, ex.read_answer(b, 0, n), cd.CountdownParams())
    return jax.vmap(one)(buf, length, nums, count, target)


def device_rewards(pieces, tasks):
    if len(pieces) not in (4, 1024):  # two compiled shapes for the whole file
        n = len(pieces)
        return device_rewards(pieces + [pieces[-1]] * (1024 - n), tasks + [tasks[-1]] * (1024 - n))[:n]
    buf = np.zeros((len(pieces), WIDTH), np.uint8)
    for i, p in enumerate(pieces):
        raw = p.encode()
        buf[i, :len(raw)] = np.frombuffer(raw, np.uint8)
    nums = np.asarray([n + [0] * (cd.MAX_NUMS - len(n)) for n, _ in tasks], np.int32)
    return np.asarray(_device_rewards(jnp.asarray(buf), jnp.asarray([len(p.encode()) for p in pieces], jnp.int32),
                                      jnp.asarray(nums), jnp.asarray([len(n) for n, _ in tasks], jnp.int32),
                                      jnp.asarray([t for _, t in tasks], jnp.int32)))


def compare(pieces, tasks):
    got = device_rewards(pieces, tasks)
    bad = [(p, t, float(g), truth(p, *t)) for p, t, g in zip(pieces, tasks, got)
           if abs(float(g) - truth(p, *t)) > 1e-6]
    return bad


def test_batch_of_adversarial_strings():
    n = int(os.environ.get("COUNTDOWN_EXPR_N", "3000"))
    rng = random.Random(0)
    tasks = [task(rng) for _ in range(n)]
    pieces = [random_piece(rng, nums) for nums, _ in tasks]
    # The solution itself for some rows, so correct answers are frequent.
    for i in range(0, n, 7):
        pieces[i] = " + ".join(map(str, tasks[i][0]))
        tasks[i] = (tasks[i][0], sum(tasks[i][0]) % 99 + 1 if i % 14 else sum(tasks[i][0]))
    bad = []
    for lo in range(0, n, 1024):  # one compiled shape
        chunk = list(range(lo, min(lo + 1024, n)))
        chunk += [chunk[-1]] * (1024 - len(chunk))
        bad += compare([pieces[i] for i in chunk], [tasks[i] for i in chunk])
    assert bad == [], bad[:5]
    seen = {truth(p, *t) for p, t in zip(pieces, tasks)}
    assert seen == {0, 0.1, 1}
    # On G, the exact truth is the reference's own float eval.
    in_g = [(p, t) for p, t in zip(pieces, tasks) if ex.postfix_of(p) is not None]
    assert len(in_g) > n // 5
    assert all(truth(p, *t) == ref.compute_reward(p, *t) for p, t in in_g)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["12", "7", "3", "05", "100", "0"] + OPS + SPACES + BREAKERS), min_size=1,
                max_size=24))
def test_hypothesis_strings(parts):
    piece = "".join(parts).strip()[:WIDTH - 8] or "7"
    tasks = [([12, 7, 3], 2), ([12, 7, 3], 22), ([12, 7, 3], 28), ([12, 7, 3, 3], 1)]
    assert compare([piece] * len(tasks), tasks) == [], piece


def test_hand_cases():
    cases = [("44 - 19 + 35", 1), ("(44 - 19) + 35", 1), ("44-(19+35)", 0.1), ("- -44 - 19 + 35", 1),
             ("44 - 19 + 35 = 60", 0), ("44 - 19 + 035", 0.1), ("44 - 19 +\n35", 0.1), ("(44 - 19 +\n35)", 1),
             ("44 - 19 + 35 ", 1), ("44 19 35", 0.1), ("44 - 19 + 35 + 1", 0), ("35 * 44 / 44 + 19 - 19", 0)]
    got = device_rewards([c for c, _ in cases], [([44, 19, 35], 60)] * len(cases))
    assert [round(float(g), 6) for g in got] == [w for _, w in cases]
    # Division by zero and the exact tolerance: 1/(3-3) fails, 99/98*98... equals exactly.
    got = device_rewards(["1 / (3 - 3) + 4", "99 / 98 * 98 - 1"], [([1, 3, 3, 4], 4), ([99, 98, 98, 1], 98)])
    assert [round(float(g), 6) for g in got] == [0.1, 1]


def test_parser_path_equals_host(qwen_tokenizer):
    parser = ex.ExpressionParser(qwen_tokenizer, max_actions_per_turn=1, think=True, max_tokens=48)
    rng = random.Random(1)
    texts = []
    for _ in range(64):
        nums, _ = task(rng)
        piece = random_piece(rng, nums)
        texts.append(rng.choice(["<think>", ""]) + rng.choice([" ok </think> ", "</think>", ""]) + "<answer>"
                     + rng.choice(["", " ", "||"]) + piece + rng.choice(["", " || 3", "||"])
                     + rng.choice(["</answer>", ""]))
    ids = [qwen_tokenizer.encode(t, add_special_tokens=False)[:48] for t in texts]
    texts = [qwen_tokenizer.decode(i) for i in ids]
    arr = np.full((len(ids), 48), 0, np.int32)
    for i, row in enumerate(ids):
        arr[i, :len(row)] = row
    got = jax.device_get(jax.jit(jax.vmap(parser.parse))(jnp.asarray(arr), jnp.asarray([len(r) for r in ids])))
    for i, text in enumerate(texts):
        want = parser.parse_text(text)
        assert int(got.num_actions[i]) == int(want.num_actions) and bool(got.format_ok[i]) == bool(want.format_ok)
        if int(want.num_actions):
            a = jax.tree.map(lambda x: np.asarray(x[i]), got.answer)
            assert list(a.numbers) == list(want.answer.numbers) and bool(a.parsed) == bool(want.answer.parsed)
            if bool(a.parsed):
                assert list(a.program) == list(want.answer.program), text


@pytest.fixture(scope="module")
def qwen_tokenizer():
    from ragen_jax.text.tokenizer import load_tokenizer

    return load_tokenizer()
