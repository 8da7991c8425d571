"""One CPU-demo RL stage from a finished warm start, with the demo's paired evaluation (issue 15).

    python scripts/rl_variant.py --family sokoban --sft runs/demo/sokoban/sft --out /tmp/rl15/ppo4 \
        --eval-at 10,20 batching.ppo_epochs=4 batching.mini_batch_size=8

Runs only launch/demo.py's second stage (StarPO-S RL from `model.init_from=<sft>`, the family's
demo config plus the given overrides) and evaluates the policy on the demo's fixed states (same
seeds, temperature and sampling key as launch/demo.py's StageEvaluator; `--temperatures` adds
evaluations at other sampling temperatures, e.g. the training rollouts' 1.0) before RL and after each
iteration count in --eval-at, each compared with the warm start pairwise (ragen_jax/evaluation/paired.py
`paired_rates`: with --eval-samples 1, the default and the earlier results' protocol, flips and exact
McNemar p; with k > 1 rollouts per state, the per-state success rates' paired permutation test; both
with a bootstrap 95% interval of the mean gain). `--greedy` evaluates with argmax decoding instead. The
warm start's evaluation is cached in <out>/../<family>_before.json (<family>_before_T<t>.json at other
temperatures, _k<k> / _greedy for the other protocols), keyed by the SFT run (its path and export
time), the number of states, the temperature, k and greedy, the only things its outcome depends on
besides the fixed eval settings, so variants of one warm start evaluate it once.
Writes <out>/rl (the run), <out>/it<N> per eval point (the policy in a finished run's layout: evaluate it
with launch/eval.py or continue from it with --sft <out>/it<N>), <out>/result.json, and prints one
line per eval point and temperature.
The SFT run is read, never written. Exists because launch/demo.py reruns (and cannot resume with
changed algo settings) the SFT stage; the demo itself is what gets published.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __name__ == "__main__":
    from ragen_jax.runtime import use_transparent_hugepages

    use_transparent_hugepages()

from absl import logging as absl_logging

from ragen_jax.recipes.demo import (EVAL_STATES, EVAL_TEMPERATURE, FROZEN_LAKE_EVAL_ENVS, MODEL_CONFIGS, SOKOBAN_EVAL_ENVS,
                                    StageEvaluator)
from ragen_jax.experiment.config import load_config
from ragen_jax.evaluation.paired import format_paired, paired_rates
from ragen_jax.trainer.rl import Trainer

FAMILIES = {"sokoban": SOKOBAN_EVAL_ENVS[0], "frozen_lake": FROZEN_LAKE_EVAL_ENVS[0]}  # family -> its eval env


def parse(argv=None):
    """The command line -> (args, experiment config, eval points, temperatures); every check that needs no
    model is made here, before anything is compiled or written (`SystemExit` with one sentence)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, choices=sorted(FAMILIES))
    p.add_argument("--model", choices=tuple(MODEL_CONFIGS), default="tiny",
                   help="the policy's demo config (launch/demo.py --model): tiny (random init) or smollm2")
    p.add_argument("--sft", required=True, help="the finished SFT run directory (read only)")
    p.add_argument("--out", required=True, help="this variant's directory (must not hold a finished run)")
    p.add_argument("--eval-at", default="", help="comma-separated iteration counts to evaluate at "
                                                 "(default: train.iterations only)")
    p.add_argument("--eval-states", type=int, default=EVAL_STATES)
    p.add_argument("--temperatures", default=str(EVAL_TEMPERATURE),
                   help=f"comma-separated evaluation temperatures (default {EVAL_TEMPERATURE}, the demo's); the "
                        "first is the one result.json's points report, every one is printed and kept")
    p.add_argument("--eval-samples", type=int, default=1,
                   help="rollouts per state of every evaluation (default 1: the published results' protocol; "
                        "k > 1 compares per-state success rates, docs/experiments/pretrained.md 'How many samples per state')")
    p.add_argument("--greedy", action="store_true", help="evaluate with argmax decoding (temperatures ignored)")
    p.add_argument("overrides", nargs="*", help="config overrides section.key=value")
    # Intermixed: overrides may come before and after the options (plain parse_args rejects
    # `a=1 --out X b=2`).
    args = p.parse_intermixed_args(argv)
    if os.path.exists(os.path.join(args.out, "metrics.jsonl")):
        p.error(f"--out {args.out!r} already holds a variant (metrics.jsonl); use a fresh directory")
    if not os.path.isdir(os.path.join(args.sft, "policy")):
        p.error(f"--sft {args.sft!r} holds no exported policy (<sft>/policy); give a finished SFT run directory")
    config_name = MODEL_CONFIGS[args.model][args.family]
    cfg = load_config(config_name, list(args.overrides) + [f"model.init_from={os.path.abspath(args.sft)}",
                                                           "train.val_every=0"])
    n_it = cfg.train.iterations
    try:
        points = sorted({int(x) for x in args.eval_at.split(",") if x} | {n_it})
    except ValueError:
        p.error(f"--eval-at must be comma-separated iteration counts, got {args.eval_at!r}")
    if points[0] < 1 or points[-1] > n_it:
        p.error(f"--eval-at points must lie in 1..train.iterations={n_it}, got {args.eval_at!r}")
    try:
        temps = [float(x) for x in args.temperatures.split(",") if x]
    except ValueError:
        p.error(f"--temperatures must be comma-separated numbers, got {args.temperatures!r}")
    if not temps or min(temps) <= 0:
        p.error(f"--temperatures must name at least one temperature > 0, got {args.temperatures!r}")
    if args.eval_samples < 1:
        p.error(f"--eval-samples must be a positive integer (rollouts per state), got {args.eval_samples}")
    if args.greedy:
        temps = temps[:1]  # argmax decoding: one evaluation per point, whatever the temperature
    return args, cfg, points, temps


