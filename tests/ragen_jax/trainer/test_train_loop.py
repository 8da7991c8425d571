"""The training program end to end on the tiny CPU config: PPO and GRPO run, logs and checkpoints
are written, a resumed run continues with exactly the metrics of an uninterrupted one, 8 devices give
the numbers of 1 device, and bad input fails early with a clear message and nothing overwritten."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.rollout import group_seeds_for_iteration
from ragen_jax.trainer.rl import Trainer

ROOT = Path(__file__).resolve().parents[3]
# Smaller than configs/tiny_cpu.py so each run is a few seconds after compilation. One mini-batch of 4
# per iteration: the mini-batch the 8-device mesh (data 2 x fsdp 2) can split, so the 8-device test
# compares against the PPO run itself (its iteration 1 and checkpoint 1), not a second 1-device run.
FAST = ["--config.train.iterations=3", "--config.train.val_every=2", "--config.train.val_size=4",
        "--config.train.save_every=1", "--config.rollout.num_groups=2", "--config.rollout.group_size=4",
        "--config.filter.value=0.5", "--config.batching.mini_batch_size=4", "--config.prompt.max_turns=2",
        "--config.prompt.max_response_tokens=8", "--config.rollout.max_context=512", "--config.train.log_samples=1",
        "--config.mesh.data=1"]


def _cfg(*extra):
    return load_config("tiny_cpu.py", [*FAST, *extra])


def _strip_timing(hist):
    return [{k: v for k, v in h.items() if not k.startswith("timing/")} for h in hist]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("ppo")
    trainer = Trainer(_cfg(), wd, quiet=True)
    hist = trainer.train()
    return wd, hist


def test_ppo_run_logs_checkpoints_and_finite_metrics(ppo_run):
    wd, hist = ppo_run
    assert [h["step"] for h in hist] == [1, 2, 3]
    for h in hist:
        for k in ("train/success", "train/reward_mean", "train/format_ok", "rollout/in_group_std",
                  "rollout/chosen_in_group_std", "actor/entropy", "actor/grad_norm", "critic/grad_norm",
                  "actor/pg_clipfrac_low", "actor/pg_clipfrac_high", "actor/approx_kl", "critic/value_loss",
                  "response_length/mean", "timing/rollout_s", "timing/update_s", "echo_trap/score"):
            assert k in h and math.isfinite(h[k]), k
    assert list((wd / "tb").glob("events.out.tfevents.*"))
    rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    assert any("val/Sokoban/success" in r for r in rows)  # validation at 0 and 2
    steps = sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == 3
    assert json.loads((wd / "config.json").read_text())["advantage"]["estimator"] == "gae"


def test_resume_continues_exactly_and_skips_a_save_killed_midway(ppo_run, tmp_path):
    """A 2-iteration run, then "rerunning the same command" with more iterations resumes from its
    checkpoint at 2 and continues with exactly the metrics of the uninterrupted run. Before resuming,
    the directory gets what a kill during the save of step 3 leaves behind (orbax's half-written
    temporary step directory): it must be ignored. One resumed run checks both (one trainer less)."""
    import shutil

    _, full = ppo_run
    wd = tmp_path / "resume"
    first = Trainer(_cfg("--config.train.iterations=2"), wd, quiet=True).train()
    ckpts = wd / "checkpoints"
    assert not (ckpts / "3").exists()
    tmp_step = ckpts / "3.orbax-checkpoint-tmp-1763700000000000"
    shutil.copytree(ckpts / "2", tmp_step)
    for f in tmp_step.rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    trainer = Trainer(_cfg(), wd, quiet=True)
    assert trainer.iteration == 2
    rest = trainer.train()
    assert [h["step"] for h in first + rest] == [1, 2, 3]
    got, want = _strip_timing(first + rest), _strip_timing(full)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            np.testing.assert_allclose(g[k], w[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_grpo_without_critic_trains_on_the_numpy_advantages(tmp_path):
    """GRPO with mean_std rewards and no critic: the prepared batch holds the kept groups' rows (top_k 0.5
    by reward std, in rank order) and on every sampled token the advantage numpy computes from the
    rewards (group mean_std normalisation, then GRPO's group normalisation, sample std + 1e-6); the
    update trains on it without a critic. Rewards are drawn at random (a random tiny model's episodes
    mostly tie) and written into the real rollout's trajectories."""
    p, n = 4, 4
    cfg = _cfg("--config.advantage.estimator=grpo", "--config.advantage.reward_norm=mean_std", "--config.model.critic=none",
               f"--config.rollout.num_groups={p}", "--config.train.iterations=1", "--config.train.val_every=0")
    tr = Trainer(cfg, tmp_path / "grpo", quiet=True)
    traj = tr.rollout(tr.actor_params, jax.random.fold_in(tr.state.key, 1),
                      group_seeds_for_iteration(0, p, cfg.train.seed_base))
    reward = np.random.default_rng(0).normal(size=p * n).astype(np.float32)
    traj = traj.replace(reward=jnp.asarray(reward))
    batch, _ = tr.prepare_fn(tr.state.actor, tr.state.critic, tr.ref, traj, *tr.frozen_args)

    g = reward.reshape(p, n).astype(np.float64)
    std = g.std(axis=1, ddof=1)[:, None]
    norm = np.where(std > 1e-6, (g - g.mean(1, keepdims=True)) / (std + 1e-6), 0.0)
    adv = ((norm - norm.mean(1, keepdims=True)) / (norm.std(1, ddof=1)[:, None] + 1e-6)).reshape(-1)
    kept = np.argsort(-std[:, 0], kind="stable")[:2]
    rows = np.concatenate([np.arange(k * n, (k + 1) * n) for k in kept])
    b, tokens = jax.device_get(batch), np.asarray(traj.tokens)
    np.testing.assert_array_equal(b.tokens, tokens[rows])
    for i, r in enumerate(rows):
        assert b.mask[i].any()
        np.testing.assert_allclose(b.advantages[i][b.mask[i]], adv[r], rtol=1e-4, atol=1e-5)
        assert not b.advantages[i][~b.mask[i]].any()
    _, metrics = tr.update_fn(tr.state, batch, *tr.frozen_args)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    assert math.isfinite(metrics["actor/pg_loss"]) and not any(k.startswith("critic/") for k in metrics)


def test_eight_devices_match_one_device(ppo_run, tmp_path):
    """The 1-device run is the module's PPO run: its iteration 1 metrics (validation and logged samples
    draw no training randomness: the rollout key is the train state's), and its parameters after
    iteration 1 read back from its checkpoint 1 (no second 1-device trainer)."""
    import shutil

    from ragen_jax.infra.checkpoint import Checkpointer

    if jax.device_count() < 8:
        pytest.skip("needs 8 (simulated) devices")
    wd, hist = ppo_run
    h1 = hist[0]
    over = ("--config.train.iterations=1", "--config.train.val_every=0", "--config.train.log_samples=0")
    eight = Trainer(_cfg(*over, "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"),
                    tmp_path / "eight", quiet=True)
    p0 = [np.array(x, copy=True) for x in jax.tree.leaves(jax.device_get(eight.state.actor))]  # before its update
    shutil.copytree(wd / "checkpoints", tmp_path / "one_ckpts")  # read a copy: the other tests read wd
    ckpt = Checkpointer(tmp_path / "one_ckpts")
    one_after, extra = ckpt.restore(1, eight.state)
    ckpt.close()
    assert extra["iteration"] == 1
    p1 = jax.tree.leaves(jax.device_get(one_after.actor))
    h8 = eight.train()[0]
    for k in ("train/reward_mean", "actor/pg_loss", "actor/entropy", "critic/value_loss", "actor/grad_norm"):
        np.testing.assert_allclose(h8[k], h1[k], rtol=2e-4, atol=1e-5, err_msg=k)
    # Updated params agree to a small fraction of one Adam step (lr 1e-4): float reassociation across
    # shards can move a near-zero gradient, which Adam's normalisation turns into a visible change.
    p8 = jax.tree.leaves(jax.device_get(eight.state.actor))
    for a, b, c in zip(p1, p8, p0):
        np.testing.assert_allclose(a, b, atol=5e-6)
        assert np.abs(b - c).max() > 1e-5  # the update really moved the parameters


# ------------------------------------------------------------------------------------ bad input
def test_bad_input_fails_before_anything_is_written(tmp_path, ppo_run):
    with pytest.raises(ConfigError, match="unknown config key 'algo.epsilon'"):
        _cfg("--config.algo.epsilon=0.2")
    with pytest.raises(ConfigError, match="loss.eps_high expects a number"):
        _cfg("--config.loss.eps_high=wide")
    with pytest.raises(ConfigError, match="fewer than batching.mini_batch_size"):
        _cfg("--config.batching.mini_batch_size=64")
    with pytest.raises(ConfigError, match="is neither a directory nor a .gguf file"):
        load_config("sokoban.py", ["--config.model.path=/nonexistent/qwen"])
    with pytest.raises(ConfigError, match="model.path is required"):
        load_config("sokoban.py")
    wd = tmp_path / "mesh"
    with pytest.raises(ConfigError, match="not divisible"):
        Trainer(_cfg("--config.mesh.data=8", "--config.rollout.group_size=3", "--config.batching.mini_batch_size=3"), wd)
    assert not wd.exists() or not any(wd.iterdir())

    # A run directory with a different config is refused; its files are untouched.
    src, _ = ppo_run
    before = (src / "config.json").read_text()
    with pytest.raises(ConfigError, match="different config"):
        Trainer(_cfg("--config.loss.eps_high=0.3"), src, quiet=True)
    assert (src / "config.json").read_text() == before


def test_corrupt_checkpoint_is_reported(ppo_run, tmp_path):
    """The latest checkpoint of a copy of the PPO run is corrupted; resuming must say so (the copy
    saves training a run of its own)."""
    import shutil

    from ragen_jax.infra.checkpoint import CheckpointError

    wd = tmp_path / "corrupt"
    shutil.copytree(ppo_run[0], wd)
    corrupted = 0
    for f in (wd / "checkpoints" / "3").rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "state" in str(f):
            f.write_bytes(b"garbage")
            corrupted += 1
    assert corrupted
    with pytest.raises(CheckpointError, match="checkpoints/3 cannot be restored"):
        Trainer(_cfg("--config.train.iterations=4"), wd, quiet=True)


def test_launch_cli_reports_config_errors_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "tpu_train.py"), "--config", "tiny_cpu.py",
                        "--workdir", str(tmp_path / "w"), "--config.algo.bogus=1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: unknown config key 'algo.bogus'")
    assert len(r.stderr.strip().splitlines()) == 1


