"""scripts/readme_results.py's tables (docs/benchmarks.md and the README's short block) and launch/demo.py's publish step.

No demo run and no jax: hand-written eval.json / demo_summary.json in a temporary root, and the
expected markdown rows typed out by hand from those numbers (the truth the renderer must match).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragen_jax.recipes import demo
from scripts import readme_results

EVAL = {
    "settings": {"quick": False, "num_states": 256, "seed_start": 123, "temperature": 0.5, "rollouts_per_state": 1,
                 "overrides": {"bandit": [], "sokoban": ["sft.epochs=8"]}, "device": "cpu"},
    "results": {
        "bandit/sft": {"Bandit": {"success": 0.81640625, "format_ok": 1.0, "high_arm_rate": 0.81640625,
                                  "reward_mean": 0.40625, "num_episodes": 256, "seconds": 3.2},
                       "BanditTest": {"success": 0.0, "format_ok": 0.0, "high_arm_rate": 0.0,
                                      "reward_mean": -0.1, "num_episodes": 256}},
        "sokoban/rl": {"Sokoban": {"success": 0.1796875, "format_ok": 0.32421875, "reward_mean": -1.23456,
                                   "num_episodes": 256}},
    },
}
SUMMARY = {
    "quick": False,
    "stages": {"bandit/sft": {"train_s": 215.04, "train_cpu_s": 400.26, "eval_s": 30.0, "eval_cpu_s": 55.56,
                              "total_s": 245.04},
               "sokoban/rl": {"train_s": 750.0, "train_cpu_s": 1300.0, "eval_s": 55.0, "eval_cpu_s": 90.0,
                              "total_s": 805.0}},
    "total_s": 1234.5,
    "total_cpu_s": 2345.6,
    "peak_rss_mb": 8806.4,
    "cpu_count": 2,
    "targets": {
        "bandit/rl Bandit high_arm_rate": {"value": 1.0, "target": 0.9, "reached": True},
        "sokoban/rl Sokoban success": {"value": 0.1796875, "target": 0.5, "reached": False},
        "sokoban: RL gain over warm start (Sokoban success)": {
            "value": -0.0078125, "target": 0.1, "reached": False, "before": 0.1875, "after": 0.1796875,
            "states": 256, "gained": 3, "lost": 5, "p_value": 0.7265625},
    },
    "curves": ["curves_bandit_sft.png", "curves_sokoban_rl.png"],
}
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


def _root(tmp_path: Path, ev=EVAL, summary=SUMMARY, pngs=("curves_bandit_sft.png",)) -> Path:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = tmp_path / "docs" / "demo_results"
    d.mkdir(parents=True)
    if ev is not None:
        (d / "eval.json").write_text(json.dumps(ev))
    if summary is not None:
        (d / "demo_summary.json").write_text(json.dumps(summary))
    for n in pngs:
        (d / n).write_bytes(PNG)
    return tmp_path


def _lines(md: str) -> list[str]:
    return md.splitlines()


def test_metrics_table(tmp_path):
    lines = _lines(readme_results.render(_root(tmp_path)))
    assert "| stage | env | success | format_ok | high_arm_rate | reward_mean | num_episodes |" in lines
    assert "| bandit/sft | Bandit | 0.816 | 1.000 | 0.816 | 0.406 | 256 |" in lines
    assert "| bandit/sft | BanditTest | 0.000 | 0.000 | 0.000 | -0.100 | 256 |" in lines
    # Sokoban has no high_arm_rate: a dash, not a made-up number.
    assert "| sokoban/rl | Sokoban | 0.180 | 0.324 | - | -1.235 | 256 |" in lines


def test_settings_and_time_table(tmp_path):
    md = readme_results.render(_root(tmp_path))
    lines = _lines(md)
    settings = next(ln for ln in lines if "fixed states per env" in ln)
    for part in ("2-core machine", "device cpu", "256 fixed states per env (seeds from 123)", "temperature 0.5",
                 "total 20.6 min wall (39.1 CPU min)", "peak RSS 8,806 MiB", "`--sokoban.sft.epochs=8`"):
        assert part in settings, (part, settings)
    assert "| bandit/sft | 215.0 | 400.3 | 30.0 | 55.6 |" in lines
    assert "| sokoban/rl | 750.0 | 1300.0 | 55.0 | 90.0 |" in lines
    assert "| **total** | 1234.5 | 2345.6 | | |" in lines
    assert "Warning" not in md
    # Only the pretrained model's demo (another folder) is unpublished in this tree, and says how to publish it.
    unpublished = [ln for ln in lines if "published yet" in ln]
    assert len(unpublished) == 1 and "--model smollm2 --skip-sokoban --skip-frozen-lake --publish " \
        "docs/pretrained_results/bandit" in unpublished[0]
    # No JSON dump of the raw files.
    assert "```" not in md.split("### CPU demo", 1)[1]


def test_targets(tmp_path):
    lines = _lines(readme_results.render(_root(tmp_path)))
    assert "| bandit/rl Bandit high_arm_rate | 1.000 | 0.90 | reached | - | - | - |" in lines
    assert "| sokoban/rl Sokoban success | 0.180 | 0.50 | **NOT reached** | - | - | - |" in lines
    # The paired columns: before -> after (states), flips each way, the p-value as published.
    assert ("| sokoban: RL gain over warm start (Sokoban success) | -0.008 | 0.10 | **NOT reached** | "
            "0.188 -> 0.180 (256) | 3 / 5 | 0.73 |") in lines


def test_image_links_only_for_existing_pngs(tmp_path):
    md = readme_results.render(_root(tmp_path, pngs=("curves_bandit_sft.png", "curves_unlisted.png")))
    assert "![curves_bandit_sft](demo_results/curves_bandit_sft.png)" in md
    assert "curves_sokoban_rl" not in md  # listed in the summary, but the PNG was not published
    assert "curves_unlisted" not in md  # present, but not this run's


def test_quick_warning(tmp_path):
    ev = {**EVAL, "settings": {**EVAL["settings"], "quick": True, "num_states": 8}}
    md = readme_results.render(_root(tmp_path, ev=ev, summary={**SUMMARY, "quick": True}))
    assert "**Warning: `--quick` smoke run.**" in md and "NOT the demo's results" in md
    assert "8 fixed states per env" in md


def test_not_published(tmp_path):
    md = readme_results.render(_root(tmp_path, ev=None, summary=None, pngs=()))
    section = md.split("### CPU demo (`launch/demo.py`)", 1)[1]
    assert ("The demo results have not been published yet: `python launch/demo.py --workdir runs/demo "
            "--publish docs/demo_results && python scripts/readme_results.py`.") in section
    assert "|" not in section and "![" not in section
    assert md.rstrip().endswith(readme_results.END)


def test_eval_without_summary(tmp_path):
    # An eval.json alone still gives the metrics table; no time or target rows, no crash.
    lines = _lines(readme_results.render(_root(tmp_path, summary=None, pngs=())))
    assert "| bandit/sft | Bandit | 0.816 | 1.000 | 0.816 | 0.406 | 256 |" in lines
    assert not any(ln.startswith("| **total**") or ln.startswith("| target |") for ln in lines)


# ---- launch/demo.py --publish ------------------------------------------------------------------


def _workdir(tmp_path: Path) -> Path:
    w = tmp_path / "work"
    w.mkdir()
    (w / "eval.json").write_text('{"new": 1}')
    (w / "demo_summary.json").write_text('{"summary": "new"}')
    (w / "curves_bandit_rl.png").write_bytes(PNG + b"new")
    (w / "curves_bandit_sft.png").write_bytes(PNG + b"sft")
    return w


def test_publish_copies_overwrites_and_drops_stale_pngs(tmp_path):
    w = _workdir(tmp_path)
    dest = tmp_path / "docs" / "demo_results"
    dest.mkdir(parents=True)
    (dest / "eval.json").write_text('{"old": 1}')
    (dest / "curves_bandit_rl.png").write_bytes(b"old")
    (dest / "curves_sokoban_rl.png").write_bytes(b"stale")  # a previous run's family, not in this run
    (dest / "notes.txt").write_text("keep")  # not ours to remove

    copied = demo.publish_results(w, dest, [str(w / "curves_bandit_rl.png")])
    assert sorted(p.name for p in copied) == ["curves_bandit_rl.png", "demo_summary.json", "eval.json"]
    assert sorted(p.name for p in dest.iterdir()) == ["curves_bandit_rl.png", "demo_summary.json", "eval.json",
                                                      "notes.txt"]
    assert (dest / "eval.json").read_text() == '{"new": 1}'
    assert (dest / "demo_summary.json").read_text() == '{"summary": "new"}'
    assert (dest / "curves_bandit_rl.png").read_bytes() == PNG + b"new"
    assert (dest / "notes.txt").read_text() == "keep"


def test_publish_creates_dest_and_renders(tmp_path):
    w = _workdir(tmp_path)
    (w / "eval.json").write_text(json.dumps(EVAL))
    (w / "demo_summary.json").write_text(json.dumps({**SUMMARY, "curves": ["curves_bandit_sft.png"]}))
    (tmp_path / "bench" / "results").mkdir(parents=True)
    demo.publish_results(w, tmp_path / "docs" / "demo_results", ["curves_bandit_sft.png"])
    md = readme_results.render(tmp_path)
    assert "| bandit/sft | Bandit | 0.816 | 1.000 | 0.816 | 0.406 | 256 |" in md.splitlines()
    assert "![curves_bandit_sft](demo_results/curves_bandit_sft.png)" in md


def test_publish_errors(tmp_path):
    w = _workdir(tmp_path)
    with pytest.raises(ValueError, match="curves_missing.png not found"):
        demo.publish_results(w, tmp_path / "out", ["curves_missing.png"])
    assert not (tmp_path / "out").exists()  # nothing half-published
    with pytest.raises(ValueError, match="own workdir"):
        demo.publish_results(w, w, [])


def test_publish_flag_parsing(tmp_path):
    args, _ = demo.parse_args(["--workdir", str(tmp_path / "w"), "--publish", str(tmp_path / "p")])
    assert args.publish == str(tmp_path / "p")
    assert demo.parse_args(["--workdir", "w"])[0].publish is None
    with pytest.raises(SystemExit):
        demo.parse_args(["--workdir", str(tmp_path), "--publish", str(tmp_path)])


def test_sampler_tables_split_by_work_and_judge_like_for_like():
    """The decode tables put tokens-only sides next to tokens-only peers and log-prob sides next to
    log-prob peers; 'target met' comes from bench/sampler.py's like-for-like verdicts (hand-made here)."""
    row = {"shape": "tiny", "batch": 64, "prompt_len": 128, "new_tokens": 64,
           "ours_tok_s": 2000.0, "ours_bf16_tok_s": 3000.0, "ours_nolp_tok_s": 4000.0, "ours_bf16_nolp_tok_s": 7000.0,
           "torch_bf16_tok_s": 2000.0, "torch_bf16_lp_tok_s": 1500.0,
           "ratio_ours_nolp_over_torch_bf16": 2.0, "ratio_ours_bf16_nolp_over_torch_bf16": 3.5,
           "ratio_ours_over_torch_bf16_lp": 1.33, "ratio_ours_bf16_over_torch_bf16_lp": 2.0,
           "greedy_tokens_equal_frac": 1.0, "bandwidth_bound": {"decode_only_tok_s": 48000.0},
           "targets": {"min_ratio": {"best_peer": 3.0},
                       "met_like_for_like": {"ours": {"best_peer": False}, "ours_bf16": {"best_peer": False},
                                             "ours_nolp": {"best_peer": False}, "ours_bf16_nolp": {"best_peer": True}}}}
    half = {**row, "shape": "qwen2.5-0.5b", "batch": 16,
            "targets": {"min_ratio": {"tunix": 1.5, "torch_bf16": 1.0},
                        "met_like_for_like": {"ours": {"tunix": None, "torch_bf16": False},
                                              "ours_bf16": {"tunix": None, "torch_bf16": True}}}}
    lines = readme_results.sampler_section({"settings": {"bandwidth_gbs": 46.0}, "machine": {}, "rows": [row, half]})
    assert ("| tiny | 64 | 4,000 | 7,000 | - | 2,000 (2.00x / 3.50x) | - | - | 48,000 | 3x the fastest peer "
            "| f32 no, bf16 yes |") in lines
    assert "| tiny | 64 | 2,000 | 3,000 | - | - | 1,500 (1.33x / 2.00x) | f32 no, bf16 no | 1.0 |" in lines
    # Tunix has no log-prob side: its target is left out of the log-prob verdict, not counted as met.
    assert "| qwen2.5-0.5b | 16 | 2,000 | 3,000 | - | - | 1,500 (1.33x / 2.00x) | f32 no, bf16 yes | 1.0 |" in lines
    assert any(ln.startswith("| qwen2.5-0.5b | 16 | 4,000 | 7,000 |") and ln.endswith("| - |") for ln in lines)


