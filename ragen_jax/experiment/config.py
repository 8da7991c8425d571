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
import re
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import envs_jax

from ragen_jax.algorithms.filters import num_kept_groups
from ragen_jax.algorithms.gigpo import GiGPOOptions
from ragen_jax.experiment.sections import (AdvantageConfig, BatchingConfig, ConfigError, FilterConfig, LossConfig,
                                          choice, micro_batch, positive)
from ragen_jax.models.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from ragen_jax.models.attention import check_available as check_attention
from ragen_jax.models.gguf import expand_model_path
from ragen_jax.models.lora import check_targets as check_lora_targets
from ragen_jax.models.qwen2.config import DEMO_PRESETS, REMAT_POLICIES
from ragen_jax.rollout.types import RolloutConfig
from ragen_jax.text.conversation import PromptConfig
from ragen_jax.text.mix import format_mix, parse_mix

CONFIG_DIR = Path(__file__).resolve().parent.parent.parent / "configs"


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
            positive("model.lora_alpha", self.lora_alpha)
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
        choice("model.dtype", self.dtype, ("float32", "bfloat16"))
        choice("model.param_dtype", self.param_dtype, ("float32", "bfloat16"))
        if self.matmul_dtype is not None:
            choice("model.matmul_dtype", self.matmul_dtype, ("float32", "bfloat16"))
        choice("model.critic", self.critic, ("separate", "shared", "none"))
        choice("model.vocab", self.vocab, ("full", "task"))
        choice("model.remat_policy", self.remat_policy, tuple(REMAT_POLICIES))
        choice("model.attention", self.attention, ATTENTION_IMPLEMENTATIONS)
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
            choice("env.name", self.name, valid)
        for name in self.val_envs:
            choice("env.val_envs", name, valid)
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
                choice(key, name, valid)
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
class OptimConfig:
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    grad_clip: float = 1.0
    warmup_steps: int = 0  # linear warm-up of the learning rate, then constant

    def validate(self):
        positive("optim.actor_lr", self.actor_lr)
        positive("optim.critic_lr", self.critic_lr)
        positive("optim.grad_clip", self.grad_clip)


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
        positive("train.iterations", self.iterations)
        positive("train.val_every", self.val_every, allow_zero=True)
        positive("train.val_size", self.val_size)
        positive("train.save_every", self.save_every)
        positive("train.keep_checkpoints", self.keep_checkpoints)
        positive("train.device_memory_gib", self.device_memory_gib, allow_zero=True)


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
        positive("sft.num_demos", self.num_demos)
        if isinstance(self.length_bucket, bool) or not isinstance(self.length_bucket, int) or self.length_bucket < 0:
            raise ConfigError(f"sft.length_bucket must be a whole number of tokens >= 0 (0: no buckets), "
                              f"got {self.length_bucket!r}")
        positive("sft.epochs", self.epochs)
        positive("sft.batch_size", self.batch_size)
        micro_batch("sft.micro_batch_size", self.micro_batch_size, "sft.batch_size", self.batch_size)
        positive("sft.lr", self.lr)
        choice("sft.lr_schedule", self.lr_schedule, ("constant", "cosine"))
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
    # The algorithm, one section per object that reads it (ragen_jax/experiment/sections.py); the old
    # `algo.*` names still work through `Config.algo` (LEGACY_ALGO_KEYS).
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def __post_init__(self):
        # Set through the old `algo.*` names: the V1 filter knobs, translated in `validate` (they depend on
        # rollout.num_groups), and new key -> old name, so an error names the key the user wrote.
        self.legacy_filter: dict = {}
        self.legacy_names: dict = {}

    @property
    def algo(self) -> "LegacyAlgo":
        """The old `algo` section: reads and writes go to the new sections, with a deprecation warning."""
        return LegacyAlgo(self)

    def validate(self) -> "Config":
        try:
            self._validate()
        except ConfigError as e:
            key = next((k for k in self.legacy_names if re.search(rf"\b{re.escape(k)}\b", str(e))), None)
            if key is not None:
                raise ConfigError(f"{e} (set through the old name {self.legacy_names[key]})") from None
            raise
        return self

    def _validate(self):
        if self.legacy_filter:
            r = self.rollout.num_groups
            for k, v in translate_v1_filter(self.legacy_filter, self.filter,
                                            r if isinstance(r, int) and r > 0 else 1).items():
                setattr(self.filter, k, v)
            self.legacy_filter = {}
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            try:
                sub.validate()
            except ConfigError:
                raise
            except ValueError as e:  # the text and rollout stages name their own classes
                raise ConfigError(str(e).replace(f"{type(sub).__name__}.", f"{f.name}.")) from None
        if self.rollout.cache_dtype is not None:
            choice("rollout.cache_dtype", self.rollout.cache_dtype, ("float32", "bfloat16"))
        r, b, spec = self.rollout, self.batching, self.filter.spec
        if self.env.mix and sum(g for _, g in self.env.mix) != r.num_groups:
            raise ConfigError(f"env.mix={format_mix(self.env.mix)!r} has {sum(g for _, g in self.env.mix)} groups in all "
                              f"but rollout.num_groups={r.num_groups}; make the mix's group counts sum to num_groups")
        if self.env.mix and 0 < r.groups_per_pass < r.num_groups:
            raise ConfigError("rollout.groups_per_pass does not work with env.mix yet (the mix assigns envs by row "
                              "of the whole batch); set rollout.groups_per_pass=0")

        if self.prompt.single_turn and self.env.mix:
            raise ConfigError("prompt.context_window_mode='single_turn' does not work with env.mix yet (each turn is "
                              "scored behind one prompt prefix shared by every row); use 'full' or one env")
        if spec.max_groups > r.num_groups:
            raise ConfigError(f"filter.max_groups={spec.max_groups} exceeds rollout.num_groups={r.num_groups}")
        slots = spec.slots(r.num_groups)
        kept = slots * r.group_size
        if kept < b.mini_batch_size:
            raise ConfigError(
                f"the filter keeps {kept} trajectories per iteration ({slots} of rollout.num_groups={r.num_groups} "
                f"groups ({spec.strategy}, value {spec.value}) x rollout.group_size={r.group_size}), fewer than "
                f"batching.mini_batch_size={b.mini_batch_size}")
        if kept % b.mini_batch_size:
            raise ConfigError(f"kept trajectories per iteration ({kept} = {slots} groups x {r.group_size}) must be a "
                              f"multiple of batching.mini_batch_size={b.mini_batch_size}")
        if spec.input_name == "entropy" and (r.num_groups * r.group_size) % min(
                b.micro_batch_size or b.mini_batch_size, r.num_groups * r.group_size):
            raise ConfigError(f"filter.metric={spec.metric!r} runs the log-prob pass over all "
                              f"{r.num_groups * r.group_size} rollout rows before filtering, in blocks of "
                              f"batching.micro_batch_size (0: mini_batch_size); the block must divide the rows")
        if self.advantage.record.needs_critic and self.model.critic == "none":
            raise ConfigError(f"advantage.estimator={self.advantage.estimator!r} needs a critic; set model.critic to "
                              "'separate' or 'shared'")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------- old algo.* names
