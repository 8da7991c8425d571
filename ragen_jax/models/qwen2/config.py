"""Qwen2 / Qwen2.5 configuration: a frozen, self-validating dataclass plus named presets.

`from_hf_config` / `to_hf_config` translate to and from a Hugging Face `config.json` dict
(`Qwen2ForCausalLM`), accepting both the transformers-5 `rope_parameters` form and the older
top-level `rope_theta`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ragen_jax.models.attention import DEFAULT_BLOCK, IMPLEMENTATIONS

_DTYPES = ("float32", "bfloat16")
_ALIASES = {"f32": "float32", "fp32": "float32", "bf16": "bfloat16"}


def _canonical_dtype(value) -> str:
    if isinstance(value, str):
        return _ALIASES.get(value.lower(), value.lower())
    try:
        import numpy as np

        return np.dtype(value).name
    except TypeError:
        return repr(value)
HF_ARCHITECTURE = "Qwen2ForCausalLM"
# What a rematerialised layer keeps for the backward pass (Qwen2Config.remat_policy).
REMAT_POLICIES = {
    "full": None,  # nothing: the whole layer is recomputed from its input
    # the matmul outputs without batch dimensions (projections, MLP); attention and elementwise
    # ops are recomputed
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    dtype: str = "float32"  # compute dtype of matmuls and activations
    param_dtype: str = "float32"  # storage dtype of the parameters
    # Operand dtype of the weight matmuls (q/k/v/o, MLP, vocabulary head); None = `dtype`. With
    # "bfloat16" over float32 activations each projection rounds its input and weight to bfloat16 and
    # accumulates in float32, outputs float32: on CPUs with avx512_bf16 XLA runs these dots ~1.7x
    # faster than float32 ones, and decode streams half the weight bytes (docs/decode.md). Attention,
    # norms, the residual stream and the KV cache keep `dtype`.
    matmul_dtype: str | None = None
    # Rematerialise each decoder layer in the backward pass (trades compute for activation memory).
    remat: bool = False
    # What a rematerialised layer keeps (REMAT_POLICIES): "full" nothing, "dots" the matmul outputs.
    remat_policy: str = "full"
    # Attention kernel (models/attention.py IMPLEMENTATIONS): auto | xla | chunked | cudnn | splash.
    attention: str = "auto"
    # Query/key block of the chunked kernel: its memory is O(T x block) per layer.
    attention_block: int = DEFAULT_BLOCK
    # LoRA adapters on the targeted projections (models/lora.py `add_lora` sets these; 0 = none).
    # The forward adds (lora_alpha / lora_rank) * (x @ A) @ B to each targeted projection.
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_targets: tuple = ()

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "attention_block",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Qwen2Config.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.attention not in IMPLEMENTATIONS:
            raise ValueError(f"Qwen2Config.attention must be one of {', '.join(IMPLEMENTATIONS)}, "
                             f"got {self.attention!r}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"Qwen2Config.remat_policy must be one of {', '.join(REMAT_POLICIES)}, "
                             f"got {self.remat_policy!r}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps!r}")
        for name in ("dtype", "param_dtype"):
            # Accept numpy/jax dtypes and short aliases; store the canonical string (keeps the
            # config hashable and printable).
            value = _canonical_dtype(getattr(self, name))
            if value not in _DTYPES:
                raise ValueError(
                    f"Qwen2Config.{name} must be one of {', '.join(_DTYPES)}, got {getattr(self, name)!r}"
                )
            object.__setattr__(self, name, value)
        if self.matmul_dtype is not None:
            value = _canonical_dtype(self.matmul_dtype)
            if value not in _DTYPES:
                raise ValueError(f"Qwen2Config.matmul_dtype must be None or one of {', '.join(_DTYPES)}, "
                                 f"got {self.matmul_dtype!r}")
            object.__setattr__(self, "matmul_dtype", None if value == self.dtype else value)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def lora_scale(self) -> float:
        """PEFT's LoRA scale alpha / rank (0 without adapters)."""
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    def replace(self, **changes) -> "Qwen2Config":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides) -> "Qwen2Config":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], source: str = "config.json", **overrides) -> "Qwen2Config":
        archs = hf.get("architectures") or []
        model_type = hf.get("model_type")
        if archs and HF_ARCHITECTURE not in archs:
            raise ValueError(f"{source}: unknown architecture {archs}; only {HF_ARCHITECTURE} is supported")
        if not archs and model_type not in (None, "qwen2"):
            raise ValueError(f"{source}: unknown model_type {model_type!r}; only qwen2 is supported")
        rope = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type not in (None, "default"):
            raise ValueError(f"{source}: rope_type {rope_type!r} is not supported (only 'default')")
        if hf.get("use_sliding_window"):
            raise ValueError(f"{source}: use_sliding_window=true is not supported (full attention only)")
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        try:
            kwargs = dict(
                vocab_size=int(hf["vocab_size"]),
                hidden_size=int(hf["hidden_size"]),
                intermediate_size=int(hf["intermediate_size"]),
                num_hidden_layers=int(hf["num_hidden_layers"]),
                num_attention_heads=int(hf["num_attention_heads"]),
                num_key_value_heads=int(hf.get("num_key_value_heads", hf["num_attention_heads"])),
                rope_theta=float(theta),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
            )
        except KeyError as e:
            raise ValueError(f"{source}: missing required key {e.args[0]!r}") from None
        head_dim = hf.get("head_dim")
        if head_dim is not None and int(head_dim) != kwargs["hidden_size"] // kwargs["num_attention_heads"]:
            raise ValueError(f"{source}: head_dim {head_dim} != hidden_size / num_attention_heads is not supported")
        kwargs.update(overrides)
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def to_hf_config(self) -> dict[str, Any]:
        """A transformers-5 style `config.json` dict for `Qwen2ForCausalLM`."""
        return {
            "architectures": [HF_ARCHITECTURE],
            "model_type": "qwen2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.num_hidden_layers,
            "dtype": self.param_dtype,
            # Qwen2.5's special ids, only when they exist in this vocabulary (tiny test models).
            **({"bos_token_id": 151643, "eos_token_id": 151645} if self.vocab_size > 151645 else {}),
        }


_QWEN25 = dict(vocab_size=151936, rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32768)

# Shapes from the published Qwen2.5 config.json files, and two random-init demo shapes (DEMO_PRESETS).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        _QWEN25,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    # Demo-sized like "tiny", twice as wide and deep: the smallest shape tried whose FrozenLake warm
    # start leaves the marginal-action plateau (docs/demo.md, "A wider model for FrozenLake").
    "small": dict(
        _QWEN25,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        _QWEN25,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        _QWEN25,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "qwen2.5-3b": dict(
        _QWEN25,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        _QWEN25,
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    ),
}
# Not published models: shapes for tests and the CPU demo (remat off by default, ModelConfig.use_remat).
DEMO_PRESETS = ("tiny", "small")
