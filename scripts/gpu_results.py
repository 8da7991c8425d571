"""Turn a lent GPU's `bench/gpu_check.py` JSON into bench/results/gpu_<device>.json for docs/benchmarks.md.

    python -m scripts.gpu_results /work/.device/<files_at>          # the run's fetched $OUT folder
    python -m scripts.gpu_results path/to/gpu_check.json --out-dir bench/results
    python scripts/readme_results.py                                   # then regenerate docs/benchmarks.md and the README

The file keeps every number the run wrote (`parts`) and adds `summary`: the few numbers the tables
table shows, each taken from one part (None where that part failed or was skipped; `errors` names
why). A CPU rehearsal (`--cpu-rehearsal`) is accepted and written as gpu_cpu-rehearsal.json, marked as
such in the table: it proves the pipeline, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
RAW_NAME = "gpu_check.json"
GIB = 2**30


def _get(parts: dict, part: str, *keys):
    v = parts.get(part) or {}
    for k in keys:
        if not isinstance(v, dict):
            return None
        v = v.get(k)
    return v


def _gib(n):
    return None if n is None else n / GIB


def summary(raw: dict) -> dict:
    """The generated tables' numbers of one run (see the module docstring)."""
    p = raw.get("parts") or {}
    it = p.get("iteration") or {}
    return {
        "device_kind": _get(p, "environment", "device_kind"),
        "rehearsal": bool(raw.get("rehearsal")),
        "copy_gb_s": _get(p, "environment", "copy_gb_s"),
        "bf16_matmul_tflops": _get(p, "environment", "bf16_matmul_tflops"),
        "bf16_logits_rel_err": _get(p, "parity", "bf16_vs_f32", "logits_rel_err"),
        "bf16_greedy_logprob_max_abs": _get(p, "parity", "bf16_vs_f32", "greedy_logprob_max_abs"),
        "transformers_logits_rel_err": _get(p, "parity", "ours_vs_transformers_f32", "logits_rel_err"),
        "cudnn_out_rel_err": _get(p, "attention", "cudnn", "out_rel_err"),
        "cudnn_dq_rel_err": _get(p, "attention", "cudnn", "dq_rel_err"),
        "chunked_out_rel_err": _get(p, "attention", "chunked", "out_rel_err"),
        "chunked_dq_rel_err": _get(p, "attention", "chunked", "dq_rel_err"),
        "iteration_preset": it.get("preset"),
        "rollout_s": it.get("rollout_s"), "prepare_s": it.get("prepare_s"), "update_s": it.get("update_s"),
        "rollout_tokens_per_s": it.get("rollout_tokens_per_s"),
        "rollout_bound_tokens_per_s": it.get("rollout_decode_bound_tokens_per_s"),
        "update_mfu": it.get("update_mfu_vs_measured_matmul"),
        "iteration_peak_gib": _gib(it.get("peak_bytes_in_use")),
        "iteration_estimate_gib": _gib(it.get("estimate_max_total_bytes")),
        "iteration_peak_is_own": it.get("peak_rose"),
        "rollout_before_s": it.get("rollout_before_s"),
        "rollout_fraction_of_filled_bound": it.get("rollout_fraction_of_filled_bound"),
        **_decode_summary(p.get("decode") or {}),
        "fit_3b_peak_gib": _gib(_get(p, "fit_3b", "peak_bytes_in_use")),
        "fit_3b_estimate_gib": _gib(_get(p, "fit_3b", "estimate_program_bytes")),
        "fit_3b_fits": _get(p, "fit_3b", "fits"),
        "fit_3b_peak_is_own": _get(p, "fit_3b", "peak_rose"),
        "errors": {k: (v.get("error") or v.get("skipped")) for k, v in p.items()
                   if isinstance(v, dict) and (v.get("error") or v.get("skipped"))},
    }


def _decode_summary(d: dict) -> dict:
    """Decode tokens/s and fraction of its bound at the cache's whole capacity (the bound of runs before
    issue 45 charged every step for the whole cache); with fills (issue 45 on), also the step time
    reading the filled slots vs the whole capacity at the smallest fill."""
    if "fills" not in d:
        return {"decode_tokens_per_s": d.get("decode_tokens_per_s"), "decode_fraction_of_bound": d.get("fraction_of_bound")}
    rows = sorted(d["fills"], key=lambda r: r["fill"])
    full, low = rows[-1], rows[0]
    return {"decode_tokens_per_s": d["batch"] * 1e3 / full["bounded_step_ms"],
            "decode_fraction_of_bound": full.get("fraction_of_filled_bound"),
            "decode_low_fill": low["fill"], "decode_low_fill_step_ms": low["bounded_step_ms"],
            "decode_low_fill_full_over_bounded": low["full_over_bounded"],
            "decode_low_fill_fraction_of_bound": low.get("fraction_of_filled_bound")}


def slug(raw: dict) -> str:
    if raw.get("rehearsal"):
        return "cpu-rehearsal"
    kind = _get(raw.get("parts") or {}, "environment", "device_kind") or "unknown"
    return re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_") or "unknown"


def read_raw(src: Path) -> dict:
    """The run's JSON from a file or from the folder its $OUT came back in; one sentence when it is not one."""
    path = src / RAW_NAME if src.is_dir() else src
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist; pass the gpu_check JSON or the folder holding {RAW_NAME}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"error: {path} is not JSON ({e}); pass the file bench/gpu_check.py wrote") from None
    if not isinstance(raw, dict) or "parts" not in raw:
        raise SystemExit(f"error: {path} has no 'parts'; it is not a bench/gpu_check.py result")
    return raw


def convert(raw: dict, out_dir: Path) -> Path:
    out = {**raw, "summary": summary(raw)}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"gpu_{slug(raw)}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", help=f"the gpu_check JSON, or the folder holding {RAW_NAME} (the run's files_at)")
    p.add_argument("--out-dir", default=str(RESULTS))
    args = p.parse_args(argv)
    path = convert(read_raw(Path(args.src)), Path(args.out_dir))
    print(f"wrote {path}; now run: python scripts/readme_results.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
