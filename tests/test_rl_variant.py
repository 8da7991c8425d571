"""scripts/rl_variant.py's command line: every check that needs no model runs before anything is
built or written, and overrides may sit on either side of the options (argparse's plain parser
rejects `a=1 --out X b=2`, which the experiments in docs/experiments/demo.md were first typed as)."""

from __future__ import annotations

import os

import pytest

from scripts import rl_variant


@pytest.fixture
def sft(tmp_path):
    d = tmp_path / "sft"
    (d / "policy").mkdir(parents=True)
    return str(d)


def test_overrides_on_both_sides_of_the_options_all_apply(sft, tmp_path):
    out = tmp_path / "v"
    args, cfg, points, temps = rl_variant.parse(
        ["optim.actor_lr=2e-4", "--family", "frozen_lake", "--sft", sft, "--out", str(out), "train.iterations=7",
         "--eval-at", "3", "rollout.num_groups=16", "--temperatures", "0.5,1"])
    assert cfg.optim.actor_lr == 2e-4 and cfg.train.iterations == 7 and cfg.rollout.num_groups == 16
    assert cfg.model.init_from == os.path.abspath(sft) and cfg.train.val_every == 0
    assert points == [3, 7] and temps == [0.5, 1.0]
    assert args.overrides == ["optim.actor_lr=2e-4", "train.iterations=7", "rollout.num_groups=16"]
    assert args.eval_samples == 1 and not args.greedy  # the published results' protocol by default
    assert not out.exists()
    args, _, _, temps = rl_variant.parse(["--family", "sokoban", "--sft", sft, "--out", str(out), "--greedy",
                                          "--eval-samples", "8", "--temperatures", "0.5,1"])
    assert args.eval_samples == 8 and temps == [0.5]  # greedy: one evaluation per point


@pytest.mark.parametrize("extra, words", [
    (["--temperatures", "0.5,hot"], "--temperatures must be comma-separated numbers"),
    (["--temperatures", "0"], "at least one temperature > 0"),
    (["--eval-at", "0"], "must lie in 1..train.iterations=7"),
    (["--eval-at", "8"], "must lie in 1..train.iterations=7"),
    (["--eval-at", "3,x"], "--eval-at must be comma-separated iteration counts"),
    (["--eval-samples", "0"], "--eval-samples must be a positive integer"),
])
def test_bad_arguments_get_one_sentence_and_write_nothing(sft, tmp_path, capsys, extra, words):
    out = tmp_path / "v"
    with pytest.raises(SystemExit) as e:
        rl_variant.parse(["--family", "frozen_lake", "--sft", sft, "--out", str(out), "train.iterations=7"] + extra)
    assert e.value.code == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_an_sft_directory_without_an_export_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        rl_variant.parse(["--family", "sokoban", "--sft", str(tmp_path), "--out", str(tmp_path / "v")])
    assert "holds no exported policy" in capsys.readouterr().err


def test_an_out_directory_holding_a_variant_is_refused(sft, tmp_path, capsys):
    out = tmp_path / "v"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit):
        rl_variant.parse(["--family", "frozen_lake", "--sft", sft, "--out", str(out)])
    assert "already holds a variant" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == "{}\n"
