"""In-graph rendering: text pieces -> token ids from host-built tables, concatenated with static shapes.

Why tables work. Qwen's tokenizer first splits special tokens out of the text, then pre-tokenizes
the rest with the regex
    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+
and runs BPE inside each pre-token only. A newline can end a pre-token (`#\\n`, `:\\n`, `\\n`) but
never starts one that goes on into the next line unless the next line starts with whitespace or
another newline. So when every grid row starts with a non-whitespace character, the ids of
"row_1\\nrow_2\\n...row_H\\n" are the ids of each "row_i\\n" concatenated, and the same holds at the
fixed seams chosen by the text layer (after ":\\n" before a row, before "You have", before "Turn",
around special tokens). Digits are single-digit pre-tokens. Hence: tokenize each fixed piece and
each possible grid row once on the host, look rows up by an index computed from the cell symbols,
and scatter the pieces one after the other into a static buffer. The seams are not assumed but
tested: tests/ragen_jax/text/test_render.py compares against `tokenizer.encode` of the host text
over thousands of random states of every environment.

Row tables. A row's table index is a mixed-radix number over the symbols that each of its cells can
hold. Cells that are always the same symbol (Sokoban's wall border) contribute no digit, which keeps
8x8 Sokoban at 7^6 = 117,649 interior rows instead of 7^8. Rows with the same per-cell symbol sets
share one table.

Coordinate blocks (RAGEN-2's `grid_coord` / `coord` observations, `CoordTable`): fixed lead and tail
pieces, a `Label: (` piece per category and two pieces per cell (`r, c), (` and `r, c)\\n`), chosen
in-graph from the env's per-category cell masks.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import unicodedata
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from envs_jax import coords

# A row table bigger than this is a configuration problem (a symbol set too permissive), not
# something to build silently: 2M rows of ~10 ids is 80 MB of constants in every compiled program.
MAX_ROW_TABLE = 2_000_000


def encode_batch(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of many texts, special tokens recognised, no BOS/EOS added."""
    texts = list(texts)
    if not texts:
        return []
    out = []
    # Chunks keep the fast tokenizer's temporary memory small for the 100k-row tables.
    for i in range(0, len(texts), 32768):
        out.extend(tokenizer(texts[i:i + 32768], add_special_tokens=False)["input_ids"])
    return out


# Appended while encoding a piece that ends in whitespace: in the token stream every such piece is
# followed by visible text (a grid row, "Turn", "You have", a label), and GPT-2-style pre-tokenizers
# (SmolLM2, Llama 3) cut a newline run before visible text differently from one that ends the string
# ("\n\nTurn" -> "\n", "\n", "Turn" but "\n\n" alone is one piece). Qwen's pattern cuts both alike.
SEAM_SENTINEL = "X"


def encode_pieces(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of stream pieces as they tokenize when visible text follows them (SEAM_SENTINEL)."""
    texts = list(texts)
    need = [bool(t) and t[-1].isspace() for t in texts]
    if not any(need):
        return encode_batch(tokenizer, texts)
    tail = encode_batch(tokenizer, [SEAM_SENTINEL])[0]
    out = []
    for text, n, ids in zip(texts, need, encode_batch(tokenizer, [t + SEAM_SENTINEL if n else t
                                                                  for t, n in zip(texts, need)])):
        if n:
            if ids[len(ids) - len(tail):] != tail:
                raise ValueError(f"the text piece {text!r} merges with the text after it under this tokenizer; "
                                 "the segment cannot be assembled from separately tokenized pieces")
            ids = ids[:len(ids) - len(tail)]
        out.append(ids)
    return out


def pre_tokenize(tokenizer, text: str) -> list[str] | None:
    """The tokenizer's own pre-tokens of `text` (None when it has a normaliser that changes `text` or no
    pre-tokenizer, i.e. when pieces cannot be read off the raw text)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.pre_tokenizer is None:
        return None
    if backend.normalizer is not None and backend.normalizer.normalize_str(text) != text:
        return None
    return [text[a:b] for _, (a, b) in backend.pre_tokenizer.pre_tokenize_str(text)]


