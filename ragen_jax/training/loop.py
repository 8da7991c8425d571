"""The training program around the compiled step: setup, validation, checkpoints, logging, resume.

    trainer = Trainer(load_config("sokoban.py", overrides), workdir)
    trainer.train()

Everything that can be wrong with the input (config, model directory, mesh vs batch, an existing
run directory with another config, a corrupt checkpoint) is checked in `__init__`, before anything
is compiled or written.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import envs_jax
from ragen_jax.config import Config, ConfigError
from ragen_jax.rollout import Rollout, RolloutConfig, format_trajectory, group_seeds_for_iteration, rollout_metrics
from ragen_jax.training.checkpoint import Checkpointer, save_policy, save_run_config
from ragen_jax.training.logger import EchoTrapMonitor, Logger
from ragen_jax.training.trainer import StepPrograms, TrainState, check_batch_fits_mesh, make_optimizer

# Config keys that may change when a run is resumed (everything else must match the saved run).
RESUMABLE_CHANGES = ("train.iterations", "train.val_every", "train.save_every", "train.log_samples",
                     "train.keep_checkpoints")


def _flatten(d: dict, prefix="") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k != "overrides":
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def check_run_dir_config(workdir: Path, cfg: Config, resumable: tuple[str, ...]) -> None:
    """A run directory may only be resumed with the config it was started with (up to `resumable` keys)."""
    saved = Path(workdir) / "config.json"
    if not saved.exists():
        return
    try:
        old = _flatten(json.loads(saved.read_text()))
    except json.JSONDecodeError:
        raise ConfigError(f"{saved} is not valid JSON; this directory holds a broken run") from None
    as_json = lambda c: _flatten(json.loads(json.dumps(c.to_dict(), default=str)))  # noqa: E731
    new = as_json(cfg)
    # A key missing from the saved config was added to Config after that run started: the run used
    # its default behaviour, so only a non-default value is a change.
    defaults = as_json(Config())
    old.update({k: defaults.get(k) for k in new if k not in old})
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in resumable)
    if diff:
        raise ConfigError(f"{workdir} holds a run with a different config ({', '.join(diff[:6])}"
                          f"{' ...' if len(diff) > 6 else ''}); use another --workdir to start a new run")


def log_validation(trainer, step: int) -> dict:
    """Validate, log the metrics at `step` and print one line; shared by the RL and SFT trainers
    (anything with `validate()`, `logger` and `_print`)."""
    m = trainer.validate()
    trainer.logger.scalars(step, m)
    summary = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in m.items() if k.endswith("/success"))
    trainer._print(f"validation @ step {step}: success {summary}")
    return m


def build_mesh(cfg: Config, devices=None):
    """The run's device mesh; an explicit mesh smaller than the machine uses its first devices."""
    from ragen_jax.models.qwen2.sharding import make_mesh

    m = cfg.mesh
    devices = list(devices if devices is not None else jax.devices())
    sizes = (m.data, m.fsdp, m.tensor)
    if -1 not in sizes and math.prod(sizes) < len(devices):
        devices = devices[: math.prod(sizes)]
    return make_mesh(data=m.data, fsdp=m.fsdp, tensor=m.tensor, devices=devices)


def load_task_tokenizer(cfg: Config):
    """The model directory's own tokenizer when it has one, else the offline-built Qwen2.5 tokenizer."""
    from ragen_jax.tokenizer import load_tokenizer

    m = cfg.model
    tok_files = ("tokenizer.json", "tokenizer_config.json")
    if m.path is not None and any((Path(m.path) / f).exists() for f in tok_files):
        return load_tokenizer(m.path)
    return load_tokenizer()


def build_text_envs(cfg: Config, tokenizer) -> dict:
    """TextEnv per environment used by the run: the training env first, then validation envs."""
    from ragen_jax.text import PromptConfig, TextEnv

    p = cfg.prompt
    prompt = PromptConfig(think=p.think, max_turns=p.max_turns, max_actions_per_turn=p.max_actions_per_turn,
                          max_response_words=p.max_response_words, max_response_tokens=p.max_response_tokens)
    out = {}
    for name in (cfg.env.name, *cfg.env.val_envs):
        env, params = envs_jax.make(name, **(cfg.env.overrides if name == cfg.env.name else {}))
        out[name] = TextEnv(env, params, tokenizer, prompt)
    return out


