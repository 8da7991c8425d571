"""Throughput of one PPO step (`StepPrograms.prepare` + `update`) next to the same step in PyTorch.

A synthetic rollout batch of K trajectories of T tokens (random ids, ragged lengths in [T/2, T],
a realistic multi-turn loss mask: a ~T/5 prompt prefix, then turns of env text (not trained) followed
by sampled answers (trained), random rewards) goes through our two compiled programs: `prepare`
(StarPO-S filter with ratio 1 so all K rows are kept, the no-grad old-log-prob pass, GRPO advantages)
and `update` (one optimizer step over a mini-batch of K rows: PPO clip-higher + dual clip, entropy
bonus, AdamW with global-norm clipping). Actor only (no critic, no KL reference): the PyTorch side
does the same work: a no-grad forward for old log-probs, then forward + backward of the same clipped
loss with the same mask, clip_grad_norm_ and an AdamW step, on `transformers.Qwen2ForCausalLM` loaded
from OUR weights (`save_pretrained` -> `from_pretrained` in a temp dir). Both sides compute
per-token log-probs without holding the whole [K, T, V] f32 logits at once (ours: time chunks;
PyTorch: row micro-batches with gradient accumulation), float32.

`--lora-rank R`: each shape is also run with LoRA adapters of rank R on all seven projections
(`model.lora_rank`: the train state and AdamW hold only the adapters, the frozen base is a
non-donated argument of both programs, as in the Trainer) and the row records `lora_rank` and
`ratio_lora_over_full`, the LoRA row's tokens/s over the full row's of the same run (same batch).

Update tokens/s = K * T / (prepare + update seconds), median of `--repeats` after one warm-up call
(its extra time = compile time). Model FLOPs per token (PaLM convention, causal masking not
discounted): fwd+bwd 6 * N + 12 * L * T * d_attn, the no-grad pass 2 * N + 4 * L * T * d_attn, with N the
matmul parameters (the embedding counted once, as the head). MFU = achieved FLOP/s / `--peak-tflops`.

Usage: python -m bench.train_step [--shapes tiny,qwen2.5-0.5b] [--rows 32 --seq-len 2048] [--quick]
       [--big-rows 2 --big-seq-len 128] [--repeats 3] [--no-torch] [--peak-tflops 989] [--micro-batch N]
       [--lora-rank 64] [--before-after [--device-gib 24]]
       [--out bench/results/train_step.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.common import machine, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "train_step.json"
ENTROPY_COEF = 0.001
EPS_LOW, EPS_HIGH, DUAL_CLIP = 0.2, 0.28, 3.0


def _presets():
    from ragen_jax.models import PRESETS

    return tuple(PRESETS)


def synthetic_batch(k: int, t: int, vocab: int, turns: int = 5, seed: int = 0):
    """Trajectories of K rows x T tokens with a multi-turn loss mask (group size 2)."""
    from ragen_jax.rollout import Trajectories

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, min(vocab, 151643), (k, t)).astype(np.int32)
    length = rng.integers(t // 2, t + 1, k).astype(np.int32)
    length[0] = t  # at least one full row: the padded width is used
    mask = np.zeros((k, t), bool)
    turn_end = np.full((k, turns), -1, np.int32)
    for r in range(k):
        pos = max(1, length[r] // 5)  # system + first user message
        span = (length[r] - pos) // turns
        for j in range(turns):
            env_text = max(1, span // 3)  # the turn's observation, then the sampled answer
            a, b = pos + env_text, min(pos + span, length[r])
            if b > a:
                mask[r, a:b] = True
                turn_end[r, j] = b - 1
            pos += span
    reward = rng.normal(size=k).astype(np.float32)
    zeros_i = np.zeros(k, np.int32)
    return Trajectories(
        tokens=jnp.asarray(tokens), length=jnp.asarray(length), loss_mask=jnp.asarray(mask),
        logprobs=jnp.zeros((k, t), jnp.float32), turn_end=jnp.asarray(turn_end),
        turn_reward=jnp.zeros((k, turns), jnp.float32), reward=jnp.asarray(reward),
        group=jnp.asarray(np.arange(k) // 2, jnp.int32), seed=jnp.asarray(zeros_i),
        success=jnp.zeros(k, bool), action_is_valid=jnp.ones(k, bool), num_actions=jnp.asarray(zeros_i),
        num_effective=jnp.asarray(zeros_i), num_turns=jnp.full(k, turns, jnp.int32),
        num_format_errors=jnp.asarray(zeros_i), response_length=jnp.asarray(mask.sum(1).astype(np.int32)),
        truncated=jnp.zeros(k, bool))


def model_flops_per_token(cfg, t: int) -> dict:
    d, f, l, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    d_kv = cfg.num_key_value_heads * cfg.head_dim
    d_attn = cfg.num_attention_heads * cfg.head_dim
    per_layer = d * d_attn + 2 * d * d_kv + d_attn * d + 3 * d * f
    n = l * per_layer + v * d  # matmul parameters; the (tied or untied) head counted once
    attn = l * t * d_attn
    return {"matmul_params": n, "fwd_bwd": 6 * n + 12 * attn, "fwd": 2 * n + 4 * attn,
            "step": 8 * n + 16 * attn}


def build_programs(model, k: int, mini_batch: int, micro_batch: int = 0, lora_rank: int = 0):
    from ragen_jax.models.lora import LoRAParam, add_lora
    from ragen_jax.experiment.config import Config
    from ragen_jax.trainer.optim import make_optimizer
    from ragen_jax.trainer.step import StepPrograms, StepSettings, TrainState

    if k % 2 or k % mini_batch:
        raise ValueError(f"--rows {k} must be even and divisible by the mini-batch size {mini_batch}")
    cfg = Config()
    cfg.model.random_init = True
    cfg.rollout.num_groups, cfg.rollout.group_size = k // 2, 2
    cfg.advantage.estimator, cfg.filter.value = "grpo", 1.0
    cfg.batching.mini_batch_size, cfg.batching.ppo_epochs, cfg.batching.micro_batch_size = mini_batch, 1, micro_batch
    lo = cfg.loss
    lo.eps_low, lo.eps_high, lo.dual_clip, lo.entropy_coef, lo.kl_coef = EPS_LOW, EPS_HIGH, DUAL_CLIP, ENTROPY_COEF, 0.0
    cfg.model.lora_rank = lora_rank
    cfg.validate()
    frozen = ()
    if lora_rank:  # as the Trainer: adapters train, the base is a non-donated argument
        add_lora(model, lora_rank, cfg.model.lora_alpha, rngs=nnx.Rngs(1))
        graph, actor, base = nnx.split(model, LoRAParam, ...)
        frozen = (base,)
    else:
        graph, actor = nnx.split(model)
    opt = make_optimizer(cfg.optim.actor_lr, cfg.optim)
    programs = StepPrograms(StepSettings.of(cfg), graph, None, opt, None)
    state = TrainState(iteration=jnp.zeros((), jnp.int32), key=jax.random.PRNGKey(0), actor=actor,
                       actor_opt=opt.init(actor), critic={}, critic_opt={}, skipped_updates=jnp.zeros((), jnp.int32))
    prepare, update = jax.jit(programs.prepare), jax.jit(programs.update)

    def step(traj):
        batch, _ = prepare(state.actor, state.critic, None, traj, *frozen)
        new_state, metrics = update(state, batch, *frozen)
        jax.block_until_ready(new_state.actor)
        return new_state, metrics

    def update_peak_bytes(traj) -> int:
        """The compiled update's peak bytes per device (XLA memory_analysis; compiled once, cached)."""
        batch = jax.eval_shape(lambda t: prepare(state.actor, state.critic, None, t, *frozen)[0], traj)
        mem = update.lower(state, batch, *frozen).compile().memory_analysis()
        return int(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                   + mem.temp_size_in_bytes)

    def program_digest(traj) -> str:
        """sha256 of the lowered prepare + update programs without source locations: two settings
        that give the same digest run the same computation."""
        import hashlib
        import re

        batch = jax.eval_shape(lambda t: prepare(state.actor, state.critic, None, t, *frozen)[0], traj)
        text = (prepare.lower(state.actor, state.critic, None, traj, *frozen).as_text()
                + update.lower(state, batch, *frozen).as_text())
        text = re.sub(r"loc\([^\n]*?\)|#loc[^\n]*", "", text)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    step.update_peak_bytes = update_peak_bytes
    step.program_digest = program_digest
    return step, cfg


