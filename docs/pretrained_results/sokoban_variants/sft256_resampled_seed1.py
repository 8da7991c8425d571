"""The paired evaluation's noise floor: the warm start evaluated again with another sampling key
(seed 1) on the same 128 states, compared state by state with the cached seed-0 evaluation."""
import json, os, sys, time
from absl import logging as absl_logging
from ragen_jax.experiment.config import load_config
from ragen_jax.recipes.demo import StageEvaluator
from ragen_jax.evaluation.paired import paired_change
from ragen_jax.trainer.rl import Trainer
absl_logging.set_verbosity(absl_logging.ERROR)
sft, out = "/work/runs/v36/sft256", "/work/runs/v37/noise"
cfg = load_config("smollm2_sokoban.py", ["rollout.num_groups=8", "batching.mini_batch_size=16",
                                         "batching.micro_batch_size=4", f"model.init_from={sft}"])
rl = Trainer(cfg, out, quiet=True)
before = json.load(open("/work/runs/v36/sokoban_before.json"))
res = {}
for seed in (1,):
    t0 = time.perf_counter()
    again = StageEvaluator(rl, ("Sokoban",), 128, seed=seed)(rl.state.actor)["Sokoban"]
    pc = paired_change(before["state_success"], again["state_success"])
    res[seed] = {"success": again["success"], "format_ok": again["format_ok"], **pc, "eval_s": time.perf_counter() - t0,
                 "state_success": [float(x) for x in again["state_success"]]}
    print(f"seed {seed}: {before['success']:.3f} -> {again['success']:.3f}, {pc['gained']} gained / {pc['lost']} lost, "
          f"p = {pc['p_value']:.2g}, {res[seed]['eval_s']:.0f} s", flush=True)
json.dump(res, open("/work/runs/v37/noise.json", "w"), indent=1)
