"""RAGEN's recipe for a pretrained model in one lent-GPU call (issue 46), run by scripts/gpu_learn.sh.

    python -m scripts.gpu_learn --model .gpu_model/SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT/gpu_learn.json
    python -m scripts.gpu_learn --cpu-rehearsal --model /tmp/tiny.gguf --out /tmp/l.json   # CI: tiny shapes

Per environment, in order (Sokoban, then FrozenLake and Countdown while time is left):
  1. the format warm start: SFT of the model on the solver's demonstrations (the SmolLM2 configs'
     recipe with 256 demonstrations x 2 epochs, the fourth CPU attempt's: docs/experiments/pretrained.md),
  2. the k-sample evaluation of the warm start: `--eval-states` fixed states (seeds from 123) x
     k = `--eval-samples` x `--eval-repeats` rollouts each (default 128 x 16) at temperature 0.5
     (launch/demo.py's StageEvaluator),
  3. StarPO-S with RAGEN's settings (behaviour spec 5: P=8 x N=16, the 2 of 8 groups with the largest
     reward spread, PPO with a critic, clip 0.2 / 0.28, entropy 0.001, no KL, actor lr 1e-6, critic lr
     1e-5, one optimizer step per iteration) for as many iterations as fit (at most --iterations),
  4. the same evaluation after RL, compared state by state with the warm start's
     (ragen_jax/evaluation/paired.py `paired_rates`: mean gain, bootstrap 95% interval, exact paired
     permutation test and Wilcoxon).

A wall-clock budget (`--budget-s`, counted from this process's start) keeps the call inside its limit:
RL stops while the after-RL evaluation (timed as the warm start's, compile included) still fits, and
an environment after the first starts only when the first's whole cost fits in what is left. The JSON
is written after every stage, so a run cut short keeps what finished. `--set key=value` changes the RL
stage (e.g. `--set optim.actor_lr=1e-5`), `--sft-set` the warm start. Bad input: one sentence, exit 2,
before anything is built. `python -m scripts.gpu_results` does not read these files; scripts/readme_results.py
renders bench/results/gpu_runs/*learn*.json into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

T_START = time.perf_counter()

# family -> (eval env, SmolLM2 config): Sokoban first (issue 46's target), then the others.
FAMILIES = {"sokoban": ("Sokoban", "smollm2_sokoban.py"), "frozen_lake": ("FrozenLake", "smollm2_frozen_lake.py"),
            "countdown": ("Countdown", "smollm2_countdown.py")}
# RAGEN's StarPO-S (shared/spec/ragen-behaviour.md sections 4-5; the Config defaults are these, the
# SmolLM2 CPU configs changed some of them for a 2-core machine).
RAGEN_RL = ("rollout.num_groups=8", "rollout.group_size=16", "filter.strategy=top_k", "filter.value=0.25",
            "filter.select=largest", "filter.metric=reward_std", "batching.mini_batch_size=32", "batching.ppo_epochs=1",
            "advantage.estimator=gae", "advantage.reward_norm=identity", "model.critic=separate",
            "optim.actor_lr=1e-6", "optim.critic_lr=1e-5", "loss.kl_coef=0.0", "loss.eps_low=0.2", "loss.eps_high=0.28",
            "loss.entropy_coef=0.001", "rollout.temperature=1.0", "rollout.top_p=1.0")
# Run-keeping for a call whose machine is given back: no periodic checkpoints, validation or probes.
RUN = ("train.val_every=0", "train.collapse_every=0", "train.save_every=1000000", "train.log_samples=0")
WARM_START = ("sft.num_demos=256", "sft.epochs=2")
# The CPU rehearsal (CI): every stage with tiny counts and shapes.
REHEARSAL_SFT = ("sft.num_demos=8", "sft.epochs=1", "sft.batch_size=4")
REHEARSAL_RL = ("rollout.num_groups=2", "rollout.group_size=2", "filter.value=0.5", "batching.mini_batch_size=2")
# The rehearsal's model reads bytes (scripts/gpu_model.py tiny): every budget in bytes, not SmolLM2's tokens.
REHEARSAL_SHAPES = {"sokoban": ("prompt.max_turns=2", "prompt.max_response_tokens=96", "rollout.max_context=2048"),
                    "frozen_lake": ("prompt.max_turns=2", "prompt.max_response_tokens=24", "rollout.max_context=2048"),
                    "countdown": ("prompt.max_response_tokens=64", "rollout.max_context=1536")}
EVAL_SEED_START, EVAL_TEMPERATURE = 123, 0.5  # the reference's validation seeds and temperature
CURVE_KEYS = ("train/success", "train/reward_mean", "actor/entropy", "rollout/in_group_std", "actor/grad_norm",
              "timing/rollout_s", "timing/update_s")
WRITE_MARGIN_S = 10.0  # the JSON and the process's exit after the last evaluation


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the pretrained model: a .gguf file or a Hugging Face directory")
    p.add_argument("--envs", default="sokoban,frozen_lake,countdown", help=f"families in order, of {', '.join(FAMILIES)}")
    p.add_argument("--budget-s", type=float, default=480.0, help="wall seconds for everything this process does")
    p.add_argument("--iterations", type=int, default=200, help="at most this many RL iterations per env (RAGEN: 200)")
    p.add_argument("--eval-states", type=int, default=128)
    p.add_argument("--eval-samples", type=int, default=8, help="rollouts per state in one evaluation run")
    p.add_argument("--eval-repeats", type=int, default=2,
                   help="evaluation runs pooled per state: k = samples x repeats (default 16; a run of 128 x 8 "
                        "episodes keeps SmolLM2's float32 cache at ~36 GB)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="RL stage config override")
    p.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE", help="warm start config override")
    p.add_argument("--workdir", default=None, help="run directories (default: a fresh temporary one)")
    p.add_argument("--out", required=True, help="the result JSON (written after every stage)")
    p.add_argument("--cpu-rehearsal", action="store_true", help="tiny counts and shapes (CI), same code")
    args = p.parse_args(argv)
    fams = [f.strip() for f in args.envs.split(",") if f.strip()]
    bad = [f for f in fams if f not in FAMILIES]
    if not fams or bad:
        p.error(f"--envs must name families of {', '.join(FAMILIES)}, got {args.envs!r}")
    for name in ("budget_s", "iterations", "eval_states", "eval_samples", "eval_repeats"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not (os.path.isfile(args.model) or os.path.isdir(args.model)):
        p.error(f"--model {args.model} does not exist (on the GPU: `bash scripts/gpu_learn.sh` joins "
                ".gpu_model/ first; here: `python -m scripts.gpu_model tiny PATH` writes a rehearsal model)")
    for kv in args.set + args.sft_set:
        if "=" not in kv:
            p.error(f"--set / --sft-set take KEY=VALUE, got {kv!r}")
    args.families = fams
    return args


def stage_configs(args, family: str, root: str):
    """(SFT config, RL config) of a family; every override checked here, before anything is built."""
    from ragen_jax.experiment.config import load_config

    name = FAMILIES[family][1]
    shapes = REHEARSAL_SHAPES[family] if args.cpu_rehearsal else ()
    common = [f"model.path={os.path.abspath(args.model)}", *RUN, *shapes]
    sft = load_config(name, common + list(WARM_START) + list(REHEARSAL_SFT if args.cpu_rehearsal else ())
                      + args.sft_set)
    rl = load_config(name, common + list(RAGEN_RL) + list(REHEARSAL_RL if args.cpu_rehearsal else ())
                     + [f"train.iterations={args.iterations}", f"model.init_from={os.path.join(root, 'sft')}"]
                     + args.set)
    return sft, rl


class Clock:
    """Seconds left of the budget, counted from `start` (default: this process's start, T_START)."""

    def __init__(self, budget_s: float, now=time.perf_counter, start: float = T_START):
        self.budget_s, self.now, self.start = budget_s, now, start

    def left(self) -> float:
        return self.budget_s - (self.now() - self.start)


def write(doc: dict, path: str) -> None:
    """Atomically (a temp file, then a rename): a call cut short never leaves half a JSON."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    tmp.replace(p)


def evaluation(m: dict) -> dict:
    keep = ("success", "format_ok", "action_is_valid", "reward_mean", "num_states", "num_episodes", "seconds",
            "state_success")
    return {k: m[k] for k in keep if k in m}


def rl_iterations(args, rl, rec: dict, clock: Clock, reserve: float, first_guess: float) -> None:
    """RL iterations while the next one (1.5 x the slowest after the first, which compiles; the first
    guessed as `first_guess`) and `reserve` still fit in the budget."""
    times = []
    while len(times) < args.iterations:
        need = 1.5 * max(times[1:]) if len(times) > 1 else (first_guess if not times else 1.5 * times[0])
        if clock.left() - reserve < need:
            break
        t = clock.now()
        m = rl.iteration_step()
        times.append(clock.now() - t)
        rec["curve"].append({"iteration": len(times), "wall_s": times[-1],
                             **{k: float(m[k]) for k in CURVE_KEYS if k in m}})
    rec["iterations"] = len(times)
    rec["stopped_by"] = "iterations" if len(times) >= args.iterations else "time"


def run_family(args, family: str, root: str, rec: dict, doc: dict, clock: Clock) -> None:
    """Warm start, evaluation, RL while time is left, evaluation; `rec` filled (and written) as it goes."""
    from ragen_jax.evaluation.paired import format_paired, paired_rates
    from ragen_jax.recipes.demo import StageEvaluator
    from ragen_jax.trainer.rl import Trainer
    from ragen_jax.trainer.sft import SFTTrainer

    env = FAMILIES[family][0]
    sft_cfg, rl_cfg = stage_configs(args, family, root)
    rec["config"] = {"sft": WARM_START + tuple(args.sft_set), "rl": RAGEN_RL + tuple(args.set)}
    t0 = time.perf_counter()
    sft = SFTTrainer(sft_cfg, os.path.join(root, "sft"), quiet=True)
    hist = [h for h in sft.train() if "sft/loss" in h]
    rec["sft"] = {"steps": len(hist), "seconds": time.perf_counter() - t0,
                  "loss_last": hist[-1]["sft/loss"] if hist else None,
                  "token_accuracy_last": hist[-1]["sft/token_accuracy"] if hist else None}
    t1 = time.perf_counter()
    k = args.eval_samples * args.eval_repeats
    before = StageEvaluator(sft, (env,), args.eval_states, samples=args.eval_samples,
                            repeats=args.eval_repeats)(sft.params)[env]
    rec["before"] = evaluation(before)
    rec["before"]["wall_s"] = eval_s = time.perf_counter() - t1
    log(f"{env}: warm start {before['success']:.3f} (format {before['format_ok']:.2f}) on {args.eval_states} x "
        f"{k}; SFT {rec['sft']['seconds']:.0f} s, evaluation {eval_s:.0f} s")
    write(doc, args.out)
    del sft
    gc.collect()

    t2 = time.perf_counter()
    rl = Trainer(rl_cfg, os.path.join(root, "rl"), quiet=True)
    rec["rl"] = {"setup_s": time.perf_counter() - t2, "iterations": 0, "curve": []}
    # The after-RL evaluation reuses the warm start's compiled rollout (same policy graph): reserving the
    # warm start's evaluation time, compile included, is on the safe side.
    rl_iterations(args, rl, rec["rl"], clock, reserve=eval_s + WRITE_MARGIN_S, first_guess=eval_s)
    rec["rl"]["seconds"] = time.perf_counter() - t2
    if not rec["rl"]["iterations"]:
        rec["status"] = "no RL iteration fitted in the time left"
        return
    t4 = time.perf_counter()
    after = StageEvaluator(rl, (env,), args.eval_states, samples=args.eval_samples,
                           repeats=args.eval_repeats)(rl.actor_params)[env]
    rec["after"] = evaluation(after)
    rec["after"]["wall_s"] = time.perf_counter() - t4
    rec["paired"] = paired_rates(before["state_success"], after["state_success"], k)
    rec["status"] = "done"
    log(f"{env}: after {rec['rl']['iterations']} RL iterations ({rec['rl']['seconds']:.0f} s): "
        f"{format_paired(rec['paired'])}")


def log(msg: str) -> None:
    print(f"[gpu_learn {time.perf_counter() - T_START:6.1f} s] {msg}", flush=True)


def machine() -> dict:
    import jax

    d = jax.devices()[0]
    return {"platform": d.platform, "device_kind": getattr(d, "device_kind", ""), "devices": jax.device_count(),
            "jax": jax.__version__, "python": platform.python_version(), "host": platform.node()}


def main(argv=None) -> int:
    args = parse(argv)
    clock = Clock(args.budget_s)
    import tempfile

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)
    work = args.workdir or tempfile.mkdtemp(prefix="gpu_learn-")
    try:
        for f in args.families:  # every config checked before anything is built
            stage_configs(args, f, os.path.join(work, f))
    except Exception as e:  # ConfigError and friends: one sentence
        print(f"gpu_learn: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    doc = {"kind": "gpu_learn", "date": time.strftime("%Y-%m-%d"), "rehearsal": args.cpu_rehearsal,
           "machine": machine(), "model": os.path.basename(os.path.normpath(args.model)),
           "settings": {"budget_s": args.budget_s, "iterations_max": args.iterations, "eval_states": args.eval_states,
                        "eval_samples": args.eval_samples, "eval_repeats": args.eval_repeats,
                        "eval_temperature": EVAL_TEMPERATURE,
                        "eval_seed_start": EVAL_SEED_START, "rl": list(RAGEN_RL) + args.set,
                        "warm_start": list(WARM_START) + args.sft_set},
           "envs": {}}
    first_cost = None
    for family in args.families:
        env = FAMILIES[family][0]
        rec = doc["envs"].setdefault(env, {"family": family})
        if first_cost is not None and clock.left() < first_cost:
            rec["status"] = f"skipped: ~{first_cost:.0f} s needed (the first env's cost), {clock.left():.0f} s left"
            log(f"{env}: {rec['status']}")
            continue
        t0 = time.perf_counter()
        try:
            run_family(args, family, os.path.join(work, family), rec, doc, clock)
        except Exception as e:  # recorded; the next env still runs
            rec["status"] = f"error: {type(e).__name__}: {' '.join(str(e).split())[:500]}"
            rec["traceback"] = traceback.format_exc()[-4000:]
            log(f"{env}: {rec['status']}")
        rec["seconds"] = time.perf_counter() - t0
        if first_cost is None:  # what a later env needs at least: the first's cost with one RL iteration
            rl = rec.get("rl", {})
            one = rl["curve"][0]["wall_s"] if rl.get("curve") else 0.0
            first_cost = rec["seconds"] - rl.get("seconds", 0.0) + rl.get("setup_s", 0.0) + one + WRITE_MARGIN_S
        doc["total_s"] = time.perf_counter() - T_START
        write(doc, args.out)
        gc.collect()
    doc["total_s"] = time.perf_counter() - T_START
    write(doc, args.out)
    return 0 if all(r.get("status") == "done" or str(r.get("status", "")).startswith("skipped")
                    for r in doc["envs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