def _section_keys(section: str, names: str, renames: dict | None = None) -> dict:
    renames = renames or {}
    return {old: (section, renames.get(old, old)) for old in names.split()}


# The old `algo` section, key by key: old name -> (section, key). Overrides, `cfg.algo.x = v` in config
# files and saved config.json files keep working through it, with a deprecation warning.
LEGACY_ALGO_KEYS = {
    **_section_keys("advantage", "adv_estimator reward_norm gamma lam bi_level_gae reward_placement "
                    "soft_advantage_reweight gigpo_weight gigpo_norm gigpo_gamma",
                    {"adv_estimator": "estimator", "soft_advantage_reweight": "soft_reweight",
                     **{f"gigpo_{k}": f"options.{k}" for k in ("weight", "norm", "gamma")}}),
    **_section_keys("loss", "eps_low eps_high dual_clip loss_agg entropy_coef kl_coef kl_type kl_in_reward "
                    "value_clip tis tis_cap tis_geo_mask", {"loss_agg": "agg"}),
    **_section_keys("batching", "ppo_epochs mini_batch_size micro_batch_size critic_warmup"),
    **_section_keys("filter", "filter_metric filter_include_zero filter_top_p_mode filter_max_groups "
                    "filter_rounding filter_loss_scaling",
                    {f"filter_{k}": k for k in ("metric", "include_zero", "top_p_mode", "max_groups", "rounding",
                                                "loss_scaling")}),
}
# The old filter knobs with no one new key (V1's ratio / mode / type / cover, and RAGEN-2's
# strategy / value / select whose None meant "take the V1 knob"): old name -> (type, V1 default).
# They are translated together by `translate_v1_filter` once rollout.num_groups is known.
V1_FILTER_KEYS = {"filter_ratio": (float, 0.25), "filter_mode": (str, "largest"), "filter_type": (str, "top_k"),
                  "filter_cover": (float, 0.9), "filter_strategy": (Optional[str], None),
                  "filter_value": (Optional[float], None), "filter_select": (Optional[str], None)}


