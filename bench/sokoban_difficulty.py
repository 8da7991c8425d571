"""Difficulty and speed of the on-device Sokoban generator, next to the reference's numbers.

Difficulty = BFS-optimal solution length (env.solve) of the room reset from seed i (i = 0..n-1).
Reference: RAGEN's host-side generator measured on a 2-core CPU (ragen-behaviour.md section 9).
Usage: python -m bench.sokoban_difficulty [--small 500] [--large 100] [--out bench/results/sokoban_difficulty.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.sokoban import make_sokoban

REFERENCE = {
    "Sokoban": {"n": 500, "histogram": {1: 46, 2: 120, 3: 55, 4: 79, 5: 77, 6: 59, 7: 24, 8: 23, 9: 10, 10: 6, 11: 1},
                "median": 4, "mean": 4.04, "pct_within_10": 99.8, "resets_per_s": 671},
    "LargerSokoban": {"n": 100, "median": 6, "mean": 5.87, "pct_within_10": 98.0, "resets_per_s": 305},
}


def difficulty(name: str, n: int) -> dict:
    env, params = make_sokoban(name)
    keys = jax.vmap(jax.random.key)(jnp.arange(n))
    f = jax.jit(jax.vmap(lambda k: env.solve(env.reset_env(k, params)[1], params)))
    sol = jax.device_get(f(keys))
    length = np.asarray(sol.length)
    solvable = np.asarray(sol.solvable)
    hist = collections.Counter(length[solvable].tolist())
    return {
        "n": n,
        "config": {"num_candidates": env.config.num_candidates, "search_depth": env.config.search_depth,
                   "gen_tries": env.config.gen_tries, "jitter_max_steps": env.config.jitter_max_steps},
        "histogram": {int(k): int(v) for k, v in sorted(hist.items())},
        "median": float(np.median(length)),
        "mean": round(float(length.mean()), 3),
        "pct_within_10": round(100.0 * float((solvable & (length <= 10)).mean()), 2),
        "pct_solvable": round(100.0 * float(solvable.mean()), 2),
    }


def speed(name: str, batches=(1, 256, 4096), reps=3) -> dict:
    env, params = make_sokoban(name)
    out = {}
    for b in batches:
        f = jax.jit(jax.vmap(lambda k: env.reset_env(k, params)[1]))
        keys = jax.random.split(jax.random.key(123), b)
        jax.block_until_ready(f(keys))  # compile
        best = float("inf")
        for r in range(reps):
            keys = jax.random.split(jax.random.key(r), b)
            t = time.perf_counter()
            jax.block_until_ready(f(keys))
            best = min(best, time.perf_counter() - t)
        out[str(b)] = round(b / best, 1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=500)
    ap.add_argument("--large", type=int, default=100)
    ap.add_argument("--out", default="bench/results/sokoban_difficulty.json")
    args = ap.parse_args()
    result = {
        "device": str(jax.devices()[0]), "platform": platform.platform(), "cpus": os.cpu_count(),
        "note": "rooms_per_s = generation only (jit(vmap(reset_env))), best of 3; the machine may be shared.",
    }
    for name, n in (("Sokoban", args.small), ("LargerSokoban", args.large)):
        res = difficulty(name, n)
        res["rooms_per_s"] = speed(name)
        res["reference"] = REFERENCE[name]
        result[name] = res
        print(f"{name}: n={n} median={res['median']} mean={res['mean']} within10={res['pct_within_10']}% "
              f"hist={res['histogram']} rooms/s={res['rooms_per_s']}")
        print(f"  reference: {REFERENCE[name]}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
