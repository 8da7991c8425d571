"""`MixedTextEnv`: several environments in one batch of the compiled rollout (RAGEN-2's env mix).

    mixed = MixedTextEnv([("Sokoban", sokoban_text_env, 4), ("FrozenLake", frozen_lake_text_env, 4)])
    rollout = Rollout(model, mixed, RolloutConfig(num_groups=8, group_size=16))

It has the interface the rollout uses of a `TextEnv`, so the rollout compiles one program for the
whole mix. Rows are grouped by environment: the first `groups_0` groups (x group_size rows) are
member 0's, the next `groups_1` member 1's, and so on; group g still starts from `group_seeds[g]`.

How each row stays exactly its own environment's episode:

* State: every row holds every member's state (static shapes) plus its member index `env`; `time`
  and `done` mirror the row's own member, so the rollout reads them as from any env. Reset, step,
  success and rendering compute every member and pick the row's (environment steps are cheap next
  to the model); a member's state changes only on its own rows.
* Conversation: the members must share the conversation settings (`PromptConfig`, so turns, answer
  format and token budgets) and their action names (the rollout parses one action list; a name maps
  to each member's own action index). Their first user messages differ (each env's instructions),
  so `prefix_ids` is the longest token prefix every member's prompt starts with (prefilled once for
  the batch) and the rest of a row's own prompt prefix comes at the head of its turn-1 segment.
  A row's tokens are therefore exactly those of a single-env rollout of its member.
* Segments are padded to the largest member budget: `max_segment_len` = max over members of (their
  prompt rest + their segment budget). Every turn's prefill pays for that width.
* Step keys and sampling keys depend only on the row, so a row of the mix sees the same randomness
  as the same row of a single-env batch of the same size.

`parse_mix` reads the config form ("Sokoban:4,FrozenLake:4" or ((name, groups), ...)).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ragen_jax.text import render
from ragen_jax.text.text_env import TextEnv


def parse_mix(spec, what: str = "env.mix") -> tuple[tuple[str, int], ...]:
    """((name, count), ...) from "A:4,B:4", ("A:4", "B:4") or (("A", 4), ("B", 4)) (lists too).

    Names are returned as written (the caller checks them against the registry); counts must be
    positive integers. ValueError (one sentence) otherwise.
    """
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
    elif isinstance(spec, (tuple, list)):
        items = list(spec)
    else:
        raise ValueError(f"{what} must be a string like 'Sokoban:4,FrozenLake:4' or a tuple of (name, count) "
                         f"pairs, got {spec!r}")
    out = []
    for item in items:
        if isinstance(item, str):
            name, sep, count = item.partition(":")
            if not sep:
                raise ValueError(f"{what} entry {item!r} needs a count: write it as {item.strip()}:<number>")
            name, count = name.strip(), count.strip()
            try:
                count = int(count)
            except ValueError:
                raise ValueError(f"{what} entry {item!r}: the count {count!r} is not a whole number") from None
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            name, count = item
        else:
            raise ValueError(f"{what} entry {item!r} must be 'Name:count' or a (name, count) pair")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what} entry {item!r}: the environment name must be a non-empty string")
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"{what} entry {item!r}: the count must be a positive whole number")
        out.append((name, int(count)))
    names = [n for n, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{what} names {', '.join(dup)} more than once; give each environment one entry")
    return tuple(out)


def format_mix(mix) -> str:
    """The string form of a parsed mix: "Sokoban:4,FrozenLake:4"."""
    return ",".join(f"{n}:{c}" for n, c in mix)


def _pick(index, trees: Sequence[Any]):
    """trees[index] leaf by leaf, for a traced (per-row) index; every tree has the same structure."""
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs])[index], *trees)


@struct.dataclass
class MixedState:
    """One row's state in a mix (leading batch axis when batched)."""

    env: jax.Array  # int32: the row's member index
    members: tuple  # every member's state; only the row's own member ever changes
    time: jax.Array  # the row's member's `time` (executed actions)
    done: jax.Array  # the row's member's `done`


