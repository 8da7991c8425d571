"""The QLoRA benches refuse a model they cannot load with one line and exit 2, before anything compiles."""

import pytest

from bench import qlora_greedy, qlora_speed


@pytest.mark.parametrize("bench", [qlora_greedy, qlora_speed], ids=["greedy", "speed"])
def test_a_missing_model_is_one_line_and_exit_2(bench, tmp_path, capsys):
    missing = tmp_path / "absent.gguf"
    assert bench.main(["--model", str(missing), "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(missing) in err[0], err
    assert "pip install" not in err[0]  # the package hint is for the default model only
    assert not (tmp_path / "out.json").exists()
