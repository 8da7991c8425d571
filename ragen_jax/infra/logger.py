"""TensorBoard scalars and texts, JSON-lines metrics and PNG curves of a run."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jax

from ragen_jax.infra.distributed import is_remote, run_path


class Logger:
    """Writes only on process 0 (multi-host runs call it on every host, with the same metrics).

    `keep_through`: the step of the checkpoint the run continues from (-1: a run with no checkpoint,
    which starts again from the beginning; None: keep every row, append). A run killed after its last
    checkpoint logged steps that the resumed run logs again: metrics.jsonl keeps only its rows with step <= `keep_through` (and
    drops a line cut off by the kill; rewritten through a temporary file, so a kill meanwhile leaves
    the old or the new file), and TensorBoard is told to purge the events from `keep_through + 1` on
    (`purge_step`: TensorBoard hides the earlier files' events from that step on). Every line is
    then logged exactly once, however often the run was killed, provided the trainer calls `flush()`
    before each checkpoint (TensorBoard buffers its events; metrics.jsonl is flushed line by line).

    `workdir` may be a bucket URL (`gs://...`; TensorBoard writes there itself): a bucket object
    cannot be appended to, so metrics.jsonl is then rewritten whole at each step (it is small)."""

    def __init__(self, workdir, enabled: bool | None = None, keep_through: int | None = None):
        self.workdir = run_path(workdir)
        self.enabled = (jax.process_index() == 0) if enabled is None else enabled
        self._tb = None
        self._jsonl = None
        self._remote_rows = None
        if self.enabled:
            from tensorboardX import SummaryWriter

            path = self.workdir / "metrics.jsonl"
            kept = None if keep_through is None else _kept_rows(path, keep_through)
            tb = self.workdir / "tb"
            earlier = tb.exists() and any(p.name.startswith("events.out.tfevents") for p in tb.iterdir())
            purge = keep_through + 1 if earlier and keep_through is not None else None
            # The suffix: two writers within one second would otherwise share (and truncate) one file
            # name; nanoseconds keep the files in the order they were written, as TensorBoard reads them.
            self._tb = SummaryWriter(str(tb), purge_step=purge, filename_suffix=f".{time.time_ns()}")
            if is_remote(self.workdir):
                self._remote_rows = kept if kept is not None else (path.read_text() if path.exists() else "")
                if kept is not None:
                    path.write_text(kept)
            else:
                if kept is not None:
                    tmp = path.with_name(path.name + ".tmp")
                    tmp.write_text(kept)
                    tmp.replace(path)
                self._jsonl = open(path, "a", encoding="utf-8")

    def scalars(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        for k, v in clean.items():
            self._tb.add_scalar(k, v, step)
        line = json.dumps({"step": step, **clean}) + "\n"
        if self._jsonl is None:
            self._remote_rows += line
            (self.workdir / "metrics.jsonl").write_text(self._remote_rows)
            return
        self._jsonl.write(line)
        self._jsonl.flush()

    def text(self, step: int, tag: str, text: str) -> None:
        if self.enabled:
            # TensorBoard renders markdown: a code block keeps the grid and the chat layout intact.
            self._tb.add_text(tag, "```\n" + text + "\n```", step)

    def flush(self) -> None:
        if self.enabled:
            self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._tb.close()
            if self._jsonl is not None:
                self._jsonl.close()


def _kept_rows(path, keep_through: int) -> str | None:
    """metrics.jsonl's text with only the complete rows of steps <= `keep_through` (None when nothing
    needs to go: no file, or every row kept)."""
    if not path.exists():
        return None
    text = path.read_text()
    kept = []
    for line in text.splitlines(keepends=True):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut off by a kill
        if line.endswith("\n") and row.get("step", 0) <= keep_through:
            kept.append(line)
    out = "".join(kept)
    return None if out == text else out


def read_metrics(workdir) -> list[dict]:
    """The rows of metrics.jsonl (a last line cut off by a kill is left out)."""
    path = run_path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


# TensorBoard's default smoothing weight (`smooth_ema`; plot_curves draws it when asked with `smoothing=`).
CURVE_SMOOTHING = 0.6


def smooth_ema(values, weight: float = CURVE_SMOOTHING) -> list[float]:
    """TensorBoard's debiased exponential moving average of a series.

    Causal (the trend at iteration t uses only iterations <= t, as a reader watching the run live saw
    it); the PNGs draw a centred window instead (`smooth_window`). The debiasing (divide by
    1 - weight^n) keeps the first points at the data's level instead of pulled towards 0. Non-finite values pass through and are not averaged in."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out, last, n = [], 0.0, 0
    for v in values:
        v = float(v)
        if not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1.0 - weight) * v
        n += 1
        out.append(last / (1.0 - weight**n))
    return out


def _eval_panel(keys: list[str], eval_key: str | None) -> str | None:
    """The plotted key whose panel carries the evaluation lines (None: a panel of their own)."""
    if eval_key is not None:
        return eval_key
    return next((k for k in keys if "success" in k), None)


