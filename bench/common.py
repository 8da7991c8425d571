"""What the benchmark scripts share: the machine description and the result file writer."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import jax
from ragen_jax.infra.machine import cpu_model


def machine() -> dict:
    """The machine a result was measured on; the load average says how shared it was."""
    d = jax.devices()[0]
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": f"{d.platform}:{getattr(d, 'device_kind', '')}",
        "device_count": jax.device_count(),
        "loadavg_start": list(os.getloadavg()),
    }


def read_result(path) -> dict:
    """The result file's rows so far (a rerun replaces its own rows by tag), with this machine."""
    out = Path(path)
    result = json.loads(out.read_text()) if out.exists() else {"rows": []}
    result["machine"] = machine()
    return result


def write_result(result: dict, path) -> None:
    """Write the JSON result (called after every row, so a run cut short keeps its rows)."""
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
