"""ragen_jax/runtime.py: when the launchers re-execute with glibc malloc's huge-page mode, and that
the re-executed process keeps its interpreter flags and arguments and does not loop."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ragen_jax import runtime


@pytest.fixture
def thp_machine(monkeypatch):
    monkeypatch.setattr(runtime.sys, "platform", "linux")
    monkeypatch.setattr(runtime, "_thp_mode", lambda: "madvise")
    monkeypatch.setattr(runtime, "glibc_at_least", lambda *v: True)


def test_sets_the_tunable_and_keeps_other_tunables(thp_machine):
    assert runtime.hugepage_env({"PATH": "/bin"})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    env = runtime.hugepage_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("environ", [
    {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"},  # the user chose: respected, and no exec loop
    {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    {"RAGEN_JAX_HUGEPAGES": "0"},
])
def test_no_reexec_when_set_or_opted_out(thp_machine, environ):
    assert runtime.hugepage_env(environ) is None


@pytest.mark.parametrize("mode", ["always", "never", None])
def test_no_reexec_unless_thp_is_madvise(monkeypatch, thp_machine, mode):
    monkeypatch.setattr(runtime, "_thp_mode", lambda: mode)
    assert runtime.hugepage_env({}) is None


def test_no_reexec_on_old_or_other_libc(monkeypatch, thp_machine):
    monkeypatch.setattr(runtime, "glibc_at_least", lambda *v: False)
    assert runtime.hugepage_env({}) is None
    monkeypatch.undo()
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("glibc", "2.31"))
    assert runtime.glibc_at_least(2, 35) is False
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("glibc", "2.36"))
    assert runtime.glibc_at_least(2, 35) is True
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("", ""))
    assert runtime.glibc_at_least(2, 35) is False


def test_reexec_keeps_flags_and_arguments(tmp_path):
    # A real process: what this machine decides (hugepage_env) is what the child must see.
    script = tmp_path / "launcher.py"
    script.write_text(
        "import json, os, sys\n"
        "from ragen_jax.runtime import use_transparent_hugepages\n"
        "use_transparent_hugepages()\n"
        "print(json.dumps({'tunables': os.environ.get('GLIBC_TUNABLES'), 'argv': sys.argv[1:],\n"
        "                  'optimize': sys.flags.optimize}))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("GLIBC_TUNABLES", "RAGEN_JAX_HUGEPAGES")}
    out = subprocess.run([sys.executable, "-O", str(script), "--a", "b c"], env=env, capture_output=True,
                         text=True, check=True).stdout
    got = json.loads(out)  # one line: the process ran its body once
    want = runtime.hugepage_env(env)
    assert got["tunables"] == (None if want is None else want["GLIBC_TUNABLES"])
    assert got["argv"] == ["--a", "b c"] and got["optimize"] == 1
