"""LoRA adapters: a fresh adapter is exactly the base model, the on-the-fly forward equals the merged
weights W + (alpha/r) A B (computed here in numpy), the PEFT files round-trip, adapters shard like
their kernels, and (when peft and torch are installed) transformers + PEFT give our logits."""

import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from safetensors import safe_open

from ragen_jax.models import Qwen2, Qwen2Config, make_mesh, param_shardings, save_pretrained
from ragen_jax.models.lora import (ADAPTER_CONFIG, ALL_TARGETS, TARGETS, LoRAParam, add_lora, check_targets,
                                   load_peft_adapter, lora_split, merge_lora, save_peft_adapter)
from tests.ragen_jax.models import ref_peft

CFG = Qwen2Config.from_preset("tiny")
RANK, ALPHA = 4, 8.0


def _tokens(b=2, t=9, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, (b, t)).astype(np.int32)
    valid = np.ones((b, t), bool)
    if b > 1:
        valid[1, 6:] = False  # a right-padded row
    return tokens, valid


def _logits(model, tokens, valid):
    hidden, _ = model(tokens, valid)
    return np.asarray(model.logits(hidden))


def test_fresh_adapter_is_exactly_the_base_model():
    model = Qwen2(CFG, nnx.Rngs(0))
    tokens, valid = _tokens()
    before = _logits(model, tokens, valid)
    add_lora(model, RANK, ALPHA, rngs=nnx.Rngs(1))
    np.testing.assert_array_equal(_logits(model, tokens, valid), before)  # B = 0
    assert model.cfg.lora_scale == ALPHA / RANK


def test_forward_equals_merged_weights_computed_in_numpy():
    model = Qwen2(CFG, nnx.Rngs(0))
    add_lora(model, RANK, ALPHA, ("q_proj", "v_proj", "down_proj"), rngs=nnx.Rngs(1))
    rng = np.random.default_rng(2)
    for name in ("q_proj", "v_proj", "down_proj"):
        group, proj = TARGETS[name]
        dense = getattr(getattr(model.model.layers, group), proj)
        dense.lora_b[...] = jnp.asarray(rng.normal(0, 0.05, dense.lora_b.shape), jnp.float32)
    state = nnx.state(model).to_pure_dict()
    merged = merge_lora(state, model.cfg.lora_scale)
    for name in ("q_proj", "v_proj", "down_proj"):
        group, proj = TARGETS[name]
        p = state["model"]["layers"][group][proj]
        want = np.asarray(p["kernel"]) + (ALPHA / RANK) * np.einsum("lir,lro->lio", np.asarray(p["lora_a"]),
                                                                     np.asarray(p["lora_b"]))
        got = merged["model"]["layers"][group][proj]
        np.testing.assert_allclose(np.asarray(got["kernel"]), want, rtol=1e-6, atol=1e-7)
        assert "lora_a" not in got and "lora_b" not in got
    base = Qwen2(CFG, nnx.Rngs(5))  # other numbers, same architecture: load the merged weights into it
    nnx.update(base, merged)
    tokens, valid = _tokens()
    np.testing.assert_allclose(_logits(model, tokens, valid), _logits(base, tokens, valid), rtol=2e-5, atol=2e-5)


def test_split_selects_only_the_adapters():
    model = Qwen2(CFG, nnx.Rngs(0))
    add_lora(model, RANK, ALPHA, rngs=nnx.Rngs(1))
    _, adapters, base = lora_split(model)
    def names_of(state):
        return {"/".join(str(getattr(k, "key", k)) for k in p)
                for p, _ in jax.tree_util.tree_leaves_with_path(state.to_pure_dict())}

    names = names_of(adapters)
    assert len(names) == 2 * len(ALL_TARGETS) and all(n.endswith(("lora_a", "lora_b")) for n in names)
    base_names = names_of(base)
    assert base_names and not any("lora" in n for n in base_names)
    assert all(isinstance(v, LoRAParam) for v in jax.tree.leaves(adapters, is_leaf=lambda x: isinstance(x, nnx.Variable)))


def test_targets_are_validated():
    assert check_targets("all-linear") == ALL_TARGETS
    with pytest.raises(ValueError, match="unknown LoRA target"):
        check_targets(("q_proj", "lm_head"))
    with pytest.raises(ValueError, match="rank"):
        add_lora(Qwen2(CFG, nnx.Rngs(0)), 0, ALPHA, rngs=nnx.Rngs(1))


