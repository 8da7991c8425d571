"""Adding an environment touches envs_jax alone: two environments registered HERE (a new FrozenLake-like
class with a value-iteration teacher, and a one-shot Bandit-like class with no teacher) are accepted by
config validation, the env mix, the prompt settings, the teacher lookup and evaluation, with no edit
to any of them. Truths: hand-counted answers of a scripted policy, the tokenizer's own text, and the
error sentences the consumers give for the built-in environments."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

import envs_jax
from envs_jax.bandit import Bandit, BanditParams
from envs_jax.frozen_lake import FrozenLake, FrozenLakeParams
from ragen_jax.rollout.teachers import FrozenLakeTeacher, get_teacher, teacher_texts
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.text.tokenizer import load_tokenizer
from ragen_jax.experiment.build import build_text_envs, prompt_for_env
from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.evaluation.suite import check_env_names, evaluate

POND_THOUGHT = " I walk around the water."


class Pond(FrozenLake):
    """A new environment class (same rules as FrozenLake, its own identity and defaults)."""


class Coin(Bandit):
    """A new one-shot environment class: one pull, success = the gold arm."""


@pytest.fixture(scope="module", autouse=True)
def fake_envs():
    specs = [
        envs_jax.EnvSpec("Pond", envs_jax.dataclass_build(
            lambda: (Pond(), FrozenLakeParams(size=3, max_steps_in_episode=6))),
                         env_class=Pond, action_names=("Left", "Down", "Right", "Up"), teacher="value_iteration",
                         teacher_thought=POND_THOUGHT),
        envs_jax.EnvSpec("Coin", envs_jax.dataclass_build(
            lambda: (Coin(), BanditParams(low_name="Copper", high_name="Gold"))),
                         env_class=Coin, action_names=("Copper", "Gold"), single_action=True, mixable=False,
                         success_alias="gold_rate"),
    ]
    for s in specs:
        envs_jax.register(s)
    yield
    for s in specs:
        envs_jax.unregister(s.name)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_records_are_registered():
    assert envs_jax.registered_envs()[-2:] == ("Pond", "Coin")
    env, params = envs_jax.make("Pond", success_rate=1.0)
    assert isinstance(env, Pond) and (params.size, params.slip) == (3, 0.0)


def test_config_validation_and_the_mix_accept_them(tok):
    cfg = load_config("tiny_cpu.py", ["env.name=Pond", "env.val_envs=('Coin',)"])
    assert cfg.env.validation_set(8) == (("Pond", 8), ("Coin", 8))
    mix = load_config("tiny_cpu.py", ["env.mix=FrozenLake:2,Pond:2", "env.overrides.Pond={'success_rate': 1.0}"])
    envs = build_text_envs(mix, tok)
    assert list(envs) == ["FrozenLake:2,Pond:2", "FrozenLake", "Pond"]
    assert isinstance(envs["Pond"].env, Pond) and envs["Pond"].env_params.slip == 0.0
    with pytest.raises(ConfigError, match="env.mix cannot hold Coin: .*not mixable.*such as .*FrozenLake.*Pond"):
        load_config("tiny_cpu.py", ["env.mix=Pond:2,Coin:2"])
    with pytest.raises(ConfigError, match="env.name='Pnd' is not valid; choose one of .*'Pond', 'Coin'"):
        load_config("tiny_cpu.py", ["env.name=Pnd"])


def test_prompt_settings_follow_single_action():
    prompt = PromptConfig(max_turns=4, max_actions_per_turn=3)
    assert prompt_for_env(prompt, "Pond") == prompt
    coin = prompt_for_env(prompt, "Coin")
    assert (coin.max_turns, coin.max_actions_per_turn) == (1, 1)
    assert prompt_for_env(prompt, "Bandit") == coin  # the built-in one-shot env gets the same


def test_teacher_lookup_reads_the_record(tok):
    env, params = envs_jax.make("Pond")
    te = TextEnv(env, params, tok, PromptConfig(max_response_tokens=32))
    teacher = get_teacher("Pond", te, high_prob=0.3)  # high_prob: ignored by a non-bandit teacher
    assert isinstance(teacher, FrozenLakeTeacher) and teacher.table.thought == POND_THOUGHT
    assert f"{POND_THOUGHT}</think><answer>" in teacher_texts()  # the task vocabulary covers it
    _, state = jax.jit(env.reset_env)(jax.random.PRNGKey(0), params)
    ids, n = jax.jit(teacher)(state, 1, jax.random.PRNGKey(1))
    text = tok.decode(np.asarray(ids)[: int(n)].tolist(), skip_special_tokens=False)
    # The value-iteration action for the start cell with 5 turns left (the env's own solver).
    policy, _ = env.solve(state, params)
    best = te.action_names[int(policy[teacher.horizon(state, 1), state.pos])]
    assert text == f"{POND_THOUGHT}</think><answer>{best}</answer><|im_end|>"
    lake, lake_params = envs_jax.make("FrozenLake")
    with pytest.raises(ValueError, match="the Pond teacher needs a Pond TextEnv, got FrozenLake"):
        get_teacher("Pond", TextEnv(lake, lake_params, tok, PromptConfig()))
    with pytest.raises(ValueError, match="no solver teacher for environment 'Coin'; environments with one: .*Pond"):
        get_teacher("Coin", te)


def test_evaluation_handles_them(tok):
    """A scripted policy on Coin: 8 episodes of one turn each whatever the prompt allows, success and
    the record's success_alias counted by hand."""
    from tests.ragen_jax.rollout.scripted import ScriptedPolicy, make_script

    assert check_env_names(["pond", " COIN "]) == ("Pond", "Coin")
    picks = ["Gold", "Gold", "Gold", "Copper", "Copper", "Copper", None, "Gold"]
    texts = [[f"x</think><answer>{p}</answer>" if p else "no answer", "x</think><answer>Gold</answer>"]
             for p in picks]
    policy = ScriptedPolicy(make_script(tok, texts, 1))
    res = evaluate(policy, nnx.state(policy), tok, ("Coin",), num_states=4, rollouts_per_state=2, max_context=512,
                   prompt=PromptConfig(max_turns=3, max_response_tokens=12), greedy=True)["Coin"]
    assert res["success"] == pytest.approx(4 / 8) and res["gold_rate"] == res["success"]
    assert res["num_turns"] == pytest.approx(1.0)
    assert res["pass@2"] == pytest.approx(3 / 4)  # states (0,1) (2,3) (4,5) (6,7): gold in 0, 1, 3


@pytest.mark.parametrize("over", [["env.name=NoTextLayer"], ["env.val_envs=('Sokoban','NoTextLayer')"]])
def test_config_refuses_what_the_trainer_cannot_run_yet(over):
    """Registered envs without a text layer are refused by the config check with one sentence, not at
    trace time."""
    import dataclasses

    from ragen_jax.experiment.config import ConfigError, load_config
    envs_jax.register(dataclasses.replace(envs_jax.get_spec("game_2048"), name="NoTextLayer", text_layer=False,
                                               mixable=False))
    try:
        with pytest.raises(ConfigError, match="text layer"):
            load_config("tiny_cpu.py", over)
    finally:
        envs_jax.unregister("NoTextLayer")
