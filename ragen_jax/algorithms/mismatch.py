"""Sampler / trainer log-prob mismatch: metrics and truncated importance sampling (pure, jittable).

The rollout records the sampler's log-prob of every sampled token; the trainer recomputes them
(`old_logp`) with its own kernels, dtype and batch layout. Both are [B, T] in the same (target)
coordinates; `mask [B, T]` = the sampled tokens. log r_t = old_logp_t - sampler_logp_t.

Metrics (`mismatch_metrics`, over masked tokens):
    mismatch/logp_abs_diff_mean, mismatch/logp_abs_diff_max   |log r_t|
    mismatch/k3_kl     k3 estimate of KL(sampler || trainer) with samples from the sampler:
                       r - 1 - log r, r = exp(log r) (losses.kl_penalty "k3": log-ratio clamped to
                       [-20, 20], result to [-10, 10])
    mismatch/ratio_above_cap   fraction of tokens with r_t > tis_cap.

Truncated importance sampling (`tis_weights`, no gradient), the variants built:
    token     w_t = min(r_t, cap)                         (Tunix / SkyRL tis_ratio_type="token"; cap 2.0)
    sequence  w_b = min(prod_t r_t, cap) on all the row's tokens, the product as exp(sum log r)
              with the sum clamped to [-20, 20] (SkyRL tis_ratio_type="sequence"; cap 5.0)
    none      w = 1
  optional geometric sequence mask (SkyRL sequence_mask_metric="geometric", bounds [0.99, 1.01]):
    rows whose geometric-mean ratio exp(mean_t log r_t) leaves [low, high] get weight 0.
  Not built: SkyRL's "product" sequence mask, its outlier-token and per-token hard masks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.algorithms.advantages import masked_mean
from ragen_jax.algorithms.losses import kl_penalty

TIS_MODES = ("none", "token", "sequence")
TIS_TOKEN_CAP = 2.0  # Tunix / SkyRL token_tis_ratio_clip_high
TIS_SEQUENCE_CAP = 5.0  # SkyRL sequence_tis_ratio_clip_high
GEO_MASK_BOUNDS = (0.99, 1.01)  # SkyRL geo_mask_low / geo_mask_high
LOG_RATIO_CLAMP = 20.0  # SkyRL safe_exp_delta(clip=20): exp cannot overflow


def check_tis_args(mode: str, cap: float, geo_mask: tuple[float, float] | None = None) -> None:
    """One sentence per bad argument, raised before anything is traced."""
    if mode not in TIS_MODES:
        raise ValueError(f"unknown tis mode {mode!r}; valid: {', '.join(TIS_MODES)}")
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap >= 1.0:
        raise ValueError(f"tis_cap must be a number >= 1 (token: 2.0, sequence: 5.0), got {cap!r}")
    if geo_mask is not None:
        ok = isinstance(geo_mask, (tuple, list)) and len(geo_mask) == 2 and 0 < geo_mask[0] <= 1.0 <= geo_mask[1]
        if not ok:
            raise ValueError(f"tis geometric mask bounds must be (low, high) with 0 < low <= 1 <= high, "
                             f"got {geo_mask!r}")


def _log_ratio(old_logp, sampler_logp, mask):
    return jnp.where(mask, old_logp.astype(jnp.float32) - sampler_logp.astype(jnp.float32), 0.0)


def mismatch_metrics(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array,
                     tis_cap: float = TIS_TOKEN_CAP) -> dict:
    """The mismatch/ metrics of the module docstring, float32 scalars (no gradient)."""
    mask = mask.astype(bool)
    lr = jax.lax.stop_gradient(_log_ratio(old_logp, sampler_logp, mask))
    k3 = kl_penalty(jax.lax.stop_gradient(sampler_logp), jax.lax.stop_gradient(old_logp), "k3")
    ratio = jnp.exp(jnp.clip(lr, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return {
        "mismatch/logp_abs_diff_mean": masked_mean(jnp.abs(lr), mask),
        "mismatch/logp_abs_diff_max": jnp.max(jnp.where(mask, jnp.abs(lr), 0.0)),
        "mismatch/k3_kl": masked_mean(k3, mask),
        "mismatch/ratio_above_cap": masked_mean((ratio > tis_cap).astype(jnp.float32), mask),
    }


def tis_weights(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, mode: str = "token",
                cap: float | None = None, geo_mask: tuple[float, float] | None = None) -> tuple[jax.Array, dict]:
    """-> (weights [B, T], 0 off the mask, no gradient; metrics). cap None: 2.0 (token) / 5.0 (sequence).

    Metrics: tis/weight_mean (masked mean weight), tis/capped_fraction (tokens (token mode) or rows
    with a sampled token (sequence mode) whose ratio exceeds the cap), tis/geo_masked_fraction (rows
    with a sampled token dropped by the geometric mask; 0 without it).
    """
    if cap is None:
        cap = TIS_SEQUENCE_CAP if mode == "sequence" else TIS_TOKEN_CAP
    check_tis_args(mode, cap, geo_mask)
    mask = mask.astype(bool)
    lr = jax.lax.stop_gradient(_log_ratio(old_logp, sampler_logp, mask))
    has_tok = jnp.any(mask, axis=-1)
    n_rows = jnp.maximum(jnp.sum(has_tok), 1).astype(jnp.float32)
    if mode == "none":
        w = jnp.ones(lr.shape, jnp.float32)
        capped = jnp.float32(0.0)
    elif mode == "token":
        r = jnp.exp(jnp.clip(lr, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        w = jnp.minimum(r, cap)
        capped = masked_mean((r > cap).astype(jnp.float32), mask)
    else:
        r_seq = jnp.exp(jnp.clip(jnp.sum(lr, axis=-1), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        w = jnp.broadcast_to(jnp.minimum(r_seq, cap)[:, None], lr.shape)
        capped = jnp.sum((r_seq > cap) & has_tok) / n_rows
    dropped = jnp.float32(0.0)
    if geo_mask is not None:
        n_tok = jnp.maximum(jnp.sum(mask, axis=-1), 1).astype(jnp.float32)
        geo = jnp.exp(jnp.clip(jnp.sum(lr, axis=-1) / n_tok, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        keep = (geo >= geo_mask[0]) & (geo <= geo_mask[1])
        w = w * keep[:, None]
        dropped = jnp.sum(~keep & has_tok) / n_rows
    w = jnp.where(mask, w, 0.0)
    metrics = {"tis/weight_mean": masked_mean(w, mask), "tis/capped_fraction": capped,
               "tis/geo_masked_fraction": dropped}
    return jax.lax.stop_gradient(w), metrics


__all__ = ["GEO_MASK_BOUNDS", "LOG_RATIO_CLAMP", "TIS_MODES", "TIS_SEQUENCE_CAP", "TIS_TOKEN_CAP", "check_tis_args",
           "mismatch_metrics", "tis_weights"]
