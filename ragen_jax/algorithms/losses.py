"""Policy / value / entropy / KL losses (pure, jittable; verl `core_algos` semantics).

Shapes: [B, T] per-token arrays over a mini-batch; `mask [B, T]` = the loss mask (sampled tokens).
Every loss is aggregated with `agg_loss`, so tokens off the mask get exactly zero gradient.
Metrics are float32 scalars in a dict, ready to be averaged over mini-batches and logged.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from ragen_jax.algorithms.advantages import lookup_choice, masked_mean


# ----------------------------------------------------------------------------- aggregation

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def agg_loss(loss_mat: jax.Array, mask: jax.Array, mode: str = "token-mean",
             norm: jax.Array | float | None = None) -> jax.Array:
    """verl `agg_loss`: [B, T] per-token losses -> scalar.

    token-mean:          sum(loss * mask) / sum(mask)            (every sampled token weighs the same)
    seq-mean-token-sum:  mean over rows of sum_t(loss * mask)
    seq-mean-token-mean: mean over rows of sum_t(loss * mask) / sum_t(mask)
    The seq-mean modes average over rows that have at least one masked token (verl averages over all
    rows; the two agree whenever every row has a sampled token, and rows that the variance-cover
    filter switched off by zeroing their mask then do not dilute the mean). `norm` overrides the
    denominator (token count for token-mean, row count otherwise), e.g. the global count when a
    mini-batch is split into micro-batches whose gradients are summed.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    m = mask.astype(jnp.float32)
    masked = jnp.where(mask, loss_mat, 0.0)  # where, not *, so inf/nan off the mask cannot leak in
    if mode == "token-mean":
        denom = jnp.maximum(jnp.sum(m), 1.0) if norm is None else norm
        return jnp.sum(masked) / denom
    tokens = jnp.sum(m, axis=-1)
    seq = jnp.sum(masked, axis=-1)
    if mode == "seq-mean-token-mean":
        seq = seq / jnp.maximum(tokens, 1.0)
    denom = jnp.maximum(jnp.sum(tokens > 0), 1) if norm is None else norm
    return jnp.sum(seq) / denom


# ----------------------------------------------------------------------------- PPO policy loss

# StarPO-S's decoupled clip ("clip-higher": 0.2 / 0.28; vanilla StarPO 0.2 / 0.2), its dual clip and verl's
# value clip: the keyword defaults below and the loss section's defaults (experiment/sections.py) read these.
EPS_LOW, EPS_HIGH, DUAL_CLIP, VALUE_CLIP = 0.2, 0.28, 3.0, 0.5


