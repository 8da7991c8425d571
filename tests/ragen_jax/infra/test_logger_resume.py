"""A resumed run's logs: metrics.jsonl keeps exactly the rows its checkpoint covers (and drops a line
cut off by a kill), and TensorBoard, read with its purge rule, shows each (tag, step) once."""

from __future__ import annotations

import json

from ragen_jax.infra.logger import Logger, read_metrics
from scripts.fault_trials import tb_events


def _log(wd, steps, keep_through=None, value=1.0):
    log = Logger(wd, enabled=True, keep_through=keep_through)
    for s in steps:
        log.scalars(s, {"a": value * s})
    log.close()


def test_rows_after_the_checkpoint_and_a_cut_line_are_dropped_and_tensorboard_purged(tmp_path):
    _log(tmp_path, range(6))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "a"')  # the kill came mid-line
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(6))  # the cut line is not read
    _log(tmp_path, [4, 5, 6], keep_through=3, value=2.0)  # resumed from checkpoint 3: 4.. logged again
    rows = read_metrics(tmp_path)
    assert [(r["step"], r["a"]) for r in rows] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 8.0), (5, 10.0), (6, 12.0)]
    assert (tmp_path / "metrics.jsonl").read_text().endswith("\n")
    shown = tb_events(tmp_path / "tb")
    assert {k: v for k, v in shown.items()} == {("a", s): [(2.0 if s > 3 else 1.0) * s] for s in range(7)}


def test_a_run_without_checkpoint_starts_its_logs_again_and_none_appends(tmp_path):
    _log(tmp_path, range(3))
    _log(tmp_path, [5], keep_through=None)  # not a resume: append
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 5]
    _log(tmp_path, [0, 1], keep_through=-1)  # killed before its first checkpoint: everything again
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]
    assert sorted(k[1] for k in tb_events(tmp_path / "tb")) == [0, 1]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0]) == {"step": 0, "a": 0.0}
