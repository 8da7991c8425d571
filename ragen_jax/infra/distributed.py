"""One run over several JAX processes (TPU pod slices, multi-node GPU, several processes on one machine).

* `start_cluster`: called by the launchers before anything touches a device. It joins a cluster when
  one is asked for (`--coordinator-address/--num-processes/--process-id`, or the variables
  JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID: JAX itself reads only the first)
  or when a cluster manager that JAX can read is present (SLURM under `srun`, Open MPI under
  `mpirun`, a Cloud TPU VM). A plain machine is left alone: `jax.distributed.initialize()` there
  would fail or wait for peers that never come. A process that joined a cluster prints one line:
  process i of n, local and global devices.
* `on_primary`: a decision taken by process 0 alone (the run directory's config check, the run
  lock) and its error, if any, raised on every process. Each host deciding for itself could let one
  host's different disk send it down another path while the others wait in a collective forever.
* `RunLock`: one writer per run directory.
* `run_path`: a run directory that may be a bucket (`gs://...`): never through `Path.resolve()`.
(Host copies of arrays that span other processes' devices: `ragen_jax.rollout.metrics.host_copy`.)

This module imports nothing else of the project, and must not: `jax.distributed.initialize` has to
run before JAX's backend exists, and importing the environments (gymnax computes at import time)
creates it. That is also why the timeouts are launcher flags and not config keys: a config file
imports the environments.

A process that dies stops sending heartbeats; the coordination service then ends every other
process (JAX's "Terminating process because the JAX distributed service detected fatal errors")
within `heartbeat_timeout_s`. An exception on one host must not wait in the shutdown barrier
while the others wait in a collective: the launchers end such a process at once (`exit_now`).
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import glob
import importlib.util
import json
import os
import socket
import sys
from pathlib import Path

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

ENV_ADDRESS, ENV_NUM, ENV_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
# The launchers' defaults (--heartbeat-timeout / --shutdown-timeout / --init-timeout override them). The
# heartbeat is JAX's 100 s shortened to 30 s: a dead peer then ends every other process within a minute
# (heartbeats come from a background thread, so a long compilation or checkpoint never misses one).
DEFAULT_TIMEOUTS = {"heartbeat": 30, "shutdown": 300, "init": 300}


class ClusterError(ValueError):
    """A cluster that cannot be joined as asked, as one sentence."""


class RunDirBusy(RuntimeError):
    """The run directory is held by another live run (named in the message)."""


# ------------------------------------------------------------------------------------- start-up
@dataclasses.dataclass(frozen=True)
class ClusterRequest:
    how: str  # "single", "explicit" (flags / JAX_* variables) or the detected manager ("SLURM", ...)
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


def _int(name: str, raw) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ClusterError(f"{name} must be a whole number, got {raw!r}") from None


def _tpu_vm(environ) -> bool:
    """A Cloud TPU VM (the TPU runtime library and TPU chips present), the case in which
    `jax.distributed.initialize()` reads the slice's workers from the VM's metadata."""
    if environ.get("TPU_SKIP_MDS_QUERY") is not None:
        return False
    if importlib.util.find_spec("libtpu") is None:
        return False
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def detect_cluster(environ=None) -> str | None:
    """The cluster manager of this process that JAX can read by itself, or None (a plain machine).
    A one-task SLURM or MPI job is a plain machine: initialising would only add a coordinator."""
    env = os.environ if environ is None else environ
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
    if all(v in env for v in slurm) and (_int("SLURM_NTASKS", env["SLURM_NTASKS"]) or 1) > 1:
        return "SLURM"
    if "OMPI_MCA_orte_hnp_uri" in env and (_int("OMPI_COMM_WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE")) or 1) > 1:
        return "Open MPI"
    if env.get("MEGASCALE_COORDINATOR_ADDRESS") or "," in env.get("TPU_WORKER_HOSTNAMES", ""):
        return "TPU"
    if _tpu_vm(env):
        return "TPU"
    return None


def cluster_request(coordinator_address=None, num_processes=None, process_id=None, environ=None) -> ClusterRequest:
    """What to join: flags first, then the JAX_* variables, then a detected cluster manager.
    Raises ClusterError (one sentence) for an incomplete or inconsistent request."""
    env = os.environ if environ is None else environ
    addr = coordinator_address or env.get(ENV_ADDRESS) or None
    num = num_processes if num_processes is not None else _int(ENV_NUM, env.get(ENV_NUM))
    pid = process_id if process_id is not None else _int(ENV_ID, env.get(ENV_ID))
    if num is not None and num < 1:
        raise ClusterError(f"the number of processes must be >= 1, got {num}")
    if num == 1 and pid in (None, 0):
        return ClusterRequest("single")  # an explicit one-process run, also on a cluster manager
    if addr is None and num is None and pid is None:
        manager = detect_cluster(env)
        return ClusterRequest(manager) if manager else ClusterRequest("single")
    manager = detect_cluster(env)
    if None in (addr, num, pid) and manager is None:
        missing = [n for n, v in (("--coordinator-address / " + ENV_ADDRESS, addr),
                                  ("--num-processes / " + ENV_NUM, num), ("--process-id / " + ENV_ID, pid)) if v is None]
        raise ClusterError(f"a multi-process run outside TPU/SLURM/Open MPI needs all three of the coordinator "
                           f"address, the process count and this process's id; missing {', '.join(missing)}")
    if num is not None and pid is not None and not 0 <= pid < num:
        raise ClusterError(f"the process id must be in 0..{num - 1} for {num} processes, got {pid}")
    return ClusterRequest("explicit" if None not in (addr, num, pid) else manager, addr, num, pid)


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    process_index: int
    process_count: int
    local_devices: int
    global_devices: int
    platform: str
    how: str

    def line(self) -> str:
        return (f"process {self.process_index} of {self.process_count}: {self.local_devices} local "
                f"{self.platform} devices, {self.global_devices} global"
                + ("" if self.how == "single" else f" (cluster: {self.how})"))


def _distributed_client():
    from jax._src import distributed as _dist  # the only place JAX says whether it joined a cluster

    return _dist.global_state.client


def start_cluster(coordinator_address=None, num_processes=None, process_id=None, *, heartbeat_timeout_s=None,
                  shutdown_timeout_s=None, init_timeout_s=None, environ=None, announce=True) -> ClusterInfo:
    """Join the cluster asked for (see `cluster_request`) and print one line per process.

    Idempotent: a process that already joined one keeps it. Timeouts in seconds, JAX's defaults
    when None (`DEFAULT_TIMEOUTS`): a peer silent for `heartbeat_timeout_s` ends every process;
    `shutdown_timeout_s` bounds the wait for the others at exit; `init_timeout_s` the wait for them
    at start."""
    req = cluster_request(coordinator_address, num_processes, process_id, environ)
    if req.how != "single" and _distributed_client() is None:
        from jax._src import xla_bridge  # initialise must come before the first device use

        if xla_bridge.backends_are_initialized():
            raise ClusterError("a multi-process run must join its cluster before JAX touches a device; call "
                               "start_cluster first thing (the launchers do)")
        # CPU processes reduce over gloo (jax 0.10's default; set in case a site config turned it off).
        if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        kwargs = dict(
            initialization_timeout=int(init_timeout_s or DEFAULT_TIMEOUTS["init"]),
            heartbeat_timeout_seconds=int(heartbeat_timeout_s or DEFAULT_TIMEOUTS["heartbeat"]),
            shutdown_timeout_seconds=int(shutdown_timeout_s or DEFAULT_TIMEOUTS["shutdown"]))
        if req.how == "explicit":
            # All three given: JAX's cluster detection (which may also guess local device ids) is not needed.
            jax.distributed.initialize(req.coordinator_address, req.num_processes, req.process_id,
                                       cluster_detection_method="deactivate", **kwargs)
        else:
            jax.distributed.initialize(req.coordinator_address, req.num_processes, req.process_id, **kwargs)
    info = ClusterInfo(jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count(),
                       jax.devices()[0].platform, req.how)
    if announce and req.how != "single":  # a plain one-process run stays quiet
        print(info.line(), file=sys.stderr, flush=True)
    return info


def exit_now(code: int) -> None:
    """End this process at once, skipping JAX's exit-time shutdown barrier (which would wait for the
    other processes, themselves stuck in a collective with this one, up to the shutdown timeout):
    the silence of its heartbeats then ends the others within the heartbeat timeout."""
    sys.stdout.flush()
    sys.stderr.flush()
    for lock in list(_HELD):  # os._exit skips atexit: release what this process holds first
        lock.release()
    os._exit(code)


# ------------------------------------------------------------------------------------- process 0 decides
_TEXT_BYTES = 4096  # one broadcast message (an error sentence, a JSON record): fixed size, one compilation


def broadcast_text(text: str) -> str:
    """Process 0's `text` on every process (the others' argument is ignored)."""
    if jax.process_count() == 1:
        return text
    raw = text.encode("utf-8")[: _TEXT_BYTES - 4]
    buf = np.zeros(_TEXT_BYTES, np.uint8)
    buf[:4] = np.frombuffer(np.uint32(len(raw)).tobytes(), np.uint8)
    buf[4:4 + len(raw)] = np.frombuffer(raw, np.uint8)
    out = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    n = int(np.frombuffer(out[:4].tobytes(), np.uint32)[0])
    return out[4:4 + n].tobytes().decode("utf-8", errors="replace")


def _error_class(path: str):
    """The exception class named `module:qualname` (every process imported the same modules)."""
    module, _, name = path.partition(":")
    obj = sys.modules.get(module)
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) and issubclass(obj, Exception) else RuntimeError


def on_primary(fn):
    """Run `fn()` on process 0 only and return its (JSON-able) result on every process. An exception
    raised there is raised on every process, with the same class and message, so all of them stop
    together instead of some waiting for the others in a collective."""
    if jax.process_count() == 1:
        return fn()
    record, error = {}, None
    if jax.process_index() == 0:
        try:
            record = {"ok": fn()}
        except Exception as e:  # noqa: BLE001 - every failure must reach the other processes
            error = e
            record = {"error": f"{type(e).__module__}:{type(e).__qualname__}", "message": str(e)}
    record = json.loads(broadcast_text(json.dumps(record, default=str)))
    if error is not None:
        raise error
    if "error" in record:
        try:
            exc = _error_class(record["error"])(record["message"])
        except Exception:  # noqa: BLE001 - a class whose constructor wants more than a message
            exc = RuntimeError(record["message"])
        raise exc
    return record.get("ok")


def any_process(flag: bool) -> bool:
    """Whether `flag` is true on any process (a collective: every process calls it at the same point)."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(np.max(np.asarray(multihost_utils.process_allgather(np.int32(bool(flag))))))