class MixedEnv:
    """The environment side of a mix: the step/success calls the rollout makes, per row.

    `params` is the tuple of the members' params (`MixedTextEnv.env_params`). Actions are indices
    into the mix's action names and are mapped to each member's own index.
    """

    def __init__(self, envs: Sequence[Any], action_maps: np.ndarray):
        self.members = tuple(envs)
        self.action_maps = np.asarray(action_maps, np.int32)  # [E, A]: mix action -> member action

    def reset_env(self, key, params):
        raise NotImplementedError("a mixed batch is reset row by row with MixedTextEnv.reset_rows(seeds): the "
                                  "member of a row depends on its position in the batch")

    def map_action(self, e: int, action):
        """Mix action indices -> member `e`'s own action indices (negative: no action, kept)."""
        action = jnp.asarray(action, jnp.int32)
        table = jnp.asarray(self.action_maps[e])
        return jnp.where(action < 0, action, table[jnp.clip(action, 0, table.shape[0] - 1)])

    def step_env(self, key, state: MixedState, action, params):
        outs = [env.step_env(key, st, self.map_action(e, action), p)
                for e, (env, st, p) in enumerate(zip(self.members, state.members, params))]
        own = [state.env == e for e in range(len(self.members))]
        members = tuple(jax.tree.map(lambda new, old, m=m: jnp.where(m, new, old), out[1], st)
                        for m, out, st in zip(own, outs, state.members))
        new_states = [out[1] for out in outs]
        reward = _pick(state.env, [jnp.asarray(out[2], jnp.float32) for out in outs])
        terminated = _pick(state.env, [jnp.asarray(out[3], bool) for out in outs])
        keys = set.intersection(*(set(out[4]) for out in outs))
        info = {k: _pick(state.env, [jnp.asarray(out[4][k]) for out in outs]) for k in sorted(keys)}
        time = _pick(state.env, [jnp.asarray(s.time, jnp.int32) for s in new_states])
        done = _pick(state.env, [jnp.asarray(s.done, bool) for s in new_states])
        return None, MixedState(env=state.env, members=members, time=time, done=done), reward, terminated, info

    def is_success(self, state: MixedState, params):
        return _pick(state.env, [jnp.asarray(env.is_success(st, p), bool)
                                 for env, st, p in zip(self.members, state.members, params)])


def _common_prefix(seqs: Sequence[np.ndarray]) -> int:
    n = min(len(s) for s in seqs)
    k = 0
    while k < n and all(s[k] == seqs[0][k] for s in seqs):
        k += 1
    return k


