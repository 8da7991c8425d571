"""Regenerate the measured tables from the files benchmarks and the demo write.

    python scripts/readme_results.py            # rewrites docs/benchmarks.md and the README's short table
    python scripts/readme_results.py --check    # exit 1, naming the files, when either is out of date

Two generated blocks: docs/benchmarks.md between the results markers (every table), and README.md
between the summary markers (the demo's paired results, the pretrained model's, the GPU iteration).
Nothing here is typed by hand: every number comes from bench/results/*.json and the CPU demo's
published outputs in docs/demo_results/ (`python launch/demo.py --workdir runs/demo --publish
docs/demo_results`), with the machine each was measured on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- results:start -->", "<!-- results:end -->"
SUMMARY_START, SUMMARY_END = "<!-- summary:start -->", "<!-- summary:end -->"
BENCHMARKS = Path("docs") / "benchmarks.md"  # the page the results block lives on; image links are relative to it


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _machine(m: dict) -> str:
    if not m:
        return "machine not recorded"
    load = m.get("load_average_1_5_15min") or m.get("loadavg_start")
    dev = m.get("backend") or m.get("device") or "?"
    s = f"{m.get('cpu_count', '?')}-core {m.get('platform', '?').split('-with')[0]}, jax {m.get('jax', '?')} on {dev}"
    if m.get("cpu_model"):
        s = f"{m['cpu_model']}, {s}"
    if load:
        s += f", load average {load[0]:.1f} while measuring (shared machine)"
    return s


def sampler_section(d) -> list[str]:
    if not d:
        return []
    bw = d.get("settings", {}).get("bandwidth_gbs")
    rows = d["rows"]

    def cell(r, k, ours=("ours", "ours_bf16")):
        v = r.get(f"{k}_tok_s")
        if v is None:
            return "-"
        ratios = [f"{r[f'ratio_{o}_over_{k}']:.2f}x" for o in ours if f"ratio_{o}_over_{k}" in r]
        return f"{v:,.0f}" + (f" ({' / '.join(ratios)})" if ratios else "")

    def met(r, sides):
        m = (r.get("targets") or {}).get("met_like_for_like")
        if not m:
            return "-"
        words = []
        for o, label in sides:
            v = m.get(o)
            if v is not None:
                vals = [x for x in v.values() if x is not None]  # None: no peer side doing this work
                words.append(f"{label} " + ("n/a" if not vals else "yes" if all(vals) else "no"))
        return ", ".join(words) or "-"

    def tok(r, k):
        v = r.get(f"{k}_tok_s")
        return "-" if v is None else f"{v:,.0f}"

    def targets(r):
        tg = (r.get("targets") or {}).get("min_ratio", {})
        return ", ".join(f"{v:g}x {'the fastest peer' if k == 'best_peer' else k}" for k, v in tg.items()) or "-"

    nolp = ("ours_nolp", "ours_bf16_nolp")
    out = ["### Decode speed (`bench/sampler.py`)", "",
           f"Greedy decode, prompt {rows[0].get('prompt_len')} ids, {rows[0].get('new_tokens')} new tokens, "
           f"random weights, tokens/s end to end (prefill included); {_machine(d.get('machine', {}))}. "
           "Every peer runs in the same run, interleaved call by call with ours. "
           "PyTorch = transformers `generate` on the same weights (f32 and a bf16 cast); Tunix = its `Sampler` on a "
           "Qwen2 of the same shapes (f32, and bf16 weights and compute); ours bf16-matmul = the same weights with "
           "`matmul_dtype=\"bfloat16\"` (bf16 operands, f32 accumulation); ours (scan) = the decode path before "
           "docs/decode.md. Peer cells: tok/s (ours f32 / peer, ours bf16-matmul / peer). Bound = decode-only "
           "memory-bandwidth bound, batch x bandwidth / f32 weight bytes"
           + (f" ({bw:.0f} GB/s measured)" if bw else "") + ". Target met = issue 14's ratios in this run, each "
           "side against the peers doing the same work.", "",
           "Tokens only (ours: `generate(logprobs=False)`; transformers' `generate` and Tunix's sampler compute no "
           "log-probs either):", "",
           "| shape | batch | ours f32 tok/s | ours bf16-matmul | PyTorch f32 | PyTorch bf16 | Tunix f32 | Tunix bf16 "
           "| bound (decode only) | target | target met |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bound = (r.get("bandwidth_bound") or {}).get("decode_only_tok_s")
        out.append(f"| {r['shape']} | {r['batch']} | {tok(r, 'ours_nolp')} | {tok(r, 'ours_bf16_nolp')} "
                   f"| {cell(r, 'torch', nolp)} | {cell(r, 'torch_bf16', nolp)} | {cell(r, 'tunix', nolp)} "
                   f"| {cell(r, 'tunix_bf16', nolp)} | {'-' if bound is None else f'{bound:,.0f}'} | {targets(r)} "
                   f"| {met(r, [('ours_nolp', 'f32'), ('ours_bf16_nolp', 'bf16')])} |")
    out += ["", "With each token's log-prob (the default, what an RL rollout keeps; the PyTorch sides compute it on "
            "the fly with a logits processor; Tunix has no such side, so its target is judged in the table above):", "",
            "| shape | batch | ours f32 tok/s | ours bf16-matmul | ours (scan) | PyTorch f32 | PyTorch bf16 "
            "| target met | same greedy tokens as PyTorch f32 |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['shape']} | {r['batch']} | {tok(r, 'ours')} | {tok(r, 'ours_bf16')} | {cell(r, 'ours_scan')} "
                   f"| {cell(r, 'torch_lp')} | {cell(r, 'torch_bf16_lp')} "
                   f"| {met(r, [('ours', 'f32'), ('ours_bf16', 'bf16')])} | {r.get('greedy_tokens_equal_frac', '-')} |")
    return out + [""]


def envs_section(d) -> list[str]:
    if not d:
        return []
    out = ["### Environment steps (`bench/envs.py`)", "",
           f"One step = {d['settings'].get('step_definition', 'step + render_ids + parse')}. Baseline: "
           f"{d['settings'].get('numpy_step_definition', 'numpy implementation')}. {_machine(d.get('machine', {}))}; "
           "per wall second and, in brackets, per CPU second of the process.", "",
           "| env | batch | jax steps/s | numpy steps/s | ratio |", "|---|---|---|---|---|"]
    for r in d.get("steps", []):
        cpu = "jax_steps_per_cpu_s" in r
        out.append(f"| {r['env']} | {r['batch']} | {r['jax_steps_per_s']:,.0f}"
                   + (f" ({r['jax_steps_per_cpu_s']:,.0f})" if cpu else "") + f" | {r['numpy_steps_per_s']:,.0f}"
                   + (f" ({r['numpy_steps_per_cpu_s']:,.0f})" if cpu else "") + f" | {r['ratio']:.1f}x"
                   + (f" ({r['ratio_cpu']:.1f}x)" if cpu else "") + " |")
    resets = d.get("resets", [])
    if resets:
        out += ["", "| rooms generated | batch | jax rooms/s | host generator rooms/s |", "|---|---|---|---|"]
        for r in resets:
            host = r.get("numpy_rooms_per_s")
            host_s = "-" if host is None else f"{host:,.0f}"
            out.append(f"| {r['env']} | {r['batch']} | {r['jax_rooms_per_s']:,.0f} | {host_s} |")
    return out + [""]


def env_rules_section(d) -> list[str]:
    if not d:
        return []
    out = ["### Environment rules alone (`bench/env_rules.py`)", "",
           f"One step = {d['settings']['step_definition']}. Baseline: {d['settings']['host_step_definition']}. "
           f"{_machine(d.get('machine', {}))}; per wall second and, in brackets, per CPU second of the process.", "",
           "| env | batch | jax steps/s | plain-Python port steps/s | ratio |", "|---|---|---|---|---|"]
    for r in d.get("steps", []):
        out.append(f"| {r['env']} | {r['batch']} | {r['jax_steps_per_s']:,.0f} ({r['jax_steps_per_cpu_s']:,.0f}) | "
                   f"{r['host_steps_per_s']:,.0f} ({r['host_steps_per_cpu_s']:,.0f}) | "
                   f"{r['ratio']:.0f}x ({r['ratio_cpu']:.0f}x) |")
    succ = d.get("random_policy_success", [])
    if succ:
        out += ["", "| random policy | episodes (jax / port) | success jax | success port |", "|---|---|---|---|"]
        for r in succ:
            out.append(f"| {r['env']} ({r['max_steps_in_episode']} steps) | {r['jax_episodes']} / {r['host_episodes']} | "
                       f"{r['jax_success']:.3f} | {r['host_success']:.3f} |")
    return out + [""]


def _loads(d) -> str:
    loads = [r.get("machine", {}).get("loadavg_start", [None])[0] for r in d.get("runs", [])]
    loads = [x for x in loads if x is not None]
    return f"load average {min(loads):.1f}-{max(loads):.1f} at the start of the runs" if loads else "load not recorded"


def rollout_section(d) -> list[str]:
    if not d or not d.get("rows"):
        return []
    m = (d.get("runs") or [{}])[0].get("machine", {})
    out = ["### Compiled rollout (`bench/rollout.py`)", "",
           f"Sokoban, temperature 1, random weights, f32; {m.get('cpu_count', '?')}-core CPU, jax {m.get('jax', '?')}, "
           f"{_loads(d)} (shared machine). Baseline: the host loop (`ragen_jax/rollout/host_loop.py`: Python turns, "
           "whole conversation re-encoded each turn) in the same run. Variants, timed in the same run from the same "
           "weights (`--variants`): before = the decode path before issue 14 (layer scan), bf16-matmul = "
           "`model.matmul_dtype=bfloat16`; cells: s / rollout (the variant's speed relative to the current program's).", "",
           "| shape | vocab | P x N x turns x tokens | s / rollout | generated tok/s | episodes/s | host loop s | ratio "
           "| before (scan) | bf16-matmul |",
           "|---|---|---|---|---|---|---|---|---|---|"]

    def variant(r, v):
        vr = r.get(f"variant_{v}")
        if not vr:
            return "-"
        return f"{vr['median_s_per_rollout']:.1f} ({r[f'ratio_{v}_over_current']:.2f}x)"

    for r in d["rows"]:
        host = r.get("host") if isinstance(r.get("host"), dict) else {}
        ratio = r.get("ratio_generated_tok_s_ours_over_host")
        out.append(f"| {r['shape']} | {r['vocab']} | {r['groups']}x{r['group_size']}x{r['turns']}x{r['max_response_tokens']} | "
                   f"{r['median_s_per_rollout']:.1f} | {r['generated_tok_s']:,.0f} | {r['episodes_per_s']:.2f} | "
                   f"{host.get('median_s_per_rollout', '-')} | {'-' if ratio is None else f'{ratio:.1f}x'} "
                   f"| {variant(r, 'scan')} | {variant(r, 'bf16')} |")
    return out + [""]


def train_step_section(d) -> list[str]:
    if not d or not d.get("rows"):
        return []
    out = ["### PPO update (`bench/train_step.py`)", "",
           f"prepare (no-grad log-probs) + one clipped-PPO AdamW step over K trajectories of T tokens, f32; "
           f"{_loads(d)}. Baseline: the same step with transformers' PyTorch Qwen2 in the same run.", "",
           "Rows with a LoRA rank train adapters only (`model.lora_rank`); their ratio is to the full-training "
           "row measured just before them in the same run. Rows marked before / after (`--before-after`) are "
           "issue 12's settings side by side: before = xla attention, no remat; after = `auto` attention and "
           "remat as a run with `model.remat` unset resolves it on a 24 GB device (off when the update fits without "
           "it, as it does at these shapes; the backward otherwise recomputes the forward to save memory); the "
           "after rows record `update_peak_gib` and whether they compile to the same program as before "
           "(`same_program_as_before`, from a digest of the lowered programs).", "",
           "| shape | K x T | micro-batch | LoRA rank | ours tok/s | PyTorch tok/s | ratio |",
           "|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        torch = (r.get("torch") or {}).get("tok_s")
        ratio, lora, ba = r.get("ratio_ours_over_torch"), r.get("ratio_lora_over_full"), r.get("ratio_after_over_before")
        ratio = (f"{ratio:.2f}x vs PyTorch" if ratio is not None
                 else f"{lora:.2f}x vs full" if lora is not None
                 else f"{ba:.2f}x vs before" if ba is not None else r.get("setting", "-"))
        out.append(f"| {r['shape']} | {r['rows']}x{r['seq_len']} | {r.get('micro_batch', '-')} | "
                   f"{r.get('lora_rank', '-')} | {r['tok_s']:,.1f} | {'-' if torch is None else f'{torch:,.1f}'} | "
                   f"{ratio} |")
    return out + [""]


def memory_section(d) -> list[str]:
    if not d or not d.get("rows"):
        return []
    out = ["### Memory per device (`bench/memory.py`)", "",
           f"Peak GiB per device of the compiled programs with abstract parameters (`memory_analysis`: "
           f"{d.get('formula', 'arguments + outputs - aliases + temporaries, plus resident train state')}), "
           f"measured on {_machine(d['machine'])}. Reference settings: P=8 x N=16, 5 turns x 400 tokens, context "
           "3,600, mini-batch 32, bf16 compute, float32 params + AdamW. before = xla attention, no remat, one pass, "
           "no donation; after = `model.attention=auto` (chunked on CPU), remat, `batching.micro_batch_size`, donated state. "
           "Rows named *-lora: LoRA rank 64 on all seven projections over a bfloat16 frozen base, AdamW for the "
           "adapters (and the critic's value head) only.",
           "", "| model, estimator | devices | settings | micro-batch | rollout | prepare | update | target | met |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(d["rows"], key=lambda r: (r["row"], r["setting"] != "before", r["setting"])):
        p = r["programs"]
        tgt = r.get("target_gib")
        met = "-" if tgt is None else ("yes" if r.get("meets_target") else "no")
        out.append(f"| {r['row']} | {r['devices']} | {r['setting']} | {r['settings'].get('micro_batch_size')} | "
                   + " | ".join(f"{p[k]['total_gib']:,.1f}" for k in ("rollout", "prepare", "update"))
                   + f" | {'-' if tgt is None else f'<= {tgt}'} | {met} |")
    return out + [""]


# Cards for the smallest-card table: (name, GiB). A program set fits a card when its largest total is at
# most CARD_FRACTION of it (JAX's pool with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95, docs/accelerators.md).
CARDS = ((8, "8 GB (RTX 4060)"), (12, "12 GB (RTX 3060)"), (16, "16 GB (T4, V100-16GB)"),
         (24, "24 GB (RTX 4090, L4, A10)"), (32, "32 GB (V100-32GB, RTX 5090)"), (40, "40 GB (A100-40GB)"),
         (48, "48 GB (L40S, A6000)"), (80, "80 GB (A100-80GB, H100)"), (141, "141 GB (H200)"))
CARD_FRACTION = 0.95
_SIZES = {"qwen2.5-0.5b": "0.5B", "qwen2.5-1.5b": "1.5B", "qwen2.5-3b": "3B", "qwen2.5-7b": "7B"}


def _option(r: dict) -> str:
    s = r["settings"]
    if not s.get("lora_rank"):
        return "full fine-tune (float32 params + AdamW)"
    quant = s.get("base_quant") or "none"
    return "LoRA, bf16 base" if quant == "none" else f"LoRA, {quant} base"


def smallest_card(gib: float) -> str:
    fit = [name for size, name in CARDS if gib <= CARD_FRACTION * size]
    return fit[0] if fit else f"none of one card (> {CARD_FRACTION * CARDS[-1][0]:.0f} GiB)"


def card_rows(*results) -> list[dict]:
    """Per (model, estimator, option, devices): the measured setting needing least memory, and its card."""
    best: dict = {}
    for d in results:
        for r in (d or {}).get("rows", []):
            if r["setting"] == "before":
                continue
            key = (r["preset"], r["estimator"], _option(r), r["devices"])
            if key not in best or r["max_total_gib"] < best[key]["max_total_gib"]:
                best[key] = r
    order = {k: i for i, k in enumerate(_SIZES)}
    quant = ("none", "int8", "nf4", "int4", "gguf")
    return sorted(best.values(), key=lambda r: (order.get(r["preset"], 99), r["estimator"] == "grpo",
                                                 bool(r["settings"].get("lora_rank")),
                                                 quant.index(r["settings"].get("base_quant") or "none"),
                                                 r["devices"]))


def card_section(memory, qlora) -> list[str]:
    rows = card_rows(memory, qlora)
    if not rows:
        return []
    out = ["### Smallest card per agent (`bench/memory.py`)", "",
           f"From the two tables above: for each model, estimator and option, the measured setting whose largest "
           f"program total is lowest, and the smallest card it fits on: total <= {CARD_FRACTION:g} x the card's "
           f"memory (JAX's pool with `XLA_PYTHON_CLIENT_MEM_FRACTION={CARD_FRACTION:g}`). The totals are XLA:CPU "
           "compilations, which hold one 16-bit copy of the float weights more than a GPU's (docs/memory.md): "
           "on a GPU they are upper bounds. Settings: micro-batch rows `batching.micro_batch_size`, "
           "`rollout.groups_per_pass`. Multi-device rows are per device (FSDP).", "",
           "| model, estimator | option | devices | setting | rollout / prepare / update GiB | smallest card |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        p, s = r["programs"], r["settings"]
        setting = f"micro-batch {s.get('micro_batch_size')}, {s.get('groups_per_pass') or 8} of 8 groups per pass"
        if s.get("kv_cache_quant", "none") != "none":
            setting += f", {s['kv_cache_quant']} KV cache"
        card = smallest_card(r["max_total_gib"])
        out.append(f"| {_SIZES.get(r['preset'], r['preset'])} {'PPO' if r['estimator'] == 'gae' else r['estimator'].upper()} | {_option(r)} | {r['devices']} | "
                   f"{setting} | " + " / ".join(f"{p[k]['total_gib']:.1f}" for k in ("rollout", "prepare", "update"))
                   + f" | {card}{' each' if r['devices'] > 1 else ''} |")
    return out + [""]


def qlora_memory_section(d, memory=None) -> list[str]:
    if not d or not d.get("rows"):
        return []
    bf16 = {(r["row"], r["setting"]): r for r in (memory or {}).get("rows", [])}
    out = ["### Memory with a quantized base (QLoRA, `bench/memory.py`)", "",
           f"The *-lora rows of the table above with the frozen base's projections stored by `model.base_quant` "
           f"(docs/memory.md): rank-64 adapters on all seven projections, bf16 embeddings, head and scales; "
           f"GiB per device, total as above; measured on {_machine(d['machine'])}. bf16 base = the same row and "
           "setting of `bench/results/memory.json` where measured.", "",
           "| row | base | setting | micro-batch | groups per pass | rollout | prepare | update | bf16 base | target | met |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(d["rows"], key=lambda r: (r["preset"], r["row"], r["settings"]["micro_batch_size"])):
        p, s = r["programs"], r["settings"]
        lora = r["row"].replace("-qlora", "-lora").rsplit("-int", 1)[0]
        ref = bf16.get((lora, r["setting"]))
        ref_cell = "-" if ref is None else " / ".join(f"{ref['programs'][k]['total_gib']:.1f}"
                                                      for k in ("rollout", "prepare", "update"))
        tgt = r.get("target_gib")
        met = "-" if tgt is None else ("yes" if r.get("meets_target") else "no")
        out.append(f"| {r['row']} | {s.get('base_quant')} | {r['setting']} | {s.get('micro_batch_size')} | "
                   f"{s.get('groups_per_pass') or 8} | "
                   + " | ".join(f"{p[k]['total_gib']:.1f}" for k in ("rollout", "prepare", "update"))
                   + f" | {ref_cell} | {'-' if tgt is None else f'<= {tgt}'} | {met} |")
    return out + [""]


def qlora_greedy_section(d) -> list[str]:
    if not d or not d.get("rows"):
        return []
    st = d.get("settings", {})
    out = ["### Greedy agreement with a quantized base (`bench/qlora_greedy.py`)", "",
           f"SmolLM2-135M-Instruct, {st.get('prompts')} chat prompts, the first {st.get('new_tokens')} greedy tokens "
           "(stopping at the end of turn) of each base against the float32 model (the file's Q4_1 projections "
           "dequantized: what every float run loads), one left-padded batch; teacher-forced on the float model's "
           "answers: the largest |logit difference| and the mean KL(float || quantized). bf16-rounded is a "
           "reference, not an option: the float weights rounded to bfloat16; kv-int8 is the float model with "
           f"`rollout.kv_cache_quant=int8`. {_machine(d.get('machine', {}))}.", "",
           "| base | prompts identical | tokens equal | max \\|logit diff\\| | mean KL | target | met |",
           "|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        tgt = r.get("target")
        met = "-" if tgt is None else ("yes" if r.get("meets_target") else "no")
        out.append(f"| {r['base_quant']} | {r['identical_prompts']} / {r['prompts']} | {r['tokens_equal_frac']:.3f} | "
                   f"{r['forced_max_abs_logit_diff']:.3g} | {r['forced_mean_kl']:.3g} | "
                   f"{'-' if tgt is None else f'>= {tgt}'} | {met} |")
    return out + [""]


def qlora_speed_section(d) -> list[str]:
    if not d or not d.get("rows"):
        return []
    st = d.get("settings", {})
    ref = d["rows"][0]["base"]
    out = ["### Sampling with a quantized base (`bench/qlora_speed.py`)", "",
           f"SmolLM2-135M-Instruct, the Bandit stage's decode: {st.get('rows')} rows, prompt {st.get('prompt_len')} ids, "
           f"{st.get('new_tokens')} sampled tokens, float32 compute and cache; the bases interleaved call by call, "
           f"median of {st.get('repeats')}; {_machine(d.get('machine', {}))}. Dequantized = the float32 bytes of "
           "the compiled program's fusions that turn codes into float kernels: hoisted out of the token loop "
           "(once per call) or inside it (per token).", "",
           f"| base | weights MiB | temporaries MiB | dequantized once per call MiB | per token MiB | median s "
           f"| tokens/s | vs {ref} |", "|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        mib = 2 ** 20
        out.append(f"| {r['base']} | {r['weight_bytes'] / mib:,.0f} | {r['memory_analysis']['temp_bytes'] / mib:,.0f} | "
                   f"{r.get('once_per_call_f32_bytes', 0) / mib:,.0f} | {r.get('per_token_f32_bytes', 0) / mib:,.0f} | "
                   f"{r['median_s']:.2f} | {r['tok_s']:,.0f} | {r[f'ratio_over_{ref}']:.2f}x |")
    return out + [""]


def sft_step_section(d) -> list[str]:
    if not d or not d.get("rows"):
        return []
    r0 = d["rows"][0]
    config = d.get("config", "demo_cpu.py")
    title = "SFT step" if config == "demo_cpu.py" else f"SFT step, `{config}`"
    out = [f"### {title} (`bench/sft_step.py`)", "",
           f"One warm-start optimizer step of `configs/{d.get('config', 'demo_cpu.py')}` on {r0['demos']} real "
           f"demonstrations (batch {r0['batch_size']}, mean {r0['mean_demo_tokens']:.0f} tokens, padded to "
           f"{r0['padded_length']}), the variants side by side in one run; {_loads(d)}.", "",
           "| variant | shared prefix | widths (tokens: demos) | s/step | demo tok/s | kernel s/step | "
           "minor faults/step | speed-up |", "|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        widths = " ".join(f"{w}:{n}" for w, n in r["widths"].items())
        kern, faults = r.get("kernel_s_per_step"), r.get("minor_faults_per_step")
        out.append(f"| {r['variant']} | {r['shared_prefix_tokens']} | {widths} | {r['median_s_per_step']:.3f} | "
                   f"{r['demo_tok_s']:,.0f} | {'-' if kern is None else f'{kern:.3f}'} | "
                   f"{'-' if faults is None else f'{faults:,.0f}'} | {r['speedup_vs_plain']:.2f}x |")
    if any("huge pages" in r["variant"] for r in d["rows"]):
        out += ["", "The huge-pages row runs in a child process with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, "
                "which the launchers set for themselves (`ragen_jax/runtime.py`)."]
    groups = max((r.get("prompt_groups", 0) for r in d["rows"]), default=0)
    if groups:
        out += ["", f"With prompt groups (`sft.group_prompts`) the demonstrations show {groups} distinct prompts: "
                "each batch runs each of them once and every row only its answer."]
    return out + [""]


def sokoban_section(d) -> list[str]:
    if not d:
        return []
    out = ["### Sokoban room difficulty (`bench/sokoban_difficulty.py`)", "",
           "BFS-optimal solution lengths of rooms from our on-device generator vs the reference's host generator.", "",
           "| variant | rooms | median | mean | solvable within 10 | histogram (length: rooms) |", "|---|---|---|---|---|---|"]
    for name in ("Sokoban", "LargerSokoban"):
        r = d.get(name)
        if not r:
            continue
        hist = " ".join(f"{k}:{v}" for k, v in r["histogram"].items())
        out.append(f"| {name} (ours) | {r['n']} | {r['median']:g} | {r['mean']:.2f} | {r['pct_within_10']:g}% | {hist} |")
        ref = r.get("reference") or {}
        if ref:
            rh = " ".join(f"{k}:{v}" for k, v in (ref.get("histogram") or {}).items()) or "-"
            out.append(f"| {name} (reference) | {ref.get('n', '-')} | {ref.get('median', '-')} | {ref.get('mean', '-')} | "
                       f"{ref.get('pct_within_10', '-')}% | {rh} |")
    return out + [""]


def _mib(row, side: str) -> str:
    v = (row.get(f"temp_mib_{side}") or {}).get("update")
    return "-" if v is None else f"{v:,.0f} MiB"


def turn_blocks_section(d) -> list[str]:
    rows = (d or {}).get("rows") or []
    if not rows:
        return []
    m = d.get("machine") or {}
    out = ["### Single-turn RL step: skipping untaken turn blocks (`bench/turn_blocks.py`)", "",
           f"`prepare` + `update` of the demo's RL configs on one real rollout batch from the policy shown, "
           f"the plain pass over every turn block vs skipping the blocks of turns never taken (same numbers), "
           f"alternated, median of {(d.get('settings') or {}).get('repeats', '-')}; "
           f"{m.get('cpu_count', '-')}-core {m.get('cpu_model') or m.get('processor', '')}.", "",
           "| env | policy | turns taken / slots | plain (s) | skipping (s) | speed-up | update temporaries, plain -> skipping |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        policy = "demo warm start" if r.get("init_from") else "random init"
        out.append(f"| {r['family']} | {policy} | {r['mean_turns']:.2f} / {r['turn_slots']} | {r['step_s_plain']:.2f} | "
                   f"{r['step_s_skip']:.2f} | {r['speedup']:.2f}x | {_mib(r, 'plain')} -> {_mib(r, 'skip')} |")
    return out + [""]


def decode_fill_section(d) -> list[str]:
    rows = (d or {}).get("rows") or []
    if not rows:
        return []
    st = d.get("settings") or {}
    out = ["### Decode cost that follows the filled cache (`bench/decode_fill.py`)", "",
           f"One greedy decode step (model, vocabulary head, token choice) with a KV cache of fixed capacity, "
           f"filled to the slots shown: reading the filled slots in static buckets (the default), the whole "
           f"capacity (before issue 45) and a cache of exactly the filled size (the floor). Per-step time from "
           f"two calls of {st.get('steps_short', '-')} and {st.get('steps_long', '-')} tokens ending at the fill, "
           f"sides interleaved, median of {st.get('repeats', '-')}; random weights, float32. {_machine(d.get('machine'))}.",
           "", "| shape | batch | capacity | filled | filled reads (ms) | whole capacity (ms) | cache of the filled size "
           "(ms) | filled reads / floor | whole / filled reads |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['shape']} | {r['batch']} | {r['capacity']:,} | {r['fill']:,} | {r['bounded_ms_per_step']:.1f} | "
                   f"{r['full_ms_per_step']:.1f} | {r['native_ms_per_step']:.1f} | {r['bounded_over_native']:.2f}x | "
                   f"{r['full_over_bounded']:.2f}x |")
    return out + [""]


def rl_iteration_section(d) -> list[str]:
    rows = (d or {}).get("rows") or []
    if not rows:
        return []
    out = ["### One RL iteration before and after issue 45 (`bench/rl_iteration.py`)", "",
           "Two Trainers from the same config, weights and seeds: before = every row prefills and the trainer "
           "scores its own copy of the prompt prefix, every decode step reads the whole cache capacity "
           "(`rollout.shared_prefix=false rollout.filled_reads=false`); after = the defaults: the prompt prefix "
           "prefilled once and broadcast, each group's first observation prefilled once, the trainer running the "
           "prefix once per batch and each group's shared beginning once, decode reading the filled slots. Iterations "
           f"alternate between the two; median seconds per phase. {_machine(d.get('machine'))}.", "",
           "| config | iterations | rollout before / after (s) | prepare before / after (s) | update before / after (s) "
           "| iteration before / after (s) | speed-up (rollout, prepare, update, iteration) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[f'before_{ph}']:.1f} / {r[f'after_{ph}']:.1f}" for ph in ("rollout_s", "prepare_s", "only_update_s",
                                                                              "iteration_s")]
        ratios = ", ".join(f"{r[f'ratio_{ph}']:.1f}x" for ph in ("rollout_s", "prepare_s", "only_update_s", "iteration_s"))
        out.append(f"| {r['tag']} | {r['iterations']} | " + " | ".join(cells) + f" | {ratios} |")
    return out + [""]


def collapse_probe_section(d) -> list[str]:
    rows = (d or {}).get("rows") or []
    if not rows:
        return []
    out = ["### The RAGEN-2 collapse probe before and after sharing each prompt (`bench/collapse_probe.py`)", "",
           "Every sampled reasoning scored under every group's prompt (M x P rows [x_j | z_i]) on one rollout "
           "batch: before = every row through the model whole; after = the rows column-major in blocks of consecutive "
           "rows, each block running each of its prompts once and every row only its reasoning. Compiled ahead "
           f"(compile seconds apart), the sides interleaved, metrics equal. {_machine(d.get('machine'))}.", "",
           "| config | pairs x prompts | row width | block | compile before / after (s) | probe before / after (s) "
           "| speed-up |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.get("compile_s") or {}
        out.append(f"| {r['tag']} | {r['pairs']} x {r['prompts']} | {r['width']} | {r['block']} | "
                   f"{c.get('before', float('nan')):.1f} / {c.get('after', float('nan')):.1f} | "
                   f"{r['before_s']:.1f} / {r['after_s']:.1f} | {r['ratio']:.1f}x |")
    return out + [""]


def evaluation_section(d) -> list[str]:
    rows = (d or {}).get("rows") or []
    if not rows:
        return []
    out = ["### The evaluation before and after prefilling each distinct first observation once (`bench/evaluation.py`)",
           "", "One rollout per initial state, temperature 0.5, the same key on both sides: before = every state "
           "prefills its own first observation; after = each distinct one once (`rollout.distinct_first`). Compiled "
           f"ahead (compile seconds apart), the sides interleaved. {_machine(d.get('machine'))}.", "",
           "| policy | env | states | texts at most | compile before / after (s) | evaluation before / after (s) "
           "| speed-up | success before / after | states that differ |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r.get("compile_s") or {}
        out.append(f"| {r['tag']} | {r['env']} | {r['states']} | {r['distinct_first_observations']} | "
                   f"{c.get('before', float('nan')):.1f} / {c.get('after', float('nan')):.1f} | "
                   f"{r['before_s']:.1f} / {r['after_s']:.1f} | {r['ratio']:.1f}x | "
                   f"{r['success_before']:.3f} / {r['success_after']:.3f} | {r['states_that_differ']} |")
    return out + [""]


def _fmt(v, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _not_own(row: dict, part: str) -> str:
    """A dagger where the device's process-wide peak did not rise during the part (an earlier part's)."""
    return " †" if row.get(f"{part}_peak_is_own") is False else ""


def gpu_section(files: list) -> list[str]:
    """One row per lent-GPU run (bench/results/gpu_*.json, made by scripts/gpu_results.py)."""
    rows = [d.get("summary") for d in files if d and d.get("summary")]
    if not rows:
        return []
    out = ["### Lent GPU check (`bench/gpu_check.py`, `scripts/gpu_check.sh`)", "",
           "One device call: ceilings measured on the card (device-to-device copy, bf16 matmul); relative errors "
           "||out - ref|| / ||ref|| (bf16 vs float32 logits of a 0.5B-shaped random model; ours vs transformers "
           "float32; cudnn / chunked attention output and dQ vs a float32 xla reference); one iteration of "
           "configs/sokoban.py at 0.5B (rollout / prepare / update seconds, rollout tokens/s against its HBM bound, "
           "update MFU against the measured matmul, peak memory against the Trainer's AOT estimate); 0.5B decode at "
           "batch 128 with a 3,600-token cache (fraction of the HBM bound); the 3B GRPO update's peak against its "
           "estimate (†: the process-wide peak did not rise during the part, so it is an earlier part's). A CPU "
           "rehearsal row proves the pipeline with tiny shapes, not the GPU.", "",
           "| device | copy GB/s | bf16 TFLOP/s | bf16 logits err | vs transformers | cudnn out / dQ err | "
           "chunked out / dQ err | rollout / prepare / update s | rollout tok/s (bound) | update MFU | "
           "peak / estimate GiB | decode tok/s (of bound) | 3B GRPO peak / estimate GiB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        dev = (r.get("device_kind") or "?") + (" (CPU rehearsal)" if r.get("rehearsal") else "")
        out.append(
            f"| {dev} | {_fmt(r.get('copy_gb_s'), ',.0f')} | {_fmt(r.get('bf16_matmul_tflops'), ',.1f')} | "
            f"{_fmt(r.get('bf16_logits_rel_err'), '.1e')} | {_fmt(r.get('transformers_logits_rel_err'), '.1e')} | "
            f"{_fmt(r.get('cudnn_out_rel_err'), '.1e')} / {_fmt(r.get('cudnn_dq_rel_err'), '.1e')} | "
            f"{_fmt(r.get('chunked_out_rel_err'), '.1e')} / {_fmt(r.get('chunked_dq_rel_err'), '.1e')} | "
            f"{_fmt(r.get('rollout_s'), '.2f')} / {_fmt(r.get('prepare_s'), '.2f')} / {_fmt(r.get('update_s'), '.2f')} | "
            f"{_fmt(r.get('rollout_tokens_per_s'), ',.0f')} ({_fmt(r.get('rollout_bound_tokens_per_s'), ',.0f')}) | "
            f"{_fmt(r.get('update_mfu'), '.1%')} | "
            f"{_fmt(r.get('iteration_peak_gib'), '.2f')}{_not_own(r, 'iteration')} / "
            f"{_fmt(r.get('iteration_estimate_gib'), '.2f')} | "
            f"{_fmt(r.get('decode_tokens_per_s'), ',.0f')} ({_fmt(r.get('decode_fraction_of_bound'), '.0%')}) | "
            f"{'OOM' if r.get('fit_3b_fits') is False else _fmt(r.get('fit_3b_peak_gib'), '.2f')}"
            f"{_not_own(r, 'fit_3b')} / {_fmt(r.get('fit_3b_estimate_gib'), '.2f')} |")
    errors = [f"{(r.get('device_kind') or '?')}: {k}: {str(v)[:160]}" for r in rows for k, v in (r.get("errors") or {}).items()]
    if errors:
        out += ["", "Parts that failed or were skipped: " + "; ".join(errors) + "."]
    return out + [""]


def _gpu_run_row(name: str, d: dict) -> str:
    """One follow-up call's part (bench/results/gpu_runs/<date>_<name>.json): its settings and outcome."""
    call = d.get("call") or d.get("settings") or {}
    alloc = call.get("XLA_PYTHON_CLIENT_PREALLOCATE")
    prec = call.get("jax_default_matmul_precision")
    dev = ((d.get("parts") or {}).get("environment") or {}).get("device_kind") or call.get("device_kind") or "GPU"
    cmd = call.get("command", "").split()
    sets = [cmd[i + 1] for i, w in enumerate(cmd[:-1]) if w == "--iteration-set"]
    gib = 2**30
    for part, r in (d.get("parts") or {}).items():
        if part == "fit_3b":
            what = f"3B GRPO update, `{r.get('setting')}` ({r.get('micro_batch_size')}-row micro-batches)"
            times = _fmt(r.get("update_s"), ".2f", " s update") if r.get("update_s") else "-"
            est = r.get("estimate_program_bytes")
        elif part == "iteration":
            extra = [o for o in r.get("overrides", sets) if o.startswith(("model.dtype", "rollout.matmul_dtype"))]
            what = "0.5B Sokoban iteration, " + (", ".join(f"`{o}`" for o in extra) or "bf16")
            times = (f"{_fmt(r.get('rollout_s'), '.1f')} / {_fmt(r.get('prepare_s'), '.2f')} / "
                     f"{_fmt(r.get('update_s'), '.2f')} s") if r.get("rollout_s") else "-"
            est = r.get("estimate_max_total_bytes")
        else:
            continue
        mm = r.get("mismatch") or {}
        mism = (f"{mm['mismatch/logp_abs_diff_mean']:.4f} / {mm['mismatch/logp_abs_diff_max']:.3f} / "
                f"{mm['mismatch/k3_kl']:.1e}" if mm else "-")
        peak = r.get("peak_bytes_in_use")
        outcome = ("OOM: " + r["error"].split("allocate ")[-1].split(" with")[0] + " block" if r.get("error")
                   else f"{_fmt(peak and peak / gib, '.2f')} / {_fmt(est and est / gib, '.2f')}")
        return (f"| {name[:10]} | {dev} | {what} | {alloc or '?'} | {prec or 'default'} | {outcome} | {times} | "
                f"{mism} |")
    return ""


