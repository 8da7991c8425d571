"""In-graph rendering equals the real Qwen2.5 tokenizer on the host text, for every env and variant.

Truth: `tokenizer.encode(render_text(...), add_special_tokens=False)`. States: random GRIDS drawn
from each env's symbol set (every cell any symbol its table covers, plus rows built from one or two
symbols to get long runs such as `______`, which merge into multi-character tokens), so the row
tables are checked on far more rows than the envs' own generators would show. Real env states are
checked in test_text_env.py.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import spaces

import envs_jax
from envs_jax import coords
from envs_jax.base import AgentEnv
from ragen_jax.text import render
from ragen_jax.text.conversation import PromptConfig, format_cents, reward_cents
from ragen_jax.text.text_env import TextEnv, default_cell_symbols, reward_cents_jax

ENVS = ("Bandit", "BanditTest", "BanditPairs", "BanditPairsTest", "FrozenLake", "Sokoban", "LargerSokoban",
        "NewSymbolsSokoban")


@struct.dataclass
class GridState:
    grid: jax.Array


class GridOnly(AgentEnv):
    """A real env's text hooks, with the grid itself as the state, so that any grid renders.

    An AgentEnv, so that every hook it does not forward keeps the declared default."""

    def __init__(self, env, params):
        self.env, self.params = env, params
        self.shape = tuple(env.observation_space(params).shape)
        self._cells = default_cell_symbols(env, params, *self.shape, len(env.symbols(params)))

    def action_names(self, _):
        return self.env.action_names(self.params)

    def instructions(self, _):
        return self.env.instructions(self.params)

    def symbols(self, _):
        return self.env.symbols(self.params)

    def observation_space(self, _):
        return self.env.observation_space(self.params)

    def cell_symbol_sets(self, _):
        return self._cells

    def render_grid(self, state, _):
        return state.grid

    def render_text(self, state, _):  # the contract of AgentEnv.render_text
        syms = self.symbols(None)
        return "\n".join("".join(syms[int(c)] for c in row) for row in np.asarray(state.grid))


def random_grids(cells, n, rng):
    """n grids; half the rows use every symbol their cells allow, half a 1-2 symbol palette (drawn with
    replacement). Cell by cell over all n grids at once (numpy): the per-cell Python loop took ~1 CPU s
    per 3,000 Sokoban grids."""
    h, w = len(cells), len(cells[0])
    all_syms = np.asarray(sorted({s for row in cells for cs in row for s in cs}))
    k = len(all_syms)
    picks = rng.integers(0, k, (n, h, 2))
    two = rng.integers(1, 3, (n, h)) == 2
    in_palette = np.zeros((n, h, k), bool)
    np.put_along_axis(in_palette, picks[..., :1], True, axis=-1)
    in_palette |= two[..., None] & (np.arange(k) == picks[..., 1:])
    in_palette |= (rng.random((n, h)) >= 0.5)[..., None]  # no palette: every allowed symbol
    out = np.zeros((n, h, w), np.int32)
    u = rng.random((n, h, w))
    for r in range(h):
        for c in range(w):
            allowed = np.asarray(cells[r][c])
            ok = in_palette[:, r][:, np.searchsorted(all_syms, allowed)]  # [n, |allowed|]
            ok[~ok.any(1)] = True  # the palette misses this cell: any symbol it allows
            rank = np.floor(u[:, r, c] * ok.sum(1)).astype(np.int64)  # uniform among the ok symbols
            out[:, r, c] = allowed[np.argmax(np.cumsum(ok, 1) > rank[:, None], 1)]
    return out


@pytest.fixture(scope="module")
def tok():
    from ragen_jax.text.tokenizer import load_tokenizer

    return load_tokenizer()


def random_args(n, rng, cfg_turns=5, max_left=10):
    turn = rng.integers(1, cfg_turns + 1, n).astype(np.int32)
    left = rng.integers(0, max_left + 1, n).astype(np.int32)
    # Rewards as the rollout sees them: float32 sums of env rewards (float noise included), and
    # arbitrary values on the 0.01 grid with sub-cent noise that must round away.
    steps = rng.integers(0, 6, n)
    summed = np.array([np.float32(-0.1) * np.float32(k) + np.float32(rng.choice([0.0, 1.0, -1.0, 10.0]))
                       for k in steps], np.float32)
    grid_vals = (rng.integers(-9999, 10000, n) / 100 + rng.uniform(-0.004, 0.004, n)).astype(np.float32)
    reward = np.where(rng.random(n) < 0.5, summed, grid_vals).astype(np.float32)
    closed = rng.random(n) < 0.5
    return turn, left, reward, closed


@pytest.mark.parametrize("think", [True, False], ids=["think", "nothink"])
@pytest.mark.parametrize("name", ENVS)
def test_render_ids_equal_tokenizer(tok, name, think):
    env, params = envs_jax.make(name)
    genv = GridOnly(env, params)
    te = TextEnv(genv, params, tok, PromptConfig(think=think, max_actions_per_episode=10))
    rng = np.random.default_rng(zlib.crc32(f"{name}{think}".encode()))
    n = 1500 if think else 500
    grids = random_grids(te.cell_symbols, n, rng)
    turn, left, reward, closed = random_args(n, rng)
    ids, length = jax.jit(jax.vmap(te.render_ids))(GridState(jnp.asarray(grids)), turn, left, reward, closed)
    ids, length = np.asarray(ids), np.asarray(length)
    texts = [te.render_text(GridState(grids[i]), turn[i], left[i], reward[i], closed[i]) for i in range(n)]
    want = render.encode_batch(tok, texts)
    assert ids.shape == (n, te.max_segment_len)
    mismatches = [i for i in range(n) if list(ids[i, :length[i]]) != want[i]]
    assert not mismatches, f"{len(mismatches)} of {n} differ, first text: {texts[mismatches[0]]!r}"
    # Padding past the length is the pad id, and the segment ends in the forced prefix.
    assert np.all(ids[np.arange(te.max_segment_len)[None, :] >= length[:, None]] == 151643)
    k = len(te.forced_prefix_ids)
    assert all(list(ids[i, length[i] - k:length[i]]) == list(te.forced_prefix_ids) for i in range(n))


# ---- coordinate observations (RAGEN-2's grid_coord / coord) ------------------------------------------
@struct.dataclass
class CoordState:
    grid: jax.Array   # int32 [H, W]
    masks: jax.Array  # bool [K, H, W]


class CoordOnly(GridOnly):
    """Text hooks with the grid AND the coordinate masks as the state, so that any block renders.

    The host text is envs_jax.coords.observation_text (whose agreement with RAGEN-2's own code is
    tested in tests/envs_jax/test_coords.py); the truth here is the tokenizer on that text.
    """

    def __init__(self, env, params, fmt, labels, budget, shape=None):
        super().__init__(env, params)
        self.fmt, self.labels, self.budget = fmt, tuple(labels), budget
        if shape is not None:
            self.shape = shape
            self._cells = default_cell_symbols(env, params, *shape, len(env.symbols(params)))

    def observation_space(self, _):
        return spaces.Box(0, 1, self.shape, jnp.int32)

    def observation_format(self, _):
        return self.fmt

    def coordinate_labels(self, _):
        return self.labels

    def coordinate_budget(self, _):
        return self.budget

    def coordinate_masks(self, state, _):
        return state.masks

    def render_text(self, state, _):
        masks = np.asarray(state.masks)
        entities = [(label, coords.cells_of(m)) for label, m in zip(self.labels, masks)]
        grid = super().render_text(state, None) if self.fmt != "coord" else ""
        return coords.observation_text(self.fmt, entities, *self.shape, grid)


def random_masks(k, shape, budget, n, rng, over=False):
    """n mask stacks [k, H, W] within the budget (lines, cells); `over`: just past it (one line or
    one cell too many). Lines may list the same cells (as Targets and Boxes on target do)."""
    max_lines, max_cells = budget
    hw = shape[0] * shape[1]
    out = np.zeros((n, k, hw), bool)
    for i in range(n):
        more_lines = over and k > max_lines and rng.random() < 0.5
        lines = max_lines + 1 if more_lines else int(rng.integers(0, min(k, max_lines) + 1))
        if over and not more_lines:
            lines = max(lines, 1, -(-(max_cells + 1) // hw))
        cats = rng.choice(k, size=lines, replace=False)
        want = max_cells + 1 if over and not more_lines else int(rng.integers(lines, max(lines, max_cells) + 1))
        want = min(want, lines * hw)
        if lines == 0:
            continue
        out[i, cats, rng.integers(0, hw, lines)] = True  # every chosen line non-empty
        while out[i].sum() < want:
            cat = rng.choice(cats)
            free = np.flatnonzero(~out[i, cat])
            if len(free):
                out[i, cat, rng.choice(free)] = True
    return out.reshape((n, k) + shape)


COORD_CASES = {
    # name: (env, format, labels, budget, shape)
    "sokoban-grid_coord": ("Sokoban", "grid_coord",
                           ("Targets", "Boxes", "Boxes on target", "Player", "Player on target"), (5, 12), None),
    "frozenlake-grid_coord": ("FrozenLake", "grid_coord",
                              ("Start", "Goal", "Player", "Player on goal", "Player in hole", "Holes"), (6, 20), None),
    # Two-digit coordinates on a large board; coord-only (no grid, no row tables).
    "frozenlake-coord-12x11": ("FrozenLake", "coord", ("Start", "Goal", "Player in hole", "Holes"), (4, 60), (12, 11)),
}


@pytest.mark.parametrize("case", list(COORD_CASES))
def test_coordinate_blocks_equal_tokenizer(tok, case):
    name, fmt, labels, budget, shape = COORD_CASES[case]
    env, params = envs_jax.make(name)
    cenv = CoordOnly(env, params, fmt, labels, budget, shape)
    te = TextEnv(cenv, params, tok, PromptConfig(max_actions_per_episode=10))
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    n = 1000
    h, w = cenv.shape
    grids = (random_grids(te.cell_symbols, n, rng) if fmt != "coord" else np.zeros((n, h, w), np.int32))
    masks = random_masks(len(labels), (h, w), budget, n, rng)
    turn, left, reward, closed = random_args(n, rng)
    # A block past its budget is flagged (its text would be cut): 50 such mask stacks ride in the same
    # render_ok call as the n within budget (one compiled program, not a second shape run op by op).
    over = random_masks(len(labels), (h, w), budget, 50, rng, over=True)
    states = CoordState(jnp.asarray(grids), jnp.asarray(masks))
    ids, length = jax.jit(jax.vmap(te.render_ids))(states, turn, left, reward, closed)
    ok = np.asarray(jax.jit(jax.vmap(te.render_ok))(
        CoordState(jnp.asarray(np.concatenate([grids, grids[:50]])), jnp.asarray(np.concatenate([masks, over]))),
        jnp.zeros(n + 50)))
    ok, ok_over = ok[:n], ok[n:]
    ids, length = np.asarray(ids), np.asarray(length)
    texts = [te.render_text(CoordState(grids[i], masks[i]), turn[i], left[i], reward[i], closed[i]) for i in range(n)]
    want = render.encode_batch(tok, texts)
    mismatches = [i for i in range(n) if list(ids[i, :length[i]]) != want[i]]
    assert not mismatches, f"{len(mismatches)} of {n} differ, first text: {texts[mismatches[0]]!r}"
    assert bool(np.all(ok)) and length.max() <= te.max_segment_len
    if fmt == "coord":
        assert all("Grid Map" not in t and "Coordinates" not in t for t in texts[:5])
    assert not np.any(ok_over)


def test_row_tables_exhaustive_frozenlake(tok):
    """Every one of FrozenLake's 6^4 row texts: table ids == direct encoding of that row."""
    env, params = envs_jax.make("FrozenLake")
    syms = env.symbols(params)
    cells = [[tuple(range(len(syms)))] * 4 for _ in range(4)]
    table = render.build_grid_table(tok, syms, cells, 151643)
    rows = np.stack(np.meshgrid(*[np.arange(6)] * 4, indexing="ij"), -1).reshape(-1, 4)
    grid = np.zeros((len(rows), 4, 4), np.int32)
    grid[:, 0] = rows
    ids, lengths, ok = jax.jit(jax.vmap(table.rows))(jnp.asarray(grid))  # one program, not op by op
    assert bool(np.all(ok))
    texts = ["".join(syms[c] for c in r) + "\n" for r in rows]
    want = render.encode_batch(tok, texts)
    ids, lengths = np.asarray(ids[:, 0]), np.asarray(lengths[:, 0])
    assert all(list(ids[i, :lengths[i]]) == want[i] for i in range(len(rows)))


