"""Make the parity fixtures: tiny random transformers *ForCausalLM models (qwen2, llama, qwen3) + reference
outputs.

Needs torch (`pip install torch==2.13.0`, CPU is enough). Writes, per variant (VARIANTS),
tests/fixtures/<name>/{config.json, model.safetensors, reference.npz}. reference.npz holds:
  input_ids [3, T] (LEFT padded with PAD), attention_mask [3, T], position_ids [3, T]
  (cumsum(mask) - 1, padding set to 1, as HF generate does), lengths [3],
  logits [3, T, V] f32 for the padded batch,
  logits_single [3, T, V] f32: each row run alone without padding (left-aligned, rest zero),
  greedy [3, N]: HF generate(do_sample=False) continuation of the padded batch (N = 8 for the qwen2_tied /
  qwen2_untied fixtures, 32 for the family ones),
  greedy_logprobs [3, N]: log_softmax of HF's step logits at the greedy tokens,
  greedy_margin: smallest top1 - top2 logit gap met during generation (ties would make greedy ill-posed).
The family fixtures use odd shapes on purpose: GQA with 3 query heads per KV head, untied heads, other
rope thetas, llama3 rope scaling whose wavelength bands all occur at head_dim 16, llama attention/MLP
biases, qwen3 q/k norms with head_dim != hidden / heads.

`reference(model, seed, new_tokens)` is also what tests/ragen_jax/models/test_families.py calls against
live torch when it is importable.

Usage: python scripts/make_parity_fixture.py [--out tests/fixtures] [--only NAME ...]
"""

import argparse
import os

import numpy as np
import torch
import transformers

PAD = 0
LENGTHS = (11, 7, 3)
CLASSES = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
           "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}
LLAMA3_ROPE = dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)

VARIANTS = {
    # hidden 64 / 4 heads / 2 kv heads (head_dim 16), tied head, Qwen's theta.
    "qwen2_tied": dict(
        family="qwen2", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-6, theta=1e6,
        seed=0, embed_std=0.25, new_tokens=8,
    ),
    # Different shapes on purpose: 3 layers, head_dim 8, group size 4, untied head, theta 1e4.
    "qwen2_untied": dict(
        family="qwen2", vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False, rms_norm_eps=1e-5, theta=1e4,
        seed=1, embed_std=1.0, new_tokens=8,
    ),
    # 3 query heads on 1 KV head (head_dim 8), tied, theta 1e5; 32 greedy steps.
    "qwen2_gqa3": dict(
        family="qwen2", vocab_size=256, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=True, rms_norm_eps=1e-6, theta=1e5,
        seed=2, embed_std=1.0, new_tokens=32,
    ),
    # Llama 3 style: no biases, llama3 rope scaling (head_dim 16 at theta 5e5 has high, medium and low
    # frequency bands against original_max_position_embeddings 64), 3 heads / 1 KV head, untied.
    "llama_untied": dict(
        family="llama", vocab_size=256, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
        num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=False, rms_norm_eps=1e-5, theta=5e5,
        rope=LLAMA3_ROPE, seed=3, embed_std=1.0, new_tokens=32,
    ),
    # Llama with attention_bias (q/k/v/o) and mlp_bias, tied (SmolLM2-like tying), default rope 1e5.
    "llama_bias": dict(
        family="llama", vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-5, theta=1e5,
        attention_bias=True, mlp_bias=True, seed=4, embed_std=1.0, new_tokens=32,
    ),
    # Qwen3: q/k norms, head_dim 16 != hidden 40 / 3 heads, 3 heads / 1 KV head, untied, theta 2e4.
    "qwen3_untied": dict(
        family="qwen3", vocab_size=256, hidden_size=40, intermediate_size=72, num_hidden_layers=3,
        num_attention_heads=3, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False, rms_norm_eps=1e-6,
        theta=2e4, seed=5, embed_std=1.0, new_tokens=32,
    ),
}


def build(v, seed=None):
    torch.manual_seed(v["seed"] if seed is None else seed)
    cfg_cls, model_cls = (getattr(transformers, n) for n in CLASSES[v["family"]])
    extra = {k: v[k] for k in ("head_dim", "attention_bias", "mlp_bias") if k in v}
    cfg = cfg_cls(
        vocab_size=v["vocab_size"], hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
        num_hidden_layers=v["num_hidden_layers"], num_attention_heads=v["num_attention_heads"],
        num_key_value_heads=v["num_key_value_heads"], tie_word_embeddings=v["tie_word_embeddings"],
        rms_norm_eps=v["rms_norm_eps"],
        rope_parameters={"rope_type": "default", **v.get("rope", {}), "rope_theta": v["theta"]},
        max_position_embeddings=128, pad_token_id=PAD, bos_token_id=None, eos_token_id=None, **extra,
    )
    cfg.architectures = [CLASSES[v["family"]][1]]
    model = model_cls(cfg).eval()
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


def reference(model, seed, new_tokens):
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
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD, eos_token_id=None,
            output_scores=True, return_dict_in_generate=True,
        )
    greedy = out.sequences[:, t:].numpy()
    scores = torch.stack(out.scores, 1).float()  # [B, N, V]
    top2 = torch.topk(scores, 2, dim=-1).values
    margin = float((top2[..., 0] - top2[..., 1]).min())
    logprobs = torch.log_softmax(scores, -1).gather(-1, out.sequences[:, t:, None])[..., 0].numpy()
    assert greedy.shape == (len(LENGTHS), new_tokens), greedy.shape
    return dict(
        input_ids=ids.astype(np.int32), attention_mask=mask.astype(np.int32), position_ids=pos.astype(np.int32),
        lengths=np.asarray(LENGTHS, np.int32), logits=logits.astype(np.float32),
        logits_single=single.astype(np.float32), greedy=greedy.astype(np.int32), greedy_margin=np.float32(margin),
        greedy_logprobs=logprobs.astype(np.float32),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    ap.add_argument("--only", nargs="*", default=None, help=f"fixture names among {', '.join(VARIANTS)}")
    args = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    for name in args.only or VARIANTS:
        v = VARIANTS[name]
        d = os.path.join(args.out, name)
        # Greedy decoding is only well posed with clear top-1 gaps: the seed is bumped until every step
        # of the reference generation has one (the seed used is recorded in reference.npz).
        for seed in range(v["seed"], v["seed"] + 1000, 100):
            model = build(v, seed)
            model.config._attn_implementation = "eager"
            ref = reference(model, seed, v["new_tokens"])
            if float(ref["greedy_margin"]) > 1e-3:
                break
        else:
            raise SystemExit(f"{name}: no seed gives greedy margins > 1e-3")
        model.save_pretrained(d, safe_serialization=True)
        if name.startswith("qwen2_") and v["new_tokens"] == 8:
            del ref["greedy_logprobs"]  # the original fixtures' contents, byte for byte
        else:
            ref["seed"] = np.int32(seed)
        np.savez_compressed(os.path.join(d, "reference.npz"), **ref)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{d}: {size / 1e3:.0f} kB, seed {seed}, greedy margin {float(ref['greedy_margin']):.3f}")


if __name__ == "__main__":
    main()
