"""Seconds per SFT optimizer step on real demonstrations, with and without the two exact speed-ups.

The SFT trainer of a config (default: the CPU demo's Sokoban stage, `configs/demo_cpu.py`) makes
`--demos` solver demonstrations, then times `--steps` optimizer steps in each variant, side by side
in one process (the machines are shared: compare the ratio, not the seconds across runs):

  plain           every demo padded to the longest, each row runs its whole conversation
  shared_prefix   the prompt prefix all demos share is run once per batch (`sft.shared_prefix`)
  prefix+buckets  ... and batches drawn from one length bucket, padded to its width
  +head at targets ... and the vocabulary head only at the assistant's tokens (`sft.head_at_targets`)
  +prompt groups  ... and each distinct prompt of a batch run once, every row only its answer
                  (`sft.group_prompts`; the default; taken only where it is cheaper: SmolLM2 Bandit's
                  demos show 2 prompts, the Sokoban demo's rooms all differ, so there it equals the row above)

  + huge pages     the default again, in a child process whose glibc malloc uses transparent
                  huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, what the launchers set:
                  ragen_jax/runtime.py); only where the kernel's THP mode is "madvise", glibc >= 2.35

Each variant first runs one step per batch width (compilation, excluded), then `--steps` timed
steps over the epoch's own batch order. The loss of a batch is the same in every variant
(tests/ragen_jax/trainer/test_sft.py checks it); only the padding and the repeated prefix go. Kernel
time and minor page faults per step (getrusage over the timed steps) show the allocator's cost.

Usage: python -m bench.sft_step [--config demo_cpu.py] [--demos 512] [--steps 24] [--quick]
       [--variants NAME ...] [--no-hugepages] [--out bench/results/sft_step.json] [section.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


import numpy as np

from bench.common import machine, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "sft_step.json"
NO_GROUPS = "sft.group_prompts=false"
VARIANTS = {
    "plain": ["sft.shared_prefix=false", "sft.length_bucket=0", "sft.head_at_targets=false", NO_GROUPS],
    "shared_prefix": ["sft.length_bucket=0", "sft.head_at_targets=false", NO_GROUPS],
    "prefix+buckets": ["sft.head_at_targets=false", NO_GROUPS],
    "+head at targets": [NO_GROUPS],
    "+prompt groups": [],
}


def bench_variant(config: str, overrides: list[str], demos: int, steps: int, workdir: Path) -> dict:
    """One variant's row: `overrides` are the variant's and the command line's config overrides."""
    from ragen_jax.experiment.config import load_config
    from ragen_jax.trainer.sft import SFTTrainer

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
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for s in range(steps):
        idx = tr.batch_indices(k + s)
        t1 = time.perf_counter()
        tr.train_step(idx)  # returns host metrics: the step has finished
        times.append(time.perf_counter() - t1)
        tokens += int(d.length[idx].sum())
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "demos": int(d.num), "batch_size": cfg.sft.batch_size, "steps": steps,
        "shared_prefix_tokens": int(d.prefix_len), "padded_length": int(d.tokens.shape[1]),
        "prompt_groups": int(tr.demo_stats["demo/prompt_groups"]),
        "widths": {int(w): int(n) for w, n in zip(*np.unique(d.width, return_counts=True))},
        "mean_demo_tokens": float(d.length.mean()),
        "median_s_per_step": statistics.median(times), "mean_s_per_step": statistics.fmean(times),
        "demo_tok_s": tokens / sum(times), "compile_s": compile_s, "compilations": tr.trace_count,
        "kernel_s_per_step": (r1.ru_stime - r0.ru_stime) / steps,
        "minor_faults_per_step": (r1.ru_minflt - r0.ru_minflt) / steps,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
    }


def bench_in_child(config: str, variant: str, demos: int, steps: int, env: dict, overrides: list[str]) -> dict:
    """One variant in a fresh process (allocator settings are fixed at process start)."""
    cmd = [sys.executable, "-m", "bench.sft_step", "--config", config, "--demos", str(demos), "--steps", str(steps),
           "--child", variant, *overrides]
    out = subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"child benchmark failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="demo_cpu.py")
    ap.add_argument("--demos", type=int, default=512, help="demonstrations generated (before filtering)")
    ap.add_argument("--steps", type=int, default=24, help="timed optimizer steps per variant")
    ap.add_argument("--quick", action="store_true", help="64 demos, 3 steps: checks that it runs")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                    help="which variants (default: all); speed-ups are relative to the first")
    ap.add_argument("--no-hugepages", action="store_true", help="leave out the huge-pages child row")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)  # internal: one row as JSON
    ap.add_argument("overrides", nargs="*", help="config overrides section.key=value for every variant, "
                    "e.g. sft.batch_size=8")
    a = ap.parse_args(argv)
    if a.quick:
        a.demos, a.steps = 64, 3
    if a.child:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(bench_variant(a.config, [*VARIANTS[a.child], *a.overrides], a.demos, a.steps, Path(tmp) / "c")))
        return 0
    m = machine()
    result = {"benchmark": "sft_step", "config": a.config, "machine": m,
              "runs": [{"machine": m, "settings": {"demos": a.demos, "steps": a.steps, "overrides": a.overrides}}], "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.variants:
            over = VARIANTS[name]
            row = {"variant": name, **bench_variant(a.config, [*over, *a.overrides], a.demos, a.steps, Path(tmp) / name)}
            base = result["rows"][0] if result["rows"] else row
            row["speedup_vs_plain"] = base["median_s_per_step"] / row["median_s_per_step"]
            result["rows"].append(row)
            print(f"{name:>15}: {row['median_s_per_step']:.3f} s/step ({row['speedup_vs_plain']:.2f}x plain), "
                  f"widths {row['widths']}, shared prefix {row['shared_prefix_tokens']} tokens", flush=True)
            write_result(result, a.out)
    from ragen_jax.runtime import hugepage_env

    env = hugepage_env({k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"})
    if env is None or a.no_hugepages:
        if env is None:
            print("malloc huge pages: not applicable here (THP mode, glibc or platform); row skipped")
        return 0
    row = {"variant": "+prompt groups, huge pages",
           **bench_in_child(a.config, "+prompt groups", a.demos, a.steps, env, a.overrides)}
    row["speedup_vs_plain"] = result["rows"][0]["median_s_per_step"] / row["median_s_per_step"]
    result["rows"].append(row)
    print(f"{row['variant']:>15}: {row['median_s_per_step']:.3f} s/step ({row['speedup_vs_plain']:.2f}x plain), "
          f"{row['minor_faults_per_step']:,.0f} minor faults/step", flush=True)
    write_result(result, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