def test_uncovered_cell_is_flagged(tok):
    """A Sokoban grid whose border is not wall is outside the tables: render_ok says so."""
    env, params = envs_jax.make("Sokoban")
    te = TextEnv(GridOnly(env, params), params, tok)
    good = random_grids(te.cell_symbols, 1, np.random.default_rng(0))[0]
    bad = good.copy()
    bad[0, 2] = 1  # floor on the border
    ok = jax.jit(jax.vmap(te.render_ok))(GridState(jnp.asarray(np.stack([good, bad, good]))),
                                         jnp.array([0.0, 0.0, 1000.0]))
    assert list(np.asarray(ok)) == [True, False, False]


def test_reward_out_of_range_is_clipped_alike(tok):
    env, params = envs_jax.make("Bandit")
    te = TextEnv(env, params, tok, PromptConfig(reward_min=-1.5, reward_max=2))
    state = env.reset_env(jax.random.PRNGKey(0), params)[1]
    rewards = np.array([-7.0, 2.5, 1.99], np.float32)
    ids, n = jax.jit(jax.vmap(te.render_ids, in_axes=(None, None, None, 0, None)))(state, 2, 0, rewards, True)
    for i, shown in enumerate(["-1.5", "2", "1.99"]):
        text = te.render_text(state, 2, 0, rewards[i], True)
        assert f"Reward:\n{shown}\n\n" in text
        assert list(np.asarray(ids[i, :n[i]])) == tok.encode(text, add_special_tokens=False)
    assert list(np.asarray(jax.jit(jax.vmap(te.reward_in_range))(rewards))) == [False, False, True]


