"""The training programs of a config without a device: abstract (nothing allocated) and exported for
another platform.

    rollout, prepare, update, state, frozen, mesh = abstract_programs(cfg)
    exported = export_programs(rollout, prepare, update, state, None, key, seeds, platform="tpu")

`abstract_programs` builds the Trainer's three programs (rollout, prepare, update: the same jitted
functions, shardings and donation) from ABSTRACT parameters: `nnx.eval_shape` for the models and
their optimizer states, placed by the mesh's `param_shardings` as ShapeDtypeStructs. bench/memory.py
compiles them for this machine to read their memory; `export_programs` traces and lowers them with
`jax.export` for a TPU or a GPU from any machine (no compilation: a lowering failure shows here, an
out-of-memory does not). The Trainer exports its own programs the same way (`Trainer.export_for`).

Trace-time choices that read the tracing process's backend stay the CPU's in a program exported from
a CPU (the model's CPU-only layer-scan and cache-write layouts: bit-exact, a speed matter); the
splash kernel vs its interpreter is chosen at lowering (`attention.py`), and `model.attention="auto"`
resolves for the tracing backend, so an export names its kernel explicitly (xla, chunked, splash;
cudnn needs the cuDNN library at trace time, i.e. a GPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ragen_jax.models import Qwen2, Qwen2Config, critic_from_policy, on_mesh, param_shardings
from ragen_jax.models.lora import CRITIC_TRAINABLE, POLICY_TRAINABLE, add_lora
from ragen_jax.models.quant import quantize_base
from ragen_jax.rollout import Rollout
from ragen_jax.rollout.rollout import turn_blocks
from ragen_jax.trainer.group_prefix import group_shape_of
from ragen_jax.experiment.config import Config, ConfigError
from ragen_jax.trainer.optim import make_optimizer
from ragen_jax.experiment.build import build_mesh, build_text_envs, build_vocab, load_task_tokenizer
from ragen_jax.trainer.step import StepPrograms, StepSettings, TrainState, full_params

# `jax.export` platform names (a GPU backend is "cuda" or "rocm" there, "gpu" in jax.default_backend()).
EXPORT_PLATFORMS = ("tpu", "cuda", "rocm", "cpu")
PROGRAMS = ("rollout", "prepare", "update")


def abstract_programs(cfg: Config, donate: bool = True, devices=None):
    """(rollout, prepare jit, update jit, abstract TrainState, abstract frozen LoRA base or None, mesh) of
    a config, split as the Trainer splits it (`rl.Trainer.__init__`); nothing is allocated. The mesh is
    `cfg.mesh` over `devices` (default: this process's devices)."""
    m = cfg.model
    if m.base_quant == "gguf":
        raise ConfigError("abstract programs are built from model.preset, and model.base_quant=gguf needs its "
                          ".gguf file's blocks; measure the same shapes with model.base_quant=int4 (Q4_0's bytes)")
    n = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor
    devices = list(devices if devices is not None else jax.devices())
    mesh = build_mesh(cfg, devices[:n] if n > 0 else devices)
    tokenizer = load_task_tokenizer(cfg)
    text_envs = build_text_envs(cfg, tokenizer)
    text_env = text_envs[cfg.env.train_key]
    vocab = build_vocab(cfg, text_envs, tokenizer)
    overrides = dict(dtype=m.dtype, param_dtype=m.param_dtype, matmul_dtype=m.matmul_dtype, remat=m.use_remat,
                     remat_policy=m.remat_policy, attention=m.attention)
    if vocab is not None:
        overrides["vocab_size"] = vocab.size
    qcfg = Qwen2Config.from_preset(m.preset).replace(**overrides)

    def sds(tree):
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                            param_shardings(tree, mesh))

    def make_policy():
        policy = Qwen2(qcfg, rngs=nnx.Rngs(0))
        if m.lora_rank:  # as setup._with_lora: float32 adapters on the (maybe bf16) base
            add_lora(policy, m.lora_rank, m.lora_alpha, m.lora_targets, rngs=nnx.Rngs(3))
        quantize_base(policy, m.base_quant)  # as build.quantize_policy (QLoRA; "none": unchanged)
        return policy

    policy = nnx.eval_shape(make_policy)
    graph, actor = nnx.split(policy)
    actor = sds(actor)
    frozen = None
    if m.lora_rank:  # the train state holds the adapters; the base is the programs' frozen argument
        actor, frozen = nnx.split_state(actor, POLICY_TRAINABLE, ...)
    critic_graph, critic = None, {}
    if m.critic == "separate" and cfg.advantage.record.needs_critic:
        critic_model = nnx.eval_shape(lambda: critic_from_policy(make_policy(), nnx.Rngs(1)))
        critic_graph, critic = nnx.split(critic_model)
        critic = sds(critic)
        if m.lora_rank:  # its trunk base is the actor's: only adapters + value head are its own
            critic = nnx.split_state(critic, CRITIC_TRAINABLE, ...)[0]
    actor_opt = make_optimizer(cfg.optim.actor_lr, cfg.optim)
    critic_opt = make_optimizer(cfg.optim.critic_lr, cfg.optim)
    rep = NamedSharding(mesh, PartitionSpec())
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
    state = TrainState(
        iteration=scalar, key=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep), actor=actor,
        actor_opt=sds(jax.eval_shape(actor_opt.init, actor)), critic=critic,
        critic_opt=sds(jax.eval_shape(critic_opt.init, critic)) if critic_graph is not None else {},
        skipped_updates=scalar)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    blocks = turn_blocks(text_env) if cfg.prompt.single_turn else None
    programs = StepPrograms(StepSettings.of(cfg), graph, critic_graph, actor_opt, critic_opt, vocab=vocab, turn_blocks=blocks,
                            batch_shards=shards, shared_prefix=turn_blocks(text_env)[0],
                            group_prefix=group_shape_of(text_env, cfg.rollout.max_context))
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    prepare = jax.jit(on_mesh(programs.prepare, mesh))
    update = jax.jit(on_mesh(programs.update, mesh), out_shardings=(state_shardings, None),
                     donate_argnums=(0,) if donate else ())
    rollout = Rollout(policy, text_env, cfg.rollout, mesh=mesh, vocab=vocab, state_keys=cfg.advantage.needs_state_keys)
    return rollout, prepare, update, state, frozen, mesh


