"""Qwen2Config: presets against the published parameter counts, validation, HF config.json translation."""

import jax
import pytest
import transformers
from flax import nnx

from ragen_jax.models import PRESETS, Qwen2, Qwen2Config

# Parameter counts published for the base models (tied embeddings counted once); the llama and qwen3
# ones also equal transformers' LlamaForCausalLM / Qwen3ForCausalLM built on the meta device.
PUBLISHED_PARAMS = {
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512,
    "llama-3.2-3b": 3_212_749_824,
    "smollm2-135m": 134_515_008,
    "qwen3-0.6b": 596_049_920,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_preset_parameter_count_matches_published(name):
    cfg = Qwen2Config.from_preset(name)
    model = nnx.eval_shape(lambda: Qwen2(cfg, nnx.Rngs(0)))  # shapes only, no memory
    assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == PUBLISHED_PARAMS[name]


def test_preset_facts():
    c = Qwen2Config.from_preset("qwen2.5-0.5b")
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (24, 896, 14, 2)
    assert c.head_dim == 64 and c.tie_word_embeddings and c.rope_theta == 1e6 and c.rms_norm_eps == 1e-6
    assert not Qwen2Config.from_preset("qwen2.5-7b").tie_word_embeddings
    t = Qwen2Config.from_preset("tiny")
    assert (t.vocab_size, t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads) == (
        151936, 64, 2, 4, 2)
    assert Qwen2Config.from_preset("tiny", vocab_size=100).vocab_size == 100
    s = Qwen2Config.from_preset("small")
    assert (s.hidden_size, s.intermediate_size, s.num_hidden_layers, s.num_attention_heads, s.num_key_value_heads) == (
        128, 256, 4, 4, 2)


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown preset 'foo'; valid: tiny, small, qwen2.5-0.5b"):
        Qwen2Config.from_preset("foo")
    assert set(PRESETS) == {"tiny", "small", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b",
                            "llama-3.2-3b", "smollm2-135m", "qwen3-0.6b"}


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_key_value_heads=3), "num_attention_heads .4. must be divisible by num_key_value_heads .3."),
        (dict(hidden_size=66), "hidden_size .66. must be divisible by num_attention_heads"),
        (dict(hidden_size=12), "head_dim .3. must be even"),
        (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
        (dict(dtype="float16"), "dtype must be one of float32, bfloat16"),
        (dict(rope_theta=0.0), "rope_theta must be positive"),
    ],
)
def test_validation_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        Qwen2Config.from_preset("tiny", **changes)


def test_hf_config_round_trip_and_transformers_accepts_it():
    cfg = Qwen2Config.from_preset("qwen2.5-7b")
    hf = cfg.to_hf_config()
    assert hf["architectures"] == ["Qwen2ForCausalLM"]
    assert hf["rope_parameters"] == {"rope_theta": 1e6, "rope_type": "default"}
    assert Qwen2Config.from_hf_config(hf) == cfg
    tcfg = transformers.Qwen2Config(**hf)  # the real transformers config class agrees on every field
    for ours, theirs in [
        ("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"), ("intermediate_size", "intermediate_size"),
        ("num_hidden_layers", "num_hidden_layers"), ("num_attention_heads", "num_attention_heads"),
        ("num_key_value_heads", "num_key_value_heads"), ("rms_norm_eps", "rms_norm_eps"),
        ("tie_word_embeddings", "tie_word_embeddings"),
    ]:
        assert getattr(cfg, ours) == getattr(tcfg, theirs), ours
    assert tcfg.rope_parameters["rope_theta"] == cfg.rope_theta


def test_from_hf_config_old_style_rope_theta():
    hf = Qwen2Config.from_preset("qwen2.5-0.5b").to_hf_config()
    del hf["rope_parameters"]
    hf["rope_theta"] = 12345.0
    assert Qwen2Config.from_hf_config(hf).rope_theta == 12345.0


def test_from_hf_config_errors():
    hf = Qwen2Config.from_preset("tiny").to_hf_config()
    with pytest.raises(ValueError, match=r"x/config.json: unknown architecture \['LlamaForCausalLM'\] for model_type 'qwen2'"):
        Qwen2Config.from_hf_config({**hf, "architectures": ["LlamaForCausalLM"]}, source="x/config.json")
    with pytest.raises(ValueError, match=r"x/config.json: unknown architecture \['MistralForCausalLM'\]; supported: "
                                         r"Qwen2ForCausalLM, LlamaForCausalLM, Qwen3ForCausalLM"):
        Qwen2Config.from_hf_config({**hf, "architectures": ["MistralForCausalLM"], "model_type": None},
                                   source="x/config.json")
    bad = dict(hf)
    del bad["hidden_size"]
    with pytest.raises(ValueError, match="config.json: missing required key 'hidden_size'"):
        Qwen2Config.from_hf_config(bad)
    with pytest.raises(ValueError, match="config.json: num_attention_heads"):
        Qwen2Config.from_hf_config({**hf, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        Qwen2Config.from_hf_config({**hf, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}})


def test_dtype_aliases_are_canonicalised():
    import jax.numpy as jnp

    c = Qwen2Config.from_preset("tiny", dtype=jnp.bfloat16, param_dtype="fp32")
    assert (c.dtype, c.param_dtype) == ("bfloat16", "float32")
    assert Qwen2Config.from_preset("tiny", dtype="bf16") == Qwen2Config.from_preset("tiny", dtype="bfloat16")
    assert "eos_token_id" not in Qwen2Config.from_preset("tiny", vocab_size=256).to_hf_config()


# config.json of Qwen/Qwen2.5-0.5B-Instruct as published (transformers 4 style: top-level rope_theta).
QWEN25_05B_CONFIG_JSON = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}


