"""Stop a training run at random moments and resume it: nothing may be lost or logged twice.

    python scripts/fault_trials.py --signal TERM --trials 20 --out bench/results/fault_trials_sigterm.json
    python scripts/fault_trials.py --signal KILL --trials 50 --in-checkpoint 10 --out bench/results/fault_trials_kill.json

One uninterrupted run of `launch/tpu_train.py` (a small tiny_cpu config: checkpoints every 2
iterations, validation every 3, logged samples) is the truth. Each trial starts the same command in
a fresh directory, sends the signal after a uniformly random delay within the reference run's wall
time (or, for `--in-checkpoint` trials, the moment an orbax checkpoint directory is being written,
at a random checkpoint), waits for the process to end, then runs the same command again to the end.
A launch that finished before its moment came is not a trial: the moment is drawn again within that
launch's own time (up to 5 times; `redrawn`), so every trial stops a live run (`stopped_a_live_run`).
A trial passes when:
- SIGTERM: the first launch exited 75 (stopped with a checkpoint) or 0 (it had finished), or was
  ended by the signal before its handler existed (no work yet);
- the resumed launch exited 0;
- metrics.jsonl equals the reference's row for row (steps, keys, values; timings left out), so no
  row was lost or written twice;
- TensorBoard's events, read as TensorBoard reads them (a SessionLog START at step s purges the earlier
  events from s on), hold each (tag, step) of the reference exactly once, with the same values.
`signal_to_exit_s` in the output: signal -> exit of the first launch (SIGTERM: the iteration in
flight finishes and its checkpoint is written).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--config", "tiny_cpu.py", "--quiet", "--config.train.iterations=6", "--config.train.save_every=2",
        "--config.train.val_every=3", "--config.train.val_size=4", "--config.train.log_samples=1",
        "--config.rollout.num_groups=2", "--config.rollout.group_size=4", "--config.filter.value=0.5",
        "--config.batching.mini_batch_size=4", "--config.prompt.max_turns=2", "--config.prompt.max_response_tokens=8",
        "--config.rollout.max_context=512", "--config.mesh.data=1"]
PREEMPTED_EXIT = 75


def launch(workdir: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "launch" / "tpu_train.py"), *ARGS, "--workdir", str(workdir)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def metrics(workdir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("timing/")} for r in rows]


def tb_events(tb: Path) -> dict[tuple[str, int], list]:
    """(tag, step) -> the values TensorBoard shows, reading the event files in order and applying its
    purge rule (EventAccumulator: a SessionLog START at step s drops the earlier events at steps >= s)."""
    from tensorboardX.proto import event_pb2

    seen: list[tuple[str, int, object]] = []
    files = sorted(tb.glob("events.out.tfevents.*"))  # by name, as TensorBoard reads them
    for f in files:
        data = f.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            if pos + 12 + n + 4 > len(data):
                break  # a record cut off by a kill: TensorBoard stops there too
            ev = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            if ev.HasField("session_log") and ev.session_log.status == ev.session_log.START:
                seen = [s for s in seen if s[1] < ev.step]
            for v in ev.summary.value:
                value = v.simple_value if v.HasField("simple_value") else v.tensor.string_val[0] if v.tensor.string_val else None
                seen.append((v.tag, ev.step, value))
    out: dict = {}
    for tag, step, value in seen:
        out.setdefault((tag, step), []).append(value)
    return out


def compare(workdir: Path, ref: Path) -> str | None:
    """None when the run's logs equal the reference's, else what differs."""
    got, want = metrics(workdir), metrics(ref)
    if [r["step"] for r in got] != [r["step"] for r in want]:
        return f"metrics.jsonl steps {[r['step'] for r in got]} != {[r['step'] for r in want]}"
    for g, w in zip(got, want):
        if g.keys() != w.keys():
            return f"step {g['step']}: keys differ {sorted(set(g) ^ set(w))}"
        for k in g:
            if not np.isclose(g[k], w[k], rtol=1e-5, atol=1e-6):
                return f"step {g['step']} {k}: {g[k]} != {w[k]}"
    eg, ew = tb_events(workdir / "tb"), tb_events(ref / "tb")
    eg = {k: v for k, v in eg.items() if not k[0].startswith("timing/")}
    ew = {k: v for k, v in ew.items() if not k[0].startswith("timing/")}
    if set(eg) != set(ew):
        return f"TensorBoard (tag, step) differ: {sorted(set(eg) ^ set(ew))[:4]}"
    twice = [k for k, v in eg.items() if len(v) != 1]
    if twice:
        return f"TensorBoard shows {twice[:3]} more than once"
    for k, v in eg.items():
        if isinstance(v[0], float) and not np.isclose(v[0], ew[k][0], rtol=1e-5, atol=1e-6):
            return f"TensorBoard {k}: {v[0]} != {ew[k][0]}"
    return None


def wait_for_checkpoint_write(workdir: Path, nth: int, proc: subprocess.Popen, timeout: float) -> bool:
    """Poll until the `nth` checkpoint (1-based) is being written (its orbax temporary directory exists)."""
    ckpts, seen, deadline = workdir / "checkpoints", set(), time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if ckpts.is_dir():
            for p in os.scandir(ckpts):
                if ".orbax-checkpoint-tmp" in p.name:
                    seen.add(p.name.split(".")[0])
                    if len(seen) >= nth:
                        return True
        time.sleep(0.002)
    return False


def trial(i: int, args, ref: Path, ref_seconds: float, env: dict, base: Path) -> dict:
    wd = base / f"t{i}"
    rng = random.Random(args.seed * 100_003 + i)  # per trial, so that --parallel draws the same moments
    sig = signal.SIGTERM if args.signal == "TERM" else signal.SIGKILL
    in_ckpt = i < args.in_checkpoint
    span, redrawn = ref_seconds, 0
    while True:
        t_start = time.monotonic()
        p = launch(wd, env)
        if in_ckpt:
            nth = rng.randint(1, 3)
            hit = wait_for_checkpoint_write(wd, nth, p, 600)
            delay = time.monotonic() - t_start
        else:
            hit, delay = False, rng.uniform(0, span)
            try:
                p.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                pass
        # A launch that ended before its moment came was not interrupted: draw again within the time it took
        # (the reference time is measured once, on a machine whose load changes), so every trial stops a live run.
        if in_ckpt or p.poll() is None or redrawn >= 5:
            break
        span, redrawn = time.monotonic() - t_start, redrawn + 1
        p.wait()
        p.stderr.read()
        shutil.rmtree(wd, ignore_errors=True)
    t_sig = time.monotonic()
    if p.poll() is None:
        p.send_signal(sig)
    rc1 = p.wait(timeout=600)
    stop_s = time.monotonic() - t_sig
    err1 = p.stderr.read()
    p2 = launch(wd, env)
    rc2 = p2.wait(timeout=900)
    err2 = p2.stderr.read()
    ok_rc1 = rc1 in ((PREEMPTED_EXIT, 0, -signal.SIGTERM) if sig == signal.SIGTERM else (-signal.SIGKILL, 0))
    problem = None if ok_rc1 and rc2 == 0 else f"exit {rc1} then {rc2}: {(err1 + err2)[-600:]}"
    problem = problem or compare(wd, ref)
    out = {"trial": i, "signal_after_s": round(delay, 2), "redrawn": redrawn, "in_checkpoint_write": hit, "first_exit": rc1,
           "signal_to_exit_s": round(stop_s, 2), "resumed_exit": rc2, "ok": problem is None, "problem": problem}
    print(json.dumps(out), flush=True)
    shutil.rmtree(wd, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--signal", choices=("TERM", "KILL"), default="TERM")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--in-checkpoint", type=int, default=0, help="of the trials, how many signal during a checkpoint write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parallel", type=int, default=1,
                    help="trials at once (each launch leaves part of a 2-core machine idle: 2 nearly doubles throughput)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fault-trials-"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(base / "cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    ref = base / "ref"
    p = launch(ref, env)
    assert p.wait(timeout=1800) == 0, p.stderr.read()
    ref_seconds = time.monotonic() - t0
    # Uninterrupted runs with the cache warm, as many at once as trials will run: a launch takes this long.
    t1 = time.monotonic()
    warm = [launch(base / f"warm{j}", env) for j in range(args.parallel)]
    assert all(w.wait(timeout=1800) == 0 for w in warm)
    ref_seconds = time.monotonic() - t1
    for j in range(args.parallel):
        shutil.rmtree(base / f"warm{j}")
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda i: trial(i, args, ref, ref_seconds, env, base), range(args.trials)))
    summary = {"signal": args.signal, "trials": len(results), "passed": sum(r["ok"] for r in results),
               "stopped_a_live_run": sum(r["first_exit"] != 0 for r in results),
               "in_checkpoint_write": sum(r["in_checkpoint_write"] for r in results),
               "reference_run_s": round(ref_seconds, 1), "max_signal_to_exit_s": max(r["signal_to_exit_s"] for r in results),
               "parallel": args.parallel, "cpu": _cpu(), "results": results}
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    shutil.rmtree(base, ignore_errors=True)


def _cpu() -> str:
    from ragen_jax.infra.machine import cpu_model

    return cpu_model()


if __name__ == "__main__":
    main()
