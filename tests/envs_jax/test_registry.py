"""envs_jax.make / registered_envs: names, overrides and clear errors."""

from __future__ import annotations

import importlib

import pytest

import envs_jax
from envs_jax.bandit import Bandit
from envs_jax.frozen_lake import FrozenLake

SOKOBAN_NAMES = ("Sokoban", "LargerSokoban", "NewSymbolsSokoban")


def test_registered_names():
    assert set(envs_jax.registered_envs()) == {"Bandit", "BanditTest", "FrozenLake", *SOKOBAN_NAMES}


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
    with pytest.raises(ValueError, match=r"unknown environment 'Snake'; valid: Bandit, BanditTest, FrozenLake"):
        envs_jax.make("Snake")


def test_unknown_override_lists_valid_parameters():
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) 'slipp' for FrozenLake; valid: .*slip"):
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
