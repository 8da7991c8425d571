"""GiGPO (verl-agent `gigpo/core_gigpo.py`): episode-level plus anchor-state step-level advantages.

Pure, jittable, static shapes. Rows are episodes: B = P groups x N rollouts (row b in group b // N),
K = max_turns turn slots per row, T tokens. Per turn the rollout records `turn_end [B, K]` (last
sampled token, -1 = no turn), `turn_reward [B, K]` and an observation key `state_key [B, K, D]`
(integer words; two turns saw the same observation iff all D words are equal: e.g. the env's
`render_grid` flattened, see `envs_jax.observation_key`). A turn is valid iff `turn_end >= 0`.

verl-agent's rows are turns ("steps"); its semantics, reproduced here on episode rows:
1. Episode advantage (`episode_norm_reward`, `compute_mean_std_cross_steps=True`, its default): the
   episode score s (sum of the row's token rewards; verl-agent puts the episode reward on every step
   row) is normalised within its group over all STEP rows, i.e. every episode counts once per valid
   turn (`cross_steps=False`: once per episode). A group with one counted row: mean 0, std 1.
2. Anchor-state groups (`build_step_group`, exact match): within an episode group, all valid turns
   with equal observation keys, from any episodes, the same episode included.
3. Step return (`compute_step_discounted_returns`, Eq. 5): G_k = r_k + gamma * G_{k+1} over the
   episode's valid turns (r_k = turn_reward).
4. Step advantage (`step_norm_reward`): G_k normalised within its anchor group; an anchor group of
   one turn: mean G_k (advantage 0), std 1.
5. A = A_episode + step_weight * A_step on the turn's sampled tokens; returns == advantages.
Normalisation ("std" = verl-agent `mean_std_norm`, "none" = `mean_norm`, verl-agent's default):
    std:  (x - mean) / (std + eps), std = sample std (torch `.std()`, ddof 1);   none: x - mean.
Means and stds are taken on values shifted by a member of the set (shift-invariant), so equal values
give exactly 0 (a float32 mean of equal values is not always that value).

The single-turn context mode uses the same record rows (the trainer unfolds turn blocks internally
and folds the per-token results back), so the same function applies; `gigpo_turn_advantages` gives
the per-turn values [B, K] for a layout with one row per turn.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ragen_jax.algorithms.advantages import STD_EPS, Estimator, EstimatorInputs, register_estimator

GIGPO_NORMS = ("std", "none")


def check_gigpo_args(step_weight: float, norm: str, gamma: float) -> None:
    """One sentence per bad argument (named as the GiGPO options), raised before anything is traced."""
    if norm not in GIGPO_NORMS:
        raise ValueError(f"norm={norm!r} is not valid; choose one of {', '.join(map(repr, GIGPO_NORMS))}")
    if not isinstance(step_weight, (int, float)) or isinstance(step_weight, bool) or step_weight < 0:
        raise ValueError(f"weight must be a number >= 0, got {step_weight!r}")
    if not isinstance(gamma, (int, float)) or isinstance(gamma, bool) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")


@dataclasses.dataclass(frozen=True)
class GiGPOOptions:
    """GiGPO's options (config: `advantage.options`)."""

    weight: float = 1.0  # A = A_episode + weight * A_step (verl-agent step_advantage_w)
    # Normalisation of both terms within their groups: "std" (x - mean) / (std + 1e-6) (verl-agent
    # mean_std_norm, its function default) | "none" x - mean (mean_norm, used by many of its scripts).
    norm: str = "std"
    gamma: float = 0.95  # discount of the step returns G_k = r_k + gamma G_{k+1} (verl-agent gamma 0.95)

    def __post_init__(self):
        check_gigpo_args(self.weight, self.norm, self.gamma)


def step_returns(turn_reward: jax.Array, turn_valid: jax.Array, gamma: float) -> jax.Array:
    """[B, K] discounted return from each valid turn over the episode's later valid turns; 0 elsewhere."""
    r = jnp.where(turn_valid, turn_reward.astype(jnp.float32), 0.0)

    def step(nxt, xs):
        rk, ok = xs
        g = rk + gamma * nxt
        return jnp.where(ok, g, nxt), jnp.where(ok, g, 0.0)

    _, g = jax.lax.scan(step, jnp.zeros(r.shape[:1], jnp.float32), (r.T, turn_valid.T), reverse=True)
    return g.T


