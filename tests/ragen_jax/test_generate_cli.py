"""`python launch/generate.py`: prints transformers' greedy continuation, loads directories, fails with one clear line."""

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flax import nnx

from ragen_jax.models import Qwen2, Qwen2Config, save_pretrained
from ragen_jax.text.tokenizer import load_tokenizer
from tests.ragen_jax import ref_generate

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "generate.py"
_spec = importlib.util.spec_from_file_location("launch_generate", SCRIPT)
cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli)

ARGS = ["--prompt", ref_generate.PROMPT, "--max-new-tokens", str(ref_generate.NEW_TOKENS), "--greedy"]
STORED = json.loads(ref_generate.FIXTURE.read_text())


def _run(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def tiny_output():
    # In this process: a second Python process would only add its imports (its decode program is the
    # same); the script itself runs as a process in test_missing_directory_is_one_line_exit_2.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["--model", "tiny", *ARGS]) == 0
    return out.getvalue()


def test_tiny_prints_transformers_continuation(tiny_output):
    """The printed continuation is transformers' greedy one on the same weights (stored ids; the tiny
    random model mostly repeats the last token, then switches at step 7)."""
    assert len(set(STORED["ids"])) > 1 and STORED["margin"] > 1e-3  # not a copy; no near-tie decides it
    assert tiny_output == load_tokenizer().decode(STORED["ids"], skip_special_tokens=False) + "\n"


def test_the_stored_continuation_is_transformers_under_torch():
    pytest.importorskip("torch")  # CI without torch checks the stored ids above
    live = ref_generate.transformers_continuation()
    assert (live["prompt_ids"], live["ids"]) == (STORED["prompt_ids"], STORED["ids"])


def test_directory_model_matches_preset(tiny_output, tmp_path, capsys):
    # `--model tiny` is Qwen2(tiny, Rngs(0)); the same weights saved to a directory must decode the same.
    save_pretrained(Qwen2(Qwen2Config.from_preset("tiny"), nnx.Rngs(0)), str(tmp_path))
    assert cli.main(["--model", str(tmp_path), *ARGS]) == 0
    assert capsys.readouterr().out == tiny_output


def test_missing_directory_is_one_line_exit_2(tmp_path):
    r = _run("--model", str(tmp_path / "nope"), "--prompt", "hi")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope" in lines[0] and "Traceback" not in r.stderr


def test_directory_without_config_is_exit_2(tmp_path, capsys):
    assert cli.main(["--model", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json" in err
