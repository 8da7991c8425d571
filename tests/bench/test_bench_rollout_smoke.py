"""bench/rollout.py and bench/train_step.py run at a tiny size and return well-formed, JSON-able rows
whose counts agree with what was asked for (and, for the FLOP count, with the model's own parameters)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flax import nnx

from bench import rollout as bench_rollout
from bench import train_step as bench_train


def _positive(row, keys):
    for k in keys:
        assert isinstance(row[k], (int, float)) and math.isfinite(row[k]) and row[k] > 0, (k, row[k])


def _measured(row, keys):
    """Times and the rates made from them are only checked to be reported: a bound on them would be
    a bound on the machine's speed (and a rounded time can be 0 on a fast one)."""
    for k in keys:
        assert isinstance(row[k], (int, float)) and math.isfinite(row[k]) and row[k] >= 0, (k, row[k])


def test_rollout_row_is_well_formed():
    from ragen_jax.text.tokenizer import load_tokenizer

    row = bench_rollout.bench_rollout("tiny", "full", groups=1, group_size=2, turns=1, max_new=4,
                                      tokenizer=load_tokenizer(), repeats=1, host_repeats=1, hbm_gbps=1000.0)
    row = json.loads(json.dumps(row))  # JSON-able
    _measured(row, ("median_s_per_rollout", "generated_tok_s", "conversation_tok_s", "episodes_per_s", "compile_s"))
    # 2 episodes x 1 turn x at most 4 sampled tokens; the conversation also holds the prompt.
    assert 0 < row["generated_tokens"] <= 2 * 1 * 4
    assert row["conversation_tokens"] >= row["generated_tokens"] + 2 * row["prefix_tokens"]
    assert row["mean_turns"] == 1.0 and row["truncated_frac"] == 0.0
    host = row["host"]
    _measured(host, ("median_s_per_rollout", "generated_tok_s", "episodes_per_s"))
    _measured(row, ("ratio_generated_tok_s_ours_over_host",))
    bb = row["bandwidth_bound"]
    assert bb["decode_steps"] == 4 and bb["weight_bytes"] > 0
    np.testing.assert_allclose(bb["bound_s_per_rollout"],
                               4 * (bb["weight_bytes"] + bb["mean_kv_bytes_per_step"]) / 1e12, rtol=1e-9)


def test_bad_shape_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown shape 'huge'"):
        bench_train.bench_train_step("huge", 2, 64, repeats=1, torch_baseline=False)
    assert bench_rollout.main(["--shapes", "huge"]) == 2


def test_train_step_row_is_well_formed():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    row = bench_train.bench_train_step("tiny", 2, 64, repeats=1, torch_baseline=have_torch, peak_tflops=100.0)
    row = json.loads(json.dumps(row))
    _measured(row, ("median_s_per_step", "tok_s", "achieved_tflops", "mfu"))
    assert row["tokens"] == 128 and 0 < row["trained_tokens"] < 128
    if have_torch:
        _measured(row["torch"], ("median_s_per_step", "tok_s"))
        _measured(row, ("ratio_ours_over_torch",))

    # FLOP count: matmul parameters equal the model's own kernels + embedding (tied head counted once;
    # layers are stacked, so count by name, not by rank).
    from ragen_jax.models import Qwen2, Qwen2Config

    model = Qwen2(Qwen2Config.from_preset("tiny"), rngs=nnx.Rngs(0))
    n2d = sum(v[...].size for path, v in nnx.state(model, nnx.Param).flat_state()
              if path[-1] in ("kernel", "embedding"))
    fl = row["flops_per_token"]
    assert fl["matmul_params"] == n2d
    cfg = model.cfg
    attn = cfg.num_hidden_layers * 64 * cfg.num_attention_heads * cfg.head_dim
    assert fl["fwd_bwd"] == 6 * n2d + 12 * attn and fl["step"] == fl["fwd_bwd"] + fl["fwd"]


