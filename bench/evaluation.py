"""The evaluation rollout before and after prefilling each distinct first observation once.

The demo's and launch/eval.py's evaluation runs one rollout per initial state (256 states, one sample
each, temperature 0.5). Many seeds render the same first observation (Bandit's arm order: 2 texts;
BanditPairs: 24), and one-turn episodes copy a prefilled observation to every row that shows it:
  before   `RolloutConfig.distinct_first=False`: every state prefills its own observation (only the
           prompt prefix all states share runs once)
  after    the default: each distinct observation runs once (rollout.py `first_rows`)
Both programs are compiled ahead (seconds reported apart), then run `--reps` times, the two sides
interleaved (the machine is shared: only ratios from one run compare). The success of every state is
recorded on both sides; they sample from the same logits up to float rounding, so they agree state
by state except where rounding moves a draw (counted).

Usage: python -m bench.evaluation --policy runs/<demo>/bandit/sft [--envs Bandit BanditTest]
       [--states 256] [--reps 1] [--tag NAME] [--out bench/results/evaluation.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

from bench.common import read_result, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "evaluation.json"
SIDES = {"before": False, "after": True}  # RolloutConfig.distinct_first


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", required=True, help="a run or stage directory (launch/eval.py's POLICY)")
    ap.add_argument("--envs", nargs="+", default=["Bandit", "BanditTest"])
    ap.add_argument("--states", type=int, default=256)
    ap.add_argument("--max-context", type=int, default=256, help="rollout.max_context (configs/smollm2_bandit.py's)")
    ap.add_argument("--cache-dtype", default="float32", help="rollout.cache_dtype (configs/smollm2_bandit.py's)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--tag", default=None, help="row name (default: the policy directory's name)")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)

    import jax
    import numpy as np

    from ragen_jax.evaluation.policies import load_for_eval
    from ragen_jax.evaluation.suite import get_rollout
    from ragen_jax.recipes.demo import EVAL_SEED_START
    from ragen_jax.rollout import Rollout

    lp = load_for_eval(a.policy)
    out = Path(a.out)
    result = read_result(out)
    key, seeds = jax.random.PRNGKey(0), np.arange(EVAL_SEED_START, EVAL_SEED_START + a.states, dtype=np.int32)
    rows = []
    for env in a.envs:
        after = get_rollout(lp.policy, lp.tokenizer, env, num_states=a.states, rollouts_per_state=1, temperature=0.5,
                            greedy=False, prompt=lp.prompt, max_context=a.max_context,
                            cache_dtype=a.cache_dtype, vocab=lp.vocab)
        ros = {"after": after, "before": Rollout(lp.policy, after.text_env,
                                                 dataclasses.replace(after.config, distinct_first=False),
                                                 vocab=lp.vocab)}
        compile_s = {}
        for side in SIDES:
            t0 = time.perf_counter()
            ros[side].use_compiled(ros[side].lower(lp.params, key, seeds).compile())
            compile_s[side] = round(time.perf_counter() - t0, 1)
            print(f"{env} {side}: compiled in {compile_s[side]} s", flush=True)
        runs, success = {side: [] for side in SIDES}, {}
        for i in range(a.reps):
            for side in SIDES:
                t0 = time.perf_counter()
                traj = jax.device_get(ros[side](lp.params, key, seeds))
                runs[side].append(round(time.perf_counter() - t0, 2))
                success[side] = np.asarray(traj.success, bool)
                print(env, side, i, runs[side][-1], "s", flush=True)
        row = {"env": env, "states": a.states, "reps": a.reps, "first_rows": after.first_rows,
               "distinct_first_observations": after.text_env.distinct_first_segments, "compile_s": compile_s,
               "per_rep_s": runs, "success_before": float(success["before"].mean()),
               "success_after": float(success["after"].mean()),
               "states_that_differ": int((success["before"] != success["after"]).sum())}
        for side in SIDES:
            row[f"{side}_s"] = round(statistics.median(runs[side]), 2)
        row["ratio"] = round(row["before_s"] / max(row["after_s"], 1e-9), 2)
        print({k: v for k, v in row.items() if k != "per_rep_s"}, flush=True)
        rows.append(row)
    tag = a.tag or Path(a.policy).resolve().parent.name + "/" + Path(a.policy).name
    for r in rows:
        r["tag"] = tag
    result["rows"] = [r for r in result.get("rows", []) if r.get("tag") != tag] + rows
    write_result(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
