"""What the `launch/` entry points share: arguments, multi-process start-up, the run lock, one-line errors.

Imports only the light `distributed` and `preemption` modules at the top: the cluster must be joined before JAX's
backend exists, and importing the config (hence the environments: gymnax computes at import
time) creates it.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable

import jax

from ragen_jax.infra.distributed import ClusterError, acquire_run_lock, cluster_request, exit_now, start_cluster
from ragen_jax.infra.preemption import STOP

# Input problems, reported in one line with exit status 2 (matched by class name: most live in
# modules that may only be imported after the cluster is joined).
INPUT_ERROR_NAMES = ("ConfigError", "ClusterError", "RunDirBusy", "CheckpointError", "EvalError")
SETUP_ERRORS = (FileNotFoundError, NotADirectoryError, ValueError)  # bad input too, while the run is being set up


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """--coordinator-address / --num-processes / --process-id (else the JAX_* variables, else a TPU
    pod, SLURM or Open MPI, else one process) and the failure timeouts."""
    g = p.add_argument_group(
        "several processes", "Run the same command in every process. Without these flags the variables "
        "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID are used; on a TPU pod slice, under "
        "SLURM's srun or Open MPI's mpirun nothing is needed; otherwise the run has one process.")
    g.add_argument("--coordinator-address", default=None, metavar="HOST:PORT",
                   help="process 0's address and a free port, the same in every process")
    g.add_argument("--num-processes", type=int, default=None, help="how many processes take part")
    g.add_argument("--process-id", type=int, default=None, help="this process's id, 0 .. num-processes - 1")
    g.add_argument("--heartbeat-timeout", type=int, default=None, metavar="S",
                   help="seconds before a silent (dead) process makes all others exit with an error (default 30)")
    g.add_argument("--shutdown-timeout", type=int, default=None, metavar="S",
                   help="seconds a finished process waits for the others to finish (default 300)")
    g.add_argument("--init-timeout", type=int, default=None, metavar="S",
                   help="seconds to wait for all processes to join at start (default 300)")


def start_from_args(args):
    """Join the cluster the flags, the environment or the cluster manager ask for (see
    `distributed.start_cluster`), with the flags' timeouts. Call it before importing the config."""

    def seconds(flag):
        v = getattr(args, flag, None)
        if v is not None and v < 1:
            raise ClusterError(f"--{flag.replace('_', '-')} must be >= 1 second, got {v}")
        return v

    return start_cluster(getattr(args, "coordinator_address", None), getattr(args, "num_processes", None),
                         getattr(args, "process_id", None), heartbeat_timeout_s=seconds("heartbeat_timeout"),
                         shutdown_timeout_s=seconds("shutdown_timeout"), init_timeout_s=seconds("init_timeout"))


def parse_run_args(doc: str, argv=None, workdir_help: str = "run directory", more_args: Callable | None = None):
    """`--config NAME --workdir DIR [--quiet] [cluster flags] [--config.a.b=value ...]` -> (args, overrides).
    `more_args(parser)`: a launcher's own flags."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config file: a bare name in configs/ (sokoban.py) or a path")
    p.add_argument("--workdir", required=True, help=workdir_help + " (a local directory or a bucket URL, gs://...)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    if more_args is not None:
        more_args(p)
    add_cluster_args(p)
    args, rest = p.parse_known_args(argv)
    bad = [r for r in rest if not r.startswith("--config.")]
    if bad:
        p.error(f"unrecognised arguments {bad}; config overrides look like --config.section.key=value")
    return args, rest


def is_input_error(e: BaseException, setting_up: bool = True) -> bool:
    """Bad input (one line, exit 2) rather than a bug (traceback, exit 1). Once the run has started,
    only the project's own error classes count: a bare ValueError there is a bug."""
    if any(c.__name__ in INPUT_ERROR_NAMES for c in type(e).__mro__):
        return True
    return setting_up and isinstance(e, SETUP_ERRORS)


def fail(e: BaseException | None, code: int) -> int:
    """Report `e` (one line for bad input, else the traceback) and return `code`. With several
    processes the process ends here (`distributed.exit_now`): returning would wait in JAX's exit
    barrier for processes that may be stuck in a collective with this one."""
    lost = e is not None and code != 2 and _multi_process() and any(m in str(e) for m in PEER_LOST_MARKS)
    if lost:  # a collective whose peer died: one line, the cause is in that process's log
        first = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"error: process {jax.process_index()} of {jax.process_count()}: {PEER_LOST} ({type(e).__name__}: "
              f"{first})", file=sys.stderr)
        exit_now(code)
    if e is not None:
        if code == 2:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        else:
            traceback.print_exception(e)
    if _multi_process():
        if code != 2:  # a collective failing here most often means that another process died
            print(f"error: process {jax.process_index()} of {jax.process_count()} stopped on the error above; if "
                  "another process died first, its log has the cause. Rerunning the same command in every process "
                  "resumes from the last complete checkpoint.", file=sys.stderr)
        exit_now(code)
    return code


