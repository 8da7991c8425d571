"""`TextEnv`: an environment as the agent's conversation, as token ids, inside jit.

Token stream of one episode (the contract with the compiled rollout)::

    prefix_ids                                   host-built, once per env
    render_ids(state_0, turn=1, ...)             segment of turn 1
    forced prefix + sampled ids of turn 1        (the forced prefix is the END of the segment)
    render_ids(state_1, turn=2, ...)             segment of turn 2
    forced prefix + sampled ids of turn 2
    ...

* `prefix_ids`: `<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{instructions}
  {action list}\\n` - everything up to where "Turn 1:" begins.
* `render_ids(state, turn, actions_left, prev_reward, prev_closed) -> (ids int32 [max_segment_len],
  length)`, jittable and vmappable, `turn` 1-based. The segment to append before the assistant
  generates turn `turn`:
    turn 1: `Turn 1:\\nState:\\n{grid}\\nYou have {k} actions left. Always output: ... (tokens).\\n
            <|im_end|>\\n<|im_start|>assistant\\n<think>`
    The state text is the grid, or with RAGEN-2's coordinate observations (`env.observation_format`
    "grid_coord" / "coord") a coordinate block before / instead of it (render.CoordTable), then
    the env's extra lines if it has any (`env.extra_lines`, e.g. FrozenLake's surroundings).
    turn>1: `<|im_end|>` (only when prev_closed is False, i.e. the model did not sample it itself)
            `\\n<|im_start|>user\\nReward:\\n{prev_reward}\\n\\n` + the turn-1 form with "Turn {turn}"
  In no-think mode the segment ends in `<answer>` instead of `<think>`. prev_reward is the summed
  env reward of the previous turn, printed by `conversation.format_reward` (0.01 grid, clipped to
  the config's range). turn and actions_left are clipped into [1, max_turns] and
  [0, max_actions_per_episode] in-graph.
* `forced_prefix_ids`: ids of the forced `<think>` / `<answer>` (the last ids of every segment);
  `parse(forced_prefix_ids + sampled ids, length)` reads the assistant's answer.
* `render_text(...)`: the host text of the same segment. Invariant (tested over thousands of random
  states per env): `tokenizer.encode(render_text(...), add_special_tokens=False) ==
  render_ids(...)[0][:length]`, and `prefix_text + render_text(turn 1)` is what Qwen's chat template
  gives for the system + first user message with the generation prompt, plus the forced prefix.

This is the reference's conversation (ragen/llm_agent/ctx_manager.py): the assistant's sampled ids
are kept as sampled (the reference re-renders them; we never re-tokenize).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.text import conversation as conv
from ragen_jax.text import render
from ragen_jax.text.tokenizer import chat_ids
from ragen_jax.text.expression import ExpressionParser
from ragen_jax.text.parse import Parser
from ragen_jax.text.placement import PlacementParser

# Host tables per tokenizer object (weak: a dropped tokenizer drops its tables). Keys inside are
# the texts' defining values, so two TextEnvs of the same env/config share tables; 8x8 Sokoban's
# 117k-row table is built once per process.
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# What `AgentEnv.answer_format` may say: the answer grammars this layer has a parser for (make_parser).
ANSWER_FORMATS = ("names", "expression", "placement")


def _cached(tokenizer, key, build):
    per_tok = _CACHE.setdefault(tokenizer, {})
    if key not in per_tok:
        per_tok[key] = build()
    return per_tok[key]


def reward_cents_jax(reward) -> jax.Array:
    """In-graph twin of `conversation.reward_cents`: float32 reward -> int32 hundredths."""
    return jnp.round(jnp.asarray(reward, jnp.float32) * jnp.float32(100.0)).astype(jnp.int32)


def _grid_shape(env, params) -> tuple[int, int]:
    try:  # observations are the grid (AgentEnv.get_obs), so the space has its shape
        shape = tuple(env.observation_space(params).shape)
    except (AttributeError, NotImplementedError, TypeError):
        def grid_of_reset(key):
            return env.render_grid(env.reset_env(key, params)[1], params)

        shape = jax.eval_shape(grid_of_reset, jax.random.PRNGKey(0)).shape
    if len(shape) != 2:
        raise ValueError(f"env.render_grid must return a 2-D [H, W] grid, got shape {shape}")
    return int(shape[0]), int(shape[1])


def default_cell_symbols(env, params, height: int, width: int, num_symbols: int):
    """What each grid cell can show: the env's own `cell_symbol_sets(params)` (Sokoban: a wall border,
    since its rooms always have one), or every symbol everywhere when it declares none."""
    sets = env.cell_symbol_sets(params)
    if sets is not None:
        return sets
    every = tuple(range(num_symbols))
    return [[every] * width for _ in range(height)]


def _check_text_declarations(env, symbols) -> None:
    """One sentence for an env whose answers or grid symbols this layer cannot handle."""
    if env.answer_format not in ANSWER_FORMATS:
        raise ValueError(f"{type(env).__name__}.answer_format is {env.answer_format!r}; the text layer reads "
                         f"{', '.join(ANSWER_FORMATS)} (a new answer grammar needs its parser in ragen_jax/text/)")
    for s in symbols:
        # The row seams need rows that start with a visible character (see render.py).
        if not s or s[0].isspace() or "<|" in s:
            raise ValueError(f"grid symbol {s!r} cannot be rendered row by row: symbols must be "
                             "non-empty, not start with whitespace and hold no chat tokens")


class TextEnv:
    """An AgentEnv seen as text: fixed prompt pieces as ids, per-turn segments rendered in-graph.

    Args:
      env, env_params: an `envs_jax` environment and its params.
      tokenizer: the Qwen2.5 tokenizer (`ragen_jax.text.tokenizer.load_tokenizer()`).
      config: `PromptConfig`.
      cell_symbols: optional [H][W] sequences of the symbol indices each grid cell can hold; keeps
        row tables small (a Sokoban border is always wall). Default: the env's
        `cell_symbol_sets(params)` when it has one, else every symbol everywhere.
    """

    is_mix = False  # MixedTextEnv: several envs by row (the rollout then cannot split a batch into passes)

    def __init__(self, env, env_params, tokenizer, config: Optional[conv.PromptConfig] = None,
                 cell_symbols=None):
        config = conv.PromptConfig() if config is None else config
        if not isinstance(config, conv.PromptConfig):
            raise ValueError(f"config must be a PromptConfig, got {type(config).__name__}")
        self.env, self.env_params, self.tokenizer = env, env_params, tokenizer
        # Pad (fills segments past `length`), <|im_end|> and the stop ids come from the tokenizer.
        self.ids = chat_ids(tokenizer)
        self.pad_id = pad_id = self.ids.pad
        self.config = dataclasses.replace(config)  # a copy: later edits of a config never reach the tables
        self.action_names: tuple[str, ...] = tuple(env.action_names(env_params))
        self.max_actions_per_turn = config.max_actions_per_turn
        self.max_turns = config.max_turns
        if config.max_actions_per_episode is not None:
            self.max_actions_per_episode = config.max_actions_per_episode
        else:
            self.max_actions_per_episode = int(env_params.max_steps_in_episode)
        self.symbols: tuple[str, ...] = tuple(env.symbols(env_params))
        # RAGEN-2's coordinate observations, or a state text assembled from slots (Countdown's line).
        self.observation_format = env.observation_format(env_params)
        _check_text_declarations(env, self.symbols)
        self.grid_shape = _grid_shape(env, env_params) if self.observation_format != "slots" else (0, 0)
        h, w = self.grid_shape
        if cell_symbols is None:
            cell_symbols = default_cell_symbols(env, env_params, h, w, len(self.symbols))
        self.cell_symbols = render.check_cell_sets(cell_symbols, h, w, len(self.symbols))

        # The reference lists the actions of every env whose config has an action_lookup: the grid envs
        # and the slot-assembled ones with names (the cube, 2048), not the Bandit, Countdown or Sudoku.
        env_lists = env.lists_actions(env_params)
        list_actions = (config.list_actions if config.list_actions is not None else env_lists if env_lists is not None
                        else (h * w > 1 or (self.observation_format == "slots" and bool(self.action_names))))
        self.head_text = conv.first_user_message_head(
            env.instructions(env_params), self.action_names, self.max_actions_per_episode, list_actions)
        self.prefix_text = conv.prefix_text(self.head_text, config)

        tok = tokenizer
        enc = lambda text: np.asarray(render.encode_pieces(tok, [text])[0], dtype=np.int32)  # noqa: E731
        self.prefix_ids = enc(self.prefix_text)
        self.forced_prefix_ids = enc(config.forced_prefix)
        self._show_grid = self.observation_format in ("grid", "grid_coord")
        self._slots = self._slot_tables() if self.observation_format == "slots" else []
        self._slot_stack = render.stack_tables(self._slots, pad_id) if self._slots else None
        # "coord" shows no grid: no row tables (they could not even be built for large boards).
        self._grid = _cached(tok, ("grid", self.symbols, self.cell_symbols),
                             lambda: render.build_grid_table(tok, self.symbols, self.cell_symbols, pad_id)
                             ) if self._show_grid else None
        self._coords = None
        if self.observation_format in ("grid_coord", "coord"):
            labels = tuple(env.coordinate_labels(env_params))
            budget = tuple(int(x) for x in env.coordinate_budget(env_params))
            self._coords = _cached(tok, ("coords", self.observation_format, labels, h, w, budget),
                                   lambda: render.build_coord_table(tok, self.observation_format, labels, h, w,
                                                                    *budget, pad_id))
        # Lines an env may show after the state (not the reference's; envs_jax/base.py extra_lines):
        # every alternative is a whole newline-terminated line, looked up like a grid row.
        self._extra = [_cached(tok, ("extra", alts), lambda alts=alts: render.PieceTable(
            *render.encode_rows(tok, [a + "\n" for a in alts], pad_id)))
            for alts in env.extra_lines(env_params)]
        self.single_turn = config.single_turn
        self._turns = render.PieceTable.build(
            tok, [conv.turn_piece_text(t, self.single_turn) for t in range(1, config.max_turns + 1)], pad_id)
        self._tails = render.PieceTable.build(
            tok, [conv.tail_piece_text(k, config) for k in range(self.max_actions_per_episode + 1)], pad_id)
        self._cents_lo, self._cents_hi = config.cents_range
        self._user_open_ids = enc(conv.USER_OPEN_TEXT)
        self._rewards = _cached(tok, ("reward", self._cents_lo, self._cents_hi), lambda: render.PieceTable(
            *render.encode_rows(tok, [conv.reward_entry_text(conv.format_cents(c))
                                      for c in range(self._cents_lo, self._cents_hi + 1)], pad_id)))
        state_len = ((self._grid.max_len if self._grid else 0) + (self._coords.max_len if self._coords else 0)
                     + sum(int(t.lengths.max()) for t in self._extra + self._slots))
        self.max_segment_len = (1 + len(self._user_open_ids) + self._rewards.width + self._turns.width
                                + state_len + self._tails.width)
        self._parser = None
        self._check_seams()

    def _slot_tables(self) -> list:
        """One PieceTable per slot of a slot-assembled state text (`env.text_slots`: alternatives per
        slot, the state text being one alternative of each, in order, its final newline included)."""
        tok, slots = self.tokenizer, tuple(tuple(alts) for alts in self.env.text_slots(self.env_params))
        return [_cached(tok, ("slot", alts), lambda alts=alts: render.PieceTable.build(tok, alts, self.pad_id))
                for alts in slots]

    def _slot_texts(self, samples: int) -> list[list[str]]:
        """The seam check's examples: slot texts of start states (even rows) and of random alternatives (odd)."""
        alts = self.env.text_slots(self.env_params)
        # One compiled program: op by op, the vmapped reset and slot index compiled each of their ~200
        # ops (a SimpleSudoku TextEnv took 9.6 CPU s to build, 8.6 of them here).
        index = np.array(jax.jit(lambda seeds: jax.vmap(lambda st: self.env.text_slot_index(st, self.env_params))(
            self.reset_rows(seeds)))(jnp.arange(samples)))
        # Every other example takes a random alternative in each slot: the tables render any combination,
        # and start states alone miss the seams of later ones (a Sudoku's feedback and filled cells).
        rng = np.random.default_rng(1)
        index[1::2] = [[rng.integers(len(a)) for a in alts] for _ in range(len(index[1::2]))]
        return [[alts[j][int(i)] for j, i in enumerate(row)] for row in index]

    def _check_seams(self, samples: int = 8) -> None:
        """Fail at build time, naming the piece, when this tokenizer would merge text across a piece seam.

        Host-only: random segments (random rows from each line's symbol sets, random extra lines,
        rewards, turns and action counts) are encoded whole and compared with their pieces' ids, which
        are exactly what the tables hold. Coordinate blocks are covered by the tests, not here.
        """
        rng = np.random.default_rng(0)
        h, w = self.grid_shape
        slot_texts = self._slot_texts(samples) if self._slots else None
        for k in range(samples):
            later = k % 2 == 1 and not self.single_turn
            turn = int(rng.integers(2, self.max_turns + 1)) if later and self.max_turns > 1 else 1
            pieces = [("the reward message", conv.reward_piece_text(conv.format_cents(
                int(rng.integers(self._cents_lo, self._cents_hi + 1)))))] if later else [("the prompt prefix",
                                                                                        self.prefix_text)]
            pieces.append(("the turn line", conv.turn_piece_text(turn, self.single_turn)))
            if self._grid is not None:
                pieces += [(f"grid row {r}", "".join(self.symbols[int(rng.choice(self.cell_symbols[r][c]))]
                                                      for c in range(w)) + "\n") for r in range(h)]
            if slot_texts is not None:
                pieces += [(f"state slot {j}", t) for j, t in enumerate(slot_texts[k])]
            for i, alts in enumerate(self.env.extra_lines(self.env_params) if self._extra else ()):
                pieces.append((f"extra line {i}", alts[int(rng.integers(len(alts)))] + "\n"))
            pieces.append(("the action-count tail", conv.tail_piece_text(
                int(rng.integers(0, self.max_actions_per_episode + 1)), self.config)))
            if self._coords is not None:
                pieces = pieces[:1] + pieces[-1:]  # coordinate segments: only the fixed seams
            parts = render.encode_pieces(self.tokenizer, [t for _, t in pieces])
            whole = render.encode_batch(self.tokenizer, ["".join(t for _, t in pieces)])[0]
            if sum(parts, []) != whole:
                ends = np.cumsum([len(p) for p in parts])
                first = next(i for i, (a, b) in enumerate(zip(sum(parts, []) + [-1], whole + [-1])) if a != b)
                name, text = pieces[int(np.searchsorted(ends, first, side="right"))
                                    if first < ends[-1] else len(pieces) - 1]
                raise ValueError(f"under this tokenizer {name} ({text[:60]!r}) tokenizes differently inside the "
                                 "segment than on its own, so the in-graph rendering would give wrong ids")

    # ---- episodes ----------------------------------------------------------------------------
    def reset_rows(self, seeds):
        """Initial states of a batch: row b is `env.reset_env(PRNGKey(seeds[b]))` (jittable). The
        rollout resets through this, so a `MixedTextEnv` (text/mix.py) can give each row its member."""
        keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds))
        return jax.vmap(self.env.reset_env, in_axes=(0, None))(keys, self.env_params)[1]

    # ---- rendering ---------------------------------------------------------------------------
    def reward_in_range(self, reward) -> jax.Array:
        """Whether `reward` prints exactly (else the segment shows it clipped); jittable."""
        c = reward_cents_jax(reward)
        return (c >= self._cents_lo) & (c <= self._cents_hi)

    @property
    def token_tables(self) -> tuple[np.ndarray, ...]:
        """Every host-built id table a segment is assembled from (e.g. for a task vocabulary)."""
        tables = (self._turns.ids, self._tails.ids, self._rewards.ids, self._user_open_ids)
        tables += (self._grid.ids,) if self._grid is not None else ()
        tables += tuple(t.ids for t in self._extra + self._slots)
        return tables + (self._coords.tables if self._coords is not None else ())

    def _state_pieces(self, state):
        """(pieces of the state text incl. its final newline, ok): coordinate block and/or grid rows,
        then the extra lines."""
        pieces, ok = [], jnp.bool_(True)
        if self._coords is not None:
            coord_pieces, coord_ok = self._coords.pieces(self.env.coordinate_masks(state, self.env_params))
            pieces += coord_pieces
            ok = ok & coord_ok
        if self._grid is not None:
            row_ids, row_len, grid_ok = self._grid.rows(self.env.render_grid(state, self.env_params))
            pieces.append((row_ids, row_len))
            ok = ok & grid_ok
        if self._slots:
            # One gather and one scatter for all slots (Sudoku has 110; a piece each compiled for minutes).
            pieces.append(self._slot_stack.lookup(self.env.text_slot_index(state, self.env_params)))
        if self._extra:
            index = self.env.extra_line_index(state, self.env_params)
            pieces += [table.lookup(index[i]) for i, table in enumerate(self._extra)]
        return pieces, ok

    def render_ok(self, state, prev_reward) -> jax.Array:
        """False when the segment is not the exact text: an uncovered grid symbol, a coordinate block
        over its budget, or a clipped reward."""
        _, ok = self._state_pieces(state)
        return ok & self.reward_in_range(prev_reward)

    def render_ids(self, state, turn, actions_left, prev_reward, prev_closed):
        """The segment before assistant turn `turn` -> (ids int32 [max_segment_len], length int32)."""
        turn = jnp.asarray(turn, jnp.int32)
        # Single-turn mode: every turn's segment follows the prompt prefix directly, as turn 1's does.
        later = (turn > 1) & (not self.single_turn)
        state_pieces, _ = self._state_pieces(state)
        cents = jnp.clip(reward_cents_jax(prev_reward), self._cents_lo, self._cents_hi)
        r_ids, r_len = self._rewards.lookup(cents - self._cents_lo)
        t_ids, t_len = self._turns.lookup(turn - 1)
        k_ids, k_len = self._tails.lookup(actions_left)
        im_end_len = jnp.where(later & ~jnp.asarray(prev_closed, bool), 1, 0)
        pieces = [
            (jnp.array([self.ids.im_end], jnp.int32), im_end_len),
            (jnp.asarray(self._user_open_ids), jnp.where(later, len(self._user_open_ids), 0)),
            (r_ids, jnp.where(later, r_len, 0)),
            (t_ids, t_len),
            *state_pieces,
            (k_ids, k_len),
        ]
        return render.concat(pieces, self.max_segment_len, self.pad_id)

    def state_text(self, state) -> str:
        return self.env.render_text(state, self.env_params)

    def render_text(self, state, turn, actions_left, prev_reward, prev_closed) -> str:
        """Host text of the segment `render_ids` builds (same clipping of turn and actions_left)."""
        turn = min(max(int(turn), 1), self.max_turns)
        actions_left = min(max(int(actions_left), 0), self.max_actions_per_episode)
        text = ""
        if turn > 1 and not self.single_turn:
            if not bool(prev_closed):
                text += conv.IM_END_TEXT
            text += conv.reward_piece_text(conv.format_reward(prev_reward, self.config))
        return (text + conv.turn_piece_text(turn, self.single_turn) + self.state_text(state) + "\n"
                + conv.tail_piece_text(actions_left, self.config))

    def first_turn_text(self, state) -> str:
        """The whole prompt of turn 1 (prefix + segment), with all actions left."""
        return self.prefix_text + self.render_text(state, 1, self.max_actions_per_episode, 0.0, True)

    @property
    def distinct_first_segments(self) -> int | None:
        """At most how many different turn-1 segments start states render, or None when it is not
        countable (a coordinate block). A turn-1 segment has no reward line and fixed turn line; the
        rest is one entry of each grid row's, slot's and extra line's table and of the action-count
        tail's: the product of their sizes is a bound by construction, whatever the env's reset does
        (BanditPairs: 24 texts x 2 tails for its 12 name pairs, whatever the number of seeds). The
        rollout prefills each distinct first observation once (rollout.py `first_rows`)."""
        if self._coords is not None:
            return None
        count = len(self._tails.lengths)
        if self._grid is not None:
            count *= math.prod(len(cell) for row in self.cell_symbols for cell in row)
        for table in self._slots + self._extra:
            count *= len(table.lengths)
        return count

    # ---- parsing -----------------------------------------------------------------------------
    @property
    def parser(self):
        if self._parser is None:
            self._parser = self.make_parser(len(self.forced_prefix_ids) + self.config.max_response_tokens)
        return self._parser

    def make_parser(self, max_tokens: int, emit_ids=None) -> Parser:
        """The parser of this env's answers: action names, or a free-text reader for an env whose
        `answer_format` is "expression" (Countdown; text/expression.py) or "placement" (Sudoku's six
        free-text forms; text/placement.py)."""
        answer_format = self.env.answer_format
        if answer_format == "expression":
            return ExpressionParser(self.tokenizer, self.max_actions_per_turn, think=self.config.think,
                                    max_tokens=max_tokens, emit_ids=emit_ids)
        if answer_format == "placement":
            return PlacementParser(self.tokenizer, self.env_params.grid_size, self.max_actions_per_turn,
                                   think=self.config.think, max_tokens=max_tokens, emit_ids=emit_ids)
        return Parser(self.tokenizer, self.action_names, self.max_actions_per_turn, think=self.config.think,
                      max_tokens=max_tokens, emit_ids=emit_ids)

    def parse(self, ids, length):
        """Parse the assistant turn: forced prefix ids + sampled ids (jittable)."""
        return self.parser.parse(ids, length)

    def parse_text(self, text: str):
        """Parse an assistant turn given as text (forced prefix included); host reference."""
        return self.parser.parse_text(text)

    def restrict_to_state(self, parsed, state):
        """Drop the parsed actions `state` does not accept (jittable, one row).

        The reference's es_manager._extract_map_valid_actions: names outside the env's CURRENT action
        lookup are dropped (the others keep their order) and the turn gets the format penalty, so
        `has_invalid` is set when anything was dropped. Identity for an env whose `valid_actions` is None.
        """
        accept = self.env.valid_actions(state, self.env_params)
        if accept is None:
            return parsed
        accept = jnp.asarray(accept, bool)
        acts = jnp.asarray(parsed.actions, jnp.int32)
        named = acts >= 0
        keep = named & accept[jnp.clip(acts, 0, accept.shape[0] - 1)]
        slot = jnp.where(keep, jnp.cumsum(keep) - 1, acts.shape[0])  # kept actions move up, in order
        out = jnp.full(acts.shape, -1, jnp.int32).at[slot].set(acts, mode="drop")
        return parsed.replace(actions=out, num_actions=jnp.sum(keep, dtype=jnp.int32),
                              has_invalid=jnp.asarray(parsed.has_invalid) | jnp.any(named & ~keep))
