"""Train a RAGEN agent with StarPO / StarPO-S.

    python launch/tpu_train.py --config sokoban.py --workdir runs/sokoban \
        --config.model.path=/path/to/Qwen2.5-0.5B-Instruct [--config.algo.filter_ratio=0.5 ...]

Configs are Python files in configs/ (bare name) or a path. Rerunning the same command resumes from
the last complete checkpoint in --workdir. On a TPU pod slice, run the same command on every host
(`gcloud compute tpus tpu-vm ssh NAME --worker=all --command="..."`): jax.distributed is initialised
automatically and only process 0 writes logs.
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
    p.add_argument("--workdir", required=True, help="run directory: checkpoints, TensorBoard (tb/), metrics.jsonl")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
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
        from ragen_jax.training.checkpoint import CheckpointError
        from ragen_jax.training.loop import Trainer

        trainer = Trainer(cfg, args.workdir, quiet=args.quiet)
    except (ConfigError, FileNotFoundError, NotADirectoryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # CheckpointError and friends: one line, no XLA traceback
        if type(e).__name__ == "CheckpointError":
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
