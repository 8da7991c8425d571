"""Bi-arm Bandit: one turn, one action, two named arms (RAGEN's `Bandit` / `BanditTest`).

Action 0 pulls the low-risk arm, action 1 the high-risk arm; the agent writes the arm's NAME.
The reference randomises, at every reset, the ORDER in which the two names are presented, so the
position in the prompt carries no information; that order is the only state. The two possible
state texts are the two "symbols" of a 1x1 grid, which keeps the env inside the grid/text contract.

Name pairs (RAGEN-2): with `name_pairs` set, every reset also draws the (low, high) pair uniformly
from that list (`ARM_NAME_PAIRS["train"]` / `["test"]` are RAGEN-2's lists). The actions are then
every name of the list, pair p's low arm = action 2p, its high arm = 2p + 1, so the host-built
parser tables stay state-independent; naming an arm of another pair is not a pull
(`valid_actions` says which two actions a state accepts; the transition ignores the others:
reward 0, not effective, the episode goes on). The state symbols are the 2 x pairs texts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import spaces

from envs_jax.base import AgentEnv

# The reference's state text (RAGEN ragen/env/bandit/env.py INIT_PROMPT), verbatim: trailing
# spaces and the final newline included, because the model was trained on exactly this text.
STATE_TEMPLATE = (
    "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. \n"
    "Game Rules: \n"
    "1. There are 2 arms, named {name_a} and {name_b}\n"
    "2. Each arm has its own reward distribution, related to their names. \n"
    "3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.\n"
    "4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher "
    "rewards on average? Choose between {name_a} and {name_b}, and output like <answer> {name_a} </answer> "
    "or <answer> {name_b} </answer>.\n"
)

# config/envs.yaml of the reference: the Bandit's env_instruction is empty (the state text says it all).
INSTRUCTIONS = ""

# RAGEN-2's ragen/env/bandit/config.py ARM_NAMES, verbatim: (low-risk, high-risk) name pairs; its
# `Bandit` tag draws from "train", `BanditTest` from the held-out "test" list.
ARM_NAME_PAIRS = {
    "train": (
        ("Teacher", "Trader"),
        ("Nurse", "StartupFounder"),
        ("Librarian", "Investor"),
        ("Accountant", "StockBroker"),
        ("Engineer", "RealEstateAgent"),
        ("Pharmacist", "Musician"),
        ("Clerk", "Freelancer"),
        ("Technician", "Youtuber"),
        ("Planner", "Artist"),
        ("Postman", "Pilot"),
        ("Banker", "VentureCapitalist"),
        ("Gardener", "Cryptominer"),
    ),
    "test": (
        ("Receptionist", "Explorer"),
        ("Archivist", "Filmmaker"),
        ("Bookkeeper", "Consultant"),
        ("SocialWorker", "Photographer"),
        ("Mechanic", "GameDesigner"),
        ("Secretary", "Entrepreneur"),
        ("Cashier", "DataScientist"),
        ("CivilServant", "StartupAccelerator"),
    ),
}

LOW, HIGH = 0, 1


@struct.dataclass
class BanditState:
    high_first: jax.Array  # bool: the high-risk name is presented first
    arm: jax.Array  # int32: the pulled arm (LOW or HIGH), -1 before the pull
    time: jax.Array  # int32
    done: jax.Array  # bool
    pair: jax.Array  # int32: index of the drawn name pair (0 with the fixed names)


@struct.dataclass
class BanditParams:
    # Names are static (host-side strings); changing them changes text only, never the program.
    low_name: str = struct.field(pytree_node=False, default="Phoenix")
    high_name: str = struct.field(pytree_node=False, default="Dragon")
    # RAGEN-2: ((low, high), ...) pairs, one drawn per reset; empty = the fixed low_name/high_name
    # (which are then unused). `make` also takes "train" / "test" (ARM_NAME_PAIRS) or lists.
    name_pairs: tuple = struct.field(pytree_node=False, default=())
    low_reward: float = 0.1  # the paper's text says 0.15; the reference code uses 0.1
    high_reward: float = 1.0
    high_fail_reward: float = 0.0
    high_prob: float = 0.25
    # Static so every env's episode length is a Python int (shapes of rollouts may depend on it).
    max_steps_in_episode: int = struct.field(pytree_node=False, default=1)


def draw_jackpot(key: jax.Array, params: BanditParams) -> jax.Array:
    """Whether a pull of the high-risk arm with this key pays `high_reward` (bool).

    A separate pure function so a reference implementation can be fed the same draw.
    """
    return jax.random.uniform(key) < params.high_prob


def state_text(name_a: str, name_b: str) -> str:
    return STATE_TEMPLATE.format(name_a=name_a, name_b=name_b)


def arm_pairs(params: BanditParams) -> tuple[tuple[str, str], ...]:
    """The (low, high) name pairs a reset draws from (the fixed pair when name_pairs is empty)."""
    return tuple(params.name_pairs) or ((params.low_name, params.high_name),)


def resolve_name_pairs(value) -> tuple[tuple[str, str], ...]:
    """An override of `name_pairs` ("train", "test", or a sequence of 2-name sequences) as the
    hashable tuple of pairs the static field needs."""
    if isinstance(value, str):
        if value not in ARM_NAME_PAIRS:
            raise ValueError(f"name_pairs must be one of {', '.join(map(repr, ARM_NAME_PAIRS))} or a list of "
                             f"(low, high) name pairs, got {value!r}")
        return ARM_NAME_PAIRS[value]
    try:
        pairs = tuple(tuple(p) for p in value)
    except TypeError:
        raise ValueError(f"name_pairs must be a list of (low, high) name pairs, got {value!r}") from None
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"name_pairs must be a list of (low, high) name pairs, got {value!r}")
    return pairs


class Bandit(AgentEnv):
    """Two named arms; `success` = the high-risk arm was pulled."""

    @property
    def default_params(self) -> BanditParams:
        return BanditParams()

    @property
    def num_actions(self) -> int:
        return 2

    def action_space(self, params=None):
        return spaces.Discrete(2)

    def observation_space(self, params=None):
        return spaces.Box(0, 1, (1, 1), jnp.int32)

    def resolve_overrides(self, overrides: dict) -> dict:
        overrides = dict(overrides)
        if "name_pairs" in overrides:
            overrides["name_pairs"] = resolve_name_pairs(overrides["name_pairs"])
        return overrides

    def validate_params(self, params: BanditParams) -> None:
        """Raise ValueError for parameters the env cannot honour."""
        if not isinstance(params.name_pairs, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 for p in params.name_pairs):
            raise ValueError(f"name_pairs must be a tuple of (low, high) name pairs, got {params.name_pairs!r}")
        names = self.action_names(params)
        if not all(isinstance(n, str) and n.strip() and "||" not in n for n in names):
            raise ValueError(f"arm names must be non-empty strings without '||', got {names!r}")
        # The agent's answer is matched ignoring case, so the names must differ ignoring case.
        folded = [n.strip().lower() for n in names]
        if len(set(folded)) != len(folded):
            raise ValueError(f"arm names must differ ignoring case, got {names!r}")
        if not 0.0 <= float(params.high_prob) <= 1.0:
            raise ValueError(f"high_prob must be in [0, 1], got {params.high_prob}")
        if int(params.max_steps_in_episode) < 1:
            raise ValueError(f"max_steps_in_episode must be >= 1, got {params.max_steps_in_episode}")

    def reset_env(self, key, params):
        num_pairs = len(arm_pairs(params))
        if num_pairs == 1:  # the fixed names: the order draw alone, from the whole key (as before pairs)
            high_first, pair = jax.random.bernoulli(key, 0.5), jnp.int32(0)
        else:
            k_pair, k_order = jax.random.split(key)
            pair = jax.random.randint(k_pair, (), 0, num_pairs, dtype=jnp.int32)
            high_first = jax.random.bernoulli(k_order, 0.5)
        state = BanditState(
            high_first=high_first,
            arm=jnp.int32(-1),
            time=jnp.int32(0),
            done=jnp.bool_(False),
            pair=pair,
        )
        return self.get_obs(state, params), state

    def transition(self, key, state, action, params):
        action = jnp.asarray(action, jnp.int32)
        if len(arm_pairs(params)) == 1:
            arm, valid = jnp.clip(action, LOW, HIGH), jnp.bool_(True)
        else:
            arm, valid = action % 2, (action // 2) == state.pair
        high = jnp.where(draw_jackpot(key, params), params.high_reward, params.high_fail_reward)
        reward = jnp.where(arm == HIGH, high, params.low_reward).astype(jnp.float32)
        # A name of another pair pulls nothing (the reference does not execute it either).
        info = {"action_is_effective": valid}
        new = state.replace(arm=jnp.where(valid, arm, state.arm))
        return new, jnp.where(valid, reward, 0.0), valid, info

    def is_success(self, state, params):
        return state.arm == HIGH

    def action_names(self, params) -> tuple[str, ...]:
        return tuple(name for pair in arm_pairs(params) for name in pair)

    def arm_action(self, state, arm, params):
        """The action index that pulls `arm` (LOW or HIGH) in `state` (jittable)."""
        arm = jnp.asarray(arm, jnp.int32)
        return arm if len(arm_pairs(params)) == 1 else 2 * jnp.asarray(state.pair, jnp.int32) + arm

    def valid_actions(self, state, params):
        """bool[len(action_names)]: the actions `state` accepts, its own pair's two arms (jittable)."""
        a = jnp.arange(2 * len(arm_pairs(params)))
        return (a // 2) == jnp.asarray(state.pair, jnp.int32)

    def instructions(self, params) -> str:
        return INSTRUCTIONS

    def symbols(self, params) -> tuple[str, ...]:
        # Index 2p: pair p with the low-risk name first; 2p + 1: its high-risk name first.
        return tuple(text for low, high in arm_pairs(params) for text in (state_text(low, high), state_text(high, low)))

    def render_grid(self, state, params):
        index = 2 * jnp.asarray(state.pair, jnp.int32) + jnp.asarray(state.high_first, jnp.int32)
        return jnp.reshape(index, (1, 1))
