"""scripts/gpu_learn.sh and scripts/gpu_model.py: the lent-GPU learning call, rehearsed here as the GPU runs it.

The model travels in parts (a call carries at most 64 MiB; SmolLM2's GGUF is 94 MB): the truths are the
file's own bytes (the joined file's sha256 computed here with hashlib), a part left behind or damaged
(one sentence naming it, exit 3, nothing learned or written), and the call's budget arithmetic on a
scripted clock. One rehearsal of the whole call (`--cpu-rehearsal`: a tiny random GGUF with a byte-level
vocabulary, one single-turn env, 2 states x 2 rollouts as two pooled runs of one, one RL iteration):
its JSON against the requested sizes and paired.py's own comparison of the two stages' per-state
rates, its summary line, and the docs/benchmarks.md row typed out from the JSON's numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_jax.evaluation.paired import paired_rates
from scripts import gpu_learn, gpu_model, readme_results

ROOT = Path(__file__).resolve().parents[1]


def _sh(*args, model_dir, out, cache):
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
           "GPU_MODEL_DIR": str(model_dir), "RAGEN_JAX_CACHE": str(cache)}
    return subprocess.run(["bash", "scripts/gpu_learn.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_model")
    model = gpu_model.write_tiny(d / "tiny.gguf")
    m = gpu_model.split(model, d / "parts", ROOT, parts=2)
    return model, d / "parts", m


def test_split_parts_rebuild_the_file(parts, tmp_path):
    model, pdir, m = parts
    data = model.read_bytes()
    assert [p["name"] for p in m["parts"]] == ["tiny.gguf.part0", "tiny.gguf.part1"]
    assert sum(p["size"] for p in m["parts"]) == len(data) and m["sha256"] == hashlib.sha256(data).hexdigest()
    assert b"".join((pdir / p["name"]).read_bytes() for p in m["parts"]) == data
    work = tmp_path / "w"
    work.mkdir()
    for f in pdir.iterdir():
        (work / f.name).write_bytes(f.read_bytes())
    joined = gpu_model.join(work)
    assert joined.read_bytes() == data
    (work / "tiny.gguf.part0").unlink()  # joined already: a rerun while the machine is held needs no part
    assert gpu_model.join(work) == joined


def test_missing_or_damaged_parts_are_one_sentence(parts, tmp_path, capsys):
    _, pdir, _ = parts
    work = tmp_path / "w"
    work.mkdir()
    (work / "manifest.json").write_bytes((pdir / "manifest.json").read_bytes())
    (work / "tiny.gguf.part0").write_bytes((pdir / "tiny.gguf.part0").read_bytes())
    # The first call: its part staged, the other named as still to carry.
    assert gpu_model.main(["stage", "--dir", str(work)]) == 0
    assert "still to carry: tiny.gguf.part1" in capsys.readouterr().out
    assert gpu_model.main(["join", "--dir", str(work)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tiny.gguf.part1 is not on this machine" in err[0] and "again" in err[0]
    damaged = bytearray((pdir / "tiny.gguf.part1").read_bytes())
    damaged[100] ^= 1
    (work / "tiny.gguf.part1").write_bytes(bytes(damaged))
    assert gpu_model.main(["join", "--dir", str(work)]) == 3
    assert "tiny.gguf.part1 is damaged" in capsys.readouterr().err
    assert not (work / "tiny.gguf").exists()
    # A manifest naming SmolLM2's file with another hash is refused: the known file's sha256 is the truth.
    bad = json.loads((pdir / "manifest.json").read_text()) | {"file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
    (work / "manifest.json").write_text(json.dumps(bad))
    assert gpu_model.main(["stage", "--dir", str(work)]) == 3
    assert "not the known file's" in capsys.readouterr().err


def test_split_refuses_parts_that_do_not_fit(parts, tmp_path):
    model, _, _ = parts
    with pytest.raises(gpu_model.TransportError, match="less than 1 MiB"):
        gpu_model.split(model, tmp_path / "p", ROOT, call_limit_mib=1)


class _FakeRL:
    """An RL trainer whose iterations take scripted seconds on a scripted clock (`t[0]`)."""

    def __init__(self, t, costs):
        self.t, self.costs = t, list(costs)

    def iteration_step(self):
        self.t[0] += self.costs.pop(0)
        return {"train/success": 0.5}


def test_rl_stops_while_the_evaluation_still_fits():
    t = [0.0]
    clock = gpu_learn.Clock(100.0, now=lambda: t[0], start=0.0)
    args = type("A", (), {"iterations": 50})()
    rec = {"curve": []}
    # First iteration 30 s (compiles), then 10 s each; 20 s reserved for the evaluation: after 30 + 10 x 4
    # = 70 s, 10 s are left beside the reserve, fewer than 1.5 x 10 s: four more iterations, not five.
    gpu_learn.rl_iterations(args, _FakeRL(t, [30] + [10] * 49), rec, clock, reserve=20.0, first_guess=25.0)
    assert rec["iterations"] == 5 and rec["stopped_by"] == "time" and t[0] == 70.0
    assert [c["iteration"] for c in rec["curve"]] == [1, 2, 3, 4, 5]
    t[0] = 0.0
    rec = {"curve": []}
    gpu_learn.rl_iterations(args, _FakeRL(t, [1] * 50), rec, clock, reserve=20.0, first_guess=90.0)
    assert rec["iterations"] == 0  # the first (compiling) iteration would not fit: none is started
    args.iterations = 3
    gpu_learn.rl_iterations(args, _FakeRL(t, [1] * 50), rec, clock, reserve=0.0, first_guess=1.0)
    assert rec["iterations"] == 3 and rec["stopped_by"] == "iterations"


def test_bad_arguments_are_one_sentence(tmp_path, capsys):
    for argv, words in ((["--model", str(tmp_path / "nope.gguf")], "does not exist"),
                        (["--model", str(tmp_path), "--envs", "chess"], "--envs must name families"),
                        (["--model", str(tmp_path), "--eval-samples", "0"], "--eval-samples must be positive"),
                        (["--model", str(tmp_path), "--set", "optim.actor_lr"], "KEY=VALUE")):
        with pytest.raises(SystemExit):
            gpu_learn.parse(argv + ["--out", str(tmp_path / "o.json")])
        assert words in capsys.readouterr().err
    assert gpu_learn.main(["--model", str(tmp_path), "--out", str(tmp_path / "o.json"), "--set", "optim.nope=1"]) == 2
    assert "optim" in capsys.readouterr().err and not (tmp_path / "o.json").exists()


@pytest.fixture(scope="module")
def rehearsal(parts, tmp_path_factory):
    _, pdir, _ = parts
    out = tmp_path_factory.mktemp("out")
    work = tmp_path_factory.mktemp("device")
    (work / "manifest.json").write_bytes((pdir / "manifest.json").read_bytes())
    (work / "tiny.gguf.part0").write_bytes((pdir / "tiny.gguf.part0").read_bytes())
    cache = tmp_path_factory.mktemp("cache")
    missing = _sh("--cpu-rehearsal", model_dir=work, out=out, cache=cache)  # the second call's part not there
    (work / "tiny.gguf.part1").write_bytes((pdir / "tiny.gguf.part1").read_bytes())
    r = _sh("--cpu-rehearsal", "--envs", "countdown", "--eval-states", "2", "--eval-samples", "1", "--eval-repeats", "2",
            "--iterations", "1", "--budget-s", "3000", model_dir=work, out=out, cache=cache)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return missing, r, json.loads((out / "gpu_learn.json").read_text())


def test_a_call_without_every_part_stops_before_anything(rehearsal):
    missing, _, _ = rehearsal
    assert missing.returncode == 3 and "Traceback" not in missing.stderr
    assert "tiny.gguf.part1 is not on this machine" in missing.stderr


def test_rehearsal_learns_evaluates_and_compares(rehearsal):
    _, r, d = rehearsal
    assert d["kind"] == "gpu_learn" and d["rehearsal"] is True and d["machine"]["platform"] == "cpu"
    rec = d["envs"]["Countdown"]
    assert rec["status"] == "done", rec.get("traceback")
    assert rec["sft"]["steps"] == 2  # 8 demonstrations, batches of 4, one epoch
    assert rec["rl"]["iterations"] == len(rec["rl"]["curve"]) == 1 and rec["rl"]["stopped_by"] == "iterations"
    for stage in ("before", "after"):
        assert rec[stage]["num_states"] == 2 and rec[stage]["num_episodes"] == 4
        assert len(rec[stage]["state_success"]) == 2
    want = paired_rates(rec["before"]["state_success"], rec["after"]["state_success"], 2)
    assert rec["paired"] == json.loads(json.dumps(want))
    assert "optim.actor_lr=1e-6" in d["settings"]["rl"] and "rollout.group_size=16" in d["settings"]["rl"]
    assert f"Countdown: done; {want['before']:.3f} -> {want['after']:.3f}" in r.stdout


def test_readme_table_row_from_the_json(rehearsal, tmp_path):
    _, _, d = rehearsal
    res = tmp_path / "bench" / "results"
    (res / "gpu_runs").mkdir(parents=True)
    assert readme_results.gpu_learn_section(res)[2].startswith("Not run yet")
    (res / "gpu_runs" / "2099-01-01_learn.json").write_text(json.dumps(d))
    assert readme_results.gpu_learn_section(res)[2].startswith("Not run yet")  # a rehearsal is never a result
    d = d | {"rehearsal": False}
    (res / "gpu_runs" / "2099-01-01_learn.json").write_text(json.dumps(d))
    rec = d["envs"]["Countdown"]
    p = rec["paired"]
    row = readme_results.gpu_learn_section(res)[-2]
    assert row.startswith("| 2099-01-01 | cpu | Countdown | 1 (iterations) |")
    assert (f"{p['before']:.3f} -> {p['after']:.3f}, {p['change']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}], "
            f"p = {p['p_value']:.2g} (2 x 2)") in row
