"""Solver teachers: the assistant's turn of a perfect (or optimal) player, as token ids, inside jit.

A teacher is `teacher(state, turn, key) -> (ids int32 [max_response_tokens], length)`, the contract
of `Rollout(None, text_env, cfg, teacher=teacher)` (see ragen_jax/rollout/rollout.py): the ids
continue the forced `<think>` (or `<answer>` in no-think mode) of the turn's segment, so the
demonstrations are in exactly the conversation format the policy later samples in:

    think:     " I push the box toward the target.</think><answer>Up || Left</answer><|im_end|>"
    no-think:  "Up || Left</answer><|im_end|>"

The thought is short and fixed per environment: the demonstrations teach the format and the
actions, not a reasoning style (the reference's SFT warm start rendered solver moves the same way).

Token ids come from small host-built tables (`AnswerTable`): the tokenizer's encoding of
"{thought}</think><answer>{first action}", of " || {action}" for each action, and of
"</answer>" + <|im_end|>. Concatenating them gives exactly the tokenizer's own encoding of the
whole answer because Qwen's pre-tokenizer always splits at these joints (a letter run ends at the
following space or `<`); the table checks that on every joint type when it is built, so a
tokenizer for which it does not hold fails loudly instead of producing drifting ids.

Teachers per kind (an environment's record, `envs_jax.get_spec(name).teacher`, names its kind, and
`teacher_thought` its thought):
- bfs (Sokoban, all variants): BFS from the CURRENT state every turn (re-solving is simpler and robust
  to anything that happened in between); the turn names the next min(actions per turn, solution
  length, actions left) moves.
- value_iteration (FrozenLake): the finite-horizon value-iteration policy. That policy is optimal only with feedback
  after every action (slips make the next cell random), but a turn's actions run without feedback
  in between, so a teacher naming several actions would act blindly after the first slip. It
  therefore names ONE action per turn: the optimal action for the current cell, planned with the
  actions it can really still take, min(actions left, turns left) (one per turn).
- countdown_solution (Countdown): the +- solution the task was drawn with, as an expression.
- backtracking (Sudoku): the current grid completed by the env's backtracking solver; the turn places
  its digits in the first min(actions per turn, actions left) empty cells, row-major (the drawn
  solution's digits where the grid has no completion, e.g. after a wrong placement).
- expectimax (2048): the env's depth-2 expectimax player (`env.teacher_action`), ONE move per turn:
  every move spawns a random tile, so a second move named in the same turn would be planned for a
  board the teacher has not seen (and the reference's instruction asks for a single action).
- env_policy (any env that brings its own policy, e.g. the worked example of docs/guide/add_environment.md):
  `env.teacher_action(key, state, params)`, one action per turn.
- bandit_arm (Bandit): the high-risk arm with probability `high_prob`, else the low-risk arm, drawn from the
  turn's key (a Bandit episode is one turn, so this is one draw per episode).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.text import render
from ragen_jax.text.tokenizer import chat_ids
import envs_jax
from envs_jax.bandit import HIGH, LOW

ANSWER_SEP = " || "
THINK_CLOSE = "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
IM_END_TEXT = "<|im_end|>"
# Joint checks of an AnswerTable beyond this many answers are sampled (each is one tokenizer call).
MAX_JOINT_CHECKS = 20_000

def teacher_texts() -> tuple[str, ...]:
    """The fixed texts every teacher answer is made of (besides action names), so that a small task
    vocabulary (`model.vocab='task'`, ragen_jax.trainer.rl.build_vocab) covers the demonstrations:
    the thoughts of every registered environment's record."""
    specs = [envs_jax.get_spec(n) for n in envs_jax.registered_envs()]
    thoughts = dict.fromkeys(s.teacher_thought for s in specs if s.teacher and s.text_layer and s.teacher_thought)
    heads = [f"{t}{THINK_CLOSE}{ANSWER_OPEN}" for t in thoughts]
    return (*heads, THINK_CLOSE + ANSWER_OPEN, ANSWER_CLOSE, ANSWER_SEP)


