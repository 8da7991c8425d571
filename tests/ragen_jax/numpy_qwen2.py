"""A Qwen2 forward pass in plain numpy, written from transformers' Qwen2 definition (modeling_qwen2.py:
RMSNorm, rotate-half RoPE, grouped-query attention with q/k/v bias, SiLU MLP, tied or untied head) and
reading a Hugging Face directory (config.json + model.safetensors). It shares no code with
ragen_jax.models: the truth the host loop decodes with (tests/ragen_jax/rollout/test_rollout.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


class NumpyQwen2:
    def __init__(self, path):
        path = Path(path)
        c = json.loads((path / "config.json").read_text())
        index = path / "model.safetensors.index.json"  # sharded: the index names each tensor's file
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
        self.w = {k: v.astype(np.float32) for f in files for k, v in load_file(str(path / f)).items()}
        self.layers, self.heads, self.kv_heads = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        self.eps = c["rms_norm_eps"]
        theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        head = self.w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else self.w["lm_head.weight"]
        self.head_t = np.ascontiguousarray(head.T)  # [hidden, V]: a transposed view would be copied per call
        self._cache = ([], None)  # (ids, per-layer keys/values) of the last next_logits call

    def _norm(self, x, weight):
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)) * weight

    def _rope(self, x, cos, sin):  # x [heads, L, d]
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def _attention(self, x, i, cos, sin, past):
        """Attention of the new positions (x [n, hidden]) over the past keys/values and their own,
        causally -> (output [n, hidden], this layer's keys/values including the new ones)."""
        p = f"model.layers.{i}.self_attn."
        n = x.shape[0]

        def proj(name, heads):
            y = x @ self.w[p + name + ".weight"].T + self.w[p + name + ".bias"]
            return y.reshape(n, heads, self.head_dim).transpose(1, 0, 2)

        q = self._rope(proj("q_proj", self.heads), cos, sin)
        k = self._rope(proj("k_proj", self.kv_heads), cos, sin)
        v = proj("v_proj", self.kv_heads)
        if past is not None:
            k, v = np.concatenate([past[0], k], axis=1), np.concatenate([past[1], v], axis=1)
        group = self.heads // self.kv_heads
        kk, vv = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
        start = k.shape[1] - n
        scores = q @ kk.transpose(0, 2, 1) / np.sqrt(self.head_dim)
        allowed = np.arange(k.shape[1])[None, :] <= start + np.arange(n)[:, None]
        scores = np.where(allowed, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        out = (probs / probs.sum(-1, keepdims=True)) @ vv
        return out.transpose(1, 0, 2).reshape(n, -1) @ self.w[p + "o_proj.weight"].T, (k, v)

    def _mlp(self, x, i):
        p = f"model.layers.{i}.mlp."
        gate, up = x @ self.w[p + "gate_proj.weight"].T, x @ self.w[p + "up_proj.weight"].T
        return (gate / (1.0 + np.exp(-gate)) * up) @ self.w[p + "down_proj.weight"].T

    def _run(self, ids, start, past, last_only):
        """Positions start.. of `ids` (the tokens after the `past` keys/values) -> (logits, keys/values)."""
        x = self.w["model.embed_tokens.weight"][np.asarray(ids)]
        freqs = (start + np.arange(len(ids)))[:, None] * self.inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
        kv = []
        for i in range(self.layers):
            a, layer_kv = self._attention(self._norm(x, self.w[f"model.layers.{i}.input_layernorm.weight"]), i, cos, sin,
                                          None if past is None else past[i])
            kv.append(layer_kv)
            x = x + a
            x = x + self._mlp(self._norm(x, self.w[f"model.layers.{i}.post_attention_layernorm.weight"]), i)
        x = x[-1:] if last_only else x  # the vocabulary head is most of a step's cost
        return self._norm(x, self.w["model.norm.weight"]) @ self.head_t, kv

    def logits(self, ids) -> np.ndarray:
        """[L, V] float32 logits of token ids [L] (positions 0..L-1, causal), from scratch."""
        return self._run(ids, 0, None, last_only=False)[0]

    def next_logits(self, ids) -> np.ndarray:
        """[V]: the logits of the token after `ids`. The keys/values of the longest prefix `ids` shares
        with the previous call are reused (greedy decoding extends a sequence token by token)."""
        ids = [int(t) for t in ids]
        cached, past = self._cache
        k = 0
        while k < min(len(cached), len(ids) - 1) and cached[k] == ids[k]:
            k += 1
        past = None if k == 0 else [(pk[:, :k], pv[:, :k]) for pk, pv in past]
        out, kv = self._run(ids[k:], k, past, last_only=True)
        self._cache = (ids, kv)
        return out[0]
