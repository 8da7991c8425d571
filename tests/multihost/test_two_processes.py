"""Several JAX processes as one run, on this machine: 2 processes x 4 simulated CPU devices (gloo
collectives, joined through JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID) against
1 process x 8 devices with the same config, seed and mesh (data 4 x tensor 2).

The truth is the one-process run: the two-process RL (PPO with a critic, and GRPO), SFT and
evaluation runs must log the same metrics and export the same parameters. Measured: identical to
the last bit on this CPU for RL; the tolerance (rtol 1e-5, atol 1e-6 for metrics, atol 1e-6 for
parameters) allows the two runs' all-reduces (gloo across processes, in-process otherwise) to add in
another order, which Adam can amplify for a near-zero gradient (an SFT run at lr 3e-3 once differed
by 2.7e-6 in one of 16,384 entries; at the default lr 1e-5 used here that is ~1e-8). The PPO run is made in two launches (1 iteration, then resumed to 2 from the two-process
checkpoint), so it also shows that resuming over two processes continues exactly. Then: a second
launch into a live run directory is refused, killing either process ends the other with an error
within the heartbeat timeout, and a dead holder's lock is taken over.

Every launch has a timeout, so a hang fails the test instead of stalling CI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(__file__).resolve().parent / "site"
LAUNCH_TIMEOUT = 480  # seconds per launch: far above a normal run, so only a hang reaches it
RTOL, ATOL, PARAM_ATOL = 1e-5, 1e-6, 1e-6

# tiny_cpu.py, smaller: P*N = 8 rows over 4 data shards, 4 kept trajectories, one optimizer step per iteration.
RL = ["--config.train.val_size=8", "--config.train.save_every=1", "--config.rollout.num_groups=2",
      "--config.rollout.group_size=4", "--config.filter.value=0.5", "--config.batching.mini_batch_size=4",
      "--config.prompt.max_turns=2", "--config.prompt.max_response_tokens=8", "--config.rollout.max_context=384",
      "--config.mesh.data=4", "--config.mesh.tensor=2"]
# 384: the 167-token prompt prefix and 2 turn segments of up to 108 tokens (the rollout refuses less), as
# tests/ragen_jax/trainer/test_memory_check.py; the evaluation's one turn fits 288.
# PPO: one turn, so the passes score each group's shared beginning once (`group_prefix`), with a critic
# beside the actor (their passes chained, `step.after`), and the collapse probe shares its prompts;
# GRPO keeps two turns (the prompt-prefix path).
PPO = [*RL, "--config.prompt.max_turns=1", "--config.rollout.max_context=288", "--config.train.val_every=2",
       "--config.train.log_samples=1"]
GRPO = [*RL, "--config.advantage.estimator=grpo", "--config.advantage.reward_norm=mean_std", "--config.model.critic=none",
        "--config.train.val_every=0", "--config.train.log_samples=0", "--config.train.iterations=1"]
# Bandit: one turn whose prompt every demo of a group shares, so the warm start's prompt groups are on
# (sft.group_prompts: each distinct prompt of a batch runs once), over the processes as in one.
SFT = ["--config.env.name=Bandit", "--config.prompt.max_turns=1", "--config.prompt.max_actions_per_turn=1",
       "--config.prompt.max_response_tokens=24", "--config.rollout.max_context=256",
       "--config.sft.num_demos=16", "--config.sft.batch_size=4", "--config.sft.epochs=1", "--config.sft.length_bucket=0",
       "--config.sft.save_every=2", "--config.train.val_every=0", "--config.mesh.data=4", "--config.mesh.tensor=2"]
EVAL = ["--envs", "Sokoban", "--num-states", "8", "--max-turns", "1", "--max-response-tokens", "8",
        "--max-context", "288", "--seed", "3"]


# ------------------------------------------------------------------------------------- helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(i: int, port: int, cache: Path, n: int = 2, devices: int = 4) -> dict:
    """Process i's environment. Process 0 compiles each program and the others load its executable
    (JAX_SHARE_BINARY_BETWEEN_HOSTS; site/sitecustomize.py makes their cache keys equal), from a
    persistent cache of this launch's test only: with the session's cache, a program another test's
    launch wrote meanwhile could be found by process 0 but not by process 1 a moment earlier, which
    would then wait for a binary process 0 never publishes."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(n), JAX_PROCESS_ID=str(i))
    env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_SHARE_BINARY_BETWEEN_HOSTS="1",
               PYTHONPATH=os.pathsep.join([str(SITE), *filter(None, [env.get("PYTHONPATH")])]))
    return env


