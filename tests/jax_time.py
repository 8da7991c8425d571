"""Where the suite's time goes, per test: `python -m pytest -q -p tests.jax_time` writes one JSON row
per test to $RAGEN_JAX_TEST_PROFILE_DIR/<worker>.jsonl (default: test-profile/): the worker's CPU
seconds (user + system, its finished children included, so subprocess launches count) and jax's own
timers for tracing, lowering to MLIR and XLA's backend compile (jax.monitoring events), plus
persistent-cache hits. A module fixture's setup is charged to the first test that uses it.

Summarise with `python -m tests.jax_time [dir]`: the files by CPU seconds with their compile split.
docs/experiments/testing.md says what it showed.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import resource
import sys

import pytest

OUT = os.environ.get("RAGEN_JAX_TEST_PROFILE_DIR", "test-profile")
EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
          "/jax/core/compile/backend_compile_duration": "compile_s",
          "/jax/compilation_cache/compile_time_saved_sec": "cache_saved_s"}
_seconds: collections.Counter = collections.Counter()
_listening = False


def _record(event: str, duration: float, **_) -> None:
    if event in EVENTS:
        _seconds[EVENTS[event]] += duration


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _listening
    if not _listening:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_record)
        _listening = True
    _seconds.clear()
    start = _cpu()
    yield
    row = {"id": item.nodeid, "cpu_s": round(_cpu() - start, 3), **{k: round(v, 3) for k, v in _seconds.items()}}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def summary(directory: str = OUT, top: int = 30) -> str:
    rows = [json.loads(line) for path in glob.glob(os.path.join(directory, "*.jsonl")) for line in open(path)]
    files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    total: collections.Counter = collections.Counter()
    for r in rows:
        for k in ("cpu_s", *EVENTS.values()):
            files[r["id"].split("::")[0]][k] += r.get(k, 0.0)
            total[k] += r.get(k, 0.0)
    lines = [f"{len(rows)} tests: " + ", ".join(f"{k} {v:.0f}" for k, v in total.items()),
             f"{'cpu_s':>8} {'trace_s':>8} {'lower_s':>8} {'compile_s':>9}  file"]
    for name, c in sorted(files.items(), key=lambda kv: -kv[1]["cpu_s"])[:top]:
        lines.append(f"{c['cpu_s']:8.1f} {c['trace_s']:8.1f} {c['lower_s']:8.1f} {c['compile_s']:9.1f}  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(*sys.argv[1:2]))
