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


def greedy_decode_hlo(model) -> tuple[str, str]:
    """(optimized HLO text, the token loop's `while` line) of prefill 5 ids + greedy decode 6 tokens,
    batch 2, a 12-slot float32 cache: what the decode-path tests read the compiled program from."""
    import jax.numpy as jnp
    from flax import nnx

    from ragen_jax.models import KVCache
    from ragen_jax.rollout import sampler

    graphdef, params = nnx.split(model)

    def gen(params, tokens):
        m = nnx.merge(graphdef, params)
        cache = KVCache.init(m.cfg, batch=2, max_len=12, dtype="float32")
        logits, cache = sampler.prefill(m, cache, tokens, jnp.ones_like(tokens, bool))
        # Two stop ids inside any test vocabulary (Qwen's defaults are refused for a small model).
        return sampler.decode(m, cache, logits, jax.random.key(0), max_new_tokens=6, greedy=True,
                              stop_ids=(3, 4), pad_id=0).tokens

    # With XLA's default fusion emitters, whatever tests/conftest.py sets for speed: the structure these
    # tests read is that of the programs users run.
    text = jax.jit(gen).lower(params, jnp.ones((2, 5), jnp.int32)).compile(
        compiler_options={"xla_cpu_use_fusion_emitters": True}).as_text()
    # The token loop is the while whose state holds the KV cache and the [B, N+1] token buffer.
    loops = [ln for ln in text.splitlines() if " while(" in ln and "s32[2,7]" in ln]
    assert len(loops) == 1, loops
    return text, loops[0]
