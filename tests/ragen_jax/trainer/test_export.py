"""The training programs lower for the accelerators from this CPU (`jax.export`: trace + lower, no
compile): the Trainer's rollout, prepare and update of a small config, and the 0.5B reference config's
update from abstract parameters, for a TPU (the Pallas splash kernel, bf16) and a GPU (xla and chunked
attention, bf16), sharded over the 8 simulated devices where the kernel allows. A lowering failure on
either platform fails here, before an accelerator session is spent on it.

The truth: what the lowered StableHLO holds (its platforms, device count, the Pallas TPU custom call
where splash must be the real kernel and not its interpreter, the argument shapes and shardings of
the train state)."""

from __future__ import annotations

import jax
import pytest

from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.trainer.export import abstract_inputs, abstract_programs, custom_calls, export_programs
from ragen_jax.trainer.rl import Trainer

PALLAS_TPU = "tpu_custom_call"
SMALL = ["--config.model.dtype=bfloat16", "--config.train.val_every=0", "--config.rollout.num_groups=8",
         "--config.rollout.group_size=2", "--config.filter.value=0.5", "--config.batching.mini_batch_size=8",
         "--config.prompt.max_turns=2", "--config.prompt.max_response_tokens=8", "--config.rollout.max_context=512"]
REFERENCE = ["model.random_init=true", "model.preset=qwen2.5-0.5b", "model.dtype=bfloat16"]


def _export_small(attention: str, platform: str, data: int, programs=("rollout", "prepare", "update")):
    cfg = load_config("tiny_cpu.py", [*SMALL, f"--config.model.attention={attention}", f"--config.mesh.data={data}"])
    rollout, prepare, update, state, frozen, mesh = abstract_programs(cfg)
    key, seeds = abstract_inputs(cfg, mesh)
    return export_programs(rollout, prepare, update, state, None, key, seeds, platform=platform, mesh=mesh,
                           frozen=frozen, programs=programs), state


def test_small_programs_export_for_tpu_with_the_splash_kernel():
    out, state = _export_small("splash", "tpu", data=1)
    assert set(out) == {"rollout", "prepare", "update"}
    for exp in out.values():
        assert exp.platforms == ("tpu",) and exp.nr_devices == 1
    # Prepare (no-grad log-probs and values) and update (forward + backward) run the no-cache forward:
    # splash, the real Mosaic kernel. The rollout's cached layout never uses it.
    assert PALLAS_TPU in custom_calls(out["prepare"]) and PALLAS_TPU in custom_calls(out["update"])
    assert PALLAS_TPU not in custom_calls(out["rollout"])
    # The update takes the train state as its first argument: every leaf, in order, with its shape.
    n = len(jax.tree.leaves(state))
    assert [(a.shape, a.dtype) for a in out["update"].in_avals[:n]] == [(x.shape, x.dtype)
                                                                         for x in jax.tree.leaves(state)]


def test_splash_is_the_interpreter_when_lowered_for_the_cpu():
    """The kernel-or-interpreter choice follows the platform a program is lowered for, not the tracing
    process's backend: the same config lowered for the CPU holds no Mosaic call."""
    out, _ = _export_small("splash", "cpu", data=1, programs=("prepare",))
    assert PALLAS_TPU not in custom_calls(out["prepare"])


def test_splash_exports_sharded_over_the_data_axis():
    """The kernel runs in a shard_map over the mesh (models/attention.py `partitioned`): the no-grad
    pass and the update (forward + backward) lower for 8 TPU devices with the Mosaic kernel inside."""
    out, _ = _export_small("splash", "tpu", data=8, programs=("prepare", "update"))
    for exp in out.values():
        assert exp.platforms == ("tpu",) and exp.nr_devices == 8 and PALLAS_TPU in custom_calls(exp)


@pytest.mark.parametrize("attention", ["xla", "chunked"])
def test_trainer_programs_export_for_cuda_sharded_over_eight_devices(tmp_path, attention):
    cfg = load_config("tiny_cpu.py", [*SMALL, f"--config.model.attention={attention}", "--config.mesh.data=8"])
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    out = tr.export_for("cuda")
    for exp in out.values():
        assert exp.platforms == ("cuda",) and exp.nr_devices == 8
        assert PALLAS_TPU not in custom_calls(exp)
    # The update's arguments carry the Trainer's shardings: the first parameter leaf as placed on the mesh.
    leaves = jax.tree.leaves(tr.state)
    shardings = out["update"].in_shardings_jax(tr.mesh)[:len(leaves)]
    for x, s in zip(leaves, shardings):
        assert s.is_equivalent_to(x.sharding, x.ndim)
    with pytest.raises(ConfigError, match="export platform 'gpu' is unknown"):
        tr.export_for("gpu")


@pytest.mark.parametrize("attention,platform,data", [("splash", "tpu", 1), ("xla", "cuda", 8), ("chunked", "cuda", 8)])
def test_reference_update_exports_at_half_a_billion_parameters(attention, platform, data):
    """configs/sokoban.py at Qwen2.5-0.5B (P=8 x N=16, 3,600-token context, PPO with a critic) from
    abstract parameters: only the update is lowered (the rollout and prepare are traced for shapes)."""
    cfg = load_config("sokoban.py", [*REFERENCE, f"model.attention={attention}", f"mesh.data={data}"])
    rollout, prepare, update, state, frozen, mesh = abstract_programs(cfg)
    key, seeds = abstract_inputs(cfg, mesh)
    out = export_programs(rollout, prepare, update, state, None, key, seeds, platform=platform, mesh=mesh,
                          frozen=frozen, programs=("update",))
    exp = out["update"]
    assert set(out) == {"update"} and exp.platforms == (platform,) and exp.nr_devices == data
    assert (PALLAS_TPU in custom_calls(exp)) == (attention == "splash")
    embed = [a for a in exp.in_avals if a.shape == (151936, 896)]
    assert embed and all(a.dtype == jax.numpy.float32 for a in embed)  # float32 master weights, bf16 compute
    # The batch: 32-row mini-batches of the 3,600-token rows (K kept trajectories).
    assert any(a.shape[-1:] == (3600,) for a in exp.in_avals)


def test_splash_over_several_devices_is_no_longer_refused(tmp_path):
    """The mesh-size refusal is gone: a Trainer with 'splash' over 8 devices stops only at the backend
    check (this CPU is no TPU; `abstract_programs` above traces the same programs on the mesh)."""
    cfg = load_config("tiny_cpu.py", [*SMALL, "--config.model.attention=splash", "--config.mesh.data=8"])
    with pytest.raises(ConfigError, match="runs only on a TPU"):
        Trainer(cfg, tmp_path / "run", quiet=True)
