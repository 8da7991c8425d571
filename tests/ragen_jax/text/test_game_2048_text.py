"""2048's text layer: the observation rendered in-graph equals the tokenizer's encoding of the
reference's text (random boards with tiles up to 131072, scores of 1-10 digits, every valid-action
subset that occurs; Qwen, and SmolLM2's tokenizer where its package is installed)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import game_2048 as g
from ragen_jax.text.conversation import PromptConfig
from ragen_jax.text.text_env import TextEnv
from tests.ragen_jax.text.test_other_tokenizer import smol  # noqa: F401  (fixture)

PC = PromptConfig(max_turns=3, max_actions_per_turn=1, max_actions_per_episode=10, max_response_tokens=48)
N = int(os.environ.get("RAGEN_TEXT_STATES", 300))  # 3,000 measured once (docs/environments.md)


@pytest.fixture(scope="module")
def qwen():
    from ragen_jax.text.tokenizer import load_tokenizer

    return load_tokenizer()


def random_states(n):
    rng = np.random.default_rng(11)
    full = rng.random(n) < 0.3  # full boards: often few or no valid moves
    empty_p = np.where(full, 0.0, rng.random(n))[:, None, None]
    board = np.where(rng.random((n, 4, 4)) < empty_p, 0, rng.integers(1, g.MAX_EXPONENT + 1, (n, 4, 4)))
    score = (10 ** rng.uniform(0, 9.3, n)).astype(np.int64)
    score[::7] = 0
    return g.Game2048State(board=jnp.asarray(board, jnp.int32), score=jnp.asarray(score, jnp.int32),
                           time=jnp.asarray(rng.integers(0, 10, n), jnp.int32), done=jnp.zeros(n, bool))


def check_render(tok, n):
    env, params = envs_jax.make("game_2048")
    te = TextEnv(env, params, tok, PC)
    st = jax.device_get(random_states(n))
    turn = np.arange(n) % 3 + 1
    ids, length = jax.device_get(jax.jit(jax.vmap(te.render_ids, (0, 0, None, None, None)))(st, turn, 5, 0.5, True))
    texts = [te.render_text(jax.tree.map(lambda x: x[b], st), turn[b], 5, 0.5, True) for b in range(n)]
    want = tok(texts, add_special_tokens=False)["input_ids"]
    bad = [texts[b] for b in range(n) if list(ids[b, :length[b]]) != list(want[b])]
    assert bad == [], bad[:2]
    return te, texts


def test_render_equals_qwen(qwen):
    te, texts = check_render(qwen, N)
    assert any("Valid Actions: None." in t for t in texts) and any("131072" in t for t in texts)
    assert "\nYour available actions are:\nUp, Right, Down, Left\n" in te.prefix_text


def test_render_equals_smollm2(smol):  # noqa: F811
    _, texts = check_render(smol, N // 3)
    assert any("Valid Actions: None." in t for t in texts) and any("131072" in t for t in texts)
