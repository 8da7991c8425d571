"""Write tests/fixtures/export_logits.npz: transformers' logits and greedy tokens for our exports.

The cases are the three families x (full weights, LoRA merged) x (Hugging Face directory, GGUF
file): each case's model is built here deterministically (`build_model`: a parity fixture's
weights or numpy-seeded ones, LoRA adapters numpy-seeded), exported with `save_pretrained` /
`write_gguf`, loaded by transformers (AutoModelForCausalLM, `gguf_file=` for GGUF) and run on
three prompts. tests/ragen_jax/models/test_hf_export.py compares our logits with transformers'
live where torch is installed, and with these stored ones everywhere (its export read back by our
own readers), so CI without torch still checks the exports against transformers' reading.

GGUF cases use models transformers' GGUF loader can represent: it drops llama biases, ignores Llama
3's rope_freqs and takes qwen3's head_dim as 128 (a llama without biases at default rope, a qwen3
with head_dim 128); the HF cases use the parity fixtures' odd shapes as they are.

Needs torch and accelerate (`pip install torch==2.13.0 accelerate==1.15.0`):

    python scripts/export_fixtures.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ragen_jax.models import Qwen2, Qwen2Config, from_pretrained, save_pretrained
from ragen_jax.models.gguf import write_gguf
from ragen_jax.models.lora import LoRAParam, add_lora

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
OUT = FIXTURES / "export_logits.npz"
GREEDY_TOKENS = 8
# Models transformers' GGUF loader represents exactly (see the docstring).
GGUF_CONFIGS = {
    "llama": dict(model_type="llama", vocab_size=256, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=3, num_key_value_heads=1, rope_theta=5e5, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, max_position_embeddings=128),
    "qwen3": dict(model_type="qwen3", vocab_size=256, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, attention_head_dim=128, rope_theta=2e4,
                  tie_word_embeddings=True, max_position_embeddings=128),
}
HF_FIXTURES = {"qwen2": "qwen2_untied", "llama": "llama_untied", "qwen3": "qwen3_untied"}
CASES = tuple(f"{family}-{weights}-{kind}" for family in ("qwen2", "llama", "qwen3")
              for weights in ("full", "lora") for kind in ("hf", "gguf"))


def seeded(model, seed: int, kind=nnx.Param) -> None:
    """Every parameter of `kind` replaced by numpy draws in a fixed order (machine-independent):
    norm scales near 1, biases 0.5 N(0, 1), matrices N(0, 1) / sqrt(fan-in)."""
    rng = np.random.default_rng(seed)
    state = nnx.state(model, kind)
    pure = state.to_pure_dict()

    def draw(path, x):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            return jnp.asarray(1.0 + 0.2 * rng.standard_normal(x.shape), jnp.float32)
        if "bias" in name:
            return jnp.asarray(0.5 * rng.standard_normal(x.shape), jnp.float32)
        return jnp.asarray(rng.standard_normal(x.shape) / np.sqrt(x.shape[-2]), jnp.float32)

    state.replace_by_pure_dict(jax.tree_util.tree_map_with_path(draw, pure))
    nnx.update(model, state)


def build_model(case: str):
    """The case's model: a parity fixture (HF cases, qwen2 GGUF) or numpy-seeded weights, and for LoRA
    cases rank-4 adapters on every projection with numpy-seeded values (B non-zero: the merge matters)."""
    family, weights, kind = case.split("-")
    if kind == "gguf" and family in GGUF_CONFIGS:
        model = Qwen2(Qwen2Config(**GGUF_CONFIGS[family]), nnx.Rngs(0))
        seeded(model, 7)
    else:
        model = from_pretrained(str(FIXTURES / HF_FIXTURES[family]))
    if weights == "lora":
        add_lora(model, 4, 8.0, rngs=nnx.Rngs(1))
        rng = np.random.default_rng(11)
        adapters = nnx.state(model, LoRAParam)
        adapters.replace_by_pure_dict(jax.tree.map(lambda x: jnp.asarray(0.1 * rng.standard_normal(x.shape), jnp.float32),
                                                   adapters.to_pure_dict()))
        nnx.update(model, adapters)
    return model


def byte_tokenizer():
    """A byte-level BPE tokenizer of the 256 byte tokens (the fixtures' vocabulary), for GGUF metadata."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ragen_jax.text.tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    backend = Tokenizer(models.BPE(vocab={table[i]: i for i in range(256)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def export(case: str, model, directory: str) -> tuple[str, str | None]:
    """Write the case's export into `directory`; (directory, gguf file name or None) for transformers."""
    if case.endswith("-gguf"):
        write_gguf(model, byte_tokenizer(), os.path.join(directory, "model.gguf"))
        return directory, "model.gguf"
    save_pretrained(model, directory)
    return directory, None


def prompts(case: str) -> list[np.ndarray]:
    """Three prompts (11, 7 and 3 tokens) of the family's parity fixture."""
    ref = np.load(FIXTURES / HF_FIXTURES[case.split("-")[0]] / "reference.npz")
    return [ref["input_ids"][b, ref["input_ids"].shape[1] - n:] for b, n in enumerate(ref["lengths"])]


def transformers_outputs(directory: str, gguf_file: str | None, rows) -> tuple[list, list]:
    """(logits per prompt [T, V], greedy continuation per prompt) from transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kwargs).eval()
    logits, greedy = [], []
    with torch.no_grad():
        for row in rows:
            x = torch.tensor(np.asarray(row)[None], dtype=torch.long)
            logits.append(model(x).logits[0].numpy())
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=GREEDY_TOKENS,
                                 min_new_tokens=GREEDY_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
            greedy.append(out[0, x.shape[1]:].numpy())
    return logits, greedy


def main() -> None:
    out = {}
    for case in CASES:
        model = build_model(case)
        with tempfile.TemporaryDirectory() as d:
            logits, greedy = transformers_outputs(*export(case, model, d), prompts(case))
        for i, (lg, g) in enumerate(zip(logits, greedy)):
            out[f"{case}/logits{i}"] = lg.astype(np.float32)
            out[f"{case}/greedy{i}"] = g.astype(np.int32)
        print(case, "ok")
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