def test_turn_blocks_table(tmp_path):
    res = tmp_path / "bench" / "results"
    res.mkdir(parents=True)
    (res / "turn_blocks.json").write_text(json.dumps({
        "machine": {"cpu_count": 2, "cpu_model": "Some CPU"}, "settings": {"repeats": 5},
        "rows": [{"family": "sokoban", "init_from": "runs/demo/sokoban/sft", "turn_slots": 5, "mean_turns": 1.834,
                  "step_s_plain": 5.006, "step_s_skip": 2.694, "speedup": 1.858,
                  "temp_mib_plain": {"update": 1365.2}, "temp_mib_skip": {"update": 1073.4}},
                 {"family": "frozen_lake", "init_from": None, "turn_slots": 10, "mean_turns": 9.5,
                  "step_s_plain": 4.0, "step_s_skip": 3.9, "speedup": 1.026}]}))
    lines = _lines(readme_results.render(tmp_path))
    assert "| sokoban | demo warm start | 1.83 / 5 | 5.01 | 2.69 | 1.86x | 1,365 MiB -> 1,073 MiB |" in lines
    assert "| frozen_lake | random init | 9.50 / 10 | 4.00 | 3.90 | 1.03x | - -> - |" in lines
    assert any("median of 5; 2-core Some CPU" in ln for ln in lines)


