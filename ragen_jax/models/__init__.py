"""Model zoo: one decoder for the qwen2, llama and qwen3 families."""

from ragen_jax.models.qwen2 import *  # noqa: F401,F403
from ragen_jax.models.qwen2 import __all__  # noqa: F401