def test_synthetic_mask_is_realistic():
    traj = bench_train.synthetic_batch(6, 100, 1000, turns=3, seed=1)
    mask, length = np.asarray(traj.loss_mask), np.asarray(traj.length)
    ends = np.asarray(traj.turn_end)
    for r in range(6):
        assert not mask[r, length[r]:].any()  # nothing trained past the end
        assert not mask[r, : length[r] // 5].any()  # the prompt is not trained
        assert mask[r].sum() > 0
        for e in ends[r][ends[r] >= 0]:
            assert mask[r, e] and (e + 1 >= 100 or not mask[r, e + 1])  # a turn ends on its last sampled token


def test_sft_step_bench_quick(tmp_path):
    from bench import sft_step

    out = tmp_path / "sft_step.json"
    # 16 demos in batches of 8 with one timed step, on tiny_cpu.py (2 turns: one length bucket, so each
    # variant compiles one step program, and the huge-pages child finds it in the session's compilation
    # cache) rather than the demo's 5-turn stage (several buckets, a compile each, steps ~2x longer): the
    # test checks the rows' structure, which the config's size does not change (the steps of 32-row
    # batches cost ~1.5 s each at the suite's XLA optimisation level 0).
    assert sft_step.main(["--config", "tiny_cpu.py", "--demos", "16", "--steps", "1", "--out", str(out),
                          "sft.batch_size=8"]) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    from ragen_jax.runtime import hugepage_env

    # The huge-pages row only where it applies (THP "madvise", glibc >= 2.35), from a child process.
    huge = ["+prompt groups, huge pages"] if hugepage_env({}) is not None else []
    assert list(rows) == ["plain", "shared_prefix", "prefix+buckets", "+head at targets", "+prompt groups", *huge]
    for name in huge:
        assert "glibc.malloc.hugetlb=1" in rows[name]["glibc_tunables"]
        assert rows[name]["widths"] == rows["+prompt groups"]["widths"]
    # Sokoban's rooms differ per demo: no prompt is shared, so the trainer keeps the per-row forward.
    assert all(r["prompt_groups"] == 0 for r in rows.values())
    for r in rows.values():
        _measured(r, ("median_s_per_step", "demo_tok_s", "speedup_vs_plain"))
        _positive(r, ("mean_demo_tokens",))
        assert sum(r["widths"].values()) == r["demos"] and r["compilations"] == len(r["widths"])
        assert r["batch_size"] == 8  # the command line's override reached every variant, the child's too
    assert rows["plain"]["speedup_vs_plain"] == 1.0 and rows["plain"]["shared_prefix_tokens"] == 0
    # Same demos in every variant; the prefix is Sokoban's system prompt + instructions.
    assert len({r["demos"] for r in rows.values()}) == 1
    assert rows["shared_prefix"]["shared_prefix_tokens"] == rows["prefix+buckets"]["shared_prefix_tokens"] > 100
    assert list(rows["plain"]["widths"]) == [str(rows["plain"]["padded_length"])]  # JSON keys are strings


def test_rollout_variants_are_timed_side_by_side():
    """`--variants scan,bf16`: each variant is timed in the same run; the float32 scan (the decode path
    before issue 14) samples exactly the current program's tokens with the same key and weights."""
    from ragen_jax.text.tokenizer import load_tokenizer

    row = bench_rollout.bench_rollout("tiny", "task", groups=1, group_size=2, turns=2, max_new=6,
                                      tokenizer=load_tokenizer(), repeats=2, host=False, variants=("scan", "bf16"))
    row = json.loads(json.dumps(row))
    for v in ("scan", "bf16"):
        _measured(row[f"variant_{v}"], ("median_s_per_rollout", "generated_tok_s"))
        _measured(row, (f"ratio_{v}_over_current",))
        assert len(row[f"variant_{v}"]["s_per_rollout"]) == 2
    assert row["variant_scan"]["same_tokens_as_current_frac"] == 1.0
    assert 0.0 <= row["variant_bf16"]["same_tokens_as_current_frac"] <= 1.0


def test_collapse_probe_bench_rows(tmp_path):
    from bench import collapse_probe

    out = tmp_path / "probe.json"
    assert collapse_probe.main(["--config", "demo_cpu_bandit.py", "--out", str(out), "--tag", "t"]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["tag"] == "t" and (row["pairs"], row["prompts"]) == (64, 8)
    _measured(row, ("before_s", "after_s", "ratio"))
    # The two sides computed the same numbers (the bench returns 1 otherwise).
    assert row["metrics_before"].keys() == row["metrics_after"].keys() and row["metrics_after"]
