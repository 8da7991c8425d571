"""Stage 4, training math: advantages, losses, the StarPO-S rollout filter, collapse metrics (pure jnp
functions; the names below are the public API)."""

from ragen_jax.algorithms.advantages import (
    ESTIMATORS, NORMALIZATIONS, TOKEN_REWARD_MODES, Estimator, EstimatorInputs, bilevel_gae, compute_advantages,
    drgrpo, gae, get_estimator, get_normalization, grpo, last_token_index, masked_mean, normalize_rewards,
    register_estimator, rloo, token_rewards, whiten)
# Estimators registered where they are defined: importing the module registers its record.
from ragen_jax.algorithms.gigpo import GiGPOOptions
from ragen_jax.algorithms.filters import (
    GroupFilter, filter_groups, filter_groups_variance_cover, gather_rows, group_reward_stats,
    num_kept_groups)
from ragen_jax.algorithms.losses import (
    KL_ESTIMATORS, LOSS_AGG_MODES, agg_loss, entropy_from_logits, entropy_loss, get_kl_estimator,
    kl_in_reward, kl_loss, kl_penalty, logprobs_from_logits, ppo_policy_loss, token_logprobs_and_entropy,
    value_loss)

__all__ = [
    "ESTIMATORS", "KL_ESTIMATORS", "LOSS_AGG_MODES", "NORMALIZATIONS", "TOKEN_REWARD_MODES",
    "Estimator", "EstimatorInputs", "GiGPOOptions", "GroupFilter", "agg_loss", "bilevel_gae", "compute_advantages", "drgrpo", "entropy_from_logits",
    "entropy_loss", "filter_groups", "filter_groups_variance_cover", "gae", "gather_rows", "get_estimator",
    "get_kl_estimator", "get_normalization", "group_reward_stats", "grpo", "kl_in_reward", "kl_loss",
    "kl_penalty", "last_token_index", "logprobs_from_logits", "masked_mean", "normalize_rewards",
    "num_kept_groups", "ppo_policy_loss", "register_estimator", "rloo", "token_logprobs_and_entropy", "token_rewards",
    "value_loss", "whiten",
]
