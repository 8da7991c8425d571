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
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check.sh: installing the carried wheels (.whl/) failed" >&2; exit 3; }
  export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The allocator keeps JAX's default, one preallocated pool (now 95% of the card: the 3B update's target is
# 70 GiB). Without preallocation (PREALLOCATE=false, this script's setting until 2026-11-27) the pool grows
# region by region and freed regions stay as holes: the float32 0.5B update then failed to get its one
# 37.6 GiB temporary block on an 80 GB H100 that the same program fits with the pool (peak 48.6 GiB).
# The peaks stay the programs' own either way: memory_stats' peak_bytes_in_use counts allocated
# buffers, not the pool. Override from the caller's environment to compare.
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-true}" \
  XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
# The CPU rehearsal (CI) only: its programs' speed means nothing and their compile time is most of
# its minute, so XLA optimises less (about a fifth less CPU time).
case " $* " in
  *" --cpu-rehearsal "*)
    export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true" ;;
esac
if command -v nvidia-smi > /dev/null; then nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1; fi
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
