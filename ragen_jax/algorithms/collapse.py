"""Reasoning-collapse diagnostics (RAGEN-2's mutual information between prompt and reasoning): pure jnp.

Inputs are the teacher-forced log-probabilities of M sampled reasonings z_i (the first turn's
tokens between `<think>` and `</think>`) under each of the P prompts x_j of a rollout batch:
`logp [M, P]` = log p(z_i | x_j) summed over z_i's tokens, with `n_tokens [M]` (|z_i|) and
`col [M]` (the group whose prompt z_i was sampled from). Columns whose group has no sampled pair
are left out (`col_valid [P]`): N = number of valid columns, so the prompt distribution is the
batch's empirical (uniform) one over the prompts that were sampled, as RAGEN. Rows that are padding
(fewer valid reasonings than M) have `row_valid` False. `same_prompt [P, P]` marks columns whose
prompts are identical token for token (two groups with the same initial state): retrieval counts any
of them as correct and the chance level counts them all (RAGEN's prompt signatures).

Estimates (means over valid rows; per-sequence on the summed log-probs, per-token on the log-probs
divided by |z_i|, as RAGEN's `*_seq_est` and `*_est` metrics):
    matched_i  = logp[i, col_i]                       log p(z_i | x_i)
    marginal_i = logsumexp_j logp[i, j] - log N       log p_mix(z_i), p_mix = mean_j p(z | x_j)
    MI         = mean(matched - marginal)             <= log N (the upper bound, logged)
    H(Z|X)     = -mean(matched)     H(Z) = -mean(marginal)
    retrieval  = mean_i [argmax_j logp[i, j] has x_i's prompt] (ties: the first column, torch.argmax),
                 chance = mean_i (#columns with x_i's prompt) / N
A policy whose reasoning depends on the prompt has MI near log N and retrieval near 1; one that
ignores the prompt has MI near 0 and retrieval at chance. The per-token marginal is a logsumexp of
per-token means (RAGEN's), not the per-token log of the sequence mixture.

Keys (under collapse/, RAGEN's names; RAGEN prefixes them collapse_first_turn_sample/):
mi_estimate (per token), mi_seq_estimate, mi_upper_bound, conditional_entropy_est /
conditional_entropy_seq_est, reasoning_entropy_est / reasoning_entropy_seq_est (the marginal
entropy H(Z)), matched_log_prob_mean, marginal_log_prob_mean, retrieval_accuracy,
retrieval_chance_level, retrieval_above_chance, marginal_std, mi_zscore, num_pairs, num_prompts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

STD_EPS = 1e-3  # RAGEN collapse_detection.std_eps: the z-score denominator's floor


def _mean(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(w, x, 0.0)) / jnp.maximum(jnp.sum(w), 1)


def matched_and_marginal(logp: jax.Array, col: jax.Array, col_valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[M, P] log-probs -> (matched [M], marginal [M]) over the valid columns."""
    n = jnp.maximum(jnp.sum(col_valid), 1).astype(jnp.float32)
    matched = jnp.take_along_axis(logp, col[:, None], axis=1)[:, 0]
    masked = jnp.where(col_valid[None, :], logp, -jnp.inf)
    marginal = jax.nn.logsumexp(masked, axis=1) - jnp.log(n)
    return matched, marginal


def retrieval(logp: jax.Array, col: jax.Array, row_valid: jax.Array, col_valid: jax.Array,
              same_prompt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(top-1 retrieval accuracy, chance level) over valid rows and columns."""
    n = jnp.maximum(jnp.sum(col_valid), 1).astype(jnp.float32)
    pred = jnp.argmax(jnp.where(col_valid[None, :], logp, -jnp.inf), axis=1)  # first maximum on ties
    hit = same_prompt[pred, col]
    chance = jnp.sum(same_prompt[col] & col_valid[None, :], axis=1) / n
    return _mean(hit.astype(jnp.float32), row_valid), _mean(chance, row_valid)


def collapse_metrics(logp: jax.Array, n_tokens: jax.Array, col: jax.Array, row_valid: jax.Array,
                     col_valid: jax.Array, same_prompt: jax.Array | None = None) -> dict:
    """The collapse/ metrics of one [M, P] log-prob matrix (see the module docstring)."""
    logp = logp.astype(jnp.float32)
    m, p = logp.shape
    col = col.astype(jnp.int32)
    row_valid = row_valid.astype(bool)
    col_valid = col_valid.astype(bool)
    if same_prompt is None:
        same_prompt = jnp.eye(p, dtype=bool)
    per_tok = logp / jnp.maximum(n_tokens.astype(jnp.float32), 1.0)[:, None]
    matched_s, marginal_s = matched_and_marginal(logp, col, col_valid)
    matched_t, marginal_t = matched_and_marginal(per_tok, col, col_valid)
    n = jnp.sum(col_valid).astype(jnp.float32)
    acc, chance = retrieval(per_tok, col, row_valid, col_valid, same_prompt)
    mean_mt, mean_gt = _mean(matched_t, row_valid), _mean(marginal_t, row_valid)
    mean_ms, mean_gs = _mean(matched_s, row_valid), _mean(marginal_s, row_valid)
    marginal_std = jnp.sqrt(_mean(jnp.square(marginal_t - mean_gt), row_valid))  # ddof 0, as RAGEN
    return {
        "collapse/mi_estimate": mean_mt - mean_gt,
        "collapse/mi_seq_estimate": mean_ms - mean_gs,
        "collapse/mi_upper_bound": jnp.log(jnp.maximum(n, 1.0)),
        "collapse/conditional_entropy_est": -mean_mt,
        "collapse/conditional_entropy_seq_est": -mean_ms,
        "collapse/reasoning_entropy_est": -mean_gt,
        "collapse/reasoning_entropy_seq_est": -mean_gs,
        "collapse/matched_log_prob_mean": mean_mt,
        "collapse/marginal_log_prob_mean": mean_gt,
        "collapse/retrieval_accuracy": acc,
        "collapse/retrieval_chance_level": chance,
        "collapse/retrieval_above_chance": acc - chance,
        "collapse/marginal_std": marginal_std,
        "collapse/mi_zscore": _mean((matched_t - marginal_t) / (marginal_std + STD_EPS), row_valid),
        "collapse/num_pairs": jnp.sum(row_valid).astype(jnp.float32),
        "collapse/num_prompts": n,
    }


__all__ = ["STD_EPS", "collapse_metrics", "matched_and_marginal", "retrieval"]
