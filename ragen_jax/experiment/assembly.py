"""The set-up every training run shares, in one order: the RL `Trainer` and the `SFTTrainer` are
both a `RunAssembly`, and their constructors keep only what differs (programs, demos, critic).

    check the config and the run directory -> mesh (+ the trainer's batch checks) -> tokenizer ->
    text envs -> task vocabulary -> policy (placed on the mesh, `model.init_from` applied)
    ... the trainer's own parts ...
    take_trainable() (LoRA: adapters train, the base is frozen) -> restore_or_start(state)

Every input check runs here or in the trainer's constructor, before anything is compiled or written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from ragen_jax.infra.checkpoint import Checkpointer, save_run_files
from ragen_jax.infra.distributed import on_primary, run_path
from ragen_jax.infra.logger import Logger
from ragen_jax.infra.preemption import STOP
from ragen_jax.models.lora import POLICY_TRAINABLE
from ragen_jax.models.qwen2.sharding import param_shardings
from ragen_jax.experiment.build import (build_mesh, build_policy, build_text_envs, build_vocab, check_run_dir_config,
                                        init_policy_params, load_task_tokenizer, quantize_policy)
from ragen_jax.experiment.config import Config
from ragen_jax.experiment.policy_export import save_policy_exports


def abstract(tree):
    """ShapeDtypeStructs of `tree`'s arrays (no numbers)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


class RunAssembly:
    """What a training run is built from. Attributes after `__init__`: cfg (validated), workdir,
    quiet, lora, mesh, n_batch_shards, tokenizer, text_envs, text_env, vocab, policy, policy_graph,
    initial_params (the policy's whole parameter state, sharded, after `model.init_from`; consumed
    by `take_trainable`), logger (None until the run starts)."""

    # Config keys that may change when a run directory is resumed; each trainer names its own.
    RESUMABLE_CHANGES: tuple[str, ...] = ()

    def __init__(self, cfg: Config, workdir: str | Path, *, quiet: bool = False, devices=None,
                 train_env: str | None = None, check_shards: Callable[[int], None] | None = None,
                 build_on_mesh: bool = True):
        """`train_env`: the key of `text_envs` the run trains on (default `cfg.env.train_key`).
        `check_shards(n)`: the trainer's batch-vs-mesh checks, run as soon as the mesh exists.
        `build_on_mesh`: create the parameters directly in their mesh shardings; off, they are made
        on one device and then placed (the SFT trainer's way; the same placement afterwards)."""
        self.cfg = cfg.validate()
        self.workdir = run_path(workdir)  # a bucket URL stays one; a local path becomes absolute
        self.quiet = quiet
        self.lora = cfg.model.lora_rank > 0
        self.logger = None
        self.interrupted: str | None = None  # the signal that stopped `train()` early, if one did
        # Decided by process 0 and raised on every process (a host with another view of the disk
        # must not go its own way while the others wait in a collective).
        on_primary(lambda: check_run_dir_config(self.workdir, self.cfg, self.RESUMABLE_CHANGES))

        self.mesh = build_mesh(cfg, devices)
        self.n_batch_shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if check_shards is not None:
            check_shards(self.n_batch_shards)

        self.tokenizer = load_task_tokenizer(cfg)
        self.text_envs = build_text_envs(cfg, self.tokenizer)
        self.text_env = self.text_envs[train_env or cfg.env.train_key]  # a MixedTextEnv with env.mix
        self.vocab = build_vocab(cfg, self.text_envs, self.tokenizer)
        self.policy = build_policy(cfg, self.vocab, mesh=self.mesh if build_on_mesh else None)
        self.policy_graph, params = nnx.split(self.policy)
        self.initial_params = init_policy_params(cfg, self.policy_graph, self.put(params), self.mesh)  # e.g. a warm start
        if cfg.model.base_quant != "none":  # QLoRA: the final base, stored quantized for every program
            self.policy = quantize_policy(cfg, nnx.merge(self.policy_graph, self.initial_params), self.mesh)
            self.policy_graph, params = nnx.split(self.policy)
            # A State of its own: `take_trainable` empties the module's.
            self.initial_params = jax.tree.map(lambda x: x, params)
        self.frozen, self.frozen_args = None, ()

    def put(self, tree):
        """`tree` placed in its mesh shardings (the model's sharding table)."""
        return jax.device_put(tree, param_shardings(tree, self.mesh)) if tree else tree

    def replicated(self, x):
        """`x` on every device of the mesh (a scalar of the train state)."""
        return jax.device_put(x, NamedSharding(self.mesh, PartitionSpec()))

    def take_trainable(self):
        """The part of `initial_params` that trains (all of it; with LoRA the adapters, the base then
        being `self.frozen`, a program argument that is never donated). The policy module keeps only
        its graph and shapes: the programs take the parameters as arguments, and holding the initial
        arrays would keep a second copy of the model."""
        params, self.initial_params = self.initial_params, None
        nnx.update(self.policy, abstract(params))
        if self.lora:
            params, self.frozen = nnx.split_state(params, POLICY_TRAINABLE, ...)
        self.frozen_args = () if self.frozen is None else (self.frozen,)
        return params

    def restore_or_start(self, state):
        """`self.state`: the run directory's last complete checkpoint of `state`'s structure, else
        `state` (raises CheckpointError naming the path of a corrupt one). `self.restored_step`: that
        checkpoint's step (None: a fresh start); `self.restored_extra`: its JSON metadata ({} if none)."""
        self.ckpt = Checkpointer(self.workdir / "checkpoints", keep=self.cfg.train.keep_checkpoints)
        self.state, self.restored_step, self.restored_extra = state, None, {}
        latest = self.ckpt.latest_step()
        if latest is not None:
            self.state, self.restored_extra = self.ckpt.restore(latest, state)
            self.restored_step = latest

    def open_logger(self) -> Logger:
        """The run's Logger, keeping exactly the rows of the steps its checkpoint holds (a run killed
        after its last checkpoint logged steps it now logs again)."""
        self.logger = Logger(self.workdir, keep_through=-1 if self.restored_step is None else self.restored_step)
        return self.logger

    def export_policy(self, trainable, workdir=None) -> None:
        """`<run>/policy` (merged with LoRA) and, with LoRA, `<run>/adapter` from the trained parameters
        (`experiment.policy_export`); every process calls it."""
        save_policy_exports(self.workdir if workdir is None else workdir, self.policy_graph, trainable,
                            self.frozen if self.lora else None, self.cfg.model.path)

    def stop_requested(self) -> bool:
        """Whether SIGTERM / SIGINT reached any process (`infra.preemption`; a collective: every process
        asks at the same point of the loop, so all stop after the same step). Records the signal in
        `self.interrupted`."""
        if not STOP.agreed():
            return False
        self.interrupted = STOP.signal or "a stop signal to another process"
        STOP.reset()
        return True

    def note(self, msg: str) -> None:
        """One line for the user (process 0, unless quiet), above any progress bar."""
        if not self.quiet and jax.process_index() == 0:
            tqdm.write(msg)

    def save_run_files(self, workdir=None) -> None:
        """config.json (and the task vocabulary) in `workdir` (default the run's), by process 0."""
        save_run_files(self.workdir if workdir is None else workdir,
                       json.loads(json.dumps(self.cfg.to_dict(), default=str)), self.vocab)


__all__ = ["RunAssembly", "abstract"]
