"""Loaded by the two-process launches of tests/multihost (their PYTHONPATH starts here): one
persistent-cache key per program for both processes, so that they share compiled programs.

jax keys its persistent compilation cache partly on `get_topology_for_devices(devices).fingerprint()`,
and XLA:CPU's topology description differs between the processes of one cluster (measured with jax
0.10.2: the same 4-device program got fingerprint 7642... in process 0 and 8852... in process 1; the
compile options are equal once jax clears its debug options). So process 1 never found process 0's
entries, and JAX_SHARE_BINARY_BETWEEN_HOSTS (process 0 compiles, the others load its executable) left
process 1 waiting for a key process 0 never published. With the devices' kinds hashed instead (jax's
own fallback for backends without a topology) the keys are equal, while the program text and the
compile options, device assignment included, still tell programs apart. Test-only: the launchers run
unpatched anywhere else, where the topology is one cluster-wide description (TPU, GPU).

Patched when jax imports the module (a meta-path hook), not here: importing jax in sitecustomize would
cost every launch a second jax import when the launcher re-executes itself with huge pages on.
"""

import importlib.abc
import importlib.util
import sys

_MODULE = "jax._src.cache_key"


class _PatchCacheKey(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module._hash_accelerator_config = module._hash_devices

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchCacheKey())
