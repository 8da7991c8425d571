"""What machine a result was measured on: results differ between CPUs of the same platform."""

from __future__ import annotations


def cpu_model() -> str:
    """The CPU's model name from Linux /proc/cpuinfo ("" where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


__all__ = ["cpu_model"]
