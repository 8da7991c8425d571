"""Model zoo: currently the Qwen2 / Qwen2.5 family."""

from ragen_jax.models.qwen2 import *  # noqa: F401,F403
from ragen_jax.models.qwen2 import __all__  # noqa: F401