def encode_rows(tokenizer, rows: Sequence[str], pad_id: int, check: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of many newline-terminated rows -> padded (ids [N, L], lengths [N]).

    Runs the tokenizer's own pre-tokenizer over all rows at once, BPE-encodes each DISTINCT
    pre-token once with the tokenizer, and composes rows from them: 8x8 Sokoban's 117k rows are
    ~400k pre-tokens but only ~9k distinct ones, which makes this ~10x faster than encoding every
    row. Valid because BPE never crosses pre-token boundaries; pre-tokens crossing a row seam are
    detected (ValueError), and `check` random rows are compared with direct encoding (each row as
    followed by visible text, see `encode_pieces`).
    """
    rows = list(rows)
    if not rows:
        return np.full((0, 1), pad_id, np.int32), np.zeros((0,), np.int32)
    joined = "".join(rows)
    pieces = None
    if "<|" not in joined and all(r.endswith("\n") for r in rows):
        pieces = pre_tokenize(tokenizer, joined + SEAM_SENTINEL)
    if pieces is None or not pieces or pieces[-1] != SEAM_SENTINEL:
        # Normalisation or special tokens could move text across pieces: take the plain route.
        return pad_table(encode_pieces(tokenizer, rows), pad_id)
    pieces = pieces[:-1]
    index: dict[str, int] = {}
    pidx = np.fromiter((index.setdefault(p, len(index)) for p in pieces), dtype=np.int64, count=len(pieces))
    uniq_ids, uniq_len = pad_table(encode_batch(tokenizer, list(index)), pad_id)
    # Which row each pre-token lies in, from character offsets.
    plen = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    pend = np.cumsum(plen)
    row_end = np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)))
    row_first = np.searchsorted(row_end, pend - plen, side="right")
    if pend[-1] != row_end[-1] or np.any(row_first != np.searchsorted(row_end, pend - 1, side="right")):
        raise ValueError("a pre-token spans two grid rows; rows cannot be tokenized independently")
    # Flatten the pre-tokens' ids in order, then cut them into rows.
    n_tok = uniq_len[pidx]
    mask = np.arange(uniq_ids.shape[1])[None, :] < n_tok[:, None]
    flat = uniq_ids[pidx][mask]
    tok_row = np.repeat(row_first, n_tok)
    lengths = np.bincount(row_first, weights=n_tok, minlength=len(rows)).astype(np.int32)
    starts = np.cumsum(lengths) - lengths
    col = np.arange(flat.shape[0]) - starts[tok_row]
    ids = np.full((len(rows), max(1, int(lengths.max()))), pad_id, dtype=np.int32)
    ids[tok_row, col] = flat
    rng = np.random.default_rng(0)
    sample = sorted({0, len(rows) - 1, *rng.integers(0, len(rows), min(check, len(rows))).tolist()})
    for i, direct in zip(sample, encode_pieces(tokenizer, [rows[i] for i in sample])):
        if list(ids[i, :lengths[i]]) != list(direct):
            raise ValueError(f"row {rows[i]!r} tokenizes differently in isolation; the row table would be wrong")
    return ids, lengths


def pad_table(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Ragged id lists -> (ids int32 [N, L], lengths int32 [N]); L >= 1."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int32, count=len(seqs))
    width = max(1, int(lengths.max(initial=0)))
    ids = np.full((len(seqs), width), pad_id, dtype=np.int32)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    return ids, lengths


@dataclasses.dataclass(frozen=True)
class PieceTable:
    """Token ids of N alternative texts for one slot of a segment."""

    ids: np.ndarray      # int32 [N, L]
    lengths: np.ndarray  # int32 [N]

    @classmethod
    def build(cls, tokenizer, texts: Sequence[str], pad_id: int) -> "PieceTable":
        ids, lengths = pad_table(encode_pieces(tokenizer, texts), pad_id)
        return cls(ids, lengths)

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])

    def lookup(self, index):
        """(ids [L], length) of entry `index` (clipped into range); jittable."""
        index = jnp.clip(jnp.asarray(index, jnp.int32), 0, self.ids.shape[0] - 1)
        return jnp.asarray(self.ids)[index], jnp.asarray(self.lengths)[index]


@dataclasses.dataclass(frozen=True)
class StackedTable:
    """The PieceTables of S slots stacked: `lookup(index int32 [S])` gives every slot's entry at once."""

    ids: np.ndarray      # int32 [sum of sizes, L]
    lengths: np.ndarray  # int32 [sum of sizes]
    offsets: np.ndarray  # int32 [S]: each slot's first row
    sizes: np.ndarray    # int32 [S]

    def lookup(self, index):
        """(ids [S, L], lengths [S], widths [S]) of each slot's entry (indices clipped into range), widths
        being each slot's longest entry (static: `concat` writes no more of a slot); jittable."""
        index = jnp.clip(jnp.asarray(index, jnp.int32), 0, jnp.asarray(self.sizes) - 1)
        rows = jnp.asarray(self.offsets) + index
        return jnp.asarray(self.ids)[rows], jnp.asarray(self.lengths)[rows], self.widths

    @property
    def widths(self) -> np.ndarray:
        return np.maximum.reduceat(self.lengths, self.offsets).astype(np.int32)


def stack_tables(tables: Sequence[PieceTable], pad_id: int) -> StackedTable:
    width = max(t.width for t in tables)
    ids = np.concatenate([np.pad(t.ids, ((0, 0), (0, width - t.width)), constant_values=pad_id) for t in tables])
    sizes = np.array([t.ids.shape[0] for t in tables], np.int32)
    return StackedTable(ids=ids.astype(np.int32), lengths=np.concatenate([t.lengths for t in tables]).astype(np.int32),
                        offsets=(np.cumsum(sizes) - sizes).astype(np.int32), sizes=sizes)


@dataclasses.dataclass(frozen=True)
class GridTable:
    """Per-row token tables of a symbol grid, indexed in-graph from the cell symbols."""

    digit: np.ndarray    # int32 [H, W, S]: position of symbol s in cell (h, w)'s set, -1 impossible
    radix: np.ndarray    # int32 [H, W]: place value of each cell's digit in its row's index
    base: np.ndarray     # int32 [H]: offset of each row's table inside `ids`
    ids: np.ndarray      # int32 [N, L]: token ids of "row text + newline", all tables stacked
    lengths: np.ndarray  # int32 [N]
    row_max: np.ndarray  # int32 [H]: longest entry of each row's table

    @property
    def row_width(self) -> int:
        return int(self.ids.shape[1])

    @property
    def max_len(self) -> int:
        """Largest total token count of a whole grid (static segment budget)."""
        return int(self.row_max.sum())

    def rows(self, grid):
        """int32 grid [H, W] -> (ids [H, L], lengths [H], ok); jittable.

        ok is False when some cell holds a symbol its table does not cover; that row is then
        rendered as the table's first row (wrong text, so the caller can mask or count it).
        """
        grid = jnp.asarray(grid, jnp.int32)
        h, w, s = self.digit.shape
        in_range = (grid >= 0) & (grid < s)
        d = jnp.asarray(self.digit)[jnp.arange(h)[:, None], jnp.arange(w)[None, :], jnp.clip(grid, 0, s - 1)]
        ok = jnp.all(in_range & (d >= 0))
        index = jnp.asarray(self.base) + jnp.sum(jnp.maximum(d, 0) * jnp.asarray(self.radix), axis=1)
        return jnp.asarray(self.ids)[index], jnp.asarray(self.lengths)[index], ok


def build_grid_table(tokenizer, symbols: Sequence[str], cell_sets, pad_id: int) -> GridTable:
    """Enumerate every row each grid line can show and tokenize "row + newline" in batches.

    cell_sets[h][w] is the sorted tuple of symbol indices cell (h, w) can hold.
    """
    h, w, s = len(cell_sets), len(cell_sets[0]), len(symbols)
    digit = np.full((h, w, s), -1, dtype=np.int32)
    radix = np.zeros((h, w), dtype=np.int32)
    base = np.zeros((h,), dtype=np.int32)
    row_size = np.zeros((h,), dtype=np.int64)
    seen: dict[tuple, int] = {}
    texts: list[str] = []
    for r in range(h):
        sets = tuple(tuple(cs) for cs in cell_sets[r])
        size = math.prod(len(cs) for cs in sets)
        for c, cs in enumerate(sets):
            digit[r, c, list(cs)] = np.arange(len(cs), dtype=np.int32)
            radix[r, c] = math.prod(len(x) for x in sets[c + 1:])
        if sets not in seen:
            if len(texts) + size > MAX_ROW_TABLE:
                raise ValueError(
                    f"grid row tables would need {len(texts) + size} rows (limit {MAX_ROW_TABLE}); "
                    "give the text layer narrower per-cell symbol sets (e.g. a fixed wall border)")
            seen[sets] = len(texts)
            # itertools.product varies the last cell fastest: the mixed-radix order of `radix`.
            texts.extend("".join(symbols[i] for i in combo) + "\n" for combo in itertools.product(*sets))
        base[r], row_size[r] = seen[sets], size
    ids, lengths = encode_rows(tokenizer, texts, pad_id)
    row_max = np.array([lengths[base[r]:base[r] + row_size[r]].max() for r in range(h)], dtype=np.int32)
    return GridTable(digit=digit, radix=radix, base=base, ids=ids, lengths=lengths, row_max=row_max)


@dataclasses.dataclass(frozen=True)
class CoordTable:
    """Token tables of a coordinate block (envs_jax/coords.py), assembled in-graph from cell masks.

    The block is `lead` (the "Coordinates: \\n" header, if any, and the board line), then per
    non-empty category `Label: (` followed by its cells, each `r, c), (` or, for the last one,
    `r, c)\\n`, then `tail` ("Grid Map: \\n" before the grid, or nothing). Every piece boundary is
    one where Qwen's pre-tokenizer splits anyway (after `(` and a newline, before a digit), so
    concatenating the pieces' ids gives the ids of the whole text.
    """

    lead_ids: np.ndarray   # int32 [L0]
    tail_ids: np.ndarray   # int32 [Lt] (may be empty)
    label_ids: np.ndarray  # int32 [K, Lh]
    label_len: np.ndarray  # int32 [K]
    cell_ids: np.ndarray   # int32 [2, H*W, Lc]: [0] "r, c), (" (more follow), [1] "r, c)\\n" (last)
    cell_len: np.ndarray   # int32 [2, H*W]
    max_lines: int
    max_cells: int

    @property
    def max_len(self) -> int:
        """Token budget of the whole block (static)."""
        return int(len(self.lead_ids) + len(self.tail_ids) + self.max_lines * self.label_len.max(initial=0)
                   + self.max_cells * self.cell_len.max(initial=0))

    def pieces(self, masks):
        """bool [K, H, W] category masks -> (pieces for `concat`, ok); jittable.

        ok is False when the state lists more lines or cells than the budget (the text is then cut).
        """
        k = self.label_ids.shape[0]
        m = jnp.asarray(masks, bool).reshape(k, -1)
        # The last listed cell of a line ends it: no member after it in row-major order.
        after = jnp.cumsum(m[:, ::-1], axis=1)[:, ::-1] - m
        last = (m & (after == 0)).astype(jnp.int32)
        cell_ids = jnp.asarray(self.cell_ids)
        cell_len = jnp.asarray(self.cell_len)
        cells = jnp.arange(m.shape[1])
        ids = cell_ids[last, cells[None, :]]                      # [K, HW, Lc]
        lens = jnp.where(m, cell_len[last, cells[None, :]], 0)    # [K, HW]
        present = jnp.any(m, axis=1)
        width = max(cell_ids.shape[-1], self.label_ids.shape[-1])
        pad = lambda x: jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])  # noqa: E731
        rows = jnp.concatenate([pad(jnp.asarray(self.label_ids))[:, None], pad(ids)], axis=1)
        row_len = jnp.concatenate([jnp.where(present, jnp.asarray(self.label_len), 0)[:, None], lens], axis=1)
        ok = (jnp.sum(present) <= self.max_lines) & (jnp.sum(m) <= self.max_cells)
        pieces = [(jnp.asarray(self.lead_ids), len(self.lead_ids)),
                  (rows.reshape(-1, width), row_len.reshape(-1)),
                  (jnp.asarray(self.tail_ids), len(self.tail_ids))]
        return pieces, ok

    @property
    def tables(self) -> tuple[np.ndarray, ...]:
        """Every id array (for vocabulary building)."""
        return (self.lead_ids, self.tail_ids, self.label_ids, self.cell_ids)