def test_pretrained_family_sections(tmp_path):
    """Each published docs/pretrained_results/<family>/ gets its own section, images linked from its folder,
    with the policy named; an unpublished family gets none."""
    root = _root(tmp_path)
    d = root / "docs" / "pretrained_results" / "bandit"
    d.mkdir(parents=True)
    ev = {**EVAL, "settings": {**EVAL["settings"], "model": "smollm2"}}
    (d / "eval.json").write_text(json.dumps(ev))
    (d / "demo_summary.json").write_text(json.dumps(SUMMARY))
    (d / "curves_bandit_sft.png").write_bytes(PNG)
    md = readme_results.render(root)
    section = md.split("### CPU demo from a pretrained model: bandit", 1)[1]
    assert "policy `smollm2`" in section.splitlines()[2]
    assert "![curves_bandit_sft](pretrained_results/bandit/curves_bandit_sft.png)" in section
    assert "### CPU demo from a pretrained model: sokoban" not in md and "published yet" not in md


def test_gpu_follow_up_rows(tmp_path):
    """bench/results/gpu_runs/: one row per part, settings from the call, the OOM's block size read from the
    allocator's error, peaks and mismatch typed out by hand."""
    runs = tmp_path / "gpu_runs"
    runs.mkdir()
    call = {"command": "bash scripts/gpu_check.sh --parts environment,iteration --iteration-set model.dtype=float32",
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "device_kind": "H100"}
    oom = {"call": call, "parts": {"iteration": {"error": "JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
                                                          "trying to allocate 37.58GiB with allocator GPU_0_bfc"}}}
    ok = {"settings": {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "jax_default_matmul_precision": "highest"},
          "parts": {"environment": {"device_kind": "H100"},
                    "iteration": {"overrides": ["model.random_init=true", "model.dtype=float32"], "rollout_s": 24.94,
                                  "prepare_s": 2.924, "update_s": 11.8, "peak_bytes_in_use": 3 * 2**30,
                                  "estimate_max_total_bytes": 2.5 * 2**30,
                                  "mismatch": {"mismatch/logp_abs_diff_mean": 0.00246, "mismatch/logp_abs_diff_max": 0.0143,
                                               "mismatch/k3_kl": 4.8e-6}}}}
    fit = {"parts": {"fit_3b": {"setting": "after-mb4", "micro_batch_size": 4, "update_s": 6.78,
                                "peak_bytes_in_use": 60 * 2**30, "estimate_program_bytes": 59.5 * 2**30}}}
    for name, d in (("2026-11-27_a", oom), ("2026-11-27_b", ok), ("2026-11-28_c", fit)):
        (runs / f"{name}.json").write_text(json.dumps(d))
    rows = readme_results.gpu_runs_section(tmp_path)[4:-1]
    assert rows == [
        "| 2026-11-27 | H100 | 0.5B Sokoban iteration, `model.dtype=float32` | false | default | OOM: 37.58GiB block | - | - |",
        "| 2026-11-27 | H100 | 0.5B Sokoban iteration, `model.dtype=float32` | true | highest | 3.00 / 2.50 | "
        "24.9 / 2.92 / 11.80 s | 0.0025 / 0.014 / 4.8e-06 |",
        "| 2026-11-28 | GPU | 3B GRPO update, `after-mb4` (4-row micro-batches) | ? | default | 60.00 / 59.50 | "
        "6.78 s update | - |",
    ]
    assert readme_results.gpu_runs_section(tmp_path / "none") == []


