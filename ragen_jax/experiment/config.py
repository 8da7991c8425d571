"""Experiment configuration: nested dataclasses that validate themselves, loaded from `configs/*.py`.

A config file defines `get_config() -> Config`. `load_config("sokoban.py")` looks the bare name up
in the repository's `configs/` folder (or takes a path), then applies command-line overrides of the
form `--config.algo.eps_high=0.28`. Every problem is reported as one sentence that names the key:
an unknown key lists the valid ones, a value of the wrong type says which type was expected.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import envs_jax

from ragen_jax.algorithms.advantages import (ESTIMATORS, NEEDS_CRITIC, NORMALIZATIONS, SOFT_REWEIGHT_ESTIMATORS,
                                            TOKEN_REWARD_MODES)
from ragen_jax.algorithms.filters import (FILTER_METRICS, FILTER_SELECT, FILTER_STRATEGIES, LOSS_SCALINGS,
                                         TOP_P_MODES, FilterSpec, num_kept_groups)
from ragen_jax.algorithms.gigpo import GIGPO_NORMS, check_gigpo_args
from ragen_jax.algorithms.losses import KL_ESTIMATORS, LOSS_AGG_MODES, check_clip_args
from ragen_jax.algorithms.mismatch import TIS_MODES, TIS_SEQUENCE_CAP, TIS_TOKEN_CAP, check_tis_args
from ragen_jax.models.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from ragen_jax.models.attention import check_available as check_attention
from ragen_jax.models.gguf import expand_model_path
from ragen_jax.models.lora import check_targets as check_lora_targets
from ragen_jax.models.qwen2.config import DEMO_PRESETS, REMAT_POLICIES
from ragen_jax.rollout.types import RolloutConfig
from ragen_jax.text.conversation import PromptConfig
from ragen_jax.text.mix import format_mix, parse_mix

# Estimators whose inputs the compiled step does not pass yet: refused here, before anything compiles,
# instead of failing when prepare is traced. (GiGPO's per-turn state keys are recorded by the rollout.)
UNWIRED_ESTIMATORS: tuple[str, ...] = ()
CONFIG_DIR = Path(__file__).resolve().parent.parent.parent / "configs"


class ConfigError(ValueError):
    """A configuration problem, reported as one readable sentence."""


def _choice(name: str, value, options):
    if value not in options:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(map(repr, options))}")


def _positive(name: str, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def _whole(name: str, value, low: int, what: str = ""):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be a whole number >= {low}{f' ({what})' if what else ''}, got {value!r}")


def _micro_batch(name: str, value, batch_name: str, batch):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a whole number of trajectories >= 0 (0: all of {batch_name}), got {value!r}")
    if value and batch % value:
        raise ConfigError(f"{name}={value} must divide {batch_name}={batch} (each optimizer step is an equal "
                          "number of micro-batches)")


@dataclass
class ModelConfig:
    # Local Hugging Face directory (config.json + safetensors). None: random init from `preset`
    # (tests, benchmarks, the CPU demo); nothing is ever downloaded.
    path: Optional[str] = None
    # Random initialisation with this preset's shapes, used only when `random_init` is set (tests,
    # benchmarks, the CPU demo); a real run must name `path`.
    preset: str = "qwen2.5-0.5b"
    random_init: bool = False
    # Compute dtype; bf16 on accelerators. Params stay float32 for the optimizer (master weights).
    dtype: str = "float32"
    param_dtype: str = "float32"
    # Operand dtype of the weight matmuls, rollout and update alike (Qwen2Config.matmul_dtype): None =
    # dtype; "bfloat16" with float32 dtype rounds each projection's input and weight to bf16 and
    # accumulates in float32. On CPUs with avx512_bf16 the rollout runs ~1.7x faster (docs/decode.md).
    matmul_dtype: Optional[str] = None
    # Rematerialise each decoder layer in the backward pass: trades ~30% compute for activation memory.
    # None (auto): off for "tiny"; for every model from 0.5B up (a `path`, or any other preset) off when
    # the compiled programs fit the device without it (the Trainer's memory check, where the device's
    # memory is known: a GPU/TPU, or train.device_memory_gib), else on.
    remat: Optional[bool] = None
    # What a rematerialised layer keeps: "full" nothing (least memory), "dots" the projection/MLP
    # matmul outputs (less recompute, more memory; bench/results/attention.json).
    remat_policy: str = "full"
    # Attention kernel (ragen_jax/models/attention.py): "auto" picks per call (cudnn on GPU, splash on
    # TPU, the memory-bounded "chunked" on CPU for long rows, "xla" for short rows and decode);
    # "xla" | "chunked" | "cudnn" | "splash" force one where its layout fits.
    attention: str = "auto"
    # Critic: "separate" (a copy of the base model + value head, the reference default), "shared"
    # (value head on the policy trunk) or "none" (GRPO-family estimators need no critic).
    critic: str = "separate"
    # Start the policy from a policy export (`<run dir>/policy`, e.g. the SFT warm start).
    init_from: Optional[str] = None
    # "full": Qwen's 151,936 ids. "task": a small model vocabulary of just the ids the task's texts
    # use, mapped inside the compiled programs (random-init models only; the CPU demo).
    vocab: str = "full"
    # LoRA (RAGEN's `lora:` block): rank 0 = off (full fine-tuning). With a rank, only the adapters
    # (and the critic's value head) train and the optimizer holds state only for them, so the frozen
    # base may be stored in bf16 (param_dtype). Scale alpha / rank, as PEFT.
    lora_rank: int = 0
    lora_alpha: float = 64.0
    # Projections that get adapters: any of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj,
    # or "all-linear" (all seven, RAGEN's default).
    lora_targets: tuple = ("all-linear",)
    # PEFT's lora_dropout. Only 0 is supported (dropout on the adapters' input is not implemented);
    # the key exists so that a config asking for dropout fails clearly instead of silently.
    lora_dropout: float = 0.0

    def validate(self):
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ConfigError(f"model.lora_rank must be a whole number >= 0 (0: no LoRA), got {self.lora_rank!r}")
        if self.lora_rank:
            _positive("model.lora_alpha", self.lora_alpha)
            try:
                check_lora_targets(self.lora_targets)
            except ValueError as e:
                raise ConfigError(f"model.lora_targets: {e}") from None
        if self.lora_dropout != 0:
            raise ConfigError(f"model.lora_dropout={self.lora_dropout!r} is not supported (adapters train without "
                              "dropout); set model.lora_dropout=0")
        if self.path is None and not self.random_init:
            raise ConfigError("model.path is required: a local Hugging Face directory such as Qwen2.5-0.5B-Instruct "
                              "(or set model.random_init=true for a randomly initialised model.preset)")
        if self.path is not None:
            try:
                p = expand_model_path(self.path)
            except (ValueError, FileNotFoundError) as e:
                raise ConfigError(str(e)) from None
            if not (p.is_dir() or (p.is_file() and p.suffix.lower() == ".gguf")):
                raise ConfigError(f"model.path {self.path!r} is neither a directory nor a .gguf file")
        _choice("model.dtype", self.dtype, ("float32", "bfloat16"))
        _choice("model.param_dtype", self.param_dtype, ("float32", "bfloat16"))
        if self.matmul_dtype is not None:
            _choice("model.matmul_dtype", self.matmul_dtype, ("float32", "bfloat16"))
        _choice("model.critic", self.critic, ("separate", "shared", "none"))
        _choice("model.vocab", self.vocab, ("full", "task"))
        _choice("model.remat_policy", self.remat_policy, tuple(REMAT_POLICIES))
        _choice("model.attention", self.attention, ATTENTION_IMPLEMENTATIONS)
        if self.remat is not None and not isinstance(self.remat, bool):
            raise ConfigError(f"model.remat must be true, false or None (on from 0.5B up), got {self.remat!r}")
        try:
            check_attention(self.attention, self.dtype, query_backend=False)
        except ValueError as e:
            raise ConfigError(f"model.attention: {e}") from None

    def check_backend(self):
        """What `validate` leaves to the running backend (called once the devices exist): a cudnn or
        splash kernel that cannot run on it."""
        try:
            check_attention(self.attention, self.dtype, interpret_ok=False)
        except ValueError as e:
            raise ConfigError(f"model.attention: {e}") from None

    @property
    def use_remat(self) -> bool:
        """`remat`, with None resolved by model size (off only for the random demo presets, DEMO_PRESETS): what
        runs where the device's memory is unknown; where it is known the RL Trainer may still turn it off
        (`Trainer.remat`)."""
        if self.remat is not None:
            return self.remat
        return self.path is not None or self.preset not in DEMO_PRESETS


@dataclass
class EnvConfig:
    name: str = "Sokoban"
    # Parameter overrides passed to `envs_jax.make(name, **overrides)`. With `mix`: one dict per
    # environment of the mix, by name, e.g. {"FrozenLake": {"success_rate": 1.0}}.
    overrides: dict = field(default_factory=dict)
    # Extra environments evaluated at validation time (generalisation), e.g. ("LargerSokoban",).
    val_envs: tuple = ()
    # RAGEN-2's mixed-environment batches: several environments in one training batch, each with its
    # number of groups (their sum is rollout.num_groups), in one compiled rollout; e.g.
    # "Sokoban:4,FrozenLake:4" or (("Sokoban", 4), ("FrozenLake", 4)). Empty: train on `name` alone
    # (with a mix, `name` is not used). The envs must share the conversation (prompt settings and
    # action names); training logs train/<Env>/<metric> per env besides the batch's train/<metric>.
    mix: tuple = ()
    # The validation set: environments with their number of initial states, "Sokoban:256,FrozenLake:128"
    # (the forms of `mix`). Empty: train.val_size states of each training env and of each val_envs.
    val_set: tuple = ()

    def validate(self):
        valid = envs_jax.registered_envs()
        if not self.mix:
            _choice("env.name", self.name, valid)
        for name in self.val_envs:
            _choice("env.val_envs", name, valid)
        for key, name in [("env.name", self.name)] * (not self.mix) + [("env.val_envs", n) for n in self.val_envs]:
            if not envs_jax.get_spec(name).text_layer:
                trainable = [n for n in valid if envs_jax.get_spec(n).text_layer]
                raise ConfigError(f"{key}={name!r} runs on device but has no text layer yet, so it cannot be trained "
                                  f"or evaluated; choose one of {', '.join(trainable)}")
        if not isinstance(self.overrides, dict):
            raise ConfigError(f"env.overrides must be a dict of parameter overrides, got {self.overrides!r}")
        try:
            self.mix = parse_mix(self.mix, "env.mix") if self.mix else ()
            self.val_set = parse_mix(self.val_set, "env.val_set") if self.val_set else ()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for key, entries in (("env.mix", self.mix), ("env.val_set", self.val_set)):
            for name, _ in entries:
                _choice(key, name, valid)
        if self.val_set and self.val_envs:
            raise ConfigError("env.val_set lists the whole validation set; put the env.val_envs "
                              f"{', '.join(self.val_envs)} into it (with their sizes) and leave env.val_envs empty")
        if self.mix:
            self._check_mix()

    def _check_mix(self):
        names = [n for n, _ in self.mix]
        stray = sorted(set(self.overrides) - set(names))
        if stray:
            raise ConfigError(f"with env.mix, env.overrides holds one dict per environment of the mix by name; "
                              f"{', '.join(map(repr, stray))} {'is' if len(stray) == 1 else 'are'} not in the mix "
                              f"({', '.join(names)})")
        actions = {}
        for name in names:
            sub = self.overrides.get(name, {})
            if not isinstance(sub, dict):
                raise ConfigError(f"env.overrides[{name!r}] must be a dict of parameter overrides, got {sub!r}")
            try:
                env, params = envs_jax.make(name, **sub)
            except ValueError as e:
                raise ConfigError(f"env.overrides[{name!r}]: {e}") from None
            if not envs_jax.get_spec(name).mixable:
                mixable = [n for n in envs_jax.registered_envs() if envs_jax.get_spec(n).mixable]
                raise ConfigError(f"env.mix cannot hold {name}: it runs a conversation of its own (its envs_jax record "
                                  f"is not mixable); mix environments such as {', '.join(mixable)}")
            actions[name] = tuple(env.action_names(params))
        first = names[0]
        for name in names[1:]:
            if {a.lower() for a in actions[name]} != {a.lower() for a in actions[first]}:
                raise ConfigError(f"the environments of env.mix must name the same actions (one compiled rollout "
                                  f"parses one action list): {first} has {', '.join(actions[first])}, {name} has "
                                  f"{', '.join(actions[name])}")

    # ---- what the run uses (valid after `validate`) -------------------------------------------
    @property
    def train_envs(self) -> tuple[str, ...]:
        """The training environments: each of the mix, else `name`."""
        return tuple(n for n, _ in self.mix) if self.mix else (self.name,)

    @property
    def train_key(self) -> str:
        """The training env's key in `setup.build_text_envs`: `name`, or the mix as "A:4,B:4"."""
        return format_mix(self.mix) if self.mix else self.name

    def overrides_for(self, name: str) -> dict:
        """The parameter overrides `envs_jax.make` gets for `name` (validation envs get none)."""
        if self.mix:
            return dict(self.overrides.get(name, {}))
        return dict(self.overrides) if name == self.name else {}

    def validation_set(self, val_size: int) -> tuple[tuple[str, int], ...]:
        """((env, number of initial states), ...): `val_set`, else every training env and val_envs at val_size."""
        if self.val_set:
            return tuple(self.val_set)
        return tuple((n, val_size) for n in dict.fromkeys((*self.train_envs, *self.val_envs)))


