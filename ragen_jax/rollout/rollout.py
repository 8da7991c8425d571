"""The compiled multi-turn rollout: P groups x N episodes, every turn inside one XLA program.

Per turn, for the whole batch at once and without returning to Python:

    render the observation segment (ids)  ->  prefill it onto the persistent KV cache
    ->  decode the answer (stop: <|im_end|>, <|endoftext|>, "</answer>", token budget)
    ->  parse it in-graph  ->  execute the valid actions in order  ->  turn reward (+ format penalty)

Earlier turns are never re-encoded: the cache holds the whole conversation and each turn prefills
only its new segment. Ended episodes are masked (they write nothing, sample nothing) and the turn loop
stops as soon as every episode has ended. All shapes are static, so one compilation serves every
iteration.

Token layout of row b (what the trainer sees):
    [prefix][seg 1][sampled 1][seg 2][sampled 2] ... pad
`loss_mask` is 1 exactly on the sampled ids (the forced `<think>` is part of the segment, not sampled).

Single-turn mode (`PromptConfig.context_window_mode="single_turn"`, RAGEN-2 window 1): turn k sees the
prefix and its own segment only. The cache is rewound to the prefix before every segment (so it holds
prefix + one turn, not the conversation), and each segment is rendered as a first turn (no reward
message). The record keeps the same layout, with `turn_start` marking where each turn's block begins;
the trainer scores each block behind the shared prefix (trainer/step.py `sequence_logprobs`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, NamedTuple

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ragen_jax.models.qwen2.model import KVCache, with_config
from ragen_jax.rollout import sampler
from ragen_jax.rollout.state_keys import state_key_fn
from ragen_jax.rollout.types import RolloutConfig, Trajectories
from ragen_jax.text.parse import Parsed, format_penalty_applies
from ragen_jax.text.tokenizer import token_bytes_table


def init_cache(model, batch: int, max_len: int, dtype=None, quant: str = "none"):
    """The model's own cache if it defines one (scripted test policies do), else a Qwen2 KVCache
    (`quant`: RolloutConfig.kv_cache_quant)."""
    if hasattr(model, "init_cache"):
        return model.init_cache(batch, max_len, dtype)

    return KVCache.init(model.cfg, batch=batch, max_len=max_len, dtype=dtype, quant=quant)


def _write_rows(buf, start, seg, seg_len):
    """buf[b, start[b] + i] = seg[b, i] for i < seg_len[b]; positions past the buffer are dropped."""
    b, n = seg.shape
    i = jnp.arange(n)[None, :]
    idx = jnp.where(i < seg_len[:, None], start[:, None] + i, buf.shape[1])
    return buf.at[jnp.arange(b)[:, None], idx].set(seg.astype(buf.dtype), mode="drop")


def _tree_where(cond, new, old):
    """Per-row select over a pytree whose leaves have a leading batch axis."""

    def sel(n, o):
        c = cond.reshape(cond.shape + (1,) * (n.ndim - 1))
        return jnp.where(c, n, o)

    return jax.tree.map(sel, new, old)


def _pure(tree):
    """Nested dicts of arrays: the form `nnx.merge` needs, without Variable metadata to compare."""
    return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


_TRACE_LIMITED = itertools.count()


def _limit_traces(fn, n: int):
    """`fn` under `chex.assert_max_traces(n)`, with a trace counter of its own.

    chex counts traces per function footprint (definition-site stack, source, name), which every
    Rollout's `_run` shares; a unique name gives each instance its own count.
    """

    def traced(*args):
        return fn(*args)

    traced.__name__ = traced.__qualname__ = f"Rollout._run#{next(_TRACE_LIMITED)}"
    return chex.assert_max_traces(traced, n=n)


@flax.struct.dataclass
class _Carry:
    """State of the turn loop. B = P x N rows, T = max_context, K = max_turns."""

    turn: jax.Array  # [] int32: turns taken so far = 0-based index of the next turn
    key: jax.Array  # PRNG key; every turn splits off its sampling and env keys
    state: Any  # env state pytree, leading axis B
    cache: Any  # KV cache holding each row's conversation so far (None in teacher mode)
    tokens: jax.Array  # [B, T] int32: the conversation, the pad id from `pos` on
    loss_mask: jax.Array  # [B, T] bool: positions the policy sampled
    logprobs: jax.Array  # [B, T] f32: sampling log-prob at sampled positions, 0 elsewhere
    pos: jax.Array  # [B] int32: conversation length = where the next segment goes
    done: jax.Array  # [B] bool: episode over (env done, context full, or last turn taken)
    prev_reward: jax.Array  # [B] f32: last turn's reward, penalty included: the next "Reward:" line
    prev_closed: jax.Array  # [B] bool: last answer ended with <|im_end|> (else the next segment adds it)
    turn_start: jax.Array  # [B, K] int32: position of each turn's segment, -1 for turns not taken
    turn_end: jax.Array  # [B, K] int32: position of each turn's last sampled token, -1 if none
    turn_reward: jax.Array  # [B, K] f32: env rewards + format penalty of each turn
    all_valid: jax.Array  # [B] bool: no turn so far got the format penalty
    num_actions: jax.Array  # [B] int32: executed actions
    num_effective: jax.Array  # [B] int32: executed actions that changed the state
    num_turns: jax.Array  # [B] int32: turns taken by this row
    num_format_errors: jax.Array  # [B] int32: turns that got the format penalty
    response_length: jax.Array  # [B] int32: sampled tokens over all turns
    truncated: jax.Array  # [B] bool: ended because the next turn would not fit in T
    state_key: jax.Array | None = None  # [B, K, D] int32: each turn's observation key (`state_keys=True`)
    # Each distinct first observation prefilled once (`Rollout._first_turn`): (NewKV [L, U, S, ...],
    # next-token logits [U, V], each group's row of them [P]) that turn 1 copies to the group's rows
    # instead of prefilling them.
    first: Any = None


class _Segment(NamedTuple):
    """A turn's observation segment (the user message and the forced assistant opening)."""

    ids: jax.Array  # [B, S] int32, S = max_segment_len
    length: jax.Array  # [B] int32; 0 for rows that take no turn
    active: jax.Array  # [B] bool: rows that take this turn (live, and segment + one token fit)
    overflow: jax.Array  # [B] bool: live rows whose turn does not fit: they end here, truncated
    budget: jax.Array  # [B] int32: answer tokens that still fit (<= max_response_tokens)