def torch_side(model, cfg, micro_rows: int = 1):
    """(step(traj) -> loss) for transformers' Qwen2ForCausalLM with our weights; same work as ours."""
    import torch
    import transformers

    from ragen_jax.models.qwen2.weights import save_pretrained

    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, d, dtype="float32")
        tm = transformers.Qwen2ForCausalLM.from_pretrained(d, dtype=torch.float32)
    tm.train()
    o = cfg.optim
    opt = torch.optim.AdamW(tm.parameters(), lr=o.actor_lr, betas=(o.b1, o.b2), weight_decay=o.weight_decay)

    def logp_entropy(ids, valid):
        hidden = tm.model(input_ids=ids, attention_mask=valid).last_hidden_state[:, :-1]
        logp_all = torch.log_softmax(tm.lm_head(hidden).float(), dim=-1)
        logp = torch.gather(logp_all, -1, ids[:, 1:, None])[..., 0]
        ent = -(logp_all.exp() * logp_all).sum(-1)
        return logp, ent

    def step(traj):
        tokens = torch.from_numpy(np.asarray(traj.tokens).astype(np.int64))
        k, t = tokens.shape
        valid = (torch.arange(t)[None, :] < torch.from_numpy(np.array(traj.length))[:, None]).long()
        mask = torch.from_numpy(np.array(traj.loss_mask)[:, 1:]).float()
        r = torch.from_numpy(np.array(traj.reward))
        g = r.view(-1, 2)
        adv_row = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)  # GRPO
        adv = adv_row[:, None] * mask
        with torch.no_grad():
            old = torch.cat([logp_entropy(tokens[i:i + micro_rows], valid[i:i + micro_rows])[0]
                             for i in range(0, k, micro_rows)])
        opt.zero_grad(set_to_none=True)
        denom = mask.sum().clamp(min=1.0)
        total = 0.0
        for i in range(0, k, micro_rows):  # gradient accumulation; the token-mean uses the global count
            sl = slice(i, i + micro_rows)
            logp, ent = logp_entropy(tokens[sl], valid[sl])
            ratio = torch.exp(torch.clamp(logp - old[sl], -20.0, 20.0))
            a = adv[sl]
            l1, l2 = -a * ratio, -a * torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH)
            clipped = torch.maximum(l1, l2)
            pg = torch.where(a < 0, torch.minimum(clipped, -a * DUAL_CLIP), clipped)
            loss = ((pg - ENTROPY_COEF * ent) * mask[sl]).sum() / denom
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(tm.parameters(), o.grad_clip)
        opt.step()
        return total

    return step