def test_run_dir_saved_before_a_config_key_existed(tmp_path):
    """A key added to Config after a run started: its default resumes the run, another value is refused."""
    from ragen_jax.experiment.build import check_run_dir_config

    cfg = load_config("tiny_cpu.py")
    saved = json.loads(json.dumps(cfg.to_dict(), default=str))
    del saved["sft"]["lr_schedule"]  # as written before sft.lr_schedule existed
    (tmp_path / "config.json").write_text(json.dumps(saved))
    check_run_dir_config(tmp_path, cfg, ())
    with pytest.raises(ConfigError, match="sft.lr_schedule"):
        check_run_dir_config(tmp_path, load_config("tiny_cpu.py", ["sft.lr_schedule=cosine"]), ())
    with pytest.raises(ConfigError, match="sft.lr"):
        check_run_dir_config(tmp_path, load_config("tiny_cpu.py", ["sft.lr=0.5"]), ())


def test_run_dir_saved_before_a_key_moved(tmp_path):
    """model.cache_dtype moved to rollout.cache_dtype: a run saved with the old key resumes with the same
    value under the new one (and is refused with another), and evaluation reads its config."""
    from ragen_jax.experiment.config import config_from_dict
    from ragen_jax.experiment.build import check_run_dir_config

    cfg = load_config("tiny_cpu.py", ["rollout.cache_dtype=bfloat16"])
    saved = json.loads(json.dumps(cfg.to_dict(), default=str))
    saved["model"]["cache_dtype"] = saved["rollout"].pop("cache_dtype")  # as written before the move
    (tmp_path / "config.json").write_text(json.dumps(saved))
    check_run_dir_config(tmp_path, cfg, ())
    with pytest.raises(ConfigError, match="rollout.cache_dtype"):
        check_run_dir_config(tmp_path, load_config("tiny_cpu.py"), ())
    assert config_from_dict(saved).rollout.cache_dtype == "bfloat16"


