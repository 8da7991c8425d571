"""scripts/env_run.py's argument checks: each bad input is refused with one sentence (exit 2) before
any model is built, and a good command line gives the two stage configs of the named environment."""

from __future__ import annotations

import os

import pytest

from scripts import env_run


@pytest.mark.parametrize("argv,message", [
    (["--env", "NoSuchEnv"], "is not a registered environment with a teacher"),
    (["--env", "Countdown", "--eval-states", "0"], "--eval-states must be a positive integer"),
    (["--env", "Countdown", "nonsense"], "overrides look like section.key=value"),
    (["--env", "Countdown", "prompt.max_turns=0"], "max_turns must be a positive integer"),
])
def test_bad_arguments_are_refused_in_one_sentence(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        env_run.parse([*argv, "--out", str(tmp_path / "run")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing written


def test_finished_run_is_refused_and_settings_reach_both_stages(tmp_path, capsys):
    args, sft_cfg, rl_cfg = env_run.parse(["--env", "SimpleSudoku", "--out", str(tmp_path), "train.iterations=3"])
    assert sft_cfg.env.name == rl_cfg.env.name == "SimpleSudoku"
    assert rl_cfg.env.overrides == {"grid_size": 4} and rl_cfg.train.iterations == 3
    assert rl_cfg.model.init_from == os.path.join(str(tmp_path), "sft") and not sft_cfg.model.init_from
    (tmp_path / "result.json").write_text("{}")
    with pytest.raises(SystemExit):
        env_run.parse(["--env", "SimpleSudoku", "--out", str(tmp_path)])
    assert "already holds a finished run" in capsys.readouterr().err
