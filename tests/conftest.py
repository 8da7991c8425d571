"""Test session setup. Runs before jax is imported anywhere in the test process."""

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

# 8 simulated CPU devices for the sharding tests; must be set before jax is imported.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
# The suite's time is mostly XLA:CPU compiling tiny programs, and LLVM's optimisation passes are most of
# that: at level 0 a tiny trainer's build + first iteration costs ~30% less CPU (docs/experiments/testing.md). HLO
# passes (fusion, layout, the collectives) still run, so the programs the tests compare are the same
# graphs; only their machine code is less optimised. Inherited by the multi-host test's subprocesses.
# RAGEN_JAX_TEST_XLA_OPT=1 keeps XLA's defaults (to check a test against fully optimised code).
# XLA:CPU's newer MLIR fusion emitters cost more to compile than the classic elemental emitters: off,
# a tiny trainer's build + 3 iterations took 28.0 instead of 43.1 CPU s (docs/experiments/testing.md). The fusion
# decisions (HLO passes) are the same; only how each fusion becomes machine code differs.
if os.environ.get("RAGEN_JAX_TEST_XLA_OPT") != "1":
    if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
    if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Nothing may be downloaded at test time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# Identical programs compiled by different tests (and by both pytest-xdist workers) are compiled
# once: jax's persistent compilation cache works on CPU too. The directory is new for every test
# session and removed at its end (the xdist workers inherit the controller's): with jax 0.10.2 an
# 8-device sharded rollout read back from the cache of an EARLIER session deadlocks in XLA:CPU's
# collectives (half the devices wait at an all-gather, half at a collective-permute;
# test_rollout.py::test_passes_equal_one_pass_rollouts_of_their_groups hung on every second run),
# while the same program compiled afresh runs. Set JAX_COMPILATION_CACHE_DIR to choose a directory.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix="ragen-jax-test-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


# The two pytest-xdist workers (pytest.ini: `-n 2 --dist loadgroup`) are handed single tests, so that a
# slow file spreads over both, except that tests sharing a module- or class-scoped fixture stay
# together as one unit on one worker: split, each worker would build the fixture (a trainer run, a
# compiled rollout) again, and a worker running another file's test in between would tear it down and
# build it a third time. xdist's own xdist_group marks cannot carry this with pytest 9 (xdist 3.8
# rewrites `item._nodeid`, which pytest 9 no longer reads), so each worker writes the groups it found
# at collection into a file of this session, and the controller's scheduler reads them.
_GROUPS_DIR = "RAGEN_JAX_TEST_GROUPS_DIR"
if "PYTEST_XDIST_WORKER" not in os.environ and _GROUPS_DIR not in os.environ:
    os.environ[_GROUPS_DIR] = tempfile.mkdtemp(prefix="ragen-jax-test-groups-")
    atexit.register(shutil.rmtree, os.environ[_GROUPS_DIR], True)


def _group_of(item) -> str | None:
    """The unit `item` must run in: its xdist_group mark, or its file where it uses a fixture wider
    than one test (pytest has no public accessor for an item's fixture definitions)."""
    for mark in item.iter_markers("xdist_group"):
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    info = getattr(item, "_fixtureinfo", None)
    scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs} if info else set()
    return item.nodeid.split("::")[0] if scopes & {"module", "class", "package"} else None


def pytest_collection_modifyitems(items):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    groups = {item.nodeid: g for item in items if (g := _group_of(item)) is not None}
    out = Path(os.environ[_GROUPS_DIR]) / f"{worker}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(out)  # the controller never reads a half-written file


def pytest_configure(config):
    # Registered only where pytest-xdist is loaded: pytest rejects a conftest with an unknown hook.
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(GroupScheduler(), "ragen-jax-group-scheduler")


class GroupScheduler:
    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") != "loadgroup":
            return None
        return make_group_scheduling(config, log)


DURATIONS = Path(__file__).with_name("durations.json")


def _expected_durations() -> dict[str, float]:
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def pytest_runtest_logreport(report):
    """With RAGEN_JAX_TEST_DURATIONS_OUT=path, the controller writes each test's seconds (setup + call +
    teardown) there at the end: `tests/durations.json` is refreshed that way from a whole-suite run."""
    if os.environ.get("RAGEN_JAX_TEST_DURATIONS_OUT") and "PYTEST_XDIST_WORKER" not in os.environ:
        _SEEN[report.nodeid] = _SEEN.get(report.nodeid, 0.0) + report.duration


_SEEN: dict[str, float] = {}
_PEAK = {"kb": 0}


def pytest_runtest_teardown(item):
    """With RAGEN_JAX_TEST_PEAK_RSS_OUT=path, each test process appends one JSON line per test: its
    high-water RSS after the test, and whether this test raised it (then the peak is the test's own,
    its fixtures included). The largest `raised` line names the test that needs the most memory."""
    out = os.environ.get("RAGEN_JAX_TEST_PEAK_RSS_OUT")
    if not out:
        return
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    raised, _PEAK["kb"] = kb > _PEAK["kb"], max(kb, _PEAK["kb"])
    with open(out, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "peak_mb": round(kb / 1024), "raised": raised}) + "\n")


def pytest_sessionfinish(session):
    out = os.environ.get("RAGEN_JAX_TEST_DURATIONS_OUT")
    if out and _SEEN and "PYTEST_XDIST_WORKER" not in os.environ:
        Path(out).write_text(json.dumps({k: round(v, 1) for k, v in sorted(_SEEN.items())}, indent=0) + "\n")


def make_group_scheduling(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FixtureGroupScheduling(LoadScopeScheduling):
        """Units of work: single tests, or the groups the workers wrote (read once, when the workers
        have all collected: xdist calls `_split_scope` only from then on)."""

        groups: dict | None = None
        expected: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = {}
                for f in sorted(Path(os.environ[_GROUPS_DIR]).glob("*.json")):
                    self.groups.update(json.loads(f.read_text()))
            return self.groups.get(nodeid, nodeid)

        def remove_node(self, node) -> str | None:
            """xdist's, except that the test running when the worker died (killed for memory, or by
            pytest-timeout for hanging) is reported failed and NOT queued again: xdist would run it a
            second time on the replacement worker, which would crash or hang the same way."""
            workload = self.assigned_work.pop(node)
            crashed = next((nid for unit in workload.values() for nid, done in unit.items() if not done), None)
            if crashed is None:
                return None
            workload[self._split_scope(crashed)][crashed] = True
            self.workqueue.update({s: u for s, u in workload.items() if not all(u.values())})
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

        def _assign_work_unit(self, node) -> None:
            """xdist's, taking the unit expected to take longest first (tests/durations.json, from an
            earlier run; 1 s for a test it does not list): a long unit started last would leave one
            worker alone with it at the end while the other idles."""
            if self.expected is None:
                self.expected = _expected_durations()
            scope = max(self.workqueue, key=lambda u: sum(self.expected.get(n, 1.0) for n in self.workqueue[u]))
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            """xdist's, with one queued test per worker instead of up to three: the queue only hides
            the round trip, and near the end a longer one strands slow tests behind a busy worker
            while the other idles (units are never taken back)."""
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return FixtureGroupScheduling(config, log)
