#!/usr/bin/env bash
# The lent GPU's one prepared check (bench/README.md "Lent GPU check" has the whole recipe):
#   1. installs the carried pure-Python wheels (.whl/: what the GPU image lacks) into /tmp/site,
#   2. records nvidia-smi, then runs `python -m bench.gpu_check`, which writes $OUT/gpu_check.json
#      after every part (a run cut short still returns what finished).
# Usage (on the GPU, in the repository root):  bash scripts/gpu_check.sh [extra bench.gpu_check flags]
# Rehearsal here:  OUT=/tmp/gpu_out bash scripts/gpu_check.sh --cpu-rehearsal
set -u
OUT="${OUT:-/tmp/gpu_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
# The wheels, allocator settings, rehearsal XLA flags and nvidia-smi record: shared with scripts/gpu_learn.sh.
source scripts/gpu_env.sh
"$PY" -m bench.gpu_check --out "$OUT/gpu_check.json" "$@"
rc=$?
# The reply's tail shows the summary even when the JSON is not fetched.
"$PY" - "$OUT/gpu_check.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"gpu_check.sh: no result JSON ({e})")
for name, part in d.get("parts", {}).items():
    keys = {k: v for k, v in part.items() if not isinstance(v, (dict, list)) and k != "traceback"}
    print(name, json.dumps(keys)[:600])
EOF
exit $rc
