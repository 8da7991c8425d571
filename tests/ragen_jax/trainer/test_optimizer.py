"""make_optimizer's learning-rate schedules, read back from Adam's steps.

With a constant gradient, a bias-corrected Adam step is lr_k * g / |g| (up to eps), so the parameter
deltas ARE the schedule; compared with the closed forms (linear warm-up; cosine 0.5 * (1 + cos(pi k / D)))."""

from __future__ import annotations

import math
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.trainer.optim import make_optimizer

LR = 0.01


def _deltas(warmup, decay, steps):
    cfg = SimpleNamespace(warmup_steps=warmup, grad_clip=1e9, b1=0.9, b2=0.999, weight_decay=0.0)
    tx = make_optimizer(LR, cfg, decay_steps=decay)
    p = jnp.zeros(()); g = jnp.ones(())  # noqa: E702
    state = tx.init(p)
    out = []
    for _ in range(steps):
        upd, state = tx.update(g, state, p)
        out.append(-float(upd))
    return np.asarray(out)


def test_constant_and_warmup():
    np.testing.assert_allclose(_deltas(0, None, 5), LR, rtol=1e-4)
    want = [LR * min(1.0, k / 4) for k in range(8)]
    np.testing.assert_allclose(_deltas(4, None, 8), want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("warmup", [0, 3])
def test_cosine_decays_to_zero_after_the_warmup(warmup):
    d = 10
    got = _deltas(warmup, d, warmup + d + 2)
    want = [LR * k / warmup for k in range(warmup)]
    want += [LR * 0.5 * (1 + math.cos(math.pi * min(k, d) / d)) for k in range(d + 2)]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_sft_lr_schedule_is_validated():
    assert load_config("demo_cpu.py", ["sft.lr_schedule=cosine"]).sft.lr_schedule == "cosine"
    with pytest.raises(ConfigError, match="sft.lr_schedule"):
        load_config("demo_cpu.py", ["sft.lr_schedule=linear"])