def check_clip_args(eps_low: float, eps_high: float, dual_clip: float | None) -> None:
    """One sentence per bad PPO clip argument (the config calls it too, before anything is traced)."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    # 1 - eps_low must stay a positive ratio, or the lower clip would admit ratios <= 0.
    if not (number(eps_low) and 0.0 <= eps_low < 1.0):
        raise ValueError(f"eps_low must be a number in [0, 1) (the PPO clip range's lower end is 1 - eps_low), "
                         f"got {eps_low!r}")
    if not (number(eps_high) and eps_high >= 0.0):
        raise ValueError(f"eps_high must be a number >= 0 (the PPO clip range's upper end is 1 + eps_high), "
                         f"got {eps_high!r}")
    if dual_clip is not None and not (number(dual_clip) and dual_clip > 1.0):
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip!r}")


def ppo_policy_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                    eps_low: float = EPS_LOW, eps_high: float = EPS_HIGH, dual_clip: float | None = DUAL_CLIP,
                    agg_mode: str = "token-mean",
                    norm: jax.Array | float | None = None,
                    tis_weights: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """PPO clipped surrogate with decoupled clip range and dual clip (verl `compute_policy_loss`).

    logp, old_logp, advantages, mask: [B, T]. ratio r = exp(logp - old_logp) (log-ratio clamped to
    [-20, 20] as verl does, so exp cannot overflow).
        L1 = -A r,  L2 = -A clip(r, 1 - eps_low, 1 + eps_high),  L = max(L1, L2)
        A < 0 and dual_clip c:  L = min(L, -A c)   (caps the loss of a huge ratio on a bad token)
    StarPO-S: eps_low 0.2, eps_high 0.28 ("clip-higher"); vanilla StarPO 0.2 / 0.2. dual_clip None
    switches it off; otherwise c must be > 1.
    tis_weights [B, T] (optional; `mismatch.tis_weights`): truncated importance-sampling weights of
    the trainer vs the sampler; the per-token loss, after both clips, is multiplied by them (no
    gradient flows through them), as SkyRL's `apply_off_policy_correction`.

    Metrics (fractions of the masked tokens, i.e. token-mean over `mask`):
      pg_clipfrac_high:  A > 0 and r > 1 + eps_high  (the upper clip is active: zero gradient)
      pg_clipfrac_low:   A < 0 and r < 1 - eps_low   (the lower clip is active: zero gradient)
      pg_clipfrac:       their sum (= verl's pg_clipfrac, tokens where L2 > L1)
      pg_clipfrac_dual:  A < 0 and the dual clip is active, -A c < max(L1, L2) (verl's
                         "pg_clipfrac_lower", a different quantity despite its name)
      ppo_kl:            mean(old_logp - logp) (verl's approx KL, k1 of the sampling policy vs the
                         current one; 0 on the first step of an on-policy update)
      pg_loss:           the aggregated loss.
    """
    check_clip_args(eps_low, eps_high, dual_clip)
    mask = mask.astype(bool)
    adv = advantages.astype(jnp.float32)
    log_ratio = jnp.clip(logp.astype(jnp.float32) - old_logp.astype(jnp.float32), -20.0, 20.0)
    ratio = jnp.exp(log_ratio)
    loss1 = -adv * ratio
    loss2 = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clipped = jnp.maximum(loss1, loss2)
    losses = clipped
    if dual_clip is not None:
        loss3 = -adv * dual_clip
        losses = jnp.where(adv < 0, jnp.minimum(clipped, loss3), clipped)
        dual = (adv < 0) & (clipped > loss3)
    else:
        dual = jnp.zeros_like(mask)
    if tis_weights is not None:
        losses = losses * jax.lax.stop_gradient(tis_weights.astype(jnp.float32))
    pg_loss = agg_loss(losses, mask, agg_mode, norm)
    high = (adv > 0) & (ratio > 1.0 + eps_high)
    low = (adv < 0) & (ratio < 1.0 - eps_low)
    f = lambda x: masked_mean(x.astype(jnp.float32), mask)  # noqa: E731
    metrics = {
        "pg_loss": pg_loss,
        "pg_clipfrac": f(high | low),
        "pg_clipfrac_high": f(high),
        "pg_clipfrac_low": f(low),
        "pg_clipfrac_dual": f(dual),
        "ppo_kl": masked_mean(-log_ratio, mask),
    }
    return pg_loss, jax.lax.stop_gradient(metrics)


# ----------------------------------------------------------------------------- value loss

def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, *,
               clip: float | None = VALUE_CLIP, agg_mode: str = "token-mean",
               norm: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """Clipped critic loss (verl `compute_value_loss`) over [B, T] -> (scalar, metrics).

    0.5 * agg( max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2) ), c = 0.5 by default (None = off).
    vf_clipfrac: fraction of masked tokens where the clipped term is strictly larger (the clip binds).
    """
    mask = mask.astype(bool)
    v = values.astype(jnp.float32)
    r = returns.astype(jnp.float32)
    l1 = jnp.square(v - r)
    if clip is None:
        l2 = l1
    else:
        vc = jnp.clip(v, old_values - clip, old_values + clip)
        l2 = jnp.square(vc - r)
    loss = 0.5 * agg_loss(jnp.maximum(l1, l2), mask, agg_mode, norm)
    metrics = {"vf_loss": loss, "vf_clipfrac": masked_mean((l2 > l1).astype(jnp.float32), mask),
               "vpred_mean": masked_mean(v, mask)}
    return loss, jax.lax.stop_gradient(metrics)


# ----------------------------------------------------------------------------- KL

def _kl_k1(logp, ref_logp):
    return logp - ref_logp


def _kl_abs(logp, ref_logp):
    return jnp.abs(logp - ref_logp)


def _kl_k2(logp, ref_logp):
    return 0.5 * jnp.square(logp - ref_logp)


def _kl_k3(logp, ref_logp):
    # verl "low_var_kl": log-ratio clamped to [-20, 20] before exp, result clamped to [-10, 10].
    kl = jnp.clip(ref_logp - logp, -20.0, 20.0)
    return jnp.clip(jnp.exp(kl) - kl - 1.0, -10.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "k1": _kl_k1, "kl": _kl_k1,
    "k2": _kl_k2, "mse": _kl_k2,
    "k3": _kl_k3, "low_var_kl": _kl_k3,
    "abs": _kl_abs,
}


def get_kl_estimator(name: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
    return lookup_choice(KL_ESTIMATORS, "KL estimator", name)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kind: str = "k3") -> jax.Array:
    """Per-token KL estimate of the policy to the reference policy [B, T] (verl `kl_penalty`).

    k1 = logp - ref;  k2 = 0.5 (logp - ref)^2;  k3 = exp(ref - logp) - (ref - logp) - 1 (clamped);
    aliases kl / mse / low_var_kl, plus abs = |logp - ref|.
    """
    return get_kl_estimator(kind)(logp.astype(jnp.float32), ref_logp.astype(jnp.float32))


def kl_loss(logp: jax.Array, ref_logp: jax.Array, mask: jax.Array, kind: str = "k3",
            agg_mode: str = "token-mean", norm=None) -> jax.Array:
    """KL term for the loss (`loss += coef * kl_loss`), aggregated like the policy loss."""
    return agg_loss(kl_penalty(logp, ref_logp, kind), mask.astype(bool), agg_mode, norm)


def kl_in_reward(token_rewards: jax.Array, logp: jax.Array, ref_logp: jax.Array, mask: jax.Array,
                 coef: float, kind: str = "k1") -> tuple[jax.Array, dict]:
    """verl `apply_kl_penalty` with a fixed coefficient: r_t - coef * KL_t on sampled tokens -> [B, T].

    logp = the sampling (old) policy's log-probs; no gradient flows (rewards are data).
    Metrics: actor/reward_kl_penalty (masked mean KL) and its coefficient.
    """
    mask = mask.astype(bool)
    kl = jax.lax.stop_gradient(kl_penalty(logp, ref_logp, kind))
    out = token_rewards - coef * jnp.where(mask, kl, 0.0)
    return out, {"reward_kl_penalty": masked_mean(kl, mask),
                 "reward_kl_penalty_coeff": jnp.asarray(coef, jnp.float32)}


# ----------------------------------------------------------------------------- entropy / logprobs

def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """[..., V] -> [...] Shannon entropy of softmax(logits) in nats, float32.

    H = logsumexp(z) - sum softmax(z) z: no log of a small probability is taken, so it is stable for
    peaked distributions (logits must be finite).
    """
    z = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(z, axis=-1)
    p = jax.nn.softmax(z, axis=-1)
    return lse - jnp.sum(p * z, axis=-1)


def logprobs_from_logits(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """[..., V] logits, [...] int targets -> [...] log softmax(logits)[target], float32."""
    z = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(z, axis=-1)
    picked = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - lse


def _chunk_logp_entropy(logits_fn, h, y):
    z = logits_fn(h).astype(jnp.float32)
    lse = jax.nn.logsumexp(z, axis=-1)
    picked = jnp.take_along_axis(z, y[..., None], axis=-1)[..., 0]
    ent = lse - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
    return picked - lse, ent


def token_logprobs_and_entropy(hidden: jax.Array, targets: jax.Array,
                               logits_fn: Callable[[jax.Array], jax.Array],
                               chunk: int = 128) -> tuple[jax.Array, jax.Array]:
    """Per-token log-prob of `targets` and entropy, without materialising [B, T, V] logits.

    hidden [B, T, H] (the model's final hidden states; position t predicts targets[:, t]), targets
    [B, T] int, logits_fn: [B, c, H] -> [B, c, V] (e.g. `model.logits`; may close over params).
    Returns (logp [B, T], entropy [B, T]) float32. The time axis is cut into chunks of `chunk` (the
    last one zero-padded); a `lax.map` walks them with a `jax.checkpoint`ed body, so the forward AND
    the backward pass only hold the [B, chunk, V] float32 temporaries of one chunk (measured with XLA
    CPU's memory analysis: about 2 blocks of B * chunk * V * 4 bytes forward, 4 in the backward pass,
    independent of T; one block at B=8, chunk=128, V=151,936 is 0.62 GB) instead of [B, T, V].
    Chunking T (not B) keeps the batch axis, and so its data sharding, untouched. Differentiable
    w.r.t. hidden and the closed-over params.
    """
    if hidden.ndim != 3 or targets.shape != hidden.shape[:2]:
        raise ValueError(f"expected hidden [B, T, H] and targets [B, T], got {hidden.shape} and {targets.shape}")
    return map_time_chunks(lambda h, y: _chunk_logp_entropy(logits_fn, h, y), hidden, targets, chunk)


def map_time_chunks(chunk_fn: Callable, hidden: jax.Array, targets: jax.Array, chunk: int = 128):
    """`chunk_fn(hidden [B, c, H], targets [B, c]) -> tuple of [B, c] arrays`, applied to the time axis
    in chunks of `chunk` (the last one zero-padded) under a `lax.map` with a `jax.checkpoint`ed body,
    so neither the forward nor the backward pass holds more than one chunk's [B, c, V] logits.
    Returns the tuple of [B, T] results. Shared by the RL losses and the SFT loss."""
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    b, t, h = hidden.shape
    c = min(chunk, t)
    n = -(-t // c)
    pad = n * c - t
    targets = targets.astype(jnp.int32)
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    hs = hidden.reshape(b, n, c, h).swapaxes(0, 1)  # [n, B, c, H]
    ys = targets.reshape(b, n, c).swapaxes(0, 1)
    out = jax.lax.map(jax.checkpoint(lambda xs: chunk_fn(*xs)), (hs, ys))
    return tuple(o.swapaxes(0, 1).reshape(b, n * c)[:, :t] for o in out)


def entropy_loss(entropy: jax.Array, mask: jax.Array, agg_mode: str = "token-mean", norm=None) -> jax.Array:
    """Aggregated entropy of the sampled tokens (the trainer subtracts coef * this; coef 0.001)."""
    return agg_loss(entropy, mask.astype(bool), agg_mode, norm)
