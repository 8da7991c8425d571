"""Qwen2Config: presets against the published parameter counts, validation, HF config.json translation."""

import jax
import pytest
import transformers
from flax import nnx

from ragen_jax.models import PRESETS, Qwen2, Qwen2Config

# Parameter counts published for the Qwen2.5 base models (tied embeddings counted once).
PUBLISHED_PARAMS = {
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512,
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
    assert set(PRESETS) == {"tiny", "small", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"}


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
    with pytest.raises(ValueError, match=r"x/config.json: unknown architecture \['LlamaForCausalLM'\]"):
        Qwen2Config.from_hf_config({**hf, "architectures": ["LlamaForCausalLM"]}, source="x/config.json")
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
