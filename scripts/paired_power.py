"""Calibration and power of the paired k-sample evaluation (ragen_jax/evaluation/paired.py), issue 46.

    python -m scripts.paired_power simulate --out docs/pretrained_results/paired_power.json
    python -m scripts.paired_power policy --run runs/demo/sokoban/sft --family sokoban \
        --samples 1,8 --pairs 20 --states 128 --out docs/pretrained_results/paired_selfcheck_demo.json

`simulate`: per-state Bernoulli rates drawn from a state mix (Beta laws, or the per-state rates a
`policy` run measured), k samples per state before and after; for each k, the fraction of
`--trials` experiments rejecting at p < 0.05 when nothing changed (calibration) and when every
state's logit moved by the shift that raises the mix's mean success by `--gain` (power), and the
smallest gain with 80% power. Both tests of paired.py (the paired permutation test and Wilcoxon)
are counted.

`policy`: one policy (a finished run directory of launch/demo.py's tiny models or SmolLM2) evaluated
against itself: `--pairs` pairs of evaluations with different sampling keys (keys 1, 2, ...; the demo
publishes key 0) on the demo's fixed states, each pair compared with paired_rates: how many of the
pairs reject at p < 0.05 (the target: at most 1 of 20). Also keeps the per-state rates over all the
samples (the state mix `simulate --mix` reads) and the evaluation seconds per k (its cost).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from ragen_jax.evaluation.paired import signflip_test, wilcoxon_test

ALPHA = 0.05
# Beta(a, b) state mixes: a mean and how spread the states are (a + b small: many states at ~0 or ~1,
# as Sokoban rooms that a policy always or never solves).
BETA_MIXES = {"beta_mean0.2_conc1": (0.2, 1.0), "beta_mean0.2_conc4": (0.2, 4.0),
              "beta_mean0.6_conc1": (0.6, 1.0), "beta_mean0.6_conc4": (0.6, 4.0)}


def logit(p):
    return np.log(p) - np.log1p(-p)


def shift_for_gain(rates: np.ndarray, gain: float) -> float:
    """The logit shift that raises the mean of `rates` by `gain` (bisection)."""
    lp = logit(np.clip(rates, 1e-4, 1 - 1e-4))
    target = float(np.mean(rates)) + gain
    if not 0 < target < 1:
        raise ValueError(f"a gain of {gain} from a mean of {np.mean(rates):.3f} leaves (0, 1)")
    lo, hi = 0.0, 20.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if np.mean(1 / (1 + np.exp(-(lp + mid)))) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def draw_states(mix, n: int, rng) -> np.ndarray:
    """n per-state rates: from a Beta (mean, concentration) or resampled from measured rates."""
    if isinstance(mix, tuple):
        mean, conc = mix
        return rng.beta(mean * conc, (1 - mean) * conc, size=n)
    return rng.choice(np.asarray(mix), size=n, replace=True)


def rejection_rates(mix, n: int, k: int, gain: float, trials: int, seed: int) -> dict:
    """Fraction of trials with p < ALPHA (permutation, Wilcoxon) for a true mean gain of `gain`."""
    rng = np.random.default_rng(seed)
    perm = wil = 0
    for _ in range(trials):
        p = draw_states(mix, n, rng)
        q = p if gain == 0 else 1 / (1 + np.exp(-(logit(np.clip(p, 1e-4, 1 - 1e-4)) + shift_for_gain(p, gain))))
        d = rng.binomial(k, q) - rng.binomial(k, p)
        perm += signflip_test(d)[0] < ALPHA
        wil += wilcoxon_test(d)[0] < ALPHA
    return {"permutation": perm / trials, "wilcoxon": wil / trials}


def smallest_detected(mix, n: int, k: int, trials: int, seed: int, power: float = 0.8) -> float | None:
    """The smallest gain (whole points, 1..20) the permutation test detects with `power` (power
    grows with the gain: a bisection); None when even 20 points (or the most the mix allows) is not."""
    def detected(pts):
        try:
            return rejection_rates(mix, n, k, pts / 100, trials, seed)["permutation"] >= power
        except ValueError:  # the gain leaves (0, 1) for this mix
            return False

    lo, hi = 0, 20
    if not detected(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if detected(mid) else (mid, hi)
    return hi / 100


def simulate(args) -> dict:
    names = BETA_MIXES if args.beta is None else [n for n in args.beta.split(",") if n]
    mixes = {name: BETA_MIXES[name] for name in names}
    if args.mix:
        with open(args.mix) as f:
            measured = json.load(f)
        mixes[f"measured:{measured['run']}"] = measured["state_rates"]
    ks = [int(x) for x in args.samples.split(",")]
    rows = []
    for name, mix in mixes.items():
        for k in ks:
            t0 = time.perf_counter()
            null = rejection_rates(mix, args.states, k, 0.0, args.trials, args.seed)
            alt = rejection_rates(mix, args.states, k, args.gain, args.trials, args.seed + 1)
            row = {"mix": name, "samples_per_state": k, "states": args.states, "trials": args.trials,
                   "false_positive_rate": null, "power_at_gain": alt, "gain": args.gain,
                   "smallest_gain_80pct_power": smallest_detected(mix, args.states, k, args.trials // 4,
                                                                  args.seed + 2),
                   "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(f"{name:28s} k={k:2d}: false positives {null['permutation']:.3f} (Wilcoxon {null['wilcoxon']:.3f}), "
                  f"power at +{args.gain * 100:.0f} points {alt['permutation']:.3f} (Wilcoxon {alt['wilcoxon']:.3f}), "
                  f"80% power from +{(row['smallest_gain_80pct_power'] or float('nan')) * 100:.0f} points",
                  flush=True)
    return {"kind": "simulation", "alpha": ALPHA, "states": args.states, "trials": args.trials, "gain": args.gain,
            "seed": args.seed, "effect_model": "every state's logit shifted by the one amount that raises the mix's "
                                               "mean success by the gain", "rows": rows}


def policy_selfcheck(args) -> dict:
    """One policy against itself under `--pairs` pairs of sampling keys, per k."""
    import jax
    from absl import logging as absl_logging

    from ragen_jax.evaluation.paired import paired_rates
    from ragen_jax.evaluation.policies import load_source
    from ragen_jax.evaluation.suite import evaluate
    from ragen_jax.recipes.demo import EVAL_SEED_START, EVAL_TEMPERATURE, FAMILY_EVAL_ENV

    absl_logging.set_verbosity(absl_logging.ERROR)
    env = FAMILY_EVAL_ENV[args.family]
    loaded, cfg = load_source(args.run)
    # The demo's StageEvaluator settings: the run's context budget, env overrides and cache dtype.
    settings = dict(prompt=loaded.prompt, vocab=loaded.vocab)
    if cfg is not None:
        settings.update(max_context=cfg.rollout.max_context, cache_dtype=cfg.rollout.cache_dtype,
                        env_overrides={cfg.env.name: cfg.env.overrides})
    rows, pooled = [], None
    for k in [int(x) for x in args.samples.split(",")]:
        evals, secs = [], []
        for key in range(1, 2 * args.pairs + 1):
            t0 = time.perf_counter()
            m = evaluate(loaded.policy, loaded.params, loaded.tokenizer, (env,), num_states=args.states,
                         seed_start=EVAL_SEED_START, repeats=k, temperature=EVAL_TEMPERATURE,
                         greedy=args.greedy, key=jax.random.PRNGKey(key), **settings)[env]
            secs.append(time.perf_counter() - t0)
            evals.append(np.asarray(m["state_success"]))
        tests = [paired_rates(evals[2 * i], evals[2 * i + 1], k, resamples=2000) for i in range(args.pairs)]
        pooled = np.mean(evals, axis=0) if pooled is None or k > 1 else pooled
        row = {"samples_per_state": k, "pairs": args.pairs,
               "rejections": sum(t["p_value"] < ALPHA for t in tests),
               "wilcoxon_rejections": sum(t["wilcoxon_p"] < ALPHA for t in tests),
               "p_values": [t["p_value"] for t in tests], "wilcoxon_p": [t["wilcoxon_p"] for t in tests],
               "changes": [t["change"] for t in tests], "success": [float(e.mean()) for e in evals],
               "eval_seconds_median": float(np.median(secs[1:] if len(secs) > 1 else secs))}
        rows.append(row)
        print(f"k={k}: {row['rejections']} of {args.pairs} self-comparisons reject at p < {ALPHA} (Wilcoxon "
              f"{row['wilcoxon_rejections']}); changes {min(row['changes']):+.3f} .. {max(row['changes']):+.3f}; "
              f"{row['eval_seconds_median']:.1f} s per evaluation", flush=True)
    return {"kind": "policy self-comparison", "run": args.run, "family": args.family, "env": env,
            "states": args.states, "greedy": args.greedy, "temperature": EVAL_TEMPERATURE, "alpha": ALPHA,
            "keys": f"1..{2 * args.pairs} (pair i: keys 2i+1, 2i+2)", "rows": rows,
            "state_rates": [float(x) for x in pooled]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("simulate")
    s.add_argument("--states", type=int, default=128)
    s.add_argument("--samples", default="1,2,4,8,16,32")
    s.add_argument("--gain", type=float, default=0.05)
    s.add_argument("--trials", type=int, default=2000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--mix", default=None, help="a `policy` JSON whose state_rates add a measured state mix")
    s.add_argument("--beta", default=None, help=f"comma-separated Beta mixes of {', '.join(BETA_MIXES)} (default all; "
                                                "'' with --mix: the measured mix alone)")
    s.add_argument("--out", default=None)
    q = sub.add_parser("policy")
    q.add_argument("--run", required=True, help="a finished run directory (or anything load_for_eval reads)")
    q.add_argument("--family", required=True, choices=("bandit", "sokoban", "frozen_lake"))
    q.add_argument("--samples", default="1,8")
    q.add_argument("--pairs", type=int, default=20)
    q.add_argument("--states", type=int, default=128)
    q.add_argument("--greedy", action="store_true")
    q.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.mode == "simulate" and (args.states < 1 or args.trials < 4 or not 0 <= args.gain < 1):
        p.error("--states must be >= 1, --trials >= 4 and --gain in [0, 1)")
    if args.mode == "simulate" and args.beta and set(args.beta.split(",")) - set(BETA_MIXES):
        p.error(f"--beta names mixes of {', '.join(BETA_MIXES)}, got {args.beta!r}")
    res = simulate(args) if args.mode == "simulate" else policy_selfcheck(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
