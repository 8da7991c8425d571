"""Make the Qwen2 parity fixtures: tiny random transformers Qwen2ForCausalLM models + reference outputs.

Needs torch (`pip install torch==2.13.0`, CPU is enough). Writes, for a tied and an untied variant,
tests/fixtures/qwen2_<variant>/{config.json, model.safetensors, reference.npz}. reference.npz holds:
  input_ids [3, T] (LEFT padded with PAD), attention_mask [3, T], position_ids [3, T]
  (cumsum(mask) - 1, padding set to 1, as HF generate does), lengths [3],
  logits [3, T, V] f32 for the padded batch,
  logits_single [3, T, V] f32: each row run alone without padding (left-aligned, rest zero),
  greedy [3, 8]: HF generate(do_sample=False) continuation of the padded batch,
  greedy_margin: smallest top1 - top2 logit gap met during generation (ties would make greedy ill-posed).

Usage: python scripts/make_parity_fixture.py [--out tests/fixtures]
"""

import argparse
import os

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

PAD = 0
NEW_TOKENS = 8
LENGTHS = (11, 7, 3)

VARIANTS = {
    # hidden 64 / 4 heads / 2 kv heads (head_dim 16), tied head, Qwen's theta.
    "tied": dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-6, theta=1e6, seed=0, embed_std=0.25,
    ),
    # Different shapes on purpose: 3 layers, head_dim 8, group size 4, untied head, theta 1e4.
    "untied": dict(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, tie_word_embeddings=False, rms_norm_eps=1e-5, theta=1e4, seed=1, embed_std=1.0,
    ),
}


def build(v):
    torch.manual_seed(v["seed"])
    cfg = Qwen2Config(
        vocab_size=v["vocab_size"], hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
        num_hidden_layers=v["num_hidden_layers"], num_attention_heads=v["num_attention_heads"],
        num_key_value_heads=v["num_key_value_heads"], tie_word_embeddings=v["tie_word_embeddings"],
        rms_norm_eps=v["rms_norm_eps"], rope_parameters={"rope_type": "default", "rope_theta": v["theta"]},
        max_position_embeddings=128, pad_token_id=PAD, bos_token_id=None, eos_token_id=None,
    )
    cfg.architectures = ["Qwen2ForCausalLM"]
    model = Qwen2ForCausalLM(cfg).eval()
    # Large, non-trivial values everywhere (biases, norm scales) so that every mapping-table row
    # matters and greedy decoding has clear margins.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(v["embed_std"] * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    return model


def reference(model, seed):
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    t = max(LENGTHS)
    ids = np.full((len(LENGTHS), t), PAD, np.int64)
    mask = np.zeros((len(LENGTHS), t), np.int64)
    for b, n in enumerate(LENGTHS):
        ids[b, t - n:] = rng.integers(1, vocab, n)
        mask[b, t - n:] = 1
    pos = np.cumsum(mask, 1) - 1
    pos[mask == 0] = 1
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos)
        ).logits.float().numpy()
        single = np.zeros_like(logits)
        for b, n in enumerate(LENGTHS):
            single[b, :n] = model(input_ids=torch.tensor(ids[b:b + 1, t - n:])).logits.float().numpy()[0]
        out = model.generate(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=PAD, eos_token_id=None,
            output_scores=True, return_dict_in_generate=True,
        )
    greedy = out.sequences[:, t:].numpy()
    scores = torch.stack(out.scores, 1).float()  # [B, N, V]
    top2 = torch.topk(scores, 2, dim=-1).values
    margin = float((top2[..., 0] - top2[..., 1]).min())
    assert greedy.shape == (len(LENGTHS), NEW_TOKENS), greedy.shape
    assert margin > 1e-3, f"greedy margin {margin} too small; pick another seed"
    return dict(
        input_ids=ids.astype(np.int32), attention_mask=mask.astype(np.int32), position_ids=pos.astype(np.int32),
        lengths=np.asarray(LENGTHS, np.int32), logits=logits.astype(np.float32),
        logits_single=single.astype(np.float32), greedy=greedy.astype(np.int32), greedy_margin=np.float32(margin),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    args = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    for name, v in VARIANTS.items():
        d = os.path.join(args.out, f"qwen2_{name}")
        model = build(v)
        model.config._attn_implementation = "eager"
        model.save_pretrained(d, safe_serialization=True)
        ref = reference(model, v["seed"])
        np.savez_compressed(os.path.join(d, "reference.npz"), **ref)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{d}: {size / 1e3:.0f} kB, greedy margin {float(ref['greedy_margin']):.3f}")


if __name__ == "__main__":
    main()
