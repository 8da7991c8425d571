"""Train a RAGEN agent with StarPO / StarPO-S.

    python launch/tpu_train.py --config sokoban.py --workdir runs/sokoban \
        --config.model.path=/path/to/Qwen2.5-0.5B-Instruct [--config.filter.value=0.5 ...]

Configs are Python files in configs/ (bare name) or a path. Rerunning the same command resumes from
the last complete checkpoint in --workdir; a second launch into a run directory that a live run
holds (<workdir>/run.lock) is refused.

Several processes (README "Several hosts"): run the same command in every process. On a TPU pod
slice (`gcloud compute tpus tpu-vm ssh NAME --worker=all --command="..."`), under SLURM's `srun` or
Open MPI's `mpirun` the cluster is joined by itself; anywhere else give every process
--coordinator-address HOST:PORT --num-processes N --process-id I (or JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID). --workdir must be one directory all processes see (a bucket
gs://... or a shared file system); only process 0 writes logs. A process that dies makes the others
exit with an error within --heartbeat-timeout seconds.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # before jax is imported: glibc malloc huge pages (why and when: ragen_jax/runtime.py)
    from ragen_jax.runtime import use_transparent_hugepages

    use_transparent_hugepages()

from ragen_jax.experiment.cli import run_config_job  # noqa: E402


def _job(cfg, args):
    # Imported after the cluster is joined (run_config_job): the trainer imports the environments, which
    # start JAX's backend, and jax.distributed.initialize must come before that.
    from ragen_jax.trainer.rl import Trainer

    return Trainer(cfg, args.workdir, quiet=args.quiet).train  # built (and checked) before it runs


def main(argv=None) -> int:
    return run_config_job(__doc__, argv, _job, workdir_help="run directory: checkpoints, TensorBoard (tb/), metrics.jsonl")


if __name__ == "__main__":
    sys.exit(main())
