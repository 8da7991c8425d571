"""The conversation an agent sees: prompt texts, the chat format and the reward format.

Every string here follows the reference RAGEN (`ragen/llm_agent/ctx_manager.py` and
`config/envs.yaml`), so a policy trained by the reference sees the same prompt here:

    <|im_start|>system\\nYou're a helpful assistant. <|im_end|>\\n
    <|im_start|>user\\n{env instructions}{action list}\\nTurn 1:\\nState:\\n{grid}\\n
    You have {k} actions left. Always output: {format} with no extra text. Strictly follow this
    format. Max response length: {words} words (tokens).\\n<|im_end|>\\n
    <|im_start|>assistant\\n<think>{sampled}<|im_end|>\\n
    <|im_start|>user\\nReward:\\n{r}\\n\\nTurn 2:\\nState:\\n ...

(the reference appends "\\nTurn {i}:\\n" to the LAST user message, which is the first user message
for turn 1 and the "Reward:" message afterwards; the system prompt's trailing space is the
reference's.) One deliberate difference: rewards are printed from a 0.01 grid without float noise
(the reference prints `-0.30000000000000004`). `format_reward` is the single definition used on
the host and, through tables built from it, on the device.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

IM_START_TEXT = "<|im_start|>"
IM_END_TEXT = "<|im_end|>"

SYSTEM_PROMPT = "You're a helpful assistant. "
ACTION_SEP = "||"
FORMAT_THINK = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
FORMAT_NO_THINK = "<answer> [your answer] </answer>"
FORCED_THINK = "<think>"
FORCED_ANSWER = "<answer>"
MAX_REWARD_SPAN = 2000.0


# RAGEN-2 agent_proxy.context_window_mode values this project implements.
CONTEXT_WINDOW_MODES = ("full", "single_turn")


@dataclasses.dataclass
class PromptConfig:
    """What the conversation looks like. Validated on construction (ValueError naming the field).

    think: forced `<think>` after the generation prompt and the think+answer format reminder;
        False forces `<answer>` and drops think from the reminder (the reference's no-think RL).
    max_turns, max_actions_per_turn: the reference's agent_proxy.max_turn / max_actions_per_turn.
    max_actions_per_episode: the "You can make up to N actions" rule and the largest
        "You have k actions left"; None takes the env's `params.max_steps_in_episode` (10).
    max_response_words: the "Max response length: N words (tokens)." hint (envs.yaml max_tokens).
    max_response_tokens: the per-turn generation budget; also the parser's byte-scan budget.
    list_actions: whether the first user message lists the actions and the action-count rule;
        None = automatic: yes for grid envs, no for envs whose state is one whole text (Bandit:
        the reference shows no action list there, the state text itself names both arms, and a
        fixed list would leak the arm order that the env randomises).
    reward_min, reward_max: the range of turn rewards that can be printed exactly; a reward
        outside is clipped to it (see `TextEnv.reward_in_range`).
    context_window_mode, max_context_window: RAGEN-2's agent_proxy settings of what the model sees
        of earlier turns. "full" (reference default): the whole conversation. "single_turn" with
        max_context_window=1: every turn is its own sample, the prompt prefix + `(Turn k):` and the
        current state only, with no earlier turn ("like without_history"); the rollout restarts its
        KV cache after the prefix every turn and the trainer scores each turn in that context.
        RAGEN-2's "limited_multi_turn" and windows k > 1 are not implemented.
    """

    think: bool = True
    max_turns: int = 5
    max_actions_per_turn: int = 5
    max_actions_per_episode: Optional[int] = None
    max_response_words: int = 100
    max_response_tokens: int = 400
    system_prompt: str = SYSTEM_PROMPT
    list_actions: Optional[bool] = None
    reward_min: float = -100.0
    reward_max: float = 100.0
    context_window_mode: str = "full"
    max_context_window: int = -1

    # The `prompt` section of the experiment config is this class (one definition of every prompt knob).
    # Mutable like the other config sections; TextEnv keeps its own copy, so a later change to the
    # config never reaches a built TextEnv.
    def __post_init__(self):
        self.validate()

    def validate(self):
        def positive_int(name, upper=None):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"PromptConfig.{name} must be a positive integer, got {v!r}")
            if upper is not None and v > upper:
                raise ValueError(f"PromptConfig.{name} must be at most {upper}, got {v!r}")

        if not isinstance(self.think, bool):
            raise ValueError(f"PromptConfig.think must be True or False, got {self.think!r}")
        positive_int("max_turns", 1000)
        positive_int("max_actions_per_turn", 1000)
        if self.max_actions_per_episode is not None:
            positive_int("max_actions_per_episode", 100_000)
        positive_int("max_response_words")
        positive_int("max_response_tokens")
        if not isinstance(self.system_prompt, str):
            raise ValueError(f"PromptConfig.system_prompt must be a string, got {self.system_prompt!r}")
        for special in (IM_START_TEXT, IM_END_TEXT, "<|endoftext|>"):
            if special in self.system_prompt:
                raise ValueError(f"PromptConfig.system_prompt must not contain the chat token {special}")
        if self.list_actions is not None and not isinstance(self.list_actions, bool):
            raise ValueError(f"PromptConfig.list_actions must be True, False or None, got {self.list_actions!r}")
        for name in ("reward_min", "reward_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not np.isfinite(v):
                raise ValueError(f"PromptConfig.{name} must be a finite number, got {v!r}")
            if abs(v) > 1e5:
                raise ValueError(f"PromptConfig.{name} must lie within [-1e5, 1e5], got {v!r}")
        if self.context_window_mode not in CONTEXT_WINDOW_MODES:
            raise ValueError(f"PromptConfig.context_window_mode must be one of {CONTEXT_WINDOW_MODES}, got "
                             f"{self.context_window_mode!r} (RAGEN-2's 'limited_multi_turn' is not implemented)")
        k = self.max_context_window
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise ValueError(f"PromptConfig.max_context_window must be an integer, got {k!r}")
        if self.context_window_mode == "single_turn" and k != 1:
            raise ValueError(f"PromptConfig.max_context_window must be 1 with context_window_mode='single_turn' "
                             f"(no earlier turns shown; windows k > 1 are not implemented), got {k}")
        if not self.reward_min < self.reward_max:
            raise ValueError(
                f"PromptConfig.reward_min ({self.reward_min}) must be below reward_max ({self.reward_max})")
        if self.reward_max - self.reward_min > MAX_REWARD_SPAN:
            # One table entry per printable cent: the span bounds the table (2000 -> 200,001 rows).
            raise ValueError(f"PromptConfig.reward_max - reward_min must be at most {MAX_REWARD_SPAN}, "
                             f"got {self.reward_max - self.reward_min}")

    @property
    def single_turn(self) -> bool:
        """Each turn sees only the prompt prefix and its own state (RAGEN-2 single_turn, window 1)."""
        return self.context_window_mode == "single_turn"

    @property
    def format_prompt(self) -> str:
        return FORMAT_THINK if self.think else FORMAT_NO_THINK

    @property
    def forced_prefix(self) -> str:
        """Text forced right after the generation prompt; the model continues from it."""
        return FORCED_THINK if self.think else FORCED_ANSWER

    @property
    def cents_range(self) -> tuple[int, int]:
        """The printable reward range in integer hundredths (inclusive)."""
        return int(np.ceil(self.reward_min * 100 - 1e-6)), int(np.floor(self.reward_max * 100 + 1e-6))


# ---- rewards ---------------------------------------------------------------------------------------
def reward_cents(reward) -> np.ndarray:
    """Reward -> integer hundredths, computed in float32 exactly as the device does it.

    The device receives float32 rewards; rounding `float32(r) * 100` half-to-even (numpy and XLA
    agree: IEEE float32 multiply, then round-half-even) makes host and device pick the same cent.
    """
    r = np.asarray(reward, dtype=np.float32)
    return np.round(r * np.float32(100.0)).astype(np.int64)


def format_cents(cents: int) -> str:
    """Hundredths -> the printed reward: at most 2 decimals, trailing zeros and '-0' dropped.

    -10 -> "-0.1", 1090 -> "10.9", 0 -> "0", 100 -> "1", -5 -> "-0.05".
    """
    cents = int(cents)
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    if frac == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{frac:02d}".rstrip("0")


def format_reward(reward, cfg: Optional[PromptConfig] = None) -> str:
    """The printed form of a turn reward (clipped to the config's range when a config is given)."""
    cents = int(reward_cents(reward))
    if cfg is not None:
        lo, hi = cfg.cents_range
        cents = min(max(cents, lo), hi)
    return format_cents(cents)


# ---- texts ----------------------------------------------------------------------------------------
def action_list_text(action_names: Sequence[str], max_actions_per_episode: int) -> str:
    """The reference's action block of the first user message."""
    return ("\nYour available actions are:\n" + ", ".join(action_names)
            + f"\nYou can make up to {max_actions_per_episode} actions, separated by the action "
              f"separator \" {ACTION_SEP} \"\n")


def first_user_message_head(instructions: str, action_names: Sequence[str],
                            max_actions_per_episode: int, list_actions: bool) -> str:
    """The first user message before its first "\\nTurn 1:\\n" (instructions + action block)."""
    head = instructions
    if list_actions:
        head += action_list_text(action_names, max_actions_per_episode)
    return head


def turn_header(turn: int) -> str:
    return f"\nTurn {turn}:\n"


def state_block(state_text: str, actions_left: int, cfg: PromptConfig) -> str:
    """The per-turn state block with the format reminder (reference wording, incl. '1 actions')."""
    return (f"State:\n{state_text}\nYou have {actions_left} actions left. Always output: "
            f"{cfg.format_prompt} with no extra text. Strictly follow this format. "
            f"Max response length: {cfg.max_response_words} words (tokens).\n")


def reward_message(reward_text: str) -> str:
    return f"Reward:\n{reward_text}\n"


def chat_message(role: str, content: str) -> str:
    """One message in Qwen's chat format (what Qwen2.5's chat template writes)."""
    return f"{IM_START_TEXT}{role}\n{content}{IM_END_TEXT}\n"


GENERATION_PROMPT = f"{IM_START_TEXT}assistant\n"


def messages_for_history(head: str, history: Sequence[dict], cfg: PromptConfig) -> list[dict]:
    """The reference's message list (ctx_manager.get_lm_inputs) for a history of turns.

    `history[i]` has `state` (text) and `actions_left`, and for finished turns `response`
    (the assistant text after the generation prompt, forced prefix included) and `reward`.
    Host-side only; used to state the conversation in tests and examples.
    """
    messages = [{"role": "system", "content": cfg.system_prompt}, {"role": "user", "content": head}]
    for i, turn in enumerate(history):
        messages[-1]["content"] += turn_header(i + 1)
        if "state" in turn:
            messages[-1]["content"] += state_block(turn["state"], int(turn["actions_left"]), cfg)
        if "response" in turn:
            messages.append({"role": "assistant", "content": turn["response"]})
        if "reward" in turn:
            messages.append({"role": "user", "content": reward_message(format_reward(turn["reward"], cfg))})
    return messages


def chat_text(messages: Sequence[dict], add_generation_prompt: bool) -> str:
    """Qwen2.5 chat template output for plain system/user/assistant messages."""
    text = "".join(chat_message(m["role"], m["content"]) for m in messages)
    return text + (GENERATION_PROMPT if add_generation_prompt else "")


# ---- the pieces of the token stream (see text_env.py for the segment structure) --------------------
# They are cut at seams where Qwen's pre-tokenizer never merges across (before "Turn", before a grid
# row, before "You have", around special tokens), so each piece tokenizes on its own.
def prefix_text(head: str, cfg: PromptConfig) -> str:
    """System message + first user message up to where "Turn 1:" begins (its leading newline included)."""
    return chat_message("system", cfg.system_prompt) + f"{IM_START_TEXT}user\n" + head + "\n"


def turn_piece_text(turn: int, single_turn: bool = False) -> str:
    """"Turn k:" (full history) or RAGEN-2's single-turn "(Turn k):" label, and the "State:" line."""
    return f"(Turn {turn}):\nState:\n" if single_turn else f"Turn {turn}:\nState:\n"


def tail_piece_text(actions_left: int, cfg: PromptConfig) -> str:
    """From "You have" to the forced prefix of the assistant turn."""
    block = state_block("", actions_left, cfg)[len("State:\n\n"):]
    return block + IM_END_TEXT + "\n" + GENERATION_PROMPT + cfg.forced_prefix


# The newline after the previous assistant's <|im_end|> and the opening of the next user message.
USER_OPEN_TEXT = f"\n{IM_START_TEXT}user\n"


def reward_entry_text(reward_text: str) -> str:
    """The reward message up to "Turn" (the newline of "\nTurn {i}:" included)."""
    return reward_message(reward_text) + "\n"


def reward_piece_text(reward_text: str) -> str:
    return USER_OPEN_TEXT + reward_entry_text(reward_text)
