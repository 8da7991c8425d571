"""Stage 5, run infrastructure: what any run stands on, independent of what it trains.

- `distributed`: joining a cluster (`start_cluster`), process-0 decisions raised everywhere
  (`on_primary`), run paths (local or gs://), the run-directory lock (`RunLock`, `acquire_run_lock`).
- `checkpoint`: Orbax checkpoints (`Checkpointer`, `CheckpointError`), the policy export (`save_policy`),
  `save_run_files`, `load_policy_params`.
- `preemption`: SIGTERM / SIGINT as a request to stop after the current iteration with a checkpoint
  (`STOP`, `PREEMPTED_EXIT`).
- `logger`: TensorBoard + metrics.jsonl (`Logger`), `read_metrics`, `plot_curves` (each iteration + a centred
  mean `smooth_window`, or the EMA `smooth_ema`; evaluations as lines or points with intervals).

infra imports nothing of the stages it serves (tests/test_import_graph.py). `distributed` imports nothing of the project: `jax.distributed.initialize` must run before the
environments (which compute at import) create JAX's backend.
"""