def bench_train_step(shape: str, k: int, t: int, *, repeats: int = 3, torch_baseline: bool = True,
                     mini_batch: int | None = None, peak_tflops: float | None = None, torch_micro_rows: int = 1,
                     seed: int = 0, micro_batch: int = 0, lora_rank: int = 0, model_overrides=None) -> dict:
    """One row: our prepare+update tokens/s (+ PyTorch's and the ratio), FLOPs and MFU. JSON-able.
    `model_overrides`: Qwen2Config fields replaced on the preset (e.g. attention, remat), recorded."""
    from ragen_jax.models import Qwen2, Qwen2Config

    if shape not in _presets():
        raise ValueError(f"unknown shape {shape!r}; valid: {', '.join(_presets())}")
    model_overrides = dict(model_overrides or {})
    setting = model_overrides.pop("setting", None)  # a label only
    model = Qwen2(Qwen2Config.from_preset(shape).replace(**model_overrides), rngs=nnx.Rngs(seed))
    step, cfg = build_programs(model, k, mini_batch or k, micro_batch, lora_rank)
    traj = synthetic_batch(k, t, model.cfg.vocab_size, seed=seed)
    n_tok = k * t
    mask = np.asarray(traj.loss_mask)
    row = {"shape": shape, "rows": k, "seq_len": t, "mini_batch": mini_batch or k, "micro_batch": micro_batch or
           mini_batch or k, "tokens": n_tok,
           "trained_tokens": int(mask[:, 1:].sum()), "real_tokens": int(np.sum(np.asarray(traj.length))),
           "dtype": str(model.cfg.dtype), "estimator": "grpo", "critic": False}
    if lora_rank:
        row["lora_rank"] = lora_rank
    if model_overrides:
        row["model"] = model_overrides
    if setting:
        row["setting"] = setting
    t0 = time.perf_counter()
    step(traj)
    first = time.perf_counter() - t0
    row["update_peak_gib"] = round(step.update_peak_bytes(traj) / 2**30, 3)
    row["program_digest"] = step.program_digest(traj)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(traj)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    fl = model_flops_per_token(model.cfg, t)
    row.update({
        "compile_s": round(max(first - med, 0.0), 2),
        "s_per_step": [round(x, 3) for x in times],
        "median_s_per_step": round(med, 3),
        "tok_s": round(n_tok / med, 1),
        "flops_per_token": fl,
        "achieved_tflops": round(fl["step"] * n_tok / med / 1e12, 4),
        "peak_tflops": peak_tflops,
        "mfu": round(fl["step"] * n_tok / med / (peak_tflops * 1e12), 4) if peak_tflops else None,
    })
    if torch_baseline:
        tstep = torch_side(model, cfg, torch_micro_rows)
        t0 = time.perf_counter()
        tstep(traj)
        tfirst = time.perf_counter() - t0
        ttimes = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            tstep(traj)
            ttimes.append(time.perf_counter() - t0)
        tmed = statistics.median(ttimes)
        row["torch"] = {"first_call_s": round(tfirst, 2), "s_per_step": [round(x, 3) for x in ttimes],
                        "median_s_per_step": round(tmed, 3), "tok_s": round(n_tok / tmed, 1),
                        "micro_rows": torch_micro_rows}
        row["ratio_ours_over_torch"] = round(row["tok_s"] / row["torch"]["tok_s"], 2)
    return row


