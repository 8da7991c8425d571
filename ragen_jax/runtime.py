"""Process set-up for the launchers: glibc malloc in transparent-huge-page mode.

XLA on CPU allocates its large temporaries (attention scores, activations: tens of MB per step)
with malloc, which serves them by fresh `mmap`s and returns them on free. Every step then faults
its memory back in, 4 KiB at a time: the CPU demo took 197 million minor page faults, a third of
its CPU time in the kernel. glibc >= 2.35 can ask for transparent huge pages instead
(`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`): 644 faults per SFT step instead of 71,869, and the
step 1.7x faster (bench/sft_step.py, docs/benchmarks.md "SFT step"); the whole demo 10.0 min instead of 11.9
(its RL update got slower, 4.4 s per iteration instead of 3.2: not investigated). The tunable is
read when the process starts, so the launchers re-execute themselves once with it set, before jax
is imported.

Nothing changes when the kernel has THP off ("never") or already on for all memory ("always"),
on non-glibc systems, or when RAGEN_JAX_HUGEPAGES=0.
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
OPT_OUT = "RAGEN_JAX_HUGEPAGES"


def glibc_at_least(major: int, minor: int) -> bool:
    lib, version = platform.libc_ver()
    if lib != "glibc":
        return False
    try:
        got = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return got >= (major, minor)


def _thp_mode() -> str | None:
    """The bracketed choice of the kernel's THP setting ("always", "madvise", "never"), or None."""
    try:
        text = open(THP_SETTING).read()
    except OSError:
        return None
    if "[" not in text:
        return None
    return text.split("[", 1)[1].split("]", 1)[0]


def hugepage_env(environ=None) -> dict | None:
    """The environment to re-execute with, or None when there is nothing to gain (see module doc)."""
    env = dict(os.environ if environ is None else environ)
    if env.get(OPT_OUT, "1") == "0" or sys.platform != "linux":
        return None
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:  # already set (by us or the user): never loops
        return None
    if _thp_mode() != "madvise" or not glibc_at_least(2, 35):
        return None
    env["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}" if tunables else TUNABLE
    return env


def use_transparent_hugepages() -> None:
    """Re-execute this Python process (same interpreter, flags and arguments) with malloc's
    huge-page mode, if it helps here; otherwise return. Call it first thing in a launcher's
    `__main__`, before importing jax."""
    env = hugepage_env()
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


__all__ = ["hugepage_env", "use_transparent_hugepages"]
