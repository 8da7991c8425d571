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
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ragen_jax.rollout import sampler
from ragen_jax.rollout.types import RolloutConfig, Trajectories
from ragen_jax.models.qwen2.model import KVCache
from ragen_jax.text.parse import Parser
from ragen_jax.text.tokenizer import token_bytes_table

IM_END = 151645
ENDOFTEXT = 151643


def init_cache(model, batch: int, max_len: int, dtype=None):
    """The model's own cache if it defines one (scripted test policies do), else a Qwen2 KVCache."""
    if hasattr(model, "init_cache"):
        return model.init_cache(batch, max_len, dtype)

    return KVCache.init(model.cfg, batch=batch, max_len=max_len, dtype=dtype)


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


class Rollout:
    """A compiled rollout for one (policy graph, TextEnv, RolloutConfig).

        rollout = Rollout(model, text_env, RolloutConfig(num_groups=8, group_size=16))
        traj = rollout(params, key, group_seeds)      # params = nnx.state(model) (or nnx.split(model)[1])

    `group_seeds` [P] int32: group g's initial state is `env.reset_env(PRNGKey(seed_g))` for all N of
    its rollouts. `key` drives sampling and env randomness (e.g. FrozenLake slips), differently per row.
    `mesh`: optional; the batch axis is sharded over `batch_axes` of the mesh (params keep the
    shardings they arrive with), giving the same numbers as one device.
    `vocab`: optional `VocabMap` for a model with its own small vocabulary (the CPU demo).
    `teacher`: optional `(state, turn, key) -> (ids int32 [max_response_tokens], length)` written in
    place of sampling (per row, vmapped; `turn` is 1-based). With a teacher the policy is never run
    (`model` may be None, `params` is ignored): this makes solver demonstrations in exactly the
    conversation format of the rollout (the supervised warm start).
    """

    def __init__(self, model, text_env, config: RolloutConfig, *, mesh=None, batch_axes=("data", "fsdp"),
                 teacher=None, vocab=None):
        self.teacher = teacher
        self.vocab = vocab  # optional VocabMap: a small-vocabulary model inside the Qwen id space
        if model is None and teacher is None:
            raise ValueError("Rollout needs a model (or a teacher for demonstrations)")
        self.graphdef = nnx.split(model)[0] if model is not None else None
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
        seg = int(text_env.max_segment_len)
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
        self.parser = Parser(text_env.tokenizer, text_env.action_names, self.max_actions,
                             think=pc.think, max_tokens=len(self.forced) + self.max_new)
        self.stop_table = None
        if config.stop_at_answer:
            self.stop_table = sampler.make_stop_table(("</answer>",), token_bytes_table(text_env.tokenizer))
        self._jitted = jax.jit(self._run)

    # ------------------------------------------------------------------------------------------
    def _teach(self, state, turn, key, active, budget):
        keys = jax.random.split(key, self.config.batch_size)
        ids, n = jax.vmap(self.teacher, in_axes=(0, None, 0))(state, turn, keys)
        ids = jnp.asarray(ids, jnp.int32)
        if ids.shape[1] != self.max_new:
            raise ValueError(f"teacher must return ids of length max_response_tokens={self.max_new}, got {ids.shape[1]}")
        n = jnp.where(active, jnp.minimum(jnp.asarray(n, jnp.int32), budget), 0)
        ids = jnp.where(jnp.arange(self.max_new)[None, :] < n[:, None], ids, ENDOFTEXT)
        return sampler.SampleOutput(tokens=ids, logprobs=jnp.zeros(ids.shape, jnp.float32), lengths=n,
                                    cache=None, stopped_by=jnp.zeros_like(n))

    def __call__(self, params, key, group_seeds) -> Trajectories:
        group_seeds = jnp.asarray(group_seeds, jnp.int32)
        if group_seeds.shape != (self.config.num_groups,):
            raise ValueError(f"group_seeds must have shape ({self.config.num_groups},) = (num_groups,), "
                             f"got {tuple(group_seeds.shape)}")
        return self._jitted(params, jnp.asarray(key), group_seeds, self.stop_table)

    def _shard(self, x, batch_dim=0):
        if self.mesh is None or not self.batch_axes:
            return x
        spec = [None] * x.ndim
        spec[batch_dim] = self.batch_axes
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, PartitionSpec(*spec)))

    def _run(self, params, key, group_seeds, stop_table) -> Trajectories:
        self.trace_count += 1  # runs only while tracing: counts compilations
        cfg, te = self.config, self.text_env
        env, env_params = te.env, te.env_params
        model = nnx.merge(self.graphdef, params) if self.teacher is None else None
        if model is not None and self.vocab is not None:
            model = self.vocab.wrap(model)
        n_grp, n_per = cfg.num_groups, cfg.group_size
        b, t_max = cfg.batch_size, cfg.max_context
        rows = jnp.arange(b)

        seeds = jnp.repeat(group_seeds, n_per)
        reset_keys = jax.vmap(jax.random.PRNGKey)(seeds)
        _, state = jax.vmap(env.reset_env, in_axes=(0, None))(reset_keys, env_params)
        state = jax.tree.map(self._shard, state)

        prefix = jnp.broadcast_to(jnp.asarray(self.prefix), (b, len(self.prefix)))
        cache = None
        if model is not None:
            cache = init_cache(model, b, t_max, cfg.cache_dtype)
            if hasattr(cache, "k"):
                cache = cache.replace(k=self._shard(cache.k, 1), v=self._shard(cache.v, 1), end=self._shard(cache.end))
            _, cache = model(prefix, jnp.ones(prefix.shape, bool), cache)
        tokens = jnp.full((b, t_max), ENDOFTEXT, jnp.int32).at[:, : len(self.prefix)].set(prefix)

        zeros_i = jnp.zeros((b,), jnp.int32)
        carry = dict(
            turn=jnp.zeros((), jnp.int32),
            key=key,
            state=state,
            cache=cache,
            tokens=self._shard(tokens),
            loss_mask=self._shard(jnp.zeros((b, t_max), bool)),
            logprobs=self._shard(jnp.zeros((b, t_max), jnp.float32)),
            pos=zeros_i + len(self.prefix),
            done=jnp.zeros((b,), bool),
            prev_reward=jnp.zeros((b,), jnp.float32),
            prev_closed=jnp.ones((b,), bool),
            turn_end=jnp.full((b, self.max_turns), -1, jnp.int32),
            turn_reward=jnp.zeros((b, self.max_turns), jnp.float32),
            all_valid=jnp.ones((b,), bool),
            num_actions=zeros_i,
            num_effective=zeros_i,
            num_turns=zeros_i,
            num_format_errors=zeros_i,
            response_length=zeros_i,
            truncated=jnp.zeros((b,), bool),
        )
        forced = jnp.broadcast_to(jnp.asarray(self.forced), (b, len(self.forced)))
        max_new = self.max_new

        def cond(c):
            return (c["turn"] < self.max_turns) & ~jnp.all(c["done"])

        def body(c):
            turn = c["turn"]
            key, k_sample, k_env = jax.random.split(c["key"], 3)
            st = c["state"]
            actions_left = self.max_actions_per_episode - st.time
            seg, seg_len = jax.vmap(te.render_ids, in_axes=(0, None, 0, 0, 0))(
                st, turn + 1, actions_left, c["prev_reward"], c["prev_closed"])
            # A turn is started only if its segment and at least one sampled token fit in T_max.
            room = t_max - c["pos"] - seg_len
            live = ~c["done"]
            overflow = live & (room < 1)
            active = live & ~overflow
            seg_len = jnp.where(active, seg_len, 0)
            budget = jnp.clip(room, 0, max_new)

            tokens = _write_rows(c["tokens"], c["pos"], seg, seg_len)
            gen_start = c["pos"] + seg_len
            if self.teacher is None:
                valid = jnp.arange(seg.shape[1])[None, :] < seg_len[:, None]
                logits, cache = sampler.prefill(model, c["cache"], seg, valid)
                out = sampler.decode(
                    model, cache, logits, k_sample, max_new_tokens=max_new, budget=budget, active=active,
                    temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, greedy=cfg.greedy,
                    use_top_p=(cfg.top_p < 1.0) and not cfg.greedy, stop_ids=(IM_END, ENDOFTEXT),
                    stop_table=stop_table)
            else:
                out = self._teach(st, turn + 1, k_sample, active, budget)
            n_gen = out.lengths
            tokens = _write_rows(tokens, gen_start, out.tokens, n_gen)
            loss_mask = _write_rows(c["loss_mask"], gen_start, jnp.ones(out.tokens.shape, bool), n_gen)
            logprobs = _write_rows(c["logprobs"], gen_start, out.logprobs, n_gen)

            # Parse exactly what was sampled, behind the forced <think>/<answer> of the segment.
            parsed = jax.vmap(self.parser.parse)(
                jnp.concatenate([forced, out.tokens], axis=1), len(self.forced) + n_gen)

            def execute(carry, a):
                st, rew, n_exec, n_eff = carry
                do = active & (a < parsed.num_actions)
                step_keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(k_env, a), r))(rows)
                _, st2, r, _, info = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(
                    step_keys, st, parsed.actions[:, a], env_params)
                executed = do & ~st.done  # the env itself ignores actions once the episode ended
                rew = rew + jnp.where(do, r, 0.0)
                n_exec = n_exec + executed.astype(jnp.int32)
                n_eff = n_eff + (executed & info["action_is_effective"].astype(bool)).astype(jnp.int32)
                return (_tree_where(do, st2, st), rew, n_exec, n_eff), None

            (st, env_rew, n_exec, n_eff), _ = jax.lax.scan(
                execute, (st, jnp.zeros((b,), jnp.float32), zeros_i, zeros_i), jnp.arange(self.max_actions))
            bad_format = active & (parsed.has_invalid | (parsed.num_actions == 0))
            turn_rew = jnp.where(active, env_rew + jnp.where(bad_format, cfg.format_penalty, 0.0), 0.0)

            last_tok = jnp.take_along_axis(out.tokens, jnp.maximum(n_gen - 1, 0)[:, None], axis=1)[:, 0]
            turn_end = c["turn_end"].at[:, turn].set(jnp.where(active & (n_gen > 0), gen_start + n_gen - 1, -1))
            done = c["done"] | overflow | (active & st.done) | (turn + 1 >= self.max_turns)
            return dict(
                turn=turn + 1,
                key=key,
                state=st,
                cache=out.cache,
                tokens=tokens,
                loss_mask=loss_mask,
                logprobs=logprobs,
                pos=gen_start + n_gen,
                done=done,
                # The "Reward:" line of the next turn shows this turn's reward, penalty included.
                prev_reward=jnp.where(active, turn_rew, c["prev_reward"]),
                prev_closed=jnp.where(active, (n_gen > 0) & (last_tok == IM_END), c["prev_closed"]),
                turn_end=turn_end,
                turn_reward=c["turn_reward"].at[:, turn].set(turn_rew),
                all_valid=c["all_valid"] & ~bad_format,
                num_actions=c["num_actions"] + n_exec,
                num_effective=c["num_effective"] + n_eff,
                num_turns=c["num_turns"] + active.astype(jnp.int32),
                num_format_errors=c["num_format_errors"] + bad_format.astype(jnp.int32),
                response_length=c["response_length"] + n_gen,
                truncated=c["truncated"] | overflow,
            )

        c = jax.lax.while_loop(cond, body, carry)
        success = jax.vmap(env.is_success, in_axes=(0, None))(c["state"], env_params)
        return Trajectories(
            tokens=c["tokens"],
            length=c["pos"],
            loss_mask=c["loss_mask"],
            logprobs=c["logprobs"],
            turn_end=c["turn_end"],
            turn_reward=c["turn_reward"],
            reward=jnp.sum(c["turn_reward"], axis=1),
            group=jnp.repeat(jnp.arange(n_grp, dtype=jnp.int32), n_per),
            seed=seeds,
            success=success.astype(bool),
            action_is_valid=c["all_valid"] & (c["num_turns"] > 0),
            num_actions=c["num_actions"],
            num_effective=c["num_effective"],
            num_turns=c["num_turns"],
            num_format_errors=c["num_format_errors"],
            response_length=c["response_length"],
            truncated=c["truncated"],
        )


def group_seeds_for_iteration(iteration: int, num_groups: int, base: int = 10000) -> np.ndarray:
    """The reference's training seeds: group g of iteration i starts from seed base + P*i + g."""
    return base + num_groups * int(iteration) + np.arange(num_groups, dtype=np.int64)