def _member_norm(x, same, norm, eps):
    """x [..., M] normalised within sets: same [..., M, M] marks the members of each entry's set
    (itself included). A set of one: mean x_i (so 0), std 1, as verl-agent. -> (z, set size)."""
    cnt = jnp.sum(same, axis=-1).astype(jnp.float32)
    d = jnp.where(same, x[..., None, :] - x[..., :, None], 0.0)  # shift by the entry itself
    mean_d = jnp.sum(d, axis=-1) / jnp.maximum(cnt, 1.0)
    var = jnp.sum(jnp.where(same, jnp.square(d - mean_d[..., None]), 0.0), axis=-1) / jnp.maximum(cnt - 1.0, 1.0)
    centred = -mean_d
    if norm == "none":
        return centred, cnt
    std = jnp.where(cnt > 1, jnp.sqrt(var), 1.0)
    return centred / (std + eps), cnt


def _key_equal(state_key: jax.Array, group_size: int) -> jax.Array:
    """[B, K, D] keys -> [P, N*K, N*K] equality of the turns of each group."""
    b, k = state_key.shape[:2]
    g = state_key.reshape(b // group_size, group_size * k, -1)
    return jnp.all(g[:, :, None, :] == g[:, None, :, :], axis=-1)


def anchor_groups(state_key: jax.Array, turn_valid: jax.Array, group_size: int) -> jax.Array:
    """[P, N*K, N*K] bool: valid turns i, j of the same episode group saw the same observation."""
    v = turn_valid.reshape(-1, group_size * turn_valid.shape[1])
    return _key_equal(state_key, group_size) & v[:, :, None] & v[:, None, :]


def episode_advantages(score: jax.Array, turn_valid: jax.Array, group_size: int, norm: str, eps: float,
                       cross_steps: bool = True) -> jax.Array:
    """[B] episode-level advantage: s normalised within its group, each episode weighted by its valid
    turns (`cross_steps`) or once; a group whose total weight is 1 uses mean 0, std 1."""
    s = score.astype(jnp.float32).reshape(-1, group_size)
    n_turns = jnp.sum(turn_valid, axis=1).reshape(-1, group_size).astype(jnp.float32)
    w = n_turns if cross_steps else (n_turns > 0).astype(jnp.float32)
    tot = jnp.sum(w, axis=1, keepdims=True)
    ref = jnp.max(jnp.where(w > 0, s, -jnp.inf), axis=1, keepdims=True)  # any member: a shift
    ref = jnp.where(jnp.isfinite(ref), ref, 0.0)
    d = s - ref
    mean_d = jnp.sum(w * d, axis=1, keepdims=True) / jnp.maximum(tot, 1.0)
    var = jnp.sum(w * jnp.square(d - mean_d), axis=1, keepdims=True) / jnp.maximum(tot - 1.0, 1.0)
    single = tot <= 1.0
    centred = jnp.where(single, s, d - mean_d)
    if norm == "none":
        return centred.reshape(-1)
    std = jnp.where(single, 1.0, jnp.sqrt(var))
    return (centred / (std + eps)).reshape(-1)


def step_advantages(state_key: jax.Array, turn_reward: jax.Array, turn_valid: jax.Array, group_size: int,
                    gamma: float, norm: str, eps: float) -> tuple[jax.Array, jax.Array]:
    """-> (step advantage [B, K], anchor-group size [B, K]); both 0 on invalid turns."""
    b, k = turn_valid.shape
    g = step_returns(turn_reward, turn_valid, gamma).reshape(-1, group_size * k)
    same = anchor_groups(state_key, turn_valid, group_size)
    z, cnt = _member_norm(g, same, norm, eps)
    return (jnp.where(turn_valid, z.reshape(b, k), 0.0), jnp.where(turn_valid, cnt.reshape(b, k), 0.0))


def token_turn_index(turn_end: jax.Array, t: int) -> jax.Array:
    """[B, K] turn ends -> [B, T] int32: the turn each position belongs to (turn k spans the
    positions after turn k-1's end up to its own), K past the last turn end."""
    pos = jnp.arange(t, dtype=jnp.int32)
    te = turn_end.astype(jnp.int32)
    return jnp.sum((te[:, None, :] >= 0) & (te[:, None, :] < pos[None, :, None]), axis=-1).astype(jnp.int32)


def _state_key3(state_key: jax.Array, turn_valid: jax.Array) -> jax.Array:
    if state_key.ndim == 2:
        state_key = state_key[..., None]
    if state_key.ndim != 3 or state_key.shape[:2] != turn_valid.shape:
        raise ValueError(f"gigpo needs state_key [B, K] or [B, K, D] matching turn_end {turn_valid.shape}, "
                         f"got {state_key.shape}")
    return state_key


def gigpo_turn_advantages(score: jax.Array, turn_end: jax.Array, turn_reward: jax.Array, state_key: jax.Array,
                          group_size: int, *, step_weight: float = 1.0, norm: str = "std", gamma: float = 0.95,
                          eps: float = 1e-6, cross_steps: bool = True) -> tuple[jax.Array, dict]:
    """-> (per-turn advantage [B, K] = A_episode + step_weight * A_step, 0 on invalid turns; metrics)."""
    check_gigpo_args(step_weight, norm, gamma)
    valid = turn_end >= 0
    key = _state_key3(state_key, valid)
    if score.shape[0] % group_size:
        raise ValueError(f"batch size {score.shape[0]} is not a multiple of group_size {group_size}")
    ep = episode_advantages(score, valid, group_size, norm, eps, cross_steps)
    st, cnt = step_advantages(key, turn_reward, valid, group_size, gamma, norm, eps)
    adv = jnp.where(valid, ep[:, None] + step_weight * st, 0.0)
    return adv, gigpo_metrics(st, cnt, valid, group_size)


def gigpo_metrics(step_adv: jax.Array, count: jax.Array, turn_valid: jax.Array, group_size: int) -> dict:
    """anchor groups per episode group (distinct observations among its valid turns, averaged over the
    groups with a valid turn: groups a filter dropped do not count), fraction of valid turns in an
    anchor group of size > 1, std (ddof 0) of the step advantages over valid turns."""
    v = turn_valid.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(v), 1.0)
    distinct = jnp.sum(jnp.where(turn_valid, 1.0 / jnp.maximum(count, 1.0), 0.0))
    groups = jnp.sum(jnp.any(turn_valid.reshape(-1, group_size * turn_valid.shape[1]), axis=1))
    mean = jnp.sum(step_adv * v) / n
    std = jnp.sqrt(jnp.sum(jnp.square(step_adv - mean) * v) / n)
    return {
        "gigpo/anchor_groups_per_group": distinct / jnp.maximum(groups, 1).astype(jnp.float32),
        "gigpo/shared_turn_fraction": jnp.sum(jnp.where(count > 1, v, 0.0)) / n,
        "gigpo/step_advantage_std": std,
    }


