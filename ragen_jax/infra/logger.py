"""TensorBoard scalars and texts, JSON-lines metrics and PNG curves of a run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax

from ragen_jax.infra.distributed import is_remote, run_path


class Logger:
    """Writes only on process 0 (multi-host runs call it on every host, with the same metrics).

    `workdir` may be a bucket URL (`gs://...`; TensorBoard writes there itself): a bucket object
    cannot be appended to, so metrics.jsonl is then rewritten whole at each step (it is small)."""

    def __init__(self, workdir, enabled: bool | None = None):
        self.workdir = run_path(workdir)
        self.enabled = (jax.process_index() == 0) if enabled is None else enabled
        self._tb = None
        self._jsonl = None
        self._remote_rows = None
        if self.enabled:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.workdir / "tb"))
            path = self.workdir / "metrics.jsonl"
            if is_remote(self.workdir):
                self._remote_rows = path.read_text() if path.exists() else ""
            else:
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


def read_metrics(workdir) -> list[dict]:
    path = run_path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(workdir: str | Path, keys: tuple[str, ...], out: str | Path | None = None) -> Path | None:
    """PNG of the given metrics against iteration (one panel each), from metrics.jsonl."""
    rows = read_metrics(workdir)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if any(k in r for r in rows)]
    if not keys:
        return None
    cols = min(3, len(keys))
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    for ax, k in zip(axes.flat, keys):
        pts = [(r["step"], r[k]) for r in rows if k in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
        ax.set_title(k, fontsize=10)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out) if out is not None else Path(workdir) / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
