"""FrozenLake with random maps generated in-graph (RAGEN's `FrozenLake`).

Rules (gymnasium FrozenLake-v1 as RAGEN uses it, with RAGEN's random start and goal):
- size x size cells, each frozen with probability `frozen_prob`, else a hole; start and goal are
  two distinct uniformly random cells (never holes); the whole map is re-drawn until the goal is
  reachable from the start through non-hole cells (4-neighbourhood).
- Slippery moves: the intended direction with probability 1 - slip, each perpendicular direction
  with slip / 2. A move off the grid leaves the player in place. RAGEN-2 (gymnasium >= 1.0) calls
  1 - slip `success_rate`; `envs_jax.make` accepts that name too (`resolve_overrides`).
- Where the slips come from (`FrozenLakeParams.seeded_slips`): by default, as in the reference, from
  a stream seeded at reset (gymnasium's `reset(seed=...)` seeds the `np_random` that `step` draws
  from, one draw per move), so the k-th move of every episode reset from one seed, e.g. the N
  rollouts of a group, slips the same way; otherwise from the key `step_env` is given.
- Reward 1 on reaching the goal, else 0. Falling into a hole or reaching the goal terminates.
- `action_is_effective` = the player's cell changed (as in the reference).
Cells are addressed by a flat index `row * size + col` everywhere.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces

from envs_jax import coords
from envs_jax.base import AgentEnv

ACTION_NAMES = ("Left", "Down", "Right", "Up")
LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
# Row/column offsets in action-index order (gymnasium's LEFT=0, DOWN=1, RIGHT=2, UP=3).
_DROW = (0, 1, 0, -1)
_DCOL = (-1, 0, 1, 0)
_SLIP_STREAM = 0x511D  # fold_in tag that separates the slip stream from the map's draws

# Symbol indices, in the reference's grid_lookup order.
PLAYER, FROZEN, HOLE, GOAL, PLAYER_IN_HOLE, PLAYER_ON_GOAL = range(6)
SYMBOLS = ("P", "_", "O", "G", "X", "√")
SYMBOL_NAMES = ("player", "empty", "hole", "goal", "player in hole", "player on goal")
GRID_VOCAB = tuple(zip(SYMBOLS, SYMBOL_NAMES))
# Not the reference's: one digit per cell (`FrozenLakeParams.symbols="digits"`). Qwen's pre-tokenizer
# splits every digit off on its own, so each cell is one token and the cell above the player is
# always the same number of tokens back; the reference's letters merge into row pieces ("___P",
# "O__G") whose cells a model has to count out (docs/experiments/demo.md, "One token per cell").
DIGIT_SYMBOLS = ("1", "0", "2", "3", "4", "5")
SYMBOL_SETS = {"standard": SYMBOLS, "digits": DIGIT_SYMBOLS}

# The reference's env_instruction (config/envs.yaml), verbatim, including its typo ("whole"),
# followed by its symbol legend exactly as its context manager appends it.
ENV_INSTRUCTION = (
    "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to "
    "the unintended direction due to the slippery ice. Example answer format: <think>To forbid the "
    "hole and go to the target, I should go left then go up.</think><answer>Left || Up</answer>"
)
def legend(symbols=SYMBOLS) -> str:
    return ", ".join(f"{k}: {v}" for k, v in zip(symbols, SYMBOL_NAMES))


LEGEND = legend()
INSTRUCTIONS = ENV_INSTRUCTION + "\nThe meaning of each symbol in the state is:\n" + LEGEND
# RAGEN-2's config/envs.yaml `env_instruction` of CoordFrozenLake, verbatim (a YAML literal block:
# line breaks and the final newline included). Its corner "(5, 5)" is the reference's fixed text,
# although its FrozenLake boards are 4x4 by default.
COORD_ENV_INSTRUCTION = (
    "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and "
    "zero-indexed coordinates for the start, goal, player, and any holes.\n"
    "Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5).\n"
    "Beware that the ice is slippery, so the agent might slide and end up in an unintended tile.\n"
    "Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n"
)
ENV_INSTRUCTIONS = {"standard": ENV_INSTRUCTION, "coord": COORD_ENV_INSTRUCTION}
# Not the reference's: two lines after the state (`FrozenLakeParams.surroundings=True`) that spell out
# what the value-iteration teacher's action depends on most: which neighbouring cells are holes or
# off the map, and the goal's offset (docs/experiments/demo.md, "Surroundings lines"). Holes and walls (the map
# edge, where a move leaves the player in place) name their directions with different words, so
# every (kind, direction) pair is its own token: a model reads it from the token's presence alone,
# without binding a kind to the direction next to it, which a random-init tiny model learned far
# more slowly (measured in docs/experiments/demo.md).
HOLE_WORDS = ("west", "south", "east", "north")  # in action order: Left, Down, Right, Up
WALL_WORDS = ("left", "down", "right", "up")
OPEN, NEAR_HOLE, WALL = range(3)  # a neighbouring cell: ice or goal, a hole, off the map
SURROUNDINGS_NOTE = "\nBelow the state: the cell one step in each direction, and how far away the goal is."
# The reference's coordinate lines (frozen_lake/utils.py format_coordinate_render), in its order.
COORD_LABELS = ("Start", "Goal", "Player", "Player on goal", "Player in hole", "Holes")


@struct.dataclass
class FrozenLakeState:
    hole: jax.Array  # bool[size, size]
    start: jax.Array  # int32 flat cell
    goal: jax.Array  # int32 flat cell
    pos: jax.Array  # int32 flat cell of the player
    time: jax.Array  # int32
    done: jax.Array  # bool
    # uint32 key data: the reset key's slip stream; move k draws from fold_in(slip_key, k) (seeded_slips).
    slip_key: jax.Array


@struct.dataclass
class FrozenLakeParams:
    # Shapes depend on these, so they are static (part of the compiled program, not traced).
    size: int = struct.field(pytree_node=False, default=4)
    max_steps_in_episode: int = struct.field(pytree_node=False, default=10)
    max_tries: int = 64  # map re-draws before the forced-path fallback (traced: no recompile)
    frozen_prob: float = 0.8
    # Total slip probability: 2/3 is gymnasium's is_slippery (1/3 intended, 1/3 each side).
    # RAGEN-2's `success_rate` is 1 - slip (make(..., success_rate=x) sets slip = 1 - x).
    slip: float = 2.0 / 3.0
    # True (the reference): the slips come from a stream seeded by the reset key, so episodes reset
    # from one seed share their slip on every k-th move. The N rollouts of a group then differ in
    # reward only through their actions (common random numbers), which is what the group-normalised
    # advantage compares. False: from the key step_env is given (independent per rollout row).
    seeded_slips: bool = struct.field(pytree_node=False, default=True)
    # RAGEN-2's observation_format: "grid", "grid_coord" or "coord" (envs_jax/coords.py). Static:
    # it changes the text layer's token budget.
    observation_format: str = struct.field(pytree_node=False, default="grid")
    # Env instruction text: "standard" (FrozenLake) or "coord" (RAGEN-2's CoordFrozenLake).
    instruction: str = struct.field(pytree_node=False, default="standard")
    # Grid symbols: "standard" (the reference's P _ O G X √) or "digits" (DIGIT_SYMBOLS: one token
    # per cell). Static: it changes the text layer's token tables.
    symbols: str = struct.field(pytree_node=False, default="standard")
    # Not the reference's: name the holes and walls next to the player and the goal's offset in two
    # lines after the state (neighbours_text, goal_offset_text). Static: it changes the text
    # layer's token tables.
    surroundings: bool = struct.field(pytree_node=False, default=False)


# ---- pure rule functions ------------------------------------------------------------------------
def move(pos: jax.Array, direction: jax.Array, size: int) -> jax.Array:
    """The cell reached from `pos` by one move in `direction`; off-grid moves stay in place."""
    row, col = pos // size, pos % size
    row = jnp.clip(row + jnp.asarray(_DROW)[direction], 0, size - 1)
    col = jnp.clip(col + jnp.asarray(_DCOL)[direction], 0, size - 1)
    return (row * size + col).astype(jnp.int32)


def slip_direction(key: jax.Array, action: jax.Array, slip: jax.Array) -> jax.Array:
    """The direction actually taken for an intended `action` (the slippery-ice draw).

    A separate pure function so a reference implementation can be fed the same realised direction.
    """
    u = jax.random.uniform(key)
    offset = jnp.where(u < 1.0 - slip, 0, jnp.where(u < 1.0 - slip / 2.0, -1, 1))
    return ((jnp.asarray(action, jnp.int32) + offset) % 4).astype(jnp.int32)


def slip_stream(reset_key: jax.Array) -> jax.Array:
    """The slip stream of an episode reset with `reset_key`, independent of the map's draws.

    Raw key data (uint32), whether `reset_key` is a typed or a raw key, so states compare, stack
    and `jnp.where` like every other field.
    """
    stream = jax.random.fold_in(reset_key, _SLIP_STREAM)
    return jax.random.key_data(stream) if jax.dtypes.issubdtype(stream.dtype, jax.dtypes.prng_key) else stream


def direction_probs(slip: jax.Array) -> jax.Array:
    """[action, direction] probability of each realised direction (matches `slip_direction`)."""
    eye = jnp.eye(4, dtype=jnp.float32)
    side = jnp.roll(eye, 1, axis=1) + jnp.roll(eye, -1, axis=1)
    return (1.0 - slip) * eye + (slip / 2.0) * side


def reachable(hole: jax.Array, start: jax.Array) -> jax.Array:
    """bool[size, size]: cells reachable from `start` through non-hole cells (4-neighbourhood)."""
    size = hole.shape[-1]
    free = ~hole
    seed = (jnp.arange(size * size) == start).reshape(size, size) & free

    def grow(_, r):
        pad = jnp.pad(r, 1)
        nbr = pad[:-2, 1:-1] | pad[2:, 1:-1] | pad[1:-1, :-2] | pad[1:-1, 2:]
        return (r | nbr) & free

    # A shortest path visits each cell at most once, so size*size - 1 growth steps always suffice.
    return jax.lax.fori_loop(0, size * size - 1, grow, seed)


def _draw_map(key, params):
    n = params.size
    k_hole, k_start, k_goal = jax.random.split(key, 3)
    hole = jax.random.uniform(k_hole, (n * n,)) >= params.frozen_prob
    start = jax.random.randint(k_start, (), 0, n * n, dtype=jnp.int32)
    goal = jax.random.randint(k_goal, (), 0, n * n, dtype=jnp.int32)
    # As in the reference, start and goal overwrite whatever cell was drawn there.
    hole = hole.at[start].set(False).at[goal].set(False).reshape(n, n)
    ok = (start != goal) & reachable(hole, start).reshape(-1)[goal]
    return hole, start, goal, ok


def _force_path(hole, start, goal, size):
    """Fallback map (probability < 1e-30 at default settings): clear an L-shaped start->goal path."""
    goal = jnp.where(goal == start, (start + 1) % (size * size), goal)
    sr, sc, gr, gc = start // size, start % size, goal // size, goal % size
    rows, cols = jnp.arange(size)[:, None], jnp.arange(size)[None, :]
    vertical = (cols == sc) & (rows >= jnp.minimum(sr, gr)) & (rows <= jnp.maximum(sr, gr))
    horizontal = (rows == gr) & (cols >= jnp.minimum(sc, gc)) & (cols <= jnp.maximum(sc, gc))
    return hole & ~(vertical | horizontal), start, goal


def generate_map(key: jax.Array, params: FrozenLakeParams):
    """(hole bool[n, n], start, goal): a deterministic function of `key`, always with a path.

    Rejection sampling of (holes, start, goal) jointly, like the reference, in a bounded
    while_loop so it stays inside the compiled program (and under vmap).
    """

    def cond(carry):
        _, tries, _, _, _, ok = carry
        return (~ok) & (tries < params.max_tries)

    def body(carry):
        key, tries, *_ = carry
        key, sub = jax.random.split(key)
        return (key, tries + 1, *_draw_map(sub, params))

    n = params.size
    init = (key, jnp.int32(0), jnp.zeros((n, n), bool), jnp.int32(0), jnp.int32(0), jnp.bool_(False))
    _, _, hole, start, goal, ok = jax.lax.while_loop(cond, body, init)
    f_hole, f_start, f_goal = _force_path(hole, start, goal, n)
    return jnp.where(ok, hole, f_hole), jnp.where(ok, start, f_start), jnp.where(ok, goal, f_goal)


def _planning_model(state: FrozenLakeState, params: FrozenLakeParams):
    """The map as a finite-horizon MDP over cells, shared by `solve` and `policy_success`:
    (q_of(value [cell]) -> [cell, action] expected next value under the slips, goal indicator
    [cell] f32, terminal [cell] bool)."""
    cells = jnp.arange(params.size * params.size)
    nxt = move(cells[:, None], jnp.arange(4)[None, :], params.size)  # [cell, direction]
    probs = direction_probs(params.slip)  # [action, direction]
    at_goal = (cells == state.goal).astype(jnp.float32)
    terminal = state.hole.reshape(-1) | (cells == state.goal)
    return (lambda value: jnp.einsum("ad,cd->ca", probs, value[nxt])), at_goal, terminal


# ---- host helpers (tests, fixed maps) -----------------------------------------------------------
def state_from_rows(rows) -> FrozenLakeState:
    """A fresh state from reference-style rows of 'S', 'F', 'H', 'G' (player on 'S'), with the slip
    stream of PRNGKey(0) (`.replace(slip_key=slip_stream(key))` for another)."""
    grid = np.array([list(r) for r in rows])
    n = grid.shape[0]
    if grid.shape != (n, n) or (grid == "S").sum() != 1 or (grid == "G").sum() != 1:
        raise ValueError(f"rows must form a square map with one 'S' and one 'G', got {rows!r}")
    start = int(np.flatnonzero(grid.reshape(-1) == "S")[0])
    goal = int(np.flatnonzero(grid.reshape(-1) == "G")[0])
    return FrozenLakeState(
        hole=jnp.asarray(grid == "H"),
        start=jnp.int32(start),
        goal=jnp.int32(goal),
        pos=jnp.int32(start),
        time=jnp.int32(0),
        done=jnp.bool_(False),
        slip_key=slip_stream(jax.random.PRNGKey(0)),
    )


def rows_from_state(state: FrozenLakeState) -> list[str]:
    """Reference-style rows ('S', 'F', 'H', 'G') of a single (unbatched) state's map."""
    hole = np.asarray(state.hole)
    cells = np.where(hole, "H", "F").reshape(-1)
    cells[int(state.start)] = "S"
    cells[int(state.goal)] = "G"
    n = hole.shape[0]
    return ["".join(cells[r * n : (r + 1) * n]) for r in range(n)]


