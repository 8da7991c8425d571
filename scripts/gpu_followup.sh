#!/usr/bin/env bash
# A second, shorter GPU call after scripts/gpu_check.sh: the 3B fit at the setting that meets its target, the
# rollout/trainer dtype variants of the 0.5B iteration (issue 33's mismatch), and the 3B fit at 8-row
# micro-batches with the GPU's own memory estimate. Each in its own process with its own limit.
# On the H100 (2026-11-26) the float32 iterations were still compiling at 120 s: they now get 200 s, so the
# whole call needs timeout_s ~560 (a fresh machine's start comes on top).
set -u
OUT="${OUT:-/tmp/gpu_followup_out}"; mkdir -p "$OUT"
run() {  # name, seconds, flags...
  local name=$1 secs=$2; shift 2
  OUT="$OUT/$name" timeout "$secs" bash scripts/gpu_check.sh "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$?"; grep -v "Loading weights" "$OUT/$name.log" | tail -3 | cut -c1-1500
  cp "$OUT/$name/gpu_check.json" "$OUT/$name.json" 2>/dev/null; rm -rf "$OUT/$name"
}
run fit_mb4 110 --parts fit_3b --fit-setting after-mb4
run iter_f32 200 --parts environment,iteration --iteration-set model.dtype=float32
run iter_f32_rollout_bf16 200 --parts environment,iteration --iteration-set model.dtype=float32 --iteration-set rollout.matmul_dtype=bfloat16
run fit_mb8 60 --parts fit_3b --fit-setting after
