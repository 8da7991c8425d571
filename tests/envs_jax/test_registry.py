"""envs_jax.make / registered_envs: names, overrides and clear errors."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax.bandit import Bandit
from envs_jax.frozen_lake import FrozenLake

SOKOBAN_NAMES = ("Sokoban", "LargerSokoban", "NewSymbolsSokoban", "CoordSokoban")
NEW_NAMES = ("game_2048", "rubikscube", "SimpleSudoku", "MediumSudoku", "Countdown")  # RAGEN-2's other environments (config/envs.yaml tags)


def test_registered_names():
    assert set(envs_jax.registered_envs()) == {"Bandit", "BanditTest", "BanditPairs", "BanditPairsTest",
                                               "FrozenLake", "CoordFrozenLake", *SOKOBAN_NAMES, *NEW_NAMES}


def test_ragen2_variants():
    env, params = envs_jax.make("CoordFrozenLake")
    assert (params.observation_format, params.instruction) == ("grid_coord", "coord")
    assert abs((1 - params.slip) - 0.8) < 1e-12  # RAGEN-2 envs.yaml: success_rate 0.8
    env, _ = envs_jax.make("CoordSokoban")
    assert (env.config.observation_format, env.config.instruction, env.config.dim_room) == ("grid_coord", "coord", (6, 6))
    env, params = envs_jax.make("BanditPairs")
    assert len(env.action_names(params)) == 24 and env.action_names(params)[:2] == ("Teacher", "Trader")
    env, params = envs_jax.make("BanditPairsTest")
    assert env.action_names(params)[-2:] == ("CivilServant", "StartupAccelerator")


def test_success_rate_and_name_pairs_overrides():
    """RAGEN-2's names: success_rate = 1 - slip; name_pairs by list name or as (possibly nested-list) pairs."""
    for rate in (1.0, 0.8, 0.0, 1):
        _, params = envs_jax.make("FrozenLake", success_rate=rate)
        assert abs(params.slip - (1.0 - rate)) < 1e-12
    assert envs_jax.make("CoordFrozenLake", success_rate=1.0)[1].slip == 0.0
    env, params = envs_jax.make("Bandit", name_pairs="test")
    assert env.action_names(params) == envs_jax.make("BanditPairsTest")[0].action_names(
        envs_jax.make("BanditPairsTest")[1])
    env, params = envs_jax.make("Bandit", name_pairs=[["Cat", "Tiger"], ("Owl", "Hawk")])
    assert params.name_pairs == (("Cat", "Tiger"), ("Owl", "Hawk"))  # hashable: a static field
    assert env.action_names(params) == ("Cat", "Tiger", "Owl", "Hawk")
    hash(params.name_pairs)


def test_make_light_envs():
    env, params = envs_jax.make("Bandit")
    assert isinstance(env, Bandit) and env.action_names(params) == ("Phoenix", "Dragon")
    env, params = envs_jax.make("BanditTest")
    assert isinstance(env, Bandit) and env.action_names(params) == ("Trader", "Librarian")
    env, params = envs_jax.make("FrozenLake")
    assert isinstance(env, FrozenLake)
    assert (params.size, params.max_steps_in_episode, params.frozen_prob) == (4, 10, 0.8)
    assert abs(params.slip - 2 / 3) < 1e-12


def test_overrides_apply():
    _, params = envs_jax.make("FrozenLake", slip=0.2, size=5)
    assert params.slip == 0.2 and params.size == 5
    _, params = envs_jax.make("Bandit", low_reward=0.15, low_name="Cat")
    assert params.low_reward == 0.15 and params.low_name == "Cat" and params.high_name == "Dragon"
    # Overrides never leak into later calls.
    assert envs_jax.make("Bandit")[1].low_reward == 0.1


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown environment 'Snake'; valid: Sokoban, NewSymbolsSokoban, .*Bandit"):
        envs_jax.make("Snake")


def test_unknown_override_lists_valid_parameters():
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) 'slipp' for FrozenLake; valid: .*slip.*success_rate"):
        envs_jax.make("FrozenLake", slipp=0.1)
    with pytest.raises(ValueError, match=r"'foo' for Bandit; valid: low_name, high_name"):
        envs_jax.make("Bandit", foo=1)


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("FrozenLake", {"slip": 1.5}, "slip must be in"),
        ("FrozenLake", {"size": 1}, "size must be"),
        ("FrozenLake", {"frozen_prob": 0.0}, "frozen_prob must be in"),
        ("FrozenLake", {"max_steps_in_episode": 0}, "max_steps_in_episode must be"),
        ("Bandit", {"high_name": "phoenix"}, "differ ignoring case"),
        ("Bandit", {"low_name": ""}, "non-empty"),
        ("Bandit", {"high_prob": 2.0}, "high_prob must be in"),
        ("FrozenLake", {"success_rate": 1.2}, "success_rate must be a number in"),
        ("FrozenLake", {"success_rate": "high"}, "success_rate must be a number in"),
        ("FrozenLake", {"success_rate": 1.0, "slip": 0.0}, "either success_rate or slip"),
        ("FrozenLake", {"observation_format": "image"}, "observation_format must be one of"),
        ("FrozenLake", {"instruction": "fancy"}, "instruction must be one of"),
        ("FrozenLake", {"symbols": "emoji"}, "symbols must be one of standard, digits"),
        ("Bandit", {"name_pairs": "validation"}, "name_pairs must be one of"),
        ("Bandit", {"name_pairs": [("A", "B", "C")]}, "name_pairs must be a list"),
        ("Bandit", {"name_pairs": 3}, "name_pairs must be a list"),
        ("Bandit", {"name_pairs": [("Cat", "Dog"), ("Owl", "cat")]}, "differ ignoring case"),
        ("Sokoban", {"observation_format": "image"}, "observation_format must be one of"),
        ("Sokoban", {"instruction": "fancy"}, "unknown instruction"),
    ],
)
def test_bad_values_raise_clear_errors(name, overrides, message):
    with pytest.raises(ValueError, match=message):
        envs_jax.make(name, **overrides)


