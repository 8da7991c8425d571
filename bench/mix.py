"""Cost of a mixed-environment batch (`env.mix`, ragen_jax/text/mix.py) next to single-env batches.

The same model, vocabulary, batch shape and sampling for three compiled rollouts: all groups Sokoban,
all groups FrozenLake, and the mix (half the groups each). Per row: compile time (first call minus
the median call), median seconds per rollout over `--repeats` calls, the shared prefix that is
prefilled once, and the segment width S every turn's prefill pays (a mix pays the largest member's,
and its turn-1 segments carry each member's rest of the prompt). Random weights, temperature 1.

Usage: python -m bench.mix [--shape tiny] [--groups 4 --group-size 4 --turns 2 --max-response-tokens 24]
       [--repeats 3] [--out bench/results/mix.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


import jax
import numpy as np
from flax import nnx

from bench.common import machine, write_result

RESULTS = Path(__file__).resolve().parent / "results" / "mix.json"


def run(shape: str, groups: int, group_size: int, turns: int, max_new: int, repeats: int, out: Path) -> dict:
    from ragen_jax.models import Qwen2, Qwen2Config
    from ragen_jax.rollout import Rollout, RolloutConfig, group_seeds_for_iteration
    from ragen_jax.text.tokenizer import load_tokenizer
    from ragen_jax.experiment.config import Config
    from ragen_jax.experiment.build import build_text_envs, build_vocab

    if groups % 2:
        raise SystemExit(f"--groups must be even (half of them each env in the mix), got {groups}")
    tok = load_tokenizer()
    cfg = Config()
    cfg.model.random_init, cfg.model.preset, cfg.model.vocab = True, shape, "task"
    cfg.prompt.max_turns, cfg.prompt.max_response_tokens = turns, max_new
    cfg.rollout.num_groups, cfg.rollout.group_size = groups, group_size
    cfg.env.mix = f"Sokoban:{groups // 2},FrozenLake:{groups // 2}"
    cfg.env.validate()  # the mix alone (the algorithm sections are not used here)
    envs = build_text_envs(cfg, tok)
    vocab = build_vocab(cfg, envs, tok)  # one vocabulary (both envs' ids) for all three rows
    model = Qwen2(Qwen2Config.from_preset(shape).replace(vocab_size=vocab.size), rngs=nnx.Rngs(0))
    params = nnx.state(model)
    max_context = max(len(te.prefix_ids) + turns * (int(te.max_segment_len) + max_new) + 8 for te in envs.values())
    rcfg = RolloutConfig(num_groups=groups, group_size=group_size, max_context=max_context, temperature=1.0)
    result = {"settings": {"shape": shape, "groups": groups, "group_size": group_size, "turns": turns,
                           "max_response_tokens": max_new, "max_context": max_context, "repeats": repeats,
                           "vocab_size": int(vocab.size)},
              "machine": machine(), "rows": []}
    for label in ("Sokoban", "FrozenLake", cfg.env.train_key):
        te = envs[label]
        ro = Rollout(model, te, rcfg, vocab=vocab)

        def call(i):
            traj = ro(params, jax.random.PRNGKey(i), group_seeds_for_iteration(i, groups))
            jax.block_until_ready(traj.tokens)
            return traj

        t0 = time.perf_counter()
        call(0)
        first = time.perf_counter() - t0
        times, gen = [], []
        for i in range(repeats):
            t0 = time.perf_counter()
            traj = call(i + 1)
            times.append(time.perf_counter() - t0)
            gen.append(int(np.sum(np.asarray(traj.response_length))))
        med = statistics.median(times)
        row = {"env": label, "prefix_tokens": len(te.prefix_ids), "segment_width": int(te.max_segment_len),
               "compile_s": round(max(first - med, 0.0), 2), "first_call_s": round(first, 2),
               "s_per_rollout": [round(t, 3) for t in times], "median_s_per_rollout": round(med, 3),
               "generated_tokens": gen[-1], "generated_tok_s": round(gen[-1] / med, 1)}
        result["rows"].append(row)
        print(row, flush=True)
        write_result(result, out)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny")
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--max-response-tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    run(a.shape, a.groups, a.group_size, a.turns, a.max_response_tokens, a.repeats, a.out)


if __name__ == "__main__":
    main()
