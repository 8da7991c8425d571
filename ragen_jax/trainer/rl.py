"""The training program around the compiled step: setup, validation, checkpoints, logging, resume.

    trainer = Trainer(load_config("sokoban.py", overrides), workdir)
    trainer.train()

Everything that can be wrong with the input (config, model directory, mesh vs batch, an existing
run directory with another config, a corrupt checkpoint) is checked in `__init__`, before anything
is compiled or written.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from ragen_jax.models import critic_from_policy, on_mesh
from ragen_jax.models.lora import CRITIC_TRAINABLE
from ragen_jax.rollout import Rollout, format_trajectory, group_seeds_for_iteration, rollout_metrics
from ragen_jax.rollout.metrics import host_copy, mix_metrics
from ragen_jax.rollout.rollout import turn_blocks
from ragen_jax.trainer.group_prefix import group_shape_of
from ragen_jax.infra.distributed import barrier
from ragen_jax.infra.preemption import STOP
from ragen_jax.experiment.assembly import RunAssembly, abstract
from ragen_jax.experiment.build import without_remat
from ragen_jax.experiment.config import Config, ConfigError
from ragen_jax.experiment.policy_export import exports_complete
from ragen_jax.evaluation.suite import log_validation, validate_run
from ragen_jax.trainer.collapse import CollapseProbe, EarlyStops, EchoTrapMonitor
from ragen_jax.trainer.export import PROGRAMS, export_programs
from ragen_jax.trainer.memory import aot_compile, check_memory_fits, device_memory_limit
from ragen_jax.trainer.optim import make_optimizer
from ragen_jax.trainer.step import StepPrograms, StepSettings, TrainState, check_batch_fits_mesh, critic_frozen, full_params

# Config keys that may change when a run is resumed (everything else must match the saved run).
RESUMABLE_CHANGES = ("train.iterations", "train.val_every", "train.save_every", "train.log_samples",
                     "train.keep_checkpoints", "train.device_memory_gib", "train.collapse_every",
                     "train.collapse_samples", "train.stop_empty_filter", "train.stop_std_fraction",
                     "train.stop_std_window", "train.stop_val_success", "train.stop_val_count",
                     # memory/speed knobs: the same numbers up to float rounding
                     "model.remat", "model.remat_policy", "model.attention", "batching.micro_batch_size")


class Trainer(RunAssembly):
    RESUMABLE_CHANGES = RESUMABLE_CHANGES
    # True: each iteration waits for `prepare` before the update and reports the two apart
    # (timing/prepare_s, timing/only_update_s; bench/gpu_check.py). timing/update_s is both.
    sync_phases: bool = False

    def __init__(self, cfg: Config, workdir: str | Path, *, quiet: bool = False, devices=None):
        if cfg.model.critic == "shared":
            raise ConfigError("model.critic='shared' is not supported yet; use 'separate' (the reference default)")
        super().__init__(cfg, workdir, quiet=quiet, devices=devices,
                         check_shards=lambda n: check_batch_fits_mesh(cfg, n))
        cfg = self.cfg
        critic_graph, critic = None, {}
        if cfg.model.critic == "separate" and cfg.advantage.record.needs_critic:
            # The critic's trunk starts from the actor's weights, cloned on the mesh: nnx.clone shares the
            # (immutable) sharded arrays, jnp.copy then gives the critic its own buffers shard by shard
            # (the update donates both models, so they may not share one). With LoRA it keeps only its
            # trained part (a copy of the actor's adapters + value head): its frozen trunk is the actor's.
            critic_model = critic_from_policy(nnx.merge(self.policy_graph, self.initial_params),
                                              nnx.Rngs(cfg.train.seed + 1))
            critic_graph, critic = nnx.split(critic_model)
            if self.lora:
                critic = nnx.split_state(critic, CRITIC_TRAINABLE, ...)[0]
            critic = jax.tree.map(jnp.copy, self.put(critic))
        # LoRA: the actor trains its adapters; sampling applies them on the fly (model.py `dense_layer`),
        # the same computation as the trainer's log-probs.
        actor = self.take_trainable()
        # The frozen initial policy: a copy, because the update donates (overwrites) the actor's arrays
        # (with LoRA, of the initial adapters: the base is frozen anyway).
        self.ref = jax.tree.map(jnp.copy, actor) if cfg.loss.kl_coef > 0 else None
        actor_opt = make_optimizer(cfg.optim.actor_lr, cfg.optim)
        critic_opt = make_optimizer(cfg.optim.critic_lr, cfg.optim)
        state = TrainState(
            iteration=self.replicated(jnp.zeros((), jnp.int32)),
            key=self.replicated(jax.random.PRNGKey(cfg.train.seed)),
            actor=actor,
            actor_opt=self.put(actor_opt.init(actor)),
            critic=critic,
            critic_opt=self.put(critic_opt.init(critic)) if critic_graph is not None else {},
            skipped_updates=self.replicated(jnp.zeros((), jnp.int32)),
        )
        self.critic_graph, self.optimizers = critic_graph, (actor_opt, critic_opt)

        # Rollouts: training (P x N) and validation (val_size states x 1, lower temperature).
        self.rollout = Rollout(self.policy, self.text_env, cfg.rollout, mesh=self.mesh, vocab=self.vocab,
                               state_keys=cfg.advantage.needs_state_keys)
        for name, size in cfg.env.validation_set(cfg.train.val_size) if cfg.train.val_every > 0 else ():
            if size % self.n_batch_shards:
                raise ConfigError(f"the validation size {size} of {name} (train.val_size or env.val_set) is not "
                                  f"divisible by the {self.n_batch_shards} data-parallel devices of the mesh")

        # The step programs, built once. With a device memory limit they are compiled ahead of time and
        # checked against it before anything is written (model.remat unset: without remat if that fits),
        # and with several processes compiled ahead so that all processes meet at a barrier before
        # the first collective; the iterations then run these executables (`self.compiled`).
        self.memory, self.compiled = None, None
        self._tried: dict = {}  # the programs of the last compile try (`_compile`)
        self.remat = cfg.model.use_remat  # what the update runs with (model.remat=None: decided below)
        limit = device_memory_limit(cfg, self.mesh.devices.flat[0])
        if limit is not None or jax.process_count() > 1:
            self._compile_ahead(state, limit)
        else:
            self._build_programs(state, self.policy_graph, critic_graph)
        self.restore_or_start(state)
        # Host state a resumed run continues (saved with every checkpoint, `save`).
        self.echo = EchoTrapMonitor()
        self.echo.load_state(self.restored_extra.get("echo_trap", {}))
        self.stops = EarlyStops(cfg.train)
        self.stops.load_state(self.restored_extra.get("early_stops", {}))
        # RAGEN-2 reasoning-collapse diagnostics (its program compiles on first use).
        self.collapse = (CollapseProbe(cfg, self.policy_graph, self.tokenizer, self.text_envs, vocab=self.vocab,
                                       mesh=self.mesh) if cfg.train.collapse_every else None)

    def _build_programs(self, state: TrainState, policy_graph, critic_graph) -> None:
        blocks = turn_blocks(self.text_env) if self.cfg.prompt.single_turn else None
        self.programs = StepPrograms(StepSettings.of(self.cfg), policy_graph, critic_graph, *self.optimizers, vocab=self.vocab,
                                     turn_blocks=blocks, batch_shards=self.n_batch_shards,
                                     shared_prefix=turn_blocks(self.text_env)[0],
                                     group_prefix=group_shape_of(self.text_env, self.cfg.rollout.max_context))
        state_shardings = jax.tree.map(lambda x: x.sharding, state)
        # Traced on the mesh: the splash kernel's shard_map reads it (models/attention.py `partitioned`).
        self.prepare_jit = jax.jit(on_mesh(self.programs.prepare, self.mesh))
        # The update donates the train state: parameters and optimizer state exist once, updated in place.
        # The prepare pass donates nothing: none of its outputs has the shape of an input (the
        # trajectories are P*N rows, the batch the kept K), and the host reads the trajectories later.
        self.update_jit = jax.jit(on_mesh(self.programs.update, self.mesh), out_shardings=(state_shardings, None),
                                  donate_argnums=(0,))
        self.prepare_fn, self.update_fn = self.prepare_jit, self.update_jit  # the compiled ones replace them

    def _compile_ahead(self, state: TrainState, limit: int | None) -> None:
        """AOT-compile the rollout, prepare and update programs for the run's shapes and shardings
        (`memory.aot_compile`), raise ConfigError (`memory.check_memory_fits`) when one needs more than
        `limit` bytes per device, and keep the executables for the iterations (no second compilation).
        `model.remat=None` (auto) with a limit: the programs without remat when they fit (remat makes
        the backward recompute every layer's forward), else the default ones. Then every process
        waits for the others (`barrier`), so none enters a collective while another still compiles."""
        m = self.cfg.model
        if limit is not None and m.remat is None and m.use_remat:
            actor_like = abstract(full_params(state.actor, self.frozen))
            critic_like = (abstract(full_params(state.critic, critic_frozen(self.frozen)))
                           if self.critic_graph is not None else None)
            self._build_programs(state, without_remat(self.policy_graph, actor_like),
                                 without_remat(self.critic_graph, critic_like))
            try:
                self._compile(state, limit)
                self.remat = False
                self.note("model.remat unset: off (every program fits the device without it)")
            except ConfigError:  # too big without remat: the default programs (remat on), checked in turn
                # Only the update differs: the rollout and prepare passes run no backward (no remat), so
                # the programs compiled for the first try are kept.
                done = {k: v for k, v in self._tried.items() if k != "update"}
                self._build_programs(state, self.policy_graph, self.critic_graph)
                self._compile(state, limit, reuse=done)
                self.note("model.remat unset: on (the update does not fit the device without it)")
        else:
            self._build_programs(state, self.policy_graph, self.critic_graph)
            self._compile(state, limit)
        barrier("ragen_jax.trainer.programs_compiled")

    def _compile(self, state: TrainState, limit: int | None, reuse: dict | None = None) -> None:
        r = self.cfg.rollout
        seeds = jnp.asarray(group_seeds_for_iteration(0, r.num_groups, self.cfg.train.seed_base), jnp.int32)
        compiled, usage = aot_compile(self.rollout, self.prepare_jit, self.update_jit, state, self.ref,
                                      jax.random.fold_in(state.key, 1), seeds, frozen=self.frozen, reuse=reuse)
        self._tried = compiled  # kept for a second try (`_compile_ahead`) when a program does not fit
        if limit is not None:
            check_memory_fits(self.cfg, usage, limit)
        self.compiled, self.memory = compiled, usage
        self.prepare_fn, self.update_fn = compiled["prepare"], compiled["update"]

    def sample(self, params, key, group_seeds):
        """The training rollout: the executable compiled ahead when there is one, else the jitted program."""
        if self.compiled is None:
            return self.rollout(params, key, group_seeds)
        return self.compiled["rollout"](params, jnp.asarray(key), jnp.asarray(group_seeds, jnp.int32),
                                        self.rollout.stop_table)

    def export_for(self, platform: str, programs=PROGRAMS) -> dict:
        """{name: jax.export.Exported}: this run's rollout, prepare and update programs (its shardings,
        donation and parameter shapes) lowered for `platform` ("tpu", "cuda"...) from any machine
        (trainer/export.py), also when the run compiled them ahead for this machine. Before `train()`."""
        r = self.cfg.rollout
        seeds = jnp.asarray(group_seeds_for_iteration(0, r.num_groups, self.cfg.train.seed_base), jnp.int32)
        return export_programs(self.rollout, self.prepare_jit, self.update_jit, self.state, self.ref,
                               jax.random.fold_in(self.state.key, 1), seeds, platform=platform, mesh=self.mesh,
                               frozen=self.frozen, programs=programs)

    @property
    def iteration(self) -> int:
        return int(self.state.iteration)

    @property
    def actor_params(self):
        """The policy's whole parameter state (with LoRA: the frozen base and the current adapters)."""
        return full_params(self.state.actor, self.frozen)

    def validate(self) -> dict:
        """The reference's validation (fixed seeds, temperature 0.5) on the training and val envs
        (`evaluation.validate_run`: compiled once per env, like the rollout)."""
        return validate_run(self.cfg, self.policy, self.actor_params, self.tokenizer, mesh=self.mesh, vocab=self.vocab)

    def iteration_step(self) -> dict:
        """One training iteration; returns its metrics (host floats)."""
        cfg = self.cfg
        i = self.iteration
        seeds = group_seeds_for_iteration(i, cfg.rollout.num_groups, cfg.train.seed_base)
        roll_key = jax.random.fold_in(self.state.key, 1)
        t0 = time.perf_counter()
        traj = self.sample(self.actor_params, roll_key, seeds)
        jax.block_until_ready(traj.tokens)
        rollout_s = time.perf_counter() - t0
        # One host copy of the trajectories (gathered from every process when the batch spans several)
        # for the metrics, the collapse diagnostics and the logged samples; every process takes part.
        # Taken while the update runs on the device, unless the collapse probe needs it first.
        host, cmetrics = None, {}
        if self.collapse is not None and self.collapse.due(i + 1):
            tc = time.perf_counter()
            host = host_copy(traj)
            # Before the update (which donates the actor): the policy that sampled the batch, unfiltered.
            cmetrics = self.collapse.probe(self.actor_params, traj, host, i + 1)
            cmetrics["timing/collapse_s"] = time.perf_counter() - tc
        t1 = time.perf_counter()
        batch, pmetrics = self.prepare_fn(self.state.actor, self.state.critic, self.ref, traj, *self.frozen_args)
        if self.sync_phases:  # measurement only: waiting here costs the overlap of the update's dispatch
            jax.block_until_ready(batch)
            t_prepared = time.perf_counter()
        self.state, umetrics = self.update_fn(self.state, batch, *self.frozen_args)
        if self.sync_phases:
            jax.block_until_ready(self.state.iteration)
            t_updated = time.perf_counter()
        if host is None:
            host = host_copy(traj)
        jax.block_until_ready(self.state.iteration)
        t2 = time.perf_counter()
        rm = rollout_metrics(host, cfg.rollout.group_size)
        metrics = {f"train/{k}": v for k, v in rm.items() if k not in ("in_group_std", "in_group_std_max",
                                                                          "response_length")}
        if cfg.env.mix:  # train/<Env>/<metric> per environment of the mix
            metrics.update({f"train/{k}": v for k, v in mix_metrics(host, cfg.rollout.group_size, cfg.env.mix).items()})
        metrics["rollout/in_group_std"] = rm["in_group_std"]
        metrics["rollout/in_group_std_max"] = rm["in_group_std_max"]
        metrics["response_length/mean"] = rm["response_length"]
        metrics.update({k: float(v) for k, v in host_copy({**pmetrics, **umetrics}).items()})
        metrics.update(cmetrics)
        metrics["timing/rollout_s"] = rollout_s
        metrics["timing/update_s"] = t2 - t1
        if self.sync_phases:
            metrics["timing/prepare_s"] = t_prepared - t1
            metrics["timing/only_update_s"] = t_updated - t_prepared
        n_tok = float(np.sum(host.length))
        metrics["timing/rollout_tokens_per_s"] = n_tok / max(rollout_s, 1e-9)
        score, warn = self.echo.update(metrics.get("rollout/in_group_std", 0.0), metrics.get("actor/entropy", 0.0),
                                       metrics["train/reward_mean"])
        metrics["echo_trap/score"] = score
        metrics["echo_trap/warning"] = float(warn)
        if warn:
            self.note(f"[echo-trap warning] iteration {i + 1}: in-group reward std and policy entropy have both "
                        f"fallen by >= {self.echo.drop:.0%} of their recent best while reward has not: the policy "
                        "may be collapsing into a repetitive template (consider a lower filter ratio or clip-higher)")
        self._last_traj = host
        return metrics

    def train(self) -> list[dict]:
        """Run (or resume) the training; returns the metrics of the iterations it ran. SIGTERM / SIGINT
        (`infra.preemption`): the current iteration finishes, a checkpoint is saved, `self.interrupted`
        names the signal and the policy is not exported (the same command resumes)."""
        cfg = self.cfg
        self.save_run_files(self.workdir)  # process 0
        self.open_logger()
        history = []
        start = self.iteration
        with STOP.installed():
            try:
                if self.stops.rule is not None or start >= cfg.train.iterations:
                    done = f"stopped early ({self.stops.rule})" if self.stops.rule else f"finished {start} iterations"
                    self.note(f"nothing to do: {self.workdir} already {done}")
                    self.export(only_missing=True)  # a kill during the final export left it incomplete
                    return history
                if self.stop_requested():  # during start-up: nothing new to save
                    return history
                if start > 0:
                    self.note(f"resuming {self.workdir} from iteration {start}")
                if cfg.train.val_every > 0 and start == 0:
                    self._log_validation(0)
                history = self._iterations(start)
                if self.interrupted is None:
                    # Policy export for eval and later runs (every process takes part: a collective save).
                    self.export()
            finally:
                self.ckpt.wait()
                self.logger.close()
        return history

    def _iterations(self, start: int) -> list[dict]:
        """Iterations `start + 1 ..` until train.iterations, an early stop or a stop signal; each logs its
        metrics (and validation) before its checkpoint, so a checkpoint always follows its logs."""
        cfg = self.cfg
        history = []
        bar = tqdm(range(start, cfg.train.iterations), initial=start, total=cfg.train.iterations,
                   desc="train", disable=self.quiet or jax.process_index() != 0, dynamic_ncols=True)
        for _ in bar:
            t0 = time.perf_counter()
            metrics = self.iteration_step()
            step = self.iteration
            metrics["timing/iteration_s"] = time.perf_counter() - t0
            stop = self.stops.after_iteration(metrics)  # adds its counters to the metrics
            self.logger.scalars(step, metrics)
            if cfg.train.log_samples:
                for row in range(min(cfg.train.log_samples, self.cfg.rollout.num_groups * self.cfg.rollout.group_size)):
                    self.logger.text(step, f"samples/{row}", format_trajectory(self._last_traj, row, self.tokenizer))
            bar.set_postfix(reward=f"{metrics['train/reward_mean']:.3f}", success=f"{metrics['train/success']:.2f}",
                            s_it=f"{metrics['timing/iteration_s']:.1f}")
            history.append({"step": step, **metrics})
            if cfg.train.val_every > 0 and step % cfg.train.val_every == 0:
                stop = stop or self.stops.after_validation(self._log_validation(step))
            if stop:
                self.logger.scalars(step, {f"early_stopped/{self.stops.rule}": 1.0})
                self.note(f"[early stop] iteration {step}: {stop}; saving and stopping")
            interrupted = self.stop_requested()  # every process, at the same point: they agree on `step`
            if stop or interrupted or step % cfg.train.save_every == 0 or step == cfg.train.iterations:
                t_save = time.perf_counter()
                self.save()
            if interrupted:
                self.ckpt.wait()  # committed before the process exits
                self.note(f"stopped by {self.interrupted} after iteration {step}: checkpoint {step} written in "
                          f"{time.perf_counter() - t_save:.1f} s; rerun the same command to resume")
            if stop or interrupted:
                break
        return history

    def _log_validation(self, step):
        return log_validation(self, step)

    def export(self, workdir=None, only_missing: bool = False):
        """`<run>/policy` (merged with LoRA) and, with LoRA, `<run>/adapter` (PEFT layout). `workdir`:
        the current policy exported elsewhere instead, with the run files (config, task vocabulary)
        beside it, so it loads as a finished run does (launch/eval.py, `model.init_from`).
        `only_missing`: nothing when the run directory's exports are complete."""
        if workdir is None:
            workdir = self.workdir
            if only_missing and exports_complete(workdir, self.lora):
                return
        else:
            self.save_run_files(workdir)
        self.export_policy(self.state.actor, workdir)

    def save(self):
        """A checkpoint of the train state and the host state a resumed run continues (early-stop
        counters, echo-trap window); TensorBoard's buffered events reach the disk first."""
        self.logger.flush()
        self.ckpt.save(self.iteration, self.state, extra={
            "iteration": self.iteration, "early_stops": self.stops.state(), "echo_trap": self.echo.state()})
