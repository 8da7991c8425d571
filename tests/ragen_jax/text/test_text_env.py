"""TextEnv: the conversation is the reference's, token streams agree with Qwen's chat template.

Truths: the reference's prompt formula (ragen/llm_agent/ctx_manager.py, config/envs.yaml) written
out again below, independently of ragen_jax.text.conversation; the tokenizer's own Qwen2.5 chat
template; `tokenizer.encode` / `tokenizer.decode`; the parser's Python-regex host path.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs_jax
from ragen_jax.text import render as render_lib
from ragen_jax.text.conversation import PromptConfig
from ragen_jax.text.text_env import TextEnv

REAL_ENVS = ("Bandit", "FrozenLake", "Sokoban", "CoordSokoban", "CoordFrozenLake", "BanditPairs")
B = 8


def reference_first_user(env, params, state_text, think, max_actions=10, list_actions=True):
    """The reference's first user message for turn 1 (ctx_manager._init_prefix_lookup + get_lm_inputs)."""
    content = env.instructions(params)
    if list_actions:
        content += "\nYour available actions are:\n" + ", ".join(env.action_names(params))
        content += f"\nYou can make up to {max_actions} actions, separated by the action separator \" || \"\n"
    return content + reference_turn(1, state_text, max_actions, think)


def reference_turn(i, state_text, actions_left, think):
    fmt = ("<think> [Your thoughts] </think> <answer> [your answer] </answer>" if think
           else "<answer> [your answer] </answer>")
    return (f"\nTurn {i}:\n" + f"State:\n{state_text}\nYou have {actions_left} actions left. Always output: "
            f"{fmt} with no extra text. Strictly follow this format. Max response length: 100 words (tokens).\n")


@pytest.fixture(scope="module")
def tok():
    from ragen_jax.text.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def real(tok):
    """Per env: (env, params, B reset states, TextEnv think, TextEnv no-think)."""
    out = {}
    for name in REAL_ENVS:
        env, params = envs_jax.make(name)
        keys = jax.random.split(jax.random.PRNGKey(len(name)), B)
        states = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(keys, params)[1]
        out[name] = (env, params, states, TextEnv(env, params, tok, PromptConfig()),
                     TextEnv(env, params, tok, PromptConfig(think=False)))
    return out


def state_at(states, i):
    return jax.tree.map(lambda x: x[i], states)


@pytest.mark.parametrize("think", [True, False], ids=["think", "nothink"])
@pytest.mark.parametrize("name", REAL_ENVS)
def test_first_turn_is_the_chat_template(tok, real, name, think):
    env, params, states, te_think, te_nothink = real[name]
    te = te_think if think else te_nothink
    state = state_at(states, 0)
    max_actions = int(params.max_steps_in_episode)
    user = reference_first_user(env, params, env.render_text(state, params), think, max_actions,
                                list_actions=not name.startswith("Bandit"))
    messages = [{"role": "system", "content": "You're a helpful assistant. "}, {"role": "user", "content": user}]
    want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    want += "<think>" if think else "<answer>"
    assert te.first_turn_text(state) == want
    ids, n = jax.jit(te.render_ids)(state, 1, max_actions, 0.0, True)
    got = list(te.prefix_ids) + list(np.asarray(ids[:n]))
    assert got == tok.encode(want, add_special_tokens=False)
    assert list(te.forced_prefix_ids) == tok.encode("<think>" if think else "<answer>", add_special_tokens=False)


@pytest.mark.parametrize("name", REAL_ENVS)
def test_real_states_render_exactly(tok, real, name):
    env, params, states, te, _ = real[name]
    rng = np.random.default_rng(3)
    turn = rng.integers(1, 6, B)
    left = rng.integers(0, 11, B)
    reward = (rng.integers(-300, 1200, B) / 100).astype(np.float32)
    closed = rng.random(B) < 0.5
    ids, n = jax.jit(jax.vmap(te.render_ids))(states, turn, left, reward, closed)
    ok = jax.jit(jax.vmap(te.render_ok))(states, reward)
    assert bool(np.all(ok))
    for i in range(B):
        s = state_at(states, i)
        text = te.render_text(s, turn[i], left[i], reward[i], closed[i])
        assert env.render_text(s, params) in text
        assert list(np.asarray(ids[i, :n[i]])) == tok.encode(text, add_special_tokens=False)


