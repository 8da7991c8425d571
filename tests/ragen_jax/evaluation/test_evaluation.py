"""Evaluation against independent paths: metrics equal `rollout_metrics` of a directly built Rollout,
pass@k recomputed from the raw success array, eval.json and the table read back, a Trainer run
directory / an HF directory / a preset load with the right parameters, and the CLI end to end.

Every evaluation here uses the same shapes (Bandit + FrozenLake, 4 states x 2 rollouts, budget 8,
context 512), so the programs compile once per process and the CLI subprocess hits the persistent
compilation cache.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import envs_jax
from ragen_jax.evaluation.policies import EvalError, load_for_eval, load_source
from ragen_jax.evaluation.suite import DEFAULT_SUITE, evaluate, flat_metrics, format_table, get_rollout, write_eval_json
from ragen_jax.experiment.config import load_config
from ragen_jax.rollout import Rollout, RolloutConfig, rollout_metrics
from ragen_jax.text import PromptConfig, TextEnv

ROOT = Path(__file__).resolve().parents[3]
ENVS = ("Bandit", "FrozenLake")
PROMPT = PromptConfig(max_turns=2, max_response_tokens=8)
SETTINGS = dict(num_states=4, rollouts_per_state=2, max_context=512, prompt=PROMPT, seed_start=123)
KEY = jax.random.PRNGKey(5)
# The train-loop test's one-device config (tests/ragen_jax/trainer/test_train_loop.py), so its
# compiled programs come from the persistent cache.
TRAIN = ["--config.train.iterations=1", "--config.train.val_every=0", "--config.train.val_size=4",
         "--config.train.save_every=1", "--config.rollout.num_groups=2", "--config.rollout.group_size=4",
         "--config.filter.value=0.5", "--config.batching.mini_batch_size=4", "--config.prompt.max_turns=2",
         "--config.prompt.max_response_tokens=8", "--config.rollout.max_context=512",
         "--config.train.log_samples=0", "--config.mesh.data=1"]


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def _assert_same_params(a, b):
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb) > 0
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def tiny():
    return load_for_eval("preset:tiny")


@pytest.fixture(scope="module")
def tiny_results(tiny):
    return evaluate(tiny.policy, tiny.params, tiny.tokenizer, ENVS, key=KEY, transcripts=2, **SETTINGS)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from ragen_jax.trainer.rl import Trainer

    wd = tmp_path_factory.mktemp("run")
    trainer = Trainer(load_config("tiny_cpu.py", TRAIN), wd, quiet=True)
    trainer.train()
    return wd, trainer


# ------------------------------------------------------------------------------------ metrics
def test_metrics_equal_a_directly_built_rollout(tiny, tiny_results):
    assert list(tiny_results) == list(ENVS)
    for name in ENVS:
        env, params = envs_jax.make(name)
        turns, acts = (1, 1) if name == "Bandit" else (PROMPT.max_turns, PROMPT.max_actions_per_turn)
        te = TextEnv(env, params, tiny.tokenizer, PromptConfig(max_turns=turns, max_actions_per_turn=acts,
                                                               max_response_tokens=8))
        ro = Rollout(tiny.policy, te, RolloutConfig(num_groups=4, group_size=2, max_context=512, temperature=0.5))
        traj = jax.device_get(ro(tiny.params, KEY, np.arange(123, 127)))
        want = rollout_metrics(traj, 2)
        got = tiny_results[name]
        for k in ("success", "reward_mean", "action_is_valid", "action_is_effective", "num_actions",
                  "response_length", "format_ok", "num_turns", "truncated"):
            assert got[k] == pytest.approx(want[k], abs=1e-9), (name, k)
        # pass@2 from the raw per-episode success (rows of a state are consecutive).
        s = np.asarray(traj.success).reshape(4, 2)
        assert got["pass@2"] == pytest.approx(np.mean([row[0] or row[1] for row in s]))
        assert got["num_episodes"] == 8 and got["num_states"] == 4
        assert np.all(np.asarray(traj.seed).reshape(4, 2) == np.arange(123, 127)[:, None])
        assert int(np.max(traj.num_turns)) <= turns
        assert len(got["transcripts"]) == 2 and "--- group 0 seed 123" in got["transcripts"][0]
    assert tiny_results["Bandit"]["high_arm_rate"] == tiny_results["Bandit"]["success"]
    assert "high_arm_rate" not in tiny_results["FrozenLake"]


def test_pass_at_k_on_a_scripted_policy(tiny):
    """A scripted Bandit policy whose 8 answers are known: pass@2 and success by hand."""
    from tests.ragen_jax.rollout.scripted import ScriptedPolicy, make_script

    env, params = envs_jax.make("Bandit")
    # Rows 2s, 2s+1 belong to state s. State 0: both pick the high arm; 1: one does; 2, 3: none
    # (3: garbage, so also format errors).
    picks = ["Dragon", "Dragon", "Dragon", "Phoenix", "Phoenix", "Phoenix", None, None]
    texts = [[f"x</think><answer>{p}</answer>" if p else "no answer"] for p in picks]
    policy = ScriptedPolicy(make_script(tiny.tokenizer, texts, 1))
    res = evaluate(policy, nnx.state(policy), tiny.tokenizer, ("Bandit",), num_states=4, rollouts_per_state=2,
                   max_context=512, prompt=PromptConfig(max_response_tokens=12), greedy=True)["Bandit"]
    assert res["success"] == pytest.approx(3 / 8)
    assert res["pass@2"] == pytest.approx(2 / 4)
    assert res["format_ok"] == pytest.approx(6 / 8)
    assert res["num_actions"] == pytest.approx(6 / 8)


def test_new_params_do_not_recompile(tiny, tiny_results):
    ro = get_rollout(tiny.policy, tiny.tokenizer, "Bandit", temperature=0.5, greedy=False, **{
        k: v for k, v in SETTINGS.items() if k != "seed_start"})
    before = ro.trace_count
    other = jax.tree.map(lambda x: x * 1.5, tiny.params)
    res = evaluate(tiny.policy, other, tiny.tokenizer, ("Bandit",), key=KEY, **SETTINGS)
    assert ro.trace_count == before == 1
    assert res["Bandit"]["response_length"] > 0


def test_bad_evaluation_input(tiny):
    with pytest.raises(EvalError, match="unknown environment 'Sokobam'; valid: .*Sokoban"):
        evaluate(tiny.policy, tiny.params, tiny.tokenizer, ("Sokobam",))
    with pytest.raises(EvalError, match="num_states must be a positive integer"):
        evaluate(tiny.policy, tiny.params, tiny.tokenizer, ("Bandit",), num_states=0)
    with pytest.raises(EvalError, match="Bandit: .*max_context"):
        evaluate(tiny.policy, tiny.params, tiny.tokenizer, ("Bandit",), num_states=1, max_context=16)
    assert set(DEFAULT_SUITE) <= set(envs_jax.registered_envs())  # the generalisation suite names registered envs


# ------------------------------------------------------------------------------------ output
def test_eval_json_and_table(tiny_results, tmp_path):
    path = write_eval_json(tiny_results, tmp_path / "sub" / "eval.json", {"model": "preset:tiny"})
    doc = json.loads(path.read_text())
    assert doc["settings"] == {"model": "preset:tiny"}
    assert doc["results"].keys() == tiny_results.keys()
    for name, m in tiny_results.items():
        for k, v in m.items():
            assert doc["results"][name][k] == (pytest.approx(v) if isinstance(v, float) else v), (name, k)

    for name, m in tiny_results.items():  # per-state success, in seed order, averages to success
        assert len(m["state_success"]) == m["num_states"]
        assert np.mean(m["state_success"]) == pytest.approx(m["success"]), name
        assert m["pass@2"] == pytest.approx(np.mean(np.asarray(m["state_success"]) > 0)), name

    flat = flat_metrics(tiny_results)
    assert flat["val/Bandit/success"] == tiny_results["Bandit"]["success"]
    assert flat["val/FrozenLake/pass@2"] == tiny_results["FrozenLake"]["pass@2"]
    assert not any(k.endswith(("/transcripts", "/seconds")) for k in flat)

    table = format_table(tiny_results).splitlines()
    header = table[0].split()
    assert header[0] == "env" and "pass@2" in header and "success" in header
    assert len({len(line) for line in table}) == 1  # fixed width
    for line, (name, m) in zip(table[2:], tiny_results.items()):
        cells = dict(zip(header, line.split()))
        assert cells["env"] == name
        assert float(cells["success"]) == pytest.approx(m["success"], abs=5e-4)
        assert float(cells["pass@2"]) == pytest.approx(m["pass@2"], abs=5e-4)
        assert float(cells["reward"]) == pytest.approx(m["reward_mean"], abs=5e-4)
        assert int(cells["episodes"]) == 8


# ------------------------------------------------------------------------------------ loading
def test_run_directory_loads_trained_policy_and_evaluates(run_dir, tmp_path):
    wd, trainer = run_dir
    loaded, cfg = load_source(wd)
    policy, params, tokenizer, prompt = loaded
    _assert_same_params(params, trainer.state.actor)
    assert cfg.env.name == "Sokoban" and prompt == trainer.cfg.prompt
    assert (loaded.vocab is None) == (trainer.vocab is None)
    if trainer.vocab is not None:  # configs/tiny_cpu.py: a small task vocabulary, mapped in-graph
        np.testing.assert_array_equal(loaded.vocab.to_qwen, trainer.vocab.to_qwen)
    # Same key, seeds and settings as the Trainer's own rollout program: identical episodes.
    res = evaluate(policy, params, tokenizer, ("Bandit",), key=KEY, vocab=loaded.vocab, **SETTINGS)["Bandit"]
    env, env_params = envs_jax.make("Bandit")
    te = TextEnv(env, env_params, tokenizer, PromptConfig(max_turns=1, max_actions_per_turn=1, max_response_tokens=8))
    ro = Rollout(trainer.policy, te, RolloutConfig(num_groups=4, group_size=2, max_context=512, temperature=0.5),
                 vocab=trainer.vocab)
    want = rollout_metrics(ro(trainer.state.actor, KEY, np.arange(123, 127)), 2)
    for k in ("reward_mean", "response_length", "format_ok", "success"):
        assert res[k] == pytest.approx(want[k], abs=1e-6), k

    # The CLI on the run directory: the run's own prompt and context; eval.json lands in the run.
    cli = _cli_module()
    assert cli.main(["--model", str(wd), "--envs", "Bandit", "--num-states", "4", "--rollouts-per-state", "2",
                     "--seed", "5"]) == 0
    doc = json.loads((wd / "eval.json").read_text())
    assert doc["settings"]["max_context"] == 512 and doc["settings"]["prompt"]["max_response_tokens"] == 8
    for k in ("reward_mean", "response_length", "format_ok", "success"):
        assert doc["results"]["Bandit"][k] == pytest.approx(want[k], abs=1e-6), k

    # Only checkpoints/ (e.g. an interrupted run), and no vocab.json: the actor of the latest
    # checkpoint alone, the vocabulary rebuilt from the config.
    ck = tmp_path / "ckonly"
    shutil.copytree(wd, ck, ignore=shutil.ignore_patterns("policy", "vocab.json"))
    again = load_for_eval(ck)
    _assert_same_params(again.params, trainer.state.actor)
    if trainer.vocab is not None:
        np.testing.assert_array_equal(again.vocab.to_qwen, trainer.vocab.to_qwen)

    # A corrupt export: the CheckpointError message, as one EvalError sentence.
    bad = tmp_path / "corrupt"
    shutil.copytree(wd, bad)
    for f in (bad / "policy").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(EvalError, match="policy export .* cannot be restored"):
        load_for_eval(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((wd / "config.json").read_text())
    with pytest.raises(EvalError, match="neither a policy export"):
        load_for_eval(empty)


def test_hf_directory_and_presets_load(tiny, tmp_path):
    from ragen_jax.models import save_pretrained

    save_pretrained(tiny.policy, str(tmp_path / "hf"))
    loaded = load_for_eval(tmp_path / "hf")
    _assert_same_params(loaded.params, tiny.params)
    assert loaded.prompt == PromptConfig()
    assert loaded.tokenizer.encode("<|im_end|>") == [151645]
    with pytest.raises(EvalError, match="does not exist"):
        load_for_eval(tmp_path / "missing")
    with pytest.raises(EvalError, match="neither a run directory .* nor a Hugging Face"):
        load_for_eval(tmp_path)
    with pytest.raises(EvalError, match="unknown preset 'huge'"):
        load_for_eval("preset:huge")


# ------------------------------------------------------------------------------------ CLI
def _cli_module():
    spec = importlib.util.spec_from_file_location("launch_eval", ROOT / "launch" / "eval.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, str(ROOT / "launch" / "eval.py"), *args], capture_output=True, text=True,
                          cwd=cwd, env=dict(os.environ), timeout=300)


def test_cli_writes_eval_json_equal_to_the_library(tiny_results, tmp_path, monkeypatch, capsys):
    # Same policy (preset:tiny = Rngs(0)), seeds, key (seed 5 = KEY) and shapes as tiny_results' Bandit row.
    # launch/eval.py's main in this process (its programs are this process's): the script itself, run as
    # a program with its exit status and one-line errors, is test_cli_errors_are_one_line_exit_2's.
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    code = _cli_module().main(["--model", "preset:tiny", "--envs", "bandit", "--num-states", "4",
                               "--rollouts-per-state", "2", "--max-response-tokens", "8", "--max-context", "512",
                               "--seed", "5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "[1/1] Bandit" in err
    doc = json.loads((tmp_path / "eval.json").read_text())
    assert doc["settings"]["envs"] == ["Bandit"] and doc["settings"]["num_states"] == 4
    want = tiny_results["Bandit"]
    got = doc["results"]["Bandit"]
    for k in ("success", "reward_mean", "format_ok", "pass@2", "response_length", "num_episodes"):
        assert got[k] == pytest.approx(want[k]), k
    assert out.splitlines()[0].split()[0] == "env" and "Bandit" in out


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    r = _cli("--model", "preset:tiny", "--envs", "Bandit,Chess")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown environment 'Chess'" in lines[0] and "FrozenLake" in lines[0]

    # The other errors in-process (launch/eval.py's main), sparing interpreter starts.
    cli = _cli_module()
    for args, msg in ((["--model", str(tmp_path / "nope")], "nope does not exist"),
                      (["--model", str(tmp_path)], "neither a run directory"),
                      (["--model", "preset:tiny", "--envs", "Bandit", "--num-states", "0"], "num_states must be")):
        capsys.readouterr()
        assert cli.main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], err


def test_cli_compare_pairs_with_an_earlier_evaluation(tiny_results, tmp_path, monkeypatch, capsys):
    """--compare: the earlier eval.json's per-state rates against this run's, through paired_rates (the
    truth: paired_rates on the two lists, read back from the files); mismatched states refused in one
    sentence before any model loads."""
    from ragen_jax.evaluation.paired import paired_rates

    monkeypatch.chdir(tmp_path)
    earlier = {"settings": {"num_states": 4, "seed_start": 123, "rollouts_per_state": 2},
               "results": {"Bandit": {"state_success": [0.0, 0.5, 1.0, 0.5]}}}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    args = ["--model", "preset:tiny", "--envs", "bandit", "--num-states", "4", "--rollouts-per-state", "2",
            "--max-response-tokens", "8", "--max-context", "512", "--seed", "5", "--compare", "earlier.json"]
    capsys.readouterr()
    assert _cli_module().main(args) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "eval.json").read_text())
    want = paired_rates([0.0, 0.5, 1.0, 0.5], doc["results"]["Bandit"]["state_success"], 2)
    assert doc["paired"]["Bandit"] == json.loads(json.dumps(want)) and doc["paired"]["against"] == "earlier.json"
    assert "Bandit: earlier.json -> this:" in out
    assert _cli_module().main(args[:5] + ["3"] + args[6:]) == 2  # 3 states against the file's 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has num_states 4, this evaluation 3" in err[0]


def test_repeats_pool_separate_runs_state_by_state(tiny, tiny_results):
    """repeats=R: R runs of the same program (keys: the key, then fold_in(key, r)) pooled per state; the
    truth is the R runs made one by one with those keys and averaged by hand, and the first run is the
    R = 1 evaluation itself."""
    pooled = evaluate(tiny.policy, tiny.params, tiny.tokenizer, ("Bandit",), key=KEY, repeats=3, **SETTINGS)["Bandit"]
    runs = [tiny_results["Bandit"]] + [
        evaluate(tiny.policy, tiny.params, tiny.tokenizer, ("Bandit",), key=jax.random.fold_in(KEY, r),
                 **SETTINGS)["Bandit"] for r in (1, 2)]
    want = np.mean([r["state_success"] for r in runs], axis=0)
    np.testing.assert_allclose(pooled["state_success"], want, rtol=0, atol=1e-12)
    assert pooled["num_episodes"] == 3 * runs[0]["num_episodes"] and pooled["num_states"] == SETTINGS["num_states"]
    assert pooled["success"] == pytest.approx(np.mean([r["success"] for r in runs]))
    assert pooled["reward_mean"] == pytest.approx(np.mean([r["reward_mean"] for r in runs]))
    with pytest.raises(EvalError, match="repeats must be a positive integer"):
        evaluate(tiny.policy, tiny.params, tiny.tokenizer, ("Bandit",), key=KEY, repeats=0, **SETTINGS)
