"""One RL iteration's phases (rollout, prepare, update seconds) before and after issue 45, same run.

Two Trainers are built from the same config, the same initial weights and the same seeds:
  before   rollout.shared_prefix=false, rollout.filled_reads=false: every row prefills its own copy
           of the prompt prefix, the trainer scores it once per row, and every decode step reads the
           cache's whole capacity (the work before issue 45)
  after    the defaults: the prefix prefilled for one row and broadcast, each group's first
           observation prefilled once, the prefix scored once per batch and each group's shared
           beginning once (trainer/group_prefix.py), and cached attention reading only the filled slots
Each runs one warm-up iteration (compilation; its seconds are reported as compile time), then
`--iterations` iterations, the two interleaved iteration by iteration (the machine is shared: only
ratios from one run compare). The Trainer's `sync_phases` times prepare and update apart. Rows:
median seconds per phase per side and `ratio_<phase>` = before / after (> 1: after is faster).
Iteration i of both sides samples from the same seeds; the policies drift apart after the first
update only by float rounding, so the workloads (response lengths) stay comparable; both are recorded.

Usage: python -m bench.rl_iteration --config smollm2_bandit.py [--iterations 3] [--tag NAME]
       [--out bench/results/rl_iteration.json] [override ...]   (overrides as launch/tpu_train.py's
       --config.<key>=<value>, written <key>=<value>)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import read_result, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "rl_iteration.json"
SIDES = {"before": {"rollout.shared_prefix": "false", "rollout.filled_reads": "false"}, "after": {}}
PHASES = ("rollout_s", "prepare_s", "only_update_s")


def _trainer(config: str, overrides: list[str], side: str, workdir: str):
    from ragen_jax.experiment.config import load_config
    from ragen_jax.trainer.rl import Trainer

    extra = [f"{k}={v}" for k, v in SIDES[side].items()]
    cfg = load_config(config, [*overrides, *extra, "train.save_every=1000000", "train.val_every=0", "train.log_samples=0",
                                       "train.collapse_every=0"])
    trainer = Trainer(cfg, workdir, quiet=True)
    trainer.sync_phases = True
    return trainer


def _phases(m: dict) -> dict:
    return {"rollout_s": m["timing/rollout_s"], "prepare_s": m["timing/prepare_s"],
            "only_update_s": m["timing/only_update_s"], "response_length": m["response_length/mean"],
            "success": m.get("train/success", float("nan"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--tag", default=None, help="row name (default: the config's stem)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    out = Path(a.out)
    result = read_result(out)
    tag = a.tag or Path(a.config).stem
    with tempfile.TemporaryDirectory() as tmp:
        trainers, compile_s = {}, {}
        for side in SIDES:
            t0 = time.perf_counter()
            trainers[side] = _trainer(a.config, a.overrides, side, f"{tmp}/{side}")
            trainers[side].iteration_step()  # warm-up: compiles rollout, prepare and update
            compile_s[side] = round(time.perf_counter() - t0, 1)
            print(f"{side}: build + first iteration {compile_s[side]} s", flush=True)
        runs = {side: [] for side in SIDES}
        for i in range(a.iterations):
            for side, trainer in trainers.items():
                runs[side].append(_phases(trainer.iteration_step()))
                print(side, i, runs[side][-1], flush=True)
    row = {"tag": tag, "config": a.config, "overrides": a.overrides, "iterations": a.iterations,
           "build_and_first_iteration_s": compile_s, "per_iteration": runs}
    for side in SIDES:
        for ph in (*PHASES, "response_length"):
            row[f"{side}_{ph}"] = round(statistics.median(r[ph] for r in runs[side]), 3)
        row[f"{side}_iteration_s"] = round(sum(row[f"{side}_{ph}"] for ph in PHASES), 3)
    for ph in (*PHASES, "iteration_s"):
        row[f"ratio_{ph}"] = round(row[f"before_{ph}"] / max(row[f"after_{ph}"], 1e-9), 2)
    print({k: v for k, v in row.items() if k != "per_iteration"}, flush=True)
    result["rows"] = [r for r in result.get("rows", []) if r.get("tag") != tag] + [row]
    result["settings"] = {"sides": SIDES}
    write_result(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