def test_multi_turn_token_stream_decodes_to_the_conversation(tok, real):
    """prefix + segment + sampled ids + segment + ... is the reference conversation, turn by turn.

    The responses stand for sampled ids: one closes itself with <|im_end|>, one is cut off (the
    next segment then closes it). Compared as text through decode, because sampled ids are not
    what re-tokenizing the text would give (that is the point of keeping them).
    """
    env, params, states, te, _ = real["FrozenLake"]
    s = [state_at(states, i) for i in range(3)]
    responses = [" I slide left.</think> <answer>Left || Up</answer>", " Go down.</think><answer>Down"]
    closed = [True, False]
    rewards = [np.float32(-0.1) * 3 + np.float32(0.0), np.float32(1.0)]
    stream = list(te.prefix_ids)
    render = jax.jit(te.render_ids)
    left = [10, 8, 7]
    for t in range(3):
        prev_r = rewards[t - 1] if t else 0.0
        prev_c = closed[t - 1] if t else True
        ids, n = render(s[t], t + 1, left[t], prev_r, prev_c)
        stream += list(np.asarray(ids[:n]))
        if t < 2:
            stream += tok.encode(responses[t], add_special_tokens=False) + ([151645] if closed[t] else [])
    st = [env.render_text(x, params) for x in s]
    names = ", ".join(env.action_names(params))
    messages = [
        {"role": "system", "content": "You're a helpful assistant. "},
        {"role": "user", "content": env.instructions(params) + "\nYour available actions are:\n" + names
         + "\nYou can make up to 10 actions, separated by the action separator \" || \"\n"
         + reference_turn(1, st[0], 10, True)},
        {"role": "assistant", "content": "<think>" + responses[0]},
        {"role": "user", "content": "Reward:\n-0.3\n" + reference_turn(2, st[1], 8, True)},
        {"role": "assistant", "content": "<think>" + responses[1]},
        {"role": "user", "content": "Reward:\n1\n" + reference_turn(3, st[2], 7, True)},
    ]
    want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + "<think>"
    assert tok.decode(stream, skip_special_tokens=False) == want
    # The host history builder of conversation.py states the same conversation.
    from ragen_jax.text.conversation import chat_text, messages_for_history

    hist = [{"state": st[0], "actions_left": 10, "response": "<think>" + responses[0], "reward": rewards[0]},
            {"state": st[1], "actions_left": 8, "response": "<think>" + responses[1], "reward": rewards[1]},
            {"state": st[2], "actions_left": 7}]
    assert chat_text(messages_for_history(te.head_text, hist, te.config), True) + "<think>" == want


def test_bandit_budget_and_no_action_list(real):
    env, params, states, te, _ = real["Bandit"]
    assert te.max_actions_per_episode == 1  # from params.max_steps_in_episode
    assert "Your available actions" not in te.prefix_text
    assert "You have 1 actions left." in te.render_text(state_at(states, 0), 1, 1, 0.0, True)
    assert te.action_names == ("Phoenix", "Dragon")
    listed = TextEnv(env, params, te.tokenizer, PromptConfig(list_actions=True, max_actions_per_episode=3))
    assert "Your available actions are:\nPhoenix, Dragon\nYou can make up to 3 actions" in listed.prefix_text


def test_parse_delegates_to_the_parser(real):
    pytest.importorskip("ragen_jax.text.parse")
    env, params, states, te, te_nothink = real["FrozenLake"]
    tok = te.tokenizer
    answers = [" go</think> <answer>left || UP || Jump</answer>", " x</think><answer></answer>", "no tags"]
    for t, answers_ in ((te, answers), (te_nothink, [" Right || Down</answer>", "Left"])):
        texts = [t.config.forced_prefix + a for a in answers_]
        rows = [list(t.forced_prefix_ids) + tok.encode(a, add_special_tokens=False) for a in answers_]
        width = max(map(len, rows))
        ids = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
        got = jax.jit(jax.vmap(t.parse))(jnp.asarray(ids), jnp.array([len(r) for r in rows]))
        for i, text in enumerate(texts):
            want = t.parse_text(text)
            assert list(np.asarray(got.actions[i])) == list(want.actions)
            assert bool(got.format_ok[i]) == bool(want.format_ok)
    first = te.parse_text(te.config.forced_prefix + answers[0])
    assert list(first.actions[:3]) == [0, 3, -1] and bool(first.has_invalid)