def warm_start_results(args, evaluators, rl, env, temps) -> dict:
    """The warm start's evaluation per temperature, from <out>/../<family>_before*.json when that cache
    was written for the same SFT export, state count and temperature, else evaluated and cached."""
    # A cache written for another warm start is re-evaluated and replaced, never compared with.
    policy = os.path.join(os.path.abspath(args.sft), "policy")
    befores = {}
    for t in temps:
        tag = "" if t == EVAL_TEMPERATURE else f"_T{t:g}"
        tag += (f"_k{args.eval_samples}" if args.eval_samples > 1 else "") + ("_greedy" if args.greedy else "")
        cache = os.path.join(os.path.dirname(os.path.abspath(args.out)), f"{args.family}_before{tag}.json")
        key = {"sft": os.path.abspath(args.sft), "eval_states": args.eval_states, "temperature": t,
               "policy_mtime": os.path.getmtime(policy) if os.path.exists(policy) else None}
        if args.eval_samples > 1 or args.greedy:  # the earlier caches' keys stay valid
            key.update(eval_samples=args.eval_samples, greedy=args.greedy)
        before = None
        if os.path.exists(cache):
            with open(cache) as f:
                cached = json.load(f)
            if cached.get("key") == key:
                before = cached
        if before is None:
            e0 = time.perf_counter()
            before = evaluators[t](rl.actor_params)[env]
            before["eval_wall_s"] = time.perf_counter() - e0
            before["key"] = key
            with open(cache, "w") as f:
                json.dump(before, f)
        befores[t] = before
        print(f"warm start (T={t:g}): {env} success {before['success']:.3f} (format {before['format_ok']:.2f})",
              flush=True)
    return befores


def main(argv=None) -> int:
    args, cfg, points, temps = parse(argv)
    absl_logging.set_verbosity(absl_logging.ERROR)
    env = FAMILIES[args.family]
    n_it = cfg.train.iterations
    os.makedirs(args.out, exist_ok=True)

    t0, c0 = time.perf_counter(), time.process_time()
    rl = Trainer(cfg, os.path.join(args.out, "rl"), quiet=True)
    if rl.iteration:
        raise SystemExit(f"{args.out}/rl already holds a run at iteration {rl.iteration}; use a fresh --out")
    setup_s, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
    evaluators = {t: StageEvaluator(rl, (env,), args.eval_states, temperature=t, repeats=args.eval_samples,
                                    greedy=args.greedy) for t in temps}

    befores = warm_start_results(args, evaluators, rl, env, temps)

    rows, train_s, train_cpu = [], 0.0, 0.0
    metrics_f = open(os.path.join(args.out, "metrics.jsonl"), "w")
    for it in range(1, n_it + 1):
        t1, c1 = time.perf_counter(), time.process_time()
        m = rl.iteration_step()
        train_s += time.perf_counter() - t1
        train_cpu += time.process_time() - c1
        metrics_f.write(json.dumps({"iteration": it, **{k: float(v) for k, v in m.items()
                                                         if isinstance(v, (int, float))}}) + "\n")
        metrics_f.flush()
        if it not in points:
            continue
        # A finished run's layout per point: evaluated again with launch/eval.py, or continued
        # with `--sft <out>/it<N>`.
        rl.export(os.path.join(args.out, f"it{it}"))
        for t in temps:
            e1 = time.perf_counter()
            after = evaluators[t](rl.actor_params)[env]
            before = befores[t]
            pc = paired_rates(before["state_success"], after["state_success"], args.eval_samples)
            row = {"iteration": it, "temperature": t, "success": after["success"], "format_ok": after["format_ok"],
                   # k = 1: flips each way (McNemar); k > 1: states whose rate rose / fell.
                   "gained": pc.get("gained", pc["improved"]), "lost": pc.get("lost", pc["worsened"]),
                   "p_value": pc["p_value"], "change": pc["change"], "ci95": pc["ci95"],
                   "wilcoxon_p": pc["wilcoxon_p"], "samples_per_state": args.eval_samples, "greedy": args.greedy,
                   "rl_train_s": train_s, "rl_train_cpu_s": train_cpu, "eval_s": time.perf_counter() - e1,
                   "loadavg": os.getloadavg()[0],
                   # Per-state outcomes: variants of one warm start compare state by state
                   # (scripts/compare_variants.py).
                   "state_success": [float(x) for x in after["state_success"]]}
            rows.append(row)
            print(f"it {it:3d} ({'greedy' if args.greedy else f'T={t:g}'}): {format_paired(pc)}, format "
                  f"{after['format_ok']:.2f}; RL {train_s:.0f} s ({train_cpu:.0f} CPU s), load {row['loadavg']:.1f}",
                  flush=True)
    metrics_f.close()
    strip = ("key",)
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"family": args.family, "overrides": args.overrides, "sft": os.path.abspath(args.sft),
                   "before": {k: v for k, v in befores[temps[0]].items() if k not in strip},
                   "before_by_temperature": {f"{t:g}": {k: v for k, v in b.items() if k not in strip}
                                             for t, b in befores.items()},
                   "eval_states": args.eval_states, "eval_samples": args.eval_samples, "greedy": args.greedy,
                   "setup_s": setup_s, "setup_cpu_s": setup_cpu,
                   "points": [r for r in rows if r["temperature"] == temps[0]],
                   "points_by_temperature": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
