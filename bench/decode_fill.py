"""Decode step time against how much of the KV cache is filled (issue 45's first target).

One decode step (the sampler's token loop: feed the pending token through every layer with its KV
cache, then the vocabulary head and the sampling reduction) of a model with random weights, greedy,
at a cache CAPACITY of `--capacity` slots (3,600 = configs/sokoban.py's max_context) with `--fills`
slots filled. Three sides, timed interleaved in one run:

  bounded   capacity slots, reads in static buckets of the filled slots (the default path,
            `Qwen2Config.decode_bound=True`, models/attention.py `read_filled`)
  full      capacity slots, every step reads them all (`decode_bound=False`: the path before issue 45)
  native    a cache of exactly `fill` slots: the floor a step at that fill can reach

Per-step time is isolated from the call's fixed costs (cache layout conversion, head set-up) by
timing two calls of `--steps-short` and `--steps-long` tokens that end at the same fill (one compiled
program per side: fill and token budget are traced inputs) and dividing the difference by the step
difference; median over `--repeats` pairs. Ratios:
`bounded_over_native` (issue 45 target: <= 1.15 at 256 filled of 3,600) and `full_over_bounded`.

Usage: python -m bench.decode_fill [--shapes tiny:64,qwen2.5-0.5b:16] [--capacity 3600]
       [--fills 256,1024,3600] [--steps-short 4 --steps-long 20] [--repeats 5] [--quick]
       [--out bench/results/decode_fill.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import machine, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "decode_fill.json"
SIDES = ("bounded", "full", "native")


def decode_timer(model, batch: int, capacity: int, max_steps: int, dtype=None):
    """One compiled greedy decode of at most `max_steps` tokens over a cache of `capacity` slots
    (random keys/values: softmax over them is a real workload), and `timed(fill, steps)` -> seconds
    of a call that decodes `steps` tokens from `fill - steps` filled slots (so its last step reads
    `fill`). Fill and step count are traced inputs (the cache's end and every row's token budget):
    one compilation serves every point."""
    from ragen_jax.models.qwen2.model import KVCache
    from ragen_jax.rollout import sampler

    graphdef, state = nnx.split(model)
    cfg = model.cfg

    @jax.jit
    def run(state, cache, logits, end, budget):
        m = nnx.merge(graphdef, state)
        out = sampler.decode(m, cache.replace(end=jnp.full((batch,), end, jnp.int32)), logits, jax.random.PRNGKey(0),
                             max_new_tokens=max_steps, budget=jnp.full((batch,), budget, jnp.int32), greedy=True,
                             stop_ids=(), pad_id=0, logprobs=False)
        return out.tokens

    cache = KVCache.init(cfg, batch=batch, max_len=capacity, dtype=dtype)
    k = (0.1 * jax.random.normal(jax.random.PRNGKey(1), cache.k.shape, jnp.float32)).astype(cache.k.dtype)
    cache = cache.replace(k=k, v=k)
    logits = jax.random.normal(jax.random.PRNGKey(2), (batch, cfg.vocab_size), jnp.float32)

    def timed(fill: int, steps: int) -> float:
        args = (state, cache, logits, jnp.int32(fill - steps), jnp.int32(steps))
        t0 = time.perf_counter()
        jax.block_until_ready(run(*args))
        return time.perf_counter() - t0

    timed(capacity, max_steps)  # compile + warm up
    return timed


def per_step_ms(timers: dict, fill: int, steps: tuple[int, int], repeats: int) -> dict:
    """{side: median ms of one decode step at `fill`} by the two-call difference, sides interleaved."""
    per = {s: [] for s in timers}
    for _ in range(repeats):
        for side, timed in timers.items():
            per[side].append((timed(fill, steps[1]) - timed(fill, steps[0])) / (steps[1] - steps[0]))
    return {s: 1e3 * statistics.median(v) for s, v in per.items()}


def bench_shape(shape: str, batch: int, capacity: int, fills, steps: tuple[int, int], repeats: int) -> list[dict]:
    from ragen_jax.models import Qwen2, Qwen2Config, with_config

    model = Qwen2(Qwen2Config.from_preset(shape), rngs=nnx.Rngs(0))
    if any(f > capacity or f <= steps[1] for f in fills):
        raise SystemExit(f"every fill must be in ({steps[1]}, capacity {capacity}]: {fills}")
    timers = {"bounded": decode_timer(model, batch, capacity, steps[1]),
              "full": decode_timer(with_config(model, decode_bound=False), batch, capacity, steps[1])}
    rows = []
    for fill in fills:
        native = decode_timer(model, batch, fill, steps[1])
        ms = per_step_ms({**timers, "native": native}, fill, steps, repeats)
        row = {"shape": shape, "batch": batch, "capacity": capacity, "fill": fill,
               **{f"{s}_ms_per_step": round(ms[s], 3) for s in SIDES},
               "bounded_over_native": round(ms["bounded"] / ms["native"], 3),
               "full_over_bounded": round(ms["full"] / ms["bounded"], 3)}
        print(row, flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="tiny:64,qwen2.5-0.5b:16", help="preset:batch,...")
    ap.add_argument("--capacity", type=int, default=3600)
    ap.add_argument("--fills", default="256,1024,3600")
    ap.add_argument("--steps-short", type=int, default=4)
    ap.add_argument("--steps-long", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="tiny shape, batch 8, capacity 512, fills 160,512")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    if a.quick:
        a.shapes, a.capacity, a.fills, a.steps_short, a.steps_long, a.repeats = "tiny:8", 512, "160,512", 2, 6, 2
    result = {"machine": machine(), "settings": vars(a), "rows": []}
    for item in a.shapes.split(","):
        shape, batch = item.split(":")
        fills = [int(f) for f in a.fills.split(",")]
        result["rows"] += bench_shape(shape, int(batch), a.capacity, fills, (a.steps_short, a.steps_long), a.repeats)
        write_result(result, a.out)


if __name__ == "__main__":
    sys.exit(main())
