"""PEFT's reading of our LoRA adapter export: the truth for tests/ragen_jax/models/test_lora.py. The tiny
preset with rank-4 adapters on all seven projections (B randomised, as the test does) is saved as a base
directory plus a PEFT adapter directory (`save_peft_adapter`), loaded by transformers +
`PeftModel.from_pretrained`, and run on 8 tokens. Stored in tests/fixtures/peft_tiny.npz (so CI without
torch and peft still checks it): the adapter tensors PEFT loaded (names and shapes, from its own
`get_peft_model_state_dict`), and its logits at 64 fixed columns plus each position's argmax and
logsumexp over the whole vocabulary.

    python -m tests.ragen_jax.models.ref_peft    # rewrites the fixture (needs torch, transformers, peft)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ragen_jax.models import Qwen2, Qwen2Config, save_pretrained
from ragen_jax.models.lora import ALL_TARGETS, TARGETS, add_lora, save_peft_adapter

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "peft_tiny.npz"
CFG = Qwen2Config.from_preset("tiny")
RANK, ALPHA = 4, 8.0
TOKENS = np.random.default_rng(0).integers(0, CFG.vocab_size, (1, 8)).astype(np.int32)
COLUMNS = np.sort(np.random.default_rng(1).choice(CFG.vocab_size, 64, replace=False))


def randomise_b(model, seed=1):
    """The adapters' B (zero when fresh) drawn at random, so that they change the logits."""
    rng = np.random.default_rng(seed)
    for name in ALL_TARGETS:
        group, proj = TARGETS[name]
        dense = getattr(getattr(model.model.layers, group), proj)
        dense.lora_b[...] = jnp.asarray(rng.normal(0, 0.05, dense.lora_b.shape), dense.lora_b.dtype)


def adapted_model(randomise_b):
    """The tiny model with its adapters; `randomise_b(model)` gives B its random values."""
    model = Qwen2(CFG, nnx.Rngs(0))
    base = nnx.clone(model)
    add_lora(model, RANK, ALPHA, rngs=nnx.Rngs(1))
    randomise_b(model)
    return base, model


def summary(logits: np.ndarray) -> dict:
    """[T, V] logits -> the stored columns, argmax and logsumexp of every position."""
    m = logits.max(-1, keepdims=True)
    return {"logits": logits[:, COLUMNS], "argmax": logits.argmax(-1),
            "logsumexp": (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]}


def peft_reference(randomise_b) -> dict:
    import torch  # the test extra only
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base, model = adapted_model(randomise_b)
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(base, f"{d}/base")
        save_peft_adapter(model, f"{d}/adapter", base_model=f"{d}/base")
        hf = AutoModelForCausalLM.from_pretrained(f"{d}/base", dtype=torch.float32)
        hf = PeftModel.from_pretrained(hf, f"{d}/adapter").eval()
        with torch.no_grad():
            logits = hf(torch.tensor(TOKENS, dtype=torch.long)).logits[0].numpy()
        loaded = get_peft_model_state_dict(hf)
    names = sorted(loaded)
    return {**summary(logits), "names": np.array(names), "shapes": np.array([tuple(loaded[n].shape) for n in names])}


def main() -> None:
    np.savez_compressed(FIXTURE, **peft_reference(randomise_b))
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
