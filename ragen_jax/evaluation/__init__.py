"""Stage 7, evaluation: policies from any source, evaluated on fixed states, compared pairwise.

- `policies`: `load_for_eval` / `load_source` (a run directory, a Hugging Face directory or
  `preset:NAME`), `LoadedPolicy`, `EvalError`.
- `suite`: `evaluate` (compiled rollouts cached per policy graph), `validate_run` /
  `log_validation` (the trainers' validation), `format_table`, `write_eval_json`, `DEFAULT_SUITE`.
- `paired`: `paired_change`, `mcnemar_exact` (two evaluations on the same states).
"""
