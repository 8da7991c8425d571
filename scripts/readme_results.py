"""Regenerate the README's results section from the files benchmarks and the demo write.

    python scripts/readme_results.py            # rewrites README.md between the results markers

Nothing here is typed by hand: every number comes from bench/results/*.json (and runs/demo/ when
the CPU demo has been run), with the machine each was measured on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- results:start -->", "<!-- results:end -->"


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
    if load:
        s += f", load average {load[0]:.1f} while measuring (shared machine)"
    return s


def sampler_section(d) -> list[str]:
    if not d:
        return []
    out = ["### Decode speed (`bench/sampler.py`)", "",
           f"Greedy decode, prompt {d['rows'][0].get('prompt_len')} ids, {d['rows'][0].get('new_tokens')} new tokens, "
           f"random weights, f32; {_machine(d.get('machine', {}))}. Ours vs transformers' PyTorch `generate` on the "
           "same weights in the same run.", "",
           "| shape | batch | ours tok/s | PyTorch tok/s | ratio | same greedy tokens |", "|---|---|---|---|---|---|"]
    for r in d["rows"]:
        torch, ratio = r.get("torch_tok_s"), r.get("ratio_ours_over_torch")
        torch_s = "-" if torch is None else f"{torch:,.0f}"
        ratio_s = "-" if ratio is None else f"{ratio:.2f}x"
        out.append(f"| {r['shape']} | {r['batch']} | {r['ours_tok_s']:,.0f} | {torch_s} | {ratio_s} | "
                   f"{r.get('greedy_tokens_equal_frac', '-')} |")
    return out + [""]


def envs_section(d) -> list[str]:
    if not d:
        return []
    out = ["### Environment steps (`bench/envs.py`)", "",
           f"One step = {d['settings'].get('step_definition', 'step + render_ids + parse')}. Baseline: "
           f"{d['settings'].get('numpy_step_definition', 'numpy implementation')}. {_machine(d.get('machine', {}))}.", "",
           "| env | batch | jax steps/s | numpy steps/s | ratio |", "|---|---|---|---|---|"]
    for r in d.get("steps", []):
        out.append(f"| {r['env']} | {r['batch']} | {r['jax_steps_per_s']:,.0f} | {r['numpy_steps_per_s']:,.0f} | "
                   f"{r['ratio']:.1f}x |")
    resets = d.get("resets", [])
    if resets:
        out += ["", "| rooms generated | batch | jax rooms/s | host generator rooms/s |", "|---|---|---|---|"]
        for r in resets:
            host = r.get("numpy_rooms_per_s")
            host_s = "-" if host is None else f"{host:,.0f}"
            out.append(f"| {r['env']} | {r['batch']} | {r['jax_rooms_per_s']:,.0f} | {host_s} |")
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
           "whole conversation re-encoded each turn) in the same run.", "",
           "| shape | vocab | P x N x turns x tokens | s / rollout | generated tok/s | episodes/s | host loop s | ratio |",
           "|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        host = r.get("host") if isinstance(r.get("host"), dict) else {}
        ratio = r.get("ratio_generated_tok_s_ours_over_host")
        out.append(f"| {r['shape']} | {r['vocab']} | {r['groups']}x{r['group_size']}x{r['turns']}x{r['max_response_tokens']} | "
                   f"{r['median_s_per_rollout']:.1f} | {r['generated_tok_s']:,.0f} | {r['episodes_per_s']:.2f} | "
                   f"{host.get('median_s_per_rollout', '-')} | {'-' if ratio is None else f'{ratio:.1f}x'} |")
    return out + [""]


def train_step_section(d) -> list[str]:
    if not d or not d.get("rows"):
        return []
    out = ["### PPO update (`bench/train_step.py`)", "",
           f"prepare (no-grad log-probs) + one clipped-PPO AdamW step over K trajectories of T tokens, f32; "
           f"{_loads(d)}. Baseline: the same step with transformers' PyTorch Qwen2 in the same run.", "",
           "| shape | K x T | ours tok/s | PyTorch tok/s | ratio |", "|---|---|---|---|---|"]
    for r in d["rows"]:
        torch = (r.get("torch") or {}).get("tok_s")
        ratio = r.get("ratio_ours_over_torch")
        out.append(f"| {r['shape']} | {r['rows']}x{r['seq_len']} | {r['tok_s']:,.1f} | "
                   f"{'-' if torch is None else f'{torch:,.1f}'} | {'-' if ratio is None else f'{ratio:.2f}x'} |")
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


def demo_section(root: Path) -> list[str]:
    demo = root / "runs" / "demo"
    ev, summary = _load(demo / "eval.json"), _load(demo / "demo_summary.json")
    if not ev:
        return []
    out = ["### CPU demo (`launch/demo.py`)", ""]
    if summary:
        out.append("Wall time and peak memory: " + ", ".join(f"{k} {v}" for k, v in summary.items()
                                                            if not isinstance(v, (dict, list))))
        out.append("")
    out += ["```", json.dumps(ev, indent=1)[:4000], "```", ""]
    return out


def render(root: Path = ROOT) -> str:
    res = root / "bench" / "results"
    lines = [START, "(generated by `python scripts/readme_results.py` from `bench/results/*.json`; do not edit)", ""]
    lines += sampler_section(_load(res / "sampler.json"))
    lines += rollout_section(_load(res / "rollout.json"))
    lines += train_step_section(_load(res / "train_step.json"))
    lines += envs_section(_load(res / "envs.json"))
    lines += sokoban_section(_load(res / "sokoban_difficulty.json"))
    lines += demo_section(root)
    lines.append(END)
    return "\n".join(lines)


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        print(f"README.md has no {START} ... {END} markers", file=sys.stderr)
        return 2
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(head + render() + tail)
    print("README.md results section regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