def build_coord_table(tokenizer, fmt: str, labels: Sequence[str], height: int, width: int,
                      max_lines: int, max_cells: int, pad_id: int) -> CoordTable:
    """Tokenize the fixed pieces and every cell's two forms (see CoordTable)."""
    lead = (coords.COORDINATES_HEADER if fmt == "grid_coord" else "") + coords.board_line(height, width) + "\n"
    tail = coords.GRID_HEADER if fmt == "grid_coord" else ""
    cells = [coords.cell_text(r, c) for r in range(height) for c in range(width)]
    enc = lambda text: np.asarray(encode_pieces(tokenizer, [text])[0] if text else [], np.int32)  # noqa: E731
    label_ids, label_len = pad_table(encode_pieces(tokenizer, [f"{label}: (" for label in labels]), pad_id)
    more_ids, more_len = pad_table(encode_pieces(tokenizer, [c + "), (" for c in cells]), pad_id)
    last_ids, last_len = pad_table(encode_pieces(tokenizer, [c + ")\n" for c in cells]), pad_id)
    lc = max(more_ids.shape[1], last_ids.shape[1])
    cell_ids = np.full((2, len(cells), lc), pad_id, np.int32)
    cell_ids[0, :, :more_ids.shape[1]], cell_ids[1, :, :last_ids.shape[1]] = more_ids, last_ids
    return CoordTable(lead_ids=enc(lead), tail_ids=enc(tail), label_ids=label_ids, label_len=label_len,
                      cell_ids=cell_ids, cell_len=np.stack([more_len, last_len]),
                      max_lines=int(max_lines), max_cells=int(max_cells))


