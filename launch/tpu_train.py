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
exit with an error within --heartbeat-timeout seconds (default 30).

--export DIR: when training finishes, also write the policy as a Hugging Face directory (`--export-to
gguf`: a GGUF file; see launch/export.py, which exports any run or checkpoint afterwards).

SIGTERM / SIGINT (a preempted VM): the current iteration finishes, a checkpoint is written and the
run exits with status 75; the same command resumes (docs/operations.md). Exit status: 0 finished
(or stopped early by a train.stop_* rule), 75 stopped by a signal after its checkpoint, 2 bad input
(one line), 1 a failure (its traceback; the run resumes from its last complete checkpoint).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # before jax is imported: glibc malloc huge pages (why and when: ragen_jax/runtime.py)
    from ragen_jax.runtime import use_transparent_hugepages

    use_transparent_hugepages()
    from ragen_jax.infra.preemption import STOP  # before the heavy imports: SIGTERM from the first second on

    STOP.install()

from ragen_jax.experiment.cli import run_config_job  # noqa: E402


def _export_args(p) -> None:
    p.add_argument("--export", default=None, metavar="DIR",
                   help="when training finishes, write the policy there as a Hugging Face directory")
    p.add_argument("--export-to", choices=("hf", "gguf"), default="hf", help="with --export: a GGUF file instead")
    p.add_argument("--export-dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="with --export: the safetensors dtype (default: the run's parameter dtype)")


def _job(cfg, args):
    # Imported after the cluster is joined (run_config_job): the trainer imports the environments, which
    # start JAX's backend, and jax.distributed.initialize must come before that.
    from ragen_jax.infra.preemption import PREEMPTED_EXIT
    from ragen_jax.trainer.rl import Trainer

    if args.export is not None:  # a bad target fails now, not after hours of training
        _check_export_target(cfg, args)
    trainer = Trainer(cfg, args.workdir, quiet=args.quiet)  # built (and checked) before it runs

    def run() -> int:
        trainer.train()
        if trainer.interrupted:
            return PREEMPTED_EXIT
        if args.export is not None:
            _export(trainer, args)
        return 0

    return run


def _check_export_target(cfg, args) -> None:
    from ragen_jax.models.hf_export import check_new_directory, check_new_file

    if args.export_to == "hf":
        check_new_directory(args.export)
        return
    check_new_file(args.export)
    if cfg.model.vocab == "task":
        raise ValueError("--export-to gguf: a task vocabulary (model.vocab='task') cannot be held by a GGUF file (one "
                         "token per model id); export a Hugging Face directory instead")


def _export(trainer, args) -> None:
    """The trained policy (merged with LoRA; the PEFT adapter kept) as `--export`."""
    from flax import nnx

    from ragen_jax.experiment.policy_export import ADAPTER_DIR
    from ragen_jax.models.gguf import write_gguf
    from ragen_jax.models.hf_export import write_hf_directory

    model = nnx.merge(trainer.policy_graph, trainer.actor_params)
    if args.export_to == "gguf":
        out = write_gguf(model, trainer.tokenizer, args.export)
    else:
        adapter = str(trainer.workdir / ADAPTER_DIR) if trainer.lora else None
        out = write_hf_directory(model, trainer.tokenizer, args.export, dtype=args.export_dtype or model.cfg.param_dtype,
                                 vocab=trainer.vocab, adapter=adapter)
    trainer.note(f"exported the policy to {out}")


def main(argv=None) -> int:
    return run_config_job(__doc__, argv, _job, workdir_help="run directory: checkpoints, TensorBoard (tb/), metrics.jsonl",
                          more_args=_export_args)


if __name__ == "__main__":
    sys.exit(main())