def _encode(tokenizer, texts):
    return [list(x) for x in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _pad_rows(rows, pad):
    width = max(1, max(len(r) for r in rows))
    out = np.full((len(rows), width), pad, np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, np.asarray([len(r) for r in rows], np.int32)


class AnswerTable:
    """Host tables that assemble one assistant answer in-graph with static shapes.

    Args:
      tokenizer: a ChatML tokenizer (Qwen2.5, SmolLM2, ...).
      action_names: the env's action names, in action-index order.
      think: think mode (thought + `</think><answer>` before the actions) or no-think (actions only).
      thought: the fixed thought text (think mode), e.g. " I push the box toward the target.".
      max_tokens: the static output length (the rollout's max_response_tokens).
      max_actions: the most actions per answer wanted; lowered to the most that ALWAYS fit in
        max_tokens (with the longest action names). `self.max_actions` is the value used.
    """

    def __init__(self, tokenizer, action_names, *, think: bool, thought: str = "", max_tokens: int,
                 max_actions: int):
        names = tuple(action_names)
        if not names:
            raise ValueError("action_names is empty: a teacher needs at least one action")
        if max_actions < 1:
            raise ValueError(f"max_actions must be >= 1, got {max_actions}")
        if ANSWER_SEP.strip() in "".join(names) or any(n != n.strip() or not n for n in names):
            raise ValueError(f"action names {names!r} cannot be written in an answer (empty, padded or containing '||')")
        self.names, self.think, self.thought = names, bool(think), thought if think else ""
        self.head_text = f"{thought}{THINK_CLOSE}{ANSWER_OPEN}" if think else ""
        self.tail_text = ANSWER_CLOSE + IM_END_TEXT
        # Row [1] of each table ends the answer: the last name is encoded with "</answer>" because a
        # name ending in punctuation (the cube's U') merges with "</" into one pre-token.
        first = [_encode(tokenizer, [self.head_text + n + end for n in names]) for end in ("", ANSWER_CLOSE)]
        rest = [_encode(tokenizer, [ANSWER_SEP + n + end for n in names]) for end in ("", ANSWER_CLOSE)]
        self.chat = chat_ids(tokenizer)  # <|im_end|> and pad are the tokenizer's
        self._check_joints(tokenizer, first, rest)
        self.first, self.first_len = _pad_rows(first[0] + first[1], self.chat.pad)
        self.rest, self.rest_len = _pad_rows(rest[0] + rest[1], self.chat.pad)
        self.first, self.rest = self.first.reshape(2, len(names), -1), self.rest.reshape(2, len(names), -1)
        self.first_len, self.rest_len = self.first_len.reshape(2, -1), self.rest_len.reshape(2, -1)
        self.tail = np.asarray([self.chat.im_end], np.int32)
        self.max_tokens = int(max_tokens)

        def worst(k):  # longest possible answer with k actions
            if k == 1:
                return int(self.first_len[1].max()) + len(self.tail)
            return (int(self.first_len[0].max()) + (k - 2) * int(self.rest_len[0].max())
                    + int(self.rest_len[1].max()) + len(self.tail))

        fit = [k for k in range(1, max_actions + 1) if worst(k) <= self.max_tokens]
        if not fit:
            raise ValueError(f"max_response_tokens={self.max_tokens} cannot hold even a one-action teacher "
                             f"answer ({worst(1)} tokens: {self.text((0,))!r}); raise prompt.max_response_tokens")
        self.max_actions = fit[-1]

    def _check_joints(self, tokenizer, first, rest):
        """Pieces concatenated == the tokenizer's encoding of the whole text, on every kind of joint:
        head|action, action|separator, separator|action (all pairs, plus all second/third pairs
        behind the first action); first/rest: [not last, last] piece ids per action."""
        n = len(self.names)
        combos = [(a,) for a in range(n)] + [(a, b) for a in range(n) for b in range(n)]
        combos += [(0, b, c) for b in range(n) for c in range(n)]
        if len(combos) > MAX_JOINT_CHECKS:  # Sudoku's 729 names: every single name, then sampled pairs/triples
            rng = np.random.default_rng(0)
            picks = rng.choice(len(combos) - n, MAX_JOINT_CHECKS - n, replace=False) + n
            combos = combos[:n] + [combos[int(i)] for i in np.sort(picks)]
        whole = _encode(tokenizer, [self.text(c)[: -len(IM_END_TEXT)] for c in combos])
        for c, want in zip(combos, whole):
            got = first[len(c) == 1][c[0]] + sum((rest[i == len(c) - 1][a] for i, a in enumerate(c) if i), [])
            if got != want:
                raise ValueError(f"the tokenizer does not split the teacher answer {self.text(c)!r} at the piece "
                                 "joints, so table-built ids would differ from its own encoding")

    # -- host --------------------------------------------------------------------------------
    def text(self, actions) -> str:
        """The intended answer text (after the forced prefix) for a sequence of action indices."""
        return self.head_text + ANSWER_SEP.join(self.names[int(a)] for a in actions) + self.tail_text

    # -- in-graph ------------------------------------------------------------------------------
    def ids(self, actions, num):
        """(ids int32 [max_tokens], length) naming `actions[:num]` (jittable, vmappable).

        actions: int32 [>= max_actions] action indices (entries past `num` are ignored);
        num: how many to name, clipped to [1, max_actions].
        """
        k = self.max_actions
        actions = jnp.clip(jnp.asarray(actions, jnp.int32)[:k], 0, len(self.names) - 1)
        num = jnp.clip(jnp.asarray(num, jnp.int32), 1, k)
        first, rest = jnp.asarray(self.first), jnp.asarray(self.rest)
        first_len, rest_len = jnp.asarray(self.first_len), jnp.asarray(self.rest_len)
        alone = (num == 1).astype(jnp.int32)
        pieces = [(first[alone, actions[0]], first_len[alone, actions[0]])]
        if k > 1:
            more, j = actions[1:], jnp.arange(1, k)
            last = (j == num - 1).astype(jnp.int32)
            pieces.append((rest[last, more], jnp.where(j < num, rest_len[last, more], 0)))
        pieces.append((jnp.asarray(self.tail), len(self.tail)))
        return render.concat(pieces, self.max_tokens, self.chat.pad)


# ---------------------------------------------------------------------------------- teachers
class _Teacher:
    kind = ""  # its envs_jax.TEACHER_KINDS key
    # Which demonstrations make the SFT data by default (see SFTTrainer): the reference's warm
    # start used solver trajectories, i.e. solutions.
    keep_only_successful = False

    def __init__(self, text_env, *, thought: str = "", max_actions: int | None = None):
        pc = text_env.config
        self.text_env, self.env, self.env_params = text_env, text_env.env, text_env.env_params
        want = text_env.max_actions_per_turn if max_actions is None else int(max_actions)
        self.table = AnswerTable(text_env.tokenizer, text_env.action_names, think=pc.think,
                                 thought=thought,
                                 max_tokens=pc.max_response_tokens, max_actions=min(want, text_env.max_actions_per_turn))
        self.actions_per_turn = self.table.max_actions
        self.max_turns = int(text_env.max_turns)
        steps = int(self.env_params.max_steps_in_episode)
        self.max_actions_per_episode = min(int(text_env.max_actions_per_episode), steps)

    def actions_left(self, state):
        return jnp.maximum(self.max_actions_per_episode - jnp.asarray(state.time, jnp.int32), 0)


class SokobanTeacher(_Teacher):
    """BFS solution from the current state; the next min(actions per turn, left) moves each turn."""

    kind = "bfs"
    keep_only_successful = True

    def __call__(self, state, turn, key):
        sol = self.env.solve(state, self.env_params)
        k = self.actions_per_turn
        acts = sol.actions[:k]
        # Unsolvable (or already solved): no solver move exists; name a random one so the turn is
        # still well formed (such demos fail and are dropped by default).
        fallback = jax.random.randint(key, (k,), 0, len(self.table.names), jnp.int32)
        has_plan = sol.length > 0
        acts = jnp.where(has_plan & (acts >= 0), acts, fallback)
        num = jnp.where(has_plan, jnp.minimum(sol.length, self.actions_left(state)), 1)
        return self.table.ids(acts, num)


class FrozenLakeTeacher(_Teacher):
    """One value-iteration-optimal action per turn (see the module docstring for why one)."""

    kind = "value_iteration"

    def horizon(self, state, turn):
        """Actions the agent can still take: one per remaining turn, at most the actions left."""
        turns_left = self.max_turns - jnp.asarray(turn, jnp.int32) + 1
        steps = int(self.env_params.max_steps_in_episode)
        return jnp.clip(jnp.minimum(self.actions_left(state), turns_left), 1, steps)

    def action(self, state, turn):
        policy, _ = self.env.solve(state, self.env_params)
        return policy[self.horizon(state, turn), state.pos]

    def __call__(self, state, turn, key):
        return self.table.ids(jnp.full((self.actions_per_turn,), self.action(state, turn)), 1)


class BanditTeacher(_Teacher):
    """The high-risk arm with probability `high_prob`, else the low-risk one."""

    kind = "bandit_arm"

    def __init__(self, text_env, *, high_prob: float = 0.5, **kw):
        super().__init__(text_env, **kw)
        if not 0.0 <= float(high_prob) <= 1.0:
            raise ValueError(f"high_prob must be in [0, 1], got {high_prob!r}")
        self.high_prob = float(high_prob)

    def __call__(self, state, turn, key):
        arm = jnp.where(jax.random.bernoulli(key, self.high_prob), HIGH, LOW).astype(jnp.int32)
        action = self.env.arm_action(state, arm, self.env_params)  # the state's own pair's name (name_pairs)
        return self.table.ids(jnp.full((self.actions_per_turn,), action), 1)


class CountdownTeacher:
    """The task's drawn +- solution written as an expression ("44 - 19 + 35"; "-44 + 19 + 35" when the
    first sign is a minus), from host tables: thought + `</think><answer>` + the signed first number
    (one table: a `-` right after `>` is one pre-token with it), then " + n" / " - n", then
    `</answer><|im_end|>`; the joints are checked against the tokenizer's own encoding when built."""

    kind = "countdown_solution"
    keep_only_successful = True

    def __init__(self, text_env, *, thought: str = "", max_actions: int | None = None):
        pc, tok = text_env.config, text_env.tokenizer
        self.text_env, self.env, self.env_params = text_env, text_env.env, text_env.env_params
        self.chat = chat_ids(tok)
        top = int(self.env_params.max_number)
        head = f"{thought}{THINK_CLOSE}{ANSWER_OPEN}" if pc.think else ""
        self.firsts = [head + f"{'-' if neg else ''}{n}" for neg in (0, 1) for n in range(top + 1)]
        self.rests = [f" {op} {n}" for op in "+-" for n in range(top + 1)]
        self.first, self.first_len = _pad_rows(_encode(tok, self.firsts), self.chat.pad)
        self.rest, self.rest_len = _pad_rows(_encode(tok, self.rests), self.chat.pad)
        self.tail = np.asarray(_encode(tok, [ANSWER_CLOSE])[0] + [self.chat.im_end], np.int32)
        self.max_tokens = int(pc.max_response_tokens)
        worst = int(self.first_len.max()) + 3 * int(self.rest_len.max()) + len(self.tail)
        if worst > self.max_tokens:
            raise ValueError(f"max_response_tokens={self.max_tokens} cannot hold a Countdown teacher answer "
                             f"({worst} tokens); raise prompt.max_response_tokens")
        rng = np.random.default_rng(0)
        for _ in range(32):  # joints: first|rest, rest|rest, rest|</answer>
            i, j, k = (int(x) for x in rng.integers(0, [len(self.firsts), len(self.rests), len(self.rests)]))
            text = self.firsts[i] + self.rests[j] + self.rests[k] + ANSWER_CLOSE
            got = _encode(tok, [self.firsts[i], self.rests[j], self.rests[k], ANSWER_CLOSE])
            if sum(got[1:], got[0]) != _encode(tok, [text])[0]:
                raise ValueError(f"the tokenizer does not split the Countdown answer {text!r} at the piece joints")

    def text(self, state) -> str:
        """The host text of the answer `__call__` writes (after the forced prefix)."""
        s = jax.device_get(state)
        nums, signs = [int(x) for x in s.nums[: int(s.count)]], [int(x) for x in s.signs[: int(s.count)]]
        out = self.firsts[(signs[0] < 0) * (len(self.firsts) // 2) + nums[0]]
        out += "".join(self.rests[(sg < 0) * (len(self.rests) // 2) + n] for n, sg in zip(nums[1:], signs[1:]))
        return out + ANSWER_CLOSE + IM_END_TEXT

    def __call__(self, state, turn, key):
        half_f, half_r = len(self.firsts) // 2, len(self.rests) // 2
        first = jnp.where(state.signs[0] < 0, half_f, 0) + state.nums[0]
        more = jnp.where(state.signs[1:] < 0, half_r, 0) + state.nums[1:]
        live = jnp.arange(1, state.nums.shape[0]) < state.count
        pieces = [(jnp.asarray(self.first)[first], jnp.asarray(self.first_len)[first]),
                  (jnp.asarray(self.rest)[more], jnp.where(live, jnp.asarray(self.rest_len)[more], 0)),
                  (jnp.asarray(self.tail), len(self.tail))]
        return render.concat(pieces, self.max_tokens, self.chat.pad)


class SudokuTeacher(_Teacher):
    """Digits of the backtracking completion of the current grid, first empty cells first."""

    kind = "backtracking"
    keep_only_successful = False  # 20-30 actions per episode do not fill 32-40 cells: keep partial solutions

    def __call__(self, state, turn, key):
        n = self.env_params.grid_size
        solved, ok = self.env.solve(state, self.env_params)
        digits = jnp.where(ok, solved, state.solution).reshape(-1)
        empty = state.grid.reshape(-1) == 0
        k = self.actions_per_turn
        cells = jnp.nonzero(empty, size=k, fill_value=0)[0]
        acts = (cells * n + digits[cells] - 1).astype(jnp.int32)
        num = jnp.maximum(jnp.minimum(jnp.sum(empty), self.actions_left(state)), 1)
        return self.table.ids(acts, num)


class EnvPolicyTeacher(_Teacher):
    """The env's own policy (`env.teacher_action`), one action per turn: the teacher of any environment
    whose record names the kind "env_policy", so a new env brings its teacher in its own file. Every
    demonstration is kept (SFTTrainer(demo_filter="success") keeps only the successful ones)."""

    kind = "env_policy"
    keep_only_successful = False

    def __call__(self, state, turn, key):
        action = self.env.teacher_action(key, state, self.env_params)
        return self.table.ids(jnp.full((self.actions_per_turn,), action), 1)


class Game2048Teacher(EnvPolicyTeacher):
    """2048's depth-2 expectimax player, one move per turn (see the module docstring). All
    demonstrations are kept: success needs a 2048 tile at the game's end, which no short episode has."""

    kind = "expectimax"


TEACHERS = {cls.kind: cls for cls in (SokobanTeacher, FrozenLakeTeacher, BanditTeacher, CountdownTeacher,
                                      SudokuTeacher, Game2048Teacher, EnvPolicyTeacher)}


def get_teacher(env_name: str, text_env, **kw):
    """The teacher of a registered environment (its record's `teacher` kind and `teacher_thought`).
    kw: `thought` (replaces the record's), `max_actions`, and `high_prob` for a bandit_arm teacher
    (ignored by the others)."""
    spec = envs_jax.get_spec(env_name) if env_name in envs_jax.registered_envs() else None
    if spec is None or spec.teacher not in TEACHERS:
        with_teacher = [n for n in envs_jax.registered_envs() if envs_jax.get_spec(n).teacher in TEACHERS]
        raise ValueError(f"no solver teacher for environment {env_name!r}; environments with one: "
                         f"{', '.join(with_teacher)}")
    if not isinstance(text_env.env, spec.env_class):
        raise ValueError(f"the {env_name} teacher needs a {spec.env_class.__name__} TextEnv, "
                         f"got {type(text_env.env).__name__}")
    cls = TEACHERS[spec.teacher]
    if cls is not BanditTeacher:
        kw.pop("high_prob", None)
    if kw.get("thought") is None:
        kw["thought"] = spec.teacher_thought
    return cls(text_env, **kw)


__all__ = ["AnswerTable", "BanditTeacher", "CountdownTeacher", "EnvPolicyTeacher", "FrozenLakeTeacher", "Game2048Teacher",
           "SokobanTeacher",
           "SudokuTeacher",
           "TEACHERS", "get_teacher",
           "teacher_texts"]
