#!/usr/bin/env bash
# RAGEN's recipe for SmolLM2-135M-Instruct on a lent GPU, in one call of at most 9 minutes (the learning)
# after one of seconds (the model's first part): docs/experiments/pretrained.md, "SmolLM2 on a lent GPU", has the calls.
#   python -m scripts.gpu_model split      # here, once: .gpu_model/ (parts + manifest) and the exact calls
#   bash scripts/gpu_learn.sh --stage      # device call 1: checks the carried part (sha256)
#   bash scripts/gpu_learn.sh [flags]      # device call 2, at once: joins the parts (sha256 of the whole file),
#                                          # installs the carried wheels (.whl/), runs `python -m scripts.gpu_learn`,
#                                          # which writes $OUT/gpu_learn.json after every stage
# Rehearsal here (CI, tiny shapes):  OUT=/tmp/o GPU_MODEL_DIR=/tmp/m bash scripts/gpu_learn.sh --cpu-rehearsal
# Exit status: 3 when the model is not all there (one sentence says which call to repeat), else gpu_learn's.
set -u
OUT="${OUT:-/tmp/gpu_learn_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
DIR="${GPU_MODEL_DIR:-.gpu_model}"
if [ "${1:-}" = "--stage" ]; then
  PYTHONPATH="$PWD" exec "$PY" -m scripts.gpu_model stage --dir "$DIR"
fi
PYTHONPATH="$PWD" "$PY" -m scripts.gpu_model join --dir "$DIR" || exit 3
source scripts/gpu_env.sh  # wheels, allocator, rehearsal XLA flags, nvidia-smi (as scripts/gpu_check.sh)
MODEL=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["file"])' "$DIR/manifest.json")
"$PY" -m scripts.gpu_learn --model "$DIR/$MODEL" --out "$OUT/gpu_learn.json" "$@"
rc=$?
# The reply's tail shows the outcome even when the JSON is not fetched.
"$PY" - "$OUT/gpu_learn.json" <<'PYEOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"gpu_learn.sh: no result JSON ({e})")
for env, r in d.get("envs", {}).items():
    p = r.get("paired") or {}
    line = f"{env}: {r.get('status')}"
    if p:
        line += (f"; {p['before']:.3f} -> {p['after']:.3f} ({p['change']:+.3f}, 95% CI [{p['ci95'][0]:+.3f}, "
                 f"{p['ci95'][1]:+.3f}]) on {p['states']} x {p['samples_per_state']}, p = {p['p_value']:.2g}; "
                 f"{r['rl']['iterations']} RL iterations")
    print(line)
print(f"total {d.get('total_s', float('nan')):.0f} s")
PYEOF
exit $rc
