"""Countdown on device (RAGEN's `Countdown`, ragen/env/countdown): the task draw, the state and the
check of an answer; turning the answer text into the answer structure is the text layer's job.

Rules (the reference's):
- A task is a list of 3 or 4 numbers and a target. The reference reads TinyZero's
  Countdown-Tasks-3to4 parquet (3-4 numbers of 1-99) and keeps only the tasks that its
  `has_solution` solves: target = +-n1 +-n2 +-n3 [+-n4] (the first sign may be a minus). The
  dataset is not available offline, so tasks are drawn here with that property by construction:
  the count (3 or 4 with probability `four_prob`), numbers uniform in [1, max_number], signs uniform,
  target = the signed sum, re-drawn until 1 <= target <= max_target. Every task is solvable.
- One answer per episode (max_actions_per_traj 1): reward `score` (1) if the answer uses exactly the
  task's numbers (the multiset of the integers in its text, the reference's `re.findall(r'\\d+')`)
  and evaluates to the target; `format_score` (0.1) if the numbers are right but the expression
  is wrong or does not evaluate (a division by zero, text that is no expression); else 0.
  `action_is_effective` = reward > 0, `success` = reward == score. The episode then ends.
- Observation text: "Target: 98, nums: [44, 19, 35]" at reset, "Your answer get {reward} points."
  after the answer (0, 0.1 or 1 as Python prints the reference's int / float rewards).
The answer (`Answer`) is what the text layer parses out of the answer text: the integers of the text
in order, and the expression as a postfix program over + - * / and unary minus. It is evaluated in
exact fractions: with at most 4 numbers of at most 99 no intermediate value leaves int32 (an answer with
other numbers scores 0 whatever it evaluates to), and the reference's |value - target| < 1e-5 is
checked exactly on the fraction. ragen_jax/text/expression.py reads the answer text into an `Answer`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces

from envs_jax.base import AgentEnv

MAX_NUMS = 4
# Numbers, binary operators and a unary minus after each number or binary result (the text layer cancels
# a minus that follows a minus, so no program of a 4-number answer needs more).
PROGRAM_LEN = 4 * MAX_NUMS
# An answer's integer that cannot be a task number (a saturated long literal, the numbers of an answer with
# more than ANSWER_NUMS integers).
NOT_A_NUMBER = 1000
# The reference's tolerance: |value - target| < 1e-5, checked exactly as TOLERANCE_DEN * |p - t q| < q.
TOLERANCE_DEN = 100_000
ANSWER_NUMS = 8  # integers of the answer text kept for the numbers check (more means a wrong count)
# Postfix tokens: a value >= 0 pushes that number; these codes apply an operator; PAD ends the program.
PAD, ADD, SUB, MUL, DIV, NEG = -1, -2, -3, -4, -5, -6
OP_TEXT = {ADD: "+", SUB: "-", MUL: "*", DIV: "/"}
# The reference's config/envs.yaml env_instruction of Countdown, verbatim.
ENV_INSTRUCTION = (
    "You are solving the Countdown puzzle. You should use the num list to create an equation that equals the "
    "target. Example answer format: <think> To find an equation using [3, 5, 2] to get 4. Let's check 2 + 5 = 7, "
    "7 - 3 = 4. So the answer is 2 + 5 - 3 = 4. </think><answer>2 + 5 - 3</answer>"
)


@struct.dataclass
class Answer:
    numbers: jax.Array  # int32[ANSWER_NUMS]: the integers of the answer text in order, -1 after them
    program: jax.Array  # int32[PROGRAM_LEN]: the expression in postfix, PAD after it
    parsed: jax.Array  # bool: the text is an expression (False: only the numbers check can pass)


@struct.dataclass
class CountdownState:
    nums: jax.Array  # int32[MAX_NUMS] the task's numbers, 0 after `count`
    count: jax.Array  # int32 3 or 4
    target: jax.Array  # int32
    signs: jax.Array  # int32[MAX_NUMS] +-1: the drawn solution (the teacher's)
    reward: jax.Array  # float32 the answer's reward (for the text after it)
    time: jax.Array  # int32
    done: jax.Array  # bool


@struct.dataclass
class CountdownParams:
    max_steps_in_episode: int = struct.field(pytree_node=False, default=1)
    four_prob: float = 0.5
    max_number: int = struct.field(pytree_node=False, default=99)
    max_target: int = 99
    max_tries: int = 64
    score: float = 1.0
    format_score: float = 0.1


# ---- pure rule functions ------------------------------------------------------------------------
def draw_task(key: jax.Array, params: CountdownParams):
    """(nums int32[MAX_NUMS], count, target, signs): solvable with +- by construction."""

    def draw(k):
        k_count, k_nums, k_signs = jax.random.split(k, 3)
        count = jnp.where(jax.random.uniform(k_count) < params.four_prob, 4, 3)
        live = jnp.arange(MAX_NUMS) < count
        nums = jnp.where(live, jax.random.randint(k_nums, (MAX_NUMS,), 1, params.max_number + 1), 0)
        signs = jnp.where(jax.random.bernoulli(k_signs, 0.5, (MAX_NUMS,)), 1, -1)
        return nums.astype(jnp.int32), count.astype(jnp.int32), jnp.sum(signs * nums).astype(jnp.int32), signs

    def cond(c):
        tries, (_, _, target, _) = c[0], c[2]
        return ((target < 1) | (target > params.max_target)) & (tries < params.max_tries)

    def body(c):
        tries, key, _ = c
        key, sub = jax.random.split(key)
        return tries + 1, key, draw(sub)

    key, sub = jax.random.split(key)
    _, _, (nums, count, target, signs) = jax.lax.while_loop(cond, body, (jnp.int32(1), key, draw(sub)))
    # Out of tries (vanishingly rare): the negated signs give a positive target unless the sum is 0.
    flip = jnp.where(target < 0, -1, 1)
    signs = jnp.where(target == 0, 1, signs * flip)
    return nums, count, jnp.sum(signs * nums).astype(jnp.int32), signs.astype(jnp.int32)


def evaluate(program: jax.Array):
    """(numerator, denominator, ok) of a postfix program in exact reduced fractions; ok False for a
    malformed program or a division by zero."""
    n = program.shape[0]

    def step(c, tok):
        p, q, sp, ok = c
        top, below = jnp.maximum(sp - 1, 0), jnp.maximum(sp - 2, 0)
        a_p, a_q, b_p, b_q = p[below], q[below], p[top], q[top]
        binary = (tok <= ADD) & (tok >= DIV)
        num = jnp.select([tok == ADD, tok == SUB, tok == MUL, tok == DIV], [a_p * b_q + b_p * a_q,
                         a_p * b_q - b_p * a_q, a_p * b_p, a_p * b_q], 0)
        den = jnp.select([tok == MUL, tok == DIV], [a_q * b_q, a_q * b_p], a_q * b_q)
        ok = ok & ~(binary & (sp < 2)) & ~((tok == NEG) & (sp < 1)) & ~((tok == DIV) & (b_p == 0))
        den = jnp.where(den == 0, 1, den)
        g = jnp.maximum(jnp.gcd(num, den), 1) * jnp.sign(den)
        p = jnp.where(binary, p.at[below].set(num // g), jnp.where(tok == NEG, p.at[top].set(-b_p), p))
        q = jnp.where(binary, q.at[below].set(den // g), q)
        push = tok >= 0
        p = jnp.where(push, p.at[sp].set(tok), p)
        q = jnp.where(push, q.at[sp].set(1), q)
        sp = sp + jnp.where(push, 1, jnp.where(binary, -1, 0))
        return (p, q, jnp.minimum(sp, n - 1), ok), None

    init = (jnp.zeros(n, jnp.int32), jnp.ones(n, jnp.int32), jnp.int32(0), jnp.bool_(True))
    (p, q, sp, ok), _ = jax.lax.scan(step, init, program)
    return p[0], q[0], ok & (sp == 1)


def answer_reward(state: CountdownState, answer: Answer, params: CountdownParams) -> jax.Array:
    """The reference's compute_reward for a parsed answer."""
    want = jnp.sort(jnp.where(jnp.arange(MAX_NUMS) < state.count, state.nums, -1))
    got = jnp.sort(answer.numbers)
    # The multisets agree: the answer's integers, sorted, are the task's padded with -1 (at most 4).
    same = jnp.all(got[: ANSWER_NUMS - MAX_NUMS] == -1) & jnp.all(got[ANSWER_NUMS - MAX_NUMS:] == want)
    p, q, ok = evaluate(answer.program)
    # Exact |p/q - target| < 1e-5 (q > 0): an integer gap of at least 21,475 fails before the product
    # could leave int32.
    gap = jnp.abs(p - state.target * q)
    correct = answer.parsed & ok & (gap < 21_475) & (gap * TOLERANCE_DEN < q)
    return jnp.where(same, jnp.where(correct, params.score, params.format_score), 0.0).astype(jnp.float32)