def gpu_runs_section(res: Path) -> list[str]:
    """The shorter follow-up calls (scripts/gpu_followup.sh), one row per part run."""
    rows = [_gpu_run_row(f.stem, _load(f) or {}) for f in sorted((res / "gpu_runs").glob("*.json"))]
    rows = [r for r in rows if r]
    if not rows:
        return []
    return ["Follow-up calls (`scripts/gpu_followup.sh` and single parts; raw JSON in bench/results/gpu_runs/): "
            "preallocate is `XLA_PYTHON_CLIENT_PREALLOCATE` (fraction 0.95 in every call); mismatch is the "
            "sampler's against the trainer's log-probs of the same tokens (mean abs / max abs / k3 KL).", "",
            "| date | device | what | preallocate | f32 matmul precision | peak / estimate GiB | "
            "rollout / prepare / update | mismatch |", "|---|---|---|---|---|---|---|---|", *rows, ""]


def _k_cell(pc: dict | None) -> str:
    """A paired_rates result in one cell: gain [95% CI], p (k rollouts per state)."""
    if not pc:
        return "-"
    lo, hi = pc["ci95"]
    return (f"{pc['before']:.3f} -> {pc['after']:.3f}, {pc['change']:+.3f} [{lo:+.3f}, {hi:+.3f}], "
            f"p = {pc['p_value']:.2g} ({pc['states']} x {pc['samples_per_state']})")


