"""One record per environment (`EnvSpec`): its name, how to build it, and everything a consumer
switches on (teacher kind, one-action conversation, mixability, evaluation defaults).

Config validation, prompt settings, solver teachers, evaluation and the env mix read these records
instead of listing environment names, so adding an environment touches envs_jax/ alone: write the
env, then `register(EnvSpec(...))` below (a test or a plug-in may register its own at run time).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from envs_jax import countdown, frozen_lake, game_2048, rubiks_cube, sokoban, sudoku
from envs_jax.bandit import ARM_NAME_PAIRS, Bandit, BanditParams, arm_pairs
from envs_jax.frozen_lake import FrozenLake, FrozenLakeParams

# Teacher kinds (the rollout side has one teacher class per kind) and what each needs of the env.
TEACHER_KINDS = {
    "bfs": "env.solve(state, params) -> Solution(actions, length): a shortest plan from the current state",
    "value_iteration": "env.solve(state, params) -> (policy[actions left, state.pos], value): an optimal policy",
    "bandit_arm": "env.arm_action(state, arm, params): the action that pulls the low (0) or high (1) arm",
    "countdown_solution": "state.nums, state.signs, state.count: a +- solution of the task",
    "backtracking": "env.solve(state, params) -> (grid, ok): the current grid completed; state.solution as fallback",
    "expectimax": "env.teacher_action(key, state, params) -> action: the env's own player's move for the current state",
    # Any new env: its own policy, written in its file (no teacher class to add in the rollout stage).
    "env_policy": "env.teacher_action(key, state, params) -> action: the env's own policy's next action, one per turn",
}


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """An environment's record.

    name: the registered name (`make(name)`).
    build: `build(name, **overrides) -> (env, params)`: the env with this name's defaults, then the
        overrides; ValueError (one sentence naming the bad override) otherwise. `dataclass_build`
        makes one for an env whose parameters are one dataclass.
    env_class: the class `build` returns (teachers check a TextEnv's env against it).
    action_names: what the agent writes, in action-index order, with the default parameters.
    teacher: a TEACHER_KINDS key, or "" when no solver teacher exists.
    teacher_thought: the fixed thought of that teacher's demonstrations (think mode).
    single_action: one turn with one action whatever the run's prompt settings say (Bandit).
    mixable: may be one environment of `env.mix` (it then shares the run's conversation).
    success_alias: one more name evaluation reports `success` under ("" for none).
    default_eval: in the default evaluation suite (launch/eval.py without --envs).
    text_layer: the text layer renders and parses it (TextEnv); False for an env that runs on device
        but cannot be trained yet. Its teacher thought stays out of the task vocabulary until then,
        so registering it changes no existing run.
    """

    name: str
    build: Callable[..., tuple[Any, Any]]
    env_class: type
    action_names: tuple[str, ...]
    teacher: str = ""
    teacher_thought: str = ""
    single_action: bool = False
    mixable: bool = True
    success_alias: str = ""
    default_eval: bool = False
    text_layer: bool = True

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip() or ":" in self.name or "," in self.name:
            raise ValueError(f"environment name {self.name!r} must be a non-empty string without ':' or ','")
        if self.teacher and self.teacher not in TEACHER_KINDS:
            raise ValueError(f"{self.name}: unknown teacher kind {self.teacher!r}; valid: {', '.join(TEACHER_KINDS)}")
        if self.mixable and not self.text_layer:
            raise ValueError(f"{self.name}: an env without a text layer cannot be mixable")
        if self.mixable and self.single_action:
            raise ValueError(f"{self.name}: a single_action env has a conversation of its own and cannot be mixable")

    def make(self, **overrides):
        """(env, params) with this record's defaults and `overrides`."""
        return self.build(self.name, **overrides)


def dataclass_build(default: Callable[[], tuple[Any, Any]]) -> Callable[..., tuple[Any, Any]]:
    """`EnvSpec.build` for an env whose parameters are one dataclass: `default()` gives (env, params);
    overrides replace params fields (or the env's `override_aliases`, resolved by its
    `resolve_overrides`), then the env's `validate_params` checks the result."""

    def build(name: str, **overrides):
        env, params = default()
        valid = [f.name for f in dataclasses.fields(params)] + list(env.override_aliases)
        unknown = sorted(set(overrides) - set(valid))
        if unknown:
            raise ValueError(
                f"unknown parameter(s) {', '.join(map(repr, unknown))} for {name}; valid: {', '.join(valid)}"
            )
        overrides = env.resolve_overrides(overrides)  # aliases (FrozenLake success_rate), list-valued forms
        params = params.replace(**overrides)
        env.validate_params(params)
        return env, params

    return build


_SPECS: dict[str, EnvSpec] = {}


def register(spec: EnvSpec, *, replace: bool = False) -> EnvSpec:
    """Add a record (ValueError if the name is taken, unless `replace`)."""
    if not isinstance(spec, EnvSpec):
        raise ValueError(f"register takes an EnvSpec, got {type(spec).__name__}")
    if spec.name in _SPECS and not replace:
        raise ValueError(f"environment {spec.name!r} is already registered; pass replace=True to redefine it")
    _SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a record (tests and plug-ins that registered their own)."""
    get_spec(name)
    del _SPECS[name]


def registered_envs() -> tuple[str, ...]:
    """All names `make` accepts, in registration order."""
    return tuple(_SPECS)


def get_spec(name: str) -> EnvSpec:
    """The record of a registered name; ValueError listing the registered names otherwise."""
    spec = _SPECS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"unknown environment {name!r}; valid: {', '.join(registered_envs())}")
    return spec


def make(name: str, **overrides):
    """The environment and its parameters for a registered name; `overrides` replace parameters.

    Raises ValueError for an unknown name, an unknown parameter name, or an invalid value.
    """
    return get_spec(name).make(**overrides)


def default_eval_suite() -> tuple[str, ...]:
    """The registered names marked `default_eval`, in registration order."""
    return tuple(n for n, s in _SPECS.items() if s.default_eval)


# ---------------------------------------------------------------------------------- built-ins
# Names follow the reference's config/envs.yaml tags (RAGEN v1's, plus RAGEN-2's Coord* tags).
_SOKOBAN = dict(build=sokoban.make_sokoban, env_class=sokoban.SokobanEnv, action_names=sokoban.ACTION_NAMES,
                teacher="bfs", teacher_thought=" I push the box toward the target.")
_FROZEN_LAKE = dict(env_class=FrozenLake, action_names=frozen_lake.ACTION_NAMES, teacher="value_iteration",
                    teacher_thought=" I avoid the holes and head for the goal.")
# Bandit: one pull per episode; success = the high-risk arm, so evaluation also names it high_arm_rate.
_BANDIT = dict(env_class=Bandit, teacher="bandit_arm", teacher_thought=" I choose an arm by what its name suggests.",
               single_action=True, mixable=False, success_alias="high_arm_rate")


def _bandit(name: str, params: BanditParams, **fields) -> EnvSpec:
    names = tuple(n for pair in arm_pairs(params) for n in pair)
    return EnvSpec(name, dataclass_build(lambda: (Bandit(), params)), action_names=names, **_BANDIT, **fields)


for _spec in (
    EnvSpec("Sokoban", **_SOKOBAN, default_eval=True),
    EnvSpec("NewSymbolsSokoban", **_SOKOBAN, default_eval=True),
    EnvSpec("LargerSokoban", **_SOKOBAN, default_eval=True),
    EnvSpec("CoordSokoban", **_SOKOBAN),  # RAGEN-2's: coordinates + grid, its own instruction
    EnvSpec("FrozenLake", dataclass_build(lambda: (FrozenLake(), FrozenLakeParams())), **_FROZEN_LAKE,
            default_eval=True),
    # RAGEN-2's CoordFrozenLake: coordinates + grid, its instruction, and its envs.yaml success_rate 0.8.
    EnvSpec("CoordFrozenLake", dataclass_build(lambda: (FrozenLake(), FrozenLakeParams(
        observation_format="grid_coord", instruction="coord", slip=0.2))), **_FROZEN_LAKE),
    _bandit("Bandit", BanditParams(), default_eval=True),
    _bandit("BanditTest", BanditParams(low_name="Trader", high_name="Librarian"), default_eval=True),
    # RAGEN-2's Bandit / BanditTest: a (low, high) name pair drawn per reset from its train / test list.
    _bandit("BanditPairs", BanditParams(name_pairs=ARM_NAME_PAIRS["train"])),
    _bandit("BanditPairsTest", BanditParams(name_pairs=ARM_NAME_PAIRS["test"])),
    # RAGEN-2's game_2048, rendered from slots; mixable with the Sokobans and FrozenLakes (the same four
    # names in another order: the mix maps them). No thought: it would enter every run's task vocabulary.
    EnvSpec("game_2048", dataclass_build(lambda: (game_2048.Game2048(), game_2048.Game2048Params())),
            env_class=game_2048.Game2048, action_names=game_2048.ACTION_NAMES, teacher="expectimax"),
    # RAGEN-2's rubikscube (envs.yaml: scramble_depth 1, max_steps 20), with a real B move by default.
    EnvSpec("rubikscube", dataclass_build(lambda: (rubiks_cube.RubiksCube(), rubiks_cube.RubiksCubeParams())),
            env_class=rubiks_cube.RubiksCube, action_names=rubiks_cube.ACTION_NAMES, teacher="bfs",
            mixable=False),  # no thought: it would enter every run's task vocabulary (teacher_texts)
    # RAGEN-2's SimpleSudoku / MediumSudoku (envs.yaml: 9x9, easy / medium, max_actions_per_traj 20 / 30).
    # Text: the with_feedback render from slot tables; answers "row,col,digit"; no thought (Countdown's reason).
    EnvSpec("SimpleSudoku", dataclass_build(lambda: (sudoku.Sudoku(), sudoku.SudokuParams())),
            env_class=sudoku.Sudoku, action_names=sudoku.action_names(9), teacher="backtracking", mixable=False),
    EnvSpec("MediumSudoku", dataclass_build(lambda: (sudoku.Sudoku(), sudoku.SudokuParams(
        difficulty="medium", max_steps_in_episode=30))), env_class=sudoku.Sudoku,
        action_names=sudoku.action_names(9), teacher="backtracking", mixable=False),
    # RAGEN's Countdown: one free-form answer (an envs_jax.countdown.Answer the text layer parses), no names.
    EnvSpec("Countdown", dataclass_build(lambda: (countdown.Countdown(), countdown.CountdownParams())),
            env_class=countdown.Countdown, action_names=(), teacher="countdown_solution", single_action=True,
            mixable=False),  # no thought: a thought would enter every run's task vocabulary (teacher_texts)
):
    register(_spec)
del _spec
