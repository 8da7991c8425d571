"""Throughput of the compiled multi-turn rollout (`ragen_jax.rollout.Rollout`) next to the host loop.

Sokoban, P groups x N episodes, `--turns` turns of up to `--max-response-tokens` sampled tokens,
temperature 1, random weights (float32). Random weights almost never emit a stop token, so nearly
every turn samples its whole budget: the workload is the same every call. Rates are over one full
call (block_until_ready, prefill and env steps included): generated tokens/s (sampled tokens =
`response_length`), conversation tokens/s (every token of the conversations = `length`) and
episodes/s; median of `--repeats` after one warm-up call whose extra time is reported as compile
time. The baseline is `ragen_jax.rollout.host_loop.host_rollout` (Python loop over turns and
episodes, host text + tokenizer, one fresh jitted `generate` over the whole re-encoded conversation
each turn, no KV reuse across turns), timed in the same run and printed as a ratio.

Memory-bandwidth bound (for an accelerator run): every decode step reads all weights plus the live
KV cache, so seconds_per_rollout >= decode_steps * (weight_bytes + mean_kv_bytes) / HBM_bandwidth
with decode_steps = turns * max_response_tokens; `--hbm-gbps` fills in the bound and the fraction.

Variants (`--variants scan,bf16`), built from the same weights and timed in the same run, interleaved
call by call with the current program (ratios `ratio_<variant>_over_current`, > 1 = the variant is
faster): `scan` the decode path before issue 14 (the layer loop a scan over the stacked weights and
cache, model config `decode_unroll=False`: the "before" of docs/experiments/decode.md);
`bf16` the model with `matmul_dtype="bfloat16"` (projections and head on bf16 operands, float32
accumulation).

Usage: python -m bench.rollout [--shapes tiny,qwen2.5-0.5b] [--vocab full|task|both] [--quick] [--variants scan,bf16]
       [--groups 8 --group-size 16 --turns 5 --max-response-tokens 400] [--big-settings P,N,TURNS,TOKENS]
       [--repeats 3] [--host-repeats 1] [--no-host] [--hbm-gbps 3350] [--out bench/results/rollout.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


import jax
import numpy as np
from flax import nnx

from bench.common import machine, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "rollout.json"


def _presets():
    from ragen_jax.models import PRESETS

    return tuple(PRESETS)


VARIANTS = ("scan", "bf16")


def build(shape: str, vocab: str, groups: int, group_size: int, turns: int, max_new: int, tokenizer,
          max_context: int | None = None, seed: int = 0, matmul_dtype: str | None = None,
          decode_unroll: bool = True):
    """(model, text_env, Rollout) for Sokoban with random weights; `vocab` 'full' or 'task'."""
    from ragen_jax.experiment.config import Config
    from ragen_jax.models import Qwen2, Qwen2Config
    from ragen_jax.rollout import Rollout, RolloutConfig
    from ragen_jax.experiment.build import build_text_envs, build_vocab

    if shape not in _presets():
        raise ValueError(f"unknown shape {shape!r}; valid: {', '.join(_presets())}")
    if vocab not in ("full", "task"):
        raise ValueError(f"unknown vocab {vocab!r}; valid: full, task")
    cfg = Config()
    cfg.env.name = "Sokoban"
    cfg.model.vocab = vocab
    cfg.prompt.max_turns = turns
    cfg.prompt.max_response_tokens = max_new
    text_env = build_text_envs(cfg, tokenizer)["Sokoban"]
    vmap = build_vocab(cfg, {"Sokoban": text_env}, tokenizer)
    qcfg = Qwen2Config.from_preset(shape, matmul_dtype=matmul_dtype, decode_unroll=decode_unroll)
    if vmap is not None:
        qcfg = qcfg.replace(vocab_size=vmap.size)
    model = Qwen2(qcfg, rngs=nnx.Rngs(seed))
    if max_context is None:  # room for every turn: no episode is cut short by the context budget
        max_context = len(text_env.prefix_ids) + turns * (int(text_env.max_segment_len) + max_new) + 8
    rcfg = RolloutConfig(num_groups=groups, group_size=group_size, max_context=max_context, temperature=1.0)
    return model, text_env, Rollout(model, text_env, rcfg, vocab=vmap), vmap


def bandwidth_bound(model, rcfg, turns: int, max_new: int, mean_context: float,
                    hbm_gbps: float | None) -> dict:
    """Bytes one decode step must read (weights + mean live KV cache) and the bound it implies."""
    cfg = model.cfg
    params = nnx.state(model, nnx.Param)
    weight_bytes = int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)))
    # A tied matrix is counted once (read as the head; the embedding lookup reads only B rows).
    itemsize = np.dtype(rcfg.cache_dtype or cfg.dtype).itemsize
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    kv_bytes = int(rcfg.batch_size * mean_context * kv_per_token * itemsize)
    steps = turns * max_new
    out = {
        "formula": "s_per_rollout >= turns * max_response_tokens * (weight_bytes + mean_kv_bytes) / (hbm_gbps * 1e9)",
        "weight_bytes": weight_bytes,
        "mean_kv_bytes_per_step": kv_bytes,
        "decode_steps": steps,
        "hbm_gbps": hbm_gbps,
        "bound_s_per_rollout": None,
    }
    if hbm_gbps:
        out["bound_s_per_rollout"] = steps * (weight_bytes + kv_bytes) / (hbm_gbps * 1e9)
    return out


def _variant_row(e: dict) -> dict:
    vmed = statistics.median(e["times"])
    return {
        "first_call_s": round(e["first"], 2),
        "s_per_rollout": [round(t, 3) for t in e["times"]],
        "median_s_per_rollout": round(vmed, 3),
        "generated_tok_s": round(statistics.median(g / t for g, t in zip(e["gen"], e["times"])), 1),
        # same key and weights: the float32 scan samples the same tokens; bf16 rounding may not
        "same_tokens_as_current_frac": e["same_tokens_frac"],
    }


def _host_baseline(model, text_env, ro, groups: int, tokenizer, host_repeats: int) -> dict:
    """The host loop's rates on the same model and text env (ragen_jax/rollout/host_loop.py)."""
    from ragen_jax.rollout.host_loop import host_rollout
    from ragen_jax.rollout import group_seeds_for_iteration
    from ragen_jax.text.tokenizer import token_bytes_table

    tb = token_bytes_table(tokenizer)
    seeds = group_seeds_for_iteration(0, groups)

    def host_call(i):
        out = host_rollout(model, text_env, ro.parser, ro.config, jax.random.PRNGKey(i), seeds, tb)
        return sum(len(x) for x in out["ids"]), sum(sum(m) for m in out["mask"])

    t0 = time.perf_counter()
    host_call(0)
    hfirst = time.perf_counter() - t0
    htimes, hgen, hconv = [], [], []
    for i in range(host_repeats):
        t0 = time.perf_counter()
        c, g = host_call(i + 1)
        htimes.append(time.perf_counter() - t0)
        hgen.append(g)
        hconv.append(c)
    hmed = statistics.median(htimes)
    return {
        "compile_s": round(max(hfirst - hmed, 0.0), 2),
        "s_per_rollout": [round(t, 3) for t in htimes],
        "median_s_per_rollout": round(hmed, 3),
        "generated_tok_s": round(statistics.median(g / t for g, t in zip(hgen, htimes)), 1),
        "conversation_tok_s": round(statistics.median(c / t for c, t in zip(hconv, htimes)), 1),
        "episodes_per_s": round(ro.config.batch_size / hmed, 3),
    }


