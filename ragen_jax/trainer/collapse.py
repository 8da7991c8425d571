"""Collapse watch of the RL Trainer: the reasoning-collapse probe (`CollapseProbe`), the Echo-Trap
early warning (`EchoTrapMonitor`) and RAGEN-2's early stops (`EarlyStops`).

The probe picks (prompt, reasoning) pairs, scores every reasoning under every prompt in one
compiled pass, and reduces with `algorithms.collapse`.

Every `train.collapse_every` iterations and at iteration 1 (RAGEN-2 collapse_detection: step 1,
then every compute_freq steps), on the rollout batch BEFORE the filter and with the policy that
sampled it:

1. Host (numpy, from the trajectories' host copy): each trajectory's first turn is its first run
   of sampled tokens; the prompt x is everything before it (ending in the forced `<think>`), the
   reasoning z is the sampled tokens before the first `</think>` (found in the tokens' bytes; a
   token that reaches into `</think>` is not part of z), without whitespace-only tokens at either
   end. A turn "has reasoning" when its text before `</think>` is not blank; one without a
   `</think>` has none (RAGEN's regex finds nothing). Differences from RAGEN: z keeps the sampled
   ids (RAGEN decodes, strips and re-tokenizes the text), and x is the conversation as the rollout
   built it, not a re-rendered chat template.
2. Host: up to M = `train.collapse_samples` trajectories with a reasoning, uniformly without
   replacement (RAGEN num_samples), from a generator seeded by (train.seed, iteration): the same
   pairs on every process and on a resumed run. Columns are the P groups (one prompt each: a
   group's rows share their first turn); those with no sampled pair are left out.
3. Device, one compiled program (static shapes: M x P rows of x_cap + z_cap tokens, reused every
   time): rows [x_j | z_i] gathered in-graph from the trajectories' tokens, teacher-forced log-probs
   of z_i's tokens at the rollout temperature (the trainer's log-prob function), summed per row ->
   [M, P] -> `collapse_metrics`.
4. Host: collapse/valid_thinking_rate (turns with a reasoning / turns taken, every turn of every
   trajectory), collapse/first_turn_valid_rate, and the [M, P] metrics when at least two prompts
   were sampled (RAGEN logs none below two).
"""

from __future__ import annotations

import functools
import math
import weakref
from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ragen_jax.algorithms.collapse import collapse_metrics
from ragen_jax.models.qwen2.sharding import batch_sharding, on_mesh
from ragen_jax.text.tokenizer import chat_ids
from ragen_jax.text.tokenizer import token_bytes_table
from ragen_jax.trainer.group_prefix import GroupShape
from ragen_jax.trainer.step import effective_micro_batch, in_consecutive_blocks, sequence_logprobs