def neighbours_text(kinds) -> str:
    """The first surroundings line from one OPEN / NEAR_HOLE / WALL per direction, in action order."""
    holes = [w for w, k in zip(HOLE_WORDS, kinds) if k == NEAR_HOLE]
    walls = [w for w, k in zip(WALL_WORDS, kinds) if k == WALL]
    return f"Holes: {', '.join(holes) or 'none'}. Walls: {', '.join(walls) or 'none'}."


def goal_offset_text(rows: int, cols: int) -> str:
    """The second surroundings line: the goal's row and column offset from the player, in moves."""
    parts = ([f"{abs(rows)} {'Down' if rows > 0 else 'Up'}"] if rows else []) + \
        ([f"{abs(cols)} {'Right' if cols > 0 else 'Left'}"] if cols else [])
    return "Goal: " + (", ".join(parts) if parts else "here") + "."


def surroundings_texts(state: FrozenLakeState) -> list[str]:
    """Host reference of the two surroundings lines, read off the reference-style rows."""
    rows = rows_from_state(state)
    n = len(rows)
    r, c = divmod(int(state.pos), n)
    kinds = []
    for dr, dc in zip(_DROW, _DCOL):
        rr, cc = r + dr, c + dc
        inside = 0 <= rr < n and 0 <= cc < n
        tile = rows[rr][cc] if inside else None
        kinds.append(WALL if not inside else NEAR_HOLE if tile == "H" else OPEN)
    gr, gc = divmod(int(state.goal), n)
    return [neighbours_text(kinds), goal_offset_text(gr - r, gc - c)]


