"""The optimizer of every trainer: AdamW with global-norm clipping, warm-up and optional cosine decay."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def lr_schedule(lr: float, warmup_steps: int = 0, decay_steps: int | None = None):
    """Linear warm-up to `lr` over `warmup_steps`, then constant, or (with `decay_steps`) a cosine decay
    to 0 over the following `decay_steps` steps (SFT's `sft.lr_schedule='cosine'`)."""
    if decay_steps is None:
        return lr if warmup_steps <= 0 else optax.linear_schedule(0.0, lr, warmup_steps)
    cosine = optax.cosine_decay_schedule(lr, max(1, int(decay_steps)))
    if warmup_steps <= 0:
        return cosine
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), cosine], [warmup_steps])


def make_optimizer(lr: float, cfg, decay_steps: int | None = None) -> optax.GradientTransformation:
    """AdamW with global-norm clipping; a non-finite gradient skips the step (and is counted).
    `decay_steps`: cosine-decay the learning rate to 0 over that many steps after the warm-up."""
    schedule = lr_schedule(lr, cfg.warmup_steps, decay_steps)
    opt = optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay),
    )
    return optax.apply_if_finite(opt, max_consecutive_errors=1_000_000)


def lr_at(step, lr: float, warmup: int):
    return lr if warmup <= 0 else lr * jnp.minimum(1.0, step / warmup)
