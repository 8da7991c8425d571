"""Supervised warm start on solver demonstrations, then hand the policy to RL.

    python launch/sft.py --config sokoban.py --workdir runs/sokoban_sft \
        --config.model.path=/path/to/Qwen2.5-0.5B-Instruct [--config.sft.num_demos=1024 ...]
    python launch/tpu_train.py --config sokoban.py --workdir runs/sokoban_rl \
        --config.model.path=/path/to/Qwen2.5-0.5B-Instruct --config.model.init_from=runs/sokoban_sft

Demonstrations are generated on the device by the environment's solver (Sokoban BFS, FrozenLake
value iteration, Bandit arm choice with sft.bandit_high_prob) in the rollout's exact conversation
format; the `sft` config section sets their number, the epochs, batch size and learning rate.
Rerunning the same command resumes from the last complete checkpoint in --workdir. The final
policy is exported to <workdir>/policy. SIGTERM / SIGINT: the current step finishes, a checkpoint is
written, exit 75 (docs/operations.md). Several processes: run the same command in every process,
with the cluster flags of launch/tpu_train.py where no cluster manager provides them.
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
    from ragen_jax.infra.preemption import PREEMPTED_EXIT
    from ragen_jax.trainer.sft import SFTTrainer

    trainer = SFTTrainer(cfg, args.workdir, quiet=args.quiet)  # built (and checked) before it runs

    def run() -> int:
        trainer.train()
        return PREEMPTED_EXIT if trainer.interrupted else 0  # 75: stopped by SIGTERM / SIGINT after a checkpoint

    return run


def main(argv=None) -> int:
    return run_config_job(__doc__, argv, _job, workdir_help="run directory: checkpoints, TensorBoard (tb/), metrics.jsonl, policy/")


if __name__ == "__main__":
    sys.exit(main())
