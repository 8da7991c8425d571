"""launch/demo.py --jobs: families side by side, each in its own process (ragen_jax/recipes/demo.py
`run_families_side_by_side`), with a stand-in family process instead of training.

The stand-in writes the family's stages from the committed docs/demo_results/eval.json (the truth the
merged eval.json is compared with) and logs when it starts, ends and is signalled, so the tests check:
the merge (eval.json equals the published results, every stage's timings kept), the schedule (Sokoban
first, never more than --jobs at once, the next family only when one ends), the family command line
(seed, overrides, one job, progress bars only for the first), a failing family stopping the others
(exit status passed on), and SIGTERM to the demo reaching the running families (exit 75, nothing
written). That a family's numbers do not depend on --jobs is measured, not tested (docs/demo.md,
"Families side by side": a quick run both ways).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from ragen_jax.infra.preemption import PREEMPTED_EXIT
from ragen_jax.recipes import demo

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = json.loads((ROOT / "docs" / "demo_results" / "eval.json").read_text())

STAND_IN = textwrap.dedent('''
    import json, os, signal, sys, time
    argv = sys.argv[1:]
    family, workdir = argv[argv.index("--family-worker") + 1], argv[argv.index("--workdir") + 1]
    plan = json.loads(os.environ["STAND_IN_PLAN"]).get(family, {})
    log = os.environ["STAND_IN_LOG"]

    def note(*what):
        with open(log, "a") as f:
            f.write(json.dumps([family, *what, time.time()]) + "\\n")

    def on_term(signum, frame):
        note("term")
        sys.exit(75)

    if not plan.get("no_handler"):  # else SIGTERM ends it by default, as a family still importing jax
        signal.signal(signal.SIGTERM, on_term)
    note("start", argv)
    if plan.get("kill_demo"):  # once every other started family can take the signal
        while sum('"start"' in line for line in open(log)) < plan["kill_demo"]:
            time.sleep(0.05)
        os.kill(os.getppid(), signal.SIGTERM)
    deadline = time.time() + plan.get("sleep", 0.3)
    while time.time() < deadline:
        time.sleep(0.05)
    if plan.get("code", 0):
        note("end")
        sys.exit(plan["code"])
    published = json.load(open(os.environ["STAND_IN_EVAL"]))
    stages = [s for s in published["results"] if s.startswith(family + "/")]
    part = {"results": {s: published["results"][s] for s in stages},
            "results_k": {s: published["k_sample"][s] for s in stages},
            "timings": {s: {"train_s": 1.0, "train_cpu_s": 0.5, "eval_s": 2.0, "eval_cpu_s": 1.0} for s in stages},
            "curves": []}
    os.makedirs(os.path.join(workdir, family), exist_ok=True)
    with open(os.path.join(workdir, family, "demo_part.json"), "w") as f:
        json.dump(part, f)
    note("end")
''')


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    log = tmp_path / "events.jsonl"
    monkeypatch.setattr(demo, "WORKER_COMMAND", (sys.executable, str(script)))
    monkeypatch.setenv("STAND_IN_LOG", str(log))
    monkeypatch.setenv("STAND_IN_EVAL", str(ROOT / "docs" / "demo_results" / "eval.json"))

    def run(plan: dict, *argv):
        monkeypatch.setenv("STAND_IN_PLAN", json.dumps(plan))
        rc = demo.main(["--workdir", str(tmp_path / "demo"), *argv])
        events = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return rc, events, tmp_path / "demo"

    return run


def _running_at_most(events, n: int) -> bool:
    live, most = 0, 0
    for e in sorted(events, key=lambda e: e[-1]):
        if e[1] == "start":
            live += 1
        elif e[1] in ("end", "term"):
            live -= 1
        most = max(most, live)
    return most <= n


def test_families_side_by_side_merge_into_one_report(stand_in, capsys):
    rc, events, work = stand_in({"sokoban": {"sleep": 1.5}}, "--seed", "3", "--sokoban.train.iterations=7")
    assert rc == 0, capsys.readouterr().err
    starts = [e for e in events if e[1] == "start"]
    # Sokoban (the long family) and Bandit at once, FrozenLake only once Bandit has ended (which of the
    # first two processes logs its start first is up to the OS).
    assert {e[0] for e in starts[:2]} == {"sokoban", "bandit"} and starts[2][0] == "frozen_lake"
    bandit_end = next(e[-1] for e in events if e[:2] == ["bandit", "end"])
    assert starts[2][-1] >= bandit_end and _running_at_most(events, demo.DEFAULT_JOBS)
    argv = {e[0]: e[2] for e in starts}
    for family, a in argv.items():
        assert a[a.index("--seed") + 1] == "3" and a[a.index("--jobs") + 1] == "1"
        assert a[a.index("--workdir") + 1] == str(work.resolve())
        assert ("--quiet" in a) == (family != "sokoban")  # one family draws progress bars
    assert "--sokoban.train.iterations=7" in argv["sokoban"]
    assert not any("iterations=7" in x for f in ("bandit", "frozen_lake") for x in argv[f])
    # The report: the published stages, in the families' order, from the parts.
    doc = json.loads((work / "eval.json").read_text())
    assert doc["results"] == PUBLISHED["results"] and doc["k_sample"] == PUBLISHED["k_sample"]
    assert list(doc["results"]) == list(PUBLISHED["results"])
    summary = json.loads((work / "demo_summary.json").read_text())
    assert summary["jobs"] == 2 and set(summary["stages"]) == set(PUBLISHED["results"])
    assert all(t["total_s"] == 3.0 for t in summary["stages"].values())
    gain = summary["targets"]["sokoban: RL gain over warm start (Sokoban success)"]
    before, after = (PUBLISHED["results"][f"sokoban/{s}"]["Sokoban"]["success"] for s in ("sft", "rl"))
    assert abs(gain["value"] - (after - before)) < 1e-12


def test_one_job_runs_the_families_in_this_process(stand_in, monkeypatch):
    ran = []
    monkeypatch.setattr(demo, "run_family", lambda family, *a, **k: ran.append(family))
    monkeypatch.setattr(demo, "write_outputs", lambda *a, **k: (None, None))
    monkeypatch.setattr(demo, "print_report", lambda *a, **k: None)
    rc, events, _ = stand_in({}, "--jobs", "1")
    assert rc == 0 and ran == ["bandit", "sokoban", "frozen_lake"] and events == []


def test_a_failing_family_stops_the_others_and_its_status_is_the_demos(stand_in):
    rc, events, work = stand_in({"sokoban": {"sleep": 60}, "bandit": {"code": 2}})
    assert rc == 2
    assert ["sokoban", "term"] == [e[:2] for e in events if e[0] == "sokoban"][-1]
    assert not any(e[0] == "frozen_lake" for e in events)  # nothing new starts after a failure
    assert not (work / "eval.json").exists()


def test_sigterm_to_the_demo_reaches_the_running_families(stand_in):
    rc, events, work = stand_in({"sokoban": {"sleep": 60}, "bandit": {"sleep": 60, "kill_demo": 2}})
    assert rc == PREEMPTED_EXIT
    assert {e[0] for e in events if e[1] == "term"} == {"sokoban", "bandit"}
    assert not any(e[0] == "frozen_lake" for e in events) and not (work / "eval.json").exists()


def test_bad_input_is_one_sentence_before_any_family_starts(stand_in, capsys):
    rc, events, _ = stand_in({}, "--frozen_lake.train.iterations=-1")
    assert rc == 2 and events == []
    err = capsys.readouterr().err
    assert "train.iterations" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        demo.parse_args(["--workdir", "w", "--jobs", "0"])


def test_a_family_killed_by_the_forwarded_sigterm_before_its_handler_counts_as_stopped(stand_in):
    rc, events, work = stand_in({"sokoban": {"sleep": 60, "no_handler": True},
                                 "bandit": {"sleep": 60, "kill_demo": 2}})
    assert rc == PREEMPTED_EXIT and not (work / "eval.json").exists()
    assert [e[1] for e in events if e[0] == "sokoban"] == ["start"]  # no handler ran: the signal ended it
