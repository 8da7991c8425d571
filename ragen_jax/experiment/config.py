"""Experiment configuration, the schema and its loading: nested dataclasses that validate themselves,
loaded from `configs/*.py`.

A config file defines `get_config() -> Config`. `load_config("sokoban.py")` looks the bare name up
in the repository's `configs/` folder (or takes a path), then applies command-line overrides of the
form `--config.loss.eps_high=0.28`. Every problem is reported as one sentence that names the key:
an unknown key lists the valid ones, a value of the wrong type says which type was expected.
The algorithm's sections are in experiment/sections.py, the rules across sections in
experiment/rules.py, the old names (`algo.*`, `advantage.gigpo_*`, moved keys) in experiment/legacy.py.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import envs_jax

from ragen_jax.experiment.legacy import LegacyAlgo, legacy_target, migrate_saved, translate_v1_filter
from ragen_jax.experiment.rules import check_across_sections
from ragen_jax.experiment.sections import (AdvantageConfig, BatchingConfig, ConfigError, FilterConfig, LossConfig,
                                          choice, micro_batch, positive)
from ragen_jax.models.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from ragen_jax.models.attention import check_available as check_attention
from ragen_jax.models.gguf import expand_model_path
from ragen_jax.models.lora import check_targets as check_lora_targets
from ragen_jax.models.lora import is_peft_dir
from ragen_jax.models.quant import MODES as QUANT_MODES
from ragen_jax.models.qwen2.config import DEMO_PRESETS, REMAT_POLICIES
from ragen_jax.rollout.types import RolloutConfig
from ragen_jax.text.conversation import PromptConfig
from ragen_jax.text.mix import format_mix, parse_mix

CONFIG_DIR = Path(__file__).resolve().parent.parent.parent / "configs"


def gguf_init_from_error(init_from) -> ConfigError:
    """`model.base_quant=gguf` with a `model.init_from` that is not a PEFT adapter directory: refused when the
    config is read (the path exists) or when the Trainer loads it (it did not exist yet)."""
    return ConfigError(f"model.base_quant=gguf keeps the .gguf file's blocks as the base, so model.init_from "
                       f"{init_from!r} (a policy export) would be ignored; start from a PEFT adapter directory "
                       "(a LoRA run's <run>/adapter) or use model.base_quant=nf4 to quantize it")


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
    # accumulates in float32. On CPUs with avx512_bf16 the rollout runs ~1.7x faster (docs/experiments/decode.md).
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
    # QLoRA: the frozen base's projection kernels (q/k/v/o, gate/up/down of every layer) stored quantized
    # and dequantized per layer inside the forward and the rematerialised backward (models/quant.py):
    # "none" (float, in param_dtype), "int8" (llama.cpp's Q8_0 rule, blocks of 32 weights with one
    # scale), "nf4" (QLoRA's NormalFloat, blocks of 64), "int4" (llama.cpp's Q4_0 rule, blocks of 64) or
    # "gguf" (a .gguf model.path's own Q4_0 / Q4_1 / Q8_0 projection blocks, read as they are). LoRA only: full
    # fine-tuning trains the base. Embeddings, the output head, norms, biases and adapters stay float.
    base_quant: str = "none"

    def validate(self):
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ConfigError(f"model.lora_rank must be a whole number >= 0 (0: no LoRA), got {self.lora_rank!r}")
        if self.lora_rank:
            positive("model.lora_alpha", self.lora_alpha)
            try:
                check_lora_targets(self.lora_targets)
            except ValueError as e:
                raise ConfigError(f"model.lora_targets: {e}") from None
        choice("model.base_quant", self.base_quant, QUANT_MODES)
        if self.base_quant != "none" and not self.lora_rank:
            raise ConfigError(f"model.base_quant={self.base_quant!r} stores a frozen base quantized, but without LoRA "
                              "(model.lora_rank=0) the whole model trains; set model.lora_rank (e.g. 64) or "
                              "model.base_quant=none")
        if self.base_quant == "gguf" and not (self.path and str(self.path).lower().endswith(".gguf")):
            raise ConfigError(f"model.base_quant='gguf' reads the projections of a .gguf model.path, got "
                              f"{self.path!r}; set model.path to a .gguf file or model.base_quant=nf4")
        # A path that does not exist yet (a stage of launch/demo.py not run yet) is checked again when the
        # Trainer loads it (experiment/build.py `init_policy_params`).
        if (self.base_quant == "gguf" and self.init_from and os.path.exists(str(self.init_from))
                and not is_peft_dir(str(self.init_from))):
            raise gguf_init_from_error(self.init_from)
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
    lr: float = 1e-5  # AdamW's learning rate; its other settings (betas, decay, clip, warm-up) are optim's
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
    # head_at_targets: the vocabulary head (and its gradient) runs only at the positions that carry
    # loss, the assistant's tokens (a static count: the most any demo has), not at every position:
    # SmolLM2's head is ~20% of a token's forward and Bandit's demos are ~10% assistant tokens.
    head_at_targets: bool = True
    # group_prompts: demos with the same prompt (everything before the first assistant token) are
    # grouped, and each batch runs each distinct prompt once and every row only its answer, when
    # that is cheaper than every row's padded forward (decided once, from all demos). Bandit's demos
    # show one of 2 prompts of ~217 tokens before ~22 answer tokens; Sokoban's rooms differ per demo.
    group_prompts: bool = True

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
        check_across_sections(self)

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
    target = legacy_target(cfg, parts)
    if target is not None:  # an old name (legacy.py): its value set on the new key, with a warning
        hint, setter = target
        setter(_coerce(dotted, raw, hint))
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


def _parse_literal(raw: str):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def _coerce(key: str, raw: str, hint) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    optional = origin in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        if raw in ("None", "none", "null"):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        low = raw.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        # An optional switch's None is "decided by the run" (model.remat, prompt.list_actions): users write auto.
        if optional and low == "auto":
            return None
        raise ConfigError(f"{key} expects true/false{', or auto (none)' if optional else ''}, got {raw!r}")
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
