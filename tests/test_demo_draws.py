"""Draws of the CPU demo (ragen_jax/recipes/draws.py, scripts/demo_draws.py) and their README rows.

No demo is run: each draw is a hand-written demo_summary.json / eval.json, and every expected number
(min / median / max, significant draws, the verdicts, the markdown rows) is typed out by hand from
them. The series runner is exercised with a stand-in demo that writes such files.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from ragen_jax.infra.machine import cpu_class, cpu_model
from ragen_jax.recipes import draws
from scripts import demo_draws, readme_results

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu avx2

processor\t: 1
cpu family\t: 99
model name\t: other
"""


def _target(before, after, gained, lost, p, k=None):
    t = {"value": after - before, "target": 0.1, "reached": after - before >= 0.1, "before": before, "after": after,
         "states": 256, "gained": gained, "lost": lost, "p_value": p}
    if k:
        kb, ka, kp = k
        t["k_sample"] = {"samples_per_state": 8, "before": kb, "after": ka, "change": ka - kb, "ci95": [0.0, 0.1],
                         "p_value": kp, "improved": 1, "worsened": 0, "unchanged": 255, "states": 256}
    return t


# (seed, Sokoban one-rollout target, its k-sample (before, after, p)), with Bandit in every draw.
DRAWS = [
    (0, (0.574, 0.609, 35, 26, 0.31), (0.565, 0.610, 0.027)),
    (1, (0.500, 0.650, 60, 22, 1e-5), (0.510, 0.640, 1e-6)),
    (2, (0.550, 0.640, 40, 17, 0.003), (0.540, 0.620, 0.001)),
]


def _write_draw(d: Path, seed: int, sok, k, total_s: float, overrides=None):
    d.mkdir(parents=True)
    targets = {"bandit/rl Bandit high_arm_rate": {"value": 1.0, "target": 0.9, "reached": True},
               "bandit: RL gain over warm start (Bandit success)": _target(0.633, 1.0, 94, 0, 1e-28,
                                                                          (0.6, 1.0, 1e-70)),
               "sokoban: RL gain over warm start (Sokoban success)": _target(*sok, k)}
    (d / "demo_summary.json").write_text(json.dumps({
        "seed": seed, "total_s": total_s, "total_cpu_s": 2 * total_s, "peak_rss_mb": 3000.0 + seed, "quick": False,
        "stages": {"sokoban/rl": {"train_s": 500.0, "train_cpu_s": 900.0, "eval_s": 4.0, "eval_cpu_s": 6.0,
                                  "total_s": 504.0}},
        "targets": targets, "curves": []}))
    (d / "eval.json").write_text(json.dumps({"settings": {
        "model": "tiny", "quick": False, "seed": seed, "num_states": 256, "k_sample_rollouts_per_state": 8,
        "overrides": overrides or {"bandit": [], "sokoban": [], "frozen_lake": []}}, "results": {}}))


@pytest.fixture
def series(tmp_path):
    for (seed, sok, k), total in zip(DRAWS, (840.0, 900.0, 780.0)):
        _write_draw(tmp_path / f"seed{seed}", seed, sok, k, total)
    return tmp_path


def test_cpu_class_names_family_and_model():
    assert cpu_class(CPUINFO) == "AMD EPYC (family 25, model 17)"
    assert cpu_class("model name\t: Some CPU\n") == "Some CPU"
    assert cpu_model(CPUINFO) == "AMD EPYC" and cpu_class("") == ""


def test_summary_is_the_distribution_over_draws(series):
    records = [draws.draw_record(series / f"seed{s}") for s, _, _ in DRAWS]
    assert [r["seed"] for r in records] == [0, 1, 2]
    s = draws.summarise(records)["sokoban"]
    assert s["env"] == "Sokoban" and s["draws"] == 3 and s["seeds"] == [0, 1, 2]
    # One-rollout gains 0.035, 0.150, 0.090; k-sample gains 0.045, 0.130, 0.080.
    assert s["gain"] == pytest.approx({"min": 0.035, "median": 0.090, "max": 0.150})
    assert s["k_gain"] == pytest.approx({"min": 0.045, "median": 0.080, "max": 0.130})
    assert s["before"] == pytest.approx({"min": 0.500, "median": 0.550, "max": 0.574})
    # Significant: a positive k-sample gain with p < 0.01, so seed 0 (p 0.027) is not.
    assert s["significant"] == 2 and s["alpha"] == 0.01 and s["samples_per_state"] == 8
    assert draws.summarise(records)["bandit"]["significant"] == 3
    doc = draws.publication(records, {"cpu_class": "X", "cpu_count": 2}, "abc1234", "cmd")
    assert doc["costs"]["total_s"] == {"min": 780.0, "median": 840.0, "max": 900.0}