def _parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="tiny", help="comma-separated presets, e.g. tiny,qwen2.5-0.5b")
    p.add_argument("--rows", type=int, default=32, help="K trajectories (reference: 0.25 * 8 * 16 = 32)")
    p.add_argument("--seq-len", type=int, default=2048, help="T tokens per trajectory")
    p.add_argument("--mini-batch", type=int, default=None, help="rows per optimizer step (default: all K)")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="tiny shape: also run with batching.micro_batch_size=N and record the speed ratio to one pass")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="also run every shape with LoRA adapters of this rank and record the speed ratio to full")
    p.add_argument("--device-gib", type=float, default=24.0,
                   help="--before-after: the device memory the after row's remat is decided for (default 24: "
                        "a 24 GB GPU)")
    p.add_argument("--before-after", action="store_true",
                   help="run each shape with issue 12's before settings (xla attention, no remat) and after "
                        "settings (auto attention, remat as a run resolves it: on from 0.5B up), side by side, "
                        "and record the after/before speed ratio (no PyTorch)")
    p.add_argument("--big-rows", type=int, default=2, help="K for shapes other than tiny (slow on CPU)")
    p.add_argument("--big-seq-len", type=int, default=128, help="T for shapes other than tiny")
    p.add_argument("--quick", action="store_true", help="K=4, T=128 (K=2, T=64 for big shapes)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--torch-micro-rows", type=int, default=1, help="PyTorch rows per forward (memory bound)")
    p.add_argument("--peak-tflops", type=float, default=None, help="for MFU (H100 SXM bf16 dense: 989)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.seq_len, args.big_rows, args.big_seq_len = 4, 128, 2, 64
    return args


def _before_after(shape: str, k: int, t: int, args) -> list[dict]:
    """Issue 12's before and after settings of one shape, side by side."""
    mb = args.mini_batch if shape == "tiny" else None
    before = bench_train_step(shape, k, t, repeats=args.repeats, torch_baseline=False, mini_batch=mb,
                              model_overrides={"attention": "xla", "remat": False, "setting": "before"})
    # remat as a run with model.remat unset decides it on a device of --device-gib: never for
    # "tiny"; from 0.5B up only when the update does not fit without it (Trainer._fit_memory).
    after = bench_train_step(shape, k, t, repeats=args.repeats, torch_baseline=False, mini_batch=mb,
                             model_overrides={"attention": "auto", "remat": False, "setting": "after"})
    if shape != "tiny" and after["update_peak_gib"] > args.device_gib:
        after = bench_train_step(shape, k, t, repeats=args.repeats, torch_baseline=False, mini_batch=mb,
                                 model_overrides={"attention": "auto", "remat": True, "setting": "after"})
    after["device_gib"] = args.device_gib
    # Equal digests: the after settings compile to the very program of before (any speed
    # difference between the two rows is then the shared machine's noise).
    after["same_program_as_before"] = after["program_digest"] == before["program_digest"]
    after["ratio_after_over_before"] = round(after["tok_s"] / before["tok_s"], 2)
    print(f"{shape:>13} K{k} T{t}: before {before['tok_s']:.1f} tok/s, after {after['tok_s']:.1f} tok/s "
          f"(ratio {after['ratio_after_over_before']:.2f})", flush=True)
    return [before, after]


def main(argv=None):
    args = _parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in shapes if s not in _presets()]
    if bad:
        print(f"error: unknown shape {bad[0]!r} in --shapes; valid: {', '.join(_presets())}", file=sys.stderr)
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
    if have_torch:
        import torch

        result["machine"]["torch"] = torch.__version__
        result["machine"]["torch_threads"] = torch.get_num_threads()
    for shape in shapes:
        k, t = (args.rows, args.seq_len) if shape == "tiny" else (args.big_rows, args.big_seq_len)
        if args.before_after:
            result["rows"] += _before_after(shape, k, t, args)
            write_result(result, args.out)
            continue
        try:
            row = bench_train_step(shape, k, t, repeats=args.repeats, torch_baseline=have_torch,
                                   mini_batch=args.mini_batch if shape == "tiny" else None,
                                   peak_tflops=args.peak_tflops, torch_micro_rows=args.torch_micro_rows)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if shape == "tiny" and args.micro_batch:
            micro = bench_train_step(shape, k, t, repeats=args.repeats, torch_baseline=False,
                                     mini_batch=args.mini_batch, micro_batch=args.micro_batch)
            micro["ratio_micro_over_one_pass"] = round(micro["tok_s"] / row["tok_s"], 2)
            result["rows"].append(micro)
            print(f"{shape:>13} K{k} T{t} micro-batches of {args.micro_batch}: {micro['tok_s']:.1f} tok/s, "
                  f"ratio to one pass {micro['ratio_micro_over_one_pass']:.2f}", flush=True)
        result["rows"].append(row)
        if args.lora_rank:
            lora = bench_train_step(shape, k, t, repeats=args.repeats, torch_baseline=False,
                                    mini_batch=args.mini_batch if shape == "tiny" else None,
                                    peak_tflops=args.peak_tflops, lora_rank=args.lora_rank)
            lora["ratio_lora_over_full"] = round(lora["tok_s"] / row["tok_s"], 2)
            result["rows"].append(lora)
            print(f"{shape:>13} K{k} T{t} LoRA rank {args.lora_rank}: {lora['tok_s']:.1f} tok/s, ratio to full "
                  f"{lora['ratio_lora_over_full']:.2f}", flush=True)
        line = (f"{shape:>13} K{k} T{t}: {row['median_s_per_step']:.2f} s/step, {row['tok_s']:.1f} tok/s "
                f"(compile {row['compile_s']:.1f} s), {row['flops_per_token']['step'] / 1e6:.1f} MFLOP/token "
                f"-> {row['achieved_tflops']:.4f} TFLOP/s")
        if row["mfu"] is not None:
            line += f", MFU {row['mfu']:.2%} of {args.peak_tflops} TFLOP/s"
        if "torch" in row:
            line += (f" | torch {row['torch']['median_s_per_step']:.2f} s/step, {row['torch']['tok_s']:.1f} tok/s "
                     f"-> ratio ours/torch {row['ratio_ours_over_torch']:.2f}")
        print(line, flush=True)
        write_result(result, args.out)
    write_result(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