@dataclass
class AlgoConfig:
    # Advantage estimator: "gae" (PPO with critic), "grpo", "drgrpo", "rloo", "gigpo" (GRPO's episode
    # advantage + an anchor-state step advantage, verl-agent; algorithms/gigpo.py).
    adv_estimator: str = "gae"
    # Reward normalisation grouped by initial state: identity (PPO default) / mean_std / mean / asym_clip.
    reward_norm: str = "identity"
    gamma: float = 1.0
    lam: float = 1.0
    bi_level_gae: bool = False
    # "trajectory": the episode reward on its last sampled token; "turn": each turn's on its last token.
    reward_placement: str = "trajectory"
    # PPO clip, decoupled (StarPO-S "clip-higher": 0.2 / 0.28; vanilla StarPO 0.2 / 0.2).
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip: float = 3.0  # dual-clip constant c for negative advantages
    loss_agg: str = "token-mean"
    entropy_coef: float = 0.001
    # KL to the frozen initial policy; 0 = off (StarPO-S), and then the reference is never computed.
    kl_coef: float = 0.0
    kl_type: str = "k3"
    kl_in_reward: bool = False
    value_clip: float = 0.5
    # verl trainer.critic_warmup: the actor trains from global step k on (steps count from 1), so k gives
    # k - 1 critic-only iterations (0 and 1: none).
    critic_warmup: int = 0
    # StarPO-S filter: keep this fraction of groups with the largest in-group reward std (1 = off).
    filter_ratio: float = 0.25
    filter_mode: str = "largest"
    filter_rounding: str = "floor"  # k = floor(ratio * P) as the reference's int(ratio * P)
    filter_type: str = "top_k"  # or "variance_cover"
    filter_cover: float = 0.9  # variance_cover: fraction of total variance to cover
    # RAGEN-2 group filter (ragen_jax/algorithms/filters.py). The V1 knobs above stay valid; these
    # override them when set (None: take the V1 knob). Unselected groups keep their rows with loss
    # weight 0 (static shapes), so top_p / min_p train on all P groups' rows unless capped.
    # top_k (value = fraction of groups) | top_k_abs (value = groups) | top_p (value = nucleus) |
    # min_p (value = fraction of the best score). None: filter_type (variance_cover = top_p linear).
    filter_strategy: Optional[str] = None
    filter_value: Optional[float] = None  # None: filter_ratio (top_k) or filter_cover (top_p)
    filter_select: Optional[str] = None  # largest | smallest; None: filter_mode
    # Group score: reward_std (RAGEN "reward_variance") | reward_mean | entropy_mean | entropy_std |
    # length. The entropy metrics run the old-log-prob pass over every row before filtering.
    filter_metric: str = "reward_std"
    filter_include_zero: bool = True  # False: groups whose score is 0 are never kept
    filter_top_p_mode: str = "linear"  # top_p: linear (score sums) | softmax (nucleus over softmax(scores))
    # Group slots (rows = slots x group_size) of top_p / min_p; 0: all groups. Fewer slots = less
    # update compute, but a selection larger than the cap loses its lowest-ranked groups.
    filter_max_groups: int = 0
    # Advantages x the kept fraction of groups ("linear") or its square root ("sqrt") (RAGEN
    # actor.filter_loss_scaling).
    filter_loss_scaling: str = "none"
    # Advantages x group std / max group std over the kept groups (RAGEN algorithm.soft_advantage_reweight).
    # GRPO only, as RAGEN (only its GRPO branch returns the group std the reweighting reads); with
    # another estimator the config refuses it rather than ignore it silently.
    soft_advantage_reweight: bool = False
    # GiGPO (adv_estimator="gigpo"): A = A_episode + gigpo_weight * A_step (verl-agent step_advantage_w).
    gigpo_weight: float = 1.0
    # Normalisation of both terms within their groups: "std" (x - mean) / (std + 1e-6) (verl-agent
    # mean_std_norm, its function default) | "none" x - mean (mean_norm, used by many of its scripts).
    gigpo_norm: str = "std"
    # Discount of the step returns G_k = r_k + gamma G_{k+1} over an episode's turns (verl-agent gamma 0.95).
    gigpo_gamma: float = 0.95
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
    ppo_epochs: int = 1
    mini_batch_size: int = 32  # trajectories per optimizer step
    # Trajectories per forward/backward pass (verl's ppo_micro_batch_size_per_gpu, but for the whole
    # mesh): a mini-batch's gradient is accumulated over mini_batch_size / micro_batch_size passes,
    # which bounds activation memory without changing the optimizer step (same loss and gradient
    # for every loss_agg mode). Also the row block of the no-grad log-prob/value passes. 0: the
    # whole mini-batch in one pass. Must divide mini_batch_size and be a multiple of the mesh's
    # data x fsdp devices.
    micro_batch_size: int = 0

    def validate(self):
        # Option names come from the registries that implement them (one list per option).
        _choice("algo.adv_estimator", self.adv_estimator, tuple(ESTIMATORS))
        if self.adv_estimator in UNWIRED_ESTIMATORS:
            raise ConfigError(f"algo.adv_estimator={self.adv_estimator!r} exists in ragen_jax.algorithms but the "
                              "trainer does not feed it its per-turn state keys yet; choose one of "
                              f"{', '.join(e for e in ESTIMATORS if e not in UNWIRED_ESTIMATORS)}")
        _choice("algo.reward_norm", self.reward_norm, tuple(NORMALIZATIONS))
        _choice("algo.reward_placement", self.reward_placement, TOKEN_REWARD_MODES)
        _choice("algo.loss_agg", self.loss_agg, LOSS_AGG_MODES)
        _choice("algo.kl_type", self.kl_type, tuple(KL_ESTIMATORS))
        _choice("algo.filter_mode", self.filter_mode, ("largest", "smallest"))
        _choice("algo.filter_type", self.filter_type, ("top_k", "variance_cover"))
        _choice("algo.filter_rounding", self.filter_rounding, ("floor", "ceil"))
        if not 0 < self.filter_ratio <= 1:
            raise ConfigError(f"algo.filter_ratio must be in (0, 1], got {self.filter_ratio!r}")
        if self.filter_strategy is not None:
            _choice("algo.filter_strategy", self.filter_strategy, tuple(FILTER_STRATEGIES))
        if self.filter_select is not None:
            _choice("algo.filter_select", self.filter_select, FILTER_SELECT)
        _choice("algo.filter_metric", self.filter_metric, tuple(FILTER_METRICS))
        _choice("algo.filter_top_p_mode", self.filter_top_p_mode, TOP_P_MODES)
        _choice("algo.filter_loss_scaling", self.filter_loss_scaling, tuple(LOSS_SCALINGS))
        for name in ("filter_include_zero", "soft_advantage_reweight"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"algo.{name} must be true or false, got {getattr(self, name)!r}")
        if self.filter_value is not None:
            _positive("algo.filter_value", self.filter_value)
        if isinstance(self.filter_max_groups, bool) or not isinstance(self.filter_max_groups, int) \
                or self.filter_max_groups < 0:
            raise ConfigError(f"algo.filter_max_groups must be a whole number >= 0 (0: all groups), "
                              f"got {self.filter_max_groups!r}")
        try:
            check_clip_args(self.eps_low, self.eps_high, self.dual_clip)
        except ValueError as e:
            raise ConfigError(f"algo.{e}") from None
        # The update scans ppo_epochs x (kept rows / mini_batch_size) steps: both are static counts.
        _whole("algo.ppo_epochs", self.ppo_epochs, 1)
        _whole("algo.mini_batch_size", self.mini_batch_size, 1, "trajectories per optimizer step")
        _micro_batch("algo.micro_batch_size", self.micro_batch_size, "algo.mini_batch_size", self.mini_batch_size)
        _whole("algo.critic_warmup", self.critic_warmup, 0, "global step the actor starts training at")
        _positive("algo.kl_coef", self.kl_coef, allow_zero=True)
        _positive("algo.entropy_coef", self.entropy_coef, allow_zero=True)
        _positive("algo.value_clip", self.value_clip)
        _positive("algo.filter_cover", self.filter_cover)
        for name in ("gamma", "lam"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ConfigError(f"algo.{name} must be a number in [0, 1] (a discount of the GAE returns), got {v!r}")
        self._validate_gigpo_tis()

    def _validate_gigpo_tis(self):
        if self.soft_advantage_reweight and self.adv_estimator not in SOFT_REWEIGHT_ESTIMATORS:
            raise ConfigError(f"algo.soft_advantage_reweight works only with algo.adv_estimator="
                              f"{' or '.join(sorted(SOFT_REWEIGHT_ESTIMATORS))} (as in RAGEN), not "
                              f"{self.adv_estimator!r}; set algo.soft_advantage_reweight=false")
        _choice("algo.gigpo_norm", self.gigpo_norm, GIGPO_NORMS)
        _choice("algo.tis", self.tis, TIS_MODES)
        try:
            check_gigpo_args(self.gigpo_weight, self.gigpo_norm, self.gigpo_gamma)
            check_tis_args(self.tis, self.effective_tis_cap)
        except ValueError as e:
            raise ConfigError(f"algo.{e}") from None
        try:
            if not isinstance(self.tis_geo_mask, (tuple, list)):
                raise ValueError
            check_tis_args(self.tis, self.effective_tis_cap, tuple(self.tis_geo_mask) or None)
        except (ValueError, TypeError):
            raise ConfigError(f"algo.tis_geo_mask must be (low, high) with 0 < low <= 1 <= high (SkyRL: (0.99, 1.01)) "
                              f"or () for off, got {self.tis_geo_mask!r}") from None
        if self.tis_geo_mask and self.tis == "none":
            raise ConfigError("algo.tis_geo_mask applies to the TIS weights; set algo.tis to 'token' or 'sequence' "
                              "or leave algo.tis_geo_mask empty")

    @property
    def needs_state_keys(self) -> bool:
        """The training rollout records per-turn observation keys (GiGPO's anchor states)."""
        return self.adv_estimator == "gigpo"

    @property
    def effective_tis_cap(self) -> float:
        """`tis_cap`, or the default cap of the TIS mode (2.0 token and none, 5.0 sequence)."""
        if self.tis_cap is not None:
            return self.tis_cap
        return TIS_SEQUENCE_CAP if self.tis == "sequence" else TIS_TOKEN_CAP

    def filter_spec(self, num_groups: int) -> FilterSpec:
        """The effective group filter: the RAGEN-2 knobs where set, else the V1 ones (filter_type
        variance_cover = top_p linear with filter_cover, at most num_kept_groups(filter_ratio) groups)."""
        legacy_cover = self.filter_strategy is None and self.filter_type == "variance_cover"
        strategy = self.filter_strategy or ("top_p" if legacy_cover else "top_k")
        value = self.filter_value
        if value is None:
            if strategy not in ("top_k", "top_p"):
                raise ConfigError(f"algo.filter_strategy={strategy!r} needs algo.filter_value "
                                  "(top_k_abs: a number of groups; min_p: a fraction of the best score)")
            value = self.filter_ratio if strategy == "top_k" else self.filter_cover
        max_groups = self.filter_max_groups
        if legacy_cover and not max_groups:
            max_groups = num_kept_groups(num_groups, self.filter_ratio, self.filter_rounding)
        if max_groups > num_groups:
            raise ConfigError(f"algo.filter_max_groups={max_groups} exceeds rollout.num_groups={num_groups}")
        try:
            return FilterSpec(strategy=strategy, value=value, select=self.filter_select or self.filter_mode,
                              metric=self.filter_metric, include_zero=self.filter_include_zero,
                              top_p_mode=self.filter_top_p_mode, max_groups=max_groups,
                              rounding=self.filter_rounding)
        except ValueError as e:
            # FilterSpec names its fields ("filter value ..."); the keys they come from are algo.filter_<field>.
            raise ConfigError(f"algo.{str(e).replace('filter ', 'filter_', 1)}") from None


@dataclass
class OptimConfig:
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    grad_clip: float = 1.0
    warmup_steps: int = 0  # linear warm-up of the learning rate, then constant

    def validate(self):
        _positive("optim.actor_lr", self.actor_lr)
        _positive("optim.critic_lr", self.critic_lr)
        _positive("optim.grad_clip", self.grad_clip)


@dataclass
class MeshConfig:
    # Device mesh axes; -1 = all remaining devices. Batch is sharded over data x fsdp, params over
    # fsdp x tensor by the model's sharding table.
    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def validate(self):
        sizes = {"mesh.data": self.data, "mesh.fsdp": self.fsdp, "mesh.tensor": self.tensor}
        for name, v in sizes.items():
            if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1):
                raise ConfigError(f"{name} must be a positive number of devices or -1 (all remaining), got {v!r}")
        if list(sizes.values()).count(-1) > 1:
            raise ConfigError("at most one of mesh.data, mesh.fsdp, mesh.tensor may be -1 (all remaining devices)")


