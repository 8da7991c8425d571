"""The reference's conversation text and answer parse in plain Python (RAGEN's ctx_manager wording),
and the host-side agent step the benchmarks time against the compiled one:

    env step (Python) -> state text -> conversation segment text -> tokenizer.encode(segment)
    answer ids -> tokenizer.decode -> `re` parse -> action
"""

from __future__ import annotations

import random
import re
from typing import Sequence

import numpy as np

THINK_FORMAT = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
ANSWER_RE = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)


def reward_text(reward: float) -> str:
    """A turn reward printed from a 0.01 grid (float32 cents, half-to-even, like the device)."""
    cents = int(np.round(np.float32(reward) * np.float32(100.0)))
    cents = min(max(cents, -10000), 10000)
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{whole}" if frac == 0 else f"{sign}{whole}.{frac:02d}".rstrip("0")


def segment_text(state_text: str, turn: int, actions_left: int, prev_reward: float, prev_closed: bool = True,
                 max_words: int = 100) -> str:
    """The text appended before assistant turn `turn` (think mode), as the host would build it."""
    head = ""
    if turn > 1:
        head = ("" if prev_closed else "<|im_end|>") + f"\n<|im_start|>user\nReward:\n{reward_text(prev_reward)}\n\n"
    return (f"{head}Turn {turn}:\nState:\n{state_text}\nYou have {actions_left} actions left. "
            f"Always output: {THINK_FORMAT} with no extra text. Strictly follow this format. "
            f"Max response length: {max_words} words (tokens).\n<|im_end|>\n<|im_start|>assistant\n<think>")


def answer_pieces(text: str, max_actions: int = 5) -> list[str]:
    """The reference's answer pieces: regex, split on '||', stripped, the empty ones dropped."""
    m = ANSWER_RE.search(text)
    if m is None:
        return []
    return [p.strip() for p in m.group(2).split("||") if p.strip()][:max_actions]


def parse_answer(text: str, action_names: Sequence[str], max_actions: int = 5) -> list[int]:
    """The reference's answer parse: the pieces looked up by name, case-insensitively."""
    lookup = {n.lower(): i for i, n in enumerate(action_names)}
    return [lookup[p.lower()] for p in answer_pieces(text, max_actions) if p.lower() in lookup]


def host_steps(env, states: list, answers: Sequence[Sequence[int]], tokenizer, num_steps: int,
               rng: random.Random, max_turns: int = 5) -> int:
    """Run `num_steps` env steps round-robin over `states` (updated in place); returns a checksum.

    One step: decode a randomly chosen answer's ids, regex-parse it, execute its first action (or
    score its first piece, for an env with `step_text`),
    restore the episode's initial state when it ended (so every step is a live one, as on the
    JAX side), render the next segment text and tokenize it.
    """
    inits = [s.copy() for s in states]
    names, max_steps = env.action_names, env.max_steps
    # An env that reads free text (Countdown) is stepped with the first answer piece, as the reference
    # passes its pieces to an env without an action lookup.
    takes_text = env.answer_format == "text"
    checksum = 0
    b = len(states)
    for i in range(num_steps):
        j = i % b
        s = states[j]
        text = tokenizer.decode(answers[rng.randrange(len(answers))])
        if takes_text:
            pieces = answer_pieces(text)
            s, reward, done, _ = env.step_text(s, pieces[0] if pieces else "", rng)
        else:
            actions = parse_answer(text, names)
            s, reward, done, _ = env.step(s, actions[0] if actions else 0, rng)
        if done:
            s = inits[j].copy()
        states[j] = s
        turn = min(s.time + 1, max_turns)
        seg = segment_text(env.render(s), turn, max_steps - s.time, reward)
        checksum += len(tokenizer.encode(seg, add_special_tokens=False))
    return checksum