def test_without_k_samples_the_one_rollout_test_decides():
    rec = {"seed": 0, "families": {"sokoban": {"env": "Sokoban", "before": 0.5, "after": 0.6, "gain": 0.1,
                                               "p_value": 0.004}}}
    neg = {"seed": 1, "families": {"sokoban": {"env": "Sokoban", "before": 0.6, "after": 0.5, "gain": -0.1,
                                               "p_value": 0.004}}}
    s = draws.summarise([rec, neg])["sokoban"]
    assert s["significant"] == 1 and s["k_gain"] == {}


def test_landing_says_where_a_run_falls(series):
    records = [draws.draw_record(series / f"seed{s}") for s, _, _ in DRAWS]
    pub = draws.publication(records, {"cpu_class": "AMD EPYC (family 25, model 17)", "cpu_count": 2}, "abc1234", "c")
    inside = {"sokoban: RL gain over warm start (Sokoban success)": _target(0.5, 0.6, 40, 20, 0.01, (0.5, 0.6, 0.001))}
    below = {"sokoban: RL gain over warm start (Sokoban success)": _target(0.5, 0.52, 20, 15, 0.5, (0.5, 0.52, 0.3))}
    lines = draws.landing_lines(pub, inside, "AMD EPYC (family 25, model 17)")
    assert lines[0] == "Published: 3 draws of commit abc1234 on a AMD EPYC (family 25, model 17)."
    assert lines[1] == ("sokoban: gain +10.0 points (8 rollouts per state); published +4.5 / +8.0 / +13.0 "
                        "(min / median / max of 3 draws): inside the published range")
    assert draws.landing_lines(pub, below, "AMD EPYC (family 25, model 17)")[1].endswith("BELOW the published range")
    other = draws.landing_lines(pub, inside, "Intel Xeon (family 6, model 85)")
    assert "runs differ across CPU classes" in other[1] and other[2].endswith("inside the published range")
    not_comparable = draws.landing_lines(pub, below, "x", comparable=False)
    assert "not comparable" in not_comparable[1] and not_comparable[2].endswith("not placed (other settings)")
    assert draws.landing_lines(None, inside, "x") == [
        "No published distribution of draws beside this checkout (docs/demo_results/draws.json)."]


def test_comparable_settings(series):
    pub = {"draws": [draws.draw_record(series / "seed0")]}
    same = {"model": "tiny", "quick": False, "seed": 5, "num_states": 256, "k_sample_rollouts_per_state": 8,
            "overrides": {"bandit": [], "sokoban": [], "frozen_lake": []}}
    assert draws.comparable(pub, same)
    assert not draws.comparable(pub, {**same, "overrides": {"sokoban": ["sft.epochs=2"]}})
    assert not draws.comparable(pub, {**same, "quick": True})
    assert not draws.comparable(pub, {**same, "k_sample_rollouts_per_state": None})


def test_readme_rows_come_from_draws_json(series, tmp_path_factory):
    records = [draws.draw_record(series / f"seed{s}") for s, _, _ in DRAWS]
    doc = draws.publication(records, {"cpu_class": "AMD EPYC (family 25, model 17)", "cpu_count": 2}, "abc1234",
                            "python scripts/demo_draws.py --draws 3")
    root = tmp_path_factory.mktemp("root")
    (root / "bench" / "results").mkdir(parents=True)
    (root / "docs" / "demo_results").mkdir(parents=True)
    (root / "docs" / "demo_results" / "draws.json").write_text(json.dumps(doc))
    md = readme_results.summary(root).splitlines()
    assert ("The tiny demo's draws: 3 runs of `launch/demo.py --seed S` (S = 0, 1, 2) at commit abc1234, alone on a "
            "2-core AMD EPYC (family 25, model 17), 14 min per draw (median; 13-15) (`python scripts/demo_draws.py "
            "--draws 3`; `docs/demo_results/draws.json`). Gains in points of success, min / median / max over the "
            "draws:") in md
    assert ("| Sokoban | 0.550 -> 0.640 (k: 0.540 -> 0.620) | +3.5 / +9.0 / +15.0 | +4.5 / +8.0 / +13.0 (k = 8) | "
            "2 of 3 (p < 0.01, paired permutation test, k) |") in md
    assert "| Bandit | 0.633 -> 1.000 (k: 0.600 -> 1.000) | +36.7 / +36.7 / +36.7 | +40.0 / +40.0 / +40.0 (k = 8) | " \
           "3 of 3 (p < 0.01, paired permutation test, k) |" in md
    assert not any(r.startswith("| tiny, from scratch") for r in md)  # no single-draw rows beside the distribution
    assert not any("main job alone" in r for r in md)  # no alone.json: no time-alone sentence
    alone = {"seed": 0, "commit": "abc1234", "date": "2026-12-07", "wall_s": 1226.7, "cpu_s": 2084.1,
             "peak_rss_mb": 2668.2, "identical_to_published_draw": True,
             "machine": {"cpu_count": 2, "cpu_class": "AMD EPYC (family 25, model 17)"}}
    (root / "docs" / "demo_results" / "alone.json").write_text(json.dumps(alone))
    md = readme_results.summary(root).splitlines()
    assert ("The main job alone (seed 0, fresh clone of abc1234 in a fresh venv, 2026-12-07): 20:27 wall, 2,084 CPU "
            "s, peak 2.6 GB RSS on a 2-core AMD EPYC (family 25, model 17) (`docs/demo_results/alone.json`). Its "
            "outcomes equal the published draw of that seed, state by state.") in md