# Texts the task vocabulary must be able to express beyond what the environments render: the
# answer format, separators and the demonstrations' templated thoughts.
TASK_VOCAB_TEXTS = (
    "<think></think><answer></answer>", " <think> </think> <answer> </answer> ", "</think>\n<answer>",
    " || ", "||", " | ", ", ", ". ", "\n", " ",
)


def build_vocab(cfg: Config, text_envs: dict, tokenizer):
    """A VocabMap for model.vocab='task' (small model vocabulary), else None (full Qwen vocabulary)."""
    if cfg.model.vocab != "task":
        return None
    from ragen_jax.models.vocab_map import VocabMap

    names = set()
    for te in text_envs.values():
        names.update(te.action_names)
    texts = list(TASK_VOCAB_TEXTS)
    for n in sorted(names):
        texts += [n, " " + n, n.lower(), " " + n.lower(), n.upper(), " " + n.upper()]
    try:
        from ragen_jax.sft.teachers import teacher_texts  # the demonstrations' fixed texts

        texts += list(teacher_texts())
    except ImportError:
        pass
    return VocabMap.for_text_envs(list(text_envs.values()), tokenizer, extra_texts=texts)


def build_policy(cfg: Config, vocab=None):
    """The policy model from the config: a local HF directory or a random preset (own vocab if mapped)."""
    from ragen_jax.models import Qwen2, Qwen2Config
    from ragen_jax.models.qwen2.weights import from_pretrained

    m = cfg.model
    if m.path is not None:
        if vocab is not None:
            raise ConfigError("model.vocab='task' needs a randomly initialised model (model.random_init=true)")
        return from_pretrained(m.path, dtype=m.dtype, param_dtype=m.param_dtype)
    overrides = dict(dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat)
    if vocab is not None:
        overrides["vocab_size"] = vocab.size
    qcfg = Qwen2Config.from_preset(m.preset).replace(**overrides)
    return Qwen2(qcfg, rngs=nnx.Rngs(cfg.train.seed))


