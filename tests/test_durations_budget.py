"""The suite's time budget stays visible: every test file has an entry in tests/durations.json.

The scheduler (tests/conftest.py) starts the units it expects to take longest first and counts a test
durations.json does not list as 1 s, so a new slow file would start last and run alone at the end,
and nobody would see what a round added to the suite's time. This test fails until the file is
measured and listed.
"""

import json
from pathlib import Path

TESTS = Path(__file__).parent
REFRESH = "RAGEN_JAX_TEST_DURATIONS_OUT=tests/durations.json python -m pytest -q"


def collected_files(tests_dir: Path) -> list[str]:
    """pytest's default test file names (pytest.ini keeps them) under `tests_dir`, as
    'tests/sub/test_x.py': the form durations.json's node ids start with."""
    found = {p for pattern in ("test_*.py", "*_test.py") for p in tests_dir.rglob(pattern)}
    return sorted(f"{tests_dir.name}/{p.relative_to(tests_dir).as_posix()}" for p in found)


def uncovered(tests_dir: Path, durations: dict) -> list[str]:
    """The test files no key of `durations` belongs to (a key is 'path::test')."""
    return [f for f in collected_files(tests_dir) if not any(k.startswith(f + "::") for k in durations)]


def message(files: list[str]) -> str:
    return (
        f"{len(files)} test file(s) without an entry in tests/durations.json: {', '.join(files)}. "
        f"Measure them and refresh the file from a whole run: `{REFRESH}` "
        "(or add the file's tests from `--durations=0` of that file alone, and say so in docs/testing.md)."
    )


def test_every_test_file_has_durations():
    files = uncovered(TESTS, json.loads((TESTS / "durations.json").read_text()))
    assert not files, message(files)


def test_the_check_finds_exactly_the_uncovered_files(tmp_path):
    tests = tmp_path / "tests"
    for rel in ("test_covered.py", "sub/test_uncovered.py", "sub/other_test.py", "sub/helper.py",
                "conftest.py", "sub/test_cov.py", "sub/test_covered_too.py"):
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        (tests / rel).write_text("")
    durations = {
        "tests/test_covered.py::test_a": 1.0,
        "tests/test_covered.py::test_b[1]": 0.0,
        # A key of test_covered_too.py (its name starts with "test_cov") does not cover test_cov.py,
        # nor does a key of another directory's file of the same name cover sub/test_uncovered.py.
        "tests/sub/test_covered_too.py::test_c": 2.0,
        "tests/test_uncovered.py::test_d": 2.0,
    }
    # Written out by hand: the test files are the three names pytest collects that have no key.
    assert uncovered(tests, durations) == ["tests/sub/other_test.py", "tests/sub/test_cov.py",
                                           "tests/sub/test_uncovered.py"]
    assert uncovered(tests, {**durations, "tests/sub/test_cov.py::t": 0.1, "tests/sub/other_test.py::t": 0.1,
                             "tests/sub/test_uncovered.py::t": 0.1}) == []
    msg = message(uncovered(tests, durations))
    assert "tests/sub/test_uncovered.py" in msg and "tests/sub/test_cov.py" in msg
    assert "tests/test_covered.py" not in msg
    assert REFRESH in msg
