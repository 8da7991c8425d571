"""Decoder parity on an accelerator (not run in CI): max |logit error| vs the PyTorch reference fixtures.

For each fixture (tests/fixtures/FIXTURES: qwen2_{tied,untied,gqa3}, llama_{untied,bias}, qwen3_untied) reports, on the default JAX backend:
  f32 (matmul precision "highest"), f32 (backend default precision, e.g. TF32 on NVIDIA),
  bf16 params + compute; for each the max abs logit error at valid positions (left-padded batch),
  the same through the KV-cache prefill, and whether greedy decoding with the cache reproduces HF.

Usage: python scripts/parity_gpu.py [--json out.json]
"""

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ragen_jax.models import KVCache, forward, from_pretrained, logits_fn

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
PARITY_FIXTURES = ("qwen2_tied", "qwen2_untied", "qwen2_gqa3", "llama_untied", "llama_bias", "qwen3_untied")


def run(variant: str, dtype: str, precision: str | None) -> dict:
    d = os.path.join(FIXTURES, variant)
    with np.load(os.path.join(d, "reference.npz")) as z:
        ref = {k: z[k] for k in z.files}
    model = from_pretrained(d, dtype=dtype)
    g, p = nnx.split(model)
    valid = ref["attention_mask"].astype(bool)
    b, n_new = ref["greedy"].shape

    @jax.jit
    def nocache(p, ids, valid):
        return logits_fn(g, p, forward(g, p, ids, valid, None)[0])

    @jax.jit
    def step(p, ids, valid, cache):
        h, cache = forward(g, p, ids, valid, cache)
        return logits_fn(g, p, h), cache

    with jax.default_matmul_precision(precision) if precision else _null():
        lg = np.asarray(nocache(p, ref["input_ids"], valid))
        cache = KVCache.init(model.cfg, batch=b, max_len=ref["input_ids"].shape[1] + n_new)
        lc, cache = step(p, ref["input_ids"], valid, cache)
        tok = jnp.argmax(lc[:, -1], -1).astype(jnp.int32)
        out = [tok]
        for _ in range(n_new - 1):
            l1, cache = step(p, tok[:, None], jnp.ones((b, 1), bool), cache)
            tok = jnp.argmax(l1[:, -1], -1).astype(jnp.int32)
            out.append(tok)
    greedy = np.asarray(jnp.stack(out, 1))
    return {
        "variant": variant,
        "dtype": dtype,
        "precision": precision or "default",
        "max_abs_err_nocache": float(np.abs(lg - ref["logits"])[valid].max()),
        "max_abs_err_cache": float(np.abs(np.asarray(lc) - ref["logits"])[valid].max()),
        "max_abs_logit": float(np.abs(ref["logits"][valid]).max()),
        "greedy_match": bool((greedy == ref["greedy"]).all()),
        "greedy_margin": float(ref["greedy_margin"]),
    }


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"backend: {jax.default_backend()}  devices: {jax.devices()}")
    rows = []
    for variant in PARITY_FIXTURES:
        for dtype, precision in (("float32", "highest"), ("float32", None), ("bfloat16", None)):
            r = run(variant, dtype, precision)
            rows.append(r)
            print(
                f"{variant:13s} {dtype:9s} precision={r['precision']:8s} max|err| nocache={r['max_abs_err_nocache']:.2e} "
                f"cache={r['max_abs_err_cache']:.2e} (max|logit| {r['max_abs_logit']:.1f}) greedy_match={r['greedy_match']}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": jax.default_backend(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