def _gpu_learn_envs(res: Path):
    """(date, device, env, record) of every published scripts/gpu_learn.sh run (not rehearsals), in file order."""
    for f in sorted((res / "gpu_runs").glob("*.json")):
        d = _load(f) or {}
        if d.get("kind") != "gpu_learn" or d.get("rehearsal"):
            continue
        dev = (d.get("machine") or {}).get("device_kind") or "GPU"
        for env, r in (d.get("envs") or {}).items():
            yield f.stem[:10], dev, env, r


def gpu_learn_section(res: Path) -> list[str]:
    """scripts/gpu_learn.sh runs (bench/results/gpu_runs/*.json of kind gpu_learn): one row per env."""
    rows = []
    for date, dev, env, r in _gpu_learn_envs(res):
        rl, sft = r.get("rl") or {}, r.get("sft") or {}
        its = f"{rl.get('iterations', 0)} ({rl.get('stopped_by', '-')})" if rl else "-"
        secs = (f"{_fmt(sft.get('seconds'), '.0f')} / {_fmt(rl.get('seconds'), '.0f')} / "
                f"{_fmt((r.get('before') or {}).get('wall_s'), '.0f')}")
        status = "" if r.get("status") == "done" else f" ({str(r.get('status'))[:80]})"
        rows.append(f"| {date} | {dev} | {env}{status} | {its} | {_k_cell(r.get('paired'))} | "
                    f"{_fmt((r.get('paired') or {}).get('wilcoxon_p'), '.2g')} | {secs} |")
    head = ["### SmolLM2-135M-Instruct on a lent GPU (`scripts/gpu_learn.sh`)", ""]
    if not rows:
        return head + ["Not run yet: the two device calls in docs/pretrained.md (\"SmolLM2 on a lent GPU\").", ""]
    return head + ["RAGEN's StarPO-S settings after the format warm start, as many iterations as fit in one call; "
                   "both evaluations on the same fixed states with k rollouts each, compared state by state (paired "
                   "permutation test, bootstrap 95% interval of the gain; raw JSON in bench/results/gpu_runs/).", "",
                   "| date | device | env | RL iterations (stopped by) | warm start -> RL: gain [95% CI], p | "
                   "Wilcoxon p | seconds SFT / RL / eval |", "|---|---|---|---|---|---|---|", *rows, ""]


