"""Bi-arm Bandit: one turn, one action, two named arms (RAGEN's `Bandit` / `BanditTest`).

Action 0 pulls the low-risk arm, action 1 the high-risk arm; the agent writes the arm's NAME.
The reference randomises, at every reset, the ORDER in which the two names are presented, so the
position in the prompt carries no information; that order is the only state. The two possible
state texts are the two "symbols" of a 1x1 grid, which keeps the env inside the grid/text contract.
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

LOW, HIGH = 0, 1


@struct.dataclass
class BanditState:
    high_first: jax.Array  # bool: the high-risk name is presented first
    arm: jax.Array  # int32: the pulled action index, -1 before the pull
    time: jax.Array  # int32
    done: jax.Array  # bool


@struct.dataclass
class BanditParams:
    # Names are static (host-side strings); changing them changes text only, never the program.
    low_name: str = struct.field(pytree_node=False, default="Phoenix")
    high_name: str = struct.field(pytree_node=False, default="Dragon")
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

    def validate_params(self, params: BanditParams) -> None:
        """Raise ValueError for parameters the env cannot honour."""
        names = (params.low_name, params.high_name)
        if not all(isinstance(n, str) and n.strip() and "||" not in n for n in names):
            raise ValueError(f"arm names must be non-empty strings without '||', got {names!r}")
        # The agent's answer is matched ignoring case, so the names must differ ignoring case.
        if params.low_name.strip().lower() == params.high_name.strip().lower():
            raise ValueError(f"arm names must differ ignoring case, got {names!r}")
        if not 0.0 <= float(params.high_prob) <= 1.0:
            raise ValueError(f"high_prob must be in [0, 1], got {params.high_prob}")
        if int(params.max_steps_in_episode) < 1:
            raise ValueError(f"max_steps_in_episode must be >= 1, got {params.max_steps_in_episode}")

    def reset_env(self, key, params):
        state = BanditState(
            high_first=jax.random.bernoulli(key, 0.5),
            arm=jnp.int32(-1),
            time=jnp.int32(0),
            done=jnp.bool_(False),
        )
        return self.get_obs(state, params), state

    def transition(self, key, state, action, params):
        arm = jnp.clip(jnp.asarray(action, jnp.int32), LOW, HIGH)
        high = jnp.where(draw_jackpot(key, params), params.high_reward, params.high_fail_reward)
        reward = jnp.where(arm == HIGH, high, params.low_reward).astype(jnp.float32)
        info = {"action_is_effective": jnp.bool_(True)}
        return state.replace(arm=arm), reward, jnp.bool_(True), info

    def is_success(self, state, params):
        return state.arm == HIGH

    def action_names(self, params) -> tuple[str, ...]:
        return (params.low_name, params.high_name)

    def instructions(self, params) -> str:
        return INSTRUCTIONS

    def symbols(self, params) -> tuple[str, ...]:
        # Index 0: low-risk name first; index 1: high-risk name first.
        return (
            state_text(params.low_name, params.high_name),
            state_text(params.high_name, params.low_name),
        )

    def render_grid(self, state, params):
        return jnp.reshape(jnp.asarray(state.high_first, jnp.int32), (1, 1))