# GiGPO's options under their released names (advantage.gigpo_weight, ...): now advantage.options.<name>.
LEGACY_OPTION_KEYS = {f"gigpo_{k}": k for k in ("weight", "norm", "gamma")}


def _deprecated(old: str, new: str):
    warnings.warn(f"algo.{old} is deprecated; use {new}", FutureWarning, stacklevel=4)


def _get_key(section_obj, key: str):
    """A section's key; "options.<name>": the estimator option (its default while unset)."""
    if key.startswith("options."):
        name = key.split(".", 1)[1]
        default = {f.name: f.default for f in dataclasses.fields(GiGPOOptions)}.get(name)
        return section_obj.options.get(name, default)
    return getattr(section_obj, key)


def _set_key(section_obj, key: str, value) -> None:
    if key.startswith("options."):
        section_obj.options[key.split(".", 1)[1]] = value
    else:
        setattr(section_obj, key, value)


def _legacy_key_hint(section: str, key: str):
    """The type a legacy key's value is coerced to."""
    if key.startswith("options."):
        return typing.get_type_hints(GiGPOOptions)[key.split(".", 1)[1]]
    return typing.get_type_hints(type(getattr(Config(), section)))[key]


def translate_v1_filter(legacy: dict, current: FilterConfig, num_groups: int) -> dict:
    """The filter section's strategy / value / select / max_groups that the old knobs in `legacy` meant,
    exactly as the old AlgoConfig.filter_spec: an explicit RAGEN-2 strategy (old name, or a non-default
    filter.strategy) wins; otherwise filter_type variance_cover = top_p linear with filter_cover, at most
    num_kept_groups(P, filter_ratio, rounding) groups, and top_k = filter_ratio."""
    # A top_k section's value and select are V1's filter_ratio and filter_mode (configs now set those).
    current_v1 = {"filter_mode": current.select}
    if current.strategy == "top_k":
        current_v1["filter_ratio"] = current.value
    v1 = {k: legacy.get(k, current_v1.get(k, d)) for k, (_, d) in V1_FILTER_KEYS.items()}
    if isinstance(v1["filter_ratio"], bool) or not isinstance(v1["filter_ratio"], (int, float)) \
            or not 0 < v1["filter_ratio"] <= 1:
        raise ConfigError(f"algo.filter_ratio must be in (0, 1], got {v1['filter_ratio']!r}")
    choice("algo.filter_mode", v1["filter_mode"], ("largest", "smallest"))
    choice("algo.filter_type", v1["filter_type"], ("top_k", "variance_cover"))
    positive("algo.filter_cover", v1["filter_cover"])
    choice("filter.rounding", current.rounding, ("floor", "ceil"))
    strategy, value, select = v1["filter_strategy"], v1["filter_value"], v1["filter_select"]
    if strategy is None and current.strategy != FilterConfig.strategy and "filter_type" not in legacy:
        strategy, value = current.strategy, current.value if value is None else value
    legacy_cover = strategy is None and v1["filter_type"] == "variance_cover"
    strategy = strategy or ("top_p" if legacy_cover else "top_k")
    if value is None:
        if strategy in ("top_k_abs", "min_p"):
            raise ConfigError(f"algo.filter_strategy={strategy!r} needs a value; set filter.value "
                              "(top_k_abs: a number of groups; min_p: a fraction of the best score)")
        value = v1["filter_ratio"] if strategy == "top_k" else v1["filter_cover"]
    max_groups = current.max_groups
    if legacy_cover and not max_groups:
        max_groups = num_kept_groups(num_groups, v1["filter_ratio"], current.rounding)
    return {"strategy": strategy, "value": value, "select": select or v1["filter_mode"], "max_groups": max_groups}


