"""Orbax checkpoints of the whole training state, and exact resumption.

A checkpoint holds the policy and critic parameters, both optimizer states, the iteration counter
and the RNG key, plus `extra`: small JSON the trainer needs to continue exactly (the early-stop
counters, the echo-trap window, whether the run stopped early). With LoRA the "parameters" are what
trains (adapters, the critic's value head): the frozen base is rebuilt from the config (model.path /
init_from / the seeded preset) and never saved. The data position needs no extra field: iteration
i's training seeds are `seed_base + P*i + g`, a function of the counter. Orbax writes into a
temporary directory and renames it when the save is complete, so a run killed mid-save resumes from
the last COMPLETE checkpoint; a half-written one is ignored (and cleaned up).

Several processes: every process calls `save` / `restore` / `save_policy` (orbax writes each
process's shards and has process 0 create directories and commit the step), and the directory must
be one that all of them see (a bucket, or a shared file system). Run files (config.json,
vocab.json) are written by process 0 alone. Paths may be bucket URLs (`gs://...`, see `run_path`).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import jax
import orbax.checkpoint as ocp

from ragen_jax.infra.distributed import run_path


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, named with its path and the reason."""


class Checkpointer:
    def __init__(self, directory, keep: int = 3):
        # Orbax needs absolute paths (it rejects relative ones only when an async save finishes,
        # long after the mistake): made absolute here, once (bucket URLs are left as they are).
        self.directory = run_path(directory)
        if jax.process_index() == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._mngr = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, cleanup_tmp_directories=True),
        )

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mngr.all_steps())

    def save(self, step: int, state: Any, extra: dict | None = None) -> None:
        """Save `state` (a pytree of arrays) as `step`; `extra` is small JSON metadata."""
        args = {"state": ocp.args.StandardSave(state)}
        if extra is not None:
            args["extra"] = ocp.args.JsonSave(extra)
        self._mngr.save(step, args=ocp.args.Composite(**args))

    def restore(self, step: int, like: Any) -> tuple[Any, dict]:
        """Restore into the structure, shapes, dtypes and shardings of `like` (a pytree of arrays)."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        try:
            out = self._mngr.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), extra=ocp.args.JsonRestore()))
        except Exception as e:  # orbax raises many types; the user needs the path and the reason
            raise CheckpointError(
                f"checkpoint {self.directory / str(step)} cannot be restored ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else 'no detail'}); it may be corrupt or from a "
                "different model/config. Move it away to resume from an earlier one.") from None
        state = out["state"]
        got = jax.tree.structure(state)
        if got != jax.tree.structure(like):
            raise CheckpointError(f"checkpoint {self.directory / str(step)} has a different structure than this run")
        return state, dict(out.get("extra") or {})

    def wait(self) -> None:
        self._mngr.wait_until_finished()

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()


def _write_whole(path, text: str) -> None:
    """`text` into `path` through a temporary file: a kill meanwhile leaves the old file or the new one."""
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def save_run_config(workdir, config_dict: dict) -> None:
    """The config of a run, written once; a resumed run checks it has not changed in ways that matter."""
    _write_whole(run_path(workdir) / "config.json", json.dumps(config_dict, indent=2, sort_keys=True, default=str))


def save_run_files(workdir, config_dict: dict, vocab=None) -> None:
    """config.json and (for a small task vocabulary) vocab.json, by process 0 alone; the run
    directory is created first. Call it on every process."""
    if jax.process_index() != 0:
        return
    workdir = run_path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    save_run_config(workdir, config_dict)
    if vocab is not None:  # eval/RL read the task vocabulary from the run dir
        # VocabMap writes local files; through a local temporary file so a bucket works as well.
        with tempfile.TemporaryDirectory() as tmp:
            vocab.save(os.path.join(tmp, "vocab.json"))
            _write_whole(workdir / "vocab.json", open(os.path.join(tmp, "vocab.json")).read())


POLICY_DIR = "policy"


def save_policy(workdir, params: Any):
    """Export the policy parameters alone (`<workdir>/policy`), e.g. the SFT warm start for RL.
    A collective save: every process calls it (each writes its shards)."""
    path = run_path(workdir) / POLICY_DIR
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path, params, force=True)
    ckptr.wait_until_finished()
    ckptr.close()
    return path


def load_policy_params(source, like: Any) -> Any:
    """Policy parameters from `<source>/policy` (an SFT or RL export), restored into `like`'s
    structure, shapes and shardings. Raises CheckpointError naming the path on any mismatch."""
    src = run_path(source)
    path = src / POLICY_DIR if (src / POLICY_DIR).is_dir() else src
    if not path.is_dir():
        raise CheckpointError(f"no policy export at {path} (expected a directory written by save_policy)")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    try:
        return ocp.StandardCheckpointer().restore(path, abstract)
    except Exception as e:
        raise CheckpointError(f"policy export {path} cannot be restored ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else 'no detail'}); it may come from a "
                              "different model shape") from None
