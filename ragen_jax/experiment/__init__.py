"""Stage 6, experiment assembly: the config and the parts a run is built from.

- `config`: `Config` and its sections, `load_config` (configs/ + dotted overrides), `ConfigError`.
- `build`: the pieces (`build_mesh`, `load_task_tokenizer`, `build_text_envs`, `build_vocab`,
  `build_policy`, `init_policy_params`, `check_run_dir_config`, `prompt_for_env`).
- `cli`: the launchers' shared command line (`run_config_job`: load the config after joining the
  cluster, take the run lock, turn bad input into one line and exit code 2).
- `assembly`: `RunAssembly`, the one set-up both trainers run (trainer/rl.py, trainer/sft.py).
"""
