# The environment of a lent-GPU call, sourced by scripts/gpu_check.sh and scripts/gpu_learn.sh (with their
# arguments: "$@"). Needs OUT and PY set; fails the call (exit 3) when the carried wheels do not install.
# 1. The pure-Python wheels the GPU image lacks (.whl/: bench/README.md "Lent GPU check") into /tmp/site.
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "$(basename "$0"): installing the carried wheels (.whl/) failed" >&2; exit 3; }
  export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The allocator keeps JAX's default, one preallocated pool (now 95% of the card: the 3B update's target is
# 70 GiB). Without preallocation (PREALLOCATE=false, gpu_check.sh's setting until 2026-11-27) the pool grows
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
