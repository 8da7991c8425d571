"""Stage 8, the trainers and their compiled steps.

- `rl`: `Trainer` (StarPO / StarPO-S: rollout -> filter -> PPO/GRPO update, validation, resume).
- `sft`: `SFTTrainer` (warm start on teacher demonstrations).
- `step`: `StepPrograms` (the compiled prepare and update), `TrainState`, log-prob/value passes.
- `memory`: the compiled programs' memory accounting and the fail-before-running check.
- `turn_blocks`: single-turn records scored block by block (`TurnBlocks`, `over_taken_blocks`).
- `optim`: `make_optimizer`; `collapse`: `CollapseProbe`, `EchoTrapMonitor`, `EarlyStops`.
"""