def _multi_process() -> bool:
    from jax._src import xla_bridge  # whether a backend exists: asking jax.process_count() would create one

    return xla_bridge.backends_are_initialized() and jax.process_count() > 1


PEER_LOST = ("another process of this run died; its log has the cause. Rerunning the same command in every process "
             "resumes from the last complete checkpoint")
# Errors of a collective whose peer is gone (gloo, the coordination service).
PEER_LOST_MARKS = ("Gloo", "Connection reset", "Connection closed", "Socket closed", "UNAVAILABLE", "DEADLINE_EXCEEDED")
# A process that runs a multi-process launch under its parent (`supervise`).
SUPERVISED = "RAGEN_JAX_SUPERVISED"
# What JAX's C++ runtime logs (then aborts with a stack trace) when the coordination service reports a
# failed peer or a lost coordinator.
JAX_PEER_FAILURE = b"Terminating process because the JAX distributed service detected fatal errors"


def supervise() -> int:
    """Run this very command again as a child and pass its output through, except the abort of JAX's
    C++ runtime when another process died (a log line, a GRPC detail and a stack trace): that becomes
    one line, and exit status 1. SIGTERM / SIGINT are passed on to the child. Returns the exit status."""
    import signal
    import subprocess

    child = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env={**os.environ, SUPERVISED: "1"},
                             stderr=subprocess.PIPE, preexec_fn=die_with_parent)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    lost, detail = False, ""
    for line in child.stderr:
        if JAX_PEER_FAILURE in line:
            lost = True
        elif lost:
            if not detail and (b"grpc_message" in line or line.startswith(b"The tasks have crashed")):
                detail = line.decode("utf-8", "replace").strip()[:200]
        else:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
    code = child.wait()
    if lost:
        print(f"error: {PEER_LOST} (the JAX distributed service reports: {detail or 'a failure'})",
              file=sys.stderr, flush=True)
        return 1
    return code if code >= 0 else 128 - code


def run_config_job(doc: str, argv, job: Callable, workdir_help: str = "run directory",
                   more_args: Callable | None = None) -> int:
    """Load the config, join the cluster, take the run directory's lock, build `job(cfg, args)` and
    run what it returns; its return value, when an int, is the exit status (`PREEMPTED_EXIT` for a
    run stopped by SIGTERM / SIGINT after its checkpoint). Bad input -> one line, exit 2 (on every
    process alike). SIGTERM / SIGINT are handled from the start (`infra.preemption`)."""
    args, overrides = parse_run_args(doc, argv, workdir_help, more_args)
    if argv is None and SUPERVISED not in os.environ and _several_processes(args):
        return supervise()  # the command line of a multi-process run: its failures in one line
    STOP.install()
    try:
        return _run_job(args, overrides, job)
    finally:  # a caller in the same process (a test) gets its own handlers back
        STOP.uninstall()
        STOP.reset()


def die_with_parent(signum: int = 9) -> None:
    """In the child, before it runs (`preexec_fn`): signal `signum` (default SIGKILL) when the supervising
    parent dies (Linux prctl PR_SET_PDEATHSIG), so that killing the launched process still ends the run's
    process. SIGTERM instead lets a trainer child save its checkpoint first (`infra.preemption`)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(1, signum)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the child outlives a killed parent
        pass


def _several_processes(args) -> bool:
    try:
        req = cluster_request(args.coordinator_address, args.num_processes, args.process_id)
    except ClusterError:
        return False  # reported in one line by the run itself
    return req.how != "single"


def _run_job(args, overrides, job: Callable) -> int:
    lock, started, code = None, False, 0
    try:
        start_from_args(args)
        from ragen_jax.experiment.config import load_config  # only now: it imports the environments (see above)

        cfg = load_config(args.config, overrides)
        lock = acquire_run_lock(args.workdir)
        runner = job(cfg, args)  # everything checked here, before anything is compiled or written
        started = True
        if runner is not None:
            result = runner()
            code = result if isinstance(result, int) else 0
    except Exception as e:
        if lock is not None:
            lock.release()
        return fail(e, 2 if is_input_error(e, setting_up=not started) else 1)
    except BaseException:  # KeyboardInterrupt, SystemExit: release, and let Python end the process
        if lock is not None:
            lock.release()
        raise
    if lock is not None:
        lock.release()
    return code