def reference_reward_text(cents: int) -> str:
    """An independent formatting: Python's fixed-point format, zeros and the point stripped."""
    s = f"{cents / 100:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "0") else s


def test_reward_format_grid():
    for c in list(range(-2500, 2501)) + [-10000, 10000, 123456, -99999]:
        assert format_cents(c) == reference_reward_text(c), c
    assert [format_cents(c) for c in (-10, 1090, 0, 100, -5, 5, -100)] == \
           ["-0.1", "10.9", "0", "1", "-0.05", "0.05", "-1"]


def test_reward_cents_host_equals_device():
    """The host rounding (numpy float32) and the device rounding (XLA float32) pick the same cent."""
    rng = np.random.default_rng(1)
    r = np.concatenate([
        rng.uniform(-120, 120, 20000).astype(np.float32),
        (rng.integers(-12000, 12000, 20000) / 100).astype(np.float32),
        (rng.integers(-12000, 12000, 2000) / 100 + 0.005).astype(np.float32),  # half-cent ties
        np.cumsum(np.full(50, -0.1, np.float32)),
        np.array([0.1 + 0.2, -0.30000000000000004, -0.0], np.float32),
    ])
    device = np.asarray(jax.jit(reward_cents_jax)(r))
    assert np.array_equal(reward_cents(r), device)
    assert format_cents(int(reward_cents(np.float32(0.1) * 3 - np.float32(0.6)))) == "-0.3"