def test_committed_draws_match_the_readme():
    """The README's rows are the committed draws.json's (regenerating changes nothing), and each of its
    draws' summary is the one recomputed from its records."""
    doc = draws.load_published()
    if doc is None:
        pytest.skip("no draws published yet")
    assert doc["families"] == json.loads(json.dumps(draws.summarise(doc["draws"])))
    block = readme_results.summary()
    assert block in Path(readme_results.ROOT / "README.md").read_text()


def test_series_runs_resumes_and_publishes(tmp_path, monkeypatch):
    """The runner with a stand-in demo (writes a finished draw): every seed run once, a finished draw
    read and not rerun, draws.json written, and --publish copies the lowest seed's outputs."""
    fake = tmp_path / "fake_demo.py"
    fake.write_text(f"""
import argparse, json
from pathlib import Path
DRAWS = {DRAWS!r}
{inspect.getsource(_target)}
{inspect.getsource(_write_draw)}
p = argparse.ArgumentParser(); p.add_argument("--workdir"); p.add_argument("--seed", type=int)
p.add_argument("--skip-bandit", action="store_true")
a = p.parse_args()
seed, sok, k = next(d for d in DRAWS if d[0] == a.seed)
_write_draw(Path(a.workdir), seed, sok, k, 800.0)
with open(Path(a.workdir).parent / "calls.txt", "a") as f:
    f.write(f"{{a.seed}} {{a.skip_bandit}}\\n")
""")
    monkeypatch.setattr(demo_draws, "DEMO", fake)
    work, pub = tmp_path / "w", tmp_path / "pub"
    _write_draw(work / "seed1", 1, *DRAWS[1][1:], 700.0)  # finished earlier
    assert demo_draws.main(["--draws", "3", "--workdir", str(work), "--publish", str(pub), "--", "--skip-bandit"]) == 0
    assert (work / "calls.txt").read_text().split("\n") == ["0 True", "2 True", ""]
    doc = json.loads((pub / "draws.json").read_text())
    assert [r["seed"] for r in doc["draws"]] == [0, 1, 2]
    assert doc["command"] == "python scripts/demo_draws.py --draws 3 -- --skip-bandit"
    assert doc["families"]["sokoban"]["significant"] == 2
    # The commit is the one recorded when the series started, not the checkout's at publication.
    assert doc["commit"] == json.loads((work / "series.json").read_text())["commit"] == demo_draws.commit()
    (work / "series.json").write_text('{"commit": "abc1234"}')
    assert demo_draws.main(["--draws", "3", "--workdir", str(work)]) == 0
    assert json.loads((work / "draws.json").read_text())["commit"] == "abc1234"
    assert sorted(p.name for p in pub.iterdir()) == ["demo_summary.json", "draws.json", "eval.json"]
    assert json.loads((pub / "demo_summary.json").read_text())["seed"] == 0
    # Two at a time: both remaining draws run, each with its own log, and the record says so.
    assert demo_draws.main(["--seeds", "0,2", "--workdir", str(tmp_path / "p"), "--parallel", "2"]) == 0
    doc = json.loads((tmp_path / "p" / "draws.json").read_text())
    assert doc["parallel"] == 2 and doc["command"] == "python scripts/demo_draws.py --seeds 0,2 --parallel 2"
    assert sorted(p.name for p in (tmp_path / "p").glob("seed*.log")) == ["seed0.log", "seed2.log"]


@pytest.mark.parametrize("argv, msg", [
    (["--workdir", "w", "--draws", "0"], "--draws must be a positive number"),
    (["--workdir", "w", "--seeds", "a,b"], "--seeds must be comma-separated whole numbers"),
    (["--workdir", "w", "--draws", "2", "--", "--seed", "3"], "--seed after -- is set by this script"),
])
def test_bad_arguments_are_one_sentence(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        demo_draws.parse(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_demo_seed_flag():
    from ragen_jax.recipes import demo
    args, _ = demo.parse_args(["--workdir", "w", "--seed", "3"])
    assert args.seed == 3
    with pytest.raises(SystemExit):
        demo.parse_args(["--workdir", "w", "--seed", "-1"])
    assert demo.parse_args(["--workdir", "w"])[0].seed == 0  # draw 0: the configs' own train.seed
    sft, rl = demo.stage_configs(demo.SOKOBAN_CONFIG, demo.base_overrides(args, demo.QUICK_SOKOBAN),
                                 ["train.seed=5"], "/tmp/x")
    assert sft.train.seed == rl.train.seed == 5  # a user's override wins
    sft, rl = demo.stage_configs(demo.SOKOBAN_CONFIG, demo.base_overrides(args, demo.QUICK_SOKOBAN), [], "/tmp/x")
    assert sft.train.seed == rl.train.seed == 3 and sft.sft.num_demos == 8192  # not --quick
