"""Attention kernels and remat: compiled memory of a 0.5B training forward+backward, and speed.

Memory rows: the gradient wrt all parameters of the trainer's token log-prob loss
(`step.sequence_logprobs`, no [B, T, V] logits) for the qwen2.5-0.5b preset with bf16 compute and
float32 parameters, at B rows x 3,600 tokens, compiled for the local backend from ABSTRACT parameters
(`nnx.eval_shape`: nothing allocated), read from XLA's `memory_analysis` (`trainer/memory.py program_memory`:
peak = arguments + outputs - aliased + temporaries). Every attention implementation that runs here
x remat off / "full" / "dots".

Speed rows (same run, same machine): the ratio of chunked to xla wall time, forward+backward,
  - the attention op alone with 0.5B geometry (14 query heads, 2 key/value heads, head_dim 64,
    float32) at several lengths and chunk blocks (this picks CHUNKED_MIN_SCORES / DEFAULT_BLOCK);
  - whole models: a tiny shape (preset "tiny", 8 x 256) and a mid shape (0.5B widths, 4 layers,
    4,096-id vocabulary, 1 x 2,048).

Remat speed rows: the mid shape (chunked) with remat off / "full" / "dots".

Usage: python -m bench.attention [--sections speed,remat_speed,memory] [--append] [--batches 1,4] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


import jax
import jax.numpy as jnp
from flax import nnx

from bench.common import machine, write_result
from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.models.attention import CHUNKED_MIN_SCORES, DEFAULT_BLOCK, attention
from ragen_jax.trainer.memory import program_memory
from ragen_jax.trainer.step import sequence_logprobs

RESULTS = Path(__file__).resolve().parent / "results" / "attention.json"
GIB = 2**30
CONTEXT = 3600
REMAT = {"off": (False, "full"), "full": (True, "full"), "dots": (True, "dots")}


def _loss_grad(graphdef):
    def loss(params, tokens, valid):
        logp, _ = sequence_logprobs(graphdef, params, tokens, valid)
        mask = (valid[:, 1:] & valid[:, :-1]).astype(jnp.float32)
        return -jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)

    return jax.grad(loss)


def memory_row(batch: int, impl: str, remat: str) -> dict:
    on, policy = REMAT[remat]
    cfg = Qwen2Config.from_preset("qwen2.5-0.5b", dtype="bfloat16", param_dtype="float32", attention=impl,
                                  remat=on, remat_policy=policy)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Qwen2(cfg, nnx.Rngs(0))))
    tokens = jax.ShapeDtypeStruct((batch, CONTEXT), jnp.int32)
    valid = jax.ShapeDtypeStruct((batch, CONTEXT), jnp.bool_)
    t0 = time.perf_counter()
    compiled = jax.jit(_loss_grad(graphdef)).lower(params, tokens, valid).compile()
    mem = program_memory(compiled)
    return {"kind": "memory", "preset": "qwen2.5-0.5b", "batch": batch, "tokens": CONTEXT, "attention": impl,
            "remat": remat, **mem, "peak_gib": round(mem["peak_bytes"] / GIB, 3),
            "temp_gib": round(mem["temp_bytes"] / GIB, 3), "compile_s": round(time.perf_counter() - t0, 1)}


def _time(fn, *args, reps: int) -> float:
    jax.block_until_ready(fn(*args))  # compile + warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def op_speed_row(batch: int, t: int, blocks=(128, 256, 512), reps: int = 5) -> dict:
    nh, nkv, d = 14, 2, 64
    ks = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(ks[0], (batch, t, nh, d))
    k = jax.random.normal(ks[1], (batch, t, nkv, d))
    v = jax.random.normal(ks[2], (batch, t, nkv, d))
    valid = jnp.broadcast_to(jnp.arange(t) < int(t * 0.9), (batch, t))  # 10% right padding

    def fwd_bwd(impl, block):
        def loss(q, k, v):
            return attention(q, k, v, valid, q_valid=valid, implementation=impl, block=block).sum()

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    xla_s = _time(fwd_bwd("xla", 0), q, k, v, reps=reps)
    row = {"kind": "op_speed", "batch": batch, "tokens": t, "heads": [nh, nkv, d], "dtype": "float32",
           "xla_s": round(xla_s, 5)}
    for blk in blocks:
        row[f"chunked_{blk}_s"] = round(_time(fwd_bwd("chunked", blk), q, k, v, reps=reps), 5)
        row[f"ratio_chunked_{blk}_to_xla"] = round(row[f"chunked_{blk}_s"] / xla_s, 3)
    return row


def model_speed_row(name: str, cfg: Qwen2Config, batch: int, t: int, reps: int) -> dict:
    tokens = jax.random.randint(jax.random.key(1), (batch, t), 0, cfg.vocab_size)
    valid = jnp.broadcast_to(jnp.arange(t) < int(t * 0.9), (batch, t))
    row = {"kind": "model_speed", "shape": name, "batch": batch, "tokens": t, "layers": cfg.num_hidden_layers,
           "hidden": cfg.hidden_size, "vocab": cfg.vocab_size, "dtype": cfg.dtype}
    for impl in ("xla", "chunked"):
        graphdef, params = nnx.split(Qwen2(cfg.replace(attention=impl), nnx.Rngs(0)))
        row[f"{impl}_s"] = round(_time(jax.jit(_loss_grad(graphdef)), params, tokens, valid, reps=reps), 4)
    row["ratio_chunked_to_xla"] = round(row["chunked_s"] / row["xla_s"], 3)
    return row


def remat_speed_row(remat: str, reps: int = 2) -> dict:
    """Whether "dots" buys speed for its memory: the mid shape with chunked attention."""
    on, policy = REMAT[remat]
    cfg = Qwen2Config.from_preset("qwen2.5-0.5b", num_hidden_layers=4, vocab_size=4096, attention="chunked",
                                  remat=on, remat_policy=policy)
    batch, t = 1, 2048
    tokens = jax.random.randint(jax.random.key(1), (batch, t), 0, cfg.vocab_size)
    valid = jnp.broadcast_to(jnp.arange(t) < int(t * 0.9), (batch, t))
    graphdef, params = nnx.split(Qwen2(cfg, nnx.Rngs(0)))
    return {"kind": "remat_speed", "shape": "mid", "batch": batch, "tokens": t, "attention": "chunked",
            "remat": remat, "s": round(_time(jax.jit(_loss_grad(graphdef)), params, tokens, valid, reps=reps), 4)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--sections", default="speed,remat_speed,memory", help="comma list of speed, remat_speed, memory")
    ap.add_argument("--append", action="store_true", help="keep the rows already in --out (other sections)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    backend = jax.default_backend()
    impls = ["xla", "chunked"] + (["cudnn"] if backend == "gpu" else []) + (["splash"] if backend == "tpu" else [])
    result = {"benchmark": "attention", "machine": machine(),
              "settings": {"context": CONTEXT, "chunked_min_scores": CHUNKED_MIN_SCORES,
                           "default_block": DEFAULT_BLOCK, "memory_program": "grad of token log-prob loss wrt "
                           "all params, qwen2.5-0.5b, bf16 compute, f32 params, abstract params"},
              "rows": []}
    sections = set(args.sections.split(","))
    if args.append and Path(args.out).exists():
        result["rows"] = json.loads(Path(args.out).read_text())["rows"]
        result["runs"] = json.loads(Path(args.out).read_text()).get("runs", []) + [result["machine"]]

    def add(row):
        print(row, flush=True)
        result["rows"].append(row)
        write_result(result, args.out)

    if "speed" in sections:
        for batch, t in ((4, 128), (4, 512), (1, 2048)):
            add(op_speed_row(batch, t))
        tiny = Qwen2Config.from_preset("tiny")
        mid = Qwen2Config.from_preset("qwen2.5-0.5b", num_hidden_layers=4, vocab_size=4096)
        add(model_speed_row("tiny", tiny, 8, 256, reps=5))
        add(model_speed_row("mid", mid, 1, 2048, reps=2))
    if "remat_speed" in sections:
        for remat in REMAT:
            add(remat_speed_row(remat))
    if "memory" in sections:
        for batch in [int(b) for b in args.batches.split(",")]:
            for impl in impls:
                for remat in REMAT:
                    add(memory_row(batch, impl, remat))


if __name__ == "__main__":
    main()