def resolve_overrides(overrides: dict) -> dict:
    """`make` overrides with RAGEN-2's `success_rate` (probability of the intended move) turned
    into `slip` = 1 - success_rate. Naming both is an error."""
    overrides = dict(overrides)
    if "success_rate" in overrides:
        rate = overrides.pop("success_rate")
        if "slip" in overrides:
            raise ValueError("give FrozenLake either success_rate or slip (slip = 1 - success_rate), not both")
        if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)) \
                or not 0.0 <= float(rate) <= 1.0:
            raise ValueError(f"success_rate must be a number in [0, 1], got {rate!r}")
        overrides["slip"] = 1.0 - float(rate)
    return overrides


# ---- the environment ----------------------------------------------------------------------------
class FrozenLake(AgentEnv):
    """Slippery FrozenLake on a random map; `success` = the player is on the goal."""

    # Override names `make` accepts besides the params' fields.
    override_aliases = ("success_rate",)

    @property
    def default_params(self) -> FrozenLakeParams:
        return FrozenLakeParams()

    @property
    def num_actions(self) -> int:
        return 4

    def action_space(self, params=None):
        return spaces.Discrete(4)

    def observation_space(self, params=None):
        n = (params or self.default_params).size
        return spaces.Box(0, len(SYMBOLS) - 1, (n, n), jnp.int32)

    def validate_params(self, params: FrozenLakeParams) -> None:
        """Raise ValueError for parameters the env cannot honour."""
        if not isinstance(params.size, int) or params.size < 2:
            raise ValueError(f"size must be an int >= 2 (start and goal differ), got {params.size!r}")
        if not 0.0 < float(params.frozen_prob) <= 1.0:
            raise ValueError(f"frozen_prob must be in (0, 1], got {params.frozen_prob}")
        if not 0.0 <= float(params.slip) <= 1.0:
            raise ValueError(f"slip must be in [0, 1], got {params.slip}")
        if not isinstance(params.max_steps_in_episode, int) or params.max_steps_in_episode < 1:
            raise ValueError(f"max_steps_in_episode must be an int >= 1, got {params.max_steps_in_episode!r}")
        if int(params.max_tries) < 1:
            raise ValueError(f"max_tries must be an int >= 1, got {params.max_tries!r}")
        coords.check_format(params.observation_format)
        if params.instruction not in ENV_INSTRUCTIONS:
            raise ValueError(f"instruction must be one of {', '.join(ENV_INSTRUCTIONS)}, got {params.instruction!r}")
        if params.symbols not in SYMBOL_SETS:
            raise ValueError(f"symbols must be one of {', '.join(SYMBOL_SETS)}, got {params.symbols!r}")
        if not isinstance(params.surroundings, bool):
            raise ValueError(f"surroundings must be True or False, got {params.surroundings!r}")
        if not isinstance(params.seeded_slips, bool):
            raise ValueError(f"seeded_slips must be True or False, got {params.seeded_slips!r}")

    def resolve_overrides(self, overrides: dict) -> dict:
        return resolve_overrides(overrides)

    def reset_env(self, key, params):
        hole, start, goal = generate_map(key, params)
        state = FrozenLakeState(hole=hole, start=start, goal=goal, pos=start, time=jnp.int32(0),
                                done=jnp.bool_(False), slip_key=slip_stream(key))
        return self.get_obs(state, params), state

    def apply_direction(self, state, direction, params):
        """The rules for one realised move direction -> (new_state, reward, terminated, info)."""
        pos = move(state.pos, direction, params.size)
        on_goal = pos == state.goal
        in_hole = state.hole.reshape(-1)[pos]
        info = {"action_is_effective": pos != state.pos}
        return state.replace(pos=pos), on_goal.astype(jnp.float32), on_goal | in_hole, info

    def move_key(self, key, state, params):
        """The key of this move's slip: from the episode's seeded stream, or the step's own key."""
        return jax.random.fold_in(state.slip_key, state.time) if params.seeded_slips else key

    def transition(self, key, state, action, params):
        direction = slip_direction(self.move_key(key, state, params), action, params.slip)
        return self.apply_direction(state, direction, params)

    def is_success(self, state, params):
        return state.pos == state.goal

    def action_names(self, params) -> tuple[str, ...]:
        return ACTION_NAMES

    def instructions(self, params) -> str:
        # RAGEN-2 appends the symbol legend in "grid" format only (CoordFrozenLake's prompt has none).
        text = coords.instruction_for_format(ENV_INSTRUCTIONS[params.instruction], params.observation_format,
                                             legend(SYMBOL_SETS[params.symbols]))
        return text + (SURROUNDINGS_NOTE if params.surroundings else "")

    def extra_lines(self, params) -> tuple[tuple[str, ...], ...]:
        if not params.surroundings:
            return ()
        # Index orders as in extra_line_index: the first direction is the most significant digit
        # (itertools.product's order), offsets row-major from (-(n-1), -(n-1)).
        span = range(-(params.size - 1), params.size)
        return (tuple(neighbours_text(k) for k in itertools.product(range(3), repeat=4)),
                tuple(goal_offset_text(dr, dc) for dr in span for dc in span))

    def extra_line_index(self, state, params):
        n = params.size
        # `move` keeps the player in place at the map edge: that is what a wall is.
        cell = move(state.pos, jnp.arange(4), n)
        kind = jnp.where(cell == state.pos, WALL, jnp.where(state.hole.reshape(-1)[cell], NEAR_HOLE, OPEN))
        near = jnp.sum(kind * 3 ** jnp.arange(3, -1, -1))
        row, col = state.pos // n, state.pos % n
        goal = (state.goal // n - row + n - 1) * (2 * n - 1) + (state.goal % n - col + n - 1)
        return jnp.stack([near, goal]).astype(jnp.int32)

    def extra_line_texts(self, state, params) -> list[str]:
        return surroundings_texts(state)

    def observation_format(self, params) -> str:
        return params.observation_format

    def coordinate_labels(self, params) -> tuple[str, ...]:
        return COORD_LABELS if params.observation_format != "grid" else ()

    def coordinate_budget(self, params) -> tuple[int, int]:
        # Lines: Start, Goal, one of the three player lines, Holes. Cells: start, goal, player and
        # at most every other cell a hole.
        n2 = params.size * params.size
        return 4, 3 + (n2 - 2)

    def coordinate_masks(self, state, params):
        """bool[6, n, n] for COORD_LABELS; the player's hole or goal is also listed as hole / goal."""
        n = state.hole.shape[-1]
        cells = jnp.arange(n * n).reshape(n, n)
        player = cells == state.pos
        on_goal = state.pos == state.goal
        in_hole = state.hole.reshape(-1)[state.pos]
        return jnp.stack([
            cells == state.start,
            cells == state.goal,
            player & ~on_goal & ~in_hole,
            player & on_goal,
            player & in_hole,
            state.hole,
        ])

    def coordinate_entities(self, state, params):
        """Host side, as the reference's collect_entity_coordinates does from its desc letters."""
        desc = np.array([list(r) for r in rows_from_state(state)])
        n = desc.shape[0]
        pos = int(state.pos)
        player = (pos // n, pos % n)
        tile = desc[player]
        out = {"Start": coords.cells_of(desc == "S"), "Goal": coords.cells_of(desc == "G"),
               "Holes": coords.cells_of(desc == "H")}
        key = "Player on goal" if tile == "G" else "Player in hole" if tile == "H" else "Player"
        out[key] = [player]
        return [(label, out.get(label, [])) for label in COORD_LABELS]

    def symbols(self, params) -> tuple[str, ...]:
        return SYMBOL_SETS[params.symbols]

    def render_grid(self, state, params):
        n = state.hole.shape[-1]
        cells = jnp.arange(n * n).reshape(n, n)
        grid = jnp.where(state.hole, HOLE, FROZEN)  # the start cell renders as frozen
        grid = jnp.where(cells == state.goal, GOAL, grid)
        player = jnp.where(state.hole.reshape(-1)[state.pos], PLAYER_IN_HOLE, PLAYER)
        player = jnp.where(state.pos == state.goal, PLAYER_ON_GOAL, player)
        return jnp.where(cells == state.pos, player, grid).astype(jnp.int32)

    def solve(self, state, params):
        """Optimal policy for the slippery dynamics by finite-horizon value iteration (jittable).

        The planning state is (cell, actions left), because the episode is cut after
        `max_steps_in_episode` actions. Returns `policy` int32[max_steps + 1, size * size]
        (policy[k, cell] = best action with k actions left; row 0 is unused and 0) and the
        probability (float32) of reaching the goal from the start with the full budget.
        """
        n2 = params.size * params.size
        q_of, at_goal, terminal = _planning_model(state, params)

        def backup(value, _):
            q = q_of(value)
            value = jnp.where(terminal, at_goal, jnp.max(q, axis=1))
            return value, jnp.argmax(q, axis=1).astype(jnp.int32)

        value, policy = jax.lax.scan(backup, at_goal, None, length=params.max_steps_in_episode)
        policy = jnp.concatenate([jnp.zeros((1, n2), jnp.int32), policy], axis=0)
        return policy, value[state.start]

    def policy_success(self, state, action_probs, params):
        """Exact probability that a given policy reaches the goal from the start (jittable): policy
        evaluation over (cell, actions left), the same model `solve` maximises over.

        `action_probs` float[max_steps + 1, size * size, 4]: row k is the action distribution with k
        actions left (row 0 unused), e.g. `jax.nn.one_hot(policy, 4)` for `solve`'s table, or a
        table read off what a policy can see (scripts/frozen_lake_ceilings.py).
        """
        q_of, at_goal, terminal = _planning_model(state, params)

        def backup(value, pi):  # pi [cell, action]: the policy with one more action left
            return jnp.where(terminal, at_goal, jnp.sum(pi * q_of(value), axis=1)), None

        value, _ = jax.lax.scan(backup, at_goal, action_probs[1:])
        return value[state.start]
