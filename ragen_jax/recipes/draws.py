"""Draws of the CPU demo: one commit run with several seeds, its outcome read as a distribution.

A draw is one `launch/demo.py --seed S` run: the seed moves the recipe's own randomness (the model's
initialisation, the warm start's batch order, the RL stage's sampling keys) while the demonstrations,
the evaluation states and the evaluation key stay fixed. A run is deterministic per machine class and
commit but not across classes (XLA picks its CPU kernels by instruction set, and thousands of
optimizer steps amplify the rounding into another trajectory), so what the project publishes is the
distribution over draws on a named CPU class, never one draw.

- `draw_record(workdir)`: one finished demo directory -> its record (seed, per-family outcome, costs).
- `summarise(records)`: per family, min / median / max of the gain (one rollout per state and k per
  state), of the rates before and after RL, and how many draws are significant.
- `landing_lines(published, targets, ...)`: where a new run lands against a published distribution.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

# A draw counts as significant when its paired test (the k-sample one where there is one) gives
# p below this and the gain is positive (issue 55's bar for Sokoban).
SIGNIFICANCE = 0.01
# The published distribution, beside a source checkout (written by scripts/demo_draws.py --publish).
PUBLISHED_DRAWS = Path(__file__).resolve().parents[2] / "docs" / "demo_results" / "draws.json"


GAIN_LABEL = ": RL gain over warm start ("  # recipes.demo.check_targets' "<family>: RL gain over warm start (<env> success)"


def gain_targets(targets: dict):
    """(family, env, target) of each RL-gain entry of a demo's targets (recipes.demo.check_targets)."""
    for label, t in targets.items():
        if "p_value" in t and GAIN_LABEL in label:
            family, rest = label.split(GAIN_LABEL, 1)
            yield family, rest.rsplit(" ", 1)[0], t


def _outcome(t: dict) -> dict:
    """A gain target of demo_summary.json (recipes.demo.check_targets) -> the draw's outcome of that family."""
    out = {k: t[k] for k in ("before", "after", "gained", "lost", "p_value", "states") if k in t}
    out["gain"] = t["value"]
    k = t.get("k_sample")
    if k:
        out["k_sample"] = {"samples_per_state": k["samples_per_state"], "before": k["before"], "after": k["after"],
                           "gain": k["change"], "ci95": list(k["ci95"]), "p_value": k["p_value"]}
    return out


def draw_record(workdir: str | Path) -> dict:
    """The record of one finished demo directory (its demo_summary.json and eval.json)."""
    d = Path(workdir)
    try:
        summary = json.loads((d / "demo_summary.json").read_text())
        settings = json.loads((d / "eval.json").read_text()).get("settings", {})
    except (OSError, ValueError) as e:
        raise ValueError(f"{d} holds no finished demo run (demo_summary.json / eval.json: {e})") from None
    families = {family: {"env": env, **_outcome(t)} for family, env, t in gain_targets(summary.get("targets") or {})}
    return {"seed": summary.get("seed", settings.get("seed", 0)), "workdir": d.name,
            "total_s": summary.get("total_s"), "total_cpu_s": summary.get("total_cpu_s"),
            "peak_rss_mb": summary.get("peak_rss_mb"),
            "stages": {s: {k: v for k, v in t.items() if k.endswith("_s")} for s, t in summary.get("stages", {}).items()},
            "settings": {k: settings.get(k) for k in ("model", "quick", "num_states", "k_sample_rollouts_per_state",
                                                      "overrides")},
            "families": families}


def _spread(values: list) -> dict:
    """min / median / max of a list of numbers (None entries left out); {} when none."""
    v = [x for x in values if isinstance(x, (int, float))]
    return {"min": min(v), "median": statistics.median(v), "max": max(v)} if v else {}


def significant(outcome: dict, alpha: float = SIGNIFICANCE) -> bool:
    """A positive gain whose paired test (k-sample where there is one) gives p < alpha."""
    src = outcome.get("k_sample") or outcome
    return src["gain"] > 0 and src["p_value"] < alpha


