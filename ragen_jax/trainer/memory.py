"""Memory accounting of the compiled programs: each program's bytes per device from XLA's memory
analysis (`program_memory`), the training state that stays resident beside it (`bytes_per_device`),
the device's limit, and the fail-before-running check (`check_memory_fits`) with the knobs to turn.
`aot_compile` compiles one iteration's three programs ahead of time for these numbers."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.experiment.config import Config, ConfigError
from ragen_jax.trainer.step import TrainState, effective_micro_batch, full_params

GIB = 2**30


def program_memory(compiled) -> dict:
    """Bytes per device of one compiled program (`jax.jit(f).lower(...).compile()`), from XLA's
    memory_analysis. peak = arguments + outputs - aliased + temporaries: the inputs and outputs are
    all alive at the end of the program, except outputs written into donated inputs (aliased,
    counted once), and the temporaries are XLA's peak scratch allocation. Generated code is left out."""
    m = compiled.memory_analysis()
    out = {"argument_bytes": int(m.argument_size_in_bytes), "output_bytes": int(m.output_size_in_bytes),
           "alias_bytes": int(m.alias_size_in_bytes), "temp_bytes": int(m.temp_size_in_bytes)}
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
    return out


def bytes_per_device(tree) -> int:
    """Bytes the arrays (or ShapeDtypeStructs with a sharding) of `tree` take on one device: each
    array's shard shape (its whole shape when it has no sharding) times its item size."""
    total = 0
    for x in jax.tree.leaves(tree):
        sharding = getattr(x, "sharding", None)
        shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
        n = 1
        for d in shape:
            n *= int(d)
        total += n * jnp.dtype(x.dtype).itemsize
    return total


def device_memory_limit(cfg: Config, device) -> int | None:
    """The bytes the programs must fit in: `train.device_memory_gib` when set, else the device's own
    `bytes_limit` (GPU/TPU); None where neither exists (CPU): no check."""
    if cfg.train.device_memory_gib:
        return int(cfg.train.device_memory_gib * GIB)
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001  backends without memory stats raise (or return None)
        stats = None
    limit = (stats or {}).get("bytes_limit")
    return int(limit) if limit else None


def _abstract(tree):
    """ShapeDtypeStructs carrying each array's sharding (ShapeDtypeStructs pass through)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def _outputs(compiled):
    return jax.tree.map(lambda i, sh: jax.ShapeDtypeStruct(i.shape, i.dtype, sharding=sh),
                        compiled.out_info, compiled.output_shardings)


def aot_compile(rollout, prepare_jit, update_jit, state: TrainState, ref, key, group_seeds, frozen=None,
                reuse: dict | None = None):
    """Compile the three programs of one iteration ahead of time for the shapes and shardings of
    `state`, `ref` and the LoRA base `frozen` (arrays, or ShapeDtypeStructs with shardings: nothing
    is allocated), each one's inputs being the previous one's outputs. Returns ({name: compiled}, {name: (program_memory,
    resident bytes per device)}), the resident bytes being the train state (and reference policy,
    and the trajectories during the update) that stay on the device while the program runs without
    being among its arguments (the input of `check_memory_fits`). `reuse`: {name: compiled} of
    programs already compiled for these inputs (not compiled again)."""
    reuse = reuse or {}
    st, ref, frozen = _abstract(state), _abstract(ref), _abstract(frozen)
    compiled_rollout = reuse.get("rollout") or rollout.lower(full_params(st.actor, frozen), key, group_seeds).compile()
    traj = _outputs(compiled_rollout)
    extra = () if frozen is None else (frozen,)  # the full-training programs take no frozen argument
    prepare = reuse.get("prepare") or prepare_jit.lower(st.actor, st.critic, ref, traj, *extra).compile()
    batch = _outputs(prepare)[0]
    update = reuse.get("update") or update_jit.lower(st, batch, *extra).compile()
    ref_bytes = bytes_per_device(ref) if ref is not None else 0
    # The LoRA base is among every program's arguments (the rollout's actor = base + adapters, the
    # `frozen` argument of prepare and update): counted in their peaks, never as resident.
    usage = {
        "rollout": (program_memory(compiled_rollout), bytes_per_device((st.actor_opt, st.critic, st.critic_opt)) + ref_bytes),
        "prepare": (program_memory(prepare), bytes_per_device((st.actor_opt, st.critic_opt))),
        "update": (program_memory(update), ref_bytes + bytes_per_device(traj)),
    }
    return {"rollout": compiled_rollout, "prepare": prepare, "update": update}, usage


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB // 10 else f"{n / 2**20:.1f} MiB"


def check_memory_fits(cfg: Config, usage: dict, limit: int) -> None:
    """Raise ConfigError when a program does not fit. `usage`: program name -> (program_memory dict,
    bytes per device of what stays resident while it runs without being one of its arguments, e.g.
    the optimizer state during the rollout). Needed = peak + resident."""
    for name, (mem, resident) in usage.items():
        need = mem["peak_bytes"] + resident
        if need > limit:
            a = cfg.batching
            micro = effective_micro_batch(a.mini_batch_size, a.micro_batch_size)
            if name == "rollout":  # its largest buffer is the KV cache of all P x N rows
                knobs = (f"generate fewer groups at a time with rollout.groups_per_pass (now "
                         f"{cfg.rollout.groups_per_pass or cfg.rollout.num_groups} of {cfg.rollout.num_groups})")
            else:
                knobs = (f"lower batching.micro_batch_size (now {micro}), set model.remat=true (now "
                         f"{str(cfg.model.use_remat).lower()})")
            if cfg.model.lora_rank and cfg.model.base_quant == "none":  # every program holds the frozen base
                knobs += ", store the frozen base in 4 bits with model.base_quant=nf4"
            raise ConfigError(
                f"the compiled {name} program needs {_size(need)} per device ({_size(mem['peak_bytes'])} "
                f"of arguments + outputs - donated + temporaries, plus {_size(resident)} of training state "
                f"held between programs) but the device has {_size(limit)}; {knobs} or shard the parameters over "
                f"more devices with mesh.fsdp (now {cfg.mesh.fsdp})")


__all__ = ["GIB", "aot_compile", "bytes_per_device", "check_memory_fits", "device_memory_limit", "program_memory"]
