"""Supervised warm start on solver demonstrations, then hand the policy to RL.

    python launch/sft.py --config sokoban.py --workdir runs/sokoban_sft \
        --config.model.path=/path/to/Qwen2.5-0.5B-Instruct [--config.sft.num_demos=1024 ...]
    python launch/tpu_train.py --config sokoban.py --workdir runs/sokoban_rl \
        --config.model.path=/path/to/Qwen2.5-0.5B-Instruct --config.model.init_from=runs/sokoban_sft

Demonstrations are generated on the device by the environment's solver (Sokoban BFS, FrozenLake
value iteration, Bandit arm choice with sft.bandit_high_prob) in the rollout's exact conversation
format; the `sft` config section sets their number, the epochs, batch size and learning rate.
Rerunning the same command resumes from the last complete checkpoint in --workdir. The final
policy is exported to <workdir>/policy. Multi-host: run the same command on every host.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _maybe_init_distributed():
    """Multi-host TPU/GPU launches set these variables; a single host needs nothing."""
    markers = ("TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS", "MEGASCALE_COORDINATOR_ADDRESS")
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if any(os.environ.get(m) for m in markers) and (not hosts or "," in hosts or os.environ.get("JAX_COORDINATOR_ADDRESS")):
        import jax

        jax.distributed.initialize()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config file: a bare name in configs/ (sokoban.py) or a path")
    p.add_argument("--workdir", required=True, help="run directory: checkpoints, TensorBoard (tb/), metrics.jsonl, policy/")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args, rest = p.parse_known_args(argv)
    bad = [r for r in rest if not r.startswith("--config.")]
    if bad:
        p.error(f"unrecognised arguments {bad}; config overrides look like --config.section.key=value")
    return args, rest


def main(argv=None) -> int:
    args, overrides = parse_args(argv)
    from ragen_jax.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, overrides)
        _maybe_init_distributed()
        from ragen_jax.sft.trainer import SFTTrainer

        trainer = SFTTrainer(cfg, args.workdir, quiet=args.quiet)
        trainer.train()
    except (ConfigError, FileNotFoundError, NotADirectoryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # CheckpointError and friends: one line, no XLA traceback
        if type(e).__name__ == "CheckpointError":
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