def test_published_config_json_maps_to_preset():
    assert Qwen2Config.from_hf_config(QWEN25_05B_CONFIG_JSON) == Qwen2Config.from_preset("qwen2.5-0.5b")
    with pytest.raises(ValueError, match="use_sliding_window=true is not supported"):
        Qwen2Config.from_hf_config({**QWEN25_05B_CONFIG_JSON, "use_sliding_window": True})
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        Qwen2Config.from_hf_config({**QWEN25_05B_CONFIG_JSON, "rope_scaling": {"type": "yarn", "factor": 4.0}})


# ----------------------------------------------------------------------------- families
# config.json of meta-llama/Llama-3.2-3B-Instruct as published (transformers 4 style: rope_scaling).
LLAMA32_3B_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 24, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}
# config.json of Qwen/Qwen3-0.6B as published.
QWEN3_06B_CONFIG_JSON = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


@pytest.mark.parametrize("preset, published", [("llama-3.2-3b", LLAMA32_3B_CONFIG_JSON),
                                                ("qwen3-0.6b", QWEN3_06B_CONFIG_JSON)])
def test_published_family_config_json_maps_to_preset(preset, published):
    cfg = Qwen2Config.from_hf_config(published)
    assert cfg == Qwen2Config.from_preset(preset)
    assert Qwen2Config.from_hf_config(cfg.to_hf_config()) == cfg


@pytest.mark.parametrize("preset", ["llama-3.2-3b", "smollm2-135m", "qwen3-0.6b", "qwen2.5-7b"])
def test_family_hf_config_is_what_transformers_reads(preset):
    # transformers' own config class for the model_type agrees on every field we wrote.
    cfg = Qwen2Config.from_preset(preset)
    hf = cfg.to_hf_config()
    tcfg = transformers.AutoConfig.for_model(**hf)
    assert tcfg.model_type == cfg.model_type and tcfg.architectures == hf["architectures"]
    assert getattr(tcfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads) == cfg.head_dim
    assert tcfg.rope_parameters["rope_theta"] == cfg.rope_theta
    assert tcfg.rope_parameters["rope_type"] == cfg.rope_type
    if cfg.rope_type == "llama3":
        assert tcfg.rope_parameters["factor"] == cfg.rope_factor
        assert tcfg.rope_parameters["original_max_position_embeddings"] == cfg.rope_original_max_position_embeddings
    if cfg.model_type != "qwen2":
        assert (tcfg.attention_bias, getattr(tcfg, "mlp_bias", False)) == (cfg.attention_bias, cfg.mlp_bias)


def test_family_switches():
    q2, ll, q3 = (Qwen2Config.from_preset(p) for p in ("tiny", "smollm2-135m", "qwen3-0.6b"))
    assert (q2.qkv_bias, q2.o_bias, q2.qk_norm) == (True, False, False)
    assert (ll.qkv_bias, ll.o_bias, ll.qk_norm, ll.mlp_bias) == (False, False, False, False)
    assert (q3.qkv_bias, q3.qk_norm, q3.head_dim) == (False, True, 128) and q3.hidden_size // 16 == 64
    lb = ll.replace(attention_bias=True, mlp_bias=True)
    assert (lb.qkv_bias, lb.o_bias) == (True, True)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(model_type="mistral"), "model_type 'mistral' is not supported; supported model types: qwen2, llama, qwen3"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), r"rope_type 'yarn' is not supported \(only default, llama3\)"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "llama3 rope scaling needs 'low_freq_factor'"),
        (dict(use_sliding_window=True), "use_sliding_window=true is not supported"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        (dict(partial_rotary_factor=0.5), "partial_rotary_factor 0.5 is not supported"),
        (dict(layer_types=["full_attention", "sliding_attention"]), "layer_types other than full_attention"),
        (dict(mlp_bias=True, model_type="qwen3", architectures=["Qwen3ForCausalLM"]), "mlp_bias is not a qwen3 option"),
    ],
)
def test_family_config_errors_are_one_sentence(changes, message):
    hf = {**Qwen2Config.from_preset("smollm2-135m").to_hf_config(), **changes}
    if "rope_scaling" in changes:
        del hf["rope_parameters"]
    if changes.get("model_type") == "mistral":
        del hf["architectures"]
    with pytest.raises(ValueError, match=message):
        Qwen2Config.from_hf_config(hf, source="m/config.json")


def test_direct_config_errors():
    with pytest.raises(ValueError, match="a qwen2 model always has q/k/v biases"):
        Qwen2Config.from_preset("tiny", attention_bias=True)
    with pytest.raises(ValueError, match="rope_type 'linear' is not supported"):
        Qwen2Config.from_preset("tiny", rope_type="linear")
    with pytest.raises(ValueError, match="llama3 rope scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor"):
        Qwen2Config.from_preset("tiny", rope_type="llama3", rope_low_freq_factor=4.0)
    with pytest.raises(ValueError, match="attention_head_dim must be None or a positive integer"):
        Qwen2Config.from_preset("tiny", model_type="qwen3", attention_head_dim=0)
    # An explicit head_dim lifts the divisibility rule (Qwen3: 1024 hidden, 16 heads x 128).
    assert Qwen2Config.from_preset("tiny", hidden_size=66, attention_head_dim=16).head_dim == 16
