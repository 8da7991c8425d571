"""The lent GPU's one prepared check, rehearsed here end to end with tiny shapes (`--cpu-rehearsal`):
every part runs and writes the JSON, the conversion accepts it, the README table shows it; a failing
part is recorded and the next one runs; scripts/gpu_check.sh runs the same module and prints its summary.

The truth: bf16 vs float32 error in the range bf16 rounding gives (METHOD.md: 1e-3 to 1e-2), the
chunked kernel against the float32 reference likewise, our float32 logits equal to transformers' where
torch is installed, the decode bound's bytes counted by hand for the tiny shape, the README row typed
out from the JSON's own numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check
from scripts import gpu_results, readme_results

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rehearsal_run(tmp_path_factory):
    """scripts/gpu_check.sh --cpu-rehearsal, as the GPU runs it (in its own process: the script sets
    the rehearsal's XLA flags and compilation cache before JAX starts)."""
    out = tmp_path_factory.mktemp("gpu")
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["bash", "scripts/gpu_check.sh", "--cpu-rehearsal"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((out / "gpu_check.json").read_text()), r.stdout


@pytest.fixture(scope="module")
def rehearsal(rehearsal_run):
    return rehearsal_run[0]


def test_every_part_runs_and_measures(rehearsal):
    parts = rehearsal["parts"]
    assert list(parts) == list(gpu_check.PARTS) and rehearsal["rehearsal"] is True
    for name, part in parts.items():
        assert "error" not in part, (name, part.get("error"))
    p = parts["parity"]["bf16_vs_f32"]
    assert 1e-4 < p["logits_rel_err"] < 3e-2 and p["greedy_agreement"] > 0.9
    hf = parts["parity"]["ours_vs_transformers_f32"]
    if "error" not in hf:  # torch installed (the parity fixtures' environment)
        assert hf["logits_rel_err"] < 1e-5 and hf["greedy_agreement"] == 1.0
    att = parts["attention"]
    assert att["chunked"]["out_rel_err"] < 2e-2 and att["chunked"]["dq_rel_err"] < 2e-2
    assert "runs only on a GPU" in att["cudnn"]["error"]  # recorded, the other kernels still measured
    # Tiny decode at each fill: 2 layers x (K and V) x 2 rows x fill slots x KV heads x head dim x 2 bytes,
    # plus the same bf16 weights at every fill.
    dec = parts["decode"]
    from ragen_jax.models import Qwen2Config

    c = Qwen2Config.from_preset("tiny")
    weights = {r["filled_bytes_per_step"] - 2 * c.num_hidden_layers * 2 * r["fill"] * c.num_key_value_heads
               * c.head_dim * 2 for r in dec["fills"]}
    assert [r["fill"] for r in dec["fills"]] == [48, 160] and len(weights) == 1
    assert weights.pop() % 2 == 0 and all(r["bounded_step_ms"] > 0 and r["full_step_ms"] > 0 for r in dec["fills"])
    it = parts["iteration"]
    assert it["finite"] and it["rollout_s"] > 0 and it["prepare_s"] > 0 and it["update_s"] > 0
    assert set(it["estimate"]) == {"rollout", "prepare", "update"}
    # The filled-cache bound: at most turns x response budget decode steps (2 x 8 in the rehearsal), the
    # K/V of at least one slot per step; the rollout before issue 45 timed beside it.
    assert 1 <= it["rollout_decode_steps"] <= 16 and it["rollout_filled_kv_bytes"] > 0
    assert it["rollout_warm_s"] > 0 and it["rollout_before_s"] > 0
    fit = parts["fit_3b"]
    assert fit["fits"] and fit["finite"] and fit["estimate_program_bytes"] > 0


def test_conversion_and_readme_table(rehearsal, tmp_path):
    raw = tmp_path / "files_at"
    raw.mkdir()
    (raw / "gpu_check.json").write_text(json.dumps(rehearsal))
    assert gpu_results.main([str(raw), "--out-dir", str(tmp_path / "bench" / "results")]) == 0
    conv = json.loads((tmp_path / "bench" / "results" / "gpu_cpu-rehearsal.json").read_text())
    s = conv["summary"]
    assert s["rehearsal"] and s["device_kind"] == "cpu" and set(s["errors"]) == set()
    lines = readme_results.render(tmp_path).splitlines()
    row = next(ln for ln in lines if ln.startswith("| cpu (CPU rehearsal) |"))
    it = rehearsal["parts"]["iteration"]
    assert f"| {it['rollout_s']:.2f} / {it['prepare_s']:.2f} / {it['update_s']:.2f} |" in row
    assert f"| {rehearsal['parts']['parity']['bf16_vs_f32']['logits_rel_err']:.1e} |" in row


def test_a_failing_part_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    def broken(sz):
        raise RuntimeError("planted")

    monkeypatch.setattr(gpu_check, "part_parity", broken)
    out = tmp_path / "g.json"
    gpu_check.run_parts(["parity", "environment"], gpu_check.shapes(True), True, 60.0, out)
    d = json.loads(out.read_text())
    assert d["parts"]["parity"]["error"] == "RuntimeError: planted" and "copy_gb_s" in d["parts"]["environment"]
    # A real run skips a part it has no time left for, naming why.
    gpu_check.run_parts(["environment"], gpu_check.shapes(True), False, 1.0, out)
    assert "s left of the budget" in json.loads(out.read_text())["parts"]["environment"]["skipped"]


def test_bad_input_gets_one_sentence(tmp_path, capsys):
    assert gpu_check.main(["--cpu-rehearsal", "--parts", "nope", "--out", str(tmp_path / "x.json")]) == 2
    assert "unknown part 'nope'" in capsys.readouterr().err
    assert gpu_check.main(["--out", str(tmp_path / "x.json")]) == 2  # no GPU here and no --cpu-rehearsal
    assert "not a GPU" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="has no 'parts'"):
        gpu_results.main([str(tmp_path / "bad.json")])


def test_shell_script_prints_the_summary(rehearsal_run):
    d, stdout = rehearsal_run
    assert d["parts"]["environment"]["device_kind"] == "cpu"
    # the script's allocator defaults (one preallocated pool of 95%) are recorded with the numbers
    assert d["settings"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    assert d["settings"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    for name in gpu_check.PARTS:  # one summary line per part, in the reply's tail
        assert f"\n{name} {{" in "\n" + stdout
