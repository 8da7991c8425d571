"""Supervised fine-tuning on solver demonstrations: the warm start RL can begin from.

    trainer = SFTTrainer(load_config("sokoban.py", overrides), workdir)
    trainer.train()          # demos -> validation -> epochs of SFT -> validation -> <workdir>/policy
    # then: launch/tpu_train.py ... --config.model.init_from=<workdir>

1. Demonstrations are made ON DEVICE by the compiled rollout in teacher mode (`Rollout(None, ...,
   teacher=get_teacher(...))`), so they are in exactly the conversation format the policy later
   samples in, loss mask included (1 on the assistant's tokens only). Seeds `sft.demo_seed + i`,
   generated in chunks so memory stays bounded whatever `sft.num_demos` is.
2. Which demos are trained on: Sokoban keeps only successful episodes (the reference fine-tuned on
   BFS-solver SOLUTIONS; a failed Sokoban demo is a room the budget cannot solve, whose moves
   would teach nothing useful). FrozenLake keeps all: the teacher's action in a given state does
   not depend on later slips, so dropping unlucky episodes would only shrink and skew the data
   toward easy maps. Bandit keeps a subset in which exactly the fraction `sft.bandit_high_prob`
   pulls the high-risk arm (`balance_arm_choices`): the per-episode draws are noisy (512 draws at
   0.5 once gave 55.9%), and that accident would leak an arm preference into a warm start meant to
   teach the format only (temperature-0.5 evaluation sharpened 55.9% into an 82% preference).
3. Loss: mean negative log-likelihood of the assistant's tokens, token-mean per mini-batch, with
   the RL update's alignment (column t is the log-prob of token t+1, mask = loss_mask[:, 1:]).
   AdamW from `make_optimizer(sft.lr, optim)` (constant or cosine-decayed: `sft.lr_schedule`), `sft.epochs` epochs of shuffled mini-batches of
   `sft.batch_size`, the batch sharded over the mesh's data axes. Two exact speed-ups: the
   prefix every demo shares (system prompt + instructions) is run once per batch, not per row
   (`sft.shared_prefix`), and each batch comes from one length bucket and is padded only to its
   width (`sft.length_bucket`; the last partial batch of each bucket is dropped: one static shape,
   one compilation, per bucket). Where demos share more than that prefix (Bandit's 246 demos show one
   of 2 prompts: ~217 tokens before a ~22-token answer), each batch runs each distinct prompt once
   and every row only its answer (`sft.group_prompts`, `prompt_groups`; trainer/group_prefix.py).
4. Orbax checkpoints every `sft.save_every` steps; rerunning the same command resumes (demos and
   the epoch permutations are deterministic functions of the config, so they are regenerated
   rather than stored). The final parameters are exported with `save_policy`.
5. LoRA (`model.lora_rank > 0`): the state holds the adapters and their optimizer state only; the
   frozen base is a non-donated argument of the step; the exports are the merged policy and
   `<workdir>/adapter` (PEFT layout), from which an RL run can continue (`model.init_from`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from ragen_jax.models import on_mesh
from ragen_jax.rollout import Rollout, rollout_metrics
from ragen_jax.rollout.metrics import host_copy
from ragen_jax.rollout.rollout import turn_blocks
from ragen_jax.rollout.teachers import get_teacher
from ragen_jax.algorithms import losses as loss_lib
from ragen_jax.infra.preemption import STOP
from ragen_jax.experiment.assembly import RunAssembly
from ragen_jax.experiment.config import Config, ConfigError
from ragen_jax.evaluation.suite import log_validation, validate_run
from ragen_jax.trainer.group_prefix import GroupShape, grouped_hidden, hidden_at, split_groups
from ragen_jax.trainer.optim import make_optimizer
from ragen_jax.trainer.step import accumulated_value_and_grad, effective_micro_batch, full_params
from ragen_jax.trainer.turn_blocks import TurnBlocks

# Config keys that may change when an SFT run is resumed (everything else must match the saved run).
RESUMABLE_CHANGES = ("sft.epochs", "sft.save_every", "train.val_every", "train.keep_checkpoints",
                     "train.log_samples", "model.remat", "model.remat_policy", "model.attention",
                     "sft.micro_batch_size")
DEMO_FILTERS = ("auto", "success", "all")
BATCH_AXES = ("data", "fsdp")


@struct.dataclass
class SFTState:
    step: jax.Array  # int32: optimizer steps taken (also the data position: epoch = step // steps_per_epoch)
    params: Any  # nnx.State of the policy (with LoRA: its adapters)
    opt_state: Any


@struct.dataclass
class Demos:
    """Demonstration episodes as host arrays, the time axis cut to the longest one (rounded up).

    The first `prefix_len` tokens are the same in every demo and hold no assistant token: the
    trainer runs them through the model once per batch (`sft.shared_prefix`). `width[i]`: the
    padded length of demo i after that prefix, i.e. its length bucket (`sft.length_bucket`)."""

    tokens: np.ndarray  # [N, T] int32
    loss_mask: np.ndarray  # [N, T] bool: the teacher's (= assistant's) tokens
    length: np.ndarray  # [N] int32
    prefix_len: int = struct.field(pytree_node=False, default=0)
    width: np.ndarray | None = None  # [N] int32, multiples of sft.length_bucket (or all T - prefix_len)
    max_targets: int = struct.field(pytree_node=False, default=0)  # the most loss-carrying targets of a demo
    group: np.ndarray | None = None  # [N] int32: each demo's prompt (`prompt_groups`), when batches share them
    # The static bounds of the grouped forward and the most distinct prompts any batch holds.
    grouping: tuple[int, GroupShape] | None = struct.field(pytree_node=False, default=None)

    @property
    def num(self) -> int:
        return int(self.tokens.shape[0])


def shared_prefix_length(tokens: np.ndarray, loss_mask: np.ndarray, length: np.ndarray) -> int:
    """Length P of the token prefix all rows share that can be computed once for a batch: common to
    every row, with no assistant token at or right after it (position P's token is predicted from
    the prefix's last hidden state, which the shared forward does not return), and shorter than
    every row."""
    same = np.all(tokens == tokens[:1], axis=0)
    p = int(np.argmin(same)) if not same.all() else tokens.shape[1]
    any_loss = loss_mask.any(axis=0)
    if any_loss.any():
        p = min(p, int(np.argmax(any_loss)) - 1)
    return max(0, min(p, int(length.min()) - 1))


def prompt_groups(tokens: np.ndarray, loss_mask: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group [N] int32, prompt length [N]): demos with the same tokens before their first assistant
    token (the whole row when it has none) are one group, numbered in order of first appearance."""
    first = np.where(loss_mask.any(axis=1), np.argmax(loss_mask, axis=1), length).astype(np.int32)
    keys: dict[bytes, int] = {}
    group = np.array([keys.setdefault(tokens[i, :first[i]].tobytes(), len(keys)) for i in range(len(first))],
                     np.int32)
    return group, first


def prompt_grouping(tokens, loss_mask, length, rows_per_pass: int, padded_cost: float):
    """(group [N], (most groups in a pass, `GroupShape`)) of demos whose passes are cheaper with each
    distinct prompt run once, or None. A pass of `rows_per_pass` rows then runs at most min(rows,
    prompts) beginnings of `width` tokens and every row's `tail` tokens after its prompt, against
    `padded_cost` tokens per pass without. Both bounds hold for every demo, so every pass fits."""
    group, first = prompt_groups(tokens, loss_mask, length)
    t = tokens.shape[1]
    shape = GroupShape(width=min(t, -(-int(first.max()) // 8) * 8),
                       tail=min(t, -(-int((length - first).max(initial=1)) // 8) * 8))
    g = min(rows_per_pass, int(group.max()) + 1)
    if g * shape.width + rows_per_pass * shape.tail >= padded_cost:
        return None
    return group, (g, shape)


def unfold_turn_rows(tokens, loss_mask, length, turn_start, prefix_len: int, width: int, pad_id: int):
    """Single-turn demonstrations (prompt.context_window_mode="single_turn"): each taken turn of each
    episode becomes its own row, the shared prompt prefix followed by that turn's block (segment and
    answer, at most `width` tokens), which is exactly the context the policy answers that turn from.
    The blocks are the trainer's (`turn_blocks.TurnBlocks.unfold`). Host arrays: tokens and loss_mask
    [N, T], length [N], turn_start [N, M] (-1: not taken) -> rows [R, L] (L: the longest row; pad
    pad_id, mask False) and their lengths [R], episode-major, turns in order."""
    t = tokens.shape[1]
    blocks = TurnBlocks(start=np.asarray(turn_start, np.int32), prefix=prefix_len, width=width)
    ids, ok, pos = jax.device_get(blocks.unfold(jnp.asarray(tokens), jnp.arange(t)[None, :] < length[:, None]))
    n, m = turn_start.shape
    mask = np.asarray(loss_mask)[np.repeat(np.arange(n), m)[:, None], np.minimum(pos.reshape(n * m, -1), t - 1)] & ok
    taken = ok.any(axis=1)
    prefix = np.broadcast_to(np.asarray(tokens[0, :prefix_len], np.int32), (int(taken.sum()), prefix_len))
    rows = np.concatenate([prefix, np.where(ok, ids, pad_id)[taken]], axis=1).astype(np.int32)
    rows_mask = np.concatenate([np.zeros(prefix.shape, bool), mask[taken]], axis=1)
    lengths = (prefix_len + ok.sum(axis=1)[taken]).astype(np.int32)
    # Cut to the longest row, not the longest possible block: SFT's widest length bucket pads to the
    # rows' width (CPU demo: 113 instead of 128 columns after the prefix, a cheaper step, same loss).
    w = int(lengths.max(initial=prefix_len))
    return rows[:, :w], rows_mask[:, :w], lengths


def length_buckets(suffix_len: np.ndarray, bucket: int, full: int, batch_size: int) -> np.ndarray:
    """Width (padded length) of each demo: its length rounded up to a multiple of `bucket` (capped at
    `full`, which `bucket=0` gives everyone), with groups smaller than a batch merged into the next
    wider one (the widest into the one below), so every group fills at least one batch."""
    n = len(suffix_len)
    if bucket <= 0 or n < 2 * batch_size:
        return np.full(n, full, np.int32)
    w = np.minimum(-(-suffix_len // bucket) * bucket, full).astype(np.int32)
    widths = np.unique(w)
    groups, members = [], []
    for x in widths:  # narrowest first: a too-small group pads up into the next
        members.extend(np.flatnonzero(w == x))
        if len(members) >= batch_size:
            groups.append((x, members))
            members = []
    if members:  # the widest leftovers join the widest full group, which then pads to their width
        x, prev = groups.pop()
        groups.append((widths[-1], prev + members))
    out = np.empty(n, np.int32)
    for x, m in groups:
        out[m] = x
    return out


def bucketed_batches(width: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """One epoch's batches of demo rows: each width's rows shuffled and cut into full batches (the
    last partial batch of each width dropped: static shapes), then all batches shuffled together.
    A pure function of (seed, epoch), so a resumed run replays the same data."""
    rng = np.random.default_rng([seed, epoch])
    batches = []
    for w in np.unique(width):
        rows = rng.permutation(np.flatnonzero(width == w))
        batches.extend(rows[i * batch_size:(i + 1) * batch_size] for i in range(len(rows) // batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


# ----------------------------------------------------------------------------------- the loss
def _chunk_logp_hit(logits_fn, h, y):
    z = logits_fn(h).astype(jnp.float32)
    picked = jnp.take_along_axis(z, y[..., None], axis=-1)[..., 0]
    # Ties count as hits; the metric only says whether greedy decoding could reproduce the token.
    return picked - jax.nn.logsumexp(z, axis=-1), picked >= jnp.max(z, axis=-1)


def token_logprobs_and_hits(graphdef, params, tokens, valid, chunk: int = 128, vocab=None, prefix=None,
                            columns=None, group=None, grouping=None):
    """`sequence_logprobs` (same alignment: column t is about token t+1) plus whether each target is
    the argmax, for the token-accuracy metric at no extra logits pass. Like
    `losses.token_logprobs_and_entropy`, the time axis is walked in checkpointed chunks so neither
    pass holds [B, T, V] logits. `vocab`: the VocabMap of a small-vocabulary model (tokens stay Qwen ids).
    `prefix` [P] (Qwen ids): tokens that precede every row, run through the model once.
    `columns` [B, K] int32: only those target columns of each row, [B, K] (the head runs K times a row).
    `group` [B] int32 with `grouping` (at most how many groups, `GroupShape`): rows of a group share
    their beginning (`prompt_grouping`), which runs once per group (trainer/group_prefix.py); the
    rows must fit the shape (`prompt_grouping` sizes it for every demo)."""
    model = nnx.merge(graphdef, params)
    ids = tokens if vocab is None else vocab.model_ids(tokens)
    y = ids[:, 1:]
    if group is not None:
        b, t = ids.shape
        cols = jnp.broadcast_to(jnp.arange(t - 1, dtype=jnp.int32), (b, t - 1)) if columns is None else columns
        p = 0 if prefix is None else prefix.shape[0]
        if p:  # the whole rows: each group's beginning holds the shared prefix once
            pre = prefix if vocab is None else vocab.model_ids(prefix)
            ids = jnp.concatenate([jnp.broadcast_to(pre, (b, p)), ids], axis=1)
            valid = jnp.concatenate([jnp.ones((b, p), bool), valid], axis=1)
        rows = split_groups(ids, valid, group, *grouping)
        g_hidden, hidden = grouped_hidden(model.model, rows)
        h = hidden_at(rows, g_hidden, hidden, cols + p)
    else:
        shared = None
        if prefix is not None:
            shared = model.prefix_kv(prefix if vocab is None else vocab.model_ids(prefix))
        hidden, _ = model(ids, valid, None, prefix=shared)
        h = hidden[:, :-1]
        if columns is not None:
            h = jnp.take_along_axis(h, columns[..., None], axis=1)
    if columns is not None:
        y = jnp.take_along_axis(y, columns, axis=1)
    return loss_lib.map_time_chunks(lambda h, y: _chunk_logp_hit(model.logits, h, y), h, y, chunk)


def sft_target_mask(loss_mask, length):
    """[B, T-1] float32: the targets that carry loss (assistant tokens inside the row's length)."""
    valid = jnp.arange(loss_mask.shape[1])[None, :] < length[:, None]
    return (loss_mask[:, 1:] & valid[:, 1:]).astype(jnp.float32)


def sft_loss(graphdef, params, prefix, tokens, loss_mask, length, vocab=None, norm=None, max_targets: int = 0,
             group=None, grouping=None):
    """(token-mean NLL over the assistant's tokens, metrics). tokens/loss_mask [B, T], length [B]
    (the rows after `prefix`, a [P] sequence shared by all rows, or None; see `shared_prefix_length`
    for why the row's first token carries no loss). An all-zero mask gives loss 0 (and zero
    gradients), not a division by zero. `norm`: the token count to divide by instead of this batch's
    (the whole batch's, when these rows are one micro-batch of it: the loss and metrics then add up).
    `max_targets` K > 0: no row has more than K loss-carrying targets; the head runs only at those
    (`sft.head_at_targets`), the same loss. `group`, `grouping`: each distinct prompt of the rows runs
    once (`token_logprobs_and_hits`), the same loss."""
    t = tokens.shape[1]
    valid = jnp.arange(t)[None, :] < length[:, None]
    mask = sft_target_mask(loss_mask, length)
    columns = None
    if 0 < max_targets < t - 1:
        # Each row's target columns first, in order (a stable sort of "carries no loss"), then padding.
        columns = jnp.argsort(mask == 0, axis=1, stable=True)[:, :max_targets].astype(jnp.int32)
        mask = jnp.take_along_axis(mask, columns, axis=1)
    logp, hit = token_logprobs_and_hits(graphdef, params, tokens, valid, vocab=vocab, prefix=prefix, columns=columns,
                                        group=group, grouping=grouping)
    n = jnp.maximum(jnp.sum(mask), 1.0) if norm is None else norm
    loss = -jnp.sum(logp * mask) / n
    return loss, {"sft/token_accuracy": jnp.sum(hit * mask) / n, "sft/tokens": jnp.sum(mask)}


def balance_arm_choices(high: np.ndarray, high_prob: float) -> np.ndarray:
    """Keep mask over Bandit demos (`high[i]`: demo i pulled the high-risk arm) selecting the largest
    subset in which the high-arm fraction is EXACTLY `high_prob` (as a fraction a/b with b <= 1000:
    t*a high and t*(b-a) low demos, t as large as the demos allow), earliest demos first."""
    high = np.asarray(high, bool)
    frac = Fraction(float(high_prob)).limit_denominator(1000)
    a, b = frac.numerator, frac.denominator
    n_hi, n_lo = int(high.sum()), int((~high).sum())
    t = min(n_hi // a if a else n_lo // b, n_lo // (b - a) if b - a else n_hi // b)
    keep = np.zeros(high.shape, bool)
    keep[np.flatnonzero(high)[: t * a]] = True
    keep[np.flatnonzero(~high)[: t * (b - a)]] = True
    return keep


# ----------------------------------------------------------------------------------- trainer
class SFTTrainer(RunAssembly):
    """Args:
      cfg: the experiment config (`cfg.sft` drives this trainer; model/env/prompt/rollout/mesh as RL).
      workdir: run directory (checkpoints/, tb/, metrics.jsonl, demos.json, policy/).
      demo_chunk: demonstration episodes per compiled teacher rollout (bounds device memory).
      demo_filter: "auto" (successful Sokoban demos only, arm-balanced Bandit demos, all FrozenLake
        ones; see the module docstring),
        "success" or "all".
    """

    RESUMABLE_CHANGES = RESUMABLE_CHANGES

    def __init__(self, cfg: Config, workdir: str | Path, *, quiet: bool = False, devices=None,
                 demo_chunk: int = 256, demo_filter: str = "auto"):
        if demo_filter not in DEMO_FILTERS:
            raise ConfigError(f"demo_filter={demo_filter!r} is not valid; choose one of {', '.join(DEMO_FILTERS)}")
        if not isinstance(demo_chunk, int) or demo_chunk < 1:
            raise ConfigError(f"demo_chunk must be a positive integer, got {demo_chunk!r}")
        self.micro_batch = effective_micro_batch(cfg.sft.batch_size, cfg.sft.micro_batch_size)
        super().__init__(cfg, workdir, quiet=quiet, devices=devices, train_env=cfg.env.name,
                         check_shards=self._check_shards, build_on_mesh=False)
        cfg = self.cfg
        self.teacher = get_teacher(cfg.env.name, self.text_env, high_prob=cfg.sft.bandit_high_prob)
        self.demo_filter = demo_filter
        self.keep_only_successful = (self.teacher.keep_only_successful if demo_filter == "auto"
                                     else demo_filter == "success")
        # Demo chunks: a multiple of the data-parallel devices (the rollout shards its batch).
        chunk = min(demo_chunk, cfg.sft.num_demos)
        self.demo_chunk = -(-chunk // self.n_batch_shards) * self.n_batch_shards
        demo_cfg = dataclasses.replace(cfg.rollout, num_groups=self.demo_chunk, group_size=1, groups_per_pass=0)  # teacher: no sampling
        self.demo_rollout = Rollout(None, self.text_env, demo_cfg, mesh=self.mesh, teacher=self.teacher)

        params = self.take_trainable()
        # The schedule is fixed before the demos exist, so it plans for all of them (an upper bound).
        planned = cfg.sft.epochs * max(1, cfg.sft.num_demos // cfg.sft.batch_size)
        self.tx = make_optimizer(cfg.sft.lr, cfg.optim,
                                 decay_steps=planned if cfg.sft.lr_schedule == "cosine" else None)
        state = SFTState(step=self.replicated(jnp.zeros((), jnp.int32)), params=params,
                         opt_state=self.put(self.tx.init(params)))
        self.batch_sharding = NamedSharding(self.mesh, PartitionSpec(BATCH_AXES))
        state_shardings = jax.tree.map(lambda x: x.sharding, state)
        self.trace_count = 0
        # The state is donated: parameters and optimizer state exist once on the devices, updated in place.
        # Traced on the mesh: the splash kernel's shard_map reads it (models/attention.py `partitioned`).
        self.step_fn = jax.jit(on_mesh(self.step_body, self.mesh), out_shardings=(state_shardings, None),
                               donate_argnums=(0,))
        self.loss_fn = jax.jit(on_mesh(self._batch_loss, self.mesh))
        self.validates = cfg.train.val_every > 0
        self.restore_or_start(state)
        self.demos: Demos | None = None
        self._epoch_batches: dict = {}
        self._prefix_dev = None
        self._steps_per_epoch = 0
        self.demo_stats: dict = {}

    def _check_shards(self, n: int) -> None:
        cfg = self.cfg
        if cfg.sft.batch_size % n:
            raise ConfigError(f"sft.batch_size = {cfg.sft.batch_size} is not divisible by the {n} devices "
                              "of the mesh's data x fsdp axes; change sft.batch_size or mesh.data/mesh.fsdp")
        if self.micro_batch % n:
            raise ConfigError(f"sft.micro_batch_size = {self.micro_batch} is not divisible by the {n} "
                              "devices of the mesh's data x fsdp axes; change sft.micro_batch_size or mesh.data/mesh.fsdp")
        if cfg.train.val_every > 0 and cfg.train.val_size % n:
            raise ConfigError(f"train.val_size={cfg.train.val_size} is not divisible by the {n} "
                              "data-parallel devices of the mesh")

    @property
    def step(self) -> int:
        return int(self.state.step)

    # -- demonstrations --------------------------------------------------------------------------
    def make_demos(self) -> Demos:
        """Generate `sft.num_demos` teacher episodes on device; keep the training ones (see module doc)."""
        s = self.cfg.sft
        c = self.demo_chunk
        n_chunks = -(-s.num_demos // c)
        parts = []
        for i in tqdm(range(n_chunks), desc="demos", disable=self.quiet or jax.process_index() != 0,
                      dynamic_ncols=True):
            seeds = s.demo_seed + i * c + np.arange(c)
            traj = self.demo_rollout(None, jax.random.fold_in(jax.random.PRNGKey(s.demo_seed), i), seeds)
            parts.append(host_copy(traj))  # gathered from every process when the batch spans several
        traj = jax.tree.map(lambda *xs: np.concatenate(xs)[: s.num_demos], *parts)
        stats = {f"demo/{k}": v for k, v in rollout_metrics(traj, 1).items()
                 if k not in ("in_group_std", "in_group_std_max", "pass_at_n", "reward_std")}
        if self.keep_only_successful:
            keep = np.asarray(traj.success)
        elif self.teacher.kind == "bandit_arm" and self.demo_filter == "auto":
            keep = balance_arm_choices(np.asarray(traj.success), s.bandit_high_prob)  # success = high arm
        else:
            keep = np.ones(s.num_demos, bool)
        stats["demo/num_generated"] = float(s.num_demos)
        stats["demo/num_kept"] = float(keep.sum())
        if keep.sum() < s.batch_size:
            raise ConfigError(f"only {int(keep.sum())} of {s.num_demos} demonstrations are usable"
                              f"{' (successful)' if self.keep_only_successful else ''}, fewer than "
                              f"sft.batch_size={s.batch_size}; raise sft.num_demos")
        if self.vocab is not None:  # a small task vocabulary must express every demonstrated token
            sampled = np.unique(np.asarray(traj.tokens)[np.asarray(traj.loss_mask)])
            missing = sampled[self.vocab.to_qwen[self.vocab.to_model[sampled]] != sampled]
            if missing.size:
                raise ConfigError(f"model.vocab='task' lacks the demonstration tokens "
                                  f"{self.tokenizer.convert_ids_to_tokens(missing[:8].tolist())}; "
                                  "add their texts to the task vocabulary")
        length = np.asarray(traj.length)[keep].astype(np.int32)
        tokens, loss_mask = np.asarray(traj.tokens)[keep].astype(np.int32), np.asarray(traj.loss_mask)[keep]
        if self.cfg.prompt.single_turn:  # one row per turn: the prefix and that turn only
            tokens, loss_mask, length = unfold_turn_rows(tokens, loss_mask, length, np.asarray(traj.turn_start)[keep],
                                                         *turn_blocks(self.text_env), pad_id=self.text_env.pad_id)
            stats["demo/turn_rows"] = float(len(length))
            if len(length) < s.batch_size:
                raise ConfigError(f"only {len(length)} demonstration turns, fewer than sft.batch_size={s.batch_size}; "
                                  "raise sft.num_demos")
        # Cut the time axis to the longest demo (rounded up to 64): no compute on the empty tail of max_context.
        t = int(min(tokens.shape[1], -(-int(length.max()) // 64) * 64))
        tokens = np.pad(tokens, ((0, 0), (0, max(0, t - tokens.shape[1]))), constant_values=self.text_env.pad_id)[:, :t]
        loss_mask = np.pad(loss_mask, ((0, 0), (0, max(0, t - loss_mask.shape[1]))))[:, :t]
        p = shared_prefix_length(tokens, loss_mask, length) if s.shared_prefix else 0
        width = length_buckets(length - p, s.length_bucket, t - p, s.batch_size)
        # Targets carry loss at column c when token c + 1 is the assistant's (`sft_target_mask`).
        targets = int((loss_mask[:, 1:] & (np.arange(1, t)[None, :] < length[:, None])).sum(axis=1).max())
        grouped = None
        # With several processes too: the grouped step is one straight-line program (no conditional around
        # its collectives, unlike the RL passes' fallback, `group_prefix.group_shape_of`), and the groups
        # are computed here from the demos, which every process generates identically.
        if s.group_prompts:
            # Tokens a pass runs without prompt groups: the rows after the prefix, padded to their bucket.
            padded = self.micro_batch * float(np.mean(width)) + p
            grouped = prompt_grouping(tokens, loss_mask, length, self.micro_batch, padded)
        self.demos = Demos(tokens=tokens, loss_mask=loss_mask, length=length, prefix_len=p, width=width,
                           max_targets=-(-max(targets, 1) // 8) * 8, group=None if grouped is None else grouped[0],
                           grouping=None if grouped is None else grouped[1])
        self._epoch_batches, self._prefix_dev = {}, None
        b = s.batch_size
        self._steps_per_epoch = sum(int(n) // b for n in np.unique(width, return_counts=True)[1])
        stats["demo/max_length"] = float(length.max())
        stats["demo/shared_prefix"] = float(p)
        stats["demo/num_widths"] = float(len(np.unique(width)))
        stats["demo/prompt_groups"] = 0.0 if grouped is None else float(grouped[0].max() + 1)
        self.demo_stats = stats
        return self.demos

    # -- the compiled step -----------------------------------------------------------------------
    def step_body(self, state: SFTState, prefix, tokens, loss_mask, length, frozen=None, group=None):
        """One optimizer step; `group` [B]: the rows' prompt groups (`put_group`), or None."""
        self.trace_count += 1  # runs only while tracing: counts compilations (one per batch width)
        norm = jnp.maximum(jnp.sum(sft_target_mask(loss_mask, length)), 1.0)  # the whole batch's tokens
        grouping = self.grouping if group is not None else None

        def loss_fn(p, rows):
            tokens, loss_mask, length, *g = rows
            return sft_loss(self.policy_graph, full_params(p, frozen), prefix, tokens, loss_mask, length, self.vocab,
                            norm=norm, max_targets=self.max_targets, group=g[0] if g else None, grouping=grouping)

        n_micro = tokens.shape[0] // self.micro_batch
        rows = (tokens, loss_mask, length) if group is None else (tokens, loss_mask, length, group)
        (loss, m), grads = accumulated_value_and_grad(loss_fn, state.params, rows, n_micro)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        m = {**m, "sft/loss": loss, "sft/grad_norm": optax.global_norm(grads)}
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), m

    def _batch_loss(self, params, prefix, tokens, loss_mask, length, group=None):
        return sft_loss(self.policy_graph, params, prefix, tokens, loss_mask, length, self.vocab, group=group,
                        grouping=self.grouping if group is not None else None)

    def put_batch(self, idx):
        """Device arrays (prefix [P] or None, tokens [B, W], loss_mask [B, W], length [B]) of demo rows
        `idx`: the rows after the shared prefix, padded to the widest row's bucket width W."""
        d = self.demos
        idx = np.asarray(idx)
        p, w = d.prefix_len, int(d.width[idx].max())
        rows = (d.tokens[idx, p:p + w], d.loss_mask[idx, p:p + w], d.length[idx] - p)
        if self._prefix_dev is None and p:  # the same for every batch: put on the devices once
            self._prefix_dev = jax.device_put(d.tokens[0, :p], NamedSharding(self.mesh, PartitionSpec()))
        return (self._prefix_dev, *(jax.device_put(x, self.batch_sharding) for x in rows))

    def put_group(self, idx):
        """The prompt groups [B] of demo rows `idx` on the devices, or None without prompt groups."""
        d = self.demos
        return None if d.group is None else jax.device_put(d.group[np.asarray(idx)], self.batch_sharding)

    def _group_kw(self, idx) -> dict:
        # Passed only when there are groups: a call with group=None would be a second cache entry
        # (a retrace) beside the positional calls that mean the same program.
        group = self.put_group(idx)
        return {} if group is None else {"group": group}

    @property
    def grouping(self):
        """The demos' (most groups in a pass, `GroupShape`), or None; read when the step is traced."""
        return None if self.demos is None else self.demos.grouping

    def train_step(self, idx) -> dict:
        """One optimizer step on demo rows `idx` (length sft.batch_size); returns host metrics."""
        idx = np.asarray(idx)
        self.state, m = self.step_fn(self.state, *self.put_batch(idx), *self.frozen_args, **self._group_kw(idx))
        return {k: float(v) for k, v in host_copy(m).items()}

    def loss(self, idx) -> tuple[float, dict]:
        """The SFT loss and metrics of demo rows `idx` at the current parameters (no update)."""
        idx = np.asarray(idx)
        loss, m = self.loss_fn(self.params, *self.put_batch(idx), **self._group_kw(idx))
        return float(loss), {k: float(v) for k, v in host_copy(m).items()}

    @property
    def params(self):
        """The policy's whole parameter state (with LoRA: the frozen base and the current adapters)."""
        return full_params(self.state.params, self.frozen)

    @property
    def max_targets(self) -> int:
        """`sft_loss`' max_targets for the compiled step (0: the head at every position)."""
        return self.demos.max_targets if self.cfg.sft.head_at_targets and self.demos is not None else 0

    def steps_per_epoch(self) -> int:
        """Full batches per epoch: each width's demos // sft.batch_size, summed (see `bucketed_batches`)."""
        return self._steps_per_epoch

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        if epoch not in self._epoch_batches:
            self._epoch_batches = {epoch: bucketed_batches(self.demos.width, self.cfg.sft.batch_size,
                                                           self.cfg.train.seed, epoch)}
        return self._epoch_batches[epoch]

    def batch_indices(self, step: int) -> np.ndarray:
        """Demo rows of optimizer step `step` (see `epoch_batches`)."""
        epoch, k = divmod(int(step), self.steps_per_epoch())
        return self.epoch_batches(epoch)[k]

    # -- validation -------------------------------------------------------------------------------
    def validate(self) -> dict:
        """The run's validation, the same as the RL trainer's (`evaluation.validate_run`)."""
        return validate_run(self.cfg, self.policy, self.params, self.tokenizer, mesh=self.mesh, vocab=self.vocab)

    def _log_validation(self, step):
        return log_validation(self, step)

    # -- the run -----------------------------------------------------------------------------------
    def train(self, max_steps: int | None = None) -> list[dict]:
        """Run (or resume) the SFT; `max_steps` stops early after that many steps of this call
        (without the final export), as an interruption would. Returns the per-step metrics.
        SIGTERM / SIGINT (`infra.preemption`): the current step finishes, a checkpoint is saved and
        `self.interrupted` names the signal (the same command resumes)."""
        self.save_run_files()  # process 0
        self.open_logger()
        with STOP.installed():
            try:
                return self._run(max_steps)
            finally:
                self.ckpt.wait()
                self.logger.close()

    def _run(self, max_steps: int | None) -> list[dict]:
        cfg = self.cfg
        history = []
        t0 = time.perf_counter()
        self.make_demos()
        start = self.step
        self.demo_stats["timing/demos_s"] = time.perf_counter() - t0
        if start == 0:  # logged once: a resumed run regenerates the same demos
            self.logger.scalars(start, self.demo_stats)
        if jax.process_index() == 0:
            (self.workdir / "demos.json").write_text(json.dumps(self.demo_stats, indent=2, sort_keys=True))
        d = self.demo_stats
        self.note(f"demos: {int(d['demo/num_kept'])}/{int(d['demo/num_generated'])} kept, success "
                  f"{d['demo/success']:.3f}, reward {d['demo/reward_mean']:.3f}, actions "
                  f"{d['demo/num_actions']:.2f}, turns {d['demo/num_turns']:.2f}")
        total = cfg.sft.epochs * self.steps_per_epoch()
        if self.stop_requested():
            return history
        if start > 0:
            self.note(f"resuming {self.workdir} from step {start}")
        if self.validates and start == 0:
            history.append({"step": 0, **self._log_validation(0)})
        end = total if max_steps is None else min(total, start + max_steps)
        bar = tqdm(range(start, end), initial=start, total=total, desc="sft",
                   disable=self.quiet or jax.process_index() != 0, dynamic_ncols=True)
        for s in bar:
            t1 = time.perf_counter()
            metrics = self.train_step(self.batch_indices(s))
            metrics["sft/epoch"] = s / self.steps_per_epoch()
            metrics["timing/step_s"] = time.perf_counter() - t1
            step = s + 1
            self.logger.scalars(step, metrics)
            bar.set_postfix(loss=f"{metrics['sft/loss']:.4f}", acc=f"{metrics['sft/token_accuracy']:.3f}")
            history.append({"step": step, **metrics})
            if step == total and self.validates:  # logged before the last checkpoint, which then covers it
                history.append({"step": total, **self._log_validation(total)})
            interrupted = self.stop_requested()  # every process, at the same point
            if step % cfg.sft.save_every == 0 or step == total or interrupted:
                self.logger.flush()  # TensorBoard's buffered events reach the disk before the checkpoint
                self.ckpt.save(step, self.state, extra={"step": step})
            if interrupted:
                self.ckpt.wait()
                self.note(f"stopped by {self.interrupted} after step {step}: checkpoint saved; rerun the same "
                          "command to resume")
                return history
        if self.step >= total:
            # Every process takes part: a collective save.
            self.export_policy(self.state.params)
        return history


__all__ = ["Demos", "SFTState", "SFTTrainer", "bucketed_batches", "length_buckets", "prompt_groups", "prompt_grouping",
           "shared_prefix_length", "sft_loss",
           "token_logprobs_and_hits"]
