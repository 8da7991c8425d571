"""Decode throughput of `ragen_jax.rollout.sampler.generate` next to its peers, side by side in one run.

Random weights, a prompt of `--prompt-len` random ids, `--new-tokens` new tokens, greedy, no stop
token (every row generates all tokens), float32. Tokens/s = batch * new_tokens / wall time of one
full call (prefill included), median of `--repeats` after one warm-up call (which includes
compilation, timed separately). Peers, each measured in the same run and interleaved with ours
call by call (the CPU is shared: only ratios taken in one run mean something):

  torch       transformers' `Qwen2ForCausalLM.generate`, float32, the SAME weights (our
              `hf_state_dict`); its greedy tokens are compared with ours (`greedy_tokens_equal_frac`).
  torch_bf16  the same model cast to bfloat16 (weights and compute).
  torch_lp, torch_bf16_lp   the same two computing each step's chosen-token log-prob on the fly
              (a logits processor), as `ours` / `ours_bf16` do; plain `generate` computes none.
  tunix       Tunix's `Sampler` on its own Qwen2 (same shapes, its own random weights, float32),
              when `tunix` is importable (bench/README.md has the recipe; never a project dependency).
  tunix_bf16  the same with Tunix's dtype and param_dtype bfloat16.

Ours runs twice: `ours` (float32) and `ours_bf16` (the same weights with `matmul_dtype="bfloat16"`:
projections and the head round their operands to bf16 and accumulate in float32, docs/experiments/decode.md);
ratios are given for both (`ratio_ours_over_<peer>`, `ratio_ours_bf16_over_<peer>`), and
`ours_bf16_greedy_tokens_equal_frac` says how many greedy tokens the rounding changed.
  ours_nolp, ours_bf16_nolp   the same two with `generate(logprobs=False)`: tokens only, no
              per-token log-prob (so greedy reads each step's logits for the max and computes no
              exp over the vocabulary). transformers' greedy `generate` computes no log-probs
              either: these are the like-for-like sides for the torch columns. The run checks that
              they give the very same tokens as `ours` / `ours_bf16`.
  ours_scan   (`--before`) our sampler with the pre-issue-14 decode path: the layer loop a scan over
              the stacked weights (model config `decode_unroll=False`).

Each row also has the memory-bandwidth bound of the decode steps: one decode step streams every
weight once (the layer stack plus the tied vocabulary head), so decode-only tokens/s <=
batch / (weight_bytes / bandwidth). The bandwidth is measured in the same run (`--bandwidth-gbs`
overrides it): the best of a few timed reductions over a 1 GiB float32 array.

Usage: python -m bench.sampler [--rows tiny:64 --rows qwen2.5-0.5b:16,64] [--repeats 3] [--before]
       [--no-torch] [--no-tunix] [--peers torch,torch_bf16,tunix] [--out bench/results/sampler.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import machine as common_machine
from bench.common import write_result
from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.models.qwen2.weights import hf_state_dict
from ragen_jax.rollout import sampler

RESULTS = Path(__file__).resolve().parent / "results" / "sampler.json"
DEFAULT_ROWS = ("tiny:64", "qwen2.5-0.5b:16,64")
PEER_NAMES = ("torch", "torch_bf16", "torch_lp", "torch_bf16_lp", "tunix", "tunix_bf16")
OURS = ("ours", "ours_bf16", "ours_nolp", "ours_bf16_nolp")


def targets_for(name: str) -> dict:
    """Issue 14's targets, as minimum ratios ours / peer."""
    if name == "tiny":
        return {"best_peer": 3.0}
    return {"tunix": 1.5, "torch_bf16": 1.0}


