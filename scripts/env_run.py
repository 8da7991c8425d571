"""A short warm start + RL run on any registered environment with a solver teacher, with paired statistics.

    python scripts/env_run.py --env Countdown --out runs/env34/countdown
    python scripts/env_run.py --env rubikscube --out runs/env34/cube --eval-states 128 train.iterations=10

The CPU demo's pipeline (ragen_jax/recipes/demo.py) for one environment: SFT on the env's teacher
demonstrations, evaluation on fixed states, StarPO-S RL from the SFT export, the same evaluation
again, and the RL stage compared with its warm start state by state (flips, exact McNemar p,
ragen_jax/evaluation/paired.py). The policy is the demo's tiny random-init Qwen2 (configs/
demo_cpu_frozen_lake.py: task vocabulary, GRPO, one action per turn, no-think answers, single-turn
context) with the env's settings from ENV_SETTINGS (a conversation the tiny model can learn in a few
CPU minutes) and the given overrides (section.key=value, applied to both stages). Writes <out>/sft,
<out>/rl, <out>/result.json (before / after metrics, the paired change, wall and CPU seconds per
stage, the CPU model) and prints one line per stage. Bad arguments: one sentence, exit 2, before
anything is compiled or written.
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

import envs_jax
from ragen_jax.experiment.config import ConfigError
from ragen_jax.recipes.demo import FROZEN_LAKE_CONFIG, StageEvaluator, stage_configs

BASE_CONFIG = FROZEN_LAKE_CONFIG  # the tiny one-action-per-turn demo policy
COMMON = ("sft.num_demos=256", "sft.epochs=3", "train.iterations=20", "train.save_every=20")
# Per environment: a conversation short enough for the tiny model and a few CPU minutes. Sudoku runs
# 4x4 grids (6 empty cells): the reference's 9x9 easy grid has 32 empty cells and 20 actions, so no
# episode can succeed and the paired success statistics would say nothing. 2048's success (the
# game ended with a 2048 tile) needs hundreds of moves: its runs report reward next to success.
ENV_SETTINGS = {
    "Countdown": ("prompt.max_turns=1", "prompt.max_response_tokens=24", "prompt.context_window_mode=full",
                  "prompt.max_context_window=-1", "rollout.max_context=512", "sft.length_bucket=128"),
    "rubikscube": ("prompt.max_turns=3", "prompt.max_actions_per_episode=3", "rollout.max_context=1024"),
    "SimpleSudoku": ("env.overrides.grid_size=4", "prompt.max_turns=8", "prompt.max_actions_per_episode=8",
                     "prompt.max_response_tokens=12", "rollout.max_context=2048", "sft.length_bucket=512"),
    "game_2048": ("prompt.max_turns=8", "prompt.max_actions_per_episode=8", "rollout.max_context=1536",
                  "sft.length_bucket=512"),
}
METRICS = ("success", "format_ok", "reward_mean", "action_is_effective")


def parse(argv=None):
    """The command line -> (args, SFT config, RL config); every check is made here (one sentence, exit 2)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True, help="a registered environment with a teacher and a text layer")
    p.add_argument("--out", required=True, help="a directory without a finished run (result.json)")
    p.add_argument("--eval-states", type=int, default=64, help="fixed evaluation states (default 64)")
    p.add_argument("overrides", nargs="*", help="config overrides section.key=value (both stages)")
    args = p.parse_intermixed_args(argv)
    teachable = [n for n in envs_jax.registered_envs()
                 if envs_jax.get_spec(n).teacher and envs_jax.get_spec(n).text_layer]
    if args.env not in teachable:
        p.error(f"--env {args.env!r} is not a registered environment with a teacher and a text layer; "
                f"valid: {', '.join(teachable)}")
    if args.eval_states < 1:
        p.error(f"--eval-states must be a positive integer, got {args.eval_states}")
    if os.path.exists(os.path.join(args.out, "result.json")):
        p.error(f"--out {args.out!r} already holds a finished run (result.json); use a fresh directory")
    bad = [o for o in args.overrides if "=" not in o or o.startswith("-")]
    if bad:
        p.error(f"overrides look like section.key=value, got {bad[0]!r}")
    over = [f"env.name={args.env}", *COMMON, *ENV_SETTINGS.get(args.env, ()), *args.overrides]
    try:
        sft_cfg, rl_cfg = stage_configs(BASE_CONFIG, over, (), os.path.abspath(args.out))
    except (ConfigError, ValueError) as e:
        p.error(" ".join(str(e).split()))
    return args, sft_cfg, rl_cfg


def _clock():
    return time.perf_counter(), time.process_time()


def _since(t):
    wall, cpu = _clock()
    return {"wall_s": round(wall - t[0], 1), "cpu_s": round(cpu - t[1], 1)}


def _summary(res: dict) -> dict:
    return {k: float(res[k]) for k in METRICS if k in res}


def main(argv=None) -> int:
    args, sft_cfg, rl_cfg = parse(argv)
    from absl import logging as absl_logging

    from ragen_jax.evaluation.paired import paired_change
    from ragen_jax.infra.machine import cpu_model
    from ragen_jax.trainer.rl import Trainer
    from ragen_jax.trainer.sft import SFTTrainer

    absl_logging.set_verbosity(absl_logging.ERROR)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    stages = {}
    t = _clock()
    sft = SFTTrainer(sft_cfg, os.path.join(out, "sft"), quiet=True)
    sft.train()
    stages["sft"] = _since(t)
    t = _clock()
    evaluator = StageEvaluator(sft, (args.env,), args.eval_states)
    before = evaluator(sft.params)[args.env]
    stages["eval_sft"] = _since(t)
    print(f"{args.env} warm start: {_summary(before)} {stages}", flush=True)
    del sft
    t = _clock()
    rl = Trainer(rl_cfg, os.path.join(out, "rl"), quiet=True)
    rl.train()
    stages["rl"] = _since(t)
    t = _clock()
    after = StageEvaluator(rl, (args.env,), args.eval_states)(rl.actor_params)[args.env]
    stages["eval_rl"] = _since(t)
    pc = paired_change(before["state_success"], after["state_success"])
    result = {"env": args.env, "command": " ".join(["python", "scripts/env_run.py", *(argv or sys.argv[1:])]),
              "settings": [f"env.name={args.env}", *COMMON, *ENV_SETTINGS.get(args.env, ())],
              "overrides": args.overrides, "eval_states": args.eval_states, "before": _summary(before),
              "after": _summary(after), "paired": pc, "stages": stages, "cpu_model": cpu_model(),
              "cpu_count": os.cpu_count(), "loadavg_end": os.getloadavg()[0]}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"{args.env} after RL: {_summary(after)}; {pc['gained']} gained / {pc['lost']} lost, "
          f"McNemar p = {pc['p_value']:.3g}; {stages}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
