"""Evaluate a policy on fixed initial states of several environments (behaviour spec section 7).

    python launch/eval.py --model runs/sokoban                       # a training/SFT run directory
    python launch/eval.py --model /models/Qwen2.5-0.5B-Instruct --envs Sokoban,FrozenLake
    python launch/eval.py --model preset:tiny --envs Bandit --num-states 2 --max-response-tokens 4

    python launch/eval.py --model runs/rl --envs Sokoban --num-states 128 --rollouts-per-state 8 \
        --compare runs/sft/eval.json                                  # paired: the same states before and after

Prints one table row per environment (success, reward, validity, pass@k, ...) and writes eval.json
(default: RUN_DIR/eval.json for a run directory, else ./eval.json). `--compare EARLIER.json` compares
each environment state by state with an earlier eval.json of the same states and rollouts per state
(ragen_jax/evaluation/paired.py `paired_rates`: the mean gain with a bootstrap 95% interval, the exact
paired permutation test and Wilcoxon; McNemar for one rollout per state), printed and kept under
"paired" in eval.json. Defaults follow the reference's
validation: 256 states from seed 123, one rollout each, temperature 0.5. For a run directory the
prompt settings and context budget default to the run's own. Errors: one line on stderr, exit 2.

Several processes (a TPU pod slice, SLURM, or --coordinator-address/--num-processes/--process-id as
for launch/tpu_train.py): run the same command in every process; the episodes are spread over every
device of every process and process 0 prints and writes the results. `--all-devices` does the same
over one process's devices.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":  # before jax is imported: glibc malloc huge pages (why and when: ragen_jax/runtime.py)
    from ragen_jax.runtime import use_transparent_hugepages

    use_transparent_hugepages()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="run directory, Hugging Face model directory, or preset:NAME")
    p.add_argument("--envs", default=None,
                   help="comma-separated env names (default: the registered envs whose envs_jax record has "
                        "default_eval: Sokoban, its variants, FrozenLake, Bandit, BanditTest)")
    p.add_argument("--num-states", type=int, default=256, help="initial states per env (seeds seed-start..)")
    p.add_argument("--seed-start", type=int, default=123)
    p.add_argument("--rollouts-per-state", type=int, default=1,
                   help="rollouts per state in one run (pass@k; each state's success rate is what --compare pairs)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of the compiled rollout, pooled (keys: --seed's, then derived ones): repeats x "
                        "rollouts-per-state samples per state at the memory of one run")
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--greedy", action="store_true", help="argmax decoding instead of sampling")
    p.add_argument("--compare", default=None, metavar="EARLIER_EVAL_JSON",
                   help="an earlier eval.json of the same states and rollouts per state: paired comparison per env")
    p.add_argument("--seed", type=int, default=0, help="sampling key")
    p.add_argument("--max-turns", type=int, default=None, help="default: the run's, else 5 (Bandit: always 1)")
    p.add_argument("--max-actions-per-turn", type=int, default=None, help="default: the run's, else 5")
    p.add_argument("--max-response-tokens", type=int, default=None,
                   help="per-turn budget; default: the run's, else 400")
    p.add_argument("--max-context", type=int, default=None,
                   help="whole-conversation budget; default: the run's, else 3600")
    p.add_argument("--no-think", action="store_true", help="force <answer> instead of <think> (no-think ablation)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="compute dtype for an HF directory or preset (default float32; a run uses its own)")
    p.add_argument("--transcripts", type=int, default=0, help="sample conversations per env to print and save")
    p.add_argument("--out", default=None, help="eval.json path")
    p.add_argument("--all-devices", action="store_true",
                   help="spread the episodes over all devices (always so with several processes); num-states x "
                        "rollouts-per-state must then be a multiple of the device count")
    from ragen_jax.experiment.cli import add_cluster_args  # here: `--help` stays free of jax imports otherwise

    add_cluster_args(p)
    return p.parse_args(argv)


def _err(msg) -> int:
    from ragen_jax.experiment.cli import fail  # one line, exit 2; with several processes this process ends here

    return fail(ValueError(str(msg)), 2)


def read_comparison(path: str, args, envs) -> dict:
    """The earlier evaluation `--compare` names, checked against this one's states before any model
    loads: {env: per-state success} for the envs both evaluate. ValueError with one sentence."""
    import json

    try:
        with open(path) as f:
            doc = json.load(f)
        st, res = doc["settings"], doc["results"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--compare {path}: not a readable eval.json ({e}); give a file launch/eval.py wrote") from None
    theirs = dict(st, samples_per_state=(st.get("rollouts_per_state") or 1) * (st.get("repeats") or 1))
    for key, mine in (("num_states", args.num_states), ("seed_start", args.seed_start),
                      ("samples_per_state", args.rollouts_per_state * args.repeats)):
        if theirs.get(key) != mine:
            raise ValueError(f"--compare {path} has {key} {theirs.get(key)}, this evaluation {mine}; a paired "
                             "comparison needs the same states and samples per state (--num-states, --seed-start, "
                             "--rollouts-per-state x --repeats)")
    common = {e: res[e]["state_success"] for e in envs if e in res and "state_success" in res[e]}
    if not common:
        raise ValueError(f"--compare {path} holds none of {', '.join(envs)} with per-state results")
    return common


def _print_paired(before: dict, results: dict, k: int, path: str) -> dict:
    from ragen_jax.evaluation.paired import format_paired, paired_rates

    paired = {"against": path}
    for env, b in before.items():
        paired[env] = paired_rates(b, results[env]["state_success"], k)
        print(f"{env}: {path} -> this: {format_paired(paired[env])}")
    return paired


def _write_results(args, envs, results, run_cfg, prompt, max_context, mesh, paired=None) -> int:
    """Print the transcripts and write eval.json (process 0)."""
    import dataclasses

    import jax

    from ragen_jax.evaluation.suite import write_eval_json

    for name, m in results.items():
        for i, text in enumerate(m.get("transcripts", ())):
            print(f"\n===== {name} transcript {i} =====\n{text}")
    if args.out is not None:
        out = args.out
    else:
        out = os.path.join(args.model, "eval.json") if run_cfg is not None else "eval.json"
    settings = dict(model=args.model, envs=list(envs), num_states=args.num_states, seed_start=args.seed_start,
                    rollouts_per_state=args.rollouts_per_state, repeats=args.repeats, temperature=args.temperature,
                    greedy=args.greedy,
                    seed=args.seed, max_context=max_context, prompt=dataclasses.asdict(prompt),
                    device=str(jax.devices()[0].platform), processes=jax.process_count(),
                    devices=jax.device_count() if mesh is not None else 1)
    path = write_eval_json(results, out, settings, extra={"paired": paired} if paired else None)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _check_model_arg(model: str, error: type) -> None:
    if (not os.path.isdir(os.path.expanduser(model)) and not model.startswith("preset:")
            and not model.lower().endswith(".gguf")):
        raise error(f"model directory {model} does not exist (give a run directory, a Hugging Face model directory, "
                    "a .gguf file or preset:NAME)")


def main(argv=None) -> int:
    args = parse_args(argv)
    # Project imports follow the cluster join: importing the environments starts JAX's backend.
    from ragen_jax.experiment.cli import start_from_args
    from ragen_jax.infra.distributed import ClusterError

    try:  # join the cluster (if any) first: importing the environments creates JAX's backend
        start_from_args(args)
    except ClusterError as e:
        return _err(e)
    from ragen_jax.evaluation.policies import EvalError
    from ragen_jax.evaluation.suite import DEFAULT_SUITE, check_env_names

    try:  # cheap checks first: a typo must not cost a model load
        envs = check_env_names(args.envs.split(",") if args.envs else DEFAULT_SUITE)
        _check_model_arg(args.model, EvalError)
        before = read_comparison(args.compare, args, envs) if args.compare else None
    except (EvalError, ValueError) as e:
        return _err(e)

    import dataclasses

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's restore chatter
    from ragen_jax.evaluation.policies import load_source
    from ragen_jax.evaluation.suite import evaluate, format_table

    try:
        loaded, run_cfg = load_source(args.model, dtype=args.dtype)
    except (EvalError, ValueError, FileNotFoundError) as e:
        return _err(e)
    prompt = loaded.prompt
    changes = {k: v for k, v in (("max_turns", args.max_turns), ("max_actions_per_turn", args.max_actions_per_turn),
                                 ("max_response_tokens", args.max_response_tokens)) if v is not None}
    if args.no_think:
        changes["think"] = False
    prompt = dataclasses.replace(prompt, **changes)
    max_context = args.max_context or (run_cfg.rollout.max_context if run_cfg is not None else 3600)
    cache_dtype = run_cfg.rollout.cache_dtype if run_cfg is not None else None

    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from ragen_jax.models.qwen2.sharding import make_mesh
    from ragen_jax.rollout.metrics import host_copy

    primary = jax.process_index() == 0
    mesh, params = None, loaded.params
    if args.all_devices or jax.process_count() > 1:
        # Every process's devices, one data axis; the parameters replicated on it (each process loaded
        # its own copy: placed from the host, the same on every process).
        mesh = make_mesh(data=-1)
        params = jax.device_put(host_copy(params), NamedSharding(mesh, PartitionSpec()))

    def progress(name, stage, m):
        if not primary:
            return
        if stage == "start":
            progress.t0 = time.perf_counter()
            print(f"[{envs.index(name) + 1}/{len(envs)}] {name}: {args.num_states} states x "
                  f"{args.rollouts_per_state} ...", file=sys.stderr, flush=True)
        else:
            print(f"[{envs.index(name) + 1}/{len(envs)}] {name}: success {m['success']:.3f} "
                  f"({time.perf_counter() - progress.t0:.1f} s incl. compile)", file=sys.stderr, flush=True)

    try:
        results = evaluate(loaded.policy, params, loaded.tokenizer, envs, num_states=args.num_states,
                           seed_start=args.seed_start, rollouts_per_state=args.rollouts_per_state, repeats=args.repeats,
                           temperature=args.temperature, greedy=args.greedy, prompt=prompt, max_context=max_context,
                           transcripts=args.transcripts, key=jax.random.PRNGKey(args.seed),
                           cache_dtype=cache_dtype, vocab=loaded.vocab, progress=progress, mesh=mesh)
    except (EvalError, ValueError) as e:
        return _err(e)
    if not primary:
        return 0

    print(format_table(results))
    paired = _print_paired(before, results, args.rollouts_per_state * args.repeats, args.compare) if before else None
    return _write_results(args, envs, results, run_cfg, prompt, max_context, mesh, paired)


if __name__ == "__main__":
    sys.exit(main())
