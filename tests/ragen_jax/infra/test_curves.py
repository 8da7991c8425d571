"""The demo's curves (infra/logger.py): the EMA and the centred window against hand-computed values,
and the PNG's panels.

Truth for `smooth_ema`: TensorBoard's debiased EMA worked by hand (weight 0.5 on [1, 0, 1, nan, 3]:
0.5/0.5, 0.25/0.75, 0.625/0.875, nan passed through, 1.8125/0.9375). For `smooth_window` (window 3 on
[0, 3, 6, nan, 12, 3]): (0+3)/2, (0+3+6)/3, (3+6)/2, nan, (12+3)/2, (12+3)/2 - the window is cut at
the ends and around a missing value, never padded. For the plot: the PNG's own
header (signature, and its width, which counts the panels: 4.2 in x 110 dpi each)."""

from __future__ import annotations

import json
import math
import struct

import pytest

from ragen_jax.infra.logger import default_window, plot_curves, smooth_ema, smooth_window

PANEL_PX = round(4.2 * 110)


def test_ema_equals_hand_computed_golden_series():
    got = smooth_ema([1.0, 0.0, 1.0, float("nan"), 3.0], weight=0.5)
    want = [1.0, 1 / 3, 5 / 7, float("nan"), 29 / 15]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w, rel=1e-12)
    assert smooth_ema([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])  # debiased: no pull towards 0
    assert smooth_ema([3.0, -1.0, 4.0], weight=0.0) == [3.0, -1.0, 4.0]
    with pytest.raises(ValueError, match=r"smoothing weight must be in \[0, 1\), got 1.0"):
        smooth_ema([1.0], weight=1.0)


def test_centred_window_equals_hand_computed_series():
    got = smooth_window([0.0, 3.0, 6.0, float("nan"), 12.0, 3.0], 3)
    want = [1.5, 3.0, 4.5, float("nan"), 7.5, 7.5]
    for g, w in zip(got, want):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w, rel=1e-12)
    assert smooth_window([1.0, 5.0], 1) == [1.0, 5.0]
    assert smooth_window([2.0, 4.0, 6.0, 8.0], 4) == smooth_window([2.0, 4.0, 6.0, 8.0], 5)  # h = window // 2
    assert (default_window(210), default_window(12), default_window(3)) == (21, 1, 1)
    with pytest.raises(ValueError, match="whole number of iterations >= 1, got 0"):
        smooth_window([1.0], 0)


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    rows = [{"step": i, "train/success": (i % 3) / 3, "actor/entropy": 2.0 - 0.1 * i} for i in range(12)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_plot_writes_png_with_eval_lines_on_the_success_panel_or_their_own(run_dir):
    old = plot_curves(run_dir, ("actor/entropy",), run_dir / "old.png")  # the old call signature
    assert old == run_dir / "old.png" and _png_size(old)[0] == PANEL_PX
    evals = {"eval success": 0.42}
    on_success = plot_curves(run_dir, ("train/success", "actor/entropy"), run_dir / "a.png", evals=evals)
    assert _png_size(on_success)[0] == 2 * PANEL_PX  # drawn on train/success: no extra panel
    own = plot_curves(run_dir, ("actor/entropy",), run_dir / "b.png", evals=evals)
    assert _png_size(own)[0] == 2 * PANEL_PX  # no success panel: the evaluation gets its own
    chosen = plot_curves(run_dir, ("actor/entropy",), run_dir / "c.png", evals=evals, eval_key="actor/entropy")
    assert _png_size(chosen)[0] == PANEL_PX
    with pytest.raises(ValueError, match="eval_key 'nope' is not one of the plotted keys"):
        plot_curves(run_dir, ("actor/entropy",), run_dir / "d.png", evals=evals, eval_key="nope")
    assert not (run_dir / "d.png").exists()
    assert plot_curves(run_dir, ("missing/key",), run_dir / "e.png") is None
    # Both stages' evaluations as points with intervals, the EMA on request, a title line.
    points = {"warm start": {"value": 0.4, "ci": [0.3, 0.5], "step": 0},
              "after RL": {"value": 0.6, "ci": [0.5, 0.7], "step": 11}}
    both = plot_curves(run_dir, ("train/success",), run_dir / "f.png", evals=points, window=5, title="gain")
    assert _png_size(both)[0] == PANEL_PX
    assert _png_size(plot_curves(run_dir, ("actor/entropy",), run_dir / "g.png", evals=points, smoothing=0.6))[0] == \
        2 * PANEL_PX
    with pytest.raises(ValueError, match="window must be a whole number"):
        plot_curves(run_dir, ("actor/entropy",), run_dir / "h.png", window=0)
