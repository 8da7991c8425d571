"""RAGEN's softmax top-p group count, transcribed from its filter (mll-lab-nu/RAGEN
ragen/trainer/rollout_filter.py, `_select_top_groups`, top_p_prob_mode "softmax", at 20daedc): the
truth for `ragen_jax.algorithms.filters`' tie rule. It runs on torch (the test extra); the counts it
gives for equal scores are stored in tests/fixtures/ragen_tied_top_p.json so CI without torch still
checks them:

    python -m tests.ragen_jax.algorithms.ref_ragen_top_p      # rewrites the fixture (needs torch)
"""

from __future__ import annotations

import json
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "ragen_tied_top_p.json"
# Every top_p value RAGEN's configs, scripts and guides use (0.98 ... 0.25), and j/32.
VALUES = tuple(dict.fromkeys((0.98, 0.95, 0.9, 0.8, 0.6, 0.5, 0.4, 0.25) + tuple(j / 32 for j in range(1, 32))))
MAX_GROUPS = 64


def ragen_softmax_top_p(scores, value: float) -> int:
    """How many groups RAGEN keeps (filter_type "largest", every group a candidate)."""
    import torch  # the test extra only: the fixture carries its answers where torch is absent

    scores = torch.tensor(scores).float()
    probs = torch.softmax(scores, dim=0)
    sorted_probs, _ = torch.sort(probs, descending=True)
    cumulative_probs = torch.cumsum(sorted_probs, dim=0)
    cutoff_index = torch.searchsorted(cumulative_probs, value).item()
    return min(cutoff_index + 1, scores.numel())


def tied_counts() -> dict[str, list[int]]:
    """{repr(value): [kept of n equal groups for n = 1..MAX_GROUPS]} by RAGEN's code."""
    return {repr(v): [ragen_softmax_top_p([0.0] * n, v) for n in range(1, MAX_GROUPS + 1)] for v in VALUES}


def main() -> None:
    import torch

    source = f"RAGEN ragen/trainer/rollout_filter.py @20daedc, softmax top-p, torch {torch.__version__} CPU"
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in tied_counts().items())
    FIXTURE.write_text(f'{{"source": {json.dumps(source)},\n "counts": {{\n{rows}\n}}}}\n')
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
