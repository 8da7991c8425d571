"""envs_jax.make / registered_envs: names, overrides and clear errors."""

from __future__ import annotations

import importlib

import pytest

import envs_jax
from envs_jax.bandit import Bandit
from envs_jax.frozen_lake import FrozenLake

SOKOBAN_NAMES = ("Sokoban", "LargerSokoban", "NewSymbolsSokoban", "CoordSokoban")


def test_registered_names():
    assert set(envs_jax.registered_envs()) == {"Bandit", "BanditTest", "BanditPairs", "BanditPairsTest",
                                               "FrozenLake", "CoordFrozenLake", *SOKOBAN_NAMES}


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
    with pytest.raises(ValueError, match=r"unknown environment 'Snake'; valid: Sokoban, NewSymbolsSokoban, .*FrozenLake, .*Bandit"):
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