def check_cell_sets(cell_sets, height: int, width: int, num_symbols: int):
    """Validate per-cell symbol sets against the grid shape; returns them as sorted tuples."""
    try:
        rows = [list(r) for r in cell_sets]
    except TypeError:
        raise ValueError("cell symbol sets must be a [H][W] nested sequence of symbol-index sequences") from None
    if len(rows) != height or any(len(r) != width for r in rows):
        raise ValueError(f"cell symbol sets must have shape [{height}][{width}] to match the rendered grid")
    out = []
    for r in rows:
        line = []
        for cs in r:
            cs = tuple(sorted({int(i) for i in cs}))
            if not cs or cs[0] < 0 or cs[-1] >= num_symbols:
                raise ValueError(f"each cell's symbol set must be non-empty indices in [0, {num_symbols}), got {cs}")
            line.append(cs)
        out.append(tuple(line))
    return tuple(out)


def concat(pieces, total_len: int, pad_id: int):
    """Concatenate ragged pieces into a static buffer; jittable and vmappable.

    pieces: sequence of (ids [n, L] or [L], lengths [n] or scalar) or (ids [n, L], lengths [n], widths
    [n]: static bounds on the lengths, e.g. a `StackedTable`'s); entries past their length are dropped.
    Returns (ids int32 [total_len], length int32). Pieces are placed by running offsets and scattered
    with mode="drop", so padding never overwrites real ids.
    """
    out = jnp.full((total_len,), pad_id, dtype=jnp.int32)
    offset = jnp.zeros((), jnp.int32)
    for piece in pieces:
        ids, lengths = jnp.asarray(piece[0], jnp.int32), jnp.asarray(piece[1], jnp.int32)
        if ids.ndim == 1:
            ids, lengths = ids[None], lengths[None]
        n, width = ids.shape
        widths = np.asarray(piece[2]) if len(piece) > 2 else np.full((n,), width)
        # Only each entry's first widths[e] ids can be real: scatter those alone (a static ragged list).
        entry = np.repeat(np.arange(n), widths)
        j = np.concatenate([np.arange(w) for w in widths]).astype(np.int32)
        starts = offset + jnp.cumsum(lengths) - lengths
        pos = jnp.where(j < lengths[entry], starts[entry] + j, total_len)  # out of bounds -> dropped
        out = out.at[pos].set(ids[entry, j], mode="drop")
        offset = offset + jnp.sum(lengths)
    return out, offset
