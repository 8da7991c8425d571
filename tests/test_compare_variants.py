"""scripts/compare_variants.py: variants that keep their per-state outcomes are compared without a
model (truth: flips counted by hand, the exact McNemar p of 7 gained / 1 lost computed from the
binomial: 2 P[Bin(8, 1/2) <= 1]), and bad input gets one sentence before anything is built."""

from __future__ import annotations

import json
from math import comb

import pytest

from scripts import compare_variants


def _variant(root, name, states, success=None):
    d = root / name
    d.mkdir()
    point = {"iteration": 5, "temperature": 0.5, "success": sum(states) / len(states) if success is None else success,
             "rl_train_s": 12.0, "state_success": states}
    (d / "result.json").write_text(json.dumps({"overrides": [name], "points_by_temperature": [point]}))
    return str(d)


def test_recorded_outcomes_are_compared_state_by_state(tmp_path, capsys):
    base = [1.0] * 3 + [0.0] * 9 + [1.0]   # states 0-2 and 12 solved
    other = [1.0] * 10 + [0.0] * 3         # states 0-9: 3-9 gained (7), 12 lost (1)
    a = _variant(tmp_path, "a", base)
    b = _variant(tmp_path, "b", other)
    assert compare_variants.main(["--family", "sokoban", "--sft", str(tmp_path), a, b]) == 0
    out = json.loads((tmp_path / "compare_sokoban.json").read_text())
    vs = out["rows"][1]["vs_baseline"]
    assert (vs["gained"], vs["lost"]) == (7, 1)
    want_p = min(1.0, 2 * sum(comb(8, k) for k in range(0, 2)) / 2 ** 8)
    assert vs["p_value"] == pytest.approx(want_p)
    assert out["rows"][0]["vs_baseline"]["gained"] == out["rows"][0]["vs_baseline"]["lost"] == 0
    assert "7 gained / 1 lost" in capsys.readouterr().out


def test_one_variant_or_an_unfinished_one_is_refused(tmp_path, capsys):
    a = _variant(tmp_path, "a", [1.0, 0.0])
    with pytest.raises(SystemExit):
        compare_variants.main(["--family", "sokoban", "--sft", str(tmp_path), a])
    assert "at least two variant directories" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        compare_variants.main(["--family", "sokoban", "--sft", str(tmp_path), a, str(tmp_path / "empty")])
    assert "holds no finished rl_variant run" in capsys.readouterr().err


def test_k_rollouts_per_state_compare_rates_and_mixed_protocols_are_refused(tmp_path, capsys):
    from ragen_jax.evaluation.paired import paired_rates

    def variant(name, states, k):
        d = tmp_path / name
        d.mkdir()
        point = {"iteration": 5, "temperature": 0.5, "success": sum(states) / len(states), "rl_train_s": 1.0,
                 "state_success": states}
        (d / "result.json").write_text(json.dumps({"overrides": [], "eval_samples": k,
                                                   "points_by_temperature": [point]}))
        return str(d)

    a = variant("a", [0.25, 0.5, 0.0, 1.0], 4)
    b = variant("b", [0.75, 0.5, 0.25, 1.0], 4)
    assert compare_variants.main(["--family", "sokoban", "--sft", str(tmp_path), a, b]) == 0
    out = json.loads((tmp_path / "compare_sokoban.json").read_text())
    assert out["samples_per_state"] == 4
    assert out["rows"][1]["vs_baseline"] == json.loads(json.dumps(paired_rates([0.25, 0.5, 0.0, 1.0],
                                                                               [0.75, 0.5, 0.25, 1.0], 4)))
    assert out["rows"][1]["vs_baseline"]["p_value"] == 0.5  # sign flips of 2 and 1 rollouts: |S| >= 3 in 2 of 4
    c = variant("c", [1.0, 0.0, 0.0, 1.0], 1)
    with pytest.raises(SystemExit, match="compare variants evaluated the same way"):
        compare_variants.main(["--family", "sokoban", "--sft", str(tmp_path), a, c])