def solution_answer(state: CountdownState) -> Answer:
    """The drawn solution as an answer: n1 [neg] n2 +- n3 +- [n4 +-] in postfix."""
    toks = [state.nums[0], jnp.where(state.signs[0] < 0, NEG, PAD)]
    for i in range(1, MAX_NUMS):
        live = i < state.count
        toks += [jnp.where(live, state.nums[i], PAD), jnp.where(live, jnp.where(state.signs[i] > 0, ADD, SUB), PAD)]
    toks = jnp.stack(toks).astype(jnp.int32)
    program = toks[jnp.argsort(toks == PAD, stable=True)]  # drop the unused slots, keep the order
    program = jnp.concatenate([program, jnp.full(PROGRAM_LEN - program.shape[0], PAD, jnp.int32)])
    numbers = jnp.where(jnp.arange(ANSWER_NUMS) < state.count, jnp.pad(state.nums, (0, ANSWER_NUMS - MAX_NUMS)), -1)
    return Answer(numbers=numbers.astype(jnp.int32), program=program, parsed=jnp.bool_(True))


def reward_text(reward: float, params: CountdownParams) -> str:
    """How the reference prints its reward: its score is the int 1, its format score the float 0.1."""
    if reward == params.score and float(params.score).is_integer():
        return str(int(params.score))
    return "0" if reward == 0.0 else str(params.format_score if abs(reward - params.format_score) < 1e-6 else reward)


