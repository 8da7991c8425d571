"""The RAGEN-2 collapse probe (trainer/collapse.py) before and after sharing each prompt per block.

The probe scores every sampled reasoning z_i under every group's prompt x_j: M x P rows [x_j | z_i].
  before   `CollapseProbe(share_prompts=False)`: every row runs through the model whole (only the
           prompt prefix all envs share runs once per block)
  after    the default: the rows are column-major, so a block of rows holds one or two prompts; each
           prompt runs once per block and each row only its reasoning (`sequence_logprobs`' groups)
One Trainer (no update is taken) samples one rollout batch; both probes plan the same pairs from it.
Each program is compiled ahead (seconds reported apart), then run `--reps` times, the two sides
interleaved (the machine is shared: only ratios from one run compare). The metrics of both sides
are recorded and must agree (they are the same numbers computed in another order).

Usage: python -m bench.collapse_probe --config smollm2_bandit.py [--init-from runs/.../bandit/sft]
       [--reps 1] [--tag NAME] [--out bench/results/collapse_probe.json] [override ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import read_result, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "collapse_probe.json"
SIDES = {"before": False, "after": True}  # share_prompts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--init-from", default=None, help="model.init_from (a warm start: reasonings to score)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--tag", default=None, help="row name (default: the config's stem)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)

    import jax
    import numpy as np

    from ragen_jax.experiment.config import load_config
    from ragen_jax.rollout import group_seeds_for_iteration
    from ragen_jax.rollout.metrics import host_copy
    from ragen_jax.trainer.collapse import CollapseProbe
    from ragen_jax.trainer.rl import Trainer

    out = Path(a.out)
    result = read_result(out)
    tag = a.tag or Path(a.config).stem
    over = list(a.overrides) + ["train.save_every=1000000", "train.val_every=0", "train.log_samples=0"]
    if a.init_from:
        over.append(f"model.init_from={a.init_from}")
    cfg = load_config(a.config, over)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, tmp, quiet=True)
        seeds = group_seeds_for_iteration(0, cfg.rollout.num_groups, cfg.train.seed_base)
        traj = trainer.sample(trainer.actor_params, jax.random.fold_in(trainer.state.key, 1), seeds)
        host = host_copy(traj)
        actor = trainer.actor_params
        probes, compiled, compile_s, plan = {}, {}, {}, None
        for side, share in SIDES.items():
            probes[side] = p = CollapseProbe(cfg, trainer.policy_graph, trainer.tokenizer, trainer.text_envs,
                                             vocab=trainer.vocab, mesh=trainer.mesh, share_prompts=share)
            plan, host_metrics = p.plan(host, 1)
            t0 = time.perf_counter()
            compiled[side] = p.program.lower(actor, traj.tokens, p.device_plan(plan)).compile()
            compile_s[side] = round(time.perf_counter() - t0, 1)
            print(f"{side}: compiled in {compile_s[side]} s", flush=True)
        runs = {side: [] for side in SIDES}
        metrics = {}
        for i in range(a.reps):
            for side in SIDES:
                dev_plan = probes[side].device_plan(plan)
                t0 = time.perf_counter()
                m = jax.device_get(compiled[side](actor, traj.tokens, dev_plan))
                runs[side].append(round(time.perf_counter() - t0, 2))
                metrics[side] = {k: float(v) for k, v in m.items()}
                print(side, i, runs[side][-1], "s", flush=True)
    for k in metrics["after"]:
        a_, b_ = metrics["before"][k], metrics["after"][k]
        if not np.isclose(a_, b_, rtol=1e-3, atol=1e-4, equal_nan=True):
            print(f"metrics differ: {k} before {a_} after {b_}", file=sys.stderr)
            return 1
    pr = probes["after"]
    row = {"tag": tag, "config": a.config, "init_from": a.init_from, "overrides": a.overrides, "reps": a.reps,
           "pairs": pr.m, "prompts": pr.p, "width": pr.width, "block": pr.block, "reasoning_tokens": pr.z_cap,
           "pairs_sampled": int(plan["row_valid"].sum()), "compile_s": compile_s, "per_rep_s": runs,
           "metrics_before": metrics["before"], "metrics_after": metrics["after"], "host_metrics": host_metrics}
    for side in SIDES:
        row[f"{side}_s"] = round(statistics.median(runs[side]), 2)
    row["ratio"] = round(row["before_s"] / max(row["after_s"], 1e-9), 2)
    print({k: v for k, v in row.items() if not k.startswith("metrics") and k != "per_rep_s"}, flush=True)
    result["rows"] = [r for r in result.get("rows", []) if r.get("tag") != tag] + [row]
    write_result(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
