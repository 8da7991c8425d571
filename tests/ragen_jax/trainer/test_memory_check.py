"""Fail before running: the Trainer compiles its rollout, prepare and update programs ahead of time
when a device memory limit is known (the device's bytes_limit, or `train.device_memory_gib`, the only
way on CPU), and a config whose programs need more stops in __init__ with one sentence naming the
numbers and the knobs. With room to spare it trains with those very executables, and the update's
donated train state is counted once (aliased)."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.rollout import group_seeds_for_iteration
from ragen_jax.trainer.rl import Trainer
from ragen_jax.trainer.memory import GIB, bytes_per_device

FAST = ["--config.train.iterations=1", "--config.train.val_every=0", "--config.rollout.num_groups=2",
        "--config.rollout.group_size=4", "--config.filter.value=0.5", "--config.batching.mini_batch_size=4",
        "--config.batching.micro_batch_size=2", "--config.prompt.max_turns=2", "--config.prompt.max_response_tokens=8",
        "--config.rollout.max_context=384", "--config.mesh.data=1"]
# 384 = the 167-token prompt prefix + 2 turn segments of up to 108 tokens (the rollout refuses less): the
# smallest context that holds both turns, so every program is as small as the truths allow.


def _nbytes(tree) -> int:
    return sum(np.asarray(x).nbytes for x in jax.tree.leaves(jax.device_get(tree)))


def test_too_small_device_fails_before_the_first_iteration(tmp_path):
    cfg = load_config("tiny_cpu.py", [*FAST, "--config.train.device_memory_gib=0.001"])  # about 1 MiB
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, tmp_path / "run", quiet=True)
    msg = str(e.value)
    assert "program needs" in msg and "per device" in msg and "but the device has 1.0 MiB" in msg
    # The rollout is checked first; its knob is the number of groups generated at a time.
    assert "compiled rollout program" in msg
    for knob in ("rollout.groups_per_pass (now 2 of 2)", "mesh.fsdp (now 1)"):
        assert knob in msg
    assert "\n" not in msg
    assert not (tmp_path / "run").exists()  # nothing written


def test_programs_that_fit_run_with_the_checked_executables(tmp_path):
    cfg = load_config("tiny_cpu.py", [*FAST, "--config.train.device_memory_gib=64"])
    tr = Trainer(cfg, tmp_path / "run", quiet=True)
    assert set(tr.memory) == {"rollout", "prepare", "update"}
    state_bytes = _nbytes(tr.state)
    assert bytes_per_device(tr.state) == state_bytes  # one device: the whole arrays
    update, resident = tr.memory["update"]
    # The donated train state is written in place: XLA aliases every byte of it to an output.
    assert update["alias_bytes"] == state_bytes
    # During the rollout the optimizer states and the critic stay on the device: counted as resident.
    _, rollout_resident = tr.memory["rollout"]
    assert rollout_resident == bytes_per_device((tr.state.actor_opt, tr.state.critic, tr.state.critic_opt))
    assert max(m["peak_bytes"] + r for m, r in tr.memory.values()) < 64 * GIB
    # The compiled executables are the Trainer's own (nothing pushed into the Rollout): its jitted
    # programs still export, after the check as before it.
    assert set(tr.compiled) == {"rollout", "prepare", "update"}
    assert set(tr.export_for("cpu", programs=("prepare",))) == {"prepare"}
    hist = tr.train()
    assert len(hist) == 1 and math.isfinite(hist[0]["actor/pg_loss"]) and math.isfinite(hist[0]["critic/value_loss"])
    # XLA's argument and output sizes of the checked update are the real call's arrays, counted by numpy:
    # the train state and the prepared batch in (less the reference log-probs: KL is off, the program
    # never reads them and jit drops unread inputs), the new state and the metrics out (XLA:CPU returns
    # several outputs through a table of one 8-byte pointer each).
    traj = tr.rollout(tr.actor_params, jax.random.PRNGKey(1), group_seeds_for_iteration(1, 2, cfg.train.seed_base))
    batch, _ = tr.prepare_fn(tr.state.actor, tr.state.critic, tr.ref, traj, *tr.frozen_args)
    assert cfg.loss.kl_coef == 0
    inputs = _nbytes((tr.state, batch, *tr.frozen_args)) - _nbytes(batch.ref_logp)
    out = tr.update_fn(tr.state, batch, *tr.frozen_args)
    outputs = _nbytes(out) + 8 * len(jax.tree.leaves(out))
    assert (update["argument_bytes"], update["output_bytes"]) == (inputs, outputs)

    # A limit between what the largest other program and the update need: the update's knobs are named.
    need = {k: m["peak_bytes"] + r for k, (m, r) in tr.memory.items()}
    others = max(v for k, v in need.items() if k != "update")
    if need["update"] > others:
        limit_gib = (others + need["update"]) / 2 / GIB
        with pytest.raises(ConfigError, match=r"compiled update program .* lower batching.micro_batch_size \(now 2\), "
                                              r"set model.remat=true"):
            Trainer(load_config("tiny_cpu.py", [*FAST, f"--config.train.device_memory_gib={limit_gib}"]),
                    tmp_path / "tight", quiet=True)


def test_remat_auto_is_decided_by_memory(tmp_path):
    """model.remat unset (auto) for a model from a path: remat costs the backward a second forward, so
    the update runs without it when every program fits the device that way, and with it only when not.
    Truth: the programs of runs with model.remat set explicitly (their memory_analysis)."""
    from flax import nnx

    from ragen_jax.models import Qwen2, Qwen2Config, save_pretrained

    hf = tmp_path / "hf"
    save_pretrained(Qwen2(Qwen2Config.from_preset("tiny"), nnx.Rngs(0)), str(hf))
    # One turn in a context that holds it: four full-vocabulary trainers (151,936 logits per token), so
    # every token less is felt; the remat relations compared do not depend on the number of turns.
    base = [*FAST, "--config.prompt.max_turns=1", "--config.rollout.max_context=288", "--config.model.random_init=false",
            f"--config.model.path={hf}", "--config.model.vocab=full", "--config.model.critic=none",
            "--config.advantage.estimator=grpo"]

    def trainer(name, *extra):
        return Trainer(load_config("tiny_cpu.py", [*base, *extra]), tmp_path / name, quiet=True)

    def need(tr):
        return {k: m["peak_bytes"] + r for k, (m, r) in tr.memory.items()}

    roomy = "--config.train.device_memory_gib=64"
    on, off = need(trainer("on", roomy, "--config.model.remat=true")), need(trainer("off", roomy, "--config.model.remat=false"))
    assert on["update"] < off["update"]  # remat saves memory (the stored activations)
    auto = trainer("auto", roomy)
    assert auto.cfg.model.remat is None and auto.cfg.model.use_remat  # the size rule alone would say on
    assert auto.remat is False and need(auto) == off  # everything fits: the no-remat programs

    # A device between the two: the update fits only with remat.
    tight = (max(on["update"], off["rollout"], off["prepare"]) + off["update"]) / 2
    assert max(on["update"], on["rollout"], on["prepare"]) < tight < off["update"]
    auto = trainer("auto_tight", f"--config.train.device_memory_gib={tight / GIB}")
    assert auto.remat is True and need(auto) == on
    # The second try compiled only the update: the rollout and prepare programs (no backward, so no
    # remat) of the first were kept, and their memory is the remat run's.
    assert auto.programs.trace_counts["prepare"] == 0 and auto.programs.trace_counts["update"] == 1
    assert math.isfinite(auto.train()[0]["actor/pg_loss"])