# ---- the environment -----------------------------------------------------------------------------
class Countdown(AgentEnv):
    """Countdown; its action is an `Answer` (a pytree), not an index."""

    @property
    def default_params(self) -> CountdownParams:
        return CountdownParams()

    @property
    def num_actions(self) -> int:
        return 0

    def action_space(self, params=None):
        return spaces.Discrete(1)

    def observation_space(self, params=None):
        return spaces.Box(0, 10_000, (MAX_NUMS + 1,), jnp.int32)

    def validate_params(self, params: CountdownParams) -> None:
        """Raise ValueError for parameters the env cannot honour."""
        if params.max_steps_in_episode != 1:
            raise ValueError(f"max_steps_in_episode must be 1 (one answer per episode), got {params.max_steps_in_episode!r}")
        if not isinstance(params.max_number, int) or not 1 <= params.max_number <= 99:
            raise ValueError(f"max_number must be an int in [1, 99] (exact int32 answer checks), got {params.max_number!r}")
        if not 0.0 <= float(params.four_prob) <= 1.0:
            raise ValueError(f"four_prob must be in [0, 1], got {params.four_prob!r}")
        if int(params.max_target) < 1 or int(params.max_tries) < 1:
            raise ValueError(f"max_target and max_tries must be >= 1, got {params.max_target!r}, {params.max_tries!r}")

    def reset_env(self, key, params):
        nums, count, target, signs = draw_task(key, params)
        state = CountdownState(nums=nums, count=count, target=target, signs=signs, reward=jnp.float32(0.0),
                               time=jnp.int32(0), done=jnp.bool_(False))
        return self.get_obs(state, params), state

    def transition(self, key, state, action: Answer, params):
        reward = answer_reward(state, action, params)
        return state.replace(reward=reward), reward, jnp.bool_(True), {"action_is_effective": reward > 0}

    def is_success(self, state, params):
        return state.done & (state.reward == params.score)

    def action_names(self, params) -> tuple[str, ...]:
        return ()

    def instructions(self, params) -> str:
        return ENV_INSTRUCTION

    def symbols(self, params) -> tuple[str, ...]:
        return ()

    # The text layer reads the answer as an arithmetic expression (ragen_jax/text/expression.py) and
    # assembles the state line from slots: head, up to MAX_NUMS numbers, tail.
    answer_format = "expression"

    def observation_format(self, params) -> str:
        return "slots"

    def text_slots(self, params) -> tuple[tuple[str, ...], ...]:
        """Alternatives per slot of the state text (final newline included): "Target: t, nums: [", the
        numbers ("n", then ", n"; "" when absent), "]\n" or the after-answer line. The target slot covers
        every sum of MAX_NUMS numbers (a task drawn out of tries can exceed max_target)."""
        head = ("",) + tuple(f"Target: {t}, nums: [" for t in range(MAX_NUMS * params.max_number + 1))
        nums = [("",) + tuple(f"{'' if i == 0 else ', '}{n}" for n in range(params.max_number + 1))
                for i in range(MAX_NUMS)]
        tail = ("]\n",) + tuple(f"Your answer get {reward_text(r, params)} points.\n"
                                 for r in (0.0, params.format_score, params.score))
        return (head, *nums, tail)

    def text_slot_index(self, state, params) -> jax.Array:
        """int32 [MAX_NUMS + 2]: each slot's alternative for `state` (jittable)."""
        live = ~state.done
        head = jnp.where(live, jnp.clip(state.target, 0, MAX_NUMS * params.max_number) + 1, 0)
        nums = jnp.where(live & (jnp.arange(MAX_NUMS) < state.count), state.nums + 1, 0)
        tail = jnp.where(live, 0, jnp.where(state.reward == params.score, 3,
                                            jnp.where(state.reward == params.format_score, 2, 1)))
        return jnp.concatenate([head[None], nums, tail[None]]).astype(jnp.int32)

    def render_grid(self, state, params):
        return jnp.concatenate([state.target[None], state.nums])

    def get_obs(self, state, params=None, key=None):
        return self.render_grid(state, params)

    def render_text(self, state, params) -> str:
        s = jax.device_get(state)
        if bool(s.done):
            return f"Your answer get {reward_text(float(s.reward), params)} points."
        return f"Target: {int(s.target)}, nums: {[int(x) for x in np.asarray(s.nums)[: int(s.count)]]}"

    def teacher_answer(self, state, params) -> Answer:
        """The drawn +- solution (jittable)."""
        return solution_answer(state)
