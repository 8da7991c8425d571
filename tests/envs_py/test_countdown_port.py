"""envs_py's Countdown (the host side of bench.envs' Countdown row: the reference's `re`
numbers check and `eval`) against the JAX env stepped with the text layer's parse of the same answer
text: the same rewards, flags and text on 240 random tasks, each answered four ways (right,
numbers-only, a number changed, right numbers with a wrong operator), and its reset text."""

from __future__ import annotations

import random

import jax
import numpy as np

import pytest

import envs_jax
from bench import envs as bench
import envs_py as npe
from envs_jax import countdown as cd
from ragen_jax.text.expression import ExpressionParser
from ragen_jax.text.tokenizer import load_tokenizer

N = 240


@pytest.fixture(scope="module")
def parser():
    return ExpressionParser(load_tokenizer(), 1)


def _piece(rng: random.Random, nums, signs, kind: int) -> str:
    """kind 0 the drawn +- solution, 1 the numbers alone, 2 the solution with a number changed,
    3 the solution with its last sign made a '*' (the numbers check passes, the value mostly not)."""
    if kind == 1:
        return rng.choice((" ", ", ")).join(map(str, nums))
    nums = list(nums)
    if kind == 2:
        i = rng.randrange(len(nums))
        nums[i] = nums[i] % 99 + 1
    ops = [("+" if s > 0 else "-") for s in signs[1:len(nums)]]
    if kind == 3:
        ops[-1] = "*"
    text = ("-" if signs[0] < 0 else "") + str(nums[0])
    return text + "".join(f" {o} {x}" for o, x in zip(ops, nums[1:]))


def _tasks(rng: random.Random, n: int) -> cd.CountdownState:
    """n tasks drawn as the env draws them (3-4 numbers of 1-99, target = a +- sum in [1, 99]), on the
    host (the env's own draw would cost a compile)."""
    rows = []
    while len(rows) < n:
        count = rng.choice((3, 4))
        nums = [rng.randint(1, 99) for _ in range(count)] + [0] * (cd.MAX_NUMS - count)
        signs = [rng.choice((1, -1)) for _ in range(cd.MAX_NUMS)]
        target = sum(s * x for s, x in zip(signs, nums))
        if 1 <= target <= 99:
            rows.append((nums, count, target, signs))
    nums, count, target, signs = (np.asarray(c, np.int32) for c in zip(*rows))
    return cd.CountdownState(nums=nums, count=count, target=target, signs=signs, reward=np.zeros(n, np.float32),
                             time=np.zeros(n, np.int32), done=np.zeros(n, bool))


def test_numpy_countdown_rewards_and_text_equal_the_env(parser):
    env, params = envs_jax.make("Countdown")
    host = npe.countdown.Countdown()
    rng = random.Random(0)
    tasks = _tasks(rng, N)
    texts, pieces, starts = [], [], []
    for e in range(N):
        st = jax.tree.map(lambda x: x[e], tasks)
        hs = npe.countdown.from_jax(st)
        assert hs.nums == [int(x) for x in st.nums[: st.count]] and hs.target == int(st.target) and not hs.done
        assert host.render(hs) == env.render_text(st, params)
        for kind in range(4):
            piece = _piece(rng, hs.nums, [int(s) for s in st.signs], kind)
            # The answer text around the piece varies as a model's does; only the first piece is scored.
            tail = rng.choice(("", " || 1 + 2", "||"))
            texts.append(f"<think> t{e} </think>{rng.choice(('', chr(10)))}<answer> {piece}{tail} </answer>")
            assert npe.answer_pieces(texts[-1])[0] == piece
            pieces.append(piece)
            starts.append(hs)
    answers = [parser.parse_text(t).answer for t in texts]
    answers = jax.tree.map(lambda *x: np.stack(x), *answers)
    states = jax.tree.map(lambda x: np.repeat(x, 4, axis=0), tasks)
    step = jax.jit(jax.vmap(env.step_env, (None, 0, 0, None)), static_argnums=3)
    _, new, reward, _, info = jax.device_get(step(jax.random.PRNGKey(1), states, answers, params))
    seen = {}
    for i, (hs, piece) in enumerate(zip(starts, pieces)):
        hnew, hr, hdone, hinfo = host.step_text(hs, piece)
        s = jax.tree.map(lambda x: x[i], new)
        assert abs(float(reward[i]) - hr) < 1e-6 and hdone and bool(s.done), (texts[i], hr, float(reward[i]))
        assert hinfo["success"] == bool(info["success"][i]), texts[i]
        assert hinfo["action_is_effective"] == bool(info["action_is_effective"][i]), texts[i]
        assert host.render(hnew) == env.render_text(s, params), texts[i]
        assert npe.countdown.from_jax(s).reward == hnew.reward
        seen.setdefault(i % 4, set()).add(hr)
    # Each kind scored as it should: right 1, numbers-only and a wrong sign 0.1 (the '*' rarely hits
    # the target), a changed number 0, so every branch of the reference's scoring ran.
    assert seen[0] == {1} and seen[1] == {0.1} and seen[2] == {0} and 0.1 in seen[3]


def test_bench_countdown_tasks_and_answers_score_alike(parser):
    """bench.envs' fixed tasks are solvable (their states carry a +- solution) and its answers score
    1, 0.1 and 0 on them, the same on both sides: the scoring the benchmark times is live work."""
    env, params = envs_jax.make("Countdown")
    host = npe.countdown.Countdown()
    n_tasks, n_answers = len(bench.COUNTDOWN_TASKS), len(bench.COUNTDOWN_PIECES)
    states = jax.device_get(bench.countdown_states(n_tasks * n_answers))  # task i % n_tasks
    texts = [f"<think> ok </think><answer> {p} </answer>" for p in bench.COUNTDOWN_PIECES]
    answers = [parser.parse_text(texts[i // n_tasks]).answer for i in range(n_tasks * n_answers)]
    answers = jax.tree.map(lambda *x: np.stack(x), *answers)
    # One program: each answer's reward, and each state's own +- solution scored.
    score = jax.jit(jax.vmap(lambda s, a: (env.step_env(jax.random.PRNGKey(0), s, a, params)[2],
                                           cd.answer_reward(s, cd.solution_answer(s), params))))
    reward, solved = jax.device_get(score(states, answers))
    assert (solved == 1.0).all()
    counts = {0: 0, 0.1: 0, 1: 0}
    for i in range(n_tasks * n_answers):
        nums, target = bench.COUNTDOWN_TASKS[i % n_tasks]
        hs = npe.countdown.from_jax(jax.tree.map(lambda x: x[i], states))
        assert (hs.nums, hs.target) == (list(nums), target)
        _, hr, _, _ = host.step_text(hs, bench.COUNTDOWN_PIECES[i // n_tasks])
        assert abs(float(reward[i]) - hr) < 1e-6, (nums, target, bench.COUNTDOWN_PIECES[i // n_tasks])
        counts[hr] += 1
    assert min(counts.values()) > 0 and counts[0.1] > 0.25 * n_tasks * n_answers