CLOSE_THINK = b"</think>"
_PIECES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def token_pieces(tokenizer) -> list[bytes]:
    """Bytes of every token id (a list: joining pieces is the fast path on the host); memoised."""
    try:
        if tokenizer in _PIECES:
            return _PIECES[tokenizer]
    except TypeError:  # not weak-referenceable
        pass
    table, lengths = token_bytes_table(tokenizer)
    pieces = [bytes(table[i, :lengths[i]]) for i in range(len(lengths))]
    try:
        _PIECES[tokenizer] = pieces
    except TypeError:
        pass
    return pieces


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of the runs of True in a 1-D bool array."""
    m = np.concatenate([[False], mask, [False]])
    d = np.flatnonzero(m[1:] != m[:-1])
    return list(zip(d[0::2].tolist(), d[1::2].tolist()))


def reasoning_span(ids: np.ndarray, pieces: list[bytes]) -> tuple[int, int, bool]:
    """One turn's sampled ids -> (offset, length, has_reasoning) of its reasoning tokens: those
    ending before the first `</think>`, whitespace-only tokens trimmed from both ends."""
    bs = [pieces[i] if 0 <= i < len(pieces) else b"" for i in ids.tolist()]
    text = b"".join(bs)
    cut = text.find(CLOSE_THINK)
    if cut < 0 or not text[:cut].strip():
        return 0, 0, False
    ends = np.cumsum([len(b) for b in bs])
    n = int(np.searchsorted(ends, cut, side="right"))  # tokens whose bytes end at or before the cut
    lo, hi = 0, n
    while lo < hi and not bs[lo].strip():
        lo += 1
    while hi > lo and not bs[hi - 1].strip():
        hi -= 1
    return lo, hi - lo, hi > lo


def reasoning_spans(tokens: np.ndarray, loss_mask: np.ndarray, length: np.ndarray, pieces: list[bytes]) -> dict:
    """Per trajectory [B]: x_len (first sampled position = the first turn's prompt length), z_start,
    z_len, first_valid; and turns / turns_with_reasoning over all of its turns."""
    b = tokens.shape[0]
    out = {k: np.zeros(b, np.int32) for k in ("x_len", "z_start", "z_len", "turns", "turns_with_reasoning")}
    out["first_valid"] = np.zeros(b, bool)
    for r in range(b):
        runs = _runs(loss_mask[r, :length[r]])
        out["turns"][r] = len(runs)
        for k, (s, e) in enumerate(runs):
            off, n, ok = reasoning_span(tokens[r, s:e], pieces)
            out["turns_with_reasoning"][r] += ok
            if k == 0:
                out["x_len"][r], out["z_start"][r], out["z_len"][r], out["first_valid"][r] = s, s + off, n, ok
    return out


def sample_pairs(spans: dict, tokens: np.ndarray, group: np.ndarray, num_groups: int, m: int,
                 rng: np.random.Generator, x_cap: int, z_cap: int) -> dict:
    """The pass's inputs (numpy): M pair slots (row, col, z_start, z_len, row_valid), per column
    the representative row and prompt length, which columns were sampled, and prompt equality."""
    ok = spans["first_valid"] & (spans["x_len"] <= x_cap)
    valid_rows = np.flatnonzero(ok)
    take = valid_rows if len(valid_rows) <= m else np.sort(rng.choice(valid_rows, m, replace=False))
    n = len(take)
    plan = {"row": np.zeros(m, np.int32), "z_start": np.zeros(m, np.int32), "z_len": np.zeros(m, np.int32),
            "col": np.zeros(m, np.int32), "row_valid": np.zeros(m, bool)}
    plan["row"][:n] = take
    plan["z_start"][:n] = spans["z_start"][take]
    plan["z_len"][:n] = np.minimum(spans["z_len"][take], z_cap)
    plan["col"][:n] = group[take]
    plan["row_valid"][:n] = True
    # Each group's first row carries its prompt (all rows of a group start from the same state).
    rep = np.array([np.flatnonzero(group == g)[0] for g in range(num_groups)], np.int32)
    x_len = np.minimum(spans["x_len"][rep], x_cap).astype(np.int32)
    prompts = [tokens[rep[g], :x_len[g]].tobytes() for g in range(num_groups)]
    plan["rep"], plan["x_len"] = rep, x_len
    plan["col_valid"] = np.isin(np.arange(num_groups), plan["col"][:n])
    plan["same_prompt"] = np.array([[a == b_ for b_ in prompts] for a in prompts], bool)
    return plan


def _common_length(seqs: list) -> int:
    """Length of the longest run of leading ids all `seqs` share."""
    n = min(len(x) for x in seqs)
    same = np.all([x[:n] == seqs[0][:n] for x in seqs], axis=0)
    return int(n if same.all() else np.argmin(same))


def build_rows(tokens: jax.Array, row, z_start, z_len, rep, x_len, width: int, pad_id: int):
    """[P * M, width] ids and valid mask of the rows [x_j | z_i | pad], gathered in-graph, column-major
    (row j * M + i): the M rows of a prompt x_j are consecutive, so a block of rows holds few prompts."""
    t = jnp.arange(width)[None, None, :]
    xl, zl = x_len[:, None, None], z_len[None, :, None]
    in_x = t < xl
    valid = t < xl + zl
    src_row = jnp.where(in_x, rep[:, None, None], row[None, :, None])
    src_col = jnp.where(in_x, t, z_start[None, :, None] + t - xl)
    src_col = jnp.clip(jnp.where(valid, src_col, 0), 0, tokens.shape[1] - 1)
    ids = jnp.where(valid, tokens[src_row, src_col], pad_id)
    m, p = row.shape[0], rep.shape[0]
    return ids.reshape(p * m, width), valid.reshape(p * m, width)


def prompts_per_block(m: int, p: int, block: int, pad_rows: int) -> int:
    """The most prompts (columns) any block of `block` consecutive rows holds: P x M column-major rows,
    then `pad_rows` copies of the last row (static: bounds the grouped pass's shape)."""
    col = np.concatenate([np.arange(p * m) // m, np.full(pad_rows, p - 1)])
    return max(len(np.unique(col[s:s + block])) for s in range(0, len(col), block))


def cross_logprobs(graphdef, params, tokens, plan: dict, *, width: int, block: int, pad_rows: int,
                   pad_id: int, temperature: float = 1.0, vocab=None, sharding=None, prefix: int = 0,
                   tail: int = 0) -> jax.Array:
    """log p(z_i | x_j) summed over z_i's tokens: [M, P] (jittable; `plan` arrays on the device).
    `tail` > 0: the most tokens of any z_i (its row past the prompt); each block runs each of its
    prompts x_j once and only the rows' z_i after it (`sequence_logprobs`' `groups`), the numbers of
    scoring every row whole. `prefix`: how many leading tokens every prompt x_j shares (the prompt
    prefix): the path of a block whose rows do not fit `tail` runs that once per block instead."""
    ids, valid = build_rows(tokens, plan["row"], plan["z_start"], plan["z_len"], plan["rep"], plan["x_len"], width,
                            pad_id)
    r = ids.shape[0]
    m, p = plan["row"].shape[0], plan["rep"].shape[0]
    col = jnp.arange(r, dtype=jnp.int32) // m
    if pad_rows:  # copies of the last row: its prompt's block stays one that fits; never read
        ids = jnp.concatenate([ids, jnp.broadcast_to(ids[-1:], (pad_rows, width))])
        valid = jnp.concatenate([valid, jnp.broadcast_to(valid[-1:], (pad_rows, width))])
        col = jnp.concatenate([col, jnp.full((pad_rows,), p - 1, jnp.int32)])
    if sharding is not None:
        ids, valid = jax.lax.with_sharding_constraint((ids, valid), (sharding, sharding))
    shape = GroupShape(width=width, tail=tail) if tail else None
    per_block = prompts_per_block(m, p, block, pad_rows)

    def fn(x, v, g):
        groups = None if shape is None else (g, per_block, shape)
        return sequence_logprobs(graphdef, params, x, v, vocab=vocab, temperature=temperature, inference=True,
                                 prefix=prefix, groups=groups)

    logp, _ = in_consecutive_blocks(fn, ids.shape[0], block, ids, valid, col)
    logp = logp[:r].reshape(p, m, width - 1).swapaxes(0, 1)
    # Target column c holds token c + 1: z's tokens are positions [x_len, x_len + z_len).
    c = jnp.arange(width - 1)[None, None, :] + 1
    xl, zl = plan["x_len"][None, :, None], plan["z_len"][:, None, None]
    target = (c >= xl) & (c < xl + zl)
    return jnp.sum(jnp.where(target, logp, 0.0), axis=-1)


def metrics_program(graphdef, params, tokens, plan, **kw):
    logp = cross_logprobs(graphdef, params, tokens, plan, **kw)
    return collapse_metrics(logp, plan["z_len"], plan["col"], plan["row_valid"], plan["col_valid"],
                            plan["same_prompt"])


class CollapseProbe:
    """The diagnostics of one run: `due(step)`, then `probe(actor, traj, host_traj, step)` -> metrics."""

    def __init__(self, cfg, graphdef, tokenizer, text_envs, *, vocab=None, mesh=None, share_prompts: bool = True):
        """`share_prompts=False`: every pair's row scored whole (the work before each block ran its
        prompts once; bench/collapse_probe.py compares the two)."""
        self.cfg = cfg
        self.every = cfg.train.collapse_every
        self.m = min(cfg.train.collapse_samples, cfg.rollout.num_groups * cfg.rollout.group_size)
        self.p = cfg.rollout.num_groups
        self.pieces = token_pieces(tokenizer)
        # Static widths: the first turn's prompt is the prefix plus one segment (at most); the
        # reasoning at most the turn's token budget.
        self.x_cap = max(len(e.prefix_ids) + e.max_segment_len for e in text_envs.values())
        # Every prompt starts with its env's prompt prefix: the part all envs share is run once per
        # block (the pairs' rows are ~80% prefix on Bandit with SmolLM2's chat template).
        self.prefix = _common_length([np.asarray(e.prefix_ids) for e in text_envs.values()])
        self.z_cap = cfg.prompt.max_response_tokens
        self.width = min(self.x_cap + self.z_cap, cfg.rollout.max_context)
        # Each prompt runs once per block and each row only its reasoning (z_cap tokens at most): on
        # Bandit with SmolLM2 the rows are ~90% prompt. With several processes too: its one pass has nothing
        # beside it to order (`step.after`, `group_prefix.group_shape_of`).
        self.tail = self.z_cap if share_prompts else 0
        a = cfg.batching
        rows = self.m * self.p
        self.block = min(effective_micro_batch(a.mini_batch_size, a.micro_batch_size), rows)
        shards = mesh.shape["data"] * mesh.shape["fsdp"] if mesh is not None else 1
        q = self.block * shards // math.gcd(self.block, shards)
        self.pad_rows = -rows % q
        self.mesh = mesh
        temperature = 1.0 if cfg.rollout.greedy else float(cfg.rollout.temperature)
        sharding = batch_sharding(mesh, 2) if mesh is not None else None
        program = functools.partial(
            metrics_program, graphdef, width=self.width, block=self.block, pad_rows=self.pad_rows,
            temperature=temperature, vocab=vocab, sharding=sharding, pad_id=chat_ids(tokenizer).pad, prefix=self.prefix,
            tail=self.tail)
        # Traced on the mesh: the splash kernel's shard_map reads it (models/attention.py `partitioned`).
        self.program = jax.jit(on_mesh(program, mesh) if mesh is not None else program)

    def due(self, step: int) -> bool:
        """RAGEN: step 1, then every `collapse_every` steps (steps count from 1)."""
        return bool(self.every) and (step == 1 or step % self.every == 0)

    def plan(self, host_traj, step: int) -> tuple[dict, dict]:
        """(pass inputs, host metrics) from the trajectories' host copy."""
        spans = reasoning_spans(np.asarray(host_traj.tokens), np.asarray(host_traj.loss_mask),
                                np.asarray(host_traj.length), self.pieces)
        rng = np.random.default_rng([self.cfg.train.seed, step])
        plan = sample_pairs(spans, np.asarray(host_traj.tokens), np.asarray(host_traj.group), self.p, self.m, rng,
                            self.x_cap, self.z_cap)
        turns = int(spans["turns"].sum())
        host = {"collapse/valid_thinking_rate": float(spans["turns_with_reasoning"].sum()) / max(turns, 1),
                "collapse/first_turn_valid_rate": float(spans["first_valid"].mean()),
                "collapse/first_turn_num_valid": float(spans["first_valid"].sum())}
        return plan, host

    def device_plan(self, plan: dict) -> dict:
        """The pass's inputs on the device(s) (replicated over the mesh)."""
        put = (lambda x: jax.device_put(x, NamedSharding(self.mesh, PartitionSpec()))) if self.mesh is not None \
            else jnp.asarray
        return {k: put(v) for k, v in plan.items()}

    def probe(self, actor, traj, host_traj, step: int) -> dict:
        plan, metrics = self.plan(host_traj, step)
        if plan["col_valid"].sum() < 2:
            return metrics
        out = self.program(actor, traj.tokens, self.device_plan(plan))
        metrics.update({k: float(v) for k, v in jax.device_get(out).items()})
        return metrics


class EchoTrapMonitor:
    """Early warning of the Echo Trap (behaviour spec section 6).

    The paper's collapse is preceded by falling in-group reward std and falling token entropy while
    the mean reward still looks fine. Each is compared with its best value in a sliding window: the
    warning fires when both have dropped by at least `drop` (relative) while the reward has not
    dropped below its windowed best by more than `drop`. `score` (logged every iteration) is the
    smaller of the two relative drops: 0 = healthy, towards 1 = collapsing diversity.
    """

    def __init__(self, window: int = 10, drop: float = 0.3):
        self.window, self.drop = window, drop
        self.std, self.ent, self.rew = (deque(maxlen=window) for _ in range(3))

    def update(self, in_group_std: float, entropy: float, reward: float) -> tuple[float, bool]:
        self.std.append(in_group_std)
        self.ent.append(entropy)
        self.rew.append(reward)
        if len(self.std) < 3:
            return 0.0, False

        def rel_drop(hist):
            best = max(hist)
            return 0.0 if best <= 1e-12 else max(0.0, (best - hist[-1]) / best)

        score = min(rel_drop(self.std), rel_drop(self.ent))
        reward_ok = rel_drop(self.rew) < self.drop if max(self.rew) > 0 else True
        return score, bool(score >= self.drop and reward_ok)

    def state(self) -> dict:
        """The window as JSON (saved with each checkpoint: a resumed run scores as an uninterrupted one)."""
        return {"std": list(self.std), "ent": list(self.ent), "rew": list(self.rew)}

    def load_state(self, state: dict) -> None:
        for name in ("std", "ent", "rew"):
            getattr(self, name).extend(float(v) for v in state.get(name, ()))


class EarlyStops:
    """RAGEN-2's early stops (train.stop_*; each off at 0), fed the host metrics of every iteration
    and validation. `after_*` return a sentence naming the rule that fired, else None; `rule` is its
    key (logged as early_stopped/<rule>). The counters live on the host and are saved with every
    checkpoint (`state` / `load_state`): a resumed run continues them.

    - empty_filtered_steps: the filter kept no group (rollout/empty_after_filter) in N consecutive
      iterations (RAGEN rollout_filter_empty_stop_steps).
    - reward_variance_collapse: baseline = mean rollout/in_group_std of the first W non-empty
      iterations; then the last W non-empty iterations all below fraction x baseline.
    - low_validation_success: val/<env>/success below the floor at K consecutive validations, for
      any env.
    """

    def __init__(self, train_cfg):
        self.cfg = train_cfg
        self.rule = None
        self.empty_run = 0
        self.first: list[float] = []
        self.baseline = None
        self.window: list[float] = []
        self.low_val: dict[str, int] = {}

    def state(self) -> dict:
        return {"rule": self.rule, "empty_run": self.empty_run, "first": list(self.first), "baseline": self.baseline,
                "window": list(self.window), "low_val": dict(self.low_val)}

    def load_state(self, state: dict) -> None:
        self.rule = state.get("rule")
        self.empty_run = int(state.get("empty_run", 0))
        self.first = [float(v) for v in state.get("first", ())]
        self.baseline = state.get("baseline")
        self.window = [float(v) for v in state.get("window", ())]
        self.low_val = {k: int(v) for k, v in state.get("low_val", {}).items()}

    def _fire(self, rule: str, msg: str) -> str:
        self.rule = rule
        return msg

    def after_iteration(self, metrics: dict) -> str | None:
        c = self.cfg
        empty = metrics.get("rollout/empty_after_filter", 0.0) > 0
        self.empty_run = self.empty_run + 1 if empty else 0
        metrics["rollout/consecutive_empty_after_filter_steps"] = float(self.empty_run)
        if c.stop_empty_filter and self.empty_run >= c.stop_empty_filter:
            return self._fire("empty_filtered_steps", f"the filter kept no group in {self.empty_run} consecutive "
                              f"iterations (train.stop_empty_filter={c.stop_empty_filter})")
        std = metrics.get("rollout/in_group_std")
        if empty or std is None or not c.stop_std_fraction:
            return None
        w = c.stop_std_window
        if self.baseline is None:
            self.first.append(float(std))
            if len(self.first) == w:
                self.baseline = sum(self.first) / w
            return None
        self.window = (self.window + [float(std)])[-w:]
        limit = c.stop_std_fraction * self.baseline
        if len(self.window) == w and all(v < limit for v in self.window):
            return self._fire("reward_variance_collapse",
                              f"in-group reward std stayed below {c.stop_std_fraction} x its early mean "
                              f"{self.baseline:.4g} for {w} iterations (train.stop_std_fraction/stop_std_window)")
        return None

    def after_validation(self, val_metrics: dict) -> str | None:
        c = self.cfg
        if not c.stop_val_success:
            return None
        for key, v in val_metrics.items():
            if key.startswith("val/") and key.endswith("/success"):
                self.low_val[key] = self.low_val.get(key, 0) + 1 if v < c.stop_val_success else 0
                if self.low_val[key] >= c.stop_val_count:
                    return self._fire("low_validation_success",
                                      f"{key} stayed below {c.stop_val_success} for {self.low_val[key]} validations "
                                      f"(train.stop_val_success/stop_val_count)")
        return None


__all__ = ["CollapseProbe", "EarlyStops", "EchoTrapMonitor", "build_rows", "cross_logprobs", "reasoning_span", "reasoning_spans", "sample_pairs",
           "token_pieces"]