def gigpo(token_rewards: jax.Array, loss_mask: jax.Array, turn_end: jax.Array, turn_reward: jax.Array,
          state_key: jax.Array, group_size: int, *, step_weight: float = 1.0, norm: str = "std",
          gamma: float = 0.95, eps: float = 1e-6, cross_steps: bool = True) -> tuple[jax.Array, jax.Array, dict]:
    """GiGPO on episode rows -> (advantages [B, T], returns [B, T] (== advantages), metrics).

    token_rewards [B, T] give the episode score (their masked sum); turn_end [B, K] (token
    coordinates of `loss_mask`), turn_reward [B, K], state_key [B, K] or [B, K, D]. Each sampled
    token gets its turn's advantage; sampled tokens after the last turn end get 0.
    """
    mask = loss_mask.astype(bool)
    score = jnp.sum(jnp.where(mask, token_rewards.astype(jnp.float32), 0.0), axis=-1)
    turn_adv, metrics = gigpo_turn_advantages(score, turn_end, turn_reward, state_key, group_size,
                                              step_weight=step_weight, norm=norm, gamma=gamma, eps=eps,
                                              cross_steps=cross_steps)
    k = turn_end.shape[1]
    idx = token_turn_index(turn_end, mask.shape[1])
    padded = jnp.concatenate([turn_adv, jnp.zeros((turn_adv.shape[0], 1), turn_adv.dtype)], axis=1)
    adv = jnp.where(mask, jnp.take_along_axis(padded, jnp.minimum(idx, k), axis=1), 0.0)
    return adv, adv, metrics


def _estimate(x: EstimatorInputs, options: GiGPOOptions):
    adv, ret, metrics = gigpo(x.token_rewards, x.loss_mask, x.turn_end, x.turn_reward, x.state_key, x.group_size,
                              step_weight=options.weight, norm=options.norm, gamma=options.gamma, eps=STD_EPS)
    return (adv, ret), metrics


register_estimator(Estimator("gigpo", _estimate, options=GiGPOOptions, reads=("turn_end", "turn_reward", "state_key")))

__all__ = ["GIGPO_NORMS", "GiGPOOptions", "anchor_groups", "check_gigpo_args", "episode_advantages", "gigpo", "gigpo_metrics",
           "gigpo_turn_advantages", "step_advantages", "step_returns", "token_turn_index"]
