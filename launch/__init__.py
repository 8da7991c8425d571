"""Stage 10, entry points: command-line programs run as `python launch/<name>.py` (README).

tpu_train.py (StarPO RL), sft.py (warm start), eval.py (evaluation), generate.py (sampling),
demo.py (the CPU demo). Each imports only installed packages (ragen_jax, envs_jax); none is a library.
"""