class Trainer:
    def __init__(self, cfg: Config, workdir: str | Path, *, quiet: bool = False, devices=None):
        from ragen_jax.models import critic_from_policy
        from ragen_jax.models.qwen2.sharding import param_shardings

        self.cfg = cfg.validate()
        self.workdir = Path(workdir).expanduser().resolve()
        self.quiet = quiet
        self._check_workdir()

        self.mesh = build_mesh(cfg, devices)
        n_batch_shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        check_batch_fits_mesh(cfg, n_batch_shards)

        self.tokenizer = load_task_tokenizer(cfg)
        self.text_envs = build_text_envs(cfg, self.tokenizer)
        self.text_env = self.text_envs[cfg.env.name]
        self.vocab = build_vocab(cfg, self.text_envs, self.tokenizer)
        policy = build_policy(cfg, self.vocab)
        self.policy_graph, actor = nnx.split(policy)
        self.policy = policy
        critic_graph, critic = None, {}
        if cfg.model.critic == "separate" and cfg.algo.adv_estimator == "gae":
            critic_model = critic_from_policy(policy, nnx.Rngs(cfg.train.seed + 1))
            critic_graph, critic = nnx.split(critic_model)
        elif cfg.model.critic == "shared":
            raise ConfigError("model.critic='shared' is not supported yet; use 'separate' (the reference default)")

        def put(tree):
            return jax.device_put(tree, param_shardings(tree, self.mesh)) if tree else tree

        actor = put(actor)
        if cfg.model.init_from:
            from ragen_jax.training.checkpoint import load_policy_params

            actor = load_policy_params(cfg.model.init_from, actor)  # e.g. the SFT warm start
            if critic_graph is not None:  # the critic's trunk starts from the same weights
                critic_model = critic_from_policy(nnx.merge(self.policy_graph, actor), nnx.Rngs(cfg.train.seed + 1))
                critic_graph, critic = nnx.split(critic_model)
        critic = put(critic)
        self.ref = actor if cfg.algo.kl_coef > 0 else None  # the frozen initial policy (same arrays, never updated)
        actor_opt = make_optimizer(cfg.optim.actor_lr, cfg.optim)
        critic_opt = make_optimizer(cfg.optim.critic_lr, cfg.optim)
        replicated = NamedSharding(self.mesh, PartitionSpec())
        state = TrainState(
            iteration=jax.device_put(jnp.zeros((), jnp.int32), replicated),
            key=jax.device_put(jax.random.PRNGKey(cfg.train.seed), replicated),
            actor=actor,
            actor_opt=put(actor_opt.init(actor)),
            critic=critic,
            critic_opt=put(critic_opt.init(critic)) if critic_graph is not None else {},
            skipped_updates=jax.device_put(jnp.zeros((), jnp.int32), replicated),
        )
        self.programs = StepPrograms(cfg, self.policy_graph, critic_graph, actor_opt, critic_opt, vocab=self.vocab)
        state_shardings = jax.tree.map(lambda x: x.sharding, state)
        self._prepare = jax.jit(self.programs.prepare)
        self._update = jax.jit(self.programs.update, out_shardings=(state_shardings, None))

        # Rollouts: training (P x N) and validation (val_size states x 1, lower temperature).
        r = cfg.rollout
        self.rollout = Rollout(policy, self.text_env, RolloutConfig(
            num_groups=r.num_groups, group_size=r.group_size, max_context=r.max_context, temperature=r.temperature,
            top_p=r.top_p, top_k=r.top_k, cache_dtype=cfg.model.cache_dtype), mesh=self.mesh, vocab=self.vocab)
        if cfg.train.val_every > 0 and cfg.train.val_size % n_batch_shards:
            raise ConfigError(f"train.val_size={cfg.train.val_size} is not divisible by the {n_batch_shards} "
                              "data-parallel devices of the mesh")

        self.ckpt = Checkpointer(self.workdir / "checkpoints", keep=cfg.train.keep_checkpoints)
        self.state = state
        latest = self.ckpt.latest_step()
        if latest is not None:
            self.state, _ = self.ckpt.restore(latest, state)  # raises CheckpointError naming the path
        self.echo = EchoTrapMonitor()
        self.logger = None

    # ------------------------------------------------------------------------------------------
    def _check_workdir(self):
        check_run_dir_config(self.workdir, self.cfg, RESUMABLE_CHANGES)

    @property
    def iteration(self) -> int:
        return int(self.state.iteration)

    def validate(self) -> dict:
        """The reference's validation (fixed seeds, temperature 0.5) on the training and val envs,
        through `ragen_jax.evaluation` (compiled once per env, like the rollout)."""
        from ragen_jax.evaluation import evaluate, flat_metrics

        cfg = self.cfg
        t0 = time.perf_counter()
        results = evaluate(
            self.policy, self.state.actor, self.tokenizer, list(self.text_envs), num_states=cfg.train.val_size,
            seed_start=cfg.train.val_seed, temperature=cfg.train.val_temperature, prompt=cfg.prompt,
            max_context=cfg.rollout.max_context, mesh=self.mesh, key=jax.random.PRNGKey(cfg.train.seed + 7),
            env_overrides={cfg.env.name: cfg.env.overrides}, cache_dtype=cfg.model.cache_dtype, vocab=self.vocab)
        out = flat_metrics(results)
        out["timing/validation_s"] = time.perf_counter() - t0
        return out

    def iteration_step(self) -> dict:
        """One training iteration; returns its metrics (host floats)."""
        cfg = self.cfg
        i = self.iteration
        seeds = group_seeds_for_iteration(i, cfg.rollout.num_groups, cfg.train.seed_base)
        roll_key = jax.random.fold_in(self.state.key, 1)
        t0 = time.perf_counter()
        traj = self.rollout(self.state.actor, roll_key, seeds)
        jax.block_until_ready(traj.tokens)
        t1 = time.perf_counter()
        batch, pmetrics = self._prepare(self.state.actor, self.state.critic, self.ref, traj)
        self.state, umetrics = self._update(self.state, batch)
        jax.block_until_ready(self.state.iteration)
        t2 = time.perf_counter()
        rm = rollout_metrics(traj, cfg.rollout.group_size)
        metrics = {f"train/{k}": v for k, v in rm.items() if k not in ("in_group_std", "in_group_std_max",
                                                                          "response_length")}
        metrics["rollout/in_group_std"] = rm["in_group_std"]
        metrics["rollout/in_group_std_max"] = rm["in_group_std_max"]
        metrics["response_length/mean"] = rm["response_length"]
        metrics.update({k: float(v) for k, v in jax.device_get({**pmetrics, **umetrics}).items()})
        metrics["timing/rollout_s"] = t1 - t0
        metrics["timing/update_s"] = t2 - t1
        n_tok = float(np.sum(np.asarray(traj.length)))
        metrics["timing/rollout_tokens_per_s"] = n_tok / max(t1 - t0, 1e-9)
        score, warn = self.echo.update(metrics.get("rollout/in_group_std", 0.0), metrics.get("actor/entropy", 0.0),
                                       metrics["train/reward_mean"])
        metrics["echo_trap/score"] = score
        metrics["echo_trap/warning"] = float(warn)
        if warn:
            self._print(f"[echo-trap warning] iteration {i + 1}: in-group reward std and policy entropy have both "
                        f"fallen by >= {self.echo.drop:.0%} of their recent best while reward has not: the policy "
                        "may be collapsing into a repetitive template (consider a lower filter ratio or clip-higher)")
        self._last_traj = traj
        return metrics

    def _print(self, msg):
        if not self.quiet and jax.process_index() == 0:
            from tqdm import tqdm

            tqdm.write(msg)

    def train(self) -> list[dict]:
        from tqdm import tqdm

        cfg = self.cfg
        self.workdir.mkdir(parents=True, exist_ok=True)
        if jax.process_index() == 0:
            save_run_config(self.workdir, json.loads(json.dumps(cfg.to_dict(), default=str)))
            if self.vocab is not None:
                self.vocab.save(self.workdir / "vocab.json")
        self.logger = Logger(self.workdir)
        history = []
        start = self.iteration
        if start >= cfg.train.iterations:
            self._print(f"nothing to do: {self.workdir} already finished {start} iterations")
            return history
        if start > 0:
            self._print(f"resuming {self.workdir} from iteration {start}")
        if cfg.train.val_every > 0 and start == 0:
            self._log_validation(0)
        bar = tqdm(range(start, cfg.train.iterations), initial=start, total=cfg.train.iterations,
                   desc="train", disable=self.quiet or jax.process_index() != 0, dynamic_ncols=True)
        try:
            for _ in bar:
                t0 = time.perf_counter()
                metrics = self.iteration_step()
                step = self.iteration
                metrics["timing/iteration_s"] = time.perf_counter() - t0
                self.logger.scalars(step, metrics)
                if cfg.train.log_samples:
                    for row in range(min(cfg.train.log_samples, self.cfg.rollout.num_groups * self.cfg.rollout.group_size)):
                        self.logger.text(step, f"samples/{row}", format_trajectory(self._last_traj, row, self.tokenizer))
                bar.set_postfix(reward=f"{metrics['train/reward_mean']:.3f}", success=f"{metrics['train/success']:.2f}",
                                s_it=f"{metrics['timing/iteration_s']:.1f}")
                history.append({"step": step, **metrics})
                if cfg.train.val_every > 0 and step % cfg.train.val_every == 0:
                    self._log_validation(step)
                if step % cfg.train.save_every == 0 or step == cfg.train.iterations:
                    self.save()
            # Policy export for eval and later runs (every process takes part: it is a collective save).
            save_policy(self.workdir, self.state.actor)
        finally:
            self.ckpt.wait()
            self.logger.close()
        return history

    def _log_validation(self, step):
        return log_validation(self, step)

    def save(self):
        self.ckpt.save(self.iteration, self.state, extra={"iteration": self.iteration})
