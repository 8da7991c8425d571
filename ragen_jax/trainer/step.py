"""StarPO / StarPO-S training: rollout -> group filter -> logprobs/values -> advantages -> PPO/GRPO update.

One iteration, read top to bottom (`Trainer.iteration`):

    traj  = rollout(actor, key, seeds(i))                  compiled: every turn of P x N episodes
    batch = prepare(actor, critic, ref, traj)              compiled: StarPO-S filter, old/ref logprobs,
                                                           sampler/trainer mismatch (+ TIS weights),
                                                           values, rewards on tokens, advantages
    state = update(state, batch)                           compiled: epochs x mini-batches of PPO
                                                           (clip-higher, dual clip) + critic steps

All three are jitted once with the mesh's shardings (params by the model's sharding table, the batch
over the data axes) and never recompile.

LoRA (`model.lora_rank > 0`): the train state holds only what trains (the actor's adapters; the
critic's adapters and value head) and its optimizer state; the frozen base is one more argument of
`prepare` and `update` (`frozen`, never donated, shared by actor, critic and reference: LoRA leaves
the base untouched, so the critic's trunk base IS the actor's). `full_params(trainable, frozen)`
rebuilds a model's whole parameter state inside the programs; without LoRA `frozen` is None and the
trainable part is the whole model. Token-level arrays in `prepare`/`update` are aligned on
TARGETS: column t holds what is known about token t+1 (its log-prob comes from the logits at t).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from ragen_jax.experiment.config import Config, ConfigError
from ragen_jax.experiment.sections import AdvantageConfig, BatchingConfig, FilterConfig, LossConfig
from ragen_jax.trainer.group_prefix import GroupShape, assemble, grouped_hidden, next_token_inputs, split_groups
from ragen_jax.trainer.optim import lr_at
from ragen_jax.trainer.turn_blocks import TurnBlocks, fold_columns, over_taken_blocks
from ragen_jax.algorithms import advantages as adv_lib
from ragen_jax.algorithms import filters as filter_lib
from ragen_jax.algorithms import losses as loss_lib
from ragen_jax.algorithms import mismatch as mismatch_lib


# ----------------------------------------------------------------------------------- state
@struct.dataclass
class TrainState:
    iteration: jax.Array  # int32: completed iterations (also the data position: seeds derive from it)
    key: jax.Array  # PRNG key for the next iteration
    actor: Any  # nnx.State of the policy (with LoRA: its adapters)
    actor_opt: Any
    critic: Any  # nnx.State of the critic ({} without one; with LoRA: its adapters and value head)
    critic_opt: Any
    skipped_updates: jax.Array  # int32: optimizer steps skipped for a non-finite gradient


@struct.dataclass
class Batch:
    """The filtered trajectories, ready for the update. K kept rows; token arrays [K, T-1]."""

    tokens: jax.Array  # [K, T]
    valid: jax.Array  # [K, T]
    mask: jax.Array  # [K, T-1] bool: target token was sampled by the policy
    old_logp: jax.Array  # [K, T-1]
    ref_logp: jax.Array  # [K, T-1] (zeros when KL is off)
    values: jax.Array  # [K, T-1] (zeros without a critic)
    advantages: jax.Array  # [K, T-1]
    returns: jax.Array  # [K, T-1]
    row_weight: jax.Array  # [K] 1 for rows that train, 0 for padding rows of variance_cover
    turn_start: jax.Array | None = None  # [K, M] single-turn records only (`TurnBlocks`)
    tis_weight: jax.Array | None = None  # [K, T-1] truncated importance weights (loss.tis); None: off
    group: jax.Array | None = None  # [K] int32: each row's group slot (group-shared scoring, `group_prefix`)


def after(x: jax.Array, *deps: jax.Array) -> jax.Array:
    """`x` unchanged, but computed only once every array of `deps` is: a data dependency XLA keeps (a
    float times 0 is not folded: NaN and inf would not give 0; `where` makes it exactly 0 for them too).

    Group-shared scoring puts each model pass in a conditional, which XLA:CPU may finish asynchronously
    while the next collective (ordered by start only) already runs; across processes (gloo, one tag per
    device group) two collectives in flight take each other's messages (`group_prefix.group_shape_of`).
    The passes that would otherwise run side by side (actor, reference, critic) are chained by this."""
    z = sum(jnp.sum(d.astype(jnp.float32)) for d in deps)
    return x + jnp.where(jnp.isfinite(z), z * 0.0, 0.0).astype(x.dtype)


# ----------------------------------------------------------------------------------- LoRA split
def full_params(trainable, frozen):
    """A model's whole parameter state from its trained part and the frozen base (LoRA), or the
    trained part itself when there is no frozen base (full fine-tuning). No array is copied."""
    return trainable if frozen is None else nnx.merge_state(trainable, frozen)


def critic_frozen(frozen):
    """The critic's frozen base within the actor's: the trunk (the critic has no output layer)."""
    return None if frozen is None else nnx.State({"model": frozen["model"]})


# ----------------------------------------------------------------------------------- forward helpers
def sequence_logprobs(graphdef, params, tokens, valid, chunk: int = 128, vocab=None, temperature: float = 1.0,
                      inference: bool = False, blocks: TurnBlocks | None = None, prefix: int = 0, groups=None):
    """Per-target log-probs and entropies [K, T-1], never materialising [K, T, V] logits.

    `vocab`: optional VocabMap of a small-vocabulary model; tokens stay Qwen ids outside the model.
    `temperature`: the logits are divided by it, as the sampler does (and verl's actor, which divides
    by the rollout temperature): the PPO ratio and the entropy are then those of the policy that
    actually sampled the tokens, and `old_logp` equals the rollout's recorded log-probs.
    `inference`: no gradient will be taken through this call (the no-grad passes), which lets the
    model pick a lighter memory layout (models/qwen2/model.py `scan_layers`); same numbers.
    `blocks`: single-turn records; each turn is scored behind the prefix alone (`TurnBlocks`).
    `prefix`: full-context records whose first `prefix` tokens are the same in every row (the prompt
    prefix): that part runs through the model once for the batch (`prefixed_forward`), its gradient
    gathered from every row; the numbers are those of the per-row forward.
    `groups`: (group [K] int32, at most how many groups the rows hold, `GroupShape`): each group's
    shared beginning runs once (trainer/group_prefix.py), when the rows fit its shape; else `prefix`.
    """
    model = nnx.merge(graphdef, params)
    to_model = (lambda x: x) if vocab is None else vocab.model_ids
    logits_fn = model.logits if temperature == 1.0 else (lambda h: model.logits(h) / temperature)
    if blocks is None and groups is not None:
        ids = to_model(tokens)
        rows = split_groups(ids, valid, *groups)

        def grouped():
            g_hidden, hidden = grouped_hidden(model.model, rows, inference)
            lp_g, ent_g = loss_lib.token_logprobs_and_entropy(g_hidden[:, :-1], rows.group_ids[:, 1:], logits_fn,
                                                              chunk=chunk)
            lp_t, ent_t = loss_lib.token_logprobs_and_entropy(next_token_inputs(rows, g_hidden, hidden), rows.tail_ids,
                                                              logits_fn, chunk=chunk)
            w = tokens.shape[1] - 1
            return assemble(rows, lp_g, lp_t, w, 1), assemble(rows, ent_g, ent_t, w, 1)

        return jax.lax.cond(rows.fits, grouped, lambda: sequence_logprobs(
            graphdef, params, tokens, valid, chunk, vocab, temperature, inference, None, prefix))
    if blocks is None:
        ids = to_model(tokens)
        if prefix:
            p_hidden, hidden = prefixed_forward(model, ids, valid, prefix, inference)
            k = ids.shape[0]
            # Targets 1..P-1 depend on the prefix alone: scored once, the same in every row.
            lp_p, ent_p = loss_lib.token_logprobs_and_entropy(p_hidden[None, :-1], ids[:1, 1:prefix], logits_fn,
                                                              chunk=chunk)
            # Targets P..T-1: from the prefix's last position and every row's own positions.
            h = jnp.concatenate([jnp.broadcast_to(p_hidden[-1], (k, 1, p_hidden.shape[-1])), hidden[:, :-1]], axis=1)
            lp, ent = loss_lib.token_logprobs_and_entropy(h, ids[:, prefix:], logits_fn, chunk=chunk)
            return (jnp.concatenate([jnp.broadcast_to(lp_p, (k, prefix - 1)), lp], axis=1),
                    jnp.concatenate([jnp.broadcast_to(ent_p, (k, prefix - 1)), ent], axis=1))
        hidden, _ = model(ids, valid, None, inference=inference)
        return loss_lib.token_logprobs_and_entropy(hidden[:, :-1], ids[:, 1:], logits_fn, chunk=chunk)
    ids, ok, pos = blocks.unfold(to_model(tokens), valid)
    shared = model.prefix_kv(to_model(tokens[0, :blocks.prefix]))

    def score(ids, ok):
        hidden, _ = model(ids, ok, None, prefix=shared, inference=inference)
        return loss_lib.token_logprobs_and_entropy(hidden[:, :-1], ids[:, 1:], logits_fn, chunk=chunk)

    logp, ent = over_taken_blocks(score, ids, ok, blocks.num_chunks, blocks.shards)
    width = tokens.shape[1] - 1
    return fold_columns(logp, pos, 1, width), fold_columns(ent, pos, 1, width)


def prefixed_forward(model, ids, valid, prefix: int, inference: bool = False):
    """(final hidden states of the shared prefix [P, H], of every row's positions after it [K, T-P, H])
    of records [K, T] whose first `prefix` ids are the same in every row: the prefix runs once and
    the rows attend to its keys/values (`PrefixKV`), exactly the per-row forward of the whole record."""
    trunk = model.model  # the policy's or the critic's decoder (hidden states, not logits or values)
    p_hidden, shared = trunk.prefix_forward(ids[0, :prefix], inference=inference)
    hidden, _ = trunk(ids[:, prefix:], valid[:, prefix:], None, shared, inference=inference)
    return p_hidden, hidden


def sequence_values(graphdef, params, tokens, valid, vocab=None, inference: bool = False,
                    blocks: TurnBlocks | None = None, prefix: int = 0, groups=None):
    """Critic values aligned on targets: V at position t is the value before sampling token t+1.
    `prefix`, `groups`: as `sequence_logprobs` (the shared prompt prefix, the groups' beginnings)."""
    critic = nnx.merge(graphdef, params)
    to_model = (lambda x: x) if vocab is None else vocab.model_ids
    if blocks is None and groups is not None:
        rows = split_groups(to_model(tokens), valid, *groups)

        def grouped():
            g_hidden, hidden = grouped_hidden(critic.model, rows, inference)
            v = assemble(rows, critic.values(g_hidden).astype(jnp.float32), critic.values(hidden).astype(jnp.float32),
                         tokens.shape[1] - 1, 0)
            return v

        return jax.lax.cond(rows.fits, grouped, lambda: sequence_values(
            graphdef, params, tokens, valid, vocab, inference, None, prefix))
    if blocks is None:
        if prefix:
            p_hidden, hidden = prefixed_forward(critic, to_model(tokens), valid, prefix, inference)
            v_p = jnp.broadcast_to(critic.values(p_hidden), (tokens.shape[0], prefix))
            return jnp.concatenate([v_p, critic.values(hidden)[:, :-1]], axis=1).astype(jnp.float32)
        return critic(to_model(tokens), valid, inference=inference)[:, :-1].astype(jnp.float32)
    ids, ok, pos = blocks.unfold(to_model(tokens), valid)
    shared = critic.prefix_kv(to_model(tokens[0, :blocks.prefix]))
    v = over_taken_blocks(lambda i, o: critic(i, o, inference=inference, prefix=shared).astype(jnp.float32),
                          ids, ok, blocks.num_chunks, blocks.shards)
    return fold_columns(v, pos, 0, tokens.shape[1] - 1)


def effective_micro_batch(mini_batch_size: int, micro_batch_size: int) -> int:
    """Rows per forward/backward pass: `micro_batch_size`, or the whole mini-batch when it is 0."""
    return micro_batch_size or mini_batch_size


def split_rows(tree, n: int):
    """Rows [R, ...] -> [n, R // n, ...]: block j holds rows j, j + n, j + 2n, ... (strided, not
    contiguous). The rows arrive sharded in contiguous blocks over the batch devices; strided blocks
    keep every block spread over all of them (a contiguous cut would put each block on few devices)."""
    return jax.tree.map(lambda a: a.reshape((a.shape[0] // n, n) + a.shape[1:]).swapaxes(0, 1), tree)


def join_rows(tree):
    """Inverse of `split_rows`: [n, R // n, ...] -> [R, ...] in the original row order."""
    return jax.tree.map(lambda a: a.swapaxes(0, 1).reshape((a.shape[0] * a.shape[1],) + a.shape[2:]), tree)


def in_minibatches(fn, n_rows: int, mb: int, *arrays):
    """Apply `fn` to row blocks of `mb` (bounds activation memory of the no-grad passes); the blocks
    are strided (`split_rows`)."""
    if mb >= n_rows:
        return fn(*arrays)
    out = jax.lax.map(lambda xs: fn(*xs), split_rows(tuple(arrays), n_rows // mb))
    return join_rows(out)


def consecutive_block_order(n_rows: int, mb: int) -> np.ndarray:
    """The row order under which `split_rows`' strided blocks of `mb` rows are the consecutive blocks
    [0, mb), [mb, 2 mb), ... of the original order: block j of `arrays[order]` is rows j*mb .. j*mb+mb-1."""
    n = max(n_rows // mb, 1)
    return np.arange(n_rows).reshape(n, n_rows // n).T.reshape(-1)


def in_consecutive_blocks(fn, n_rows: int, mb: int, *arrays):
    """`in_minibatches` over blocks of consecutive rows: what a group-major batch needs for a block to
    hold few whole groups (group-shared scoring). The rows are permuted in and out (device-side
    gathers); the strided split then still spreads every block over the batch devices."""
    if mb >= n_rows:
        return fn(*arrays)
    order = consecutive_block_order(n_rows, mb)
    out = in_minibatches(fn, n_rows, mb, *(jnp.take(a, order, axis=0) for a in arrays))
    return jax.tree.map(lambda a: jnp.take(a, np.argsort(order), axis=0), out)


def loss_norms(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The denominators of `agg_loss` for a whole mini-batch: (masked tokens, rows with a masked
    token), each at least 1. Micro-batch losses divided by these sum to the mini-batch's loss."""
    m = mask.astype(jnp.float32)
    return jnp.maximum(jnp.sum(m), 1.0), jnp.maximum(jnp.sum(jnp.any(mask, axis=-1)).astype(jnp.float32), 1.0)


def accumulated_value_and_grad(loss_fn, params, batch, n_micro: int):
    """`jax.value_and_grad(loss_fn, has_aux=True)(params, batch)` computed over `n_micro` micro-batches
    of rows (`split_rows`) under a `lax.scan`, the loss, metrics and gradients SUMMED: only one
    micro-batch's activations are alive at a time. `loss_fn` must make its micro-batch loss and
    metrics additive, i.e. normalise by the whole batch (`loss_norms`) rather than by its own rows;
    then the sum equals the single-pass value (up to float summation order)."""
    vg = jax.value_and_grad(loss_fn, has_aux=True)
    if n_micro == 1:
        return vg(params, batch)
    micro = split_rows(batch, n_micro)
    shapes = jax.eval_shape(vg, params, jax.tree.map(lambda x: x[0], micro))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(acc, mb):
        return jax.tree.map(jnp.add, acc, vg(params, mb)), None

    out, _ = jax.lax.scan(body, zeros, micro)
    return out


def _apply_update(tx, grads, params, opt_state):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _keep(grads, params, opt_state):
    return params, opt_state


# ----------------------------------------------------------------------------------- the programs
@dataclasses.dataclass(frozen=True)
class StepSettings:
    """What the compiled step reads: the four algorithm sections, and the few rollout, prompt and
    optimizer facts it needs (not the whole `Config`, so the step's inputs are visible here)."""

    advantage: AdvantageConfig
    loss: LossConfig
    filter: FilterConfig
    batching: BatchingConfig
    num_groups: int  # P of the rollout batch P x N
    group_size: int  # N
    # Log-probs and entropy are of the policy the rollout sampled from: logits / rollout temperature.
    temperature: float
    single_turn: bool  # prompt.context_window_mode == "single_turn": records are turn blocks
    shared_prefix: bool  # rollout.shared_prefix: the passes run the records' prompt prefix once per batch
    actor_lr: float  # only for the logged actor/lr
    warmup_steps: int

    @classmethod
    def of(cls, cfg: Config) -> StepSettings:
        r = cfg.rollout
        return cls(advantage=cfg.advantage, loss=cfg.loss, filter=cfg.filter, batching=cfg.batching,
                   num_groups=r.num_groups, group_size=r.group_size,
                   temperature=1.0 if r.greedy else float(r.temperature), single_turn=cfg.prompt.single_turn,
                   shared_prefix=r.shared_prefix,
                   actor_lr=cfg.optim.actor_lr, warmup_steps=cfg.optim.warmup_steps)


class StepPrograms:
    """The compiled `prepare` and `update` programs of one config (built once per run)."""

    def __init__(self, settings: StepSettings, actor_graph, critic_graph, actor_opt, critic_opt, vocab=None,
                 turn_blocks: tuple[int, int] | None = None, batch_shards: int = 1, shared_prefix: int = 0,
                 group_prefix: GroupShape | None = None):
        """`settings`: `StepSettings.of(config)`. `turn_blocks`:
        (prefix length, block width) of single-turn records (`TurnBlocks`;
        `ragen_jax.rollout.rollout.turn_blocks(text_env)`), required when
        `prompt.context_window_mode="single_turn"`. `batch_shards`: the data-parallel devices the
        rows are sharded over (`over_taken_blocks` compacts turn blocks within each one).
        `shared_prefix`: the length of the prompt prefix every full-context record starts with
        (`turn_blocks(text_env)[0]`): the passes run it once per batch; 0 runs every row whole.
        `group_prefix`: the `GroupShape` of full-context records (`group_prefix.group_shape`): calls
        whose rows hold fewer groups than rows run each group's shared beginning once."""
        if not isinstance(settings, StepSettings):
            raise TypeError("StepPrograms takes StepSettings.of(config), not a whole Config")
        s = self.settings = settings
        self.vocab = vocab
        if s.single_turn and turn_blocks is None:
            raise ConfigError("prompt.context_window_mode='single_turn' needs StepPrograms(turn_blocks=(prefix "
                              "length, block width)), from ragen_jax.rollout.rollout.turn_blocks(text_env)")
        self.turn_blocks = turn_blocks if s.single_turn else None
        # Full-context records share the prompt prefix (single-turn blocks carry their own).
        self.shared_prefix = int(shared_prefix) if s.shared_prefix and not s.single_turn else 0
        if self.shared_prefix == 1:  # a one-token prefix has no target of its own to share
            self.shared_prefix = 0
        self.group_prefix = group_prefix if self.shared_prefix else None
        self.skip_untaken = True  # `TurnBlocks.skip_untaken`; False only to measure the plain pass against it
        self.batch_shards = batch_shards
        self.actor_graph, self.critic_graph = actor_graph, critic_graph
        self.actor_opt, self.critic_opt = actor_opt, critic_opt
        self.has_critic = critic_graph is not None
        self.use_ref = s.loss.kl_coef > 0
        self.temperature = s.temperature
        self.filter_spec = s.filter.spec
        self.kept_groups = self.filter_spec.slots(s.num_groups)  # static group slots (some may be unused)
        self.kept_rows = self.filter_spec.kept_rows(s.num_groups, s.group_size)
        self.trace_counts = {"prepare": 0, "update": 0}

    def _blocks(self, turn_start) -> TurnBlocks | None:
        if self.turn_blocks is None:
            return None
        return TurnBlocks(start=turn_start, prefix=self.turn_blocks[0], width=self.turn_blocks[1],
                          skip_untaken=self.skip_untaken, shards=self.batch_shards)

    def _groups(self, group, rows: int, groups: int):
        """`sequence_logprobs`' `groups` for a call of `rows` rows holding at most `groups` groups, or
        None where sharing cannot pay (as many groups as rows, or no `group_prefix`)."""
        if self.group_prefix is None or groups >= rows:
            return None
        return group, groups, self.group_prefix

    def _contiguous_groups(self, rows: int, total: int) -> int:
        """Groups a block of `rows` consecutive rows of a group-major batch of `total` rows holds (the
        no-grad passes' blocks start at multiples of `rows`)."""
        n = self.settings.group_size
        return min(total // n, rows // n if rows % n == 0 else rows // n + 2)

    def _per_rows(self, fn, total: int, block: int):
        """`fn(tokens, valid, blocks=..., prefix=..., groups=...)` as a function of row arrays (tokens,
        valid, turn_start, group) in blocks of `block` of `total` group-major rows, the form
        `in_consecutive_blocks` splits."""
        groups = self._contiguous_groups(min(block, total), total)
        return lambda x, v, ts, g: fn(x, v, blocks=self._blocks(ts), prefix=self.shared_prefix,
                                      groups=self._groups(g, x.shape[0], groups))

    # -- prepare: filter + no-grad passes + advantages --------------------------------------
    def prepare(self, actor, critic, ref, traj, frozen=None) -> tuple[Batch, dict]:
        """`frozen`: the LoRA base (None without LoRA); `ref` is then the reference's adapters."""
        self.trace_counts["prepare"] += 1
        bt = self.settings.batching
        n = self.settings.group_size
        if self.turn_blocks is not None and traj.turn_start is None:
            raise ValueError("single-turn training needs Trajectories.turn_start (recorded by the Rollout)")
        # Every pass takes (tokens, valid, turn_start); turn_start is a dummy without single-turn blocks.
        ts_all = traj.turn_start if self.turn_blocks is not None else jnp.zeros((traj.tokens.shape[0], 1), jnp.int32)
        logp_fn = functools.partial(sequence_logprobs, self.actor_graph, full_params(actor, frozen), vocab=self.vocab,
                                    temperature=self.temperature, inference=True)
        micro = effective_micro_batch(bt.mini_batch_size, bt.micro_batch_size)
        # Group filter (StarPO-S / RAGEN-2) on raw rewards, static slots; unselected slots get row
        # weight 0. Entropy metrics need every row's entropy: the old-log-prob pass then runs over
        # all P x N rows before filtering (the rollout records no entropy) and its kept rows are
        # reused, instead of a pass over the kept rows after it.
        spec = self.filter_spec
        inputs = {"reward": traj.reward, "length": traj.response_length}
        all_logp = None
        if spec.input_name == "entropy":
            b, t_all = traj.tokens.shape
            valid_all = jnp.arange(t_all)[None, :] < traj.length[:, None]
            all_logp, all_ent = in_consecutive_blocks(self._per_rows(logp_fn, b, micro), b, min(micro, b),
                                                      traj.tokens, valid_all, ts_all, jnp.arange(b, dtype=jnp.int32) // n)
            m_all = traj.loss_mask[:, 1:].astype(jnp.float32)
            inputs["entropy"] = jnp.sum(all_ent * m_all, -1) / jnp.maximum(jnp.sum(m_all, -1), 1.0)
        f = filter_lib.filter_by_spec(spec, inputs, n)
        t = filter_lib.gather_rows(traj, f.rows)
        ts = jnp.take(ts_all, f.rows, axis=0)
        k, t_max = t.tokens.shape
        valid = jnp.arange(t_max)[None, :] < t.length[:, None]
        mask = t.loss_mask[:, 1:] & (f.row_weight[:, None] > 0)
        mb = min(micro, k)
        group = jnp.arange(k, dtype=jnp.int32) // n  # kept rows are whole groups, group by group
        rows = (t.tokens, valid, ts, group)

        if all_logp is None:
            old_logp, _ = in_consecutive_blocks(self._per_rows(logp_fn, k, mb), k, mb, *rows)
        else:
            old_logp = jnp.take(all_logp, f.rows, axis=0)

        def rows_after(*deps):  # the passes one after another where each is a conditional (`after`)
            return rows if self.group_prefix is None else (after(t.tokens, *deps), *rows[1:])

        ref_logp = jnp.zeros_like(old_logp)
        if self.use_ref:
            ref_fn = functools.partial(sequence_logprobs, self.actor_graph, full_params(ref, frozen), vocab=self.vocab,
                                       temperature=self.temperature, inference=True)
            ref_logp, _ = in_consecutive_blocks(self._per_rows(ref_fn, k, mb), k, mb, *rows_after(old_logp))
        values = jnp.zeros_like(old_logp)
        if self.has_critic:
            val_fn = functools.partial(sequence_values, self.critic_graph, full_params(critic, critic_frozen(frozen)),
                                       vocab=self.vocab, inference=True)
            values = in_consecutive_blocks(self._per_rows(val_fn, k, mb), k, mb, *rows_after(old_logp, ref_logp))
        values = jnp.where(mask, values, 0.0)

        tis_weight, metrics = self._importance_weights(t, mask, old_logp)
        advantages, returns, adv_metrics = self._advantages(t, f, mask, old_logp, ref_logp, values)
        batch = Batch(tokens=t.tokens, valid=valid, mask=mask, old_logp=old_logp, ref_logp=ref_logp,
                      values=values, advantages=advantages, returns=returns, row_weight=f.row_weight,
                      turn_start=ts if self.turn_blocks is not None else None, tis_weight=tis_weight,
                      group=group if self.group_prefix is not None else None)
        metrics.update(adv_metrics)
        metrics.update(f.metrics)
        metrics.update({
            "critic/values_mean": adv_lib.masked_mean(values, mask),
            "critic/returns_mean": adv_lib.masked_mean(returns, mask),
            "actor/advantages_mean": adv_lib.masked_mean(advantages, mask),
            "actor/advantages_abs_mean": adv_lib.masked_mean(jnp.abs(advantages), mask),
        })
        return batch, metrics

    def _importance_weights(self, t, mask, old_logp):
        """(TIS weights [K, T-1] or None, metrics) of the kept rows `t`: the sampler's recorded log-probs
        against the trainer's `old_logp` over the tokens that train (`mask`). The mismatch/ metrics are
        computed whatever `loss.tis` is; the weights only with TIS on (the programs are unchanged without)."""
        lo = self.settings.loss
        # The rollout records each sampled token's log-prob at its own position; target column t is token t+1.
        sampler_logp = t.logprobs[:, 1:]
        metrics = mismatch_lib.mismatch_metrics(old_logp, sampler_logp, mask, lo.effective_tis_cap)
        if lo.tis == "none":
            return None, metrics
        weight, tm = mismatch_lib.tis_weights(old_logp, sampler_logp, mask, lo.tis, lo.effective_tis_cap,
                                              tuple(lo.tis_geo_mask) or None)
        return weight, {**metrics, **tm}

    def _advantages(self, t, f, mask, old_logp, ref_logp, values):
        """(advantages, returns, metrics) of the kept rows `t` of filter result `f`."""
        s = self.settings
        adv, lo, flt, n = s.advantage, s.loss, s.filter, s.group_size
        metrics = {}
        # Trajectory scores normalised within each initial-state group (identity for PPO), placed
        # on the last sampled token (or per turn). Turn ends move to target coordinates (index - 1).
        scores = adv_lib.normalize_rewards(t.reward, n, adv.reward_norm)
        turn_end = jnp.where(t.turn_end >= 1, t.turn_end - 1, -1)
        tok_rewards = adv_lib.token_rewards(mask, turn_end, t.turn_reward, scores, mode=adv.reward_placement)
        if self.use_ref and lo.kl_in_reward:
            tok_rewards, klm = loss_lib.kl_in_reward(tok_rewards, old_logp, ref_logp, mask, lo.kl_coef, lo.kl_type)
            metrics.update({f"actor/{k_}": v for k_, v in klm.items()})
        inputs = {"turn_end": turn_end, **self._gigpo_inputs(t, f, turn_end)}
        advantages, returns, est_metrics = adv_lib.compute_advantages(
            adv.record.name, tok_rewards, mask, values=values, group_size=n, gamma=adv.gamma, lam=adv.lam,
            options=adv.estimator_options, with_metrics=True, **inputs)
        metrics.update(est_metrics)
        # RAGEN-2 after the advantages: soft reweighting by group std (GRPO only: the config refuses it
        # with other estimators, as RAGEN applies it only there), then the kept-fraction scale (both on
        # the advantages only; the critic's returns are untouched, as RAGEN).
        if adv.soft_reweight:
            w = filter_lib.soft_reweight(scores, n, f.group_used)
            advantages = advantages * jnp.repeat(w, n)[:, None]
            metrics["actor/soft_reweight_mean"] = jnp.sum(w) / jnp.maximum(jnp.sum(f.group_used), 1)
        if flt.loss_scaling != "none":
            scale = filter_lib.loss_scale(f.kept_fraction, flt.loss_scaling)
            advantages = advantages * scale
            metrics["actor/filter_loss_scale"] = scale
        return advantages, returns, metrics

    def _gigpo_inputs(self, t, f, turn_end) -> dict:
        """GiGPO's extra inputs (none for the other estimators): the rollout's per-turn observation keys
        and rewards. The turns of rows the filter dropped (weight 0) are marked not taken, so they join
        no anchor group, no episode statistics and no gigpo/ metric."""
        adv = self.settings.advantage
        if not adv.needs_state_keys:
            return {}
        if t.state_key is None:
            raise ValueError(f"advantage.estimator={adv.estimator!r} needs Trajectories.state_key: build the Rollout "
                             "with state_keys=True (the Trainer does)")
        return {"turn_end": jnp.where(f.row_weight[:, None] > 0, turn_end, -1), "turn_reward": t.turn_reward,
                "state_key": t.state_key}

    # -- update: epochs x mini-batches ---------------------------------------------------------
    def _actor_loss(self, params, mb: Batch, norms, frozen=None):
        """Loss and metrics of (a micro-batch of) a mini-batch; `norms` = `loss_norms` of the whole
        mini-batch, so that micro-batch values add up to the mini-batch's (token-mean weighs each
        micro-batch by its masked tokens, the seq-mean modes by its rows). The masked-mean metrics
        are weighted by the micro-batch's share of the masked tokens for the same reason."""
        lo = self.settings.loss
        tok_norm, row_norm = norms
        norm = tok_norm if lo.agg == "token-mean" else row_norm
        share = jnp.sum(mb.mask.astype(jnp.float32)) / tok_norm
        logp, entropy = sequence_logprobs(self.actor_graph, full_params(params, frozen), mb.tokens, mb.valid,
                                          vocab=self.vocab, temperature=self.temperature,
                                          blocks=self._blocks(mb.turn_start), prefix=self.shared_prefix,
                                          groups=self.micro_batch_groups(mb))
        pg_loss, pm = loss_lib.ppo_policy_loss(
            logp, mb.old_logp, mb.advantages, mb.mask, eps_low=lo.eps_low, eps_high=lo.eps_high,
            dual_clip=lo.dual_clip, agg_mode=lo.agg, norm=norm, tis_weights=mb.tis_weight)
        ent = loss_lib.entropy_loss(entropy, mb.mask, lo.agg, norm)
        loss = pg_loss - lo.entropy_coef * ent
        m = {f"actor/{k}": (v if k == "pg_loss" else v * share) for k, v in pm.items()}
        m["actor/approx_kl"] = m["actor/ppo_kl"]
        if self.use_ref and not lo.kl_in_reward:
            kl = loss_lib.kl_loss(logp, mb.ref_logp, mb.mask, lo.kl_type, lo.agg, norm)
            loss = loss + lo.kl_coef * kl
            m["actor/kl_loss"] = jax.lax.stop_gradient(kl)
        m["actor/entropy"] = jax.lax.stop_gradient(ent)
        return loss, m

    def _critic_loss(self, params, mb: Batch, norms, frozen=None):
        tok_norm, _ = norms
        share = jnp.sum(mb.mask.astype(jnp.float32)) / tok_norm
        v = sequence_values(self.critic_graph, full_params(params, critic_frozen(frozen)), mb.tokens, mb.valid,
                            vocab=self.vocab, blocks=self._blocks(mb.turn_start), prefix=self.shared_prefix,
                            groups=self.micro_batch_groups(mb))
        loss, m = loss_lib.value_loss(v, mb.values, mb.returns, mb.mask, clip=self.settings.loss.value_clip,
                                      agg_mode="token-mean", norm=tok_norm)
        return loss, {"critic/value_loss": m["vf_loss"], "critic/vf_clipfrac": m["vf_clipfrac"] * share,
                      "critic/vpred_mean": m["vpred_mean"] * share}

    def micro_batch_groups(self, mb: Batch):
        """A micro-batch's rows are drawn from the whole batch's `kept_groups` groups in random order."""
        return None if mb.group is None else self._groups(mb.group, mb.tokens.shape[0], self.kept_groups)

    def actor_value_and_grad(self, params, mbatch: Batch, frozen=None):
        """((loss, metrics), grads) of one mini-batch, over `batching.micro_batch_size` micro-batches.
        With LoRA the gradient is of the adapters alone (`frozen` is a constant of the loss)."""
        bt = self.settings.batching
        n_micro = bt.mini_batch_size // effective_micro_batch(bt.mini_batch_size, bt.micro_batch_size)
        norms = loss_norms(mbatch.mask)
        return accumulated_value_and_grad(lambda p, b: self._actor_loss(p, b, norms, frozen), params, mbatch, n_micro)

    def critic_value_and_grad(self, params, mbatch: Batch, frozen=None):
        bt = self.settings.batching
        n_micro = bt.mini_batch_size // effective_micro_batch(bt.mini_batch_size, bt.micro_batch_size)
        norms = loss_norms(mbatch.mask)
        return accumulated_value_and_grad(lambda p, b: self._critic_loss(p, b, norms, frozen), params, mbatch, n_micro)

    def update(self, state: TrainState, batch: Batch, frozen=None) -> tuple[TrainState, dict]:
        """`frozen`: the LoRA base (None without LoRA), an argument the caller does not donate."""
        self.trace_counts["update"] += 1
        bt = self.settings.batching
        k = batch.tokens.shape[0]
        mb = bt.mini_batch_size
        n_mb = k // mb
        # verl: `if critic_warmup <= global_steps: update_actor`, with global_steps = 1 on the first
        # iteration; `state.iteration` counts completed iterations, so global_steps = iteration + 1 and
        # critic_warmup = k gives k - 1 critic-only iterations (none for k <= 1).
        train_actor = state.iteration + 1 >= bt.critic_warmup

        def minibatch_step(carry, idx):
            actor, actor_opt, critic, critic_opt, skipped = carry
            mbatch = jax.tree.map(lambda x: x[idx], batch)
            # A mini-batch of filtered-out rows only (weight 0; all of them when the filter kept
            # nothing) takes no optimizer step: Adam's momentum and weight decay would still move.
            has_rows = jnp.any(mbatch.row_weight > 0)
            step_actor = train_actor & has_rows
            (_, am), g = self.actor_value_and_grad(actor, mbatch, frozen)
            gnorm = optax.global_norm(g)
            finite = jnp.isfinite(gnorm)
            # Critic warm-up: the actor's gradient is computed but the actor is not moved. A cond, not
            # a where over both trees: the new parameters and optimizer state exist only in the taken
            # branch, so XLA updates them in place instead of holding an old and a new copy.
            actor, actor_opt = jax.lax.cond(step_actor, functools.partial(_apply_update, self.actor_opt), _keep,
                                             g, actor, actor_opt)
            skipped = skipped + (step_actor & ~finite).astype(jnp.int32)
            am = {**am, "actor/grad_norm": gnorm, "train/optimizer_steps": step_actor.astype(jnp.float32)}
            if self.has_critic:
                # After the actor's gradient where the passes are conditionals (`after`).
                cbatch = mbatch if self.group_prefix is None else mbatch.replace(tokens=after(mbatch.tokens, gnorm))
                (_, cm), cg = self.critic_value_and_grad(critic, cbatch, frozen)
                cnorm = optax.global_norm(cg)
                critic, critic_opt = jax.lax.cond(has_rows, functools.partial(_apply_update, self.critic_opt),
                                                  _keep, cg, critic, critic_opt)
                skipped = skipped + (has_rows & ~jnp.isfinite(cnorm)).astype(jnp.int32)
                am = {**am, **cm, "critic/grad_norm": cnorm}
            return (actor, actor_opt, critic, critic_opt, skipped), (am, has_rows)

        key, perm_key = jax.random.split(state.key)
        carry = (state.actor, state.actor_opt, state.critic, state.critic_opt, state.skipped_updates)
        all_metrics, all_used = [], []
        for epoch in range(bt.ppo_epochs):
            perm = jax.random.permutation(jax.random.fold_in(perm_key, epoch), k)
            # Rows that train first (a stable sort keeps their random order): filtered-out rows fill
            # the last mini-batches, which are skipped, so a partial selection takes
            # ceil(kept rows / mini_batch_size) steps as RAGEN's shrunk batch does. With every row
            # kept (top_k) this is the plain permutation.
            perm = perm[jnp.argsort(batch.row_weight[perm] <= 0, stable=True)]
            carry, (m, used) = jax.lax.scan(minibatch_step, carry, perm.reshape(n_mb, mb))
            all_metrics.append(m)
            all_used.append(used)
        actor, actor_opt, critic, critic_opt, skipped = carry
        # Means over the mini-batches that trained (skipped ones computed on weight-0 rows only).
        w = jnp.concatenate(all_used).astype(jnp.float32)
        metrics = jax.tree.map(lambda *xs: jnp.sum(jnp.concatenate(xs) * w) / jnp.maximum(jnp.sum(w), 1.0),
                               *all_metrics)
        metrics["train/optimizer_steps"] = jnp.sum(jnp.concatenate([m["train/optimizer_steps"] for m in all_metrics]))
        metrics["actor/grad_norm_max"] = jnp.max(jnp.stack([jnp.max(jnp.where(u, m["actor/grad_norm"], 0.0))
                                                            for m, u in zip(all_metrics, all_used)]))
        metrics["train/skipped_updates"] = skipped.astype(jnp.float32)
        metrics["actor/lr"] = lr_at(state.iteration * n_mb * bt.ppo_epochs, self.settings.actor_lr,
                                     self.settings.warmup_steps)
        new_state = state.replace(actor=actor, actor_opt=actor_opt, critic=critic, critic_opt=critic_opt,
                                  skipped_updates=skipped, key=key, iteration=state.iteration + 1)
        return new_state, metrics


def check_batch_fits_mesh(cfg: Config, n_batch_shards: int) -> None:
    r, bt = cfg.rollout, cfg.batching
    b = r.num_groups * r.group_size
    kept = cfg.filter.spec.kept_rows(r.num_groups, r.group_size)
    micro = effective_micro_batch(bt.mini_batch_size, bt.micro_batch_size)
    for what, n in (("rollout batch P*N", b), ("kept trajectories", kept), ("batching.mini_batch_size", bt.mini_batch_size),
                    ("batching.micro_batch_size (0: = mini_batch_size)", micro)):
        if n % n_batch_shards:
            raise ConfigError(f"{what} = {n} is not divisible by the {n_batch_shards} devices of the mesh's "
                              "data x fsdp axes; change the batch settings or mesh.data/mesh.fsdp")


__all__ = ["Batch", "GIB", "StepPrograms", "StepSettings", "TrainState", "accumulated_value_and_grad", "check_batch_fits_mesh", "critic_frozen",
           "consecutive_block_order", "effective_micro_batch", "full_params", "in_consecutive_blocks", "in_minibatches", "join_rows", "loss_norms", "prefixed_forward", "sequence_logprobs",
           "sequence_values", "split_rows"]