def bench_rollout(shape: str, vocab: str, *, groups: int, group_size: int, turns: int, max_new: int, tokenizer,
                  repeats: int = 3, host_repeats: int = 1, host: bool = True, hbm_gbps: float | None = None,
                  max_context: int | None = None, variants: tuple[str, ...] = ()) -> dict:
    """One row: compiled rollout rates (+ host-loop baseline and ratio, + variants). JSON-able dict."""
    from ragen_jax.rollout import group_seeds_for_iteration

    model, text_env, ro, vmap = build(shape, vocab, groups, group_size, turns, max_new, tokenizer, max_context)
    rcfg = ro.config
    params = nnx.state(model)
    b = rcfg.batch_size
    row = {"shape": shape, "vocab": vocab, "vocab_size": int(model.cfg.vocab_size), "env": "Sokoban",
           "groups": groups, "group_size": group_size, "turns": turns, "max_response_tokens": max_new,
           "max_context": rcfg.max_context, "temperature": 1.0, "dtype": str(model.cfg.dtype),
           "prefix_tokens": len(text_env.prefix_ids)}

    def call(i):
        traj = ro(params, jax.random.PRNGKey(i), group_seeds_for_iteration(i, groups))
        jax.block_until_ready(traj.tokens)
        return traj

    t0 = time.perf_counter()
    traj = call(0)
    first = time.perf_counter() - t0
    # Variants: the same weights (same seed), compiled now (the decode path is chosen while tracing).
    extra = {}
    for v in variants:
        _, _, vro, _ = build(shape, vocab, groups, group_size, turns, max_new, tokenizer, max_context,
                             matmul_dtype="bfloat16" if v == "bf16" else None, decode_unroll=v != "scan")

        def vcall(i, vro=vro):
            t = vro(params, jax.random.PRNGKey(i), group_seeds_for_iteration(i, groups))
            jax.block_until_ready(t.tokens)
            return t

        t0 = time.perf_counter()
        vtraj = vcall(0)
        extra[v] = {"call": vcall, "first": time.perf_counter() - t0, "times": [], "gen": [],
                    "same_tokens_frac": float(np.mean(np.asarray(vtraj.tokens) == np.asarray(traj.tokens)))}
    times, gen, conv = [], [], []
    for i in range(repeats):  # interleaved: every variant sees the same machine load
        t0 = time.perf_counter()
        traj = call(i + 1)
        times.append(time.perf_counter() - t0)
        gen.append(int(np.sum(np.asarray(traj.response_length))))
        conv.append(int(np.sum(np.asarray(traj.length))))
        for e in extra.values():
            t0 = time.perf_counter()
            vtraj = e["call"](i + 1)
            e["times"].append(time.perf_counter() - t0)
            e["gen"].append(int(np.sum(np.asarray(vtraj.response_length))))
    med = statistics.median(times)
    row.update({
        "compile_s": round(max(first - med, 0.0), 2),
        "first_call_s": round(first, 2),
        "s_per_rollout": [round(t, 3) for t in times],
        "median_s_per_rollout": round(med, 3),
        "generated_tokens": gen[-1],
        "conversation_tokens": conv[-1],
        "generated_tok_s": round(statistics.median(g / t for g, t in zip(gen, times)), 1),
        "conversation_tok_s": round(statistics.median(c / t for c, t in zip(conv, times)), 1),
        "episodes_per_s": round(b / med, 3),
        "mean_turns": float(np.mean(np.asarray(traj.num_turns))),
        "truncated_frac": float(np.mean(np.asarray(traj.truncated))),
    })
    for v, e in extra.items():
        row[f"variant_{v}"] = _variant_row(e)
        row[f"ratio_{v}_over_current"] = round(med / row[f"variant_{v}"]["median_s_per_rollout"], 3)
    mean_ctx = float(np.mean(np.asarray(traj.length))) / 2  # the cache grows linearly over the rollout
    bound = bandwidth_bound(model, rcfg, turns, max_new, mean_ctx, hbm_gbps)
    if bound["bound_s_per_rollout"]:
        bound["fraction_of_bound"] = round(bound["bound_s_per_rollout"] / med, 4)
    row["bandwidth_bound"] = bound

    if host and vmap is None:  # the host loop runs full-vocabulary models only
        row["host"] = _host_baseline(model, text_env, ro, groups, tokenizer, host_repeats)
        row["ratio_generated_tok_s_ours_over_host"] = round(row["generated_tok_s"] / row["host"]["generated_tok_s"], 2)
        row["ratio_episodes_per_s_ours_over_host"] = round(row["episodes_per_s"] / row["host"]["episodes_per_s"], 2)
    elif host:
        row["host"] = "skipped: the host loop has no VocabMap support (task vocabulary)"
    return row


