"""Rewards -> token rewards -> advantages (pure, jittable, static shapes).

Shapes: B rows = P groups x N rollouts, row b in group b // N (the `Trajectories` order, and the order
`filter.py` keeps after gathering whole groups); T tokens per row; K = max_turns.
`loss_mask [B, T]` marks exactly the tokens the policy sampled; everything here ignores the rest.

Pipeline the trainer runs (the reference's order):
    r      = traj.reward                                    # raw reward + format penalties, [B]
    r      = normalize_rewards(r, N, "identity")            # grouped by initial state, [B]
    tok_r  = token_rewards(loss_mask, turn_end, turn_reward, r, mode="trajectory")   # [B, T]
    tok_r  = kl_in_reward(...)  (losses.py, optional)
    adv, returns = compute_advantages("gae", tok_r, loss_mask, values=..., group_size=N, ...)

Reference choices reproduced here (RAGEN `ctx_manager._normalize_score_tensor`, verl `core_algos`):
- group std is the SAMPLE std (torch `.std()`, ddof = 1) and the divisor is `std + 1e-6`;
- `mean_std` / `asym_clip` give 0 for a whole group whose std <= 1e-6;
- a group size of 1 leaves rewards unnormalised (the reference skips normalisation then), and GRPO /
  RLOO use baseline 0 and scale 1 for it (verl: mean 0, std 1 for a single-sample group);
- `whiten` is verl's `masked_whiten`: unbiased masked variance, `(x - mean) * rsqrt(var + 1e-8)`,
  the mean is removed (`shift_mean=True`); GAE advantages are whitened, critic returns are not.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

STD_EPS = 1e-6  # reference: zero-std threshold and the `std + eps` divisor


def check_group_size(batch: int, group_size: int) -> None:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if batch % group_size:
        raise ValueError(f"batch size {batch} is not a multiple of group_size {group_size}")


def lookup_choice(registry: dict, kind: str, name: str):
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(registry))}")
    return registry[name]


def group_std(x: jax.Array, ddof: int = 1) -> jax.Array:
    """Std over the last axis [..., N] -> [...]; sample std (ddof=1) as torch `.std()`; N=1 -> 0."""
    n = x.shape[-1]
    if n == 1:
        return jnp.zeros(x.shape[:-1], x.dtype)
    # Shift by the first element (std is shift-invariant): a group of equal rewards then has std
    # exactly 0 (a float32 mean of three -0.1 is not -0.1, which would leave a spurious ~1e-8 std
    # that ranks such groups above all-zero ones in the filter).
    x = x - x[..., :1]
    mean = jnp.mean(x, axis=-1, keepdims=True)
    return jnp.sqrt(jnp.sum(jnp.square(x - mean), axis=-1) / (n - ddof))


# ----------------------------------------------------------------------------- reward placement

def last_token_index(loss_mask: jax.Array) -> jax.Array:
    """[B, T] bool -> [B] int32: position of the last True; -1 for a row without sampled tokens."""
    t = loss_mask.shape[-1]
    pos = jnp.arange(t, dtype=jnp.int32)
    return jnp.max(jnp.where(loss_mask, pos, -1), axis=-1)


def _scatter_rows(t: int, pos: jax.Array, vals: jax.Array) -> jax.Array:
    """Adds vals [B, K] at positions pos [B, K] of a zero [B, T] array; pos < 0 is dropped.

    Negative indices would wrap around in JAX, so they are sent past the end and dropped instead.
    """
    b = pos.shape[0]
    pos = jnp.where(pos < 0, t, pos)
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], pos.shape)
    return jnp.zeros((b, t), vals.dtype).at[rows, pos].add(vals, mode="drop")


def token_rewards(loss_mask: jax.Array, turn_end: jax.Array, turn_reward: jax.Array,
                  reward: jax.Array, mode: str = "trajectory") -> jax.Array:
    """Places rewards on sampled tokens -> [B, T] float32.

    loss_mask [B, T] bool, turn_end [B, K] int32 (-1 = no turn), turn_reward [B, K], reward [B].
    mode "trajectory" (default): `reward[b]` (already normalised, if wanted) on the row's LAST sampled
        token; a row with no sampled token gets nothing.
    mode "turn": `turn_reward[b, k]` on each turn's last sampled token `turn_end[b, k]` (turn-level
        credit; the reference does not normalise in this mode); turns with turn_end = -1 are dropped.
    """
    if mode not in TOKEN_REWARD_MODES:
        raise ValueError(f"unknown reward placement {mode!r}; valid: {', '.join(TOKEN_REWARD_MODES)}")
    t = loss_mask.shape[-1]
    if mode == "trajectory":
        last = last_token_index(loss_mask)
        return _scatter_rows(t, last[:, None], reward.astype(jnp.float32)[:, None])
    return _scatter_rows(t, turn_end.astype(jnp.int32), turn_reward.astype(jnp.float32))


TOKEN_REWARD_MODES = ("trajectory", "turn")


# ----------------------------------------------------------------------------- normalisation

def _norm_identity(r: jax.Array, group_size: int) -> jax.Array:
    return r


def _norm_mean(r: jax.Array, group_size: int) -> jax.Array:
    if group_size == 1:
        return r
    g = r.reshape(-1, group_size)
    return (g - g.mean(axis=-1, keepdims=True)).reshape(r.shape)


def _norm_mean_std(r: jax.Array, group_size: int) -> jax.Array:
    if group_size == 1:
        return r
    g = r.reshape(-1, group_size)
    std = group_std(g)[:, None]
    z = (g - g.mean(axis=-1, keepdims=True)) / (std + STD_EPS)
    # Reference: a group whose rewards are all equal (std <= 1e-6) carries no signal -> exactly 0.
    return jnp.where(std > STD_EPS, z, 0.0).reshape(r.shape)


def _norm_asym_clip(r: jax.Array, group_size: int) -> jax.Array:
    if group_size == 1:
        return r
    return jnp.clip(_norm_mean_std(r, group_size), -1.0, 3.0)


NORMALIZATIONS: dict[str, Callable[[jax.Array, int], jax.Array]] = {
    "identity": _norm_identity,
    "mean_std": _norm_mean_std,
    "mean": _norm_mean,
    "asym_clip": _norm_asym_clip,
}


def get_normalization(name: str) -> Callable[[jax.Array, int], jax.Array]:
    return lookup_choice(NORMALIZATIONS, "reward normalization", name)


def normalize_rewards(reward: jax.Array, group_size: int, method: str = "identity") -> jax.Array:
    """Groupwise reward normalisation [B] -> [B] (groups = consecutive blocks of `group_size` rows).

    identity: r;  mean: r - mean_g;  mean_std: (r - mean_g) / (std_g + 1e-6), 0 where std_g <= 1e-6
    (std_g = sample std);  asym_clip: mean_std clamped to [-1, 3]. group_size 1: unchanged.
    """
    fn = get_normalization(method)
    check_group_size(reward.shape[0], group_size)
    return fn(reward.astype(jnp.float32), group_size)


# ----------------------------------------------------------------------------- whitening

def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Mean of x over mask (0 where the mask is empty)."""
    m = mask.astype(x.dtype)
    return jnp.sum(x * m, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def whiten(x: jax.Array, mask: jax.Array, shift_mean: bool = True, eps: float = 1e-8) -> jax.Array:
    """verl `masked_whiten` over ALL masked entries of x [B, T] -> [B, T], 0 off the mask.

    mean and the unbiased variance (n / (n - 1) Bessel factor, n = masked count; n <= 1 uses no factor
    instead of raising, so it stays jittable) over the masked entries; result `(x - mean) *
    rsqrt(var + eps)`, plus `mean` added back when `shift_mean` is False (verl's option).
    """
    m = mask.astype(jnp.float32)
    x = x.astype(jnp.float32)
    n = jnp.sum(m)
    mean = jnp.sum(x * m) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.square(x - mean) * m) / jnp.maximum(n, 1.0)
    var = var * jnp.where(n > 1, n / jnp.maximum(n - 1.0, 1.0), 1.0)
    out = (x - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m


# ----------------------------------------------------------------------------- estimators

def _masked_reverse_gae(rewards, values, mask, reset, gamma, lam):
    """Backward GAE recursion along T that only steps on masked positions.

    Carry (next_value, next_adv) is the value / advantage of the NEXT masked token; unmasked positions
    (environment text between turns, padding) leave the carry untouched, so the chain jumps over them.
    `reset [B, T]` zeroes the carry before position t (used by bi-level GAE at turn ends).
    Returns advantages [B, T] (0 off-mask).
    """
    b = rewards.shape[0]

    def step(carry, xs):
        next_v, next_a = carry
        r, v, m, rs = xs
        next_v = jnp.where(rs, 0.0, next_v)
        next_a = jnp.where(rs, 0.0, next_a)
        delta = r + gamma * next_v - v
        a = delta + gamma * lam * next_a
        carry = (jnp.where(m, v, next_v), jnp.where(m, a, next_a))
        return carry, jnp.where(m, a, 0.0)

    zeros = jnp.zeros((b,), jnp.float32)
    xs = (rewards.T, values.T, mask.T, reset.T)
    _, adv_t = jax.lax.scan(step, (zeros, zeros), xs, reverse=True)
    return adv_t.T


def gae(token_rewards: jax.Array, values: jax.Array, loss_mask: jax.Array,
        gamma: float = 1.0, lam: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Token-level GAE over the sampled tokens only -> (advantages [B, T], returns [B, T]).

    token_rewards [B, T], values [B, T] (zeroed off-mask here), loss_mask [B, T].
    For masked tokens t < t' (t' = next masked token of the row, none -> V = 0, A = 0):
        delta_t = r_t + gamma * V_t' - V_t,   A_t = delta_t + gamma * lam * A_t'.
    gamma = lam = 1 gives A_t = (sum of rewards at masked tokens >= t) - V_t. returns = A + V.
    Both are 0 off the mask; advantages are NOT whitened here (see `compute_advantages`).
    """
    m = loss_mask.astype(bool)
    v = jnp.where(m, values.astype(jnp.float32), 0.0)
    r = jnp.where(m, token_rewards.astype(jnp.float32), 0.0)
    adv = _masked_reverse_gae(r, v, m, jnp.zeros_like(m), gamma, lam)
    return adv, jnp.where(m, adv + v, 0.0)


def bilevel_gae(token_rewards: jax.Array, values: jax.Array, loss_mask: jax.Array, turn_end: jax.Array,
                gamma: float = 1.0, lam: float = 1.0,
                high_level_gamma: float = 0.95) -> tuple[jax.Array, jax.Array]:
    """Bi-level GAE (RAGEN `compute_bi_level_gae_advantage_return`) -> (advantages, returns) [B, T].

    turn_end [B, K]: each turn's last sampled token (-1 = no turn; valid turns first).
    1. Turn level, over the valid turns k with e_k = turn_end[k], r_k = token_rewards[e_k],
       V_k = values[e_k] (V = 0 after the last turn):
           delta_k = r_k + gamma_h * V_{k+1} - V_k,   A_k = delta_k + gamma_h * lam * A_{k+1},
           G_k = A_k + V_k (the turn's return).
    2. Token level inside each turn, backwards over its sampled tokens, restarting at each turn end:
           at e_k:      A = G_k - V_{e_k}  (= A_k)
           before it:   A_t = (r_t + gamma * V_t' - V_t) + gamma * lam * A_t'   (t' = next sampled token)
       returns = A + V.
    Difference to the reference: turn ends come from `turn_end`, not from "reward != 0" positions, so a
    turn with zero reward is still a turn (the reference silently merged it into the next turn).
    Advantages are not whitened here (the reference whitens; `compute_advantages` does).
    """
    m = loss_mask.astype(bool)
    bsz, t = m.shape
    v = jnp.where(m, values.astype(jnp.float32), 0.0)
    r = jnp.where(m, token_rewards.astype(jnp.float32), 0.0)
    te = turn_end.astype(jnp.int32)
    valid = te >= 0
    safe = jnp.clip(te, 0, t - 1)
    r_k = jnp.where(valid, jnp.take_along_axis(r, safe, axis=1), 0.0)
    v_k = jnp.where(valid, jnp.take_along_axis(v, safe, axis=1), 0.0)

    def turn_step(next_carry, xs):
        next_v, next_a = next_carry
        rk, vk, ok = xs
        delta = rk + high_level_gamma * next_v - vk
        a = delta + high_level_gamma * lam * next_a
        carry = (jnp.where(ok, vk, next_v), jnp.where(ok, a, next_a))
        return carry, jnp.where(ok, a, 0.0)

    zeros = jnp.zeros((bsz,), jnp.float32)
    _, a_k = jax.lax.scan(turn_step, (zeros, zeros), (r_k.T, v_k.T, valid.T), reverse=True)
    g_k = a_k.T + v_k

    is_end = _scatter_rows(t, te, jnp.ones_like(g_k)) > 0
    g_tok = _scatter_rows(t, te, jnp.where(valid, g_k, 0.0))
    r2 = jnp.where(is_end, g_tok, r)
    adv = _masked_reverse_gae(r2, v, m, is_end, gamma, lam)
    return adv, jnp.where(m, adv + v, 0.0)


def _scores(token_rewards, loss_mask):
    return jnp.sum(jnp.where(loss_mask, token_rewards.astype(jnp.float32), 0.0), axis=-1)


def _broadcast(score, loss_mask):
    adv = jnp.where(loss_mask, score[:, None], 0.0)
    return adv, adv


def grpo(token_rewards: jax.Array, loss_mask: jax.Array, group_size: int,
         eps: float = STD_EPS) -> tuple[jax.Array, jax.Array]:
    """GRPO outcome advantage (verl) -> (advantages, returns) [B, T], returns == advantages.

    s = sum of the row's masked token rewards; A = (s - mean_g) / (std_g + eps) (sample std),
    broadcast over the row's sampled tokens. Group size 1: A = s.
    """
    check_group_size(loss_mask.shape[0], group_size)
    s = _scores(token_rewards, loss_mask)
    if group_size > 1:
        g = s.reshape(-1, group_size)
        s = ((g - g.mean(-1, keepdims=True)) / (group_std(g)[:, None] + eps)).reshape(s.shape)
    return _broadcast(s, loss_mask)


def drgrpo(token_rewards: jax.Array, loss_mask: jax.Array, group_size: int) -> tuple[jax.Array, jax.Array]:
    """Dr. GRPO: A = s - mean_g (no std division), broadcast over sampled tokens.

    (Dr. GRPO also drops the per-sequence length normalisation: pair it with loss aggregation
    `seq-mean-token-sum` or a constant token normaliser.)
    """
    check_group_size(loss_mask.shape[0], group_size)
    s = _scores(token_rewards, loss_mask)
    if group_size > 1:
        g = s.reshape(-1, group_size)
        s = (g - g.mean(-1, keepdims=True)).reshape(s.shape)
    return _broadcast(s, loss_mask)


def rloo(token_rewards: jax.Array, loss_mask: jax.Array, group_size: int) -> tuple[jax.Array, jax.Array]:
    """RLOO: A_i = s_i - mean_{j != i} s_j = N / (N - 1) * (s_i - mean_g); group size 1: A = s."""
    check_group_size(loss_mask.shape[0], group_size)
    s = _scores(token_rewards, loss_mask)
    n = group_size
    if n > 1:
        g = s.reshape(-1, n)
        s = ((g - g.mean(-1, keepdims=True)) * (n / (n - 1))).reshape(s.shape)
    return _broadcast(s, loss_mask)


# ----------------------------------------------------------------------------- the estimator records

@dataclasses.dataclass(frozen=True)
class EstimatorInputs:
    """What the trainer hands every estimator: [B, T] token rewards and sampled-token mask, and the
    per-row / per-turn arrays an estimator may read (None when the run has none): critic `values`
    [B, T], `turn_end` [B, K] (each turn's last sampled token, -1 = none), `turn_reward` [B, K],
    `state_key` [B, K(, D)] (per-turn observation keys), plus the group size and the GAE discounts."""

    token_rewards: jax.Array
    loss_mask: jax.Array
    values: jax.Array | None = None
    turn_end: jax.Array | None = None
    turn_reward: jax.Array | None = None
    state_key: jax.Array | None = None
    group_size: int = 1
    gamma: float = 1.0
    lam: float = 1.0
    high_level_gamma: float = 0.95


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of an estimator that takes none."""


@dataclasses.dataclass(frozen=True)
class Estimator:
    """One advantage estimator's record, registered where the estimator is defined (`register_estimator`).

    fn(inputs: EstimatorInputs, options) -> ((advantages [B, T], returns [B, T]), metrics dict), both 0
        off the mask; advantages before whitening.
    needs_critic: it reads `inputs.values` (the trainer then trains a critic; config refuses
        model.critic='none').
    whiten: whether its advantages are whitened by default (verl's masked_whiten).
    options: a frozen dataclass of its options with defaults, validating itself in `__post_init__`
        (ValueError, one sentence naming the option); the config's `advantage.options` fills it.
    reads: the inputs it needs beyond rewards and the mask ("values", "turn_end", "turn_reward",
        "state_key"): refused in one sentence when missing; "state_key" makes the rollout record them.
    soft_reweight: RAGEN's soft_advantage_reweight applies (it reads the group std only GRPO returns).
    """

    name: str
    fn: Callable
    needs_critic: bool = False
    whiten: bool = False
    options: type = NoOptions
    reads: tuple[str, ...] = ()
    soft_reweight: bool = False

    def __post_init__(self):
        if not dataclasses.is_dataclass(self.options):
            raise ValueError(f"estimator {self.name!r}: options must be a dataclass type, got {self.options!r}")
        unknown = set(self.reads) - set(ESTIMATOR_READS)
        if unknown:
            raise ValueError(f"estimator {self.name!r} reads unknown inputs {sorted(unknown)}; "
                             f"valid: {', '.join(ESTIMATOR_READS)}")

    def make_options(self, values=None):
        """The options instance: `values` None (defaults), a dict by option name, or an instance."""
        if isinstance(values, self.options):
            return values
        values = dict(values or {})
        names = [f.name for f in dataclasses.fields(self.options)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"options {', '.join(map(repr, unknown))} are not options of the {self.name!r} estimator; "
                             f"valid: {', '.join(names) or 'none'}")
        return self.options(**values)


# The inputs an estimator may read beyond rewards and the mask, with the words an error names them by.
ESTIMATOR_READS = {"values": "critic values", "turn_end": "turn_end", "turn_reward": "turn_reward",
                   "state_key": "state_key (per-turn observation keys)"}
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(record: Estimator, *, replace: bool = False) -> Estimator:
    """Add an estimator's record (ValueError if the name is taken, unless `replace`)."""
    if not isinstance(record, Estimator):
        raise ValueError(f"register_estimator takes an Estimator record, got {type(record).__name__}")
    if record.name in ESTIMATORS and not replace:
        raise ValueError(f"advantage estimator {record.name!r} is already registered")
    ESTIMATORS[record.name] = record
    return record


def unregister_estimator(name: str) -> None:
    """Remove a record (tests and plug-ins that registered their own)."""
    get_estimator(name)
    del ESTIMATORS[name]


def get_estimator(name: str) -> Estimator:
    return lookup_choice(ESTIMATORS, "advantage estimator", name)


def _est_gae(x: EstimatorInputs, options):
    return gae(x.token_rewards, x.values, x.loss_mask, x.gamma, x.lam), {}


def _est_bilevel(x: EstimatorInputs, options):
    return bilevel_gae(x.token_rewards, x.values, x.loss_mask, x.turn_end, x.gamma, x.lam, x.high_level_gamma), {}


def _est_grpo(x: EstimatorInputs, options):
    return grpo(x.token_rewards, x.loss_mask, x.group_size), {}


def _est_drgrpo(x: EstimatorInputs, options):
    return drgrpo(x.token_rewards, x.loss_mask, x.group_size), {}


def _est_rloo(x: EstimatorInputs, options):
    return rloo(x.token_rewards, x.loss_mask, x.group_size), {}


# The reference whitens GAE inside verl's compute_gae_advantage_return and its bi-level variant; the
# group estimators are not whitened. GRPO alone returns the group std RAGEN's soft reweighting reads.
register_estimator(Estimator("gae", _est_gae, needs_critic=True, whiten=True, reads=("values",)))
register_estimator(Estimator("bilevel_gae", _est_bilevel, needs_critic=True, whiten=True, reads=("values", "turn_end")))
register_estimator(Estimator("grpo", _est_grpo, soft_reweight=True))
register_estimator(Estimator("drgrpo", _est_drgrpo))
register_estimator(Estimator("rloo", _est_rloo))


def compute_advantages(estimator: str, token_rewards: jax.Array, loss_mask: jax.Array, *,
                       values: jax.Array | None = None, turn_end: jax.Array | None = None,
                       turn_reward: jax.Array | None = None, state_key: jax.Array | None = None,
                       group_size: int = 1, gamma: float = 1.0, lam: float = 1.0,
                       high_level_gamma: float = 0.95, options=None,
                       whiten_advantages: bool | None = None, with_metrics: bool = False):
    """Dispatch -> (advantages [B, T], returns [B, T]), both 0 off the mask; with `with_metrics`
    a third item, the estimator's metrics dict (GiGPO's "gigpo/..." keys; empty for the others).

    `options`: the estimator's options (its record's dataclass, a dict of them, or None: defaults).
    whiten_advantages None = the record's default (True for the critic-based `gae`, `bilevel_gae`;
    False for the group estimators). Returns are computed before whitening.
    """
    record = get_estimator(estimator)
    opts = record.make_options(options)
    check_group_size(loss_mask.shape[0], group_size)
    mask = loss_mask.astype(bool)
    x = EstimatorInputs(token_rewards, mask, values, turn_end, turn_reward, state_key, group_size, gamma, lam,
                        high_level_gamma)
    missing = [r for r in record.reads if getattr(x, r) is None]
    if missing:
        raise ValueError(f"the {estimator!r} estimator needs {', '.join(ESTIMATOR_READS[r] for r in missing)}")
    (adv, ret), metrics = record.fn(x, opts)
    if whiten_advantages is None:
        whiten_advantages = record.whiten
    if whiten_advantages:
        adv = whiten(adv, mask)
    return (adv, ret, metrics) if with_metrics else (adv, ret)
