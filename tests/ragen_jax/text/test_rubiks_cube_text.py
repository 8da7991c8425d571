"""The 2x2 cube's text layer: the observation rendered in-graph equals the tokenizer's encoding of the
reference's text (random scrambles, steps, game-over lines; Qwen and SmolLM2), the first user message
lists the reference's actions, its move names parse, and the BFS teacher's demonstrations, run through
the compiled rollout, solve every cube in as many moves as a plain-Python BFS over the reference's
moves needs."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import rubiks_cube as rc
from ragen_jax.rollout import teachers
from ragen_jax.rollout.rollout import Rollout
from ragen_jax.rollout.types import RolloutConfig
from ragen_jax.text.conversation import PromptConfig
from ragen_jax.text.text_env import TextEnv
from envs_py.rubiks_cube import ACTION_LOOKUP, RefCube
from tests.ragen_jax.text.test_other_tokenizer import smol  # noqa: F401  (fixture)

PC = PromptConfig(max_turns=3, max_actions_per_turn=5, max_actions_per_episode=10, max_response_tokens=48)
N = int(os.environ.get("RAGEN_TEXT_STATES", 300))  # 3,000 measured once (docs/environments.md)


@pytest.fixture(scope="module")
def qwen():
    from ragen_jax.text.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def qwen_env(qwen):
    env, params = envs_jax.make("rubikscube", scramble_depth=3)
    return TextEnv(env, params, qwen, PC)


def random_states(params, n):
    """Scrambles of 0..8 random moves, at random steps, a fifth of them ended (solved or not)."""
    rng = np.random.default_rng(7)
    table = rc.move_table(params.moves)
    stickers = []
    for _ in range(n):
        s = rc.SOLVED.copy()
        for a in rng.integers(0, 12, rng.integers(0, 9)):
            s = s[table[a]]
        stickers.append(s)
    return rc.RubiksCubeState(stickers=jnp.asarray(np.stack(stickers)),
                              time=jnp.asarray(rng.integers(0, params.max_steps_in_episode + 1, n), jnp.int32),
                              done=jnp.asarray(rng.random(n) < 0.2))


def check_render(te, tokenizer, n):
    st = jax.device_get(random_states(te.env_params, n))
    turn = np.arange(n) % 3 + 1
    left = np.arange(n) % 11
    reward = np.where(np.arange(n) % 2 == 0, 0.0, 1.0).astype(np.float32)
    ids, length = jax.device_get(jax.jit(jax.vmap(te.render_ids, (0, 0, 0, 0, None)))(st, turn, left, reward, True))
    texts = [te.render_text(jax.tree.map(lambda x: x[b], st), turn[b], left[b], reward[b], True) for b in range(n)]
    want = tokenizer(texts, add_special_tokens=False)["input_ids"]
    bad = [texts[b] for b in range(n) if list(ids[b, :length[b]]) != list(want[b])]
    assert bad == [], bad[:2]
    for line in ("Cube Solved!", "Max steps reached.", "What is your next move?", "Step: 20/20"):
        assert any(line in t for t in texts), line


def test_render_equals_qwen(qwen, qwen_env):
    check_render(qwen_env, qwen, N)
    assert "\nYour available actions are:\nU, U', D, D', L, L', R, R', F, F', B, B'\n" in qwen_env.prefix_text


def test_render_equals_smollm2(smol):  # noqa: F811
    env, params = envs_jax.make("rubikscube", scramble_depth=3)
    check_render(TextEnv(env, params, smol, PC), smol, N // 3)


def test_move_names_parse(qwen_env):
    parsed = jax.jit(qwen_env.parse)(*map(jnp.asarray, _ids(qwen_env, " ok</think><answer>U' || B || R'</answer>")))
    assert list(np.asarray(parsed.actions)[:3]) == [1, 10, 7] and int(parsed.num_actions) == 3
    assert bool(parsed.format_ok) and not bool(parsed.has_invalid)


def _ids(te, text):
    ids = list(te.forced_prefix_ids) + te.tokenizer.encode(text, add_special_tokens=False)
    buf = np.full((len(te.forced_prefix_ids) + PC.max_response_tokens,), te.pad_id, np.int32)
    buf[:len(ids)] = ids
    return buf, len(ids)


def _ref_distance(stickers, max_depth=5):
    """Quarter-turn distance to solved by BFS over the plain-Python port's moves (real B)."""
    def moved(s, a):
        cube = RefCube(fixed_b=True)
        cube.state = list(s)
        cube.apply_action(a)
        return tuple(cube.state)

    solved = lambda s: all(len(set(s[4 * f:4 * f + 4])) == 1 for f in range(6))  # noqa: E731
    frontier, seen = [tuple(int(x) for x in stickers)], set()
    for d in range(max_depth + 1):
        if any(solved(s) for s in frontier):
            return d
        seen.update(frontier)
        frontier = list({moved(s, a) for s in frontier for a in ACTION_LOOKUP} - seen)
    return -1


def test_bfs_teacher_solves_in_the_optimal_number_of_moves(qwen_env):
    teacher = teachers.get_teacher("rubikscube", qwen_env)
    seeds = jnp.arange(8, dtype=jnp.int32)
    ro = Rollout(None, qwen_env, RolloutConfig(num_groups=8, group_size=1, max_context=1024), teacher=teacher)
    traj = jax.device_get(ro(None, jax.random.PRNGKey(0), seeds))
    start = jax.device_get(jax.jit(qwen_env.reset_rows)(seeds)).stickers  # compiled: op by op costs more
    want = [_ref_distance(s) for s in start]
    assert traj.success.all() and traj.action_is_valid.all() and np.allclose(traj.reward, 1.0)
    assert list(traj.num_actions) == want and max(want) >= 2
