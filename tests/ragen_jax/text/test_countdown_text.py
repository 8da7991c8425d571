"""Countdown's text layer: the state line rendered in-graph equals the tokenizer's encoding of the
host text (3,000 task states and the after-answer lines, Qwen and SmolLM2), the prompt is the
reference's (no action list: its Countdown has no action lookup), and the solution teacher's
demonstrations, run through the compiled rollout (render -> answer ids -> parse -> step), all score 1."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import countdown as cd
from ragen_jax.rollout import teachers
from ragen_jax.rollout.rollout import Rollout
from ragen_jax.rollout.types import RolloutConfig
from ragen_jax.text.conversation import PromptConfig
from ragen_jax.text.text_env import TextEnv
from tests.ragen_jax.text.test_other_tokenizer import smol  # noqa: F401  (fixture)

PC = PromptConfig(max_turns=1, max_actions_per_turn=1, max_actions_per_episode=1, max_response_tokens=48)
N = 3000


@pytest.fixture(scope="module")
def qwen():
    from ragen_jax.text.tokenizer import load_tokenizer

    return load_tokenizer()


def states(env, params, n):
    _, st = jax.jit(jax.vmap(env.reset_env, (0, None)))(jax.random.split(jax.random.PRNGKey(3), n), params)
    # A tenth of them after an answer, one of each reward.
    done = jnp.arange(n) % 10 == 0
    reward = jnp.asarray([0.0, params.format_score, params.score], jnp.float32)[jnp.arange(n) % 3]
    return st.replace(done=done, reward=jnp.where(done, reward, 0.0))


def check_render(tokenizer):
    env, params = envs_jax.make("Countdown")
    te = TextEnv(env, params, tokenizer, PC)
    st = jax.device_get(states(env, params, N))  # host texts from numpy, not one device read per state
    ids, n = jax.device_get(jax.jit(jax.vmap(te.render_ids, (0, None, None, None, None)))(st, 1, 1, 0.0, True))
    texts = [te.render_text(jax.tree.map(lambda x: x[b], st), 1, 1, 0.0, True) for b in range(N)]
    want = tokenizer(texts, add_special_tokens=False)["input_ids"]
    bad = [texts[b] for b in range(N) if list(ids[b, :n[b]]) != list(want[b])]
    assert bad == [], bad[:3]
    assert any("Your answer get 0.1 points." in t for t in texts) and any(", nums: [" in t for t in texts)
    return te


def test_render_equals_qwen(qwen):
    te = check_render(qwen)
    assert "Your available actions" not in te.prefix_text and cd.ENV_INSTRUCTION in te.prefix_text
    s = jax.tree.map(lambda x: x[0], te.reset_rows(jnp.arange(1)))
    assert f"State:\nTarget: {int(s.target)}, nums: [" in te.first_turn_text(s)


def test_render_equals_smollm2(smol):  # noqa: F811
    check_render(smol)


def test_teacher_demos_score_one(qwen):
    env, params = envs_jax.make("Countdown")
    te = TextEnv(env, params, qwen, PC)
    teacher = teachers.get_teacher("Countdown", te)
    ro = Rollout(None, te, RolloutConfig(num_groups=8, group_size=2, max_context=512), teacher=teacher)
    traj = jax.device_get(ro(None, jax.random.PRNGKey(0), jnp.arange(8, dtype=jnp.int32)))
    assert traj.success.all() and np.allclose(traj.reward, 1.0) and traj.action_is_valid.all()
    # The written ids are the tokenizer's encoding of the teacher's text.
    st = jax.tree.map(lambda x: x[0], te.reset_rows(jnp.asarray([0])))
    ids, n = teacher(st, 1, jax.random.PRNGKey(0))
    assert list(np.asarray(ids[:n])) == qwen.encode(teacher.text(st), add_special_tokens=False)
