#!/usr/bin/env bash
# The second GPU call of a session, after scripts/gpu_check.sh: what the last session left open, each in its
# own process with its own limit (docs/experiments/accelerators.md, "Second GPU session").
#   f32_highest   the 0.5B float32 iteration with full-precision float32 matmuls: is the float32 sampler/trainer
#                 log-prob gap seen on 2026-11-27 (mean 0.0025, max 0.014; 1.6e-7 on CPU) the GPU's default
#                 TF32 dots?
#   fit_mb8       the 3B GRPO update at 8-row micro-batches (CPU estimate 64.7 GB; 60 s was too short on 11-27)
# On the H100 (2026-11-27) a float32 iteration took 77-81 s to build and compile and 124 s in all: the call
# needs timeout_s ~360 (a fresh machine's start comes on top).
set -u
OUT="${OUT:-/tmp/gpu_followup_out}"; mkdir -p "$OUT"
run() {  # name, seconds, flags...
  local name=$1 secs=$2; shift 2
  OUT="$OUT/$name" timeout "$secs" bash scripts/gpu_check.sh "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$?"; grep -v "Loading weights" "$OUT/$name.log" | tail -3 | cut -c1-1500
  cp "$OUT/$name/gpu_check.json" "$OUT/$name.json" 2>/dev/null; rm -rf "$OUT/$name"
}
JAX_DEFAULT_MATMUL_PRECISION=highest run f32_highest 200 --parts environment,iteration --iteration-set model.dtype=float32
run fit_mb8 120 --parts fit_3b --fit-setting after
