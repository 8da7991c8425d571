"""ragen-jax: RAGEN / StarPO multi-turn agent RL in JAX.

Stages, in the order data flows (each imports only from those before it; docs/design.md): runtime (0),
text (1), models (2), rollout (3), algorithms (4), infra (5), experiment (6), evaluation (7),
trainer (8), recipes (9). The environments are the separate package `envs_jax` (stage 0).
"""
