"""What the `launch/` entry points share: arguments, multi-host start-up, one-line errors."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable
from ragen_jax.trainer.config import ConfigError, load_config


def maybe_init_distributed() -> None:
    """Multi-host TPU/GPU launches set these variables; a single host needs nothing."""
    markers = ("TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS", "MEGASCALE_COORDINATOR_ADDRESS")
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if any(os.environ.get(m) for m in markers) and (not hosts or "," in hosts or os.environ.get("JAX_COORDINATOR_ADDRESS")):
        import jax

        jax.distributed.initialize()


def parse_run_args(doc: str, argv=None, workdir_help: str = "run directory"):
    """`--config NAME --workdir DIR [--quiet] [--config.a.b=value ...]` -> (args, overrides)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config file: a bare name in configs/ (sokoban.py) or a path")
    p.add_argument("--workdir", required=True, help=workdir_help)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args, rest = p.parse_known_args(argv)
    bad = [r for r in rest if not r.startswith("--config.")]
    if bad:
        p.error(f"unrecognised arguments {bad}; config overrides look like --config.section.key=value")
    return args, rest


def run_config_job(doc: str, argv, job: Callable, workdir_help: str = "run directory") -> int:
    """Load the config, start multi-host if needed, run `job(cfg, args)`; bad input -> one line, exit 2."""
    args, overrides = parse_run_args(doc, argv, workdir_help)

    try:
        cfg = load_config(args.config, overrides)
        maybe_init_distributed()
        runner = job(cfg, args)
    except (ConfigError, FileNotFoundError, NotADirectoryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # CheckpointError and friends: one line, no XLA traceback
        if type(e).__name__ in ("CheckpointError", "EvalError"):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    if runner is not None:
        runner()
    return 0