DEMO_DIR = Path("docs") / "demo_results"  # committed copies of the demo's outputs (launch/demo.py --publish)
PUBLISH_CMD = "python launch/demo.py --workdir runs/demo --publish docs/demo_results && python scripts/readme_results.py"
# The same demo from the pretrained SmolLM2-135M-Instruct (launch/demo.py --model smollm2), one published
# folder per family (each is a separate run: an hour or more on 2 cores).
PRETRAINED_DIR = Path("docs") / "pretrained_results"
PRETRAINED_FAMILIES = {"bandit": "--skip-sokoban --skip-frozen-lake", "sokoban": "--skip-bandit --skip-frozen-lake",
                       "frozen_lake": "--skip-bandit --skip-sokoban"}


# The Bandit family again with only adapters trained (issue 57): over the float base (LoRA) and over the
# .gguf file's own 4-bit blocks or re-quantized to nf4 (QLoRA), the same seeds and settings: folder ->
# (policy label, demo flags).
ADAPTER_FLAGS = ("--skip-sokoban --skip-frozen-lake --eval-samples 0 --bandit.model.lora_rank=64 --bandit.sft.lr=1e-3 "
                 "--bandit.optim.actor_lr=2e-4")
PRETRAINED_ADAPTER_RUNS = {
    "bandit_lora": ("SmolLM2-135M-Instruct, LoRA rank 64", ADAPTER_FLAGS),
    "bandit_qlora": ("SmolLM2-135M-Instruct, QLoRA rank 64 over the file's Q4_1 blocks",
                     ADAPTER_FLAGS + " --bandit.model.base_quant=gguf"),
    "bandit_qlora_nf4": ("SmolLM2-135M-Instruct, QLoRA rank 64 over an nf4 base", ADAPTER_FLAGS + " --bandit.model.base_quant=nf4"),
}