def parse_rows(specs):
    rows = []
    for spec in specs:
        name, _, batches = spec.partition(":")
        if name not in sampler_presets():
            raise ValueError(f"unknown shape {name!r} in --rows {spec!r}; valid: {', '.join(sampler_presets())}")
        try:
            bs = [int(b) for b in batches.split(",")] if batches else [1]
        except ValueError:
            raise ValueError(f"--rows {spec!r}: batches must be integers like tiny:1,16,64") from None
        rows += [(name, b) for b in bs]
    return rows


def sampler_presets():
    from ragen_jax.models import PRESETS

    return tuple(PRESETS)


def machine():
    info = common_machine()
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        info["torch"] = None
    info["tunix"] = _tunix_version()
    return info


def _tunix_version():
    try:
        from importlib.metadata import version

        import tunix  # noqa: F401

        return version("google-tunix")
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return None


def measure_bandwidth_gbs(n_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Read bandwidth (GB/s): best of `repeats` jitted sums over an `n_bytes` float32 array."""
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    f = jax.jit(jnp.sum)
    f(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    del x
    return n_bytes / best / 1e9


def weight_bytes(model) -> int:
    """Bytes one decode step must read: every parameter once (the tied head is the embedding)."""
    return int(sum(v.size * v.dtype.itemsize for v in jax.tree.leaves(nnx.state(model, nnx.Param))))


def torch_model(model, dtype: str = "float32"):
    import torch
    import transformers

    hf_cfg = dict(model.cfg.to_hf_config())
    hf_cfg.pop("architectures", None)
    hf_cfg.pop("model_type", None)
    hf_cfg["dtype"] = "float32"
    cfg = transformers.Qwen2Config(**hf_cfg)
    tm = transformers.Qwen2ForCausalLM(cfg)
    sd = {k: torch.from_numpy(v) for k, v in hf_state_dict(model, "float32").items()}
    missing, unexpected = tm.load_state_dict(sd, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"weight transfer to transformers failed: missing {missing}, unexpected {unexpected}")
    tm.tie_weights()
    if dtype == "bfloat16":
        tm = tm.to(torch.bfloat16)
    return tm.eval()


def torch_generate_fn(tmodel, prompts: np.ndarray, n: int, logprobs: bool = False):
    """transformers' greedy `generate`; with `logprobs`, each step's chosen-token log-prob is also
    computed on the fly (a logits processor: max - logsumexp of the step's float32 scores), as our
    sampler does, so `torch*_lp` against `ours*` compares the same work."""
    import torch
    import transformers

    ids = torch.from_numpy(prompts.astype(np.int64))
    mask = torch.ones_like(ids)

    class LogProbOfGreedy(transformers.LogitsProcessor):
        def __init__(self):
            self.steps = []

        def __call__(self, input_ids, scores):
            s = scores.float()
            self.steps.append(s.max(dim=-1).values - torch.logsumexp(s, dim=-1))
            return scores

    def fn():
        extra = {}
        if logprobs:
            extra["logits_processor"] = transformers.LogitsProcessorList([LogProbOfGreedy()])
        with torch.inference_mode():
            out = tmodel.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                pad_token_id=0, eos_token_id=None, use_cache=True, **extra,
            )[:, prompts.shape[1]:].numpy()
        if logprobs and len(extra["logits_processor"][0].steps) != n:
            raise RuntimeError("the log-prob processor did not see every step")
        return out

    return fn


def tunix_generate_fn(cfg: Qwen2Config, prompts: np.ndarray, n: int, dtype=jnp.float32):
    """Tunix's sampler on a Tunix Qwen2 of the same shapes (random weights), greedy, in `dtype`."""
    from tunix.generate import sampler as tsampler
    from tunix.models.qwen2 import model as tmodel

    tcfg = tmodel.ModelConfig(
        num_layers=cfg.num_hidden_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
        hidden_dim=cfg.intermediate_size, num_heads=cfg.num_attention_heads, head_dim=cfg.head_dim,
        num_kv_heads=cfg.num_key_value_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps,
        use_tied_embedding=cfg.tie_word_embeddings, dtype=dtype, param_dtype=dtype,
    )
    model = tmodel.Qwen2(tcfg, rngs=nnx.Rngs(0))

    class _Tok:  # Tunix's sampler wants a tokenizer; prompts are passed as ids, so only ids matter
        def encode(self, s, **_):
            return [int(t) for t in s.split()]

        def decode(self, ids, **_):
            return " ".join(str(int(t)) for t in ids)

        def bos_id(self):
            return 0

        def eos_id(self):
            return -1

        def pad_id(self):
            return 0

    cache_cfg = tsampler.CacheConfig(cache_size=prompts.shape[1] + n, num_layers=cfg.num_hidden_layers,
                                     num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim)
    s = tsampler.Sampler(transformer=model, tokenizer=_Tok(), cache_config=cache_cfg)
    text = [" ".join(str(int(t)) for t in row) for row in prompts]

    def fn():
        out = s(text, max_generation_steps=n, temperature=0.0, echo=False, return_logits=False)
        return np.asarray([np.asarray(t)[-n:] for t in out.tokens])

    return fn


def bench_row(name, batch, args, model, peers: dict, before: bool, bw_gbs: float, bf16: bool = True):
    rng = np.random.default_rng(batch)
    prompts = rng.integers(0, 151643, (batch, args.prompt_len)).astype(np.int32)
    tokens = jnp.asarray(prompts)
    valid = jnp.ones_like(tokens, bool)
    n = args.new_tokens
    graphdef, state = nnx.split(model)

    def compiled(unroll: bool, matmul_dtype=None, logprobs: bool = True):
        """Our generate program, compiled with the decode layer loop unrolled or scanned."""
        # Same weights, another config (the graphdef holds the config).
        cfg = model.cfg.replace(decode_unroll=unroll, matmul_dtype=matmul_dtype or model.cfg.matmul_dtype)
        gd = nnx.split(nnx.eval_shape(lambda: Qwen2(cfg, nnx.Rngs(0))))[0]
        statics = (n, args.prompt_len + n, 0, True, False, (), 151643, None, logprobs)
        fn = jax.jit(lambda st, tk, vd, key: sampler.generate_impl(
            st, tk, vd, key, jnp.float32(1.0), jnp.float32(1.0), None, graphdef=gd, statics=statics))
        return fn.lower(state, tokens, valid, jax.random.key(0)).compile()

    def ours_fn(exe):
        def fn():
            out = exe(state, tokens, valid, jax.random.key(0))
            return np.asarray(jax.block_until_ready(out.tokens))

        return fn

    row = {"shape": name, "batch": batch, "prompt_len": args.prompt_len, "new_tokens": n}
    fns = {}
    t0 = time.perf_counter()
    fns["ours"] = ours_fn(compiled(True))
    # The public entry point must give the very same tokens as the program compiled here.
    public = np.asarray(sampler.generate(model, tokens, valid, jax.random.key(0), max_new_tokens=n, greedy=True,
                                         stop_ids=()).tokens)
    our_tokens = fns["ours"]()
    row["ours_first_call_s"] = round(time.perf_counter() - t0, 2)
    if not np.array_equal(public, our_tokens):
        raise RuntimeError("sampler.generate and the benchmarked program disagree")
    if bf16:
        t0 = time.perf_counter()
        fns["ours_bf16"] = ours_fn(compiled(True, "bfloat16"))
        row["ours_bf16_greedy_tokens_equal_frac"] = float(np.mean(fns["ours_bf16"]() == our_tokens))
        row["ours_bf16_first_call_s"] = round(time.perf_counter() - t0, 2)
    # Without the per-token log-prob (`generate(logprobs=False)`): what transformers' greedy
    # `generate` computes (tokens only), so these sides are the like-for-like comparison with it.
    fns["ours_nolp"] = ours_fn(compiled(True, logprobs=False))
    if not np.array_equal(fns["ours_nolp"](), our_tokens):
        raise RuntimeError("logprobs=False changed the greedy tokens")
    if bf16:
        fns["ours_bf16_nolp"] = ours_fn(compiled(True, "bfloat16", logprobs=False))
        if not np.array_equal(fns["ours_bf16_nolp"](), fns["ours_bf16"]()):
            raise RuntimeError("logprobs=False changed the bf16 greedy tokens")
    if before:
        fns["ours_scan"] = ours_fn(compiled(False))
        row["ours_scan_tokens_equal_frac"] = float(np.mean(fns["ours_scan"]() == our_tokens))
    for peer, make in peers.items():
        t0 = time.perf_counter()
        fns[peer] = make(prompts, n)
        peer_tokens = fns[peer]()
        row[f"{peer}_first_call_s"] = round(time.perf_counter() - t0, 2)
        if not peer.startswith("tunix"):  # tunix runs its own random weights: its tokens are not comparable
            row[f"{peer}_greedy_tokens_equal_frac"] = float(np.mean(peer_tokens == our_tokens))

    _time_interleaved(row, fns, args.repeats, batch * n)
    wb = weight_bytes(model)
    row["bandwidth_bound"] = {
        "weight_bytes": wb,
        "bandwidth_gbs": round(bw_gbs, 1),
        "decode_only_tok_s": round(batch / (wb / (bw_gbs * 1e9)), 1),
        "formula": "decode-only tok/s <= batch * bandwidth / weight_bytes (one step streams every weight)",
    }
    tg = targets_for(name)
    row["targets"] = {"min_ratio": tg,
                      "met": targets_met(row, tg, [o for o in OURS if o in fns], lambda o, p: p),
                      "met_like_for_like": targets_met(row, tg, [o for o in OURS if o in fns], same_work_peer)}
    return row


def _time_interleaved(row: dict, fns: dict, repeats: int, tokens: int) -> None:
    """Each side's seconds and tokens/s into `row`, the sides called in turn (every side sees the same
    machine load), and our sides' ratios over each peer."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    for k, ts in times.items():
        row[f"{k}_s"] = [round(t, 3) for t in ts]
        row[f"{k}_tok_s"] = round(tokens / statistics.median(ts), 1)
    for o in (o for o in OURS if o in fns):
        for k in fns:
            if k not in OURS:
                row[f"ratio_{o}_over_{k}"] = round(row[f"{o}_tok_s"] / row[f"{k}_tok_s"], 2)
    # Backwards-compatible names (the README renderer and older readers).
    if "torch_tok_s" in row:
        row["greedy_tokens_equal_frac"] = row["torch_greedy_tokens_equal_frac"]


def same_work_peer(ours: str, peer: str):
    """The side of `peer` that does the work `ours` does: log-probs or tokens only (None: not measured)."""
    if ours.endswith("_nolp"):
        return None if peer.endswith("_lp") else peer
    if peer.endswith("_lp"):
        return peer
    return f"{peer}_lp" if f"{peer}_lp" in PEER_NAMES else None


def targets_met(row: dict, tg: dict, ours_sides, peer_of) -> dict:
    """For each of our sides and each target, whether this run met it (None: the peer was not
    measured). `peer_of(ours, peer)` names the peer side to compare with; "best_peer" takes the
    fastest of the measured sides it allows."""
    met = {}
    for o in ours_sides:
        met[o] = {}
        for peer, ratio in tg.items():
            names = PEER_NAMES if peer == "best_peer" else (peer,)
            sides = {peer_of(o, p) for p in names} - {None}
            speeds = [row[f"{p}_tok_s"] for p in sides if f"{p}_tok_s" in row]
            met[o][peer] = bool(row[f"{o}_tok_s"] >= ratio * max(speeds)) if speeds else None
    return met


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", action="append", help="SHAPE:B1,B2,... (repeatable); default: " + " ".join(DEFAULT_ROWS))
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--before", action="store_true", help="also time the previous decode path (layer scan)")
    p.add_argument("--no-bf16", action="store_true", help="skip ours_bf16 (bf16 matmuls)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-tunix", action="store_true")
    p.add_argument("--peers", default=",".join(PEER_NAMES),
                   help="comma-separated subset of " + ",".join(PEER_NAMES) + " (e.g. the target peers only: "
                        "torch_bf16,tunix)")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="skip the bandwidth measurement")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    try:
        rows = parse_rows(args.rows or DEFAULT_ROWS)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    have_torch = False
    if not args.no_torch:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401

            have_torch = True
        except ImportError:
            print("torch/transformers not importable: PyTorch peers skipped", file=sys.stderr)
    have_tunix = not args.no_tunix and _tunix_version() is not None
    if not args.no_tunix and not have_tunix:
        print("tunix not importable: Tunix peer skipped (bench/README.md has the recipe)", file=sys.stderr)

    wanted = {x.strip() for x in args.peers.split(",") if x.strip()}
    if wanted - set(PEER_NAMES):
        print(f"error: unknown peer(s) {sorted(wanted - set(PEER_NAMES))} in --peers; valid: {', '.join(PEER_NAMES)}",
              file=sys.stderr)
        return 2
    bw = args.bandwidth_gbs or measure_bandwidth_gbs()
    result = {"machine": machine(), "settings": {**vars(args), "bandwidth_gbs": round(bw, 1)}, "rows": []}
    for name in dict.fromkeys(n for n, _ in rows):
        cfg = Qwen2Config.from_preset(name)
        model = Qwen2(cfg, nnx.Rngs(0))
        peers = {}
        if have_torch and wanted & {"torch", "torch_bf16", "torch_lp", "torch_bf16_lp"}:
            tm32, tm16 = torch_model(model), torch_model(model, "bfloat16")
            peers["torch"] = lambda pr, n, m=tm32: torch_generate_fn(m, pr, n)
            peers["torch_bf16"] = lambda pr, n, m=tm16: torch_generate_fn(m, pr, n)
            peers["torch_lp"] = lambda pr, n, m=tm32: torch_generate_fn(m, pr, n, logprobs=True)
            peers["torch_bf16_lp"] = lambda pr, n, m=tm16: torch_generate_fn(m, pr, n, logprobs=True)
        if have_tunix and "tunix" in wanted:
            peers["tunix"] = lambda pr, n, c=cfg: tunix_generate_fn(c, pr, n)
        if have_tunix and "tunix_bf16" in wanted:
            peers["tunix_bf16"] = lambda pr, n, c=cfg: tunix_generate_fn(c, pr, n, jnp.bfloat16)
        peers = {k: f for k, f in peers.items() if k in wanted}
        for shape, batch in rows:
            if shape != name:
                continue
            row = bench_row(name, batch, args, model, peers, args.before, bw, bf16=not args.no_bf16)
            result["rows"].append(row)
            line = f"{name:>14} b{batch:<3} ours {row['ours_tok_s']:8.1f} tok/s"
            for o in OURS[1:]:
                if f"{o}_tok_s" in row:
                    line += f", {o} {row[f'{o}_tok_s']:.1f}"
            for k in ("ours_scan", *PEER_NAMES):
                if f"{k}_tok_s" in row:
                    line += f" | {k} {row[f'{k}_tok_s']:.1f} ({row[f'ratio_ours_over_{k}']:.2f}x"
                    for o in OURS[1:]:
                        if f"ratio_{o}_over_{k}" in row:
                            line += f" / {row[f'ratio_{o}_over_{k}']:.2f}x"
                    line += ")"
            line += f" | decode bound {row['bandwidth_bound']['decode_only_tok_s']:.0f} | targets {row['targets']['met']}"
            print(line, flush=True)
            write_result(result, args.out)  # after every row: a long run that is cut short keeps its rows
        del model, peers
    write_result(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
