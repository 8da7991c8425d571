"""Exports transformers loads as the model we trained: three families x (full weights, LoRA merged) x
(Hugging Face directory, GGUF file).

Truth: transformers (AutoModelForCausalLM; `gguf_file=` for GGUF) run on the export, live where torch
is installed, and its logits and greedy tokens stored by scripts/export_fixtures.py everywhere (CI
has no torch: there the export is read back by our own readers, from_pretrained and the GGUF
converter, and must give transformers' stored numbers). Logits agree to 1e-5 (float32; the LoRA
cases compare our adapter forward x W + s (x A) B with transformers' merged weights), greedy tokens
exactly. Also: `save_pretrained` merges adapters (the merged matrix against W + (alpha / r) A B in
numpy), writes the dtype asked, and a GGUF file is F16 or F32 as asked."""

from __future__ import annotations

import importlib.util
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from ragen_jax.models import from_pretrained, save_pretrained
from ragen_jax.models.gguf import convert_gguf, open_gguf, write_gguf
from scripts.export_fixtures import CASES, FIXTURES, GREEDY_TOKENS, OUT, build_model, byte_tokenizer, export, prompts

HAVE_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("accelerate") is not None
STORED = np.load(OUT)
RTOL = ATOL = 1e-5


WIDTH = 11 + GREEDY_TOKENS  # the longest prompt and its continuation: one shape, so the ops compile once


def logits_of(model, row) -> np.ndarray:
    """[len(row), V] logits: the row right-padded to WIDTH (causal: the padding changes nothing before it)."""
    n = len(row)
    x, valid = np.zeros((1, WIDTH), np.int32), np.zeros((1, WIDTH), bool)
    x[0, :n], valid[0, :n] = row, True
    hidden, _ = model(jnp.asarray(x), jnp.asarray(valid))
    return np.asarray(model.logits(hidden)[0, :n])


def greedy_of(model, row, n: int = GREEDY_TOKENS) -> np.ndarray:
    """Greedy continuation by full forwards (no cache: the plainest decode)."""
    seq = list(np.asarray(row))
    for _ in range(n):
        seq.append(int(np.argmax(logits_of(model, seq)[-1])))
    return np.asarray(seq[len(row):])


def read_back(case: str, directory: str, gguf_file: str | None):
    """The export through our own readers (the HF directory, or the GGUF converted to one)."""
    if gguf_file is None:
        return from_pretrained(directory)
    return from_pretrained(str(convert_gguf(os.path.join(directory, gguf_file), cache_root=directory, log=lambda m: None)))


@pytest.mark.parametrize("case", CASES)
def test_exports_give_transformers_logits_and_greedy_tokens(case, tmp_path):
    model = build_model(case)
    directory, gguf_file = export(case, model, str(tmp_path))
    rows = prompts(case)
    ours = [logits_of(model, r) for r in rows]
    if HAVE_TORCH:
        from scripts.export_fixtures import transformers_outputs

        theirs, greedy = transformers_outputs(directory, gguf_file, rows)
    else:  # CI: transformers' stored reading of the same export, and our own reading of the files
        theirs = [STORED[f"{case}/logits{i}"] for i in range(len(rows))]
        greedy = [STORED[f"{case}/greedy{i}"] for i in range(len(rows))]
        back = read_back(case, directory, gguf_file)
        for r, t in zip(rows, theirs):
            np.testing.assert_allclose(logits_of(back, r), t, rtol=RTOL, atol=ATOL)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(o, t, rtol=RTOL, atol=ATOL, err_msg=f"{case} prompt {i}")
        np.testing.assert_allclose(t, STORED[f"{case}/logits{i}"], rtol=RTOL, atol=ATOL)  # the fixture is current
    assert [list(greedy_of(model, r)) for r in rows[:1]] == [list(g) for g in greedy[:1]]


def test_save_pretrained_merges_lora_adapters_in_the_dtype_asked(tmp_path):
    """The written matrix of a targeted projection is W + (alpha / r) A B (numpy, float64), and the
    model read back gives the adapter model's logits; bfloat16 / float16 saves are those weights cast."""
    model = build_model("qwen2-lora-hf")
    cfg = model.cfg
    save_pretrained(model, str(tmp_path / "f32"))
    saved = load_file(str(tmp_path / "f32" / "model.safetensors"))
    assert not any("lora" in k for k in saved)
    dense = model.model.layers.mlp.down_proj
    w, a, b = (np.asarray(x[...], np.float64) for x in (dense.kernel, dense.lora_a, dense.lora_b))
    want = (w[1] + cfg.lora_alpha / cfg.lora_rank * a[1] @ b[1]).T  # HF stores [out, in]
    np.testing.assert_allclose(saved["model.layers.1.mlp.down_proj.weight"], want, rtol=1e-6, atol=1e-6)
    back = from_pretrained(str(tmp_path / "f32"))
    assert back.cfg.lora_rank == 0
    row = prompts("qwen2-lora-hf")[0]
    np.testing.assert_allclose(logits_of(back, row), logits_of(model, row), rtol=RTOL, atol=ATOL)
    for dtype, np_dtype in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)):
        save_pretrained(model, str(tmp_path / dtype), dtype=dtype)
        got = load_file(str(tmp_path / dtype / "model.safetensors"))
        assert {v.dtype for v in got.values()} == {np.dtype(np_dtype)}
        np.testing.assert_array_equal(got["model.norm.weight"], saved["model.norm.weight"].astype(np_dtype))
    with pytest.raises(ValueError, match="cannot save weights as 'int8'"):
        save_pretrained(model, str(tmp_path / "int8"), dtype="int8")


def test_gguf_file_types_and_llama_rope_scaling(tmp_path):
    """F16 files hold the matrices in float16 and the norms in float32 (llama.cpp's layout); a Llama 3
    rope-scaled model (transformers' GGUF loader ignores rope_freqs, so no transformers truth here)
    comes back from our reader with the same logits (its rope_scaling fitted from the divisors), and
    so does a llama with q/k/v/o and MLP biases."""
    import gguf

    model = build_model("llama-full-hf")  # llama_untied: llama3 rope scaling, untied head
    assert model.cfg.rope_type == "llama3"
    write_gguf(model, byte_tokenizer(), tmp_path / "a.gguf", "F16")
    reader = open_gguf(tmp_path / "a.gguf")
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert types["blk.0.attn_norm.weight"] == types["rope_freqs.weight"] == gguf.GGMLQuantizationType.F32
    write_gguf(model, byte_tokenizer(), tmp_path / "b.gguf", "F32")
    back = from_pretrained(str(convert_gguf(tmp_path / "b.gguf", cache_root=tmp_path, log=lambda m: None)))
    assert back.cfg.rope_type == "llama3"
    row = prompts("llama-full-hf")[0]
    np.testing.assert_allclose(logits_of(back, row), logits_of(model, row), rtol=RTOL, atol=ATOL)
    # Llama q/k biases are permuted like their rows (llama.cpp's converter does both).
    biased = from_pretrained(str(FIXTURES / "llama_bias"))
    write_gguf(biased, byte_tokenizer(), tmp_path / "bias.gguf", "F32")
    back = from_pretrained(str(convert_gguf(tmp_path / "bias.gguf", cache_root=tmp_path, log=lambda m: None)))
    np.testing.assert_allclose(logits_of(back, row), logits_of(biased, row), rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="file type 'Q4_0'"):
        write_gguf(model, byte_tokenizer(), tmp_path / "c.gguf", "Q4_0")
    assert not (tmp_path / "c.gguf").exists()