def _settings_for(shape, args):
    if shape != "tiny" and args.big_settings != "same":
        try:
            p, n, t, m = (int(x) for x in args.big_settings.split(","))
        except ValueError:
            raise ValueError(f"--big-settings {args.big_settings!r}: expected P,N,TURNS,TOKENS like 2,2,2,16 "
                             "or 'same'") from None
        return dict(groups=p, group_size=n, turns=t, max_new=m)
    return dict(groups=args.groups, group_size=args.group_size, turns=args.turns, max_new=args.max_response_tokens)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="tiny", help="comma-separated presets, e.g. tiny,qwen2.5-0.5b")
    p.add_argument("--vocab", default="full", choices=("full", "task", "both"))
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-response-tokens", type=int, default=400)
    p.add_argument("--max-context", type=int, default=None, help="default: room for every turn")
    p.add_argument("--big-settings", default="2,2,2,16",
                   help="P,N,TURNS,TOKENS for shapes other than tiny (slow on CPU), or 'same'")
    p.add_argument("--quick", action="store_true", help="P=2, N=4, 2 turns, 32 tokens (and 1,2,1,8 for big shapes)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--host-repeats", type=int, default=1)
    p.add_argument("--no-host", action="store_true")
    p.add_argument("--hbm-gbps", type=float, default=None, help="memory bandwidth for the bound (H100 SXM: 3350)")
    p.add_argument("--variants", default="", help=f"comma-separated, timed next to the current program: "
                                                  f"{', '.join(VARIANTS)}")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    variants = tuple(v for v in args.variants.split(",") if v)
    if set(variants) - set(VARIANTS):
        print(f"error: unknown variant(s) {sorted(set(variants) - set(VARIANTS))} in --variants; valid: "
              f"{', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    if args.quick:
        args.groups, args.group_size, args.turns, args.max_response_tokens = 2, 4, 2, 32
        if args.big_settings == "2,2,2,16":
            args.big_settings = "1,2,1,8"
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in shapes if s not in _presets()]
    if bad:
        print(f"error: unknown shape {bad[0]!r} in --shapes; valid: {', '.join(_presets())}", file=sys.stderr)
        return 2
    vocabs = ("full", "task") if args.vocab == "both" else (args.vocab,)

    from ragen_jax.text.tokenizer import load_tokenizer

    tok = load_tokenizer()
    result = {"machine": machine(), "settings": vars(args), "rows": []}
    print(f"backend {jax.default_backend()}, {os.cpu_count()} cpus, load {os.getloadavg()}", flush=True)
    for shape in shapes:
        for vocab in vocabs:
            try:
                s = _settings_for(shape, args)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            row = bench_rollout(shape, vocab, tokenizer=tok, repeats=args.repeats, host_repeats=args.host_repeats,
                                host=not args.no_host, hbm_gbps=args.hbm_gbps, max_context=args.max_context,
                                variants=variants, **s)
            result["rows"].append(row)
            line = (f"{shape:>13} {vocab:>4} P{s['groups']} N{s['group_size']} turns {s['turns']} tokens {s['max_new']}: "
                    f"{row['median_s_per_rollout']:.2f} s/rollout, {row['generated_tok_s']:.1f} gen tok/s, "
                    f"{row['conversation_tok_s']:.1f} conv tok/s, {row['episodes_per_s']:.2f} ep/s "
                    f"(compile {row['compile_s']:.1f} s)")
            if isinstance(row.get("host"), dict):
                line += (f" | host loop {row['host']['median_s_per_rollout']:.2f} s, "
                         f"{row['host']['generated_tok_s']:.1f} gen tok/s -> ratio "
                         f"{row['ratio_generated_tok_s_ours_over_host']:.2f}x")
            for v in variants:
                vr = row[f"variant_{v}"]
                line += f" | {v} {vr['median_s_per_rollout']:.2f} s ({row[f'ratio_{v}_over_current']:.2f}x the current speed)"
            bb = row["bandwidth_bound"]
            line += (f" | bound: {bb['decode_steps']} steps x ({bb['weight_bytes'] / 1e6:.1f} MB weights + "
                     f"{bb['mean_kv_bytes_per_step'] / 1e6:.1f} MB KV) / hbm")
            if bb["bound_s_per_rollout"]:
                line += f" = {bb['bound_s_per_rollout']:.3f} s ({bb['fraction_of_bound']:.1%} of bound)"
            print(line, flush=True)
            write_result(result, args.out)  # after every row: a long run cut short keeps its rows
    write_result(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