@dataclass
class TrainConfig:
    iterations: int = 200
    seed: int = 0
    seed_base: int = 10000  # group g of iteration i starts from seed_base + P*i + g (reference)
    val_every: int = 10  # validate before training and every k iterations (0 = never)
    val_size: int = 256  # fixed validation states, seeds val_seed .. val_seed + val_size - 1
    val_seed: int = 123
    val_temperature: float = 0.5
    save_every: int = 10
    keep_checkpoints: int = 3
    log_samples: int = 2  # conversations written to TensorBoard as text per log step
    # Device memory (GiB) the compiled programs must fit in, checked before the first iteration from
    # their memory_analysis (see trainer/memory.py program_memory). 0: what the device reports (GPU/TPU
    # bytes_limit); CPU reports nothing, so there the check runs only when this is set.
    device_memory_gib: float = 0.0
    # Reasoning-collapse diagnostics (RAGEN-2 collapse_detection, ragen_jax/trainer/collapse.py),
    # logged under collapse/: at iteration 1 and every k iterations, on the rollout batch before the
    # filter. 0 = never.
    collapse_every: int = 5
    # M: sampled (prompt, first-turn reasoning) pairs; each is scored under every group's prompt
    # (M x rollout.num_groups teacher-forced rows in one compiled pass). RAGEN num_samples.
    collapse_samples: int = 64
    # Early stops (0 = off): the Trainer saves, logs early_stopped/<rule> = 1 and stops.
    # N consecutive iterations whose filter kept no group (RAGEN rollout_filter_empty_stop_steps: 5).
    stop_empty_filter: int = 0
    # rollout/in_group_std below this fraction of its mean over the first stop_std_window iterations,
    # for stop_std_window consecutive iterations after them (RAGEN: 0.1 and 10).
    stop_std_fraction: float = 0.0
    stop_std_window: int = 10
    # Validation success of any env below this floor at stop_val_count consecutive validations
    # (RAGEN: 0.01 and 5).
    stop_val_success: float = 0.0
    stop_val_count: int = 5

    def validate(self):
        for name in ("collapse_every", "collapse_samples", "stop_empty_filter", "stop_std_window", "stop_val_count"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"train.{name} must be a whole number >= 0, got {v!r}")
        if self.collapse_every and self.collapse_samples < 2:
            raise ConfigError(f"train.collapse_samples must be >= 2 (pairs from at least two prompts) when "
                              f"train.collapse_every > 0, got {self.collapse_samples!r}")
        if not 0 <= self.stop_std_fraction < 1:
            raise ConfigError(f"train.stop_std_fraction must be in [0, 1) (0: off), got {self.stop_std_fraction!r}")
        if self.stop_std_fraction and not self.stop_std_window:
            raise ConfigError("train.stop_std_window must be >= 1 when train.stop_std_fraction is set")
        if not 0 <= self.stop_val_success <= 1:
            raise ConfigError(f"train.stop_val_success must be in [0, 1] (0: off), got {self.stop_val_success!r}")
        if self.stop_val_success and not self.stop_val_count:
            raise ConfigError("train.stop_val_count must be >= 1 when train.stop_val_success is set")
        _positive("train.iterations", self.iterations)
        _positive("train.val_every", self.val_every, allow_zero=True)
        _positive("train.val_size", self.val_size)
        _positive("train.save_every", self.save_every)
        _positive("train.keep_checkpoints", self.keep_checkpoints)
        _positive("train.device_memory_gib", self.device_memory_gib, allow_zero=True)