def test_readme_summary_rows(tmp_path):
    """The README's block: one row per paired target (hand-typed from SUMMARY), the GPU sentence from a real
    (not rehearsal) GPU summary only."""
    root = _root(tmp_path)
    res = root / "bench" / "results"
    (res / "gpu_cpu-rehearsal.json").write_text(json.dumps({"summary": {"rehearsal": True, "rollout_s": 1.0}}))
    md = readme_results.summary(root)
    lines = md.splitlines()
    assert "| tiny, from scratch | Sokoban | 0.188 -> 0.180 | 256 | 3 / 5 | 0.73 | - | 2-core CPU, 21 min |" in lines
    assert not any("high_arm_rate" in ln for ln in lines)  # not a paired target
    assert "RL iteration" not in md
    (res / "gpu_h100.json").write_text(json.dumps({"summary": {
        "rehearsal": False, "device_kind": "H100", "iteration_preset": "qwen2.5-0.5b", "rollout_s": 21.32,
        "prepare_s": 0.5736, "update_s": 2.9498, "update_mfu": 0.4664, "iteration_peak_gib": 31.43,
        "iteration_estimate_gib": 31.28}}))
    assert ("One RL iteration of `configs/sokoban.py` at qwen2.5-0.5b on an H100: rollout 21.3 s, prepare 0.57 s, "
            "update 2.95 s (MFU 46.6%); peak 31.4 GiB against the Trainer's estimate of 31.3 GiB.") \
        in readme_results.summary(root).splitlines()


