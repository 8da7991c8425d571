"""Peak device memory of the compiled rollout, prepare and update programs of a config, per device.

Each row builds the three programs of one training iteration exactly as the RL Trainer does
(`trainer/memory.py aot_compile`: the same jitted functions, shardings and donation) from ABSTRACT parameters
(`nnx.eval_shape` + the mesh's `param_shardings`: nothing is allocated), compiles them for the local
backend and reads XLA's `memory_analysis`. Per program and per device:

    program peak = arguments + outputs - aliased (donated) + temporaries
    total        = program peak + resident: train state (and the trajectories during the update) that
                   stays on the device while the program runs without being one of its arguments

`total` is what the Trainer's fail-before-running check compares with the device's memory; the
targets of issue 12 are checked against it. The reference settings are configs/sokoban.py (P=8 x N=16,
5 turns x 400 tokens, context 3,600, mini-batch 32, bf16 compute, float32 parameters and AdamW) with
a random-init preset. Multi-device rows run on simulated CPU devices (8 are created when this
script starts jax). Two setting sets:
  before: today's settings before issue 12: xla attention, no remat, no micro-batches, no donation.
  after:  attention auto (chunked on CPU for long rows), remat on, micro-batches of 8 rows, the update
          donating the train state; after-mb4 / after-mb2: the same with micro-batches of 4 / 2 rows;
          after-mbM-passG: micro-batches of M rows and the rollout generating G of the 8 groups at a time
          (`rollout.groups_per_pass`).

Usage: python -m bench.memory [--rows 0.5b-ppo,3b-grpo] [--settings before,after] [--force] [--list]
       [--out bench/results/memory.json]
Rows already in the output file are kept and skipped (resumable) unless --force; every finished
row is written at once. Compiling the 3B/7B programs on a small CPU takes minutes per row.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # The multi-device rows need 8 devices; must be set before jax is imported.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from bench.common import machine, write_result  # noqa: E402
from ragen_jax.trainer.export import abstract_programs  # noqa: E402  (the Trainer's programs, abstract)

RESULTS = Path(__file__).resolve().parent / "results" / "memory.json"
GIB = 2**30

# name: (preset, estimator, mesh.fsdp, target GiB per device of the largest program or None, LoRA rank
# [, model.base_quant]). The LoRA rows (issue 17) train rank-64 adapters on all seven projections over
# a bfloat16 frozen base (`model.param_dtype=bfloat16`): AdamW holds state only for the adapters (and
# the critic's value head), so what remains is the base, the rollout's KV cache and the activations.
# The QLoRA rows (issue 57) store that base's projections in 4 bits (nf4, blocks of 64, bf16 scales):
# 7B GRPO on one 24 GB GPU, 3B PPO with its critic in 14 GiB. Written to their own file:
#     python -m bench.memory --rows 7b-grpo-qlora,3b-ppo-qlora --settings after-mb1-pass1 \
#         --out bench/results/memory_qlora.json
ROWS = {
    "0.5b-ppo": ("qwen2.5-0.5b", "gae", 1, 20, 0),
    "1.5b-ppo": ("qwen2.5-1.5b", "gae", 1, None, 0),
    "3b-ppo": ("qwen2.5-3b", "gae", 1, None, 0),
    "3b-grpo": ("qwen2.5-3b", "grpo", 1, 70, 0),
    "3b-ppo-fsdp4": ("qwen2.5-3b", "gae", 4, 40, 0),
    "7b-grpo-fsdp8": ("qwen2.5-7b", "grpo", 8, 40, 0),
    "3b-ppo-lora": ("qwen2.5-3b", "gae", 1, 24, 64),
    "7b-grpo-lora": ("qwen2.5-7b", "grpo", 1, 40, 64),
    "0.5b-ppo-lora": ("qwen2.5-0.5b", "gae", 1, None, 64),
    "7b-grpo-qlora": ("qwen2.5-7b", "grpo", 1, 22, 64, "nf4"),
    "3b-ppo-qlora": ("qwen2.5-3b", "gae", 1, 14, 64, "nf4"),
    "0.5b-ppo-qlora": ("qwen2.5-0.5b", "gae", 1, None, 64, "nf4"),
    # The same with an int8 base (Q8_0 codes, blocks of 32) and, to confirm that it needs what nf4 needs (the
    # same array shapes and dtypes), an int4 one: the smallest-card table of docs/memory.md.
    #     python -m bench.memory --rows 7b-grpo-qlora-int8,7b-grpo-qlora-int4 --settings after-mb1-pass1 \
    #         --out bench/results/memory_qlora.json   (and 3b-ppo-qlora-int8 at after-mb2-pass2,
    #         0.5b-ppo-qlora-int8 at after-mb4-pass2, 7b-grpo-qlora-int8 at after-mb2-pass2)
    "7b-grpo-qlora-int8": ("qwen2.5-7b", "grpo", 1, None, 64, "int8"),
    "7b-grpo-qlora-int4": ("qwen2.5-7b", "grpo", 1, None, 64, "int4"),
    "3b-ppo-qlora-int8": ("qwen2.5-3b", "gae", 1, None, 64, "int8"),
    "0.5b-ppo-qlora-int8": ("qwen2.5-0.5b", "gae", 1, None, 64, "int8"),
}
SETTINGS = {
    "before": dict(attention="xla", remat=False, micro_batch_size=0, donate=False),
    # micro_batch_size: rows per forward/backward over the whole mesh (a multiple of its devices).
    "after": dict(attention="auto", remat=True, micro_batch_size=8, donate=True),
    "after-mb4": dict(attention="auto", remat=True, micro_batch_size=4, donate=True),
    "after-mb2": dict(attention="auto", remat=True, micro_batch_size=2, donate=True),
    # ... and the rollout in passes of 2 groups (`rollout.groups_per_pass`): a quarter of the KV cache.
    "after-mb4-pass2": dict(attention="auto", remat=True, micro_batch_size=4, donate=True, groups_per_pass=2),
    "after-mb2-pass2": dict(attention="auto", remat=True, micro_batch_size=2, donate=True, groups_per_pass=2),
    "after-mb1-pass2": dict(attention="auto", remat=True, micro_batch_size=1, donate=True, groups_per_pass=2),
    "after-mb1-pass1": dict(attention="auto", remat=True, micro_batch_size=1, donate=True, groups_per_pass=1),
    # ... with the rollout's KV cache in int8 (`rollout.kv_cache_quant=int8`: codes + one scale per token
    # and kv head), against the same setting without:
    "after-mb1-pass1-kv8": dict(attention="auto", remat=True, micro_batch_size=1, donate=True, groups_per_pass=1,
                                kv_cache_quant="int8"),
    "after-mb2-pass2-kv8": dict(attention="auto", remat=True, micro_batch_size=2, donate=True, groups_per_pass=2,
                                kv_cache_quant="int8"),
}


def row_config(name: str, setting: str):
    from ragen_jax.experiment.config import load_config

    preset, estimator, fsdp, _, lora_rank, base_quant = row_spec(name)
    s = SETTINGS[setting]
    over = ["model.random_init=true", f"model.preset={preset}", f"model.attention={s['attention']}",
            f"model.remat={str(s['remat']).lower()}", f"batching.micro_batch_size={s['micro_batch_size']}",
            "mesh.data=1", f"mesh.fsdp={fsdp}", "mesh.tensor=1", f"rollout.groups_per_pass={s.get('groups_per_pass', 0)}"]
    if s.get("kv_cache_quant"):
        over.append(f"rollout.kv_cache_quant={s['kv_cache_quant']}")
    if estimator == "grpo":
        over += ["advantage.estimator=grpo", "advantage.reward_norm=mean_std", "model.critic=none"]
    if lora_rank:
        over += [f"model.lora_rank={lora_rank}", f"model.lora_alpha={lora_rank}", "model.param_dtype=bfloat16",
                 f"model.base_quant={base_quant}"]
    return load_config("sokoban.py", over)


def row_spec(name: str) -> tuple:
    """ROWS[name] with its base_quant ("none" where the row names none)."""
    spec = ROWS[name]
    return spec if len(spec) == 6 else (*spec, "none")


def measure(name: str, setting: str) -> dict:
    from ragen_jax.trainer.memory import aot_compile
    from ragen_jax.trainer.step import effective_micro_batch

    cfg = row_config(name, setting)
    s = SETTINGS[setting]
    rollout, prepare, update, state, frozen, mesh = abstract_programs(cfg, s["donate"])
    rep = NamedSharding(mesh, PartitionSpec())
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep)
    seeds = jax.ShapeDtypeStruct((cfg.rollout.num_groups,), jnp.int32, sharding=rep)
    ref = None  # kl_coef is 0 in the reference config: no reference policy
    t0 = time.perf_counter()
    _, usage = aot_compile(rollout, prepare, update, state, ref, key, seeds, frozen=frozen)
    compile_s = time.perf_counter() - t0
    preset, estimator, fsdp, target, lora_rank, base_quant = row_spec(name)
    a, r, p = cfg.batching, cfg.rollout, cfg.prompt
    programs = {}
    for prog, (mem, resident) in usage.items():
        programs[prog] = {**mem, "resident_bytes": resident, "total_bytes": mem["peak_bytes"] + resident,
                          "peak_gib": round(mem["peak_bytes"] / GIB, 2),
                          "total_gib": round((mem["peak_bytes"] + resident) / GIB, 2)}
    worst = max(v["total_gib"] for v in programs.values())
    return {
        "row": name, "setting": setting, "preset": preset, "estimator": estimator,
        "critic": cfg.model.critic if estimator == "gae" else "none",
        "mesh": {"data": 1, "fsdp": fsdp, "tensor": 1}, "devices": int(mesh.devices.size),
        "settings": {"attention": cfg.model.attention, "remat": cfg.model.use_remat,
                     "remat_policy": cfg.model.remat_policy,
                     "micro_batch_size": effective_micro_batch(a.mini_batch_size, a.micro_batch_size),
                     "mini_batch_size": a.mini_batch_size, "donate": s["donate"], "dtype": cfg.model.dtype,
                     "param_dtype": cfg.model.param_dtype, "cache_dtype": r.cache_dtype,
                     "kv_cache_quant": r.kv_cache_quant,
                     "lora_rank": lora_rank, "lora_alpha": cfg.model.lora_alpha if lora_rank else None,
                     "base_quant": base_quant,
                     "rollout": f"P={r.num_groups} x N={r.group_size}", "groups_per_pass": r.groups_per_pass,
                     "turns": f"{p.max_turns} x {p.max_response_tokens} tokens", "max_context": r.max_context},
        "programs": programs,
        "max_total_gib": worst,
        "target_gib": target,
        "meets_target": None if target is None else bool(worst <= target),
        "compile_s": round(compile_s, 1),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows: {', '.join(ROWS)}")
    p.add_argument("--settings", default="before,after", help=f"comma-separated: {', '.join(SETTINGS)}")
    p.add_argument("--force", action="store_true", help="re-measure rows already in the output file")
    p.add_argument("--list", action="store_true", help="print the rows and settings and exit")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    rows = [x for x in args.rows.split(",") if x]
    settings = [x for x in args.settings.split(",") if x]
    bad = [x for x in rows if x not in ROWS] + [x for x in settings if x not in SETTINGS]
    if bad:
        print(f"error: unknown row or setting {bad[0]!r}; rows: {', '.join(ROWS)}; settings: "
              f"{', '.join(SETTINGS)}", file=sys.stderr)
        return 2
    if args.list:
        for name, spec in ROWS.items():
            print(name, spec)
        for name, s in SETTINGS.items():
            print(name, s)
        return 0
    out = Path(args.out)
    result = {"machine": machine(), "formula": "total = arguments + outputs - aliased + temporaries (per device, "
              "XLA memory_analysis) + resident train state not among the program's arguments", "rows": []}
    if out.exists():
        old = json.loads(out.read_text())
        result["rows"] = old.get("rows", [])
    for name in rows:
        for setting in settings:
            done = [r for r in result["rows"] if r["row"] == name and r["setting"] == setting]
            if done and not args.force:
                print(f"{name} [{setting}]: in {out}, skipped (--force re-measures)", flush=True)
                continue
            row = measure(name, setting)
            result["rows"] = [r for r in result["rows"] if not (r["row"] == name and r["setting"] == setting)]
            result["rows"].append(row)
            result["machine"] = {**machine(), "loadavg_start": result["machine"]["loadavg_start"]}
            write_result(result, out)
            progs = ", ".join(f"{k} {v['total_gib']:.2f} GiB (program {v['peak_gib']:.2f})"
                              for k, v in row["programs"].items())
            tgt = "" if row["target_gib"] is None else (f" target <= {row['target_gib']} GiB: "
                                                        f"{'met' if row['meets_target'] else 'MISSED'}")
            print(f"{name} [{setting}] {row['devices']} device(s): {progs}; compile {row['compile_s']:.0f} s{tgt}",
                  flush=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