def test_concat_equals_list_concatenation():
    """`concat` (plain pieces, scalar pieces and a StackedTable lookup's static widths) equals joining
    the pieces' real ids in Python, the buffer padded after them and truncated at its size."""
    rng = np.random.default_rng(0)
    tables = [render.PieceTable(*render.pad_table([list(rng.integers(1, 99, n)) for n in sizes], 0))
              for sizes in ((0, 3, 1), (2,), (5, 0, 4, 1))]
    stack = render.stack_tables(tables, 0)
    assert list(stack.widths) == [3, 2, 5]
    for case in range(8):
        index = rng.integers(0, 5, 3)
        plain = rng.integers(1, 99, (2, 4))
        plain_len = rng.integers(0, 5, 2)
        one = rng.integers(1, 99, 3)
        pieces = [(plain, plain_len), (one, np.int32(case % 4)), stack.lookup(index)]
        want = [int(x) for ids, n in zip(plain, plain_len) for x in ids[:n]] + [int(x) for x in one[:case % 4]]
        for t, i in zip(tables, np.clip(index, 0, [len(t.lengths) - 1 for t in tables])):
            want += [int(x) for x in t.ids[i, :t.lengths[i]]]
        for total in (len(want), 20, max(len(want) - 2, 0)):
            ids, n = render.concat(pieces, total, -1)
            assert int(n) == len(want)
            assert np.asarray(ids).tolist() == (want + [-1] * total)[:total], (case, total)