def test_missing_markers_name_the_file(tmp_path):
    root = _root(tmp_path)
    (root / "README.md").write_text("no markers")
    (root / "docs" / "benchmarks.md").write_text(f"{readme_results.START}\n{readme_results.END}\n")
    with pytest.raises(ValueError, match="README.md has no <!-- summary:start -->"):
        readme_results.rewritten(root)


def test_committed_tables_are_current_and_the_readme_short():
    """The numbers in README.md and docs/benchmarks.md are the ones the result files give today (a result
    committed without `python scripts/readme_results.py` fails here), and the README stays a five-minute read."""
    stale = [str(p) for p, (old, new) in readme_results.rewritten().items() if old != new]
    assert not stale, f"out of date: {stale}; run python scripts/readme_results.py"
    assert len((readme_results.ROOT / "README.md").read_text().splitlines()) <= 200


def test_k_sample_results_get_their_column(tmp_path):
    """A gain target with a k-sample comparison (launch/demo.py --eval-samples): its cell in the demo's
    targets table and the README's summary, typed out from the numbers."""
    summary = json.loads(json.dumps(SUMMARY))
    label = next(k for k, t in summary["targets"].items() if "p_value" in t)
    summary["targets"][label]["k_sample"] = {"before": 0.5, "after": 0.5625, "change": 0.0625,
                                            "ci95": [0.0234, 0.1016], "p_value": 0.00213, "states": 256,
                                            "samples_per_state": 8}
    root = _root(tmp_path, summary=summary)
    cell = "0.500 -> 0.562, +0.062 [+0.023, +0.102], p = 0.0021 (256 x 8)"
    demo_rows = [ln for ln in readme_results.render(root).splitlines() if ln.startswith(f"| {label} |")]
    assert len(demo_rows) == 1 and demo_rows[0].endswith(f" {cell} |")
    assert any(f"| {cell} |" in ln for ln in readme_results.summary(root).splitlines())


def _mem_row(row, preset, estimator, setting, devices, totals, lora_rank=64, quant="none", mb=2, passes=2):
    return {"row": row, "setting": setting, "preset": preset, "estimator": estimator, "devices": devices,
            "settings": {"lora_rank": lora_rank, "base_quant": quant, "micro_batch_size": mb, "groups_per_pass": passes},
            "programs": {k: {"total_gib": v} for k, v in zip(("rollout", "prepare", "update"), totals)},
            "max_total_gib": max(totals), "target_gib": None, "meets_target": None}


