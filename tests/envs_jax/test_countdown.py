"""Countdown vs the reference's scoring (envs_py/countdown.py, Python `eval` of the answer
text): 1,000 drawn tasks each answered in several ways, checked side by side (reward, flags, text);
the task draw (every task solvable as the reference's filter demands)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import countdown as cd
from envs_py import countdown as ref

ENV = cd.Countdown()
PARAMS = cd.CountdownParams()
N = 1000


@pytest.fixture(scope="module")
def tasks():
    _, state = jax.jit(jax.vmap(ENV.reset_env, (0, None)))(jax.random.split(jax.random.PRNGKey(0), N), PARAMS)
    return jax.device_get(state)


def test_tasks_are_drawn_solvable(tasks):
    counts = np.asarray(tasks.count)
    assert set(counts.tolist()) == {3, 4} and abs((counts == 4).mean() - 0.5) < 0.06
    for e in range(N):
        nums = [int(x) for x in tasks.nums[e][: counts[e]]]
        assert all(1 <= x <= 99 for x in nums) and 1 <= int(tasks.target[e]) <= 99
        assert ref.has_solution(nums, int(tasks.target[e]))
    assert len({(tuple(n), int(t)) for n, t in zip(tasks.nums.tolist(), tasks.target)}) > 0.99 * N


def _random_answer(rng, nums, signs, kind):
    """(text, Answer fields): kind 0 the drawn solution, 1 a random expression over the numbers,
    2 the same with one number changed, 3 the numbers in text that is no expression."""
    if kind == 0:
        post = [nums[0]] + ([cd.NEG] if signs[0] < 0 else [])
        for x, s in zip(nums[1:], signs[1:]):
            post += [x, cd.ADD if s > 0 else cd.SUB]
    else:
        order = list(rng.permutation(nums))
        if kind == 2:
            order[0] = int(order[0]) % 99 + 1
        post, depth = [], 0
        for i, x in enumerate(order):
            post.append(int(x))
            depth += 1
            if rng.random() < 0.2:
                post.append(cd.NEG)
            while depth >= 2 and (i == len(order) - 1 or rng.random() < 0.5):
                post.append(int(rng.choice([cd.ADD, cd.SUB, cd.MUL, cd.DIV])))
                depth -= 1
    stack = []
    for t in post:
        if t >= 0:
            stack.append(str(t))
        elif t == cd.NEG:
            stack.append(f"(-{stack.pop()})")
        else:
            b, a = stack.pop(), stack.pop()
            stack.append(f"({a} {cd.OP_TEXT[t]} {b})")
    text, parsed = stack[0], True
    if kind == 3:
        text, parsed = " + * ".join(str(x) for x in rng.permutation(nums)) + " =", False
    numbers = [int(x) for x in (post if kind != 3 else rng.permutation(nums)) if x >= 0] if kind != 3 else \
        [int(x) for x in text.replace("+", " ").replace("*", " ").replace("=", " ").split()]
    return text, numbers, post, parsed


def test_answers_scored_as_the_reference(tasks):
    rng = np.random.default_rng(0)
    texts, numbers, programs, parsed = [], [], [], []
    for e in range(N):
        nums = [int(x) for x in tasks.nums[e][: tasks.count[e]]]
        for kind in range(4):
            t, n, p, ok = _random_answer(rng, nums, [int(s) for s in tasks.signs[e]], kind)
            texts.append(t)
            numbers.append(n + [-1] * (cd.ANSWER_NUMS - len(n)))
            programs.append(p + [cd.PAD] * (cd.PROGRAM_LEN - len(p)))
            parsed.append(ok)
    answers = cd.Answer(numbers=jnp.asarray(numbers, jnp.int32), program=jnp.asarray(programs, jnp.int32),
                        parsed=jnp.asarray(parsed))
    states = jax.tree.map(lambda x: np.repeat(x, 4, axis=0), tasks)
    step = jax.jit(jax.vmap(ENV.step_env, (None, 0, 0, None)))
    _, new, reward, term, info = jax.device_get(step(jax.random.PRNGKey(1), states, answers, PARAMS))
    mismatches, seen = 0, set()
    for i, text in enumerate(texts):
        e = i // 4
        nums = [int(x) for x in tasks.nums[e][: tasks.count[e]]]
        want = ref.compute_reward(text, nums, int(tasks.target[e]))
        seen.add(want)
        s = jax.tree.map(lambda x: x[i], new)
        ok = (abs(float(reward[i]) - want) < 1e-6 and bool(term[i]) and bool(s.done)
              and bool(info["success"][i]) == (want == ref.SCORE) and bool(info["action_is_effective"][i]) == (want > 0)
              and ENV.render_text(s, PARAMS) == ref.step_text(want))
        mismatches += not ok
    assert mismatches == 0 and seen == {0, 0.1, 1}
    assert sum(ref.compute_reward(t, [int(x) for x in tasks.nums[i // 4][: tasks.count[i // 4]]],
                                  int(tasks.target[i // 4])) == 1 for i, t in enumerate(texts) if i % 4 == 1) > 0


def test_reset_text_and_teacher(tasks):
    s = jax.tree.map(lambda x: x[0], tasks)
    nums = [int(x) for x in s.nums[: s.count]]
    assert ENV.render_text(s, PARAMS) == ref.reset_text(nums, int(s.target))
    rewards = jax.jit(jax.vmap(lambda st: cd.answer_reward(st, ENV.teacher_answer(st, PARAMS), PARAMS)))(tasks)
    assert (np.asarray(rewards) == 1.0).all()


def test_evaluate_by_hand():
    prog = lambda *t: jnp.asarray(list(t) + [cd.PAD] * (cd.PROGRAM_LEN - len(t)), jnp.int32)
    p, q, ok = cd.evaluate(prog(6, 4, cd.DIV, 3, cd.MUL))  # 6 / 4 * 3 = 9/2
    assert (int(p), int(q), bool(ok)) == (9, 2, True)
    assert not bool(cd.evaluate(prog(6, 3, 3, cd.SUB, cd.DIV))[2])  # division by zero
    assert not bool(cd.evaluate(prog(6, cd.ADD))[2]) and not bool(cd.evaluate(prog(6, 4))[2])  # malformed
    p, q, ok = cd.evaluate(prog(5, cd.NEG, 2, cd.SUB))
    assert (int(p), int(q), bool(ok)) == (-7, 1, True)


def test_registered_and_validated():
    env, params = envs_jax.make("Countdown")
    assert isinstance(env, cd.Countdown) and params.max_steps_in_episode == 1
    assert envs_jax.get_spec("Countdown").single_action
    with pytest.raises(ValueError, match="max_number must be an int in"):
        envs_jax.make("Countdown", max_number=1000)