@pytest.mark.parametrize("field,value", [
    ("think", "yes"), ("max_turns", 0), ("max_turns", 2.5), ("max_actions_per_turn", -1),
    ("max_actions_per_episode", 0), ("max_response_words", True), ("max_response_tokens", 0),
    ("system_prompt", 3), ("system_prompt", "hi<|im_end|>"), ("list_actions", 1),
    ("reward_min", float("nan")), ("reward_max", 1e9), ("reward_max", 1999.0),
])
def test_prompt_config_rejects_bad_values(field, value):
    kwargs = {field: value, **({"reward_min": -2.0} if (field, value) == ("reward_max", 1999.0) else {})}
    with pytest.raises(ValueError, match=f"PromptConfig.{field}"):
        PromptConfig(**kwargs)


def test_prompt_config_range_order_and_text_env_errors(tok, real):
    with pytest.raises(ValueError, match="reward_min .* must be below reward_max"):
        PromptConfig(reward_min=1.0, reward_max=1.0)
    env, params, *_ = real["FrozenLake"]
    with pytest.raises(ValueError, match="config must be a PromptConfig"):
        TextEnv(env, params, tok, {"think": True})
    with pytest.raises(ValueError, match=r"shape \[4\]\[4\]"):
        TextEnv(env, params, tok, cell_symbols=[[(0,)] * 3] * 4)
    with pytest.raises(ValueError, match="symbol set"):
        TextEnv(env, params, tok, cell_symbols=[[(0, 9)] * 4] * 4)

    class Spaced(type(env)):
        def symbols(self, params):
            return (" P",) + tuple(super().symbols(params))[1:]

    with pytest.raises(ValueError, match="cannot be rendered row by row"):
        TextEnv(Spaced(), params, tok)


def test_text_env_keeps_its_own_config(tok, real):
    """PromptConfig is a mutable config section; a built TextEnv keeps a copy, so later edits of the
    config object never reach its tables or texts."""
    env, params, states, *_ = real["FrozenLake"]
    cfg = PromptConfig(max_response_words=100)
    te = TextEnv(env, params, tok, cfg)
    before = te.render_text(state_at(states, 0), 1, 10, 0.0, True)
    cfg.max_response_words = 7
    cfg.think = False
    assert te.config.max_response_words == 100 and te.config.think
    assert te.render_text(state_at(states, 0), 1, 10, 0.0, True) == before


# ---- RAGEN-2's coordinate observations and Bandit name pairs, on the envs' own states --------------
def _played_states(env, params, seed, batch=48, steps=10):
    """States from reset and uniformly random actions: [(steps + 1) * batch] host states."""
    def run(key):
        k_reset, k_act, k_step = jax.random.split(key, 3)
        _, s0 = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(k_reset, batch), params)
        n_act = len(env.action_names(params))
        acts = jax.random.randint(k_act, (steps, batch), 0, n_act)

        def step(s, x):
            s = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(jax.random.split(x[1], batch), s, x[0], params)[1]
            return s, s

        _, ss = jax.lax.scan(step, s0, (acts, jax.random.split(k_step, steps)))
        return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]).reshape((-1,) + a.shape[1:]), s0, ss)

    return jax.device_get(jax.jit(run)(jax.random.key(seed)))


COORD_ENVS = {
    "CoordSokoban": ("CoordSokoban", {}),
    "CoordFrozenLake": ("CoordFrozenLake", {}),
    "LargerSokoban-grid_coord": ("LargerSokoban", {"observation_format": "grid_coord"}),
    "Sokoban-coord": ("Sokoban", {"observation_format": "coord"}),
    "FrozenLake-coord": ("FrozenLake", {"observation_format": "coord"}),
    "FrozenLake-digits": ("FrozenLake", {"symbols": "digits"}),
    "FrozenLake-surroundings": ("FrozenLake", {"surroundings": True}),
    "FrozenLake-coord-surroundings": ("FrozenLake", {"observation_format": "coord", "surroundings": True}),
    "BanditPairs": ("BanditPairs", {}),
}