class _Executed(NamedTuple):
    """What a turn's parsed actions did in the env."""

    state: Any  # env state after them
    reward: jax.Array  # [B] f32: sum of their env rewards
    num_actions: jax.Array  # [B] int32: actions executed (none once the episode has ended)
    num_effective: jax.Array  # [B] int32: executed actions that changed the state


class Rollout:
    """A compiled rollout for one (policy graph, TextEnv, RolloutConfig).

        rollout = Rollout(model, text_env, RolloutConfig(num_groups=8, group_size=16))
        traj = rollout(params, key, group_seeds)      # params = nnx.state(model) (or nnx.split(model)[1])

    `group_seeds` [P] int32: group g's initial state is `env.reset_env(PRNGKey(seed_g))` for all N of
    its rollouts. `key` drives sampling and the randomness of envs that draw it from the step's key
    (e.g. Bandit's jackpot), differently per row; an env that seeds its randomness at reset
    (FrozenLake's `seeded_slips`, as the reference) gives the rows of a group the same draws.
    `params` must have the shapes and dtypes of `nnx.state(model)` (checked when the program is traced).
    `mesh`: optional; the batch axis is sharded over `batch_axes` of the mesh (params keep the
    shardings they arrive with), giving the same numbers as one device.
    `vocab`: optional `VocabMap` for a model with its own small vocabulary (the CPU demo).
    `teacher`: optional `(state, turn, key) -> (ids int32 [max_response_tokens], length)` written in
    place of sampling (per row, vmapped; `turn` is 1-based). With a teacher the policy is never run
    (`model` may be None, `params` is ignored): this makes solver demonstrations in exactly the
    conversation format of the rollout (the supervised warm start).
    `max_traces`: optional; tracing (= compiling) the program more often raises an AssertionError
    (`chex.assert_max_traces`), so an unintended recompilation fails instead of running slowly.
    `trace_count` counts the traces either way.
    `state_keys`: also record each turn's observation key (`Trajectories.state_key` [B, K, D], GiGPO's
    anchor states; rollout/state_keys.py), computed in the compiled turn step. Off: the field is None.
    """

    def __init__(self, model, text_env, config: RolloutConfig, *, mesh=None, batch_axes=("data", "fsdp"),
                 teacher=None, vocab=None, max_traces: int | None = None, state_keys: bool = False):
        self.teacher = teacher
        self.state_key, self.state_key_width = state_key_fn(text_env) if state_keys else (None, 0)
        self.vocab = vocab  # optional VocabMap: a small-vocabulary model inside the Qwen id space
        if model is None and teacher is None:
            raise ValueError("Rollout needs a model (or a teacher for demonstrations)")
        if model is not None and config.matmul_dtype is not None:  # the sampler's numerics only
            model = with_config(model, matmul_dtype=config.matmul_dtype)
        if model is not None and hasattr(model, "cfg") and model.cfg.decode_bound != config.filled_reads:
            model = with_config(model, decode_bound=config.filled_reads)
        self.graphdef = nnx.split(model)[0] if model is not None else None
        # Shapes and dtypes only: holding the arrays would keep a second copy of the model alive.
        self.params_spec = (jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.state(model))
                            if model is not None else None)
        self.text_env = text_env
        self.config = dataclasses.replace(config)  # a copy: later edits of a config never reach the compiled program
        self.mesh = mesh
        self.batch_axes = tuple(a for a in batch_axes if mesh is not None and a in mesh.axis_names)
        self.trace_count = 0

        pc = text_env.config
        self.max_turns = int(text_env.max_turns)
        self.max_new = int(pc.max_response_tokens)
        self.max_actions = int(text_env.max_actions_per_turn)
        self.max_actions_per_episode = int(text_env.max_actions_per_episode)
        self.prefix = np.asarray(text_env.prefix_ids, np.int32)
        self.forced = np.asarray(text_env.forced_prefix_ids, np.int32)
        # Pad, <|im_end|> and stop ids are the tokenizer's (Qwen: 151643 / 151645; SmolLM2: 2 / 2).
        self.chat = text_env.ids
        seg = int(text_env.max_segment_len)
        self.single_turn = bool(text_env.single_turn)
        # Single-turn: the cache holds the prefix and one turn (segment + answer), whatever T_max is.
        self.cache_len = (min(config.max_context, len(self.prefix) + seg + self.max_new) if self.single_turn
                          else config.max_context)
        if len(self.prefix) + seg + 1 > config.max_context:
            raise ValueError(
                f"RolloutConfig.max_context={config.max_context} cannot hold even the first turn: the "
                f"prompt prefix is {len(self.prefix)} tokens and a turn segment up to {seg}")
        if mesh is not None:
            n_shards = int(np.prod([mesh.shape[a] for a in self.batch_axes])) if self.batch_axes else 1
            if config.batch_size % n_shards:
                raise ValueError(
                    f"batch P*N = {config.batch_size} is not divisible by the {n_shards} devices of mesh axes "
                    f"{self.batch_axes}; change num_groups/group_size or the mesh")

        # The parser sees forced prefix + sampled ids, so its static budget covers both.
        # With a task vocabulary (and no teacher forcing ids from outside it) only its ids and the forced
        # prefix can reach the parser, which then sizes its byte buffer by their longest token.
        emit = None if vocab is None or teacher is not None else np.union1d(vocab.to_qwen, self.forced)
        self.parser = text_env.make_parser(len(self.forced) + self.max_new, emit_ids=emit)  # the env's answer format
        self.stop_table = None
        if config.stop_at_answer:
            self.stop_table = sampler.make_stop_table(("</answer>",), token_bytes_table(text_env.tokenizer))
        # Several passes: one pass is this same rollout for groups_per_pass groups, run in a loop.
        self._pass = None
        if 0 < config.groups_per_pass < config.num_groups:
            if text_env.is_mix:  # a MixedTextEnv assigns envs by row of the whole batch
                raise ValueError("RolloutConfig.groups_per_pass does not work with a mixed-environment batch "
                                 "(env.mix) yet; set it to 0")
            self._pass = Rollout(model, text_env,
                                 dataclasses.replace(config, num_groups=config.groups_per_pass, groups_per_pass=0),
                                 mesh=mesh, batch_axes=batch_axes, teacher=teacher, vocab=vocab,
                                 state_keys=state_keys)
        # Rows of a group start from the same seed, so their first observation is the same ids: it is
        # prefilled once per group and copied (a model that can run tokens without writing its cache).
        # One turn only: with more, choosing turn 1's copy or a later turn's computation is a conditional
        # whose operand is the cache, and XLA held two more caches of temporaries for it (bench/memory.py,
        # the reference config: rollout temporaries 6.97 -> 18.39 GB).
        # Different seeds can render the same first observation (Bandit: 2 texts): then each distinct one
        # is prefilled once. `first_rows` is how many the program makes room for, from the env's count.
        bound = text_env.distinct_first_segments if config.distinct_first else None
        self.first_rows = config.num_groups if bound is None else max(1, min(config.num_groups, bound))
        self.share_first = (teacher is None and model is not None and config.shared_prefix and self.max_turns == 1
                            and (config.group_size > 1 or self.first_rows < config.num_groups)
                            and callable(getattr(model, "extend", None)))
        run = self._run if max_traces is None else _limit_traces(self._run, max_traces)
        self._jitted = jax.jit(run)

    def __call__(self, params, key, group_seeds) -> Trajectories:
        group_seeds = jnp.asarray(group_seeds, jnp.int32)
        if group_seeds.shape != (self.config.num_groups,):
            raise ValueError(f"group_seeds must have shape ({self.config.num_groups},) = (num_groups,), "
                             f"got {tuple(group_seeds.shape)}")
        return self._jitted(params, jnp.asarray(key), group_seeds, self.stop_table)

    def lower(self, params, key, group_seeds):
        """The rollout program lowered for these (possibly abstract) inputs: AOT memory analysis."""
        return self._jitted.lower(params, key, group_seeds, self.stop_table)

    def export(self, platform: str, params, key, group_seeds):
        """The rollout program exported (`jax.export`: traced and lowered, not compiled) for `platform`
        ("tpu", "cuda", "cpu"...) from the (possibly abstract, sharded) inputs, on any backend."""
        return jax.export.export(self._jitted, platforms=[platform])(params, key, group_seeds, self.stop_table)

    def use_compiled(self, compiled) -> None:
        """Run with an executable compiled from `lower(...)` for the same shapes and shardings, so the
        program that was checked ahead of time is the one that runs (no second compilation)."""
        self._jitted = compiled

    # ------------------------------------------------------------------------------------------
    # The compiled program: set up, take turns while any episode is live, return the record.

    def _run(self, params, key, group_seeds, stop_table) -> Trajectories:
        self.trace_count += 1  # runs only while tracing: counts compilations
        if self._pass is not None:
            return self._run_passes(params, key, group_seeds, stop_table)
        model = self._policy(params)
        seeds = jnp.repeat(group_seeds, self.config.group_size)
        carry = self._start(model, key, seeds)
        carry = jax.lax.while_loop(self._any_turn_left, functools.partial(self._turn, model, stop_table), carry)
        return self._trajectories(carry, seeds)

    def _run_passes(self, params, key, group_seeds, stop_table) -> Trajectories:
        """Pass i = the one-pass rollout of groups [i*G, (i+1)*G) with fold_in(key, i), in a loop (lax.map
        allocates one pass's buffers); rows come out in group order, group ids global."""
        inner = self._pass
        g = inner.config.num_groups
        n = self.config.num_groups // g

        def one(args):
            i, seeds = args
            traj = inner._run(params, jax.random.fold_in(key, i), seeds, stop_table)
            return traj.replace(group=traj.group + i * g)

        out = jax.lax.map(one, (jnp.arange(n, dtype=jnp.int32), group_seeds.reshape(n, g)))
        return jax.tree.map(lambda x: self._shard(x.reshape(n * x.shape[1], *x.shape[2:])), out)

    def _policy(self, params):
        """The model the program samples from; None in teacher mode."""
        if self.teacher is not None:
            return None
        try:
            chex.assert_trees_all_equal_shapes_and_dtypes(_pure(params), _pure(self.params_spec))
        except AssertionError as e:
            raise ValueError(f"params do not match the model this Rollout was built with; pass "
                             f"nnx.state(model) of that model ({e})") from None
        model = nnx.merge(self.graphdef, params)
        return model if self.vocab is None else self.vocab.wrap(model)

    def _start(self, model, key, seeds) -> _Carry:
        """Reset every row's env from its group's seed; the shared prompt prefix in every row's cache."""
        cfg = self.config
        b, t_max, n_prefix = cfg.batch_size, cfg.max_context, len(self.prefix)
        state = self.text_env.reset_rows(seeds)  # per row: a mixed batch (text/mix.py) resets each row's own env
        prefix = jnp.broadcast_to(jnp.asarray(self.prefix), (b, n_prefix))
        cache = None
        if model is not None:
            cache = self._prefix_cache(model)
            if hasattr(cache, "k"):
                cache = cache.replace(k=self._shard(cache.k, 1), v=self._shard(cache.v, 1), end=self._shard(cache.end))
                if getattr(cache, "k_scale", None) is not None:  # rollout.kv_cache_quant=int8
                    cache = cache.replace(k_scale=self._shard(cache.k_scale, 1), v_scale=self._shard(cache.v_scale, 1))
        tokens = jnp.full((b, t_max), self.chat.pad, jnp.int32).at[:, :n_prefix].set(prefix)
        zeros_i = jnp.zeros((b,), jnp.int32)
        carry = _Carry(
            turn=jnp.zeros((), jnp.int32),
            key=key,
            state=jax.tree.map(self._shard, state),
            cache=cache,
            tokens=self._shard(tokens),
            loss_mask=self._shard(jnp.zeros((b, t_max), bool)),
            logprobs=self._shard(jnp.zeros((b, t_max), jnp.float32)),
            pos=zeros_i + n_prefix,
            done=jnp.zeros((b,), bool),
            prev_reward=jnp.zeros((b,), jnp.float32),
            prev_closed=jnp.ones((b,), bool),
            turn_start=jnp.full((b, self.max_turns), -1, jnp.int32),
            turn_end=jnp.full((b, self.max_turns), -1, jnp.int32),
            turn_reward=jnp.zeros((b, self.max_turns), jnp.float32),
            all_valid=jnp.ones((b,), bool),
            num_actions=zeros_i,
            num_effective=zeros_i,
            num_turns=zeros_i,
            num_format_errors=zeros_i,
            response_length=zeros_i,
            truncated=jnp.zeros((b,), bool),
            state_key=(None if self.state_key is None else
                       jnp.full((b, self.max_turns, self.state_key_width), -1, jnp.int32)),
        )
        return carry.replace(first=self._first_turn(model, carry)) if self.share_first else carry

    def _first_turn(self, model, c: _Carry):
        """Turn 1's segment prefilled once per group, or once per distinct segment when fewer than P
        (`first_rows` = U), behind the prefix: (NewKV [L, U, S, ...], next-token logits [U, V], each
        group's row of them [P]) (a group's rows render the same ids: same seed, same state), for
        `_answer` to copy to every row of the group. Only the U rows are held until then."""
        n, p, u = self.config.group_size, self.config.num_groups, self.first_rows
        seg = jax.tree.map(lambda x: x[::n], self._segment(c))

        def prefill(ids, length):
            valid = jnp.arange(ids.shape[1])[None, :] < length[:, None]
            logits, new = sampler.extend(model, self._prefix_cache(model, ids.shape[0]), ids, valid)
            return new, logits

        if u == p:
            return *prefill(seg.ids, seg.length), jnp.arange(p, dtype=jnp.int32)
        # The distinct segments (ids and length as one row) in u rows, u being at least how many texts
        # turn 1 can render at all (`TextEnv.distinct_first_segments`, counted from the very tables
        # the segments are assembled from), so none is ever left out; rows past the count copy the first.
        # Found by comparing all pairs ([P, P] equal rows): a sort over S + 1 keys (`jnp.unique(axis=0)`)
        # is a variadic sort of ~200 operands, which accelerators compile poorly.
        rows = jnp.concatenate([seg.ids, seg.length[:, None]], axis=1)
        first = jnp.argmax(jnp.all(rows[:, None, :] == rows[None, :, :], axis=-1), axis=1)  # first equal row
        own = first == jnp.arange(p)
        slot = jnp.cumsum(own) - 1  # each distinct row's place among them, in order of first appearance
        inv = slot[first]
        uniq = jnp.zeros((u, rows.shape[1]), rows.dtype).at[jnp.where(own, slot, u)].set(rows, mode="drop")
        uniq = jnp.where((jnp.arange(u) < jnp.sum(own))[:, None], uniq, rows[0])
        return *prefill(uniq[:, :-1], uniq[:, -1]), inv.astype(jnp.int32)

    def _prefix_cache(self, model, rows: int | None = None):
        """The cache (B rows, or `rows`) holding the prompt prefix every row shares: prefilled for ONE
        row, then broadcast (the same keys and values the per-row prefill writes, at 1/B of its cost). Any cache
        pytree works (`init_cache`): each leaf of the one-row cache is broadcast to its B-row shape.
        `RolloutConfig.shared_prefix=False`: every row prefills its own copy."""
        cfg = self.config
        rows = cfg.batch_size if rows is None else rows
        if not cfg.shared_prefix:
            prefix = jnp.broadcast_to(jnp.asarray(self.prefix), (rows, len(self.prefix)))
            cache = init_cache(model, rows, self.cache_len, cfg.cache_dtype, cfg.kv_cache_quant)
            return model(prefix, jnp.ones(prefix.shape, bool), cache)[1]
        prefix = jnp.asarray(self.prefix)[None]
        one = init_cache(model, 1, self.cache_len, cfg.cache_dtype, cfg.kv_cache_quant)
        _, one = model(prefix, jnp.ones(prefix.shape, bool), one)
        like = jax.eval_shape(lambda: init_cache(model, rows, self.cache_len, cfg.cache_dtype, cfg.kv_cache_quant))
        return jax.tree.map(lambda x, shape: jnp.broadcast_to(x, shape.shape), one, like)

    def _any_turn_left(self, c: _Carry):
        return (c.turn < self.max_turns) & ~jnp.all(c.done)

    def _turn(self, model, stop_table, c: _Carry) -> _Carry:
        """One assistant turn of every live row."""
        key, k_sample, k_env = jax.random.split(c.key, 3)
        seg = self._segment(c)
        out = self._answer(model, stop_table, c, seg, k_sample)
        parsed = self._restrict(self._parse(out), c.state)
        executed = self._execute(c.state, parsed, seg.active, k_env)
        return self._record(c, key, seg, out, parsed, executed)

    # ------------------------------------------------------------------------------------------
    # The phases of a turn.

    def _segment(self, c: _Carry) -> _Segment:
        """Render each row's next observation segment; decide who takes the turn and its token budget."""
        actions_left = self.max_actions_per_episode - c.state.time
        ids, length = jax.vmap(self.text_env.render_ids, in_axes=(0, None, 0, 0, 0))(
            c.state, c.turn + 1, actions_left, c.prev_reward, c.prev_closed)
        # A turn is started only if its segment and at least one sampled token fit in T_max.
        room = self.config.max_context - c.pos - length
        live = ~c.done
        overflow = live & (room < 1)
        active = live & ~overflow
        return _Segment(ids=ids, length=jnp.where(active, length, 0), active=active, overflow=overflow,
                        budget=jnp.clip(room, 0, self.max_new))

    def _answer(self, model, stop_table, c: _Carry, seg: _Segment, key) -> sampler.SampleOutput:
        """Prefill the segment onto the cache and decode the answer (or write the teacher's)."""
        if self.teacher is not None:
            return self._teach(c.state, c.turn + 1, key, seg.active, seg.budget)
        cfg = self.config
        valid = jnp.arange(seg.ids.shape[1])[None, :] < seg.length[:, None]
        cache = c.cache
        if self.single_turn:  # forget the previous turn: the prefix's keys stay, later slots are overwritten
            cache = cache.replace(end=jnp.full_like(cache.end, len(self.prefix)))
        if c.first is None:
            logits, cache = sampler.prefill(model, cache, seg.ids, valid)
        else:
            new, logits = self._segment_kv(c, valid)
            cache = cache.append(new)
        return sampler.decode(
            model, cache, logits, key, max_new_tokens=self.max_new, budget=seg.budget, active=seg.active,
            temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, greedy=cfg.greedy,
            use_top_p=(cfg.top_p < 1.0) and not cfg.greedy, stop_ids=self.chat.stop, pad_id=self.chat.pad,
            stop_table=stop_table)

    def _segment_kv(self, c: _Carry, valid):
        """(NewKV, next-token logits) of the (only) turn's segment: each group's, prefilled in `_start`,
        copied to its rows (one gather from the distinct rows)."""
        new, logits, of_group = c.first
        row = jnp.repeat(of_group, self.config.group_size)
        return new.replace(k=new.k[:, row], v=new.v[:, row], valid=valid), logits[row]

    def _teach(self, state, turn, key, active, budget) -> sampler.SampleOutput:
        keys = jax.random.split(key, self.config.batch_size)
        ids, n = jax.vmap(self.teacher, in_axes=(0, None, 0))(state, turn, keys)
        ids = jnp.asarray(ids, jnp.int32)
        if ids.shape[1] != self.max_new:
            raise ValueError(f"teacher must return ids of length max_response_tokens={self.max_new}, got {ids.shape[1]}")
        n = jnp.where(active, jnp.minimum(jnp.asarray(n, jnp.int32), budget), 0)
        ids = jnp.where(jnp.arange(self.max_new)[None, :] < n[:, None], ids, self.chat.pad)
        return sampler.SampleOutput(tokens=ids, logprobs=jnp.zeros(ids.shape, jnp.float32), lengths=n,
                                    cache=None, stopped_by=jnp.zeros_like(n))

    def _parse(self, out: sampler.SampleOutput) -> Parsed:
        """Parse exactly what was sampled, behind the forced <think>/<answer> of the segment."""
        forced = jnp.broadcast_to(jnp.asarray(self.forced), (out.tokens.shape[0], len(self.forced)))
        return jax.vmap(self.parser.parse)(jnp.concatenate([forced, out.tokens], axis=1),
                                           len(self.forced) + out.lengths)

    def _restrict(self, parsed: Parsed, state) -> Parsed:
        """Drop the names each row's own state does not accept (flagged, so the turn is penalised):
        an env whose action names depend on the episode (BanditPairs draws its arm pair per reset)."""
        return jax.vmap(self.text_env.restrict_to_state)(parsed, state)

    def _execute(self, state, parsed: Parsed, active, key) -> _Executed:
        """Step the env with each active row's valid actions, in answer order."""
        env, env_params = self.text_env.env, self.text_env.env_params
        rows = jnp.arange(self.config.batch_size)

        def step(carry: _Executed, a):
            st = carry.state
            do = active & (a < parsed.num_actions)
            step_keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(key, a), r))(rows)
            action = parsed.actions[:, a] if parsed.answer is None else parsed.answer  # free-text answer
            _, st2, r, _, info = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(step_keys, st, action, env_params)
            executed = do & ~st.done  # the env itself ignores actions once the episode ended
            return _Executed(
                state=_tree_where(do, st2, st),
                reward=carry.reward + jnp.where(do, r, 0.0),
                num_actions=carry.num_actions + executed.astype(jnp.int32),
                num_effective=carry.num_effective
                + (executed & info["action_is_effective"].astype(bool)).astype(jnp.int32),
            ), None

        zeros_i = jnp.zeros((self.config.batch_size,), jnp.int32)
        init = _Executed(state=state, reward=jnp.zeros((self.config.batch_size,), jnp.float32),
                         num_actions=zeros_i, num_effective=zeros_i)
        return jax.lax.scan(step, init, jnp.arange(self.max_actions))[0]

    def _record(self, c: _Carry, key, seg: _Segment, out: sampler.SampleOutput, parsed: Parsed,
                executed: _Executed) -> _Carry:
        """Append segment and answer to the conversation; book the turn's reward, end and counts."""
        active, n_gen, turn = seg.active, out.lengths, c.turn
        gen_start = c.pos + seg.length
        bad_format = active & format_penalty_applies(parsed)
        reward = jnp.where(active, executed.reward + jnp.where(bad_format, self.config.format_penalty, 0.0), 0.0)
        last_tok = jnp.take_along_axis(out.tokens, jnp.maximum(n_gen - 1, 0)[:, None], axis=1)[:, 0]
        return _Carry(
            turn=turn + 1,
            key=key,
            state=executed.state,
            cache=out.cache,
            tokens=_write_rows(_write_rows(c.tokens, c.pos, seg.ids, seg.length), gen_start, out.tokens, n_gen),
            loss_mask=_write_rows(c.loss_mask, gen_start, jnp.ones(out.tokens.shape, bool), n_gen),
            logprobs=_write_rows(c.logprobs, gen_start, out.logprobs, n_gen),
            pos=gen_start + n_gen,
            done=c.done | seg.overflow | (active & executed.state.done) | (turn + 1 >= self.max_turns),
            prev_reward=jnp.where(active, reward, c.prev_reward),
            prev_closed=jnp.where(active, (n_gen > 0) & (last_tok == self.chat.im_end), c.prev_closed),
            turn_start=c.turn_start.at[:, turn].set(jnp.where(active, c.pos, -1)),
            turn_end=c.turn_end.at[:, turn].set(jnp.where(active & (n_gen > 0), gen_start + n_gen - 1, -1)),
            turn_reward=c.turn_reward.at[:, turn].set(reward),
            all_valid=c.all_valid & ~bad_format,
            num_actions=c.num_actions + executed.num_actions,
            num_effective=c.num_effective + executed.num_effective,
            num_turns=c.num_turns + active.astype(jnp.int32),
            num_format_errors=c.num_format_errors + bad_format.astype(jnp.int32),
            response_length=c.response_length + n_gen,
            truncated=c.truncated | seg.overflow,
            state_key=self._record_key(c, seg.active),
            first=c.first,
        )

    def _record_key(self, c: _Carry, active):
        """The observation key of the state each active row acted on at this turn (-1 elsewhere)."""
        if self.state_key is None:
            return None
        key = jax.vmap(self.state_key)(c.state)
        return c.state_key.at[:, c.turn].set(jnp.where(active[:, None], key, -1))

    # ------------------------------------------------------------------------------------------

    def _trajectories(self, c: _Carry, seeds) -> Trajectories:
        cfg = self.config
        success = jax.vmap(self.text_env.env.is_success, in_axes=(0, None))(c.state, self.text_env.env_params)
        traj = Trajectories(
            tokens=c.tokens,
            length=c.pos,
            loss_mask=c.loss_mask,
            logprobs=c.logprobs,
            turn_start=c.turn_start,
            turn_end=c.turn_end,
            turn_reward=c.turn_reward,
            reward=jnp.sum(c.turn_reward, axis=1),
            group=jnp.repeat(jnp.arange(cfg.num_groups, dtype=jnp.int32), cfg.group_size),
            seed=seeds,
            success=success.astype(bool),
            action_is_valid=c.all_valid & (c.num_turns > 0),
            num_actions=c.num_actions,
            num_effective=c.num_effective,
            num_turns=c.num_turns,
            num_format_errors=c.num_format_errors,
            response_length=c.response_length,
            truncated=c.truncated,
            state_key=c.state_key,
        )
        traj.assert_shapes(cfg.batch_size, cfg.max_context, self.max_turns)
        return traj

    def _shard(self, x, batch_dim=0):
        if self.mesh is None or not self.batch_axes:
            return x
        spec = [None] * x.ndim
        spec[batch_dim] = self.batch_axes
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, PartitionSpec(*spec)))


def turn_blocks(text_env) -> tuple[int, int]:
    """(prefix length, block width) of single-turn records: what the trainer needs to score each turn
    behind the prompt prefix alone (trainer/turn_blocks.py `TurnBlocks`). A block is one turn's segment
    and its answer."""
    return len(text_env.prefix_ids), int(text_env.max_segment_len) + int(text_env.config.max_response_tokens)


def group_seeds_for_iteration(iteration: int, num_groups: int, base: int = 10000) -> np.ndarray:
    """The reference's training seeds: group g of iteration i starts from seed base + P*i + g."""
    return base + num_groups * int(iteration) + np.arange(num_groups, dtype=np.int64)