_BARRIERS: dict[str, int] = {}


def barrier(name: str, timeout_s: int | None = None) -> None:
    """Every process waits here for all the others, through the coordination service (no device
    collective). Its use: after compiling and before the first collective, so that a process still
    compiling cannot time out the others' collective set-up (gloo's 30 s rendezvous: `Gloo context
    initialization failed: DEADLINE_EXCEEDED`). `timeout_s`: default the start-up timeout."""
    if jax.process_count() == 1:
        return
    from jax._src import distributed as jax_distributed  # the coordination client; jax has no public barrier

    client = jax_distributed.global_state.client
    if client is None:  # processes started by a runtime without jax.distributed (never in this project)
        multihost_utils.sync_global_devices(name)
        return
    count = _BARRIERS[name] = _BARRIERS.get(name, 0) + 1  # each barrier id is used once
    client.wait_at_barrier(f"{name}#{count}", int(1000 * (timeout_s or DEFAULT_TIMEOUTS["init"])))


# ------------------------------------------------------------------------------------- paths
def is_remote(path) -> bool:
    return "://" in os.fspath(path) if not isinstance(path, str) else "://" in path


def run_path(workdir):
    """A run directory as a path object: a bucket URL (`gs://...`) as an `etils.epath.Path`, unchanged;
    a local directory absolute and resolved (orbax rejects relative paths, and only late)."""
    s = workdir if isinstance(workdir, str) else os.fspath(workdir)
    if is_remote(s):
        return epath.Path(s)
    return Path(s).expanduser().resolve()