class MixedTextEnv:
    """Several `TextEnv`s as one, row by row (see the module docstring).

    Args:
      members: (name, TextEnv, groups) per member, in batch order; their TextEnvs must share the
        tokenizer, the `PromptConfig` and the action names (ValueError naming the difference).
    """

    is_mix = True  # rows belong to members by their place in the whole batch (env_of_row)

    def __init__(self, members: Sequence[tuple[str, TextEnv, int]]):
        members = list(members)
        if not members:
            raise ValueError("a mix needs at least one environment")
        self.names = tuple(str(n) for n, _, _ in members)
        self.members = tuple(te for _, te, _ in members)
        self.ids = self.members[0].ids  # one tokenizer for all members
        self.pad_id = self.ids.pad
        self.groups = tuple(int(g) for _, _, g in members)
        if any(g < 1 for g in self.groups):
            raise ValueError(f"every environment of a mix needs at least one group, got {self.groups}")
        first, name0 = self.members[0], self.names[0]
        for name, te in zip(self.names[1:], self.members[1:]):
            if te.tokenizer is not first.tokenizer:
                raise ValueError(f"the environments of a mix must share one tokenizer ({name} has another one "
                                 f"than {name0})")
            if te.config != first.config:
                diff = [f.name for f in dataclasses.fields(te.config)
                        if getattr(te.config, f.name) != getattr(first.config, f.name)]
                raise ValueError(f"the environments of a mix share one conversation format, but {name} and {name0} "
                                 f"differ in {', '.join(diff)}; give them the same prompt settings")
            if {a.lower() for a in te.action_names} != {a.lower() for a in first.action_names}:
                raise ValueError(f"the environments of a mix must name the same actions (the compiled rollout "
                                 f"parses one action list): {name0} has {', '.join(first.action_names)}, {name} has "
                                 f"{', '.join(te.action_names)}")
        self.tokenizer = first.tokenizer
        self.config = dataclasses.replace(first.config)
        self.action_names = first.action_names
        self.max_actions_per_turn = first.max_actions_per_turn
        self.max_turns = first.max_turns
        self.single_turn = first.single_turn
        self.forced_prefix_ids = np.asarray(first.forced_prefix_ids, np.int32)
        self.max_actions_per_episode = max(te.max_actions_per_episode for te in self.members)
        # Mix action i -> each member's index of the same name.
        lower = [a.lower() for a in self.action_names]
        maps = np.array([[[a.lower() for a in te.action_names].index(n) for n in lower] for te in self.members],
                        np.int32)
        self.env = MixedEnv([te.env for te in self.members], maps)
        self.env_params = tuple(te.env_params for te in self.members)

        # The shared prompt prefix, and each member's rest of it (the head of its turn-1 segment).
        prefixes = [np.asarray(te.prefix_ids, np.int32) for te in self.members]
        k = _common_prefix(prefixes)
        if k == 0:  # the rollout prefills a non-empty shared prefix once per batch
            raise ValueError(f"the prompts of {', '.join(self.names)} share no first token; a mix needs a common "
                             "chat opening (the same system prompt)")
        self.prefix_ids = prefixes[0][:k]
        self._rest_ids = tuple(p[k:] for p in prefixes)
        self.prefix_text = self.tokenizer.decode(self.prefix_ids.tolist(), skip_special_tokens=False) if k else ""
        self._rest_text = tuple(te.prefix_text[len(self.prefix_text):] for te in self.members)
        if not all(te.prefix_text.startswith(self.prefix_text) for te in self.members):
            raise ValueError("the shared prompt tokens of the mix do not decode to a common text prefix")
        self.max_segment_len = max(len(r) + int(te.max_segment_len) for r, te in zip(self._rest_ids, self.members))
        self._parser = None

    # ---- the layout of a batch ---------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return sum(self.groups)

    @property
    def mix(self) -> tuple[tuple[str, int], ...]:
        return tuple(zip(self.names, self.groups))

    @property
    def env_of_group(self) -> np.ndarray:
        """int32 [P]: the member index of each group."""
        return np.repeat(np.arange(len(self.groups), dtype=np.int32), self.groups)

    @property
    def distinct_first_segments(self) -> int | None:
        """At most how many different turn-1 segments the members render together (None: uncountable)."""
        counts = [te.distinct_first_segments for te in self.members]
        return None if None in counts else sum(counts)

    def env_of_row(self, batch: int) -> np.ndarray:
        """int32 [batch]: the member index of each row (batch = P x group_size)."""
        if batch % self.num_groups:
            raise ValueError(f"a mix of {self.num_groups} groups cannot lay out {batch} rows (rows = groups x "
                             "group_size)")
        return np.repeat(self.env_of_group, batch // self.num_groups)

    def reset_rows(self, seeds):
        """Row b starts as `reset_env(PRNGKey(seeds[b]))` of its member (jittable)."""
        seeds = jnp.asarray(seeds)
        env = jnp.asarray(self.env_of_row(seeds.shape[0]))
        states = tuple(te.reset_rows(seeds) for te in self.members)
        time = _pick_rows(env, [jnp.asarray(s.time, jnp.int32) for s in states])
        done = _pick_rows(env, [jnp.asarray(s.done, bool) for s in states])
        return MixedState(env=env, members=states, time=time, done=done)

    # ---- rendering (one row; the rollout vmaps) ------------------------------------------------
    @property
    def token_tables(self) -> tuple[np.ndarray, ...]:
        tables = tuple(t for te in self.members for t in te.token_tables)
        return tables + tuple(r for r in self._rest_ids if len(r))

    def _member_left(self, te, actions_left):
        # The rollout counts actions left against the mix's largest episode budget; each member
        # prints its own (time = mix budget - actions_left).
        return actions_left - self.max_actions_per_episode + te.max_actions_per_episode

    def render_ids(self, state: MixedState, turn, actions_left, prev_reward, prev_closed):
        """The row's member segment (turn 1: behind the rest of its prompt prefix), padded to
        `max_segment_len` -> (ids int32 [max_segment_len], length int32)."""
        first = jnp.asarray(turn, jnp.int32) <= 1
        ids, lengths = [], []
        for te, st, rest in zip(self.members, state.members, self._rest_ids):
            seg, n = te.render_ids(st, turn, self._member_left(te, actions_left), prev_reward, prev_closed)
            out, length = render.concat([(jnp.asarray(rest), jnp.where(first, len(rest), 0)), (seg, n)],
                                        self.max_segment_len, self.members[0].pad_id)
            ids.append(out)
            lengths.append(length)
        return _pick(state.env, ids), _pick(state.env, lengths)

    def reward_in_range(self, reward) -> jax.Array:
        return self.members[0].reward_in_range(reward)  # one PromptConfig: one printable range

    def render_ok(self, state: MixedState, prev_reward) -> jax.Array:
        return _pick(state.env, [te.render_ok(st, prev_reward) for te, st in zip(self.members, state.members)])

    def restrict_to_state(self, parsed, state: MixedState):
        """Each member's `restrict_to_state` on its own rows (actions in the mix's own order)."""
        outs = []
        for e, (te, st) in enumerate(zip(self.members, state.members)):
            if te.env.valid_actions(st, te.env_params) is None:  # accepts every name: nothing to drop
                outs.append(parsed)
                continue
            own = parsed.replace(actions=self.env.map_action(e, parsed.actions))
            r = te.restrict_to_state(own, st)
            back = jnp.asarray(np.argsort(self.env.action_maps[e]).astype(np.int32))  # member -> mix
            acts = jnp.asarray(r.actions, jnp.int32)
            outs.append(r.replace(actions=jnp.where(acts < 0, acts, back[jnp.clip(acts, 0)])))
        return _pick(state.env, outs)

    # ---- host side ----------------------------------------------------------------------------
    def _row(self, state: MixedState):
        e = int(np.asarray(jax.device_get(state.env)))
        return e, self.members[e], state.members[e]

    def state_text(self, state: MixedState) -> str:
        _, te, st = self._row(state)
        return te.state_text(st)

    def render_text(self, state: MixedState, turn, actions_left, prev_reward, prev_closed) -> str:
        """Host text of `render_ids`' segment (one row's state)."""
        e, te, st = self._row(state)
        text = te.render_text(st, turn, self._member_left(te, int(actions_left)), prev_reward, prev_closed)
        return (self._rest_text[e] if int(turn) <= 1 else "") + text

    def first_turn_text(self, state: MixedState) -> str:
        _, te, st = self._row(state)
        return te.first_turn_text(st)

    # ---- parsing -------------------------------------------------------------------------------
    @property
    def parser(self):
        return self.members[0].parser

    def make_parser(self, max_tokens: int, emit_ids=None):
        return self.members[0].make_parser(max_tokens, emit_ids=emit_ids)  # one action list, one answer format

    def parse(self, ids, length):
        return self.members[0].parse(ids, length)

    def parse_text(self, text: str):
        return self.members[0].parse_text(text)


def _pick_rows(index, arrays):
    """Per-row choice among [B] arrays."""
    stacked = jnp.stack(arrays)
    return jnp.take_along_axis(stacked, index[None, :], axis=0)[0]