def smooth_window(values, window: int) -> list[float]:
    """Centred moving mean: point t is the mean of the finite values at t - h .. t + h (h = window // 2;
    fewer at the ends, where the window is cut, not padded). Non-finite values pass through.

    Centred rather than causal (TensorBoard's EMA): a figure read after the run should show the
    trend where it happens, and a window of several iterations averages out the sampling noise of
    one iteration's few groups, which an EMA of weight 0.6 (about 4 iterations) does not."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"smoothing window must be a whole number of iterations >= 1, got {window!r}")
    vals = [float(v) for v in values]
    h = window // 2
    out = []
    for t, v in enumerate(vals):
        if not math.isfinite(v):
            out.append(v)
            continue
        near = [x for x in vals[max(0, t - h): t + h + 1] if math.isfinite(x)]
        out.append(sum(near) / len(near))
    return out


def default_window(n: int) -> int:
    """A window of about a tenth of the run (odd, at least 1): 21 iterations for a run of 210."""
    w = max(1, round(n / 10))
    return w if w % 2 else w + 1


def _draw_series(ax, pts, key: str, smoothing: float | None, window: int | None) -> None:
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    ax.plot(xs, ys, color="C0", alpha=0.3, lw=0.8, marker="o", ms=2, label="each iteration")
    if smoothing is not None:
        ax.plot(xs, smooth_ema(ys, smoothing), color="C0", lw=1.8, label=f"EMA {smoothing:g}")
    else:
        w = window or default_window(len(ys))
        if w > 1:
            ax.plot(xs, smooth_window(ys, w), color="C0", lw=1.8, label=f"mean of {w} iterations (centred)")
    ax.set_title(key, fontsize=10)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)


def _draw_evals(ax, evals: dict) -> None:
    """A number: a dashed horizontal line. A dict {"value", "ci": (lo, hi), "step"}: a point at that
    iteration with its interval as an error bar (the evaluation before RL at 0, after it at the end).
    The panel's legend names these alone (the series' entries are on the first panel)."""
    handles = []
    for i, (label, e) in enumerate(evals.items()):
        color = f"C{i + 1}"
        if not isinstance(e, dict):
            handles.append(ax.axhline(float(e), color=color, ls="--", lw=1.2, label=f"{label}: {float(e):.3f}"))
            continue
        v, ci = float(e["value"]), e.get("ci")
        text = f"{label}: {v:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        yerr = None if not ci else [[v - float(ci[0])], [float(ci[1]) - v]]
        handles.append(ax.errorbar([e.get("step", 0)], [v], yerr=yerr, fmt="s", color=color, ms=6, capsize=5, lw=1.6,
                                   label=text, zorder=5))
    ax.legend(handles=handles, fontsize=6.5, loc="best", framealpha=0.6)


def plot_curves(workdir: str | Path, keys: tuple[str, ...], out: str | Path | None = None, *,
                evals: dict | None = None, eval_key: str | None = None, smoothing: float | None = None,
                window: int | None = None, title: str | None = None) -> Path | None:
    """PNG of the given metrics against iteration (one panel each), from metrics.jsonl.

    Each panel draws every iteration's value faint and a centred mean over `window` iterations
    (`smooth_window`; default about a tenth of the run, `default_window`) over them; `smoothing`
    (a weight in [0, 1)) draws TensorBoard's EMA instead. `evals` (label -> value, or label ->
    {"value", "ci": (lo, hi), "step"}) are drawn on the panel of `eval_key` (default: the first
    plotted key naming "success"; without one, on a panel of their own): a value as a dashed line,
    a dict as a point at its iteration with its interval. `title`: a line above the panels."""
    if smoothing is not None and not 0.0 <= smoothing < 1.0:
        raise ValueError(f"plot_curves: smoothing must be in [0, 1), got {smoothing}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"plot_curves: window must be a whole number of iterations >= 1, got {window!r}")
    if eval_key is not None and eval_key not in keys:
        raise ValueError(f"plot_curves: eval_key {eval_key!r} is not one of the plotted keys {list(keys)}")
    rows = read_metrics(workdir)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if any(k in r for r in rows)]
    if not keys:
        return None
    target = _eval_panel(keys, eval_key) if evals else None
    own_panel = bool(evals) and target not in keys
    n_panels = len(keys) + own_panel
    cols = min(3, n_panels)
    nrows = math.ceil(n_panels / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    for ax, k in zip(axes.flat, keys):
        _draw_series(ax, [(r["step"], r[k]) for r in rows if k in r], k, smoothing, window)
        if k == target:
            _draw_evals(ax, evals)
        elif k == keys[0]:
            ax.legend(fontsize=7, loc="best")
    if own_panel:
        ax = list(axes.flat)[len(keys)]
        steps = [r["step"] for r in rows] + [e["step"] for e in evals.values() if isinstance(e, dict) and "step" in e]
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        ax.set_title("evaluation", fontsize=10)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        _draw_evals(ax, evals)
    for ax in list(axes.flat)[n_panels:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = Path(out) if out is not None else Path(workdir) / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
