"""Test session setup. Runs before jax is imported anywhere in the test process."""

import atexit
import os
import shutil
import tempfile

# 8 simulated CPU devices for the sharding tests; must be set before jax is imported.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Nothing may be downloaded at test time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# Identical programs compiled by different tests (and by both pytest-xdist workers) are compiled
# once: jax's persistent compilation cache works on CPU too. The directory is new for every test
# session and removed at its end (the xdist workers inherit the controller's): with jax 0.10.2 an
# 8-device sharded rollout read back from the cache of an EARLIER session deadlocks in XLA:CPU's
# collectives (half the devices wait at an all-gather, half at a collective-permute;
# test_rollout.py::test_passes_equal_one_pass_rollouts_of_their_groups hung on every second run),
# while the same program compiled afresh runs. Set JAX_COMPILATION_CACHE_DIR to choose a directory.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache_dir = tempfile.mkdtemp(prefix="ragen-jax-test-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
