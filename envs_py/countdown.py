"""Countdown in plain Python, written from the reference's code (RAGEN ragen/env/countdown/env.py and
config.py): answers are the reference's free-text strings, scored by Python `eval`."""

from __future__ import annotations

import itertools
import re

import numpy as np

# The reference's scores: the int 1 and the float 0.1, printed as Python prints them.
SCORE, FORMAT_SCORE = 1, 0.1


def check_format(equation, nums):
    """The reference's check_format: the integers of the text are exactly the task's numbers."""
    try:
        nums_in_eq = [int(n) for n in re.findall(r'\d+', equation)]
        return sorted(nums_in_eq) == sorted(nums)
    except Exception:  # the reference's bare except (int() of a non-ASCII digit run can fail)
        return False


def check_correctness(equation_str, target):
    """The reference's check_correctness: Python eval without builtins, within 1e-5 of the target."""
    try:
        result = eval(equation_str, {"__builtins__": None}, {})
        return abs(result - target) < 1e-5
    except Exception:  # any error (syntax, division by zero, a tuple minus an int) scores as wrong
        return False


def has_solution(nums, target):
    nums = list(nums) + [0] * (4 - len(nums))
    return any(sum(s[i] * nums[i] for i in range(4)) == target for s in itertools.product([1, -1], repeat=4))


def compute_reward(action, nums, target, score=SCORE, format_score=FORMAT_SCORE):
    if not check_format(action, nums):
        return 0
    if not check_correctness(action, target):
        return format_score
    return score


def reset_text(nums, target):
    return f"Target: {target}, nums: {list(nums)}"


def step_text(reward):
    return f"Your answer get {reward} points."


class CountdownState:
    """The task (numbers, target), the answer's reward as the reference returns it, and the flags."""

    def __init__(self, nums, target, reward=0, time=0, done=False):
        self.nums, self.target = [int(x) for x in nums], int(target)
        self.reward, self.time, self.done = reward, int(time), bool(done)

    def copy(self) -> "CountdownState":
        return CountdownState(self.nums, self.target, self.reward, self.time, self.done)


class Countdown:
    """One answer (its text) per episode, scored, then done."""

    answer_format = "text"  # step_text(state, the first answer piece)

    def __init__(self, score=SCORE, format_score=FORMAT_SCORE):
        self.score, self.format_score = score, format_score
        self.max_steps, self.action_names = 1, ()

    def step_text(self, s: CountdownState, answer: str, rng=None):
        """-> (state, reward, done, info) for the answer text (the first stripped answer piece)."""
        if s.done:
            return s, 0.0, True, {"action_is_effective": False, "success": s.reward == self.score}
        s = s.copy()
        s.reward = compute_reward(answer, s.nums, s.target, self.score, self.format_score)
        s.time, s.done = s.time + 1, True
        return s, s.reward, True, {"action_is_effective": s.reward > 0, "success": s.reward == self.score}

    def render(self, s: CountdownState) -> str:
        return step_text(s.reward) if s.done else reset_text(s.nums, s.target)


def from_jax(state) -> CountdownState:
    """One (unbatched) JAX Countdown state; its float32 reward back to the reference's int / float."""
    r = float(state.reward)
    reward = SCORE if r == 1.0 else 0 if r == 0.0 else FORMAT_SCORE
    nums = np.asarray(state.nums)[: int(state.count)].tolist()
    return CountdownState(nums, int(state.target), reward, int(state.time), bool(state.done))
