"""ragen-jax: RAGEN / StarPO multi-turn agent RL in JAX.

Stages, in the order data flows (each imports only from those before it; docs/design.md): runtime (0),
text (1), models (2), rollout (3), algorithms (4), infra (5), experiment (6), evaluation (7),
trainer (8), recipes (9). The environments are the separate package `envs_jax` (stage 0).
"""

import os as _os

# transformers advises "PyTorch was not found..." on its first import: ragen-jax uses only its tokenizers
# (torch is an optional extra for benchmarks and export checks), so on every command that line is noise,
# and a second stderr line where an error is promised as one sentence. Set before anything imports it.
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
