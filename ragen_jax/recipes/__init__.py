"""Stage 9, recipes: whole experiments built from the trainers and evaluation, used by launch/,
scripts/ and bench/ as a library.

Public API: `ragen_jax.recipes.demo` (the CPU demo: `main`, `run_family`, `stage_configs`,
`StageEvaluator`, `check_targets`, `publish_results` and its configs and settings).
"""