def test_prompt_and_rollout_knobs_reach_the_objects_that_use_them():
    """Every field of the classes that use the prompt and rollout sections is settable from the command
    line (no hand-copied mirror that drops some): format_penalty and stop_at_answer included."""
    cfg = load_config("tiny_cpu.py", ["rollout.format_penalty=-0.5", "rollout.stop_at_answer=false",
                                      "prompt.system_prompt=Be brief.", "prompt.max_actions_per_episode=7"])
    assert cfg.rollout.format_penalty == -0.5 and cfg.rollout.stop_at_answer is False
    assert cfg.prompt.system_prompt == "Be brief." and cfg.prompt.max_actions_per_episode == 7
    with pytest.raises(ConfigError, match="prompt.max_turns"):
        load_config("tiny_cpu.py", ["prompt.max_turns=0"])
    with pytest.raises(ConfigError, match="rollout.top_p"):
        load_config("tiny_cpu.py", ["rollout.top_p=1.5"])


# ------------------------------------------------------------------------------------ stops and crashes
def test_sigterm_saves_after_the_iteration_and_the_resumed_run_is_uninterrupted(ppo_run, tmp_path, monkeypatch):
    """SIGTERM during iteration 2 (of a run saving every 3: the signal is what writes checkpoint 2):
    the iteration finishes, checkpoint 2 is written, train() returns with `interrupted`; the same run
    resumed gives exactly the uninterrupted run's metrics.jsonl and TensorBoard (each tag and step
    once, as TensorBoard reads the files). Early-stop counters and the echo-trap window come back."""
    import os
    import signal

    from ragen_jax.infra.logger import Logger
    from scripts.fault_trials import compare

    ref, _ = ppo_run
    wd = tmp_path / "run"
    scalars = Logger.scalars

    def signal_during_iteration_2(self, step, metrics):
        if step == 2 and "train/success" in metrics:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only records it; the loop stops after this step
        return scalars(self, step, metrics)

    monkeypatch.setattr(Logger, "scalars", signal_during_iteration_2)
    first = Trainer(_cfg("--config.train.save_every=3"), wd, quiet=True)
    hist = first.train()
    assert first.interrupted == "SIGTERM" and [h["step"] for h in hist] == [1, 2]
    assert sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == [2]
    assert not (wd / "policy").exists()  # interrupted: no export
    monkeypatch.setattr(Logger, "scalars", scalars)
    resumed = Trainer(_cfg(), wd, quiet=True)
    assert resumed.iteration == 2 and resumed.stops.state() == first.stops.state()
    assert resumed.echo.state() == first.echo.state() and len(resumed.echo.state()["std"]) == 2
    resumed.train()
    assert resumed.interrupted is None and (wd / "policy").exists()
    assert compare(wd, ref) is None