# ------------------------------------------------------------------------------------- one writer per run
LOCK_NAME = "run.lock"
_HELD: list["RunLock"] = []


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (Linux), which tells a reused pid from the one recorded."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


def _pid_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):  # exited, not yet reaped by its parent
            return False
    except (OSError, IndexError):
        pass
    now = _proc_start(pid)
    return start is None or now is None or now == start


class RunLock:
    """`<workdir>/run.lock`: host, pid, process count and start time of the run writing there.

    `acquire()` (process 0 only; see `acquire_run_lock` for all processes) creates it atomically,
    or raises RunDirBusy naming the holder; a lock left by a dead process on this host is taken
    over with a warning. A holder on another host cannot be checked from here: the message says
    which file to delete if that run is known to be dead. Released by `release()`, at exit, and
    by `exit_now`. On a bucket the create is check-then-write (buckets have no exclusive create)."""

    def __init__(self, workdir, processes: int = 1):
        self.workdir = run_path(workdir)
        self.path = self.workdir / LOCK_NAME
        self.processes = processes
        self.record = None
        self._made_dir = False

    def _describe(self, h: dict) -> str:
        return (f"{self.workdir} is in use by another run (host {h.get('host', '?')}, pid {h.get('pid', '?')}, "
                f"{h.get('processes', '?')} process(es), started {h.get('started', '?')}); wait for it to finish or "
                f"use another --workdir (if that run is dead, delete {self.path})")

    def _create(self, text: str) -> bool:
        if is_remote(self.workdir):
            if self.path.exists():
                return False
            self.path.write_text(text)
            return json.loads(self.path.read_text()).get("token") == self.record["token"]
        tmp = Path(f"{self.path}.{os.getpid()}.tmp")
        tmp.write_text(text)
        try:
            os.link(tmp, self.path)  # atomic, fails if the lock exists; the content is complete at once
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def acquire(self) -> str | None:
        """Take the lock; returns a warning when a dead holder's lock was taken over, else None."""
        if not self.workdir.exists():
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._made_dir = True
        pid = os.getpid()
        self.record = {"host": socket.gethostname(), "pid": pid, "pid_start": _proc_start(pid),
                       "processes": self.processes, "argv": sys.argv,
                       "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                       "token": f"{socket.gethostname()}:{pid}:{os.urandom(8).hex()}"}
        text = json.dumps(self.record, indent=1)
        warning = None
        for _ in range(3):
            if self._create(text):
                _HELD.append(self)
                return warning
            try:
                holder = json.loads(self.path.read_text())
            except FileNotFoundError:
                continue  # released meanwhile: try again
            except (OSError, ValueError):
                raise RunDirBusy(f"{self.workdir} has an unreadable lock file {self.path}; if no run is writing "
                                 "there, delete it") from None
            same_host = holder.get("host") == self.record["host"]
            if same_host and holder.get("pid") == pid:
                pass  # left by this very process (an earlier run in it that was not released): ours
            elif not same_host or _pid_alive(int(holder.get("pid", -1)), holder.get("pid_start")):
                raise RunDirBusy(self._describe(holder))
            else:
                warning = (f"warning: taking over the lock of a dead run in {self.workdir} (host {holder.get('host')}, "
                           f"pid {holder.get('pid')}, started {holder.get('started')})")
            self.path.unlink(missing_ok=True)
        raise RunDirBusy(self._describe({}))

    def release(self) -> None:
        if self not in _HELD:
            return
        _HELD.remove(self)
        try:
            if json.loads(self.path.read_text()).get("token") == self.record["token"]:
                self.path.unlink()
            if self._made_dir and not any(self.workdir.iterdir()):
                self.workdir.rmdir()  # a launch refused for bad input leaves nothing behind
        except (OSError, ValueError):
            pass


@atexit.register
def _release_all():
    for lock in list(_HELD):
        lock.release()


def acquire_run_lock(workdir) -> RunLock | None:
    """Every process calls this; process 0 takes `<workdir>/run.lock` and all of them raise RunDirBusy
    together if it is held. Returns the lock on process 0, None on the others."""
    lock = RunLock(workdir, jax.process_count()) if jax.process_index() == 0 else None
    warning = on_primary(lambda: lock.acquire())
    if warning and jax.process_index() == 0:
        print(warning, file=sys.stderr, flush=True)
    return lock


__all__ = ["ClusterError", "ClusterInfo", "ClusterRequest", "DEFAULT_TIMEOUTS", "LOCK_NAME", "RunDirBusy", "RunLock",
           "acquire_run_lock", "any_process", "barrier", "broadcast_text", "cluster_request", "detect_cluster", "exit_now", "is_remote", "on_primary", "run_path", "start_cluster"]