def smollm2_cmd(folder: str, flags: str) -> str:
    """The command that publishes docs/pretrained_results/<folder> from a SmolLM2 demo run."""
    return (f"python launch/demo.py --workdir runs/smollm2_{folder} --model smollm2 {flags} "
            f"--publish {(PRETRAINED_DIR / folder).as_posix()} && python scripts/readme_results.py")


def pretrained_cmd(family: str) -> str:
    return smollm2_cmd(family, PRETRAINED_FAMILIES[family])


def pretrained_sections(root: Path) -> list[str]:
    out = []
    published = [f for f in PRETRAINED_FAMILIES if (root / PRETRAINED_DIR / f / "eval.json").is_file()]
    for family in published:
        out += demo_section(root, PRETRAINED_DIR / family,
                            f"### CPU demo from a pretrained model: {family} (`launch/demo.py --model smollm2`)",
                            pretrained_cmd(family))
    for folder, (label, flags) in PRETRAINED_ADAPTER_RUNS.items():
        if (root / PRETRAINED_DIR / folder / "eval.json").is_file():
            out += demo_section(root, PRETRAINED_DIR / folder, f"### CPU demo from a pretrained model: {label}",
                                smollm2_cmd(folder, flags))
    if not published:
        out += ["### CPU demo from a pretrained model (`launch/demo.py --model smollm2`)", "",
                f"Not published yet: `{pretrained_cmd('bandit')}` (likewise sokoban, frozen_lake).", ""]
    return out
