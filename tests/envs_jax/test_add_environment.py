"""docs/guide/add_environment.md, sections 3 and 4 (the worked example), run verbatim: the env file and its
record, then the env played through TextEnv, the compiled rollout with its own teacher, the SFT warm start
and RL, with nothing outside envs_jax/ edited (the record is registered at run time, as a plug-in would).

The truth: the corridor's rules written again in plain Python below (move, clamp at the ends, reward 1
and the end on the goal), the tokenizer's own encoding of the host text, and the teacher's optimality
(it reaches the goal in |goal - start| moves, within the 8-move budget of a 6-cell corridor)."""

from __future__ import annotations

import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import registry
from ragen_jax.experiment.config import load_config
from ragen_jax.models.qwen2.sharding import make_mesh
from ragen_jax.rollout import Rollout, RolloutConfig
from ragen_jax.rollout.teachers import EnvPolicyTeacher, get_teacher
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.text.tokenizer import load_tokenizer
from ragen_jax.trainer.rl import Trainer
from ragen_jax.trainer.sft import SFTTrainer
from tests.docs_example import code_after, run_example


@pytest.fixture(scope="module")
def corridor():
    module = run_example("guide/add_environment.md", "3. The worked example: Corridor", "envs_jax.corridor")
    exec(compile(code_after("guide/add_environment.md", "4. The record"), "docs/guide/add_environment.md (record)",
                 "exec"),
         dict(vars(registry)))  # the record runs where it is written: in envs_jax/registry.py
    yield module
    envs_jax.unregister("Corridor")
    del sys.modules["envs_jax.corridor"]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _port_step(pos, goal, action, length):
    """The corridor's rules in plain Python -> (pos, reward, arrived)."""
    new = min(max(pos + (1 if action == 1 else -1), 0), length - 1)
    return new, float(new == goal), new == goal


def test_the_record_builds_the_env_and_checks_its_parameters(corridor):
    env, params = envs_jax.make("Corridor", length=5)
    assert isinstance(env, corridor.Corridor) and params.length == 5
    assert envs_jax.get_spec("Corridor").teacher == "env_policy"
    with pytest.raises(ValueError, match="length must be >= 2"):
        envs_jax.make("Corridor", length=1)
    with pytest.raises(ValueError, match="unknown parameter.*'width'.*valid: length, max_steps_in_episode"):
        envs_jax.make("Corridor", width=3)


def test_played_states_follow_the_rules_and_render_exactly(corridor, tok):
    env, params = envs_jax.make("Corridor")
    te = TextEnv(env, params, tok, PromptConfig(max_turns=3))
    step, reset, render = jax.jit(env.step_env), jax.jit(env.reset_env), jax.jit(te.render_ids)
    budget = params.max_steps_in_episode
    rng = np.random.default_rng(0)
    starts = set()
    for seed in range(12):
        _, s = reset(jax.random.PRNGKey(seed), params)
        pos, goal, time, ended = int(s.pos), int(s.goal), 0, False
        starts.add((pos, goal))
        assert pos != goal
        for t in range(budget + 2):
            turn, left = min(t + 1, 3), budget - time
            ids, n = render(s, turn, left, 0.5, True)
            text = te.render_text(s, turn, left, 0.5, True)
            assert np.asarray(ids)[: int(n)].tolist() == tok.encode(text, add_special_tokens=False)
            row = ["_"] * params.length
            row[goal], row[pos] = "G", "P"
            assert te.state_text(s) == "".join(row)
            a = int(rng.integers(2))
            _, s, reward, terminated, info = step(jax.random.PRNGKey(t), s, a, params)
            if ended:  # an ended episode ignores the action
                assert (int(s.pos), float(reward), bool(info["action_is_effective"])) == (pos, 0.0, False)
                continue
            pos, want_reward, arrived = _port_step(pos, goal, a, params.length)
            time += 1
            ended = arrived or time >= budget
            assert (int(s.pos), float(reward), bool(terminated), bool(info["success"]), bool(s.done)) == (
                pos, want_reward, arrived, arrived, ended)
    assert len(starts) > 6  # resets draw varied start / goal pairs


def test_the_rollout_with_its_own_teacher_reaches_every_goal(corridor, tok):
    env, params = envs_jax.make("Corridor")
    te = TextEnv(env, params, tok, PromptConfig(max_turns=8, max_response_tokens=32))
    teacher = get_teacher("Corridor", te)
    assert type(teacher) is EnvPolicyTeacher
    seeds = np.arange(100, 108)
    mesh = make_mesh(data=1, devices=jax.devices()[:1])
    traj = jax.device_get(Rollout(None, te, RolloutConfig(num_groups=8, group_size=1, max_context=1024), mesh=mesh,
                                  teacher=teacher)(None, jax.random.PRNGKey(0), seeds))
    starts = jax.device_get(jax.jit(te.reset_rows)(jnp.asarray(seeds, jnp.int32)))
    for r in range(len(seeds)):
        distance = abs(int(starts.goal[r]) - int(starts.pos[r]))
        # One action per turn, each toward the goal: |goal - start| turns, success, format kept.
        assert bool(traj.success[r]) and int(traj.num_turns[r]) == distance
        assert bool(traj.action_is_valid[r]) and int(traj.num_format_errors[r]) == 0
        assert int(traj.num_actions[r]) == int(traj.num_effective[r]) == distance


def test_sft_from_its_teacher_then_rl(corridor, tmp_path):
    # A 4-cell corridor: every goal is at most 3 moves away, so 3 turns of one action each reach it.
    common = ["--config.env.name=Corridor", "--config.env.overrides.length=4", "--config.prompt.max_turns=3",
              "--config.rollout.max_context=512", "--config.mesh.data=1", "--config.train.val_every=0"]
    sft = SFTTrainer(load_config("tiny_cpu.py", [*common, "--config.sft.num_demos=8", "--config.sft.batch_size=4",
                                                  "--config.sft.epochs=3", "--config.sft.lr=3e-3"]),
                     tmp_path / "sft", quiet=True, demo_chunk=8)
    hist = sft.train()
    assert sft.demo_stats["demo/num_kept"] == 8 and sft.demo_stats["demo/success"] == 1.0
    losses = [h["sft/loss"] for h in hist if "sft/loss" in h]
    assert len(losses) == 6 and losses[-1] < losses[0] - 1.0
    rl = Trainer(load_config("tiny_cpu.py", [*common, f"--config.model.init_from={tmp_path / 'sft'}",
                                             "--config.advantage.estimator=grpo", "--config.model.critic=none",
                                             "--config.train.iterations=1", "--config.train.collapse_every=0"]),
                 tmp_path / "rl", quiet=True)
    hist = rl.train()
    rows = [h for h in hist if "train/success" in h]
    assert len(rows) == 1 and all(math.isfinite(v) for v in rows[0].values())