def test_peft_files_round_trip(tmp_path):
    model = Qwen2(CFG, nnx.Rngs(0))
    add_lora(model, RANK, ALPHA, rngs=nnx.Rngs(1))
    ref_peft.randomise_b(model)
    save_peft_adapter(model, str(tmp_path), base_model="tiny")
    config = json.loads((tmp_path / ADAPTER_CONFIG).read_text())
    assert config["r"] == RANK and config["lora_alpha"] == ALPHA and set(config["target_modules"]) == set(ALL_TARGETS)
    fresh = Qwen2(CFG, nnx.Rngs(0))  # same base, no adapters: loading adds them
    load_peft_adapter(str(tmp_path), fresh)
    a, b = nnx.state(model, LoRAParam).to_pure_dict(), nnx.state(fresh, LoRAParam).to_pure_dict()
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
    tokens, valid = _tokens()
    np.testing.assert_array_equal(_logits(model, tokens, valid), _logits(fresh, tokens, valid))


def test_adapters_shard_like_their_kernels():
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("needs 8 (simulated) devices")
    mesh = make_mesh(data=2, fsdp=2, tensor=2, devices=devices[:8])
    cfg = CFG.replace(num_attention_heads=4, num_key_value_heads=2)
    model = Qwen2(cfg, nnx.Rngs(0))
    add_lora(model, RANK, ALPHA, rngs=nnx.Rngs(1))
    sh = param_shardings(nnx.state(model).to_pure_dict(), mesh)
    layers = sh["model"]["layers"]
    for name in ALL_TARGETS:
        group, proj = TARGETS[name]
        k, a, b = (layers[group][proj][x].spec for x in ("kernel", "lora_a", "lora_b"))
        assert a[1] == k[1] and a[2] is None, (name, k, a)  # `in` like the kernel, rank whole
        assert b[2] == k[2] and b[1] is None, (name, k, b)  # `out` like the kernel


def test_our_adapter_is_what_peft_loaded(tmp_path):
    """CI without torch and peft: our adapter export holds exactly the tensors PEFT loaded from it (names
    and shapes from its own get_peft_model_state_dict), and our adapted model's logits are the ones PEFT
    computed on transformers (tests/fixtures/peft_tiny.npz: 64 columns, each position's argmax and
    logsumexp over the whole vocabulary)."""
    stored = np.load(ref_peft.FIXTURE)
    base, model = ref_peft.adapted_model(ref_peft.randomise_b)
    save_pretrained(base, str(tmp_path / "base"))
    save_peft_adapter(model, str(tmp_path / "adapter"), base_model=str(tmp_path / "base"))
    with safe_open(str(tmp_path / "adapter" / "adapter_model.safetensors"), "np") as f:
        shapes = {k: f.get_tensor(k).shape for k in f.keys()}
    assert sorted(shapes) == stored["names"].tolist()
    assert [shapes[k] for k in sorted(shapes)] == [tuple(s) for s in stored["shapes"].tolist()]
    ours = ref_peft.summary(_logits(model, ref_peft.TOKENS, np.ones_like(ref_peft.TOKENS, bool))[0])
    np.testing.assert_allclose(ours["logits"], stored["logits"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ours["logsumexp"], stored["logsumexp"], rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(ours["argmax"], stored["argmax"])


@pytest.mark.skipif(importlib.util.find_spec("peft") is None or importlib.util.find_spec("torch") is None,
                    reason="peft and torch are not installed (pip install torch==2.13.0 peft)")
def test_the_peft_fixture_is_peft_under_torch():
    stored, live = np.load(ref_peft.FIXTURE), ref_peft.peft_reference(ref_peft.randomise_b)
    assert live["names"].tolist() == stored["names"].tolist() and np.array_equal(live["shapes"], stored["shapes"])
    np.testing.assert_allclose(live["logits"], stored["logits"], atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("peft") is None or importlib.util.find_spec("torch") is None,
                    reason="peft and torch are not installed (pip install torch==2.13.0 peft)")
def test_peft_adapter_loads_onto_transformers_and_gives_our_logits(tmp_path):
    import torch  # optional: only for this cross-check
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = Qwen2(CFG, nnx.Rngs(0))
    save_pretrained(model, str(tmp_path / "base"))
    add_lora(model, RANK, ALPHA, rngs=nnx.Rngs(1))
    ref_peft.randomise_b(model)
    save_peft_adapter(model, str(tmp_path / "adapter"), base_model=str(tmp_path / "base"))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), dtype=torch.float32)
    hf = PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    tokens, _ = _tokens(b=1, t=8)
    with torch.no_grad():
        ref = hf(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    ours = _logits(model, tokens, np.ones_like(tokens, bool))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
