"""What machine a result was measured on: results differ between CPUs of the same platform."""

from __future__ import annotations

from pathlib import Path


def _first_processor(cpuinfo: str | None) -> dict:
    """The first processor's "key: value" fields of Linux /proc/cpuinfo ({} where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    fields = {}
    for line in cpuinfo.splitlines():
        if ":" in line:
            k, v = (s.strip() for s in line.split(":", 1))
            fields.setdefault(k, v)
        elif not line.strip() and fields:
            break  # the first processor's block is enough
    return fields


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name from Linux /proc/cpuinfo ("" where it cannot be read)."""
    return _first_processor(cpuinfo).get("model name", "")


def cpu_class(cpuinfo: str | None = None) -> str:
    """"<model name> (family F, model M)" from Linux /proc/cpuinfo ("" where it cannot be read).

    The model name alone is not enough: KVM guests report "AMD EPYC" for several generations, whose
    instruction sets (and so XLA's kernels and the demo's numbers) differ."""
    fields = _first_processor(cpuinfo)
    name = fields.get("model name", "")
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})".strip()
    return name


__all__ = ["cpu_class", "cpu_model"]
