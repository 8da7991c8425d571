"""Sudoku's text layer: the `with_feedback` text assembled in-graph from slot tables equals the Qwen
tokenizer's encoding of the host text (`observation_text`, the reference's render) over random states
that cover every feedback kind and the valid-numbers block; the prompt is the reference's (its
instruction, no action list); answers in the reference's forms parse to the env's actions; and the backtracking
teacher's demonstrations, run through the compiled rollout, place only valid digits and solve."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import sudoku as sd
from ragen_jax.rollout import teachers
from ragen_jax.rollout.rollout import Rollout
from ragen_jax.rollout.types import RolloutConfig
from ragen_jax.text.conversation import PromptConfig
from ragen_jax.text.text_env import TextEnv
from tests.ragen_jax.text.test_other_tokenizer import smol  # noqa: F401  (fixture)

PC = PromptConfig(max_turns=5, max_actions_per_turn=5, max_response_tokens=96)
N = 300  # CI; 3,000 measured once (docs/environments.md)


@pytest.fixture(scope="module")
def qwen():
    from ragen_jax.text.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def text_env(qwen):
    env, params = envs_jax.make("SimpleSudoku")
    return TextEnv(env, params, qwen, PC)


def random_states(env, params, n, seed=0, steps=40):
    """States after a random number of steps (0..steps) of a mix of solution digits (to reach grids with
    at most 10 empty cells) and uniformly random actions (given cells, conflicts, wrong digits)."""
    params = params.replace(max_steps_in_episode=10_000)

    def one(key):
        k_reset, k_len, k_steps = jax.random.split(key, 3)
        _, state = env.reset_env(k_reset, params)
        stop = jax.random.randint(k_len, (), 0, steps + 1)
        good = jax.random.uniform(jax.random.fold_in(k_len, 1), (), minval=0.5, maxval=1.0)

        def step(s, xs):
            t, k = xs
            k_kind, k_act, k_step = jax.random.split(k, 3)
            n = params.grid_size
            rand = jax.random.randint(k_act, (), 0, n ** 3)
            masks = sd.valid_masks(s.grid)  # a legal digit that may differ from the solution's
            cell = jax.random.categorical(k_act, jnp.where(masks > 0, 0.0, -jnp.inf))
            bits = (masks[cell] >> jnp.arange(n)) & 1
            legal = cell * n + jax.random.categorical(jax.random.fold_in(k_act, 2), jnp.where(bits > 0, 0.0, -jnp.inf))
            u = jax.random.uniform(k_kind)
            act = jnp.where(u < good, env.teacher_action(k_act, s, params),
                            jnp.where((u < (1 + good) / 2) & jnp.any(masks > 0), legal, rand))
            _, nxt, _, _, _ = env.step_env(k_step, s, act, params)
            keep = (t < stop) & ~s.done
            return jax.tree.map(lambda a, b: jnp.where(keep, a, b), nxt, s), None

        state, _ = jax.lax.scan(step, state, (jnp.arange(steps), jax.random.split(k_steps, steps)))
        return state

    return jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(seed), n))


def first_state(te):
    """Row 0 of `reset_rows([0])`, compiled (op by op the vmapped reset compiles every op) and on the host."""
    return jax.device_get(jax.tree.map(lambda x: x[0], jax.jit(te.reset_rows)(jnp.zeros(1, jnp.int32))))


def render_mismatches(te, n, seed=0):
    st = jax.device_get(random_states(te.env, te.env_params, n, seed))
    turn = 1 + np.arange(n) % te.max_turns
    ids, length = jax.device_get(jax.jit(jax.vmap(te.render_ids, (0, 0, None, None, None)))(
        st, turn, 7, 0.5, True))
    texts = [te.render_text(jax.tree.map(lambda x: x[b], st), int(turn[b]), 7, 0.5, True) for b in range(n)]
    want = te.tokenizer(texts, add_special_tokens=False)["input_ids"]
    bad = [texts[b] for b in range(n) if list(ids[b, :length[b]]) != list(want[b])]
    return bad, texts


def test_render_equals_qwen(text_env):
    bad, texts = render_mismatches(text_env, N)
    assert bad == [], bad[:2]
    # The sample covers what the slots assemble: every feedback kind and the valid-numbers block.
    for piece in ("Cannot modify", "Invalid placement", "Valid numbers for (", "✓ Correct", "Valid but not",
                  "VALID NUMBERS FOR EMPTY CELLS", "Puzzle solved"):
        assert any(piece in t for t in texts), piece


def test_prompt_is_the_reference(text_env):
    s = first_state(text_env)
    first = text_env.first_turn_text(s)
    assert sd.ENV_INSTRUCTION in text_env.prefix_text and "Your available actions" not in text_env.prefix_text
    assert "State:\n" + sd.observation_text(jax.device_get(s), text_env.env_params) + "\n" in first


def test_answers_parse_to_actions(text_env):
    names = sd.action_names(9)
    text = "<think>ok</think><answer>2,3,5 || 9,9,9 || place 4 at row 2 col 3 || 10,1,1</answer>"
    p = text_env.parse_text(text)  # the six forms: tests/ragen_jax/text/test_placement.py
    want = [names.index("2,3,5"), names.index("9,9,9"), names.index("2,3,4")]
    assert list(p.actions[:3]) == want and bool(p.has_invalid)
    ids = text_env.tokenizer.encode(text, add_special_tokens=False)
    q = jax.jit(text_env.parse)(jnp.asarray(ids + [0] * 8), len(ids))  # compiled: op by op costs more
    assert list(np.asarray(q.actions[:3])) == want and int(q.num_actions) == 3 and bool(q.has_invalid)


def test_teacher_demos_place_valid_digits(text_env, qwen):
    teacher = teachers.get_teacher("SimpleSudoku", text_env)
    ro = Rollout(None, text_env, RolloutConfig(num_groups=2, group_size=2, max_context=2048), teacher=teacher)
    traj = jax.device_get(ro(None, jax.random.PRNGKey(0), jnp.arange(2, dtype=jnp.int32)))
    # 32 empty cells, 5 per turn: 20 actions (max_actions_per_traj) in 4 turns, each a valid placement
    # (1.0 for the drawn solution's digit, 0.5 for another solution's).
    assert traj.action_is_valid.all() and np.all(np.asarray(traj.reward) >= 10.0)
    # The first turn's ids are the tokenizer's encoding of the first five empty cells (row-major) with
    # the digits of a plain-Python backtracking solver (digits tried in increasing order).
    st = first_state(text_env)
    # Compiled: op by op the teacher's backtracking search cost seconds of tiny-program compiles.
    ids, n = jax.device_get(jax.jit(teacher)(st, 1, jax.random.PRNGKey(0)))
    given = np.asarray(st.grid).tolist()
    grid = [row[:] for row in given]
    assert solve(grid)
    empty = [(r, c) for r in range(9) for c in range(9) if given[r][c] == 0][:5]
    want = "</think><answer>" + " || ".join(f"{r + 1},{c + 1},{grid[r][c]}" for r, c in empty) + "</answer>"
    assert list(np.asarray(ids[:n])) == qwen.encode(want, add_special_tokens=False) + [teacher.table.chat.im_end]


def solve(grid) -> bool:
    """Plain backtracking over the first empty cell, digits 1..9 in order (fills `grid` in place)."""
    for k in range(81):
        r, c = divmod(k, 9)
        if grid[r][c] == 0:
            for d in range(1, 10):
                box = [grid[r // 3 * 3 + i][c // 3 * 3 + j] for i in range(3) for j in range(3)]
                if d not in grid[r] and d not in [grid[i][c] for i in range(9)] and d not in box:
                    grid[r][c] = d
                    if solve(grid):
                        return True
            grid[r][c] = 0
            return False
    return True



def test_a_tokenizer_that_merges_across_slots_is_refused(smol):  # noqa: F811
    """SmolLM2's BPE merges a filled cell with the next slot (' [9]\\n' ...): the rendering would give
    wrong ids, so TextEnv refuses it at build time, naming the slot, rather than render them."""
    env, params = envs_jax.make("SimpleSudoku")
    with pytest.raises(ValueError, match=r"under this tokenizer state slot \d+ .* wrong ids"):
        TextEnv(env, params, smol, PC)
