"""The suite's xdist scheduler (tests/conftest.py) on a toy suite run in a subprocess: a worker that dies
(killed, or stopped by pytest-timeout for hanging) fails its test once, the test is not run again, and
every other test, including the rest of the dead worker's fixture group, still runs."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TOY = '''
import os, time, pytest

@pytest.fixture(scope="module")
def shared():
    return 1

def test_a1(shared): time.sleep(1)
def test_crashes(shared): os._exit(1)
def test_a3(shared): pass
def test_a4(shared): pass
'''
TOY_HANG = '''
import time
def test_hangs(): time.sleep(600)
def test_after(): pass
def test_b(): pass
'''


def test_dead_workers_fail_their_test_once_and_the_rest_runs(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(Path(__file__).with_name("conftest.py"), tests / "conftest.py")
    (tests / "test_toy_a.py").write_text(TOY)
    (tests / "test_toy_b.py").write_text(TOY_HANG)
    shutil.copy(Path(__file__).parents[1] / "pytest.ini", tmp_path / "pytest.ini")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RAGEN_JAX_TEST_"))}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=5", "-rf"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    ).stdout
    failed = sorted(re.findall(r"^FAILED (\S+)", out, re.M))
    assert failed == ["tests/test_toy_a.py::test_crashes", "tests/test_toy_b.py::test_hangs"], out
    assert re.search(r"\b2 failed, 5 passed\b", out), out


def test_units_expected_to_take_longest_start_first(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(Path(__file__).with_name("conftest.py"), tests / "conftest.py")
    shutil.copy(Path(__file__).parents[1] / "pytest.ini", tmp_path / "pytest.ini")
    for i in range(1, 7):
        (tests / f"test_f{i}.py").write_text(f"def test_t{i}(): pass\n")
    (tests / "durations.json").write_text('{"tests/test_f5.py::test_t5": 50, "tests/test_f3.py::test_t3": 40}')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RAGEN_JAX_TEST_"))}
    out = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "1"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240).stdout
    order = re.findall(r"PASSED tests/test_f(\d)\.py", out)
    assert order == ["5", "3", "1", "2", "4", "6"], out