def summarise(records: list[dict], alpha: float = SIGNIFICANCE) -> dict:
    """{family: {"env", "draws", "seeds", "gain", "before", "after", "k_gain", "k_before", "k_after",
    "significant", "alpha"}}: each rate or gain as min / median / max over the draws."""
    out = {}
    for family in dict.fromkeys(f for r in records for f in r["families"]):
        rows = [(r["seed"], r["families"][family]) for r in records if family in r["families"]]
        ks = [o.get("k_sample") or {} for _, o in rows]
        out[family] = {"env": rows[0][1]["env"], "draws": len(rows), "seeds": [s for s, _ in rows],
                       "gain": _spread([o["gain"] for _, o in rows]),
                       "before": _spread([o["before"] for _, o in rows]),
                       "after": _spread([o["after"] for _, o in rows]),
                       "k_gain": _spread([k.get("gain") for k in ks]),
                       "k_before": _spread([k.get("before") for k in ks]),
                       "k_after": _spread([k.get("after") for k in ks]),
                       "samples_per_state": max((k.get("samples_per_state", 1) for k in ks), default=1),
                       "significant": sum(significant(o, alpha) for _, o in rows), "alpha": alpha}
    return out


def publication(records: list[dict], machine: dict, commit: str, command: str) -> dict:
    """The document scripts/demo_draws.py writes: the machine, the commit, every draw and the summary."""
    costs = {"total_s": _spread([r["total_s"] for r in records]),
             "total_cpu_s": _spread([r["total_cpu_s"] for r in records]),
             "peak_rss_mb": _spread([r["peak_rss_mb"] for r in records])}
    return {"machine": machine, "commit": commit, "command": command, "costs": costs,
            "families": summarise(records), "draws": records}


def _points(x: float) -> str:
    return f"{100 * x:+.1f}"


def comparable(published: dict, settings: dict) -> bool:
    """Whether a run with these eval.json settings ran the published draws' recipe and evaluation."""
    def key(st: dict) -> tuple:
        over = {f: list(v) for f, v in (st.get("overrides") or {}).items() if v}
        return (st.get("model"), bool(st.get("quick")), st.get("num_states"), st.get("k_sample_rollouts_per_state"),
                over)

    draws = published.get("draws") or [{}]
    return key(settings) == key(draws[0].get("settings", {}))


def landing_lines(published: dict | None, targets: dict, cpu: str, comparable: bool = True) -> list[str]:
    """For each family of this run's gain targets: its gain next to the published distribution.

    `published`: a `publication` document (None: nothing published); `targets`: this run's
    check_targets; `cpu`: this machine's `cpu_class`; `comparable`: False when the run used other
    settings than the published draws (overrides, --quick, another model or evaluation size)."""
    if not published:
        return ["No published distribution of draws beside this checkout (docs/demo_results/draws.json)."]
    where = published.get("machine", {}).get("cpu_class", "?")
    n = max((s["draws"] for s in published.get("families", {}).values()), default=0)
    lines = [f"Published: {n} draws of commit {published.get('commit', '?')} on a {where}."]
    if not comparable:
        lines.append("This run's settings differ from the published draws' (overrides, --quick, model or "
                     "evaluation size): its gains are not comparable with them.")
    elif cpu != where:
        lines.append(f"This machine is a {cpu or 'CPU of unknown class'}: runs differ across CPU classes, so read "
                     "the comparison as a rough guide, not a check.")
    for family, _, t in gain_targets(targets):
        dist = published.get("families", {}).get(family)
        if not dist:
            continue
        k = t.get("k_sample")
        gain, spread, what = ((k["change"], dist["k_gain"], f"{k['samples_per_state']} rollouts per state")
                              if k and dist.get("k_gain") else (t["value"], dist["gain"], "one rollout per state"))
        lo, mid, hi = spread["min"], spread["median"], spread["max"]
        verdict = ("not placed (other settings)" if not comparable else
                   "inside the published range" if lo - 1e-9 <= gain <= hi + 1e-9 else
                   "BELOW the published range" if gain < lo else "above the published range")
        lines.append(f"{family}: gain {_points(gain)} points ({what}); published {_points(lo)} / {_points(mid)} / "
                     f"{_points(hi)} (min / median / max of {dist['draws']} draws): {verdict}")
    return lines


def load_published(path: str | Path = PUBLISHED_DRAWS) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


__all__ = ["PUBLISHED_DRAWS", "SIGNIFICANCE", "comparable", "draw_record", "landing_lines", "load_published", "publication",
           "gain_targets", "significant", "summarise"]
