"""Decode throughput of `ragen_jax.rollout.sampler.generate` next to transformers' PyTorch `generate`.

Random weights, a prompt of `--prompt-len` ids, `--new-tokens` new tokens, greedy, no stop token
(every row generates all tokens), float32. Tokens/s = batch * new_tokens / wall time of one full
call (prefill included), median of `--repeats` after one warm-up call (which includes compilation,
timed separately). When torch is importable, the SAME weights (our `hf_state_dict`) are loaded into
`transformers.Qwen2ForCausalLM` and run with the same prompts, interleaved with ours so that both
see the same machine load; the greedy tokens of both are compared as a sanity check.

Usage: python -m bench.sampler [--rows tiny:1,16,64 --rows qwen2.5-0.5b:1,16] [--repeats 3]
       [--no-torch] [--out bench/results/sampler.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench._common import machine as common_machine  # noqa: E402
from bench._common import write_result  # noqa: E402
from ragen_jax.rollout import sampler
from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.models.qwen2.weights import hf_state_dict

RESULTS = Path(__file__).resolve().parent / "results" / "sampler.json"
DEFAULT_ROWS = ("tiny:1,16,64", "qwen2.5-0.5b:1,16")

# architecture.md, "Speed of peers on a machine like ours (2-core CPU)": tokens/s, f32 unless noted.
PEERS = {
    ("tiny", 64): {"tunix": 765, "torch": 1374},
    ("qwen2.5-0.5b", 16): {"tunix": 40.6, "torch": 36.4, "torch_bf16": 76.0},
    ("qwen2.5-0.5b", 1): {"tunix": 10.6, "torch": 6.0, "torch_bf16": 12.6},
}


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
    return info


def time_call(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def torch_model(model):
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
    return tm.eval()


def bench_row(name, batch, args, model, tmodel):
    rng = np.random.default_rng(batch)
    prompts = rng.integers(0, 151643, (batch, args.prompt_len)).astype(np.int32)
    tokens = jnp.asarray(prompts)
    valid = jnp.ones_like(tokens, bool)
    n = args.new_tokens

    def ours():
        out = sampler.generate(model, tokens, valid, jax.random.key(0), max_new_tokens=n, greedy=True, stop_ids=())
        return np.asarray(jax.block_until_ready(out.tokens))

    row = {"shape": name, "batch": batch, "prompt_len": args.prompt_len, "new_tokens": n}
    t0 = time.perf_counter()
    our_tokens = ours()
    row["ours_first_call_s"] = round(time.perf_counter() - t0, 2)

    torch_fn = None
    if tmodel is not None:
        import torch

        ids = torch.from_numpy(prompts.astype(np.int64))
        mask = torch.ones_like(ids)

        def torch_fn():
            with torch.inference_mode():
                return tmodel.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                    pad_token_id=0, eos_token_id=None, use_cache=True,
                )[:, args.prompt_len :].numpy()

        t0 = time.perf_counter()
        torch_tokens = torch_fn()
        row["torch_first_call_s"] = round(time.perf_counter() - t0, 2)
        row["greedy_tokens_equal_frac"] = float(np.mean(torch_tokens == our_tokens))

    ours_t, torch_t = [], []
    for _ in range(args.repeats):  # interleaved: both sides see the same machine load
        ours_t += time_call(ours, 1)
        if torch_fn is not None:
            torch_t += time_call(torch_fn, 1)
    row["ours_s"] = [round(t, 3) for t in ours_t]
    row["ours_tok_s"] = round(batch * n / statistics.median(ours_t), 1)
    if torch_t:
        row["torch_s"] = [round(t, 3) for t in torch_t]
        row["torch_tok_s"] = round(batch * n / statistics.median(torch_t), 1)
        row["ratio_ours_over_torch"] = round(row["ours_tok_s"] / row["torch_tok_s"], 2)
    peers = PEERS.get((name, batch))
    if peers:
        row["peers_2core_tok_s"] = peers
        # The target is 1.5x the best float32 peer (PyTorch bf16 is listed for context only).
        row["target_tok_s"] = round(1.5 * max(v for k, v in peers.items() if not k.endswith("bf16")), 1)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", action="append", help="SHAPE:B1,B2,... (repeatable); default: " + " ".join(DEFAULT_ROWS))
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-torch", action="store_true")
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
            print("torch not importable: PyTorch baseline skipped", file=sys.stderr)

    result = {"machine": machine(), "settings": vars(args), "rows": []}
    for name in dict.fromkeys(n for n, _ in rows):
        model = Qwen2(Qwen2Config.from_preset(name), nnx.Rngs(0))
        tmodel = torch_model(model) if have_torch else None
        for shape, batch in rows:
            if shape != name:
                continue
            row = bench_row(name, batch, args, model, tmodel)
            result["rows"].append(row)
            line = f"{name:>14} b{batch:<3} ours {row['ours_tok_s']:8.1f} tok/s"
            if "torch_tok_s" in row:
                line += f"  torch {row['torch_tok_s']:8.1f} tok/s  ratio {row['ratio_ours_over_torch']:.2f}"
                line += f"  (greedy tokens equal: {row['greedy_tokens_equal_frac']:.2f})"
            if "target_tok_s" in row:
                line += f"  target {row['target_tok_s']}"
            print(line, flush=True)
            write_result(result, args.out)  # after every row: a long run that is cut short keeps its rows
        del model, tmodel
    write_result(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
