"""Mixed-environment batches (text/mix.py) against single-env rollouts of the same seeds and key: every
row of a mix must be exactly the row a single-env batch of its member gives (tokens, rewards, counts),
and the per-env metrics must equal the metrics of the split batch."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest
from flax import nnx

import envs_jax
from ragen_jax.rollout import Rollout, RolloutConfig, rollout_metrics
from ragen_jax.rollout.metrics import mix_metrics
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.text.mix import MixedTextEnv, format_mix, parse_mix
from ragen_jax.text.tokenizer import load_tokenizer
from tests.ragen_jax.rollout.scripted import ScriptedPolicy, make_script

TURNS = 3


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _text_env(tok, name, **prompt):
    env, params = envs_jax.make(name)
    return TextEnv(env, params, tok, PromptConfig(**{"max_turns": TURNS, "max_response_tokens": 24, **prompt}))


def _script(tok, batch, seed):
    """Random valid answers (1-3 actions a turn, sometimes garbage) per row and turn."""
    rng = np.random.default_rng(seed)
    names = ("Up", "Down", "Left", "Right")
    texts = [[("ok</think><answer>" + " || ".join(rng.choice(names, size=rng.integers(1, 4))) + "</answer>")
              if rng.random() < 0.85 else "no idea" for _ in range(TURNS)] for _ in range(batch)]
    return ScriptedPolicy(make_script(tok, texts, TURNS))


@pytest.fixture(scope="module")
def runs(tok):
    """A mix Sokoban:2 + FrozenLake:1 (P=3, N=2) and both single-env batches of the same seeds and key,
    with the per-turn observation keys recorded (GiGPO's anchor states)."""
    mix = (("Sokoban", 2), ("FrozenLake", 1))
    tes = {name: _text_env(tok, name) for name, _ in mix}
    mixed = MixedTextEnv([(n, tes[n], g) for n, g in mix])
    cfg = RolloutConfig(num_groups=3, group_size=2, max_context=1200, greedy=True)
    policy = _script(tok, cfg.batch_size, 0)
    key, seeds = jax.random.PRNGKey(3), np.array([11, 12, 13])
    ro = Rollout(policy, mixed, cfg, state_keys=True)
    out = {"mix": jax.device_get(ro(nnx.state(policy), key, seeds))}
    for name, te in tes.items():
        out[name] = jax.device_get(Rollout(policy, te, cfg, state_keys=True)(nnx.state(policy), key, seeds))
    return mixed, cfg, out


def test_mixed_rows_equal_single_env_rows(runs):
    mixed, cfg, out = runs
    rows = mixed.env_of_row(cfg.batch_size)
    np.testing.assert_array_equal(rows, [0, 0, 0, 0, 1, 1])
    t = out["mix"]
    for e, name in enumerate(mixed.names):
        own = rows == e
        single = jax.tree.map(lambda x: x[own], out[name])
        # Every field of the row: the whole token stream (the shared prefix, then the member's rest of
        # its prompt at the head of turn 1), loss mask, rewards, success, counts.
        mine = jax.tree.map(lambda x: x[own], t)
        chex.assert_trees_all_equal(mine.replace(turn_start=None, state_key=None),
                                    single.replace(turn_start=None, state_key=None))
        # Observation keys: the member's own, padded with -1 to the widest member's width.
        d = single.state_key.shape[-1]
        np.testing.assert_array_equal(mine.state_key[..., :d], single.state_key)
        assert (mine.state_key[..., d:] == -1).all()
        # Turn 1's segment starts after the prefix the rollout shares: the mix's common one (the member's
        # own head is then part of its first segment); every later turn starts where the single env's does.
        np.testing.assert_array_equal(mine.turn_start[:, 1:], single.turn_start[:, 1:])
        assert (mine.turn_start[:, 0] == len(mixed.prefix_ids)).all()
    assert int(np.sum(t.num_actions)) > 0 and int(np.sum(t.num_format_errors)) > 0
    # The keys follow the states: some row's board changes between its first two turns.
    assert any(not np.array_equal(t.state_key[b, 0], t.state_key[b, 1]) for b in range(cfg.batch_size)
               if t.turn_start[b, 1] >= 0)
    # Both members really differ on these rows (a mix that rendered one env everywhere would fail).
    assert not np.array_equal(out["Sokoban"].tokens[4:], out["FrozenLake"].tokens[4:])


def test_mix_metrics_equal_the_split_batch(runs):
    mixed, cfg, out = runs
    m = mix_metrics(out["mix"], cfg.group_size, mixed.mix)
    rows = mixed.env_of_row(cfg.batch_size)
    for e, name in enumerate(mixed.names):
        split = jax.tree.map(lambda x: x[rows == e], out[name])
        want = rollout_metrics(split, cfg.group_size)
        assert {k[len(name) + 1:]: v for k, v in m.items() if k.startswith(name + "/")} == pytest.approx(want)
    assert set(m) == {f"{n}/{k}" for n in mixed.names for k in rollout_metrics(out["mix"], cfg.group_size)}


def test_mixed_text_env_prompt_pieces(tok):
    """The shared prefix + a row's turn-1 segment is its member's own prompt, in ids and in text."""
    tes = [("Sokoban", _text_env(tok, "Sokoban"), 1), ("CoordSokoban", _text_env(tok, "CoordSokoban"), 2)]
    mixed = MixedTextEnv(tes)
    assert mixed.max_segment_len == max(len(te.prefix_ids) - len(mixed.prefix_ids) + te.max_segment_len
                                        for _, te, _ in tes)
    state = jax.jit(mixed.reset_rows)(np.array([5, 6, 7]))
    for r, (e, left, turn) in enumerate([(0, 10, 1), (1, 10, 1), (1, 7, 2)]):
        row = jax.tree.map(lambda x: x[r], state)
        te = tes[e][1]
        ids, n = jax.jit(mixed.render_ids)(row, turn, left, 0.5, False)
        own, k = te.render_ids(row.members[e], turn, left, 0.5, False)
        head = list(mixed.prefix_ids) + ids[: int(n)].tolist()
        want = (list(te.prefix_ids) if turn == 1 else list(mixed.prefix_ids)) + own[: int(k)].tolist()
        assert head == want
        assert int(row.env) == e
        text = mixed.render_text(row, turn, left, 0.5, False)
        assert mixed.prefix_text + text == (te.prefix_text if turn == 1 else mixed.prefix_text) + te.render_text(
            row.members[e], turn, left, 0.5, False)


@pytest.mark.parametrize("other", ["FrozenLake", "game_2048"])
def test_mixed_step_maps_action_names(tok, other):
    """FrozenLake orders its actions Left, Down, Right, Up, 2048 Up, Right, Down, Left; Sokoban Up, Down,
    Left, Right: "Up" (mix index 0) must move the other's board up, as its plain step with its own index."""
    so, fl = _text_env(tok, "Sokoban"), _text_env(tok, other)
    mixed = MixedTextEnv([("Sokoban", so, 1), (other, fl, 1)])
    state = mixed.reset_rows(np.array([21, 22]))
    row = jax.tree.map(lambda x: x[1], state)
    key = jax.random.PRNGKey(0)
    for mix_action, name in enumerate(mixed.action_names):
        _, st, r, term, info = mixed.env.step_env(key, row, mix_action, mixed.env_params)
        _, st2, r2, term2, info2 = fl.env.step_env(key, row.members[1], fl.action_names.index(name), fl.env_params)
        chex.assert_trees_all_equal(st.members[1], st2)
        assert (float(r), bool(term), bool(info["success"])) == (float(r2), bool(term2), bool(info2["success"]))
        assert (int(st.time), bool(st.done)) == (int(st2.time), bool(st2.done))
        chex.assert_trees_all_equal(st.members[0], row.members[0])  # the other member never moves


def test_mixes_that_cannot_share_a_rollout_are_rejected(tok):
    so = _text_env(tok, "Sokoban")
    with pytest.raises(ValueError, match="same actions"):
        MixedTextEnv([("Sokoban", so, 1), ("Bandit", _text_env(tok, "Bandit"), 1)])
    with pytest.raises(ValueError, match="differ in max_turns"):
        MixedTextEnv([("Sokoban", so, 1), ("FrozenLake", _text_env(tok, "FrozenLake", max_turns=2), 1)])
    with pytest.raises(ValueError, match="at least one group"):
        MixedTextEnv([("Sokoban", so, 0)])
    with pytest.raises(ValueError, match="cannot lay out 5 rows"):
        MixedTextEnv([("Sokoban", so, 1), ("FrozenLake", _text_env(tok, "FrozenLake"), 1)]).env_of_row(5)


@pytest.mark.parametrize("spec", ["Sokoban:4,FrozenLake:2", " Sokoban:4 , FrozenLake:2 ", ("Sokoban:4", "FrozenLake:2"),
                                  (("Sokoban", 4), ("FrozenLake", 2)), [["Sokoban", 4], ["FrozenLake", 2]]])
def test_parse_mix_forms(spec):
    assert parse_mix(spec) == (("Sokoban", 4), ("FrozenLake", 2))
    assert format_mix(parse_mix(spec)) == "Sokoban:4,FrozenLake:2"


@pytest.mark.parametrize("spec, message", [
    ("Sokoban", "needs a count"), ("Sokoban:x", "is not a whole number"), ("Sokoban:0", "positive whole number"),
    ("Sokoban:1,Sokoban:2", "more than once"), (3, "must be a string"), ((("Sokoban", 1, 2),), "must be 'Name:count'"),
])
def test_parse_mix_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_mix(spec)
