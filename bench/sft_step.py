"""Seconds per SFT optimizer step on real demonstrations, with and without the two exact speed-ups.

The SFT trainer of a config (default: the CPU demo's Sokoban stage, `configs/demo_cpu.py`) makes
`--demos` solver demonstrations, then times `--steps` optimizer steps in each variant, side by side
in one process (the machines are shared: compare the ratio, not the seconds across runs):

  plain           every demo padded to the longest, each row runs its whole conversation
  shared_prefix   the prompt prefix all demos share is run once per batch (`sft.shared_prefix`)
  prefix+buckets  ... and batches drawn from one length bucket, padded to its width (the default)

Each variant first runs one step per batch width (compilation, excluded), then `--steps` timed
steps over the epoch's own batch order. The loss of a batch is the same in every variant
(tests/ragen_jax/sft/test_sft.py checks it); only the padding and the repeated prefix go.

Usage: python -m bench.sft_step [--config demo_cpu.py] [--demos 512] [--steps 24] [--quick]
       [--out bench/results/sft_step.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench._common import machine, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "sft_step.json"
VARIANTS = {
    "plain": ["sft.shared_prefix=false", "sft.length_bucket=0"],
    "shared_prefix": ["sft.length_bucket=0"],
    "prefix+buckets": [],
}


def bench_variant(config: str, overrides: list[str], demos: int, steps: int, workdir: Path) -> dict:
    from ragen_jax.config import load_config
    from ragen_jax.sft.trainer import SFTTrainer

    cfg = load_config(config, [f"sft.num_demos={demos}", *overrides])
    tr = SFTTrainer(cfg, workdir, quiet=True)
    d = tr.make_demos()
    widths = np.unique(d.width)
    t0 = time.perf_counter()
    k, warmed = 0, set()
    while len(warmed) < len(widths):  # compile every width once, outside the timing
        idx = tr.batch_indices(k)
        w = int(d.width[idx].max())
        if w not in warmed:
            tr.train_step(idx)
            warmed.add(w)
        k += 1
    compile_s = time.perf_counter() - t0
    times, tokens = [], 0
    for s in range(steps):
        idx = tr.batch_indices(k + s)
        t1 = time.perf_counter()
        tr.train_step(idx)  # returns host metrics: the step has finished
        times.append(time.perf_counter() - t1)
        tokens += int(d.length[idx].sum())
    return {
        "demos": int(d.num), "batch_size": cfg.sft.batch_size, "steps": steps,
        "shared_prefix_tokens": int(d.prefix_len), "padded_length": int(d.tokens.shape[1]),
        "widths": {int(w): int(n) for w, n in zip(*np.unique(d.width, return_counts=True))},
        "mean_demo_tokens": float(d.length.mean()),
        "median_s_per_step": statistics.median(times), "mean_s_per_step": statistics.fmean(times),
        "demo_tok_s": tokens / sum(times), "compile_s": compile_s, "compilations": tr.trace_count,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="demo_cpu.py")
    ap.add_argument("--demos", type=int, default=512, help="demonstrations generated (before filtering)")
    ap.add_argument("--steps", type=int, default=24, help="timed optimizer steps per variant")
    ap.add_argument("--quick", action="store_true", help="64 demos, 3 steps: checks that it runs")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    if a.quick:
        a.demos, a.steps = 64, 3
    m = machine()
    result = {"benchmark": "sft_step", "config": a.config, "machine": m,
              "runs": [{"machine": m, "settings": {"demos": a.demos, "steps": a.steps}}], "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, over in VARIANTS.items():
            row = {"variant": name, **bench_variant(a.config, over, a.demos, a.steps, Path(tmp) / name)}
            base = result["rows"][0] if result["rows"] else row
            row["speedup_vs_plain"] = base["median_s_per_step"] / row["median_s_per_step"]
            result["rows"].append(row)
            print(f"{name:>15}: {row['median_s_per_step']:.3f} s/step ({row['speedup_vs_plain']:.2f}x plain), "
                  f"widths {row['widths']}, shared prefix {row['shared_prefix_tokens']} tokens", flush=True)
            write_result(result, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
