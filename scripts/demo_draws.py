"""Several draws of the CPU demo on one commit, read as a distribution (docs/demo.md, "Draws").

    python scripts/demo_draws.py --draws 5 --workdir runs/draws                    # seeds 0..4, one at a time
    python scripts/demo_draws.py --seeds 0,7 --workdir runs/draws -- --skip-bandit  # flags after -- go to the demo
    python scripts/demo_draws.py --draws 5 --workdir runs/draws --publish docs/demo_results \
        && python scripts/readme_results.py

Each draw is `launch/demo.py --workdir <workdir>/seed<S> --seed S` in its own process: the command a
user runs, its memory given back at exit. A draw whose directory already holds a finished run with that
seed is read, not rerun, so an interrupted series resumes where it stopped (the demo resumes its own
stages too). Writes <workdir>/draws.json (`ragen_jax.recipes.draws.publication`: the CPU class, the
commit, every draw's per-family outcome and costs, and per family the min / median / max of the gain and
how many draws are significant) and prints the summary. --publish DIR writes draws.json into DIR and the
lowest seed's eval.json, demo_summary.json and curves beside it (the README's example run);
scripts/readme_results.py renders the README's rows from them. Exit 2 with one sentence on bad input;
a draw that fails ends the series with the demo's exit code (its directory is kept for the rerun).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ragen_jax.infra.machine import cpu_class
from ragen_jax.recipes.demo import publish_results
from ragen_jax.recipes.draws import draw_record, publication

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "launch" / "demo.py"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, help="the series' directory: seed<S>/ per draw and draws.json")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--draws", type=int, help="seeds 0 .. N-1")
    g.add_argument("--seeds", help="comma-separated seeds, e.g. 0,3,7")
    p.add_argument("--parallel", type=int, default=1,
                   help="draws run at once (default 1: one after another, so each draw's times are its own; "
                        "more share the cores, and the record says so); each draw's output goes to seed<S>.log")
    p.add_argument("--publish", metavar="DIR", default=None,
                   help="write draws.json and the lowest seed's outputs into DIR (docs/demo_results for the README)")
    argv = list(sys.argv[1:] if argv is None else argv)
    demo_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.draws is not None:
        if args.draws < 1:
            p.error(f"--draws must be a positive number of draws, got {args.draws}")
        seeds = list(range(args.draws))
    else:
        try:
            seeds = sorted({int(s) for s in args.seeds.split(",") if s.strip()})
        except ValueError:
            p.error(f"--seeds must be comma-separated whole numbers, got {args.seeds!r}")
        if not seeds or seeds[0] < 0:
            p.error(f"--seeds must name at least one seed >= 0, got {args.seeds!r}")
    if args.parallel < 1:
        p.error(f"--parallel must be a positive number of draws at once, got {args.parallel}")
    for flag in ("--workdir", "--seed", "--publish"):
        if any(a == flag or a.startswith(flag + "=") for a in demo_args):
            p.error(f"{flag} after -- is set by this script per draw; remove it")
    return args, seeds, demo_args


def finished(draw_dir: Path, seed: int) -> bool:
    """A complete earlier run of this draw: its summary exists and names the same seed."""
    try:
        return json.loads((draw_dir / "demo_summary.json").read_text()).get("seed") == seed
    except (OSError, ValueError):
        return False


def commit() -> str:
    """The checkout's commit, with "+changes" when tracked files differ from it."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def series_commit(workdir: Path) -> str:
    """The commit the series' draws run at: recorded in <workdir>/series.json when its first draw starts,
    so a series resumed or published from a later checkout still names the code that made it."""
    path = workdir / "series.json"
    try:
        return json.loads(path.read_text())["commit"]
    except (OSError, ValueError, KeyError):
        c = commit()
        path.write_text(json.dumps({"commit": c, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}) + "\n")
        return c


def run_draws(workdir: Path, seeds: list[int], demo_args: list[str], parallel: int = 1) -> int:
    """Run every unfinished draw, `parallel` at a time (their output in seed<S>.log when more than one);
    the first non-zero exit code, after every started draw has ended."""
    todo = [s for s in seeds if not finished(workdir / f"seed{s}", s)]
    if todo:
        series_commit(workdir)
    for s in sorted(set(seeds) - set(todo)):
        print(f"[draws] seed {s}: finished earlier in {workdir / f'seed{s}'}, read as it is", flush=True)
    running, rc = {}, 0
    while todo or running:
        while todo and len(running) < parallel and rc == 0:
            seed = todo.pop(0)
            cmd = [sys.executable, str(DEMO), "--workdir", str(workdir / f"seed{seed}"), "--seed", str(seed), *demo_args]
            out = open(workdir / f"seed{seed}.log", "w") if parallel > 1 else None
            print(f"[draws] seed {seed}: {shlex.join(cmd)}" + (f" > {out.name}" if out else ""), flush=True)
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None)
            running[seed] = (proc, time.perf_counter(), out)
        if rc and not running:
            break
        if not running:
            continue
        time.sleep(1.0)
        for seed, (proc, t0, out) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[seed]
            if out:
                out.close()
            if proc.returncode != 0:
                rc = rc or proc.returncode
                print(f"[draws] seed {seed} ended with exit {proc.returncode}; rerun the same command to resume it",
                      file=sys.stderr, flush=True)
            else:
                print(f"[draws] seed {seed} done in {time.perf_counter() - t0:.0f} s", flush=True)
    return rc


def print_summary(doc: dict) -> None:
    print(f"\n== {len(doc['draws'])} draws on a {doc['machine']['cpu_class']} ({doc['machine']['cpu_count']} cores), "
          f"commit {doc['commit']} ==")
    for family, s in doc["families"].items():
        k = s["samples_per_state"]
        def pts(d):
            return " / ".join(f"{100 * d[x]:+.1f}" for x in ("min", "median", "max")) if d else "-"
        print(f"{family:12s} gain (points, min / median / max): one rollout {pts(s['gain'])}; "
              f"{k} rollouts per state {pts(s['k_gain'])}; significant (p < {s['alpha']:g}) in "
              f"{s['significant']} of {s['draws']} draws")
    t = doc["costs"]["total_s"]
    if t:
        print(f"time per draw: {t['min'] / 60:.1f} / {t['median'] / 60:.1f} / {t['max'] / 60:.1f} min")


def main(argv=None) -> int:
    args, seeds, demo_args = parse(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rc = run_draws(workdir, seeds, demo_args, args.parallel)
    if rc != 0:
        return rc
    records = [draw_record(workdir / f"seed{s}") for s in seeds]
    cmd = "python scripts/demo_draws.py " + (f"--draws {len(seeds)}" if seeds == list(range(len(seeds)))
                                             else "--seeds " + ",".join(map(str, seeds)))
    cmd += f" --parallel {args.parallel}" if args.parallel > 1 else ""
    cmd += (" -- " + shlex.join(demo_args)) if demo_args else ""
    doc = publication(records, {"cpu_class": cpu_class(), "cpu_count": os.cpu_count()}, series_commit(workdir), cmd)
    doc["parallel"] = args.parallel  # draws that shared the machine: their times are not a draw's alone
    (workdir / "draws.json").write_text(json.dumps(doc, indent=2) + "\n")
    print_summary(doc)
    if args.publish:
        first = workdir / f"seed{seeds[0]}"
        curves = json.loads((first / "demo_summary.json").read_text()).get("curves", [])
        try:
            publish_results(first, args.publish, curves)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        (Path(args.publish) / "draws.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(f"published draws.json and seed {seeds[0]}'s outputs to {args.publish}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
