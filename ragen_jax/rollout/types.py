"""Rollout settings and the record a rollout returns."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
from flax import struct


@dataclasses.dataclass
class RolloutConfig:
    """Static settings of one compiled rollout (changing any of them recompiles). The `rollout` section
    of the experiment config is this class; `Rollout` keeps its own copy."""

    # P: initial states per rollout batch (the "groups" that reward normalisation and the StarPO-S
    # filter work on). Reference: 8.
    num_groups: int = 8
    # N: rollouts per initial state; all N of a group start from the same seed. Reference: 16.
    group_size: int = 16
    # T_max: whole-conversation token budget (prompt + all turns). Reference: 3,600. A turn that
    # would not fit is not started: the episode ends there, flagged `truncated`.
    max_context: int = 3600
    # Sampling. Training: temperature 1, top-p 1 (reference); validation: temperature 0.5.
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    # Added to a turn's reward when its answer had an invalid piece or no valid action (reference -0.1).
    format_penalty: float = -0.1
    # Also stop a turn's generation at a completed "</answer>" (the reference's vLLM stop string),
    # besides <|im_end|> / <|endoftext|> and the per-turn token budget.
    stop_at_answer: bool = True
    # KV-cache dtype; None = the model's compute dtype (bf16 on accelerators halves cache traffic).
    cache_dtype: str | None = None
    # "int8": the KV cache stores int8 codes with one scale per token and kv head (in cache_dtype),
    # dequantized per layer where attention reads it: the cache's bytes fall to ~1/4 (float32) or ~1/2
    # (bfloat16), the sampled tokens move slightly (docs/memory.md). "none": the float cache, unchanged.
    kv_cache_quant: str = "none"
    # Operand dtype of the weight matmuls while sampling only (Qwen2Config.matmul_dtype of the rollout's
    # view of the policy); None = the model's own. The trainer's log-probs keep model.matmul_dtype, so
    # "bfloat16" here is a faster sampler that differs from the trainer: the mismatch/ metrics measure
    # it and loss.tis corrects for it (docs/algorithms.md).
    matmul_dtype: str | None = None
    # Groups generated together (0: all P at once). With fewer, the P groups run in P / groups_per_pass
    # passes one after another inside the same compiled program, and the KV cache (rows x max_context
    # x layers: the rollout's largest buffer) is sized for one pass: memory for time, like verl's
    # rollout micro-batches. Pass i samples with fold_in(key, i): the same distribution as one pass,
    # other draws.
    groups_per_pass: int = 0
    # Work that follows what is real (docs/experiments/decode.md, "Issue 45: sampling does only the work it needs"). `shared_prefix`:
    # the prompt prefix every row starts with is prefilled for one row and its keys/values broadcast,
    # and the trainer scores it once per batch. `filled_reads`: every cached attention call reads only
    # the key slots some row has filled (Qwen2Config.decode_bound). False: per row / the whole cache
    # capacity every step, the work before both existed (benchmarks run the two side by side).
    shared_prefix: bool = True
    filled_reads: bool = True
    # One-turn episodes: each DISTINCT first observation among the groups is prefilled once (found at
    # run time; Bandit's 256 evaluation states show 2 texts, BanditPairs' 24). False: once per group (still shared by
    # the group's rows when shared_prefix is on).
    distinct_first: bool = True

    def __post_init__(self):
        self.validate()

    def validate(self):
        for name in ("num_groups", "group_size", "max_context"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"RolloutConfig.{name} must be a positive integer, got {v!r}")
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"RolloutConfig.temperature must be > 0 when sampling, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"RolloutConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"RolloutConfig.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.matmul_dtype not in (None, "float32", "bfloat16"):
            raise ValueError(f"RolloutConfig.matmul_dtype must be None (the model's), 'float32' or 'bfloat16', "
                             f"got {self.matmul_dtype!r}")
        g = self.groups_per_pass
        if not isinstance(g, int) or isinstance(g, bool) or g < 0 or (g and self.num_groups % g):
            raise ValueError(f"RolloutConfig.groups_per_pass must be 0 (all groups at once) or a divisor of "
                             f"num_groups = {self.num_groups}, got {g!r}")

    @property
    def batch_size(self) -> int:
        return self.num_groups * self.group_size


@struct.dataclass
class Trajectories:
    """B = P x N finished episodes as fixed-size buffers (row b belongs to group b // N)."""

    tokens: jax.Array  # [B, T] int32: the whole conversation, pad after `length`
    length: jax.Array  # [B] int32
    loss_mask: jax.Array  # [B, T] bool: exactly the tokens the policy sampled
    logprobs: jax.Array  # [B, T] f32: sampling log-prob at sampled positions, 0 elsewhere
    turn_end: jax.Array  # [B, max_turns] int32: position of each turn's last sampled token, -1 if none
    turn_reward: jax.Array  # [B, max_turns] f32: env rewards + format penalty of each turn
    reward: jax.Array  # [B] f32: trajectory reward = sum of turn rewards (placed on the last sampled token)
    group: jax.Array  # [B] int32: group index 0..P-1
    seed: jax.Array  # [B] int32: the env seed of the group
    success: jax.Array  # [B] bool
    action_is_valid: jax.Array  # [B] bool: every turn parsed and named only valid actions
    num_actions: jax.Array  # [B] int32: executed actions
    num_effective: jax.Array  # [B] int32: executed actions that changed the state (player moved, ...)
    num_turns: jax.Array  # [B] int32: assistant turns taken
    num_format_errors: jax.Array  # [B] int32: turns that got the format penalty
    response_length: jax.Array  # [B] int32: sampled tokens over all turns
    truncated: jax.Array  # [B] bool: ended because the next turn would overflow max_context
    # [B, max_turns] int32: position of each turn's segment, -1 for turns not taken. The rollout always
    # records it; the trainer needs it in single-turn mode (each turn scored behind the prefix alone).
    turn_start: jax.Array | None = None
    # [B, max_turns, D] int32: the observation key of the state each turn acted on (-1 for turns not
    # taken): GiGPO's anchor states (rollout/state_keys.py). Recorded only by a Rollout built with
    # `state_keys=True`; None otherwise.
    state_key: jax.Array | None = None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def assert_shapes(self, batch: int, max_context: int, max_turns: int) -> None:
        """chex assertions that every field has the shape and dtype written above (arrays or tracers)."""
        b, t, k = batch, max_context, max_turns
        chex.assert_shape([self.tokens, self.loss_mask, self.logprobs], (b, t))
        chex.assert_shape([self.turn_end, self.turn_reward], (b, k))
        if self.turn_start is not None:
            chex.assert_shape(self.turn_start, (b, k))
            chex.assert_type(self.turn_start, jnp.int32)
        if self.state_key is not None:
            chex.assert_shape(self.state_key, (b, k, None))
            chex.assert_type(self.state_key, jnp.int32)
        per_row = [self.length, self.reward, self.group, self.seed, self.success, self.action_is_valid,
                   self.num_actions, self.num_effective, self.num_turns, self.num_format_errors,
                   self.response_length, self.truncated]
        chex.assert_shape(per_row, (b,))
        chex.assert_type([self.tokens, self.length, self.turn_end, self.group, self.seed, self.num_actions,
                          self.num_effective, self.num_turns, self.num_format_errors, self.response_length],
                         jnp.int32)
        chex.assert_type([self.logprobs, self.turn_reward, self.reward], jnp.float32)
        chex.assert_type([self.loss_mask, self.success, self.action_is_valid, self.truncated], bool)
