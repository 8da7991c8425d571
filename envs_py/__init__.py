"""Stage 0, the environments in plain Python: one port per environment (envs_py/<env>.py), written from
the reference's code (RAGEN / RAGEN-2's envs and the gym / gymnasium envs they wrap), never from the
JAX code, and importing nothing of the project. The tests compare envs_jax with them step by step (the
truth), and the benchmarks time them as the host-side baseline.

Each module holds the rules once: a state class (`time`, `done`, `copy()`) and a rules class with
`step(state, action, rng) -> (state, reward, done, info)`, `render(state)`, `action_names`,
`max_steps` and `answer_format` ("action"; Countdown's "text": `step_text`), plus the reference
episode object its tests step the way the reference's env is stepped (`RefSokoban`, `FrozenLakeRef`,
...), built on those rules. `host_env` / `from_jax` pair a registered JAX env with its port;
envs_py.conversation has the conversation text, the answer parse and the host agent step.
"""

from __future__ import annotations

from envs_py import bandit, countdown, frozen_lake, game_2048, rubiks_cube, sokoban, sudoku
from envs_py.conversation import answer_pieces, host_steps, parse_answer, reward_text, segment_text
from envs_py.sokoban import generate_sokoban_room

_PORTS = {"Sokoban": sokoban, "LargerSokoban": sokoban, "FrozenLake": frozen_lake, "Bandit": bandit,
          "rubikscube": rubiks_cube, "SimpleSudoku": sudoku, "MediumSudoku": sudoku, "game_2048": game_2048,
          "Countdown": countdown}


def _port_module(name: str):
    if name not in _PORTS:
        raise ValueError(f"no plain-Python port of {name!r}; ports: {', '.join(_PORTS)}")
    return _PORTS[name]


def host_env(name: str, env, params):
    """The port of registered env `name`, with the JAX env's parameters (read, never run)."""
    _port_module(name)
    steps = int(params.max_steps_in_episode)
    if name in ("Sokoban", "LargerSokoban"):
        return sokoban.Sokoban(env.config.num_boxes, steps)
    if name == "FrozenLake":
        return frozen_lake.FrozenLake(float(params.slip), steps)
    if name == "Bandit":
        return bandit.Bandit(params.low_name, params.high_name, float(params.low_reward), float(params.high_reward),
                             float(params.high_fail_reward), float(params.high_prob), steps)
    if name == "rubikscube":
        return rubiks_cube.Cube(steps, params.moves)
    if name in ("SimpleSudoku", "MediumSudoku"):
        return sudoku.Sudoku(params.grid_size, params.max_steps, steps, (float(params.correct_placement_score),
                                                                        float(params.invalid_action_score),
                                                                        float(params.completion_bonus)))
    if name == "game_2048":
        return game_2048.Game2048(steps, float(params.two_prob))
    return countdown.Countdown()


def from_jax(name: str):
    """JAX state (one env) -> the port's state, for registered env `name`."""
    return _port_module(name).from_jax


__all__ = ["answer_pieces", "bandit", "countdown", "from_jax", "frozen_lake", "game_2048", "generate_sokoban_room",
           "host_env", "host_steps", "parse_answer", "reward_text", "rubiks_cube", "segment_text", "sokoban", "sudoku"]