def abstract_inputs(cfg: Config, mesh):
    """(key, group seeds) of iteration 0 as replicated ShapeDtypeStructs."""
    rep = NamedSharding(mesh, PartitionSpec())
    return (jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep),
            jax.ShapeDtypeStruct((cfg.rollout.num_groups,), jnp.int32, sharding=rep))


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def _outputs(exported, mesh):
    """The exported program's outputs as ShapeDtypeStructs with their shardings on `mesh` (None where
    the program leaves the choice to the compiler): the next program's inputs."""
    shardings = exported.out_shardings_jax(mesh)
    leaves = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(exported.out_avals, shardings)]
    return jax.tree.unflatten(exported.out_tree, leaves)


def check_platform(platform: str) -> None:
    if platform not in EXPORT_PLATFORMS:
        raise ConfigError(f"export platform {platform!r} is unknown; choose one of {', '.join(EXPORT_PLATFORMS)}")


def export_programs(rollout, prepare_jit, update_jit, state: TrainState, ref, key, group_seeds, *, platform: str,
                    mesh, frozen=None, programs=PROGRAMS) -> dict:
    """{name: jax.export.Exported} of the rollout, prepare and update programs named in `programs`, for
    `platform`, each one's inputs being the previous one's outputs (as `memory.aot_compile`, without
    compiling). A program not named is only traced for its output shapes (`jax.eval_shape`), which is
    cheaper than lowering it. `state`, `ref`, `frozen`: arrays or ShapeDtypeStructs with shardings on
    `mesh`."""
    check_platform(platform)
    unknown = [p for p in programs if p not in PROGRAMS]
    if unknown:
        raise ConfigError(f"program {unknown[0]!r} is unknown; choose from {', '.join(PROGRAMS)}")
    st, ref, frozen = _abstract(state), _abstract(ref), _abstract(frozen)
    with_frozen = () if frozen is None else (frozen,)  # the full-training programs take no frozen argument
    out = {}

    def step(name, export, shapes, *args):
        if name in programs:
            out[name] = export(*args)
            return _outputs(out[name], mesh)
        return None if shapes is None else shapes(*args)

    traj = step("rollout", functools.partial(rollout.export, platform), functools.partial(jax.eval_shape, rollout),
                full_params(st.actor, frozen), key, group_seeds)
    batch = step("prepare", jax.export.export(prepare_jit, platforms=[platform]),
                 functools.partial(jax.eval_shape, prepare_jit), st.actor, st.critic, ref, traj, *with_frozen)[0]
    step("update", jax.export.export(update_jit, platforms=[platform]), None, st, batch, *with_frozen)
    return out


def custom_calls(exported) -> set[str]:
    """The custom-call targets of an exported program's StableHLO (e.g. "tpu_custom_call" for a Pallas
    TPU kernel, "__cudnn$fmhaSoftmax..." for cuDNN attention)."""
    text = exported.mlir_module()
    found = set()
    for part in text.split("stablehlo.custom_call @")[1:]:
        found.add(part.split("(", 1)[0].strip())
    return found


__all__ = ["EXPORT_PLATFORMS", "PROGRAMS", "abstract_inputs", "abstract_programs", "check_platform", "custom_calls",
           "export_programs"]
