"""transformers' GGUF tokenizer of SmolLM2-135M-Instruct's file, with llama.cpp's smollm pre-tokenizer
(see test_gguf.py): the truth for our GGUF tokenizer. Its ids on 600 of test_gguf's random strings and
its chat template on one conversation are stored in tests/fixtures/smollm2_tokenizer.npz, so CI without
torch still checks them:

    python -m tests.ragen_jax.models.ref_smollm2_tokenizer    # rewrites the fixture (needs torch, transformers)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "smollm2_tokenizer.npz"
NUM_STRINGS = 600
MESSAGES = [{"role": "user", "content": "Hi 42"}]


def transformers_tokenizer(path: Path):
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return ref


def flatten(ids: list[list[int]]) -> dict:
    return {"ids": np.concatenate([np.asarray(x, np.int32) for x in ids]),
            "offsets": np.cumsum([0] + [len(x) for x in ids]).astype(np.int64)}


def main() -> None:
    from tests.ragen_jax.models.test_gguf import random_strings, smollm2_file

    ref = transformers_tokenizer(smollm2_file())
    ids = ref(random_strings(NUM_STRINGS), add_special_tokens=False)["input_ids"]
    np.savez_compressed(FIXTURE, **flatten(ids), chat=np.array(ref.apply_chat_template(MESSAGES, tokenize=False)))
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
