"""2048 on device (RAGEN-2's `game_2048`, ragen/env/game_2048).

Rules (the reference's):
- size x size board (4); reset spawns two tiles; every move that changes the board spawns one more
  on a uniformly random empty cell: a 2 with probability `two_prob` (0.9), else a 4.
- Actions, in index order: Up, Right, Down, Left. Each line is compressed toward the move's side,
  then equal neighbours merge once, nearest the side first (2 2 2 2 -> 4 4; 4 4 8 -> 8 8 when moving
  toward the 4s). The raw reward of a move is the sum of the tiles its merges made; `score` adds it up.
- A move that changes nothing is not effective: no spawn, the game goes on, raw reward
  `invalid_act_score` (-0.1).
- The game ends when a move leaves no move that changes the board; `success` = it ended with a tile
  >= `success_tile` (2048) on the board, as the reference reports it (reaching 2048 does not end it).
- Reward (`use_log_reward`, the reference's default): 0.1 * log2(raw + 1) for a positive raw reward.
  For a move that changes nothing the reference's log branch gives 0.0, although its instructions
  ("If a move is invalid (no tiles move), a small penalty is applied") and its `invalid_act_score`
  promise -0.1. `noop_rule="promised"` (the default) pays `invalid_act_score` for it in both reward
  modes; `noop_rule="reference"` reproduces the reference (0.0 in log mode, the raw -0.1 otherwise).
The board holds tile exponents (0 = empty, k = tile 2**k), so merges are +1 and states stay int32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces

from envs_jax.base import AgentEnv

ACTION_NAMES = ("Up", "Right", "Down", "Left")
UP, RIGHT, DOWN, LEFT = range(4)
NOOP_RULES = ("promised", "reference")
MAX_EXPONENT = 17  # 2**17 = 131072, the largest tile a 4x4 board can hold
SCORE_DIGITS = 10  # a non-negative int32 score
# Tile texts by exponent: what a board cell shows (render_grid indexes these).
SYMBOLS = tuple(str(2**k if k else 0) for k in range(MAX_EXPONENT + 1))
# The reference's config/envs.yaml env_instruction of game_2048 (a YAML literal block, final newline kept).
ENV_INSTRUCTION = (
    "You are playing the 2048 game on a 4x4 grid. Merge equal tiles by sliding Up, Right, Down, or Left.\n"
    "If a move is invalid (no tiles move), a small penalty is applied. Respond with a single action.\n"
    "Example: <answer>Up</answer>\n"
)


@struct.dataclass
class Game2048State:
    board: jax.Array  # int32[size, size] tile exponents, 0 = empty
    score: jax.Array  # int32 sum of all merged tiles so far (the reference's `score`)
    time: jax.Array  # int32
    done: jax.Array  # bool


@struct.dataclass
class Game2048Params:
    size: int = struct.field(pytree_node=False, default=4)
    # The reference's max_actions_per_traj for game_2048 (config/envs.yaml).
    max_steps_in_episode: int = struct.field(pytree_node=False, default=700)
    two_prob: float = 0.9
    use_log_reward: bool = struct.field(pytree_node=False, default=True)
    invalid_act_score: float = -0.1
    noop_rule: str = struct.field(pytree_node=False, default="promised")
    success_tile: int = 2048


# ---- pure rule functions ------------------------------------------------------------------------
def compact_left(line: jax.Array) -> jax.Array:
    """The line's non-zero entries moved toward index 0 in their order, zeros after them.

    A one-hot contraction over the n x n (source, target) pairs instead of a stable argsort: XLA:CPU
    runs a sort's comparator element by element, and a step slides 20 lines twice (the move and the
    four-move validity test), which made the sort most of 2048's step cost.
    """
    n = line.shape[0]
    nonzero = line != 0
    idx = jnp.arange(n)
    target = jnp.sum(nonzero[None, :] & (idx[None, :] < idx[:, None]), axis=1)  # non-zeros before each entry
    onehot = nonzero[:, None] & (target[:, None] == idx[None, :])
    return jnp.sum(jnp.where(onehot, line[:, None], 0), axis=0).astype(line.dtype)


def merge_line_left(line: jax.Array):
    """One line moved toward index 0 -> (new line, raw reward). Exponents, 0 = empty."""
    n = line.shape[0]
    compact = compact_left(line)
    out, reward, skip = [], jnp.int32(0), jnp.bool_(False)
    for j in range(n):
        nxt = compact[j + 1] if j + 1 < n else jnp.int32(0)
        merge = (~skip) & (compact[j] != 0) & (compact[j] == nxt)
        out.append(jnp.where(skip, 0, jnp.where(merge, compact[j] + 1, compact[j])))
        reward = reward + jnp.where(merge, jnp.left_shift(jnp.int32(1), compact[j] + 1), 0)
        skip = merge
    return compact_left(jnp.stack(out).astype(jnp.int32)), reward


def _oriented(board, action):
    """The board turned so that `action` moves every row toward column 0 (an involution per action)."""
    return jax.lax.switch(action, [lambda b: b.T, lambda b: b[:, ::-1], lambda b: b[::-1, :].T, lambda b: b], board)


def _restored(board, action):
    return jax.lax.switch(action, [lambda b: b.T, lambda b: b[:, ::-1], lambda b: b.T[::-1, :], lambda b: b], board)


def slide(board: jax.Array, action: jax.Array):
    """The board after a move, before the spawn -> (board, raw reward int32, moved bool)."""
    rows, rewards = jax.vmap(merge_line_left)(_oriented(board, action))
    new = _restored(rows, action)
    return new, jnp.sum(rewards), jnp.any(new != board)


def valid_moves(board: jax.Array) -> jax.Array:
    """bool[4]: which actions change the board (the reference's action mask).

    Without sliding: a line changes when moved toward index 0 exactly when some neighbour pair is
    (empty, tile) or two equal tiles (a line with neither is already packed and has nothing to merge).
    """
    views = (board.T, board[:, ::-1], board[::-1, :].T, board)  # each action's lines, moving toward index 0

    def changes(lines):
        a, b = lines[:, :-1], lines[:, 1:]
        return jnp.any(((a == 0) & (b != 0)) | ((a != 0) & (a == b)))

    return jnp.stack([changes(v) for v in views])


def spawn(key: jax.Array, board: jax.Array, two_prob) -> jax.Array:
    """One tile on a uniformly random empty cell (2 with probability two_prob, else 4); none if full."""
    k_cell, k_value = jax.random.split(key)
    flat = board.reshape(-1)
    empty = flat == 0
    cell = jax.random.categorical(k_cell, jnp.where(empty, 0.0, -jnp.inf))
    value = jnp.where(jax.random.uniform(k_value) < two_prob, 1, 2)
    return jnp.where(jnp.any(empty), flat.at[cell].set(value), flat).reshape(board.shape).astype(jnp.int32)


def move_reward(raw, moved, params: Game2048Params):
    """The reward of a move from its raw merge sum (see the module docstring for the no-op rule)."""
    raw_f = jnp.where(moved, raw.astype(jnp.float32), params.invalid_act_score)
    if not params.use_log_reward:
        return raw_f
    logged = jnp.where(raw_f > 0, 0.1 * jnp.log2(raw_f + 1.0), 0.0)
    if params.noop_rule == "reference":
        return logged
    return jnp.where(moved, logged, params.invalid_act_score)


def tiles(board) -> np.ndarray:
    """Host side: tile values (0 = empty) of an exponent board."""
    b = np.asarray(board)
    return np.where(b > 0, np.left_shift(1, b), 0)


_valid_moves_jit = jax.jit(valid_moves)


def observation_text(board, score, valid) -> str:
    """The reference's observation text (host side) of an exponent board, its score and its
    `valid_moves` mask."""
    values = tiles(board)
    lines = ["Current 2048 Grid:"]
    for i in range(values.shape[0]):
        lines.append(f"Row {i + 1}: [{', '.join(str(int(x)) for x in values[i])}]")
    valid = [a for a in range(4) if bool(valid[a])]
    actions = ", ".join(f"{a}({ACTION_NAMES[a]})" for a in valid) if valid else "None"
    lines += ["", f"Valid Actions: {actions}.", "Goal: Merge same numbers to reach 2048.",
              f"Current Score: {int(score)}", "What is your next move?"]
    return "\n".join(lines)


# ---- the teacher ---------------------------------------------------------------------------------
def _snake_weights(size: int) -> jax.Array:
    # A monotone "snake" toward the top-left corner: keeping big tiles ordered along it leaves room
    # to merge, the classic strong heuristic for 2048 players.
    order = np.arange(size * size).reshape(size, size)
    order[1::2] = order[1::2, ::-1]
    return jnp.asarray(4.0 ** (-order / 2.0), jnp.float32)


def board_value(board: jax.Array) -> jax.Array:
    """Heuristic value of a board: snake-weighted tile values plus a bonus per empty cell."""
    values = jnp.where(board > 0, jnp.exp2(board.astype(jnp.float32)), 0.0)
    snake = jnp.sum(values * _snake_weights(board.shape[0]))
    return snake + 0.25 * jnp.max(values) * jnp.mean(board == 0)


def expectimax_action(board: jax.Array, two_prob) -> jax.Array:
    """The move maximising the expected best next-move value over the spawn (depth-2 expectimax;
    jittable). Moves that change nothing are never chosen while another exists."""
    n2 = board.size

    def after(b, a):
        new, _, moved = slide(b, a)
        return new, moved

    def chance_value(b):  # expectation over the spawn, then the best reply by board_value
        flat = b.reshape(-1)
        empty = flat == 0
        def reply(cell, exp):
            nb = flat.at[cell].set(exp).reshape(b.shape)
            boards, moved = jax.vmap(lambda a: after(nb, a))(jnp.arange(4))
            vals = jnp.where(moved, jax.vmap(board_value)(boards), -1.0)
            return jnp.max(vals)
        cells = jnp.arange(n2)
        v2 = jax.vmap(lambda c: reply(c, 1))(cells)
        v4 = jax.vmap(lambda c: reply(c, 2))(cells)
        per_cell = two_prob * v2 + (1.0 - two_prob) * v4
        return jnp.sum(jnp.where(empty, per_cell, 0.0)) / jnp.maximum(jnp.sum(empty), 1)

    boards, moved = jax.vmap(lambda a: after(board, a))(jnp.arange(4))
    values = jax.vmap(chance_value)(boards)
    return jnp.argmax(jnp.where(moved, values, -jnp.inf)).astype(jnp.int32)


# ---- the environment -----------------------------------------------------------------------------
class Game2048(AgentEnv):
    """The 2048 game; `success` = the game ended with a `success_tile` on the board."""

    @property
    def default_params(self) -> Game2048Params:
        return Game2048Params()

    @property
    def num_actions(self) -> int:
        return 4

    def action_space(self, params=None):
        return spaces.Discrete(4)

    def observation_space(self, params=None):
        n = (params or self.default_params).size
        return spaces.Box(0, MAX_EXPONENT, (n, n), jnp.int32)

    def validate_params(self, params: Game2048Params) -> None:
        """Raise ValueError for parameters the env cannot honour."""
        if not isinstance(params.size, int) or not 2 <= params.size <= 8:
            raise ValueError(f"size must be an int in [2, 8], got {params.size!r}")
        if not 0.0 <= float(params.two_prob) <= 1.0:
            raise ValueError(f"two_prob must be in [0, 1], got {params.two_prob!r}")
        if not isinstance(params.max_steps_in_episode, int) or params.max_steps_in_episode < 1:
            raise ValueError(f"max_steps_in_episode must be an int >= 1, got {params.max_steps_in_episode!r}")
        if params.noop_rule not in NOOP_RULES:
            raise ValueError(f"noop_rule must be one of {', '.join(NOOP_RULES)}, got {params.noop_rule!r}")
        if not isinstance(params.use_log_reward, bool):
            raise ValueError(f"use_log_reward must be True or False, got {params.use_log_reward!r}")
        tile = int(params.success_tile)
        if tile < 4 or tile & (tile - 1):
            raise ValueError(f"success_tile must be a power of two >= 4, got {params.success_tile!r}")

    def reset_env(self, key, params):
        k1, k2 = jax.random.split(key)
        board = jnp.zeros((params.size, params.size), jnp.int32)
        board = spawn(k2, spawn(k1, board, params.two_prob), params.two_prob)
        state = Game2048State(board=board, score=jnp.int32(0), time=jnp.int32(0), done=jnp.bool_(False))
        return self.get_obs(state, params), state

    def transition(self, key, state, action, params):
        moved_board, raw, moved = slide(state.board, action)
        board = jnp.where(moved, spawn(key, moved_board, params.two_prob), state.board)
        new = state.replace(board=board, score=state.score + jnp.where(moved, raw, 0))
        terminated = moved & ~jnp.any(valid_moves(board))
        return new, move_reward(raw, moved, params), terminated, {"action_is_effective": moved}

    def is_success(self, state, params):
        big = jnp.max(state.board) >= jnp.log2(jnp.float32(params.success_tile)).astype(jnp.int32)
        return big & ~jnp.any(valid_moves(state.board))

    def action_names(self, params) -> tuple[str, ...]:
        return ACTION_NAMES

    def instructions(self, params) -> str:
        return ENV_INSTRUCTION

    def symbols(self, params) -> tuple[str, ...]:
        return SYMBOLS

    def render_grid(self, state, params):
        return state.board

    # The text layer assembles the observation from slots: each cell ("Row i: [v", ", v", the row's
    # last one with "]\n", the board's with "]\n\n", a single pre-token), the valid-action line with
    # the goal line and "Current Score:" (16 alternatives), the score's digits (Qwen's pre-tokenizer
    # cuts every digit on its own; the first carries the space) and the closing question.
    def observation_format(self, params) -> str:
        return "slots"

    def text_slots(self, params) -> tuple[tuple[str, ...], ...]:
        """Alternatives per slot of `observation_text` + "\n" (the final newline included)."""
        n, cells = params.size, []
        for r in range(n):
            for c in range(n):
                head = f"Row {r + 1}: [" if c == 0 else ", "
                tail = "" if c < n - 1 else ("]\n\n" if r == n - 1 else "]\n")
                cells.append(tuple(head + v + tail for v in SYMBOLS))
        valid = tuple("Valid Actions: " + (", ".join(f"{a}({ACTION_NAMES[a]})" for a in range(4) if m >> a & 1)
                                           or "None") + ".\nGoal: Merge same numbers to reach 2048.\nCurrent Score:"
                      for m in range(16))
        # The space before the score goes with its first digit: " X" would merge into one pre-token.
        digits = [("",) + tuple(str(d) for d in range(10)) + tuple(f" {d}" for d in range(10))] * SCORE_DIGITS
        return (("Current 2048 Grid:\n",), *cells, valid, *digits, ("\nWhat is your next move?\n",))

    def text_slot_index(self, state, params) -> jax.Array:
        """int32 [1 + size^2 + 1 + SCORE_DIGITS + 1]: each slot's alternative for `state` (jittable)."""
        cells = jnp.clip(state.board.reshape(-1), 0, MAX_EXPONENT)
        valid = jnp.sum(valid_moves(state.board).astype(jnp.int32) * (1 << jnp.arange(4)))
        score = jnp.maximum(state.score, 0)
        power = jnp.asarray([10 ** (SCORE_DIGITS - 1 - k) for k in range(SCORE_DIGITS)], jnp.int32)
        shown = (score >= power) | (power == 1)
        lead = shown & (jnp.cumsum(shown) == 1)
        digits = jnp.where(shown, score // power % 10 + 1 + jnp.where(lead, 10, 0), 0)
        zero = jnp.zeros((1,), jnp.int32)
        return jnp.concatenate([zero, cells, valid[None], digits, zero]).astype(jnp.int32)

    def render_text(self, state, params) -> str:
        return observation_text(jax.device_get(state.board), jax.device_get(state.score),
                                np.asarray(_valid_moves_jit(jnp.asarray(state.board))))

    def teacher_action(self, key, state, params):
        """The expectimax player's move (jittable); `key` is unused (the player is deterministic)."""
        return expectimax_action(state.board, params.two_prob)
