"""The algorithm's config sections, one per object that reads them: `advantage` (the estimator),
`loss` (policy / value / KL / TIS terms), `filter` (the group filter, as `FilterSpec`) and `batching`
(how the kept rows are split into optimizer steps). Each validates its own bounds with one sentence
naming the key; checks across sections (filter vs batching, estimator vs critic) stay in `Config.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ragen_jax.algorithms import ESTIMATORS, NORMALIZATIONS, TOKEN_REWARD_MODES, Estimator
from ragen_jax.algorithms.filters import LOSS_SCALINGS, FilterSpec
from ragen_jax.algorithms.losses import (DUAL_CLIP, EPS_HIGH, EPS_LOW, KL_ESTIMATORS, LOSS_AGG_MODES, VALUE_CLIP,
                                        check_clip_args)
from ragen_jax.algorithms.mismatch import TIS_MODES, TIS_SEQUENCE_CAP, TIS_TOKEN_CAP, check_tis_args


class ConfigError(ValueError):
    """A configuration problem, reported as one readable sentence."""


def choice(name: str, value, options):
    if value not in options:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(map(repr, options))}")


def positive(name: str, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def whole(name: str, value, low: int, what: str = ""):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be a whole number >= {low}{f' ({what})' if what else ''}, got {value!r}")


def micro_batch(name: str, value, batch_name: str, batch):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a whole number of trajectories >= 0 (0: all of {batch_name}), got {value!r}")
    if value and batch % value:
        raise ConfigError(f"{name}={value} must divide {batch_name}={batch} (each optimizer step is an equal "
                          "number of micro-batches)")


def boolean(name: str, value):
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")


@dataclass
class AdvantageConfig:
    # A registered estimator (its record: algorithms/advantages.py ESTIMATORS): "gae" (PPO with critic),
    # "grpo", "drgrpo", "rloo", "gigpo" (GRPO's episode advantage + an anchor-state step advantage,
    # verl-agent; algorithms/gigpo.py).
    estimator: str = "gae"
    # Reward normalisation grouped by initial state: identity (PPO default) / mean_std / mean / asym_clip.
    reward_norm: str = "identity"
    gamma: float = 1.0  # GAE discount
    lam: float = 1.0  # GAE lambda
    bi_level_gae: bool = False  # gae only: RAGEN's turn-level + token-level GAE
    # "trajectory": the episode reward on its last sampled token; "turn": each turn's on its last token.
    reward_placement: str = "trajectory"
    # Advantages x group std / max group std over the kept groups (RAGEN algorithm.soft_advantage_reweight).
    # GRPO only, as RAGEN (only its GRPO branch returns the group std the reweighting reads); with
    # another estimator the config refuses it rather than ignore it silently.
    soft_reweight: bool = False
    # The estimator's own options by name, e.g. GiGPO's {"weight": 1.0, "norm": "std", "gamma": 0.95}
    # (each estimator's record lists them: algorithms/advantages.py ESTIMATORS; unset ones keep their
    # defaults). `--config.advantage.options.weight=0.5`; the released advantage.gigpo_* names map here.
    options: dict = field(default_factory=dict)

    def validate(self):
        # Option names come from the registries that implement them (one list per option).
        choice("advantage.estimator", self.estimator, tuple(ESTIMATORS))
        choice("advantage.reward_norm", self.reward_norm, tuple(NORMALIZATIONS))
        choice("advantage.reward_placement", self.reward_placement, TOKEN_REWARD_MODES)
        for name in ("gamma", "lam"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ConfigError(f"advantage.{name} must be a number in [0, 1] (a discount of the GAE returns), "
                                  f"got {v!r}")
        boolean("advantage.bi_level_gae", self.bi_level_gae)
        boolean("advantage.soft_reweight", self.soft_reweight)
        if self.soft_reweight and not ESTIMATORS[self.estimator].soft_reweight:
            with_it = sorted(n for n, e in ESTIMATORS.items() if e.soft_reweight)
            raise ConfigError(f"advantage.soft_reweight works only with advantage.estimator="
                              f"{' or '.join(with_it)} (as in RAGEN), not {self.estimator!r}; set "
                              "advantage.soft_reweight=false")
        if not isinstance(self.options, dict):
            raise ConfigError(f"advantage.options must be a dict of the estimator's options, got {self.options!r}")
        self.estimator_options  # noqa: B018  (the record's dataclass checks every option)

    @property
    def record(self) -> Estimator:
        """The estimator that runs: `estimator`, or bilevel_gae for gae with bi_level_gae."""
        return ESTIMATORS["bilevel_gae" if (self.estimator == "gae" and self.bi_level_gae) else self.estimator]

    @property
    def estimator_options(self):
        """`options` as the estimator's typed options (its record's dataclass, defaults filled in)."""
        try:
            return ESTIMATORS[self.estimator].make_options(self.options)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"advantage.options: {e}") from None

    @property
    def needs_state_keys(self) -> bool:
        """The training rollout records per-turn observation keys (GiGPO's anchor states)."""
        return "state_key" in self.record.reads


@dataclass
class LossConfig:
    # PPO clip, decoupled (StarPO-S "clip-higher": 0.2 / 0.28; vanilla StarPO 0.2 / 0.2).
    eps_low: float = EPS_LOW
    eps_high: float = EPS_HIGH
    dual_clip: float = DUAL_CLIP  # dual-clip constant c for negative advantages
    agg: str = "token-mean"  # loss aggregation over tokens and rows (losses.LOSS_AGG_MODES)
    entropy_coef: float = 0.001
    # KL to the frozen initial policy; 0 = off (StarPO-S), and then the reference is never computed.
    kl_coef: float = 0.0
    kl_type: str = "k3"
    kl_in_reward: bool = False  # the KL as a token-reward penalty instead of a loss term
    value_clip: float = VALUE_CLIP
    # Truncated importance sampling against the sampler/trainer mismatch (algorithms/mismatch.py): the
    # policy loss of each token x min(exp(trainer old log-prob - sampler log-prob), cap), no gradient.
    # "none" | "token" (per token, Tunix / SkyRL) | "sequence" (product over the row, SkyRL). The
    # mismatch/ metrics are logged every iteration whatever this is.
    tis: str = "none"
    # Cap of the TIS weights and threshold of mismatch/ratio_above_cap; None: 2.0 (token, none) / 5.0
    # (sequence), the Tunix / SkyRL defaults.
    tis_cap: Optional[float] = None
    # SkyRL's geometric sequence mask: (low, high), rows whose geometric-mean ratio leaves it get
    # weight 0 (SkyRL: (0.99, 1.01)); () = off. Needs tis != "none".
    tis_geo_mask: tuple = ()

    def validate(self):
        choice("loss.agg", self.agg, LOSS_AGG_MODES)
        choice("loss.kl_type", self.kl_type, tuple(KL_ESTIMATORS))
        try:
            check_clip_args(self.eps_low, self.eps_high, self.dual_clip)
        except ValueError as e:
            raise ConfigError(f"loss.{e}") from None
        positive("loss.kl_coef", self.kl_coef, allow_zero=True)
        positive("loss.entropy_coef", self.entropy_coef, allow_zero=True)
        positive("loss.value_clip", self.value_clip)
        boolean("loss.kl_in_reward", self.kl_in_reward)
        choice("loss.tis", self.tis, TIS_MODES)
        try:
            check_tis_args(self.tis, self.effective_tis_cap)
        except ValueError as e:
            raise ConfigError(f"loss.{e}") from None
        try:
            if not isinstance(self.tis_geo_mask, (tuple, list)):
                raise ValueError
            check_tis_args(self.tis, self.effective_tis_cap, tuple(self.tis_geo_mask) or None)
        except (ValueError, TypeError):
            raise ConfigError(f"loss.tis_geo_mask must be (low, high) with 0 < low <= 1 <= high (SkyRL: (0.99, 1.01)) "
                              f"or () for off, got {self.tis_geo_mask!r}") from None
        if self.tis_geo_mask and self.tis == "none":
            raise ConfigError("loss.tis_geo_mask applies to the TIS weights; set loss.tis to 'token' or 'sequence' "
                              "or leave loss.tis_geo_mask empty")

    @property
    def effective_tis_cap(self) -> float:
        """`tis_cap`, or the default cap of the TIS mode (2.0 token and none, 5.0 sequence)."""
        if self.tis_cap is not None:
            return self.tis_cap
        return TIS_SEQUENCE_CAP if self.tis == "sequence" else TIS_TOKEN_CAP


@dataclass
class FilterConfig:
    """The group filter (ragen_jax/algorithms/filters.py; `spec` is its FilterSpec). Unselected groups
    keep their rows with loss weight 0 (static shapes), so top_p / min_p train on all P groups' rows
    unless max_groups caps them."""

    # top_k (value = fraction of groups; StarPO-S keeps the 25% of groups with the largest reward std) |
    # top_k_abs (value = groups) | top_p (value = nucleus) | min_p (value = fraction of the best score).
    strategy: str = "top_k"
    value: float = 0.25  # top_k 1.0 = off
    select: str = "largest"  # largest | smallest scores
    # Group score: reward_std (RAGEN "reward_variance") | reward_mean | entropy_mean | entropy_std |
    # length. The entropy metrics run the old-log-prob pass over every row before filtering.
    metric: str = "reward_std"
    include_zero: bool = True  # False: groups whose score is 0 are never kept
    top_p_mode: str = "linear"  # top_p: linear (score sums) | softmax (nucleus over softmax(scores))
    # Group slots (rows = slots x group_size) of top_p / min_p; 0: all groups. Fewer slots = less
    # update compute, but a selection larger than the cap loses its lowest-ranked groups.
    max_groups: int = 0
    rounding: str = "floor"  # top_k: k = floor(value * P) as the reference's int(value * P), or ceil
    # Advantages x the kept fraction of groups ("linear") or its square root ("sqrt") (RAGEN
    # actor.filter_loss_scaling).
    loss_scaling: str = "none"

    def validate(self):
        choice("filter.loss_scaling", self.loss_scaling, tuple(LOSS_SCALINGS))
        self.spec  # noqa: B018  (FilterSpec checks every other field)

    @property
    def spec(self) -> FilterSpec:
        try:
            return FilterSpec(strategy=self.strategy, value=self.value, select=self.select, metric=self.metric,
                              include_zero=self.include_zero, top_p_mode=self.top_p_mode,
                              max_groups=self.max_groups, rounding=self.rounding)
        except ValueError as e:
            # FilterSpec names its fields ("filter value ..."); the keys are filter.<field>.
            raise ConfigError(str(e).replace("filter ", "filter.", 1)) from None


@dataclass
class BatchingConfig:
    ppo_epochs: int = 1  # passes over the kept rows per iteration
    mini_batch_size: int = 32  # trajectories per optimizer step
    # Trajectories per forward/backward pass (verl's ppo_micro_batch_size_per_gpu, but for the whole
    # mesh): a mini-batch's gradient is accumulated over mini_batch_size / micro_batch_size passes,
    # which bounds activation memory without changing the optimizer step (same loss and gradient
    # for every loss agg mode). Also the row block of the no-grad log-prob/value passes. 0: the
    # whole mini-batch in one pass. Must divide mini_batch_size and be a multiple of the mesh's
    # data x fsdp devices.
    micro_batch_size: int = 0
    # verl trainer.critic_warmup: the actor trains from global step k on (steps count from 1), so k gives
    # k - 1 critic-only iterations (0 and 1: none).
    critic_warmup: int = 0

    def validate(self):
        # The update scans ppo_epochs x (kept rows / mini_batch_size) steps: both are static counts.
        whole("batching.ppo_epochs", self.ppo_epochs, 1)
        whole("batching.mini_batch_size", self.mini_batch_size, 1, "trajectories per optimizer step")
        micro_batch("batching.micro_batch_size", self.micro_batch_size, "batching.mini_batch_size",
                    self.mini_batch_size)
        whole("batching.critic_warmup", self.critic_warmup, 0, "global step the actor starts training at")
