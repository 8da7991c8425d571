"""Where a tiny-shape decode step's time goes: the vocabulary head against the reductions after it.

Issue 14's tiny row (hidden 64, 151,936-id vocabulary, batch 64, 64 greedy tokens) is dominated by
the head and what reads its [B, V] logits, not by the two layers. Each row times a jitted
`fori_loop` of 64 steps that computes the head's logits from a hidden state, reduces them, and feeds
a token embedding back (so no step can be skipped or sliced away), in float32 and with bf16 operands
(float32 accumulation, as `model.matmul_dtype="bfloat16"`):

  max      the head plus one max over the vocabulary: the cheapest full read of the logits
  lse      the head plus a logsumexp (what the log-prob of the chosen token needs)
  select   the head plus the sampler's greedy `select_token` (first argmax, then one exp pass for the
           chosen token's log-prob): what `sampler.generate(greedy=True)` does per step
  argmax   the head plus greedy `select_token(logprob=False)` (the first argmax only, no exp):
           what `sampler.generate(greedy=True, logprobs=False)` does per step

Rows report the best of --repeats calls (and the median), ms per step, and the head's GFLOP/s at
that speed. Ratios are within one run on one machine.

Usage: python -m bench.decode_head [--repeats 5] [--out bench/results/decode_head.json]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


import jax
import jax.numpy as jnp
import numpy as np

from bench.common import machine, write_result
from ragen_jax.rollout.sampler import select_token

RESULTS = Path(__file__).resolve().parent / "results" / "decode_head.json"
B, H, V, STEPS = 64, 64, 151_936, 64  # the tiny row of bench/sampler.py
f32 = jnp.float32

# `t` is the temperature, traced as in the sampler (a Python 1.0 would let XLA fold the division away).
REDUCTIONS = {
    "max": lambda lg, t: jnp.max(lg, axis=1),
    "lse": lambda lg, t: jax.nn.logsumexp(lg, axis=1),
    "select": lambda lg, t: select_token(lg, None, t, greedy=True)[1],
    "argmax": lambda lg, t: select_token(lg, None, t, greedy=True, logprob=False)[0].astype(f32) * 1e-3,
}


def time_row(dtype, reduction: str, repeats: int) -> dict:
    reduce = REDUCTIONS[reduction]
    w = jax.random.normal(jax.random.PRNGKey(0), (V, H), f32).astype(dtype)
    h0 = jax.random.normal(jax.random.PRNGKey(1), (B, H), f32)
    emb = jax.random.normal(jax.random.PRNGKey(2), (V, H), f32) * 0.02

    @jax.jit
    def loop(w, h0, t):
        def body(i, carry):
            h, acc = carry
            logits = jnp.einsum("bh,vh->bv", h.astype(dtype), w, preferred_element_type=f32)
            r = reduce(logits, t)
            tok = jnp.abs(r * 1e3).astype(jnp.int32) % V  # depends on every logit
            return h + emb[tok], acc + r

        return jax.lax.fori_loop(0, STEPS, body, (h0, jnp.zeros((B,), f32)))

    temp = jnp.float32(1.0)
    jax.block_until_ready(loop(w, h0, temp))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(loop(w, h0, temp))
        times.append(time.perf_counter() - t)
    best = min(times)
    return {"dtype": jnp.dtype(dtype).name, "reduction": reduction, "calls_s": [round(x, 4) for x in times],
            "best_s": round(best, 4), "median_s": round(float(np.median(times)), 4),
            "ms_per_step": round(best / STEPS * 1e3, 2),
            "head_gflops_per_s": round(2 * B * H * V * STEPS / best / 1e9, 1)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    info = machine()
    rows = []
    for dtype in (jnp.float32, jnp.bfloat16):
        for reduction in REDUCTIONS:
            row = time_row(dtype, reduction, args.repeats)
            rows.append(row)
            print(f"{row['dtype']:9s} {reduction:7s} {row['ms_per_step']:6.2f} ms/step "
                  f"(best of {args.repeats}; median {row['median_s'] * 1e3 / STEPS:6.2f}), "
                  f"head {row['head_gflops_per_s']:6.1f} GFLOP/s", flush=True)
    write_result({"machine": info, "settings": {"batch": B, "hidden": H, "vocab": V, "steps": STEPS,
                                                "repeats": args.repeats}, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