def start_two(script: str, args: list[str], logs: Path) -> list[subprocess.Popen]:
    """2 processes x 4 devices running `launch/<script> args`; output in logs/p{i}.log. The launches
    of one test share logs.parent/"cache" (the PPO fixture's resumed launch loads the first's programs)."""
    port = free_port()
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(2):
        out = open(logs / f"p{i}.log", "w")
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "launch" / script), *args], cwd=ROOT,
                                      env=process_env(i, port, logs.parent / "cache"), stdout=out,
                                      stderr=subprocess.STDOUT))
        out.close()
    return procs


def run_two(script: str, args: list[str], logs: Path) -> list[str]:
    """Run both processes to the end (each must exit 0); returns their outputs."""
    procs = start_two(script, args, logs)
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        pytest.fail(f"{script} on 2 processes did not finish in {LAUNCH_TIMEOUT} s:\n" + _tails(logs))
    outs = [(logs / f"p{i}.log").read_text() for i in range(2)]
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} exited {p.returncode}:\n" + _tails(logs)
    for i, out in enumerate(outs):
        assert f"process {i} of 2: 4 local cpu devices, 8 global" in out, out[-3000:]
    return outs


def _tails(logs: Path) -> str:
    return "\n".join(f"--- p{i}\n" + (logs / f"p{i}.log").read_text()[-3000:] for i in range(2))


def run_one(script: str, args: list[str]) -> None:
    """The same launcher in one process with 8 devices (in this test process: conftest gives it 8)."""
    assert jax.process_count() == 1 and jax.device_count() == 8, "the reference needs 1 process x 8 devices"
    spec = importlib.util.spec_from_file_location(f"launch_{script[:-3]}", ROOT / "launch" / script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(args) == 0


def metrics(workdir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("timing/")} for r in rows]


def assert_same_metrics(got: list[dict], want: list[dict]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]  # also: no row written twice
    for g, w in zip(got, want):
        assert g.keys() == w.keys(), sorted(set(g) ^ set(w))
        for k in g:
            np.testing.assert_allclose(g[k], w[k], rtol=RTOL, atol=ATOL, err_msg=f"step {g['step']} {k}")


def policy(workdir: Path) -> list[np.ndarray]:
    """The exported policy's parameters as host arrays, whatever mesh wrote them."""
    ckptr = ocp.PyTreeCheckpointer()
    tree = ckptr.metadata(workdir / "policy").item_metadata.tree
    restore = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return jax.tree.leaves(ckptr.restore(workdir / "policy", restore_args=restore))


def assert_same_policy(a: Path, b: Path) -> None:
    pa, pb = policy(a), policy(b)
    assert len(pa) == len(pb) and pa
    for x, y in zip(pa, pb):
        np.testing.assert_allclose(x, y, atol=PARAM_ATOL)


# ------------------------------------------------------------------------------------- RL
@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory):
    """(two-process run dir, one-process run dir) of the same 2-iteration PPO run; the two-process
    one in two launches: 1 iteration, then resumed from its checkpoint to 2."""
    base = tmp_path_factory.mktemp("ppo")
    two, one = base / "two", base / "one"
    run_two("tpu_train.py", ["--config", "tiny_cpu.py", "--workdir", str(two), "--quiet", *PPO,
                             "--config.train.iterations=1"], base / "logs1")
    outs = run_two("tpu_train.py", ["--config", "tiny_cpu.py", "--workdir", str(two), *PPO,
                                    "--config.train.iterations=2"], base / "logs2")
    assert "resuming" in outs[0] and "from iteration 1" in outs[0]
    run_one("tpu_train.py", ["--config", "tiny_cpu.py", "--workdir", str(one), "--quiet", *PPO,
                             "--config.train.iterations=2"])
    return two, one


def test_ppo_two_processes_equal_one_and_resume_exactly(ppo_runs):
    two, one = ppo_runs
    got, want = metrics(two), metrics(one)
    assert [r["step"] for r in want] == [0, 1, 2, 2]  # validation at 0, iterations 1 and 2, validation at 2
    assert "critic/value_loss" in want[1] and "val/Sokoban/success" in want[0]
    assert_same_metrics(got, want)
    assert_same_policy(two, one)
    # Only process 0 wrote: one TensorBoard file per launch, the run's files once, the lock released.
    assert len(list((two / "tb").glob("events.out.tfevents.*"))) == 2
    assert json.loads((two / "config.json").read_text()) == json.loads((one / "config.json").read_text())
    assert (two / "vocab.json").read_text() == (one / "vocab.json").read_text()
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["1", "2"]
    assert not (two / "run.lock").exists()


