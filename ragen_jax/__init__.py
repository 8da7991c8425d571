"""ragen-jax: RAGEN / StarPO multi-turn agent RL in JAX."""