@pytest.mark.parametrize("case", list(COORD_ENVS))
def test_played_states_render_exactly(tok, case):
    """tokenizer.encode(render_text) == render_ids on ~1,000 states of the env's own reset and steps
    per case (two hypothesis-drawn seeds)."""
    name, overrides = COORD_ENVS[case]
    env, params = envs_jax.make(name, **overrides)
    te = TextEnv(env, params, tok, PromptConfig(max_actions_per_episode=10))
    render = jax.jit(jax.vmap(te.render_ids))
    ok_fn = jax.jit(jax.vmap(te.render_ok))

    @settings(max_examples=2, deadline=None, database=None)
    @given(seed=st.integers(0, 2**31 - 1))
    def check(seed):
        states = _played_states(env, params, seed)
        n = states.time.shape[0]
        rng = np.random.default_rng(seed)
        turn, left = rng.integers(1, 6, n), rng.integers(0, 11, n)
        reward = (rng.integers(-300, 1200, n) / 100).astype(np.float32)
        closed = rng.random(n) < 0.5
        ids, length = jax.device_get(render(states, turn, left, reward, closed))
        assert bool(np.all(ok_fn(states, reward)))
        texts = [te.render_text(state_at(states, i), turn[i], left[i], reward[i], closed[i]) for i in range(n)]
        want = render_lib.encode_batch(tok, texts)
        bad = [i for i in range(n) if list(ids[i, :length[i]]) != want[i]]
        assert not bad, f"{len(bad)} of {n} differ, first: {texts[bad[0]]!r}"
        if te.observation_format != "grid":
            assert all(("Board size: " in t) for t in texts)
        if overrides.get("surroundings"):
            assert all(("\nHoles: " in t and "\nGoal: " in t) for t in texts)

    check()


def test_bandit_pairs_texts_and_state_actions(tok, real):
    """Every pair's text is one of the env's state symbols; names of another pair are dropped by
    restrict_to_state (with the format penalty flag), as the reference's per-state action lookup."""
    env, params, states, te, _ = real["BanditPairs"]
    assert te.max_actions_per_episode == 1 and "Your available actions" not in te.prefix_text
    state = state_at(states, 0)
    pair = int(state.pair)
    low, high = env.action_names(params)[2 * pair: 2 * pair + 2]
    other = env.action_names(params)[2 * ((pair + 1) % 12)]
    shown = (high, low) if bool(state.high_first) else (low, high)
    assert f"There are 2 arms, named {shown[0]} and {shown[1]}\n" in te.render_text(state, 1, 1, 0.0, True)
    answers = [f" x</think><answer>{high}</answer>", f" x</think><answer>{other} || {low}</answer>",
               f" x</think><answer>{other}</answer>", " x</think><answer>nobody</answer>"]
    rows = [list(te.forced_prefix_ids) + tok.encode(a, add_special_tokens=False) for a in answers]
    width = max(map(len, rows))
    ids = jnp.asarray([r + [0] * (width - len(r)) for r in rows], jnp.int32)
    parsed = jax.jit(jax.vmap(te.parse))(ids, jnp.asarray([len(r) for r in rows]))  # op by op costs more
    restricted = jax.jit(jax.vmap(te.restrict_to_state, in_axes=(0, None)))(parsed, state)
    names = env.action_names(params)
    got = [[names[a] for a in np.asarray(restricted.actions[i]) if a >= 0] for i in range(len(answers))]
    assert got == [[high], [low], [], []]
    assert list(np.asarray(restricted.has_invalid)) == [False, True, True, True]
    assert list(np.asarray(restricted.num_actions)) == [1, 1, 0, 0]
    # Envs without per-state actions are left alone.
    fl_te = real["FrozenLake"][3]
    p = fl_te.parse_text("<think> a</think><answer>Left || Jump</answer>")
    assert fl_te.restrict_to_state(p, state_at(real["FrozenLake"][2], 0)) is p
