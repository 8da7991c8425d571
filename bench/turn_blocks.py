"""What skipping untaken turn blocks buys the single-turn RL step (`TurnBlocks.skip_untaken`).

The CPU demo's Sokoban and FrozenLake stages score single-turn records (`prompt.context_window_mode=
"single_turn"`): each of a row's M turn slots is a block row of the prepare and update passes, and
episodes end early (a solved room, the goal, a hole), so many of the K x M block rows are padding.
For each family: the demo's RL config (launch/demo.py), the policy of `--init-from <run>` for that
family (e.g. the demo's warm start `runs/demo/<family>/sft`; the randomly initialised tiny model
when absent, whose episodes rarely end early), ONE real rollout batch, then `prepare` + `update`
on that same batch with skipping on and off, alternated (ABAB...) `--repeats` times after one
warm-up call each; the medians, their ratio, the share of block rows that were taken, and each
program's compile time and temporaries (XLA's memory analysis). Both
programs compute the same numbers (tests/ragen_jax/rollout/test_single_turn.py), so the ratio is
the time the padding cost.

Usage: python -m bench.turn_blocks [--families sokoban,frozen_lake] [--init-from runs/demo]
       [--repeats 5] [--out bench/results/turn_blocks.json] [override ...]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path


import jax
import numpy as np

from bench.common import machine, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "turn_blocks.json"


def _timed(fn, *args):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def measure(family: str, init_from: str | None, repeats: int, overrides: list[str]) -> dict:
    from ragen_jax.recipes.demo import FROZEN_LAKE_CONFIG, SOKOBAN_CONFIG
    from ragen_jax.rollout import group_seeds_for_iteration
    from ragen_jax.experiment.config import load_config
    from ragen_jax.trainer.rl import Trainer

    over = list(overrides)
    init = None
    if init_from:
        init = Path(init_from) / family / "sft"
        if not init.exists():
            raise SystemExit(f"--init-from {init_from}: no {init}; give a demo workdir holding {family}/sft")
        over.append(f"model.init_from={init}")
    cfg = load_config({"sokoban": SOKOBAN_CONFIG, "frozen_lake": FROZEN_LAKE_CONFIG}[family], over)
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(cfg, tmp, quiet=True)
        seeds = group_seeds_for_iteration(0, cfg.rollout.num_groups, cfg.train.seed_base)
        traj = jax.block_until_ready(t.rollout(t.actor_params, jax.random.fold_in(t.state.key, 1), seeds))
        start = np.asarray(traj.turn_start)
        frozen = t.frozen_args
        steps, mem, compile_s = {}, {}, {}
        for skip in (True, False):
            programs = copy.copy(t.programs)
            programs.skip_untaken = skip
            # Compiled once here: the compile time and the temporaries (XLA's memory analysis) are
            # read off the same executables that are timed.
            t0 = time.perf_counter()
            lowered = jax.jit(programs.prepare).lower(t.state.actor, t.state.critic, t.ref, traj, *frozen)
            prep = lowered.compile()
            upd = jax.jit(programs.update).lower(t.state, lowered.out_info[0], *frozen).compile()
            compile_s[skip] = time.perf_counter() - t0
            mem[skip] = {"prepare": prep.memory_analysis().temp_size_in_bytes,
                         "update": upd.memory_analysis().temp_size_in_bytes}

            def step(prep=prep, upd=upd):
                batch, _ = prep(t.state.actor, t.state.critic, t.ref, traj, *frozen)
                return upd(t.state, batch, *frozen)

            steps[skip] = step
        warm = {skip: _timed(steps[skip]) for skip in (True, False)}
        times = {True: [], False: []}
        for _ in range(repeats):
            for skip in (True, False):
                times[skip].append(_timed(steps[skip]))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    k, m = start.shape
    return {
        "family": family,
        "init_from": str(init) if init else None,
        "rows": k,
        "turn_slots": m,
        "taken_block_share": float((start >= 0).mean()),
        "mean_turns": float((start >= 0).sum(1).mean()),
        "step_s_skip": on,
        "step_s_plain": off,
        "speedup": off / on,
        "temp_mib_skip": {k: v / 2**20 for k, v in mem[True].items()},
        "temp_mib_plain": {k: v / 2**20 for k, v in mem[False].items()},
        "compile_s_skip": compile_s[True],
        "compile_s_plain": compile_s[False],
        "first_call_s_skip": warm[True],
        "first_call_s_plain": warm[False],
        "times_skip": times[True],
        "times_plain": times[False],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="sokoban,frozen_lake")
    ap.add_argument("--init-from", default=None, help="a demo workdir: <dir>/<family>/sft is each family's policy")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("overrides", nargs="*", help="config overrides section.key=value, for every family")
    args = ap.parse_args(argv)
    result = {"machine": machine(), "settings": vars(args), "rows": []}
    for family in args.families.split(","):
        row = measure(family, args.init_from, args.repeats, args.overrides)
        result["rows"].append(row)
        print(f"{family}: {row['mean_turns']:.2f} of {row['turn_slots']} turns taken; prepare+update "
              f"{row['step_s_plain']:.2f} s -> {row['step_s_skip']:.2f} s ({row['speedup']:.2f}x); update temporaries "
              f"{row['temp_mib_plain']['update']:.0f} -> {row['temp_mib_skip']['update']:.0f} MiB", flush=True)
        write_result(result, args.out)


if __name__ == "__main__":
    main()
