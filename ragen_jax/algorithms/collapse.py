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
retrieval_chance_level, retrieval_above_chance, retrieval_accuracy@k / retrieval_chance_level@k /
retrieval_above_chance@k (k = 2, 4, 8), marginal_std, marginal_std_seq (population std of the
per-token / per-sequence marginals), mi_zscore, mi_zscore_seq (mean (matched - marginal) / (std +
1e-3)), num_pairs, num_prompts; with an EMA state: marginal_std_ema, marginal_std_ema_seq,
mi_zscore_ema, mi_zscore_ema_seq (RAGEN's cross-step EMA, decay 0.9, of the marginal stds).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

STD_EPS = 1e-3  # RAGEN collapse_detection.std_eps: the z-score denominator's floor
EMA_DECAY = 0.9  # RAGEN collapse_detection.ema_decay: the cross-step EMA of the marginal stds
RETRIEVAL_KS = (2, 4, 8)  # RAGEN's retrieval_accuracy@k (k_max = min(8, N))


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


def retrieval_at_k(logp: jax.Array, col: jax.Array, row_valid: jax.Array, col_valid: jax.Array,
                   same_prompt: jax.Array, chance: jax.Array, ks=RETRIEVAL_KS) -> dict:
    """RAGEN's top-k retrieval: row i is correct when one of its k_eff = min(k, N) best valid columns
    has x_i's prompt; chance@k = min(1, chance x k_eff). Ranks: descending log-prob, ties by the lower
    column index (torch.topk's tie order is unspecified)."""
    p = logp.shape[1]
    n = jnp.sum(col_valid)
    x = jnp.where(col_valid[None, :], logp, -jnp.inf)
    idx = jnp.arange(p)
    xl, xj = x[:, None, :], x[:, :, None]  # [M, j, l]: does column l rank above column j?
    better = (xl > xj) | ((xl == xj) & (idx[None, None, :] < idx[None, :, None]))
    rank = jnp.sum(better & col_valid[None, None, :], axis=-1)  # [M, P]: rank of column j in row i
    right = same_prompt[col] & col_valid[None, :]  # [M, P]: column j has x_i's prompt
    out = {}
    for k in ks:
        k_eff = jnp.minimum(k, n)
        hit = jnp.any(right & (rank < k_eff), axis=1).astype(jnp.float32)
        acc = _mean(hit, row_valid)
        chance_k = jnp.minimum(1.0, chance * k_eff)
        out[f"collapse/retrieval_accuracy@{k}"] = acc
        out[f"collapse/retrieval_chance_level@{k}"] = chance_k
        out[f"collapse/retrieval_above_chance@{k}"] = acc - chance_k
    return out


def collapse_metrics(logp: jax.Array, n_tokens: jax.Array, col: jax.Array, row_valid: jax.Array,
                     col_valid: jax.Array, same_prompt: jax.Array | None = None, ema: tuple | None = None) -> dict:
    """The collapse/ metrics of one [M, P] log-prob matrix (see the module docstring). `ema`: the
    marginal-std EMAs already updated with this step (`ema_update` on a first call without it), to
    add the *_ema metrics."""
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
    marginal_std_seq = jnp.sqrt(_mean(jnp.square(marginal_s - mean_gs), row_valid))
    out = {
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
        "collapse/marginal_std_seq": marginal_std_seq,
        "collapse/mi_zscore": _mean((matched_t - marginal_t) / (marginal_std + STD_EPS), row_valid),
        "collapse/mi_zscore_seq": _mean((matched_s - marginal_s) / (marginal_std_seq + STD_EPS), row_valid),
        "collapse/num_pairs": jnp.sum(row_valid).astype(jnp.float32),
        "collapse/num_prompts": n,
    }
    out.update(retrieval_at_k(per_tok, col, row_valid, col_valid, same_prompt, chance))
    if ema is not None:
        out.update(ema_metrics(out, ema))
    return out


def ema_update(ema: tuple | None, metrics: dict, decay: float = EMA_DECAY) -> tuple:
    """RAGEN `_update_ema_std`: (marginal_std EMA, marginal_std_seq EMA) after this step's metrics;
    the first step (ema None) starts them at the current values. Carried by the caller across the
    steps that compute collapse metrics (one EMA per sampling strategy, as RAGEN keys them)."""
    cur = (metrics["collapse/marginal_std"], metrics["collapse/marginal_std_seq"])
    if ema is None:
        return cur
    return tuple(decay * e + (1.0 - decay) * c for e, c in zip(ema, cur))


def ema_metrics(metrics: dict, ema: tuple) -> dict:
    """The EMA variants from this step's metrics and the UPDATED EMA (`ema_update` first, as RAGEN):
    marginal_std_ema(_seq), and mi_zscore_ema(_seq) = mean_i (matched_i - marginal_i) / (EMA + eps)
    = the MI estimate over (EMA + eps)."""
    return {
        "collapse/marginal_std_ema": ema[0],
        "collapse/marginal_std_ema_seq": ema[1],
        "collapse/mi_zscore_ema": metrics["collapse/mi_estimate"] / (ema[0] + STD_EPS),
        "collapse/mi_zscore_ema_seq": metrics["collapse/mi_seq_estimate"] / (ema[1] + STD_EPS),
    }


__all__ = ["EMA_DECAY", "RETRIEVAL_KS", "STD_EPS", "collapse_metrics", "ema_metrics", "ema_update",
           "matched_and_marginal", "retrieval", "retrieval_at_k"]