def test_qlora_memory_and_smallest_card_tables(tmp_path):
    """memory_qlora.json's rows beside memory.json's bf16-base row of the same name and setting, and the
    smallest card per option: the least-memory setting of each, the first card with total <= 0.95 x its size
    (typed out: 15.1 <= 15.2 fits 16 GB; 15.3 does not; 7.7 <= 7.6 does not, so 12 GB)."""
    res = tmp_path / "bench" / "results"
    res.mkdir(parents=True)
    memory = {"machine": {"cpu_count": 2}, "rows": [
        _mem_row("7b-grpo-lora", "qwen2.5-7b", "grpo", "after-mb1-pass1", 1, (37.4, 31.5, 35.3), mb=1, passes=1),
        _mem_row("7b-grpo", "qwen2.5-7b", "grpo", "before", 1, (90.0, 91.0, 99.0), lora_rank=0),
        _mem_row("7b-grpo-fsdp8", "qwen2.5-7b", "grpo", "after-mb4", 8, (17.8, 14.9, 25.2), lora_rank=0, mb=4, passes=0),
        _mem_row("0.5b-ppo", "qwen2.5-0.5b", "gae", "after-mb2", 1, (7.7, 4.0, 5.0), lora_rank=0, passes=0)]}
    qlora = {"machine": {"cpu_count": 2}, "rows": [
        _mem_row("7b-grpo-qlora", "qwen2.5-7b", "grpo", "after-mb1-pass1", 1, (13.7, 10.6, 15.1), quant="nf4", mb=1, passes=1),
        _mem_row("7b-grpo-qlora", "qwen2.5-7b", "grpo", "after-mb2-pass2", 1, (17.0, 11.6, 17.9), quant="nf4"),
        _mem_row("7b-grpo-qlora-int8", "qwen2.5-7b", "grpo", "after-mb1-pass1", 1, (15.3, 12.0, 14.0), quant="int8",
                 mb=1, passes=1)]}
    (res / "memory.json").write_text(json.dumps(memory))
    (res / "memory_qlora.json").write_text(json.dumps(qlora))
    lines = _lines(readme_results.render(tmp_path))
    assert "| 7b-grpo-qlora | nf4 | after-mb1-pass1 | 1 | 1 | 13.7 | 10.6 | 15.1 | 37.4 / 31.5 / 35.3 | - | - |" in lines
    assert "| 7b-grpo-qlora | nf4 | after-mb2-pass2 | 2 | 2 | 17.0 | 11.6 | 17.9 | - | - | - |" in lines
    assert "| 7b-grpo-qlora-int8 | int8 | after-mb1-pass1 | 1 | 1 | 15.3 | 12.0 | 14.0 | 37.4 / 31.5 / 35.3 | - | - |" in lines
    start = lines.index("| model, estimator | option | devices | setting | rollout / prepare / update GiB | smallest card |")
    assert lines[start + 2:start + 7] == [
        "| 0.5B PPO | full fine-tune (float32 params + AdamW) | 1 | micro-batch 2, 8 of 8 groups per pass "
        "| 7.7 / 4.0 / 5.0 | 12 GB (RTX 3060) |",
        "| 7B GRPO | full fine-tune (float32 params + AdamW) | 8 | micro-batch 4, 8 of 8 groups per pass "
        "| 17.8 / 14.9 / 25.2 | 32 GB (V100-32GB, RTX 5090) each |",
        "| 7B GRPO | LoRA, bf16 base | 1 | micro-batch 1, 1 of 8 groups per pass | 37.4 / 31.5 / 35.3 | 40 GB (A100-40GB) |",
        "| 7B GRPO | LoRA, int8 base | 1 | micro-batch 1, 1 of 8 groups per pass | 15.3 / 12.0 / 14.0 "
        "| 24 GB (RTX 4090, L4, A10) |",
        "| 7B GRPO | LoRA, nf4 base | 1 | micro-batch 1, 1 of 8 groups per pass | 13.7 / 10.6 / 15.1 "
        "| 16 GB (T4, V100-16GB) |"]
    assert lines[start + 7] == ""