@dataclass
class SFTConfig:
    """Supervised warm start on solver demonstrations (launch/sft.py)."""

    num_demos: int = 1024  # demonstration episodes (reference: 1k BFS-solver trajectories)
    demo_seed: int = 50000  # demos use seeds demo_seed.. (disjoint from training and validation seeds)
    epochs: int = 2
    batch_size: int = 32  # trajectories per optimizer step
    # Trajectories per forward/backward pass; the step's gradient is accumulated over
    # batch_size / micro_batch_size passes (same loss and gradient, less activation memory).
    # 0: the whole batch in one pass. Must divide batch_size (and split over the mesh's batch devices).
    micro_batch_size: int = 0
    lr: float = 1e-5
    # "constant" (after optim.warmup_steps), or "cosine": decay to 0 over the planned steps
    # (epochs x num_demos // batch_size; dropped demos end it slightly above 0). Annealing makes the
    # result the average of the last steps rather than wherever the last noisy mini-batches left it.
    lr_schedule: str = "constant"
    # Bandit demonstrations choose the high-risk arm with this probability; 0.5 teaches only the
    # format, leaving the risk preference for RL to discover.
    bandit_high_prob: float = 0.5
    save_every: int = 100  # optimizer steps between checkpoints
    # Speed, not semantics (the loss of a given batch is the same up to float rounding):
    # shared_prefix: the tokens every demonstration starts with (system prompt + instructions: 174
    # of Sokoban's ~300) go through the model once per step, not once per row.
    shared_prefix: bool = True
    # length_bucket: demos are grouped by their length after the shared prefix, rounded up to this
    # many tokens; each batch is drawn from one group and padded only to its width (one compiled
    # step per width). 0: one width for all, the longest demo's. Sokoban's demos are 1 turn (~100
    # tokens after the prefix) or 2 turns (~220): without buckets every batch pays for 2 turns.
    length_bucket: int = 64

    def validate(self):
        _positive("sft.num_demos", self.num_demos)
        if isinstance(self.length_bucket, bool) or not isinstance(self.length_bucket, int) or self.length_bucket < 0:
            raise ConfigError(f"sft.length_bucket must be a whole number of tokens >= 0 (0: no buckets), "
                              f"got {self.length_bucket!r}")
        _positive("sft.epochs", self.epochs)
        _positive("sft.batch_size", self.batch_size)
        _micro_batch("sft.micro_batch_size", self.micro_batch_size, "sft.batch_size", self.batch_size)
        _positive("sft.lr", self.lr)
        _choice("sft.lr_schedule", self.lr_schedule, ("constant", "cosine"))
        if not 0 <= self.bandit_high_prob <= 1:
            raise ConfigError(f"sft.bandit_high_prob must be in [0, 1], got {self.bandit_high_prob!r}")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    # The conversation (ragen_jax.text.PromptConfig) and the training rollout
    # (ragen_jax.rollout.RolloutConfig) are configured by the classes that use them.
    prompt: PromptConfig = field(default_factory=PromptConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def validate(self) -> "Config":
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            try:
                sub.validate()
            except ConfigError:
                raise
            except ValueError as e:  # the text and rollout stages name their own classes
                raise ConfigError(str(e).replace(f"{type(sub).__name__}.", f"{f.name}.")) from None
        if self.rollout.cache_dtype is not None:
            _choice("rollout.cache_dtype", self.rollout.cache_dtype, ("float32", "bfloat16"))
        a, r = self.algo, self.rollout
        if self.env.mix and sum(g for _, g in self.env.mix) != r.num_groups:
            raise ConfigError(f"env.mix={format_mix(self.env.mix)!r} has {sum(g for _, g in self.env.mix)} groups in all "
                              f"but rollout.num_groups={r.num_groups}; make the mix's group counts sum to num_groups")
        if self.env.mix and 0 < r.groups_per_pass < r.num_groups:
            raise ConfigError("rollout.groups_per_pass does not work with env.mix yet (the mix assigns envs by row "
                              "of the whole batch); set rollout.groups_per_pass=0")

        if self.prompt.single_turn and self.env.mix:
            raise ConfigError("prompt.context_window_mode='single_turn' does not work with env.mix yet (each turn is "
                              "scored behind one prompt prefix shared by every row); use 'full' or one env")

        spec = a.filter_spec(r.num_groups)
        slots = spec.slots(r.num_groups)
        kept = slots * r.group_size
        if kept < a.mini_batch_size:
            raise ConfigError(
                f"the filter keeps {kept} trajectories per iteration ({slots} of rollout.num_groups={r.num_groups} "
                f"groups ({spec.strategy}, value {spec.value}) x rollout.group_size={r.group_size}), fewer than "
                f"algo.mini_batch_size={a.mini_batch_size}")
        if kept % a.mini_batch_size:
            raise ConfigError(f"kept trajectories per iteration ({kept} = {slots} groups x {r.group_size}) must be a "
                              f"multiple of algo.mini_batch_size={a.mini_batch_size}")
        if spec.input_name == "entropy" and (r.num_groups * r.group_size) % min(
                a.micro_batch_size or a.mini_batch_size, r.num_groups * r.group_size):
            raise ConfigError(f"algo.filter_metric={a.filter_metric!r} runs the log-prob pass over all "
                              f"{r.num_groups * r.group_size} rollout rows before filtering, in blocks of "
                              f"algo.micro_batch_size (0: mini_batch_size); the block must divide the rows")
        if a.adv_estimator in NEEDS_CRITIC and self.model.critic == "none":
            raise ConfigError(f"algo.adv_estimator={a.adv_estimator!r} needs a critic; set model.critic to 'separate' "
                              "or 'shared'")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------- loading
def resolve_config_path(name: str) -> Path:
    p = Path(name)
    if p.suffix != ".py":
        p = p.with_suffix(".py")
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, CONFIG_DIR / p.name]
    for c in candidates:
        if c.is_file():
            return c
    available = sorted(x.name for x in CONFIG_DIR.glob("*.py") if not x.name.startswith("_"))
    raise ConfigError(f"config {name!r} not found (looked in {', '.join(str(c.parent) for c in candidates)}); "
                      f"available in configs/: {', '.join(available)}")