@pytest.mark.parametrize("name", SOKOBAN_NAMES)
def test_sokoban_names_route_to_sokoban_package(name):
    sokoban = importlib.import_module("envs_jax.sokoban")
    if not hasattr(sokoban, "make_sokoban"):
        pytest.skip("envs_jax.sokoban.make_sokoban not available yet")
    env, params = envs_jax.make(name)
    assert env.action_names(params) == ("Up", "Down", "Left", "Right")


# ---------------------------------------------------------------------------------- records
def test_default_eval_suite_is_the_generalisation_suite():
    """The suite launch/eval.py ran before the records existed (hand-written list)."""
    assert envs_jax.default_eval_suite() == ("Sokoban", "NewSymbolsSokoban", "LargerSokoban", "FrozenLake", "Bandit",
                                             "BanditTest")


def _first_action_ends(env, params, keys):
    """done[key, action] after one action from a fresh episode (the env's own rules, jitted once)."""
    def first(key, action):
        _, state = env.reset_env(key, params)
        return env.step_env(key, state, action, params)[1].done

    actions = jnp.arange(len(env.action_names(params)))
    return np.asarray(jax.jit(jax.vmap(jax.vmap(first, (None, 0)), (0, None)))(keys, actions))


def _first_of_its_class(name):
    cls = envs_jax.get_spec(name).env_class
    return next(n for n in envs_jax.registered_envs() if envs_jax.get_spec(n).env_class is cls) == name


@pytest.mark.parametrize("name", envs_jax.registered_envs())
def test_every_record_matches_its_env(name):
    spec = envs_jax.get_spec(name)
    assert spec.name == name
    env, params = spec.make()
    assert isinstance(env, spec.env_class)
    assert tuple(env.action_names(params)) == spec.action_names
    # Writable in an answer: non-empty, unpadded, no separator, distinct ignoring case.
    assert all(a and a == a.strip() and "||" not in a for a in spec.action_names)
    assert len({a.lower() for a in spec.action_names}) == len(spec.action_names)
    # A thought per teacher, except Countdown's, the cube's, Sudoku's and 2048's (a thought would enter every run's
    # task vocabulary, teacher_texts, and change the runs made before them).
    assert spec.teacher == "" or (spec.teacher in envs_jax.TEACHER_KINDS
                                  and (spec.teacher_thought.strip() or name in ("Countdown", "rubikscube", "game_2048")
                                       or spec.teacher == "backtracking"))
    assert not (spec.mixable and spec.single_action)
    if spec.single_action:
        assert int(params.max_steps_in_episode) == 1
    else:
        assert int(params.max_steps_in_episode) > 1
    # Behaviour (compiled once per env class: the Sokoban generator alone takes seconds to compile):
    # a single-action env ends after any first action; any other keeps going after some first action.
    # Countdown's action is a parsed answer, not an index (tests/envs_jax/test_countdown.py steps it).
    if _first_of_its_class(name) and spec.action_names:
        done = _first_action_ends(env, params, jax.random.split(jax.random.PRNGKey(0), 8))
        assert done.all() if spec.single_action else not done.all()


def _spec(name="Toy", **kw):
    fields = dict(build=envs_jax.dataclass_build(lambda: (FrozenLake(), envs_jax.FrozenLakeParams())),
                  env_class=FrozenLake, action_names=("Left", "Down", "Right", "Up"))
    return envs_jax.EnvSpec(name, **{**fields, **kw})


def test_bad_records_are_refused_in_one_sentence():
    with pytest.raises(ValueError, match="Toy: unknown teacher kind 'astar'; valid: bfs, value_iteration"):
        _spec(teacher="astar")
    with pytest.raises(ValueError, match="Toy: a single_action env .* cannot be mixable"):
        _spec(single_action=True)
    with pytest.raises(ValueError, match="must be a non-empty string without ':' or ','"):
        _spec("Toy:2")
    with pytest.raises(ValueError, match="'FrozenLake' is already registered; pass replace=True"):
        envs_jax.register(_spec("FrozenLake"))
    with pytest.raises(ValueError, match="register takes an EnvSpec, got dict"):
        envs_jax.register({"name": "Toy"})
    with pytest.raises(ValueError, match="unknown environment 'Toy'; valid: Sokoban"):
        envs_jax.unregister("Toy")
    with pytest.raises(ValueError, match="unknown environment 'Toy'; valid: Sokoban"):
        envs_jax.get_spec("Toy")


def test_a_registered_record_is_made_and_removed():
    spec = envs_jax.register(_spec(teacher="value_iteration", teacher_thought=" t"))
    try:
        assert envs_jax.registered_envs()[-1] == "Toy" and envs_jax.get_spec("Toy") is spec
        env, params = envs_jax.make("Toy", size=3, success_rate=1.0)  # the dataclass rule, aliases included
        assert isinstance(env, FrozenLake) and (params.size, params.slip) == (3, 0.0)
        with pytest.raises(ValueError, match=r"unknown parameter\(s\) 'sise' for Toy; valid: "):
            envs_jax.make("Toy", sise=3)
    finally:
        envs_jax.unregister("Toy")
    assert "Toy" not in envs_jax.registered_envs()
