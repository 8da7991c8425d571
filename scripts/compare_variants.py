"""Paired comparison of RL variants of one warm start (scripts/rl_variant.py outputs), state by state.

    python -m scripts.compare_variants --family sokoban --sft runs/demo/sokoban/sft \
        runs/v33/sok_base runs/v33/sok_gigpo runs/v33/sok_bf16_tis

Each variant's last evaluation point (<variant>/it<N>, the exported policy) is evaluated again on the
demo's fixed states with rl_variant's evaluator (same seeds, temperature and sampling key), and every
variant after the first is compared with the first (ragen_jax/evaluation/paired.py `paired_rates`:
flips each way and exact McNemar p for one rollout per state, the paired permutation test on per-state
rates for rl_variant's --eval-samples k > 1; a bootstrap 95% interval of the mean difference either
way). Every variant must have been evaluated with the same k and decoding (greedy or sampled). The re-evaluated success must equal the one rl_variant recorded in
<variant>/result.json (a check that the export reproduces the trained policy); variants whose
result.json already keeps the per-state outcomes (`state_success`, written by rl_variant since
this script exists) are not evaluated again.
Writes <first variant>/../compare_<family>.json and prints one line per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from absl import logging as absl_logging


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, choices=("sokoban", "frozen_lake"))
    p.add_argument("--model", default="tiny", help="the demo config the variants ran (rl_variant --model)")
    p.add_argument("--sft", required=True, help="the warm start the variants started from (read only)")
    p.add_argument("--temperature", type=float, default=None, help="default: the demo's evaluation temperature")
    p.add_argument("variants", nargs="+", help="rl_variant --out directories; the first is the baseline")
    args = p.parse_args(argv)
    if len(args.variants) < 2:
        p.error("give at least two variant directories (the first is the baseline)")
    for v in args.variants:
        if not os.path.isfile(os.path.join(v, "result.json")):
            p.error(f"{v!r} holds no finished rl_variant run (result.json); give rl_variant --out directories")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    from ragen_jax.evaluation.paired import format_paired, paired_rates
    from ragen_jax.evaluation.policies import load_for_eval
    from ragen_jax.recipes.demo import EVAL_STATES, EVAL_TEMPERATURE, MODEL_CONFIGS, StageEvaluator
    from ragen_jax.experiment.config import load_config
    from ragen_jax.trainer.rl import Trainer
    from scripts.rl_variant import FAMILIES

    absl_logging.set_verbosity(absl_logging.ERROR)
    temp = EVAL_TEMPERATURE if args.temperature is None else args.temperature
    env = FAMILIES[args.family]
    results, rl, evaluator, protocols = [], None, None, set()
    for v in args.variants:
        with open(os.path.join(v, "result.json")) as f:
            res = json.load(f)
        protocols.add((int(res.get("eval_samples", 1)), bool(res.get("greedy", False))))
        if len(protocols) > 1:
            raise SystemExit(f"{v} was evaluated with (rollouts per state, greedy) = {sorted(protocols)[-1]}, another "
                             f"variant with {sorted(protocols)[0]}; compare variants evaluated the same way")
        k, greedy = next(iter(protocols))
        point = [r for r in res["points_by_temperature"] if r["temperature"] == temp][-1]
        states = point.get("state_success")
        if states is None:
            if rl is None:  # one trainer (one compilation) evaluates every variant's export
                cfg = load_config(MODEL_CONFIGS[args.model][args.family],
                                  [f"model.init_from={os.path.abspath(args.sft)}", "train.val_every=0"])
                rl = Trainer(cfg, tempfile.mkdtemp(prefix="compare_variants-"), quiet=True)
                evaluator = StageEvaluator(rl, (env,), int(res.get("eval_states", EVAL_STATES)), temperature=temp,
                                           repeats=k, greedy=greedy)
            params = load_for_eval(os.path.join(v, f"it{point['iteration']}")).params
            out = evaluator(params)[env]
            if abs(out["success"] - point["success"]) > 1e-9:
                raise SystemExit(f"{v}: the export re-evaluates to success {out['success']:.4f}, not the recorded "
                                 f"{point['success']:.4f}; the comparison would not be of the trained policies")
            states = out["state_success"]
        results.append((v, res, point, states))
    base_v, _, base_point, base = results[0]
    rows = []
    for v, res, point, states in results:
        pc = paired_rates(base, states, k)
        rows.append({"variant": v, "overrides": res["overrides"],
                     "success": point["success"], "vs_baseline": pc, "rl_train_s": point["rl_train_s"]})
        print(f"{os.path.basename(v.rstrip('/'))} vs the baseline: {format_paired(pc)}; RL {point['rl_train_s']:.0f} s",
              flush=True)
    out_path = os.path.join(os.path.dirname(os.path.abspath(args.variants[0])), f"compare_{args.family}.json")
    with open(out_path, "w") as f:
        json.dump({"family": args.family, "temperature": temp, "samples_per_state": k, "greedy": greedy,
                   "baseline": base_v, "rows": rows}, f, indent=2)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