def test_kill_during_a_checkpoint_write_resumes_from_the_last_complete_one(ppo_run, tmp_path):
    """`launch/tpu_train.py` killed (SIGKILL) while checkpoint 2 is being written, after logging
    iteration 2: the same command resumes from checkpoint 1, and metrics.jsonl and TensorBoard end
    up as the uninterrupted run's (iteration 2 logged once, not twice)."""
    from scripts.fault_trials import compare, wait_for_checkpoint_write

    ref, _ = ppo_run
    wd = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "launch" / "tpu_train.py"), "--config", "tiny_cpu.py", "--workdir", str(wd),
           "--quiet", *FAST]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_checkpoint_write(wd, 2, p, timeout=600), p.stderr.read()[-3000:]
        p.kill()
    finally:
        p.wait(timeout=120)
    assert p.returncode == -9
    rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert max(r["step"] for r in rows) == 2  # logged before its checkpoint
    assert sorted(p.name for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]  # 2: half-written
    # The same command again, in this process (launch/tpu_train.py's `main`, the script's code without a
    # second interpreter's imports and tokenizer): it reads only what the killed process left on disk.
    from launch import tpu_train

    assert tpu_train.main(cmd[2:]) == 0
    assert compare(wd, ref) is None


def test_bad_model_files_and_a_missing_shard_fail_in_one_line_and_create_nothing(ppo_run, tmp_path, capsys,
                                                                                  monkeypatch):
    """launch/tpu_train.py on a truncated .gguf, safetensors whose shapes contradict config.json, a
    config.json of an unknown model type, and a checkpoint missing a shard: exit 2, one line naming the
    file and what is wrong, no run directory (and no GGUF cache entry) created."""
    import shutil

    from flax import nnx

    from launch import tpu_train
    from ragen_jax.models import Qwen2, Qwen2Config, save_pretrained
    from ragen_jax.models.gguf import write_gguf
    from scripts.export_fixtures import byte_tokenizer

    monkeypatch.setenv("RAGEN_JAX_CACHE", str(tmp_path / "cache"))
    small = Qwen2(Qwen2Config(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1), nnx.Rngs(0))
    gguf_file = write_gguf(small, byte_tokenizer(), tmp_path / "cut.gguf")
    gguf_file.write_bytes(gguf_file.read_bytes()[:-100])
    save_pretrained(small, str(tmp_path / "shapes"))
    cfg = json.loads((tmp_path / "shapes" / "config.json").read_text())
    (tmp_path / "shapes" / "config.json").write_text(json.dumps({**cfg, "hidden_size": 32}))
    (tmp_path / "mamba").mkdir()
    (tmp_path / "mamba" / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    cases = {tmp_path / "cut.gguf": "cut.gguf is a truncated",
             tmp_path / "shapes": "model.safetensors: weight 'model.embed_tokens.weight' has shape (256, 16), expected",
             tmp_path / "mamba": "config.json: model_type 'mamba' is not supported"}
    for path, message in cases.items():
        wd = tmp_path / "run"
        capsys.readouterr()
        rc = tpu_train.main(["--config", "tiny_cpu.py", "--workdir", str(wd), "--quiet", *FAST,
                             "--config.model.random_init=false", "--config.model.vocab=full", f"--config.model.path={path}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and message in err[0], (path, err)
        assert not wd.exists() and not (tmp_path / "cache" / "gguf").exists()  # (the tokenizer's cache may be built)
    # A checkpoint missing one of its files: the resumed run names it.
    wd = tmp_path / "copy"
    shutil.copytree(ppo_run[0], wd)
    shard = max((f for f in (wd / "checkpoints" / "3").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    shard.unlink()
    before = sorted(str(p) for p in wd.rglob("*"))
    capsys.readouterr()
    assert tpu_train.main(["--config", "tiny_cpu.py", "--workdir", str(wd), "--quiet", *FAST,
                           "--config.train.iterations=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoints/3 cannot be restored" in err[0], err
    assert sorted(str(p) for p in wd.rglob("*")) == before  # nothing written