def test_grpo_two_processes_equal_one(tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    run_two("tpu_train.py", ["--config", "tiny_cpu.py", "--workdir", str(two), "--quiet", *GRPO], tmp_path / "logs")
    run_one("tpu_train.py", ["--config", "tiny_cpu.py", "--workdir", str(one), "--quiet", *GRPO])
    got, want = metrics(two), metrics(one)
    # One iteration: the PPO test above carries the state over two iterations and a resume.
    assert [r["step"] for r in want] == [1] and "critic/value_loss" not in want[0]
    assert_same_metrics(got, want)
    assert_same_policy(two, one)


# ------------------------------------------------------------------------------------- SFT, evaluation
def test_sft_two_processes_equal_one(tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    run_two("sft.py", ["--config", "tiny_cpu.py", "--workdir", str(two), "--quiet", *SFT], tmp_path / "logs")
    run_one("sft.py", ["--config", "tiny_cpu.py", "--workdir", str(one), "--quiet", *SFT])
    got, want = metrics(two), metrics(one)
    assert len(want) >= 2 and "demo/num_kept" in want[0] and "sft/loss" in want[-1]
    assert want[0]["demo/prompt_groups"] >= 1  # the grouped step ran (0: the per-row path)
    assert_same_metrics(got, want)
    assert_same_policy(two, one)
    assert json.loads((two / "demos.json").read_text()).keys() == json.loads((one / "demos.json").read_text()).keys()


def test_eval_two_processes_equal_one(ppo_runs, tmp_path):
    run_dir, _ = ppo_runs
    run_two("eval.py", ["--model", str(run_dir), *EVAL, "--out", str(tmp_path / "two.json")], tmp_path / "logs")
    run_one("eval.py", ["--model", str(run_dir), *EVAL, "--all-devices", "--out", str(tmp_path / "one.json")])
    two = json.loads((tmp_path / "two.json").read_text())
    one = json.loads((tmp_path / "one.json").read_text())
    assert two["settings"]["processes"] == 2 and one["settings"]["processes"] == 1
    assert two["settings"]["devices"] == one["settings"]["devices"] == 8
    got, want = two["results"]["Sokoban"], one["results"]["Sokoban"]
    assert want["num_episodes"] == 8
    for k in want:
        if k != "seconds":
            np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)


# ------------------------------------------------------------------------------------- failures, the lock
@pytest.mark.parametrize("victim", [1, 0])
def test_live_run_is_refused_and_a_killed_process_ends_the_other(victim, tmp_path, capsys):
    """Process `victim` is killed (SIGKILL) mid-run: the other must exit non-zero, saying so in one line,
    within a minute at the default heartbeat timeout (30 s). Killing process 0 (the lock holder and JAX's coordinator) leaves its lock behind, which
    the next launch takes over with a warning."""
    wd, logs = tmp_path / "run", tmp_path / "logs"
    procs = start_two("tpu_train.py", ["--config", "tiny_cpu.py", "--workdir", str(wd), "--quiet", *GRPO,
                                       "--config.train.iterations=1000"], logs)
    spec = importlib.util.spec_from_file_location("launch_train", ROOT / "launch" / "tpu_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while not (wd / "run.lock").exists():
            assert all(p.poll() is None for p in procs), "a process ended early:\n" + _tails(logs)
            assert time.monotonic() < deadline, "no run.lock appeared:\n" + _tails(logs)
            time.sleep(0.5)
        holder = json.loads((wd / "run.lock").read_text())
        # The launched process supervises the run's process (experiment/cli.py `supervise`): the holder is its child.
        parent = int(Path(f"/proc/{holder['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent == procs[0].pid and holder["processes"] == 2 and holder["host"] == socket.gethostname()

        # A second launch into the live run directory: refused in one line naming the holder.
        capsys.readouterr()
        assert mod.main(["--config", "tiny_cpu.py", "--workdir", str(wd), "--quiet", *GRPO]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is in use by another run" in err[0] and f"pid {holder['pid']}" in err[0], err
        assert json.loads((wd / "run.lock").read_text()) == holder

        time.sleep(2)  # let the run get going (compiling or in a collective)
        procs[victim].send_signal(signal.SIGKILL)
        survivor = procs[1 - victim]
        # A hang guard, not a timing: every survivor must be gone within a minute.
        try:
            rc = survivor.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"process {1 - victim} kept running after process {victim} was killed:\n" + _tails(logs))
        assert rc != 0, _tails(logs)
        # One line says so (no stack trace of JAX's runtime): the survivor's output after the kill.
        out = (logs / f"p{1 - victim}.log").read_text()
        errors = [x for x in out.splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and "another process of this run died" in errors[0], out[-3000:]
        assert "Check failure stack trace" not in out and "Traceback" not in out, out[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    if victim != 0:
        return
    # The dead holder's lock is taken over with a warning; this launch then fails on bad input found
    # by the Trainer (a batch the 4 data shards cannot split) and releases the lock again.
    assert json.loads((wd / "run.lock").read_text()) == holder
    capsys.readouterr()
    assert mod.main(["--config", "tiny_cpu.py", "--workdir", str(wd), "--quiet", *GRPO,
                     "--config.rollout.group_size=2", "--config.batching.mini_batch_size=2"]) == 2
    err = capsys.readouterr().err
    assert "taking over the lock of a dead run" in err and f"pid {holder['pid']}" in err, err
    assert not (wd / "run.lock").exists()


def test_run_lock_unit(tmp_path):
    """The lock on its own: exclusive, released, a dead holder's lock taken over, another host's refused."""
    from ragen_jax.infra.distributed import RunDirBusy, RunLock

    wd = tmp_path / "w"
    a = RunLock(wd)
    assert a.acquire() is None and (wd / "run.lock").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    a.release()
    assert not wd.exists()  # made by the lock and left empty: removed, as if never launched
    wd.mkdir()
    (wd / "run.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": "then"}))
    b = RunLock(wd)
    assert "taking over" in b.acquire()
    with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):  # held by this live process
        _acquire_from_other_process(wd)
    b.release()
    (wd / "run.lock").write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "then", "processes": 4}))
    with pytest.raises(RunDirBusy, match="host elsewhere, pid 1, 4 process"):
        RunLock(wd).acquire()


