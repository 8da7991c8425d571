"""env.mix end to end: configs/mix_cpu.py trains one tiny-model iteration with per-env metrics in
TensorBoard and a per-env validation set; the mix's config forms (file, command line, saved run) and
its errors, each one sentence before anything compiles."""

from __future__ import annotations

import json
import math
import struct

import pytest

from ragen_jax.experiment.config import ConfigError, config_from_dict, load_config
from ragen_jax.trainer.rl import RESUMABLE_CHANGES, Trainer
from ragen_jax.experiment.build import check_run_dir_config

TINY = ["train.iterations=1", "train.val_every=1", "env.val_set=Sokoban:2,FrozenLake:3", "train.save_every=1",
        "rollout.group_size=2", "batching.mini_batch_size=2", "prompt.max_response_tokens=12", "rollout.max_context=640",
        "train.log_samples=1", "train.collapse_every=1", "train.collapse_samples=4", "mesh.data=1"]
METRICS = ("success", "reward_mean", "format_ok", "num_actions", "in_group_std", "pass_at_n")


def _tb_scalars(run_dir) -> dict[str, list[float]]:
    """Scalars of the run's TensorBoard event files, read from the TFRecord framing and Event protos."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[float]] = {}
    for path in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in ev.summary.value:
                out.setdefault(v.tag, []).append(v.simple_value)
    return out


def test_mix_cpu_one_tiny_iteration(tmp_path):
    cfg = load_config("mix_cpu.py", TINY)
    assert cfg.env.mix == (("Sokoban", 2), ("FrozenLake", 2)) and cfg.rollout.num_groups == 4
    trainer = Trainer(cfg, tmp_path / "run", quiet=True)
    assert type(trainer.text_env).__name__ == "MixedTextEnv" and trainer.text_env.mix == cfg.env.mix
    (h,) = trainer.train()
    for name in ("Sokoban", "FrozenLake"):
        for k in METRICS:
            assert math.isfinite(h[f"train/{name}/{k}"]), (name, k)
    # Equal group counts: the batch's numbers are the mean of the two envs' (an independent relation).
    for k in ("success", "reward_mean", "format_ok", "num_actions"):
        assert h[f"train/{k}"] == pytest.approx((h[f"train/Sokoban/{k}"] + h[f"train/FrozenLake/{k}"]) / 2)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = {k: v for r in rows for k, v in r.items() if k.startswith("val/")}
    # The validation set: each env with its own number of states.
    assert val["val/Sokoban/num_states"] == 2 and val["val/FrozenLake/num_states"] == 3
    tb = _tb_scalars(tmp_path / "run")
    assert "collapse/first_turn_valid_rate" in h  # the reasoning-collapse probe reads mixed rows too
    for tag in ("train/Sokoban/success", "train/FrozenLake/reward_mean", "val/FrozenLake/success", "train/success"):
        assert tag in tb, tag
    assert tb["train/Sokoban/success"][-1] == pytest.approx(h["train/Sokoban/success"])


def test_mix_forms_and_saved_runs(tmp_path):
    a = load_config("mix_cpu.py")
    b = load_config("tiny_cpu.py", ["--config.env.mix=Sokoban:2,FrozenLake:2"])
    c = load_config("tiny_cpu.py", ["env.mix=(('Sokoban', 2), ('FrozenLake', 2))",
                                    "env.overrides.FrozenLake={'success_rate': 1.0}"])
    assert a.env.mix == b.env.mix == c.env.mix == (("Sokoban", 2), ("FrozenLake", 2))
    assert c.env.overrides_for("FrozenLake") == {"success_rate": 1.0} and c.env.overrides_for("Sokoban") == {}
    assert b.env.validation_set(8) == (("Sokoban", 8), ("FrozenLake", 8))
    assert a.env.validation_set(99) == (("Sokoban", 8), ("FrozenLake", 8))
    assert load_config("tiny_cpu.py", ["env.val_envs=FrozenLake"]).env.validation_set(8) == (
        ("Sokoban", 8), ("FrozenLake", 8))  # without a mix: name, then val_envs
    saved = json.loads(json.dumps(a.to_dict(), default=str))
    assert config_from_dict(saved).validate().env.mix == a.env.mix
    (tmp_path / "config.json").write_text(json.dumps(saved))
    check_run_dir_config(tmp_path, a, RESUMABLE_CHANGES)  # the same run resumes
    with pytest.raises(ConfigError, match="env.mix"):
        check_run_dir_config(tmp_path, load_config("mix_cpu.py", ["env.mix=Sokoban:1,FrozenLake:3"]),
                             RESUMABLE_CHANGES)


@pytest.mark.parametrize("overrides, message", [
    (["env.mix=Sokoban:2,FrozenLake:1"], "has 3 groups in all but rollout.num_groups=4"),
    (["env.mix=Sokoban:2,Bandit:2"], "env.mix cannot hold Bandit"),
    (["env.mix=Sokoban:2,Sokobn:2"], "env.mix='Sokobn' is not valid; choose one of"),
    (["env.mix=Sokoban,FrozenLake:2"], "env.mix entry 'Sokoban' needs a count"),
    (["env.mix=Sokoban:2,Sokoban:2"], "env.mix names Sokoban more than once"),
    (["env.mix=Sokoban:2,FrozenLake:2", "env.overrides.Bandit={}"], "'Bandit' is not in the mix"),
    (["env.mix=Sokoban:2,FrozenLake:2", "env.overrides.FrozenLake={'slipp': 0.1}"],
     r"env.overrides\['FrozenLake'\]: unknown parameter"),
    (["env.val_set=Sokoban:4", "env.val_envs=FrozenLake"], "put the env.val_envs FrozenLake into it"),
    (["env.val_set=Sokoban:-4"], "env.val_set entry 'Sokoban:-4': the count must be a positive"),
    (["env.mix=Sokoban:2,FrozenLake:2", "rollout.groups_per_pass=2"], "rollout.groups_per_pass does not work with "
                                                                       "env.mix"),
    (["rollout.groups_per_pass=3"], r"rollout.groups_per_pass must be 0 \(all groups at once\) or a divisor"),
])
def test_bad_mixes_are_one_sentence_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config("tiny_cpu.py", overrides)
    assert "\n" not in str(e.value)


def test_validation_sizes_must_fit_the_mesh(tmp_path):
    cfg = load_config("mix_cpu.py", ["env.val_set=Sokoban:8,FrozenLake:3", "mesh.data=2"])
    with pytest.raises(ConfigError, match="validation size 3 of FrozenLake"):
        Trainer(cfg, tmp_path / "run", quiet=True)
