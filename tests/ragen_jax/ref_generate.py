"""transformers' greedy continuation of `launch/generate.py --model tiny`'s weights: the truth for
tests/ragen_jax/test_generate_cli.py. The tiny preset (Qwen2(tiny, Rngs(0))) is saved in the HF layout,
loaded by transformers' Qwen2ForCausalLM and decoded greedily from the prompt's ids (the offline Qwen2.5
tokenizer's). The ids are stored in tests/fixtures/generate_tiny.json so CI without torch still checks
them:

    python -m tests.ragen_jax.ref_generate      # rewrites the fixture (needs torch and transformers)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from flax import nnx

from ragen_jax.models import Qwen2, Qwen2Config, save_pretrained
from ragen_jax.text.tokenizer import load_tokenizer

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "generate_tiny.json"
PROMPT, NEW_TOKENS = "The quick brown fox jumps over the lazy dog", 8  # a switch at step 7: not a copy


def transformers_continuation() -> dict:
    """{prompt_ids, ids, margin}: transformers' greedy ids and the smallest top-1 - top-2 logit gap met."""
    import torch  # the test extra only: the fixture carries the answer where torch is absent
    import transformers

    prompt_ids = load_tokenizer().encode(PROMPT, add_special_tokens=False)
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(Qwen2(Qwen2Config.from_preset("tiny"), nnx.Rngs(0)), d)
        model = transformers.Qwen2ForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                         pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    gaps = [float(torch.topk(s[0], 2).values.diff().abs()) for s in out.scores]
    return {"prompt_ids": prompt_ids, "ids": out.sequences[0, len(prompt_ids):].tolist(), "margin": min(gaps)}


def main() -> None:
    import transformers

    FIXTURE.write_text(json.dumps({"source": f"transformers {transformers.__version__} Qwen2ForCausalLM, greedy",
                                   "prompt": PROMPT, **transformers_continuation()}) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