class LegacyAlgo:
    """`cfg.algo`: the old section's names, read and written on the new sections (deprecated)."""

    def __init__(self, cfg: Config):
        object.__setattr__(self, "cfg", cfg)

    def __getattr__(self, name):
        cfg = object.__getattribute__(self, "cfg")
        if name in LEGACY_ALGO_KEYS:
            section, key = LEGACY_ALGO_KEYS[name]
            _deprecated(name, f"{section}.{key}")
            return _get_key(getattr(cfg, section), key)
        if name in V1_FILTER_KEYS:
            _deprecated(name, "filter.strategy / filter.value / filter.select / filter.max_groups")
            return cfg.legacy_filter.get(name, V1_FILTER_KEYS[name][1])
        raise AttributeError(f"algo has no key {name!r}; the algorithm's keys are in the sections advantage, loss, "
                             "filter and batching")

    def __setattr__(self, name, value):
        cfg = object.__getattribute__(self, "cfg")
        if name in LEGACY_ALGO_KEYS:
            section, key = LEGACY_ALGO_KEYS[name]
            _deprecated(name, f"{section}.{key}")
            cfg.legacy_names[f"{section}.{key}"] = f"algo.{name}"
            _set_key(getattr(cfg, section), key, value)
        elif name in V1_FILTER_KEYS:
            _deprecated(name, "filter.strategy / filter.value / filter.select / filter.max_groups")
            cfg.legacy_filter[name] = value
            if name in ("filter_strategy", "filter_value", "filter_select"):
                cfg.legacy_names[name.replace("_", ".", 1)] = f"algo.{name}"
        else:
            raise ConfigError(f"unknown config key 'algo.{name}'; the old algo keys are "
                              f"{', '.join([*LEGACY_ALGO_KEYS, *V1_FILTER_KEYS])}")


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
    if parts[0] == "algo" and len(parts) == 2:
        _legacy_override(cfg, parts[1], raw)
        return
    if parts[0] == "advantage" and len(parts) == 2 and parts[1] in LEGACY_OPTION_KEYS:
        key = f"options.{LEGACY_OPTION_KEYS[parts[1]]}"
        warnings.warn(f"advantage.{parts[1]} is deprecated; use advantage.{key}", FutureWarning, stacklevel=2)
        _set_key(cfg.advantage, key, _coerce(dotted, raw, _legacy_key_hint("advantage", key)))
        return
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


def _legacy_override(cfg: Config, name: str, raw: str) -> None:
    if name in LEGACY_ALGO_KEYS:
        section, key = LEGACY_ALGO_KEYS[name]
        setattr(cfg.algo, name, _coerce(f"algo.{name}", raw, _legacy_key_hint(section, key)))
    elif name in V1_FILTER_KEYS:
        setattr(cfg.algo, name, _coerce(f"algo.{name}", raw, V1_FILTER_KEYS[name][0]))
    else:
        raise ConfigError(f"unknown config key 'algo.{name}'; the algorithm's keys are now in advantage, loss, "
                          "filter and batching (docs/configuration.md)")


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


# Keys that moved since runs were saved: old dotted name -> new one (the old algo section: LEGACY_ALGO_KEYS).
# A saved run directory's config.json is read through `migrate_saved`, so old runs resume and evaluate
# unchanged.
RENAMED_KEYS = {"model.cache_dtype": "rollout.cache_dtype"}


def migrate_saved(d: dict) -> dict:
    """A saved config dict with renamed keys moved to their current place (a new dict)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for old, new in RENAMED_KEYS.items():
        (os_, ok), (ns, nk) = old.split("."), new.split(".")
        if ok in out.get(os_, {}):
            out.setdefault(ns, {})[nk] = out[os_].pop(ok)
    legacy = {}
    adv = out.setdefault("advantage", {})
    estimator = adv.get("estimator", out.get("algo", {}).get("adv_estimator", AdvantageConfig.estimator))
    for old, value in [*out.pop("algo", {}).items(), *((k, adv.pop(k)) for k in list(adv) if k in LEGACY_OPTION_KEYS)]:
        if old in LEGACY_OPTION_KEYS:
            # Saved before advantage.options: GiGPO's three keys were saved for every estimator; they
            # acted only under gigpo, and only a non-default value is a setting.
            name = LEGACY_OPTION_KEYS[old]
            if estimator == "gigpo" and value != getattr(GiGPOOptions(), name):
                adv.setdefault("options", {})[name] = value
        elif old in LEGACY_ALGO_KEYS:
            section, key = LEGACY_ALGO_KEYS[old]
            out.setdefault(section, {})[key] = value
        elif old in V1_FILTER_KEYS:
            legacy[old] = value
        else:
            raise ConfigError(f"saved config has unknown keys in algo: {old}")
    if legacy:
        num_groups = out.get("rollout", {}).get("num_groups", RolloutConfig.num_groups)
        out.setdefault("filter", {}).update(translate_v1_filter(legacy, FilterConfig(**out.get("filter", {})), num_groups))
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
