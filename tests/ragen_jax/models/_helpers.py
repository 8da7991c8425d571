"""Shared fixtures paths and jitted functions for the model tests (one compile per shape per process)."""

import functools
import os

import jax
import numpy as np

from ragen_jax.models import forward, logits_fn

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures")
VARIANTS = ("tied", "untied")


def fixture_dir(variant: str) -> str:
    return os.path.abspath(os.path.join(FIXTURES, f"qwen2_{variant}"))


def reference(variant: str) -> dict:
    with np.load(os.path.join(fixture_dir(variant), "reference.npz")) as z:
        return {k: z[k] for k in z.files}


@functools.partial(jax.jit, static_argnums=0)
def logits_nocache(graphdef, params, tokens, valid):
    hidden, _ = forward(graphdef, params, tokens, valid, None)
    return logits_fn(graphdef, params, hidden)


@functools.partial(jax.jit, static_argnums=0)
def logits_step(graphdef, params, tokens, valid, cache):
    hidden, cache = forward(graphdef, params, tokens, valid, cache)
    return logits_fn(graphdef, params, hidden), cache


def right_padded(ref: dict) -> tuple[np.ndarray, np.ndarray]:
    """The reference rows moved to the left (right padding), valid mask."""
    ids, mask = ref["input_ids"], ref["attention_mask"].astype(bool)
    out = np.zeros_like(ids)
    valid = np.zeros_like(mask)
    for b, n in enumerate(ref["lengths"]):
        out[b, :n] = ids[b][mask[b]]
        valid[b, :n] = True
    return out, valid