def _acquire_from_other_process(wd: Path):
    """Acquire `wd`'s lock from a child process; raise its RunDirBusy message here."""
    code = ("import sys; from ragen_jax.infra.distributed import RunLock, RunDirBusy\n"
            "try:\n    RunLock(sys.argv[1]).acquire()\nexcept RunDirBusy as e:\n    print(e); sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code, str(wd)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    from ragen_jax.infra.distributed import RunDirBusy

    if r.returncode == 3:
        raise RunDirBusy(r.stdout.strip())
    raise AssertionError(f"the child took a held lock (rc {r.returncode}): {r.stderr[-2000:]}")


# ------------------------------------------------------------------------------------- start-up, paths
def test_cluster_request_from_flags_variables_and_cluster_managers():
    from ragen_jax.infra.distributed import ClusterError, cluster_request

    jax_vars = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
             "SLURM_LOCALID": "0"}
    assert cluster_request(environ={}).how == "single"  # a plain machine: never initialise
    got = cluster_request(environ=jax_vars)
    assert (got.how, got.coordinator_address, got.num_processes, got.process_id) == ("explicit", "10.0.0.1:1234", 4, 3)
    got = cluster_request("h:1", 2, 0, environ=jax_vars)  # flags win over the variables
    assert (got.coordinator_address, got.num_processes, got.process_id) == ("h:1", 2, 0)
    assert cluster_request(environ=slurm).how == "SLURM"
    assert cluster_request(environ={**slurm, "SLURM_NTASKS": "1"}).how == "single"  # a one-task job
    assert cluster_request(environ={**slurm, "JAX_NUM_PROCESSES": "1"}).how == "single"  # asked for one process
    assert cluster_request(environ={"OMPI_MCA_orte_hnp_uri": "1.0;tcp://x:1", "OMPI_COMM_WORLD_SIZE": "2"}).how == "Open MPI"
    assert cluster_request(environ={"TPU_WORKER_HOSTNAMES": "w0,w1"}).how == "TPU"
    # Under a cluster manager a coordinator address alone is enough (JAX reads the rest).
    assert cluster_request(environ={**slurm, "JAX_COORDINATOR_ADDRESS": "n1:5"}).how == "SLURM"
    with pytest.raises(ClusterError, match="missing --num-processes / JAX_NUM_PROCESSES, --process-id"):
        cluster_request(environ={"JAX_COORDINATOR_ADDRESS": "h:1"})
    with pytest.raises(ClusterError, match="in 0..1 for 2 processes, got 2"):
        cluster_request("h:1", 2, 2, environ={})
    with pytest.raises(ClusterError, match="JAX_NUM_PROCESSES must be a whole number, got 'two'"):
        cluster_request(environ={**jax_vars, "JAX_NUM_PROCESSES": "two"})


def test_launcher_rejects_an_incomplete_cluster_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "tpu_train.py"), "--config", "tiny_cpu.py", "--workdir",
                        str(tmp_path / "w"), "--num-processes", "2"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("JAX_C")})
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing --coordinator-address / JAX_COORDINATOR_ADDRESS" in lines[0], lines
    assert not (tmp_path / "w").exists()


def test_run_paths_keep_bucket_urls_and_make_local_paths_absolute(tmp_path, monkeypatch):
    from ragen_jax.infra.distributed import is_remote, run_path

    p = run_path("gs://bucket/runs/a")
    assert str(p) == "gs://bucket/runs/a" and str(p / "checkpoints") == "gs://bucket/runs/a/checkpoints"
    assert is_remote(p) and not is_remote(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert run_path("runs/a") == tmp_path.resolve() / "runs" / "a"
