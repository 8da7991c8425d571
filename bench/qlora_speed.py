"""SmolLM2-135M-Instruct's sampling speed on this CPU with a quantized base against float32, side by side.

The workload is the Bandit stage's rollout decode (configs/smollm2_bandit.py: 8 groups x 8 = 64 rows,
up to 32 sampled tokens, float32 compute and cache): `sampler.generate` on 64 chat prompts (the 20 of
bench/qlora_greedy.py, cycled), temperature 1, no stop ids (every row samples all its tokens: the same
work for every base). Bases: float32 (the model as every float run loads it), int8 (Q8_0 codes)
and nf4; each program is compiled first (its XLA `memory_analysis` recorded), then the calls are
interleaved base by base, `--repeats` rounds, median per base (the machine is shared: only ratios within
one run mean something).

Where the dequantization goes: the compiled program's optimized HLO is searched for the fused
computations that convert integer codes to a float32 array and return it (`dequant_fusions`): every
such result is a buffer XLA:CPU writes to memory before a dot reads it (no dot of these programs takes
integer operands). Reported: their count and float32 bytes, and those executed on every sampled token
(inside the token loop), against the bytes of codes the step reads.

Usage: python -m bench.qlora_speed [--repeats 5] [--new-tokens 32] [--out bench/results/qlora_speed.json]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import machine, write_result
from bench.qlora_greedy import PROMPTS, load_or_exit

RESULTS = Path(__file__).resolve().parent / "results" / "qlora_speed.json"
BASES = ("float32", "int8", "nf4")
ROWS = 64  # 8 groups x 8 (configs/smollm2_bandit.py)
_SHAPE = re.compile(r"^\s*(?:ROOT\s+)?(%?[\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\]")


def prompts(tokenizer, rows: int):
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                         add_generation_prompt=True, tokenize=True) for i in range(rows)]
    ids = [list(x["input_ids"]) if hasattr(x, "keys") else list(x) for x in ids]
    width = max(len(x) for x in ids)
    tokens, valid = np.zeros((rows, width), np.int32), np.zeros((rows, width), bool)
    for i, x in enumerate(ids):
        tokens[i, width - len(x):], valid[i, width - len(x):] = x, True
    return tokens, valid


def dequant_fusions(hlo: str) -> dict:
    """The fused computations of the optimized HLO that turn integer codes (s8/u8) into a float32 array
    of two or more dimensions and return it: each result is a buffer written to memory (no dot of these
    programs takes integer operands, so XLA:CPU fuses the conversion into none). Returns their count and
    float32 bytes (one execution each); the float32 bytes written per sampled token: those reached from
    the body of the sampler's token loop (the while loop without a known trip count), a nested layer
    scan's counted once per layer; and those written once per call outside every loop (hoisted out of
    the loops: these buffers are the dequantized weights, alive while the program runs)."""
    comps, order, cur = {}, [], None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY\s+)?%([\w.\-]+)\s*\(.*\)\s*->.*{\s*$", line)
        if head:
            cur = head.group(1)
            comps[cur] = []
            order.append(cur)
        elif cur is not None and line.strip() != "}":
            comps[cur].append(line)
    dequant = {}  # computation -> f32 bytes of its root, for the dequantizing ones
    for name, lines in comps.items():
        types, has_int, root = {}, False, None
        for line in lines:
            m = _SHAPE.match(line)
            if not m:
                continue
            types[m.group(1).lstrip("%")] = m.group(2)
            if " convert(" in line:
                operand = re.search(r"convert\(\s*%?([\w.\-]+)", line).group(1)
                has_int |= types.get(operand) in ("s8", "u8")
            if line.lstrip().startswith("ROOT"):
                root = (m.group(2), [int(x) for x in m.group(3).split(",") if x])
        if has_int and root and root[0] == "f32" and len(root[1]) >= 2:
            dequant[name] = 4 * int(np.prod(root[1]))

    def reached(name, seen=(), loops=True):
        """f32 bytes of dequantizing fusions executed per run of computation `name` (`loops`: counting
        the bodies of the while loops it runs, a known trip count's times; else outside them only)."""
        total = 0
        for line in comps.get(name, []):
            is_while = " while(" in line
            if is_while and not loops:
                continue
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            for callee in re.findall(r"(?:calls|to_apply|body)=%([\w.\-]+)", line):
                if callee in seen:
                    continue
                times = int(trips.group(1)) if trips and is_while else 1
                total += (dequant.get(callee, 0) + reached(callee, seen + (callee,), loops)) * times
        return total

    per_token = 0
    for lines in comps.values():
        for line in lines:
            if " while(" in line and "known_trip_count" not in line:
                body = re.search(r"body=%([\w.\-]+)", line).group(1)
                per_token = max(per_token, reached(body, (body,)))
    entry = next((n for n in order if n.startswith("main")), order[-1] if order else None)
    return {"fusions": len(dequant), "f32_bytes": int(sum(dequant.values())), "per_token_f32_bytes": int(per_token),
            "once_per_call_f32_bytes": int(reached(entry, (entry,), loops=False)) if entry else 0}


def main(argv=None) -> int:
    from ragen_jax.models import from_pretrained
    from ragen_jax.models import gguf as conv
    from ragen_jax.models.quant import quantize_base
    from ragen_jax.rollout import sampler

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=conv.SMOLLM2_135M_INSTRUCT)
    p.add_argument("--bases", default=",".join(BASES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    loaded = load_or_exit(args.model)
    if loaded is None:
        return 2
    _, tok, hf_dir, _ = loaded
    tokens, valid = prompts(tok, ROWS)
    bases = [b for b in args.bases.split(",") if b]
    fns, runs = {}, {}
    result = {"machine": machine(), "settings": {"model": args.model, "rows": ROWS, "prompt_len": int(tokens.shape[1]),
                                                 "new_tokens": args.new_tokens, "repeats": args.repeats,
                                                 "dtype": "float32", "cache_dtype": "float32", "temperature": 1.0},
              "rows": []}
    for base in bases:
        m = from_pretrained(hf_dir, dtype="float32")
        if base != "float32":
            quantize_base(m, base)
        weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(m)))
        call = lambda k, m=m: sampler.generate(m, tokens, valid, k, max_new_tokens=args.new_tokens, stop_ids=(),  # noqa: E731
                                               tokenizer=tok, cache_dtype=jnp.float32)
        # The program generate() runs, compiled ahead of time for its memory analysis and HLO.
        graphdef, state = nnx.split(m)
        statics = (args.new_tokens, tokens.shape[1] + args.new_tokens, 0, False, False, (), 2, "float32", True)
        jitted = jax.jit(lambda s, t, v, k, temp, tp: sampler.generate_impl(s, t, v, k, temp, tp, None,
                                                                             graphdef=graphdef, statics=statics))
        t0 = time.perf_counter()
        compiled = jitted.lower(state, tokens, valid, jax.random.key(0), jnp.float32(1), jnp.float32(1)).compile()
        compile_s = time.perf_counter() - t0
        mem = compiled.memory_analysis()
        hlo = compiled.as_text()
        dq = dequant_fusions(hlo)
        t0 = time.perf_counter()
        jax.block_until_ready(call(jax.random.key(0)).tokens)  # warm-up: generate's own compile
        warm_s = time.perf_counter() - t0
        fns[base], runs[base] = call, []
        result["rows"].append({"base": base, "weight_bytes": int(weight_bytes), "compile_s": round(compile_s, 1),
                               "warmup_call_s": round(warm_s, 1),
                               "memory_analysis": {"argument_bytes": int(mem.argument_size_in_bytes),
                                                   "output_bytes": int(mem.output_size_in_bytes),
                                                   "temp_bytes": int(mem.temp_size_in_bytes)},
                               **dq})
        print(f"{base}: weights {weight_bytes / 2**20:.1f} MiB, temporaries {mem.temp_size_in_bytes / 2**20:.1f} MiB, "
              f"{dq['fusions']} dequantizing fusions ({dq['f32_bytes'] / 2**20:.1f} MiB float32), "
              f"{dq['per_token_f32_bytes'] / 2**20:.1f} MiB of float32 kernels written per sampled token, "
              f"{dq['once_per_call_f32_bytes'] / 2**20:.1f} MiB once per call (hoisted)", flush=True)
    for r in range(args.repeats):
        for base in bases:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[base](jax.random.key(r + 1)).tokens)
            runs[base].append(time.perf_counter() - t0)
    ref = statistics.median(runs[bases[0]])
    for row in result["rows"]:
        s = statistics.median(runs[row["base"]])
        row.update({"call_s": [round(x, 3) for x in runs[row["base"]]], "median_s": round(s, 3),
                    "tok_s": round(ROWS * args.new_tokens / s, 1), f"ratio_over_{bases[0]}": round(ref / s, 3)})
        print(f"{row['base']}: median {s:.3f} s, {row['tok_s']:.0f} tok/s, {ref / s:.2f}x {bases[0]}", flush=True)
    write_result(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