# Columns of the demo's results table, in order; only those some env reports are shown (high_arm_rate: Bandit).
DEMO_METRICS = ("success", "format_ok", "high_arm_rate", "reward_mean", "num_episodes")


def _num(v, fmt: str) -> str:
    return "-" if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, fmt)


def _demo_settings(ev: dict, summary: dict) -> str:
    st = ev.get("settings") or {}
    parts = [f"policy `{st['model']}`"] if st.get("model") else []
    if summary.get("cpu_count") is not None:
        parts.append(f"{summary['cpu_count']}-core machine" + (f" ({summary['cpu_model']})" if summary.get("cpu_model") else ""))
    if st.get("device"):
        parts.append(f"device {st['device']}")
    if st.get("num_states") is not None:
        seeds = f" (seeds from {st['seed_start']})" if st.get("seed_start") is not None else ""
        parts.append(f"{st['num_states']} fixed states per env{seeds}")
    if st.get("temperature") is not None:
        parts.append(f"one rollout each at temperature {st['temperature']:g}")
    if isinstance(summary.get("total_s"), (int, float)):
        cpu = summary.get("total_cpu_s")
        parts.append(f"total {summary['total_s'] / 60:.1f} min wall"
                     + (f" ({cpu / 60:.1f} CPU min)" if isinstance(cpu, (int, float)) else ""))
    if isinstance(summary.get("peak_rss_mb"), (int, float)):
        parts.append(f"peak RSS {summary['peak_rss_mb']:,.0f} MiB")
    over = [f"`--{fam}.{o}`" for fam, items in sorted((st.get("overrides") or {}).items()) for o in items]
    parts.append("overrides: " + " ".join(over) if over else "committed configs, no overrides")
    return "; ".join(parts) + "."