def load_config(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load `configs/<name>` (or a path), apply `a.b=value` overrides, validate."""
    path = resolve_config_path(name)
    spec = importlib.util.spec_from_file_location(f"ragen_jax_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path} defines no get_config() function")
    cfg = module.get_config()
    if not isinstance(cfg, Config):
        raise ConfigError(f"{path}: get_config() must return ragen_jax.experiment.config.Config, got {type(cfg).__name__}")
    for ov in overrides:
        apply_override(cfg, ov)
    return cfg.validate()


def apply_override(cfg: Config, text: str) -> None:
    """Apply one `section.key=value` (a leading `config.` or `--config.` is accepted)."""
    body = text[2:] if text.startswith("--") else text
    if body.startswith("config."):
        body = body[len("config."):]
    if "=" not in body:
        raise ConfigError(f"override {text!r} must look like --config.section.key=value")
    dotted, raw = body.split("=", 1)
    parts = dotted.split(".")
    obj = cfg
    for i, name in enumerate(parts):
        if not dataclasses.is_dataclass(obj):
            if isinstance(obj, dict) and i == len(parts) - 1:
                obj[name] = _parse_literal(raw)
                return
            raise ConfigError(f"override {text!r}: {'.'.join(parts[:i])} has no sub-keys")
        names = [f.name for f in dataclasses.fields(obj)]
        if name not in names:
            where = ".".join(parts[:i]) or "config"
            raise ConfigError(f"unknown config key {'.'.join(parts[: i + 1])!r}; valid keys of {where}: {', '.join(names)}")
        if i == len(parts) - 1:
            hint = typing.get_type_hints(type(obj))[name]
            setattr(obj, name, _coerce(".".join(parts), raw, hint))
            return
        obj = getattr(obj, name)


def _parse_literal(raw: str):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def _coerce(key: str, raw: str, hint) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if raw in ("None", "none", "null"):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        low = raw.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key} expects true/false, got {raw!r}")
    if hint is int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{key} expects an integer, got {raw!r}") from None
    if hint is float:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{key} expects a number, got {raw!r}") from None
    if hint is str:
        return raw
    value = _parse_literal(raw)
    want = {tuple: tuple, dict: dict, list: list}.get(hint if origin is None else origin)
    if want is not None:
        if isinstance(value, (list, tuple)) and want is tuple:
            return tuple(value)
        if isinstance(value, str) and want is tuple:
            return tuple(v for v in value.split(",") if v)
        if not isinstance(value, want):
            raise ConfigError(f"{key} expects a {want.__name__}, got {raw!r}")
    return value


# Keys that moved since runs were saved: old dotted name -> new one. A saved run directory's
# config.json is read through `migrate_saved`, so old runs resume and evaluate unchanged.
RENAMED_KEYS = {"model.cache_dtype": "rollout.cache_dtype"}


def migrate_saved(d: dict) -> dict:
    """A saved config dict with renamed keys moved to their current place (a new dict)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for old, new in RENAMED_KEYS.items():
        (os_, ok), (ns, nk) = old.split("."), new.split(".")
        if ok in out.get(os_, {}):
            out.setdefault(ns, {})[nk] = out[os_].pop(ok)
    return out


def config_from_dict(d: dict) -> Config:
    """Inverse of `Config.to_dict` (used to restore the config saved in a run directory)."""
    d = migrate_saved(d)
    kwargs = {}
    for f in dataclasses.fields(Config):
        sub_cls = typing.get_type_hints(Config)[f.name]
        sub = d.get(f.name, {})
        names = {g.name for g in dataclasses.fields(sub_cls)}
        unknown = set(sub) - names
        if unknown:
            raise ConfigError(f"saved config has unknown keys in {f.name}: {', '.join(sorted(unknown))}")
        vals = {k: tuple(v) if isinstance(v, list) else v for k, v in sub.items()}
        kwargs[f.name] = sub_cls(**vals)
    return Config(**kwargs)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
