"""Plain-Python Countdown scoring written from the reference's code (RAGEN ragen/env/countdown/env.py
and config.py), independent of the JAX code: answers are the reference's free-text strings."""

from __future__ import annotations

import itertools
import re

SCORE, FORMAT_SCORE = 1, 0.1


def check_format(equation, nums):
    try:
        nums_in_eq = [int(n) for n in re.findall(r'\d+', equation)]
        return sorted(nums_in_eq) == sorted(nums)
    except Exception:
        return False


def check_correctness(equation_str, target):
    try:
        result = eval(equation_str, {"__builtins__": None}, {})
        return abs(result - target) < 1e-5
    except Exception:
        return False


def has_solution(nums, target):
    nums = list(nums) + [0] * (4 - len(nums))
    return any(sum(s[i] * nums[i] for i in range(4)) == target for s in itertools.product([1, -1], repeat=4))


def compute_reward(action, nums, target):
    if not check_format(action, nums):
        return 0
    if not check_correctness(action, target):
        return FORMAT_SCORE
    return SCORE


def reset_text(nums, target):
    return f"Target: {target}, nums: {list(nums)}"


def step_text(reward):
    return f"Your answer get {reward} points."