def demo_section(root: Path, demo_dir: Path = DEMO_DIR, title: str = "### CPU demo (`launch/demo.py`)",
                 publish_cmd: str = PUBLISH_CMD) -> list[str]:
    demo = root / demo_dir
    ev, summary = _load(demo / "eval.json"), _load(demo / "demo_summary.json") or {}
    out = [title, ""]
    if not isinstance(ev, dict) or not ev.get("results"):
        return out + [f"The demo results have not been published yet: `{publish_cmd}`.", ""]
    st = ev.get("settings") or {}
    if st.get("quick") or summary.get("quick"):
        out += ["> **Warning: `--quick` smoke run.** Reduced counts and shapes so that every part runs in a "
                "minute or two; nothing is learned. These are NOT the demo's results: republish with "
                f"`{publish_cmd}`.", ""]
    out += [_demo_settings(ev, summary), ""]

    results = ev["results"]
    cols = [k for k in DEMO_METRICS if any(k in m for envs in results.values() for m in envs.values())]
    fmt = {"num_episodes": "d"}
    out += ["| stage | env | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for stage, envs in results.items():
        for env, m in envs.items():
            out.append(f"| {stage} | {env} | " + " | ".join(_num(m.get(k), fmt.get(k, ".3f")) for k in cols) + " |")
    out.append("")

    stages = summary.get("stages") or {}
    if stages:
        out += ["| stage | train s | train CPU s | eval s | eval CPU s |", "|---|---|---|---|---|"]
        for stage, t in stages.items():
            out.append(f"| {stage} | " + " | ".join(_num(t.get(k), ".1f") for k in
                                                   ("train_s", "train_cpu_s", "eval_s", "eval_cpu_s")) + " |")
        out.append(f"| **total** | {_num(summary.get('total_s'), '.1f')} | {_num(summary.get('total_cpu_s'), '.1f')} "
                   f"| | |")
        out += ["", "The total includes start-up and compilation outside the stages; peak RSS "
                f"{_num(summary.get('peak_rss_mb'), ',.0f')} MiB. CPU seconds count every thread of the process "
                "(on a shared, loaded machine they say more than the wall times).", ""]

    targets = summary.get("targets") or {}
    if targets:
        with_k = any("k_sample" in t for t in targets.values())
        out += ["| target | value | goal | result | paired: before -> after (states) | flips gained / lost | "
                "McNemar p |" + (" k rollouts per state: gain [95% CI], p |" if with_k else ""),
                "|---|---|---|---|---|---|---|" + ("---|" if with_k else "")]
        for label, t in targets.items():
            res = "reached" if t.get("reached") else "**NOT reached**"
            if "p_value" in t:
                paired = (f"{_num(t.get('before'), '.3f')} -> {_num(t.get('after'), '.3f')} ({t.get('states', '-')})",
                          f"{t.get('gained', '-')} / {t.get('lost', '-')}", _num(t.get("p_value"), ".2g"))
            else:
                paired = ("-", "-", "-")
            out.append(f"| {label} | {_num(t.get('value'), '+.3f' if 'p_value' in t else '.3f')} | "
                       f"{_num(t.get('target'), '.2f')} | {res} | " + " | ".join(paired) + " |"
                       + (f" {_k_cell(t.get('k_sample'))} |" if with_k else ""))
        out += ["", "A gain is RL's change over its warm start on the same states with the same sampling key: "
                "the states that flipped each way, and the exact McNemar p-value (two-sided binomial test on "
                "the flipped states, `ragen_jax/evaluation/paired.py`)"
                + ("; the last column evaluates both stages again with k rollouts per state and compares the "
                   "per-state success rates (exact paired permutation test, bootstrap 95% interval of the mean gain)"
                   if with_k else "") + ".", ""]

    # Only the curves that were published: a name in the summary whose PNG is missing would be a broken image.
    pngs = [Path(c).name for c in summary.get("curves") or []]
    pngs = [n for n in pngs if (demo / n).is_file()]
    if pngs:
        rel = demo_dir.relative_to(BENCHMARKS.parent).as_posix()
        out += [f"![{Path(n).stem}]({rel}/{n})" for n in pngs] + [""]
    return out


def render(root: Path = ROOT) -> str:
    res = root / "bench" / "results"
    lines = [START, "(generated by `python scripts/readme_results.py` from `bench/results/*.json`, `docs/demo_results/` and "
             "`docs/pretrained_results/`; "
             "do not edit)", ""]
    lines += sampler_section(_load(res / "sampler.json"))
    lines += rollout_section(_load(res / "rollout.json"))
    lines += decode_fill_section(_load(res / "decode_fill.json"))
    lines += rl_iteration_section(_load(res / "rl_iteration.json"))
    lines += collapse_probe_section(_load(res / "collapse_probe.json"))
    lines += evaluation_section(_load(res / "evaluation.json"))
    lines += memory_section(_load(res / "memory.json"))
    lines += qlora_memory_section(_load(res / "memory_qlora.json"), _load(res / "memory.json"))
    lines += card_section(_load(res / "memory.json"), _load(res / "memory_qlora.json"))
    lines += qlora_greedy_section(_load(res / "qlora_greedy.json"))
    lines += qlora_speed_section(_load(res / "qlora_speed.json"))
    lines += train_step_section(_load(res / "train_step.json"))
    lines += sft_step_section(_load(res / "sft_step.json"))
    lines += sft_step_section(_load(res / "sft_step_smollm2_bandit.json"))
    lines += turn_blocks_section(_load(res / "turn_blocks.json"))
    lines += gpu_section([_load(f) for f in sorted(res.glob("gpu_*.json"))])
    lines += gpu_runs_section(res)
    lines += gpu_learn_section(res)
    lines += envs_section(_load(res / "envs.json"))
    lines += sokoban_section(_load(res / "sokoban_difficulty.json"))
    lines += env_rules_section(_load(res / "env_rules.json"))
    lines += demo_section(root)
    if (draws := draws_section(_load(root / DEMO_DIR / "draws.json"))):
        lines += ["#### The demo's draws (`scripts/demo_draws.py`)", "", *draws,
                  *alone_sentence(_load(root / DEMO_DIR / "alone.json")),
                  "The run above is the lowest seed's; each draw's outcome and cost is in `docs/demo_results/draws.json`.", ""]
    lines += pretrained_sections(root)
    lines.append(END)
    return "\n".join(lines)


def _paired_rows(root: Path, demo_dir: Path, policy: str) -> list[str]:
    summary = _load(root / demo_dir / "demo_summary.json") or {}
    where = f"{summary.get('cpu_count', '?')}-core {summary.get('cpu_model') or 'CPU'}"
    if isinstance(summary.get("total_s"), (int, float)):
        where += f", {summary['total_s'] / 60:.0f} min"
    rows = []
    for label, t in (summary.get("targets") or {}).items():
        if "p_value" not in t:
            continue
        env = (label.split("(", 1)[-1].rstrip(")") if "(" in label else label).removesuffix(" success")
        rows.append(f"| {policy} | {env} | {_num(t.get('before'), '.3f')} -> {_num(t.get('after'), '.3f')} | "
                    f"{t.get('states', '-')} | {t.get('gained', '-')} / {t.get('lost', '-')} | "
                    f"{_num(t.get('p_value'), '.2g')} | {_k_cell(t.get('k_sample'))} | {where} |")
    return rows


def _gpu_learn_rows(res: Path) -> list[str]:
    """The README's rows of scripts/gpu_learn.sh runs (not rehearsals): the k-sample comparison only."""
    rows = []
    for date, dev, env, r in _gpu_learn_envs(res):
        pc = r.get("paired")
        if pc:
            rows.append(f"| SmolLM2-135M-Instruct, {r['rl']['iterations']} RL iterations of RAGEN's settings | "
                        f"{env} | - | {pc['states']} | - | - | {_k_cell(pc)} | {dev}, {date} |")
    return rows


def _gpu_sentence(files: list) -> list[str]:
    rows = [d["summary"] for d in files if d and d.get("summary") and not d["summary"].get("rehearsal")]
    if not rows:
        return []
    r = rows[-1]
    return [f"One RL iteration of `configs/sokoban.py` at {r.get('iteration_preset', 'qwen2.5-0.5b')} on an "
            f"{r.get('device_kind', 'GPU')}: rollout {_fmt(r.get('rollout_s'), '.1f')} s, prepare "
            f"{_fmt(r.get('prepare_s'), '.2f')} s, update {_fmt(r.get('update_s'), '.2f')} s (MFU "
            f"{_fmt(r.get('update_mfu'), '.1%')}); peak {_fmt(r.get('iteration_peak_gib'), '.1f')} GiB against the "
            f"Trainer's estimate of {_fmt(r.get('iteration_estimate_gib'), '.1f')} GiB.", ""]


DRAWS_CMD = "python scripts/demo_draws.py --draws 5 --workdir runs/draws --publish docs/demo_results"


def _spread_cell(d: dict, scale: float = 100.0, fmt: str = "+.1f") -> str:
    """min / median / max of a `recipes.draws` spread, in points by default."""
    return " / ".join(format(scale * d[k], fmt) for k in ("min", "median", "max")) if d else "-"


def draws_section(doc: dict | None) -> list[str]:
    """The demo's draws (docs/demo_results/draws.json, scripts/demo_draws.py) as one row per family: the
    distribution of RL's gain over its warm start, not one draw."""
    if not doc or not doc.get("families"):
        return []
    m, costs = doc.get("machine") or {}, doc.get("costs") or {}
    t = costs.get("total_s") or {}
    when = f", {t['median'] / 60:.0f} min per draw (median; {t['min'] / 60:.0f}-{t['max'] / 60:.0f})" if t else ""
    if doc.get("parallel", 1) > 1 and t:
        when += f" with {doc['parallel']} draws at a time sharing the cores (not a draw's time alone)"
    out = [f"The tiny demo's draws: {len(doc.get('draws', []))} runs of `launch/demo.py --seed S` (S = "
           f"{', '.join(str(r['seed']) for r in doc.get('draws', []))}) at commit {doc.get('commit', '?')}, "
           f"{'alone ' if doc.get('parallel', 1) == 1 else ''}on a "
           f"{m.get('cpu_count', '?')}-core {m.get('cpu_class') or 'CPU'}{when} (`{doc.get('command', DRAWS_CMD)}`; "
           "`docs/demo_results/draws.json`). Gains in points of success, min / median / max over the draws:", "",
           "| env | warm start -> RL success (median) | gain, 1 rollout per state | gain, k rollouts per state | "
           "draws with a significant gain |", "|---|---|---|---|---|"]
    for family, s in doc["families"].items():
        kb, ka = s.get("k_before"), s.get("k_after")
        rates = (f"{s['before']['median']:.3f} -> {s['after']['median']:.3f}" +
                 (f" (k: {kb['median']:.3f} -> {ka['median']:.3f})" if kb and ka else ""))
        k = s.get("samples_per_state", 1)
        test = "paired permutation test, k" if s.get("k_gain") else "McNemar"
        out.append(f"| {s['env']} | {rates} | {_spread_cell(s['gain'])} | "
                   f"{_spread_cell(s.get('k_gain')) + f' (k = {k})' if s.get('k_gain') else '-'} | "
                   f"{s['significant']} of {s['draws']} (p < {s['alpha']:g}, {test}) |")
    return out + [""]


def alone_sentence(doc: dict | None) -> list[str]:
    """The main job's time alone (docs/demo_results/alone.json): one draw from a fresh clone with nothing
    else on the machine, the number a newcomer compares their own run with."""
    if not doc:
        return []
    m, w = doc.get("machine") or {}, round(doc["wall_s"])
    same = (" Its outcomes equal the published draw of that seed, state by state." if doc.get("identical_to_published_draw")
            else "")
    return [f"The main job alone (seed {doc['seed']}, fresh clone of {doc['commit']} in a fresh venv, "
            f"{doc['date']}): {w // 60}:{w % 60:02d} wall, {doc['cpu_s']:,.0f} CPU s, peak "
            f"{doc['peak_rss_mb'] / 1024:.1f} GB RSS on a {m.get('cpu_count', '?')}-core "
            f"{m.get('cpu_class') or 'CPU'} (`docs/demo_results/alone.json`).{same}", ""]


def summary(root: Path = ROOT) -> str:
    """The README's short results block: the demo's draws, then each RL stage against its warm start on
    the same states."""
    draws = _load(root / DEMO_DIR / "draws.json")
    rows = [] if draws else _paired_rows(root, DEMO_DIR, "tiny, from scratch")
    for family in PRETRAINED_FAMILIES:
        if (root / PRETRAINED_DIR / family / "demo_summary.json").is_file():
            rows += _paired_rows(root, PRETRAINED_DIR / family, "SmolLM2-135M-Instruct")
    for folder, (label, _) in PRETRAINED_ADAPTER_RUNS.items():
        if (root / PRETRAINED_DIR / folder / "demo_summary.json").is_file():
            rows += _paired_rows(root, PRETRAINED_DIR / folder, label)
    rows += _gpu_learn_rows(root / "bench" / "results")
    lines = [SUMMARY_START, "(generated by `python scripts/readme_results.py`; do not edit)", ""]
    lines += draws_section(draws)
    lines += alone_sentence(_load(root / DEMO_DIR / "alone.json"))
    if rows:
        lines += ["| policy | env | warm start -> RL success | states | flips gained / lost | McNemar p | "
                  "k rollouts per state: before -> after, gain [95% CI], p | machine |",
                  "|---|---|---|---|---|---|---|---|", *rows, ""]
    else:
        lines += [] if draws else [f"The demo results have not been published yet: `{PUBLISH_CMD}`.", ""]
    lines += _gpu_sentence([_load(f) for f in sorted((root / "bench" / "results").glob("gpu_*.json"))])
    lines.append(SUMMARY_END)
    return "\n".join(lines)


def _splice(text: str, start: str, end: str, block: str) -> str | None:
    if start not in text or end not in text:
        return None
    head, rest = text.split(start, 1)
    return head + block + rest.split(end, 1)[1]


def rewritten(root: Path = ROOT) -> dict:
    """{path: (current text, regenerated text)} of the two files holding generated blocks."""
    out = {}
    for rel, start, end, block in ((BENCHMARKS, START, END, render(root)),
                                   (Path("README.md"), SUMMARY_START, SUMMARY_END, summary(root))):
        text = (root / rel).read_text()
        new = _splice(text, start, end, block)
        if new is None:
            raise ValueError(f"{rel} has no {start} ... {end} markers; put them back where the generated block goes")
        out[root / rel] = (text, new)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        files = rewritten()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    stale = [p for p, (old, new) in files.items() if old != new]
    if "--check" in argv:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run python scripts/readme_results.py", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(files[p][1])
    print("regenerated: " + (", ".join(str(p.relative_to(ROOT)) for p in stale) or "nothing changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
