"""On-device Sokoban room generation: the reference's generate_room, re-expressed for jit.

The reference (RAGEN ragen/env/sokoban/utils.py, from gym-sokoban) does, on the host:
  1. topology: a random walk stamping 3x3 floor patterns;
  2. player and box targets on random floor cells, boxes start on their targets;
  3. reverse play: a depth-first search over "pull" moves keeping the state that maximises
     box_swaps x (sum of Manhattan box displacements), where only states with every target
     empty (no box on a target, player not on one) score; retried on a new topology if 0;
  4. player jitter: up to 3 random non-pushing moves.
A recursive search with a visited set cannot be jitted; here step 3 is K random pull sequences of
D moves run in parallel (vmap of a scan), each remembering its best-scoring prefix, and the best
over the K is kept. Every pull is the exact reverse of a push, so the room is solvable by
construction. Retries are a bounded `lax.while_loop`; if every try scores 0 a fixed, solvable room
is returned. All random choices are integer draws (no float argmax over Gumbel noise), so the same
key gives the same room on every backend.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.sokoban.types import SokobanConfig, SokobanParams, flat_deltas

# The reference's five 3x3 floor patterns, in its order.
TOPOLOGY_MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    dtype=bool,
)
# The reference's walk directions, in its order (row, col).
WALK_DIRECTIONS = np.array([(1, 0), (0, 1), (-1, 0), (0, -1)], dtype=np.int32)


class Room(NamedTuple):
    walls: jax.Array    # bool[H, W]
    targets: jax.Array  # bool[H, W]
    boxes: jax.Array    # int32[N] flat cells; box i was pulled away from target i
    player: jax.Array   # int32 flat cell


# Randomness: each try draws ONE block of uint32 words with jax.random.bits and every stage derives
# its choices from its slice with integer arithmetic. Many small jax.random calls inside scan bodies
# made XLA compile for ~15 s and run ~10x slower; integer derivation also keeps rooms bit-identical
# on every backend (no float argmax over Gumbel noise).


def bits_below(word: jax.Array, n) -> jax.Array:
    """Integer in [0, n) from a uint32 word (multiply-shift on the top 16 bits; n < 2**16)."""
    return (((word >> 16) * jnp.asarray(n, jnp.uint32)) >> 16).astype(jnp.int32)


def bits_uniform(word: jax.Array) -> jax.Array:
    """Float32 in [0, 1) from a uint32 word (exact: 24 bits scaled by 2**-24)."""
    return (word >> 8).astype(jnp.float32) * jnp.float32(2.0 ** -24)


def choice_masked(word: jax.Array, mask: jax.Array) -> jax.Array:
    """Uniform index among the True entries of a 1-D mask (0 if none)."""
    n = jnp.sum(mask, dtype=jnp.int32)
    k = bits_below(word, jnp.maximum(n, 1))
    return jnp.argmax(jnp.cumsum(mask, dtype=jnp.int32) > k).astype(jnp.int32)


def topology_words(num_steps: int) -> int:
    return 3 * (num_steps + 1)


def room_topology(words: jax.Array, dim_room: tuple[int, int], num_steps: int, p_change) -> jax.Array:
    """bool[H, W] floor mask: the reference's random walk of 3x3 stamps, border forced to wall."""
    h, w = dim_room
    words = words.reshape(num_steps + 1, 3)
    direction = bits_below(words[0, 0], 4)
    # Python randint(1, dim - 1) is inclusive of both ends.
    pos = jnp.stack([1 + bits_below(words[0, 1], h - 1), 1 + bits_below(words[0, 2], w - 1)])
    masks = jnp.asarray(TOPOLOGY_MASKS)
    dirs = jnp.asarray(WALK_DIRECTIONS)
    hi = jnp.array([h - 2, w - 2], jnp.int32)

    def step(carry, word):
        level, pos, direction = carry
        change = bits_uniform(word[0]) < p_change
        direction = jnp.where(change, bits_below(word[1], 4), direction)
        pos = jnp.clip(pos + dirs[direction], 1, hi)
        mask = masks[bits_below(word[2], 5)]
        corner = (pos[0] - 1, pos[1] - 1)
        patch = jax.lax.dynamic_slice(level, corner, (3, 3))
        level = jax.lax.dynamic_update_slice(level, patch | mask, corner)
        return (level, pos, direction), None

    level0 = jnp.zeros((h, w), bool)
    (level, _, _), _ = jax.lax.scan(step, (level0, pos, direction), words[1:])
    border = np.zeros((h, w), bool)
    border[0, :] = border[-1, :] = border[:, 0] = border[:, -1] = True
    return level & ~jnp.asarray(border)


def place_player_and_targets(words: jax.Array, floor: jax.Array, num_boxes: int):
    """Player then each target on a distinct random floor cell -> (player, targets[N], ok).

    words: uint32[num_boxes + 1]."""
    floor_f = floor.reshape(-1)
    player = choice_masked(words[0], floor_f)
    free = floor_f.at[player].set(False)
    targets = []
    for i in range(num_boxes):
        t = choice_masked(words[i + 1], free)
        targets.append(t)
        free = free.at[t].set(False)
    # The reference refuses rooms with <= num_boxes + 1 floor cells.
    ok = jnp.sum(floor_f, dtype=jnp.int32) >= num_boxes + 2
    return player, jnp.stack(targets), ok


class _Best(NamedTuple):
    score: jax.Array   # int32 box_swaps * displacement (0 when some target is covered)
    disp: jax.Array    # int32 sum of Manhattan displacements
    player: jax.Array
    boxes: jax.Array


def reverse_words(num_candidates: int, depth: int) -> int:
    return -(-num_candidates * depth // 16)  # 2 bits per move: 16 moves per uint32 word


def reverse_play(words, walls_f, targets, player, width: int, num_candidates: int, depth: int) -> _Best:
    """K random pull sequences of D moves; the best-scoring state seen by any of them.

    A reverse move: the player steps to a free neighbour (floor or empty target); if a box sits
    on the opposite side it is pulled into the cell the player left (the reference's
    reverse_move, which always pulls when it can). box_swaps counts how often the pulled box
    differs from the previously pulled one (so it is 1 after any pull, for a single box).
    """
    deltas = flat_deltas(width)
    n_cells = walls_f.shape[0]
    tmask = jnp.zeros(n_cells, bool).at[targets].set(True)
    t_r, t_c = targets // width, targets % width

    def score_of(p, boxes, swaps):
        disp = jnp.sum(jnp.abs(boxes // width - t_r) + jnp.abs(boxes % width - t_c), dtype=jnp.int32)
        all_targets_empty = ~jnp.any(tmask[boxes]) & ~tmask[p]
        return jnp.where(all_targets_empty, swaps * disp, 0), disp

    def candidate(moves):
        def step(carry, a):
            p, boxes, swaps, last, best = carry
            d = deltas[a]
            nxt = p + d
            free = ~walls_f[nxt] & ~jnp.any(boxes == nxt)
            pulled = (boxes == p - d) & free
            any_pulled = jnp.any(pulled)
            idx = jnp.argmax(pulled).astype(jnp.int32)
            boxes = jnp.where(pulled, p, boxes)
            p = jnp.where(free, nxt, p)
            swaps = swaps + (any_pulled & (idx != last)).astype(jnp.int32)
            last = jnp.where(any_pulled, idx, last)
            s, disp = score_of(p, boxes, swaps)
            better = s > best.score  # first strictly better state wins, as in the reference
            best = jax.tree.map(lambda new, old: jnp.where(better, new, old), _Best(s, disp, p, boxes), best)
            return (p, boxes, swaps, last, best), None

        best0 = _Best(jnp.int32(0), jnp.int32(0), player, targets)
        carry0 = (player, targets, jnp.int32(0), jnp.int32(-1), best0)
        (_, _, _, _, best), _ = jax.lax.scan(step, carry0, moves)
        return best

    moves = (words[:, None] >> (2 * jnp.arange(16, dtype=jnp.uint32))[None, :]) & 3
    moves = moves.reshape(-1)[: num_candidates * depth].reshape(num_candidates, depth).astype(jnp.int32)
    bests = jax.vmap(candidate)(moves)
    i = jnp.argmax(bests.score)
    return jax.tree.map(lambda x: x[i], bests)


def fallback_room(dim_room: tuple[int, int], num_boxes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A fixed solvable room: open interior, targets on row 1, boxes right below, player on row 3.

    Push i: walk along row 3 to column 1+i and push Up. Needs height >= 5 and num_boxes <= width-2
    (checked by SokobanConfig.validate).
    """
    h, w = dim_room
    floor = np.zeros((h, w), bool)
    floor[1:-1, 1:-1] = True
    targets = np.array([1 * w + 1 + i for i in range(num_boxes)], np.int32)
    boxes = targets + w
    player = 3 * w + 1
    return floor, targets, boxes, player


def jitter_player(words, walls_f, boxes, player, disp, width: int, max_steps: int, params: SokobanParams):
    """The reference's add_random_player_movement: up to `max_steps` non-pushing random moves.

    With probability move_prob (0.8 if the displacement score is 1, else 0.5) the player walks to
    random free neighbours it has not visited, continuing with probability 0.5 after each move. It
    never moves a box, so the set of reachable states (hence solvability) is unchanged.
    """
    if max_steps == 0:
        return player
    deltas = flat_deltas(width)
    words = words.reshape(max_steps + 1, 2)
    move_prob = jnp.where(disp == 1, params.jitter_move_prob_close, params.jitter_move_prob)
    active = ~(bits_uniform(words[0, 0]) > move_prob)
    visited = jnp.zeros(walls_f.shape[0], bool).at[player].set(True)

    def step(carry, word):
        player, visited, active = carry
        nxt = player + deltas
        ok = ~walls_f[nxt] & ~jnp.any(nxt[:, None] == boxes[None, :], axis=1) & ~visited[nxt]
        move = active & jnp.any(ok)
        player = jnp.where(move, nxt[choice_masked(word[0], ok)], player)
        visited = visited.at[player].set(True)
        active = move & ~(bits_uniform(word[1]) > params.jitter_continue_prob)
        return (player, visited, active), None

    (player, _, _), _ = jax.lax.scan(step, (player, visited, active), words[1:])
    return player


def generate_room(key: jax.Array, params: SokobanParams, cfg: SokobanConfig) -> Room:
    """One room (jittable, static shapes). vmap it for a batch."""
    h, w = cfg.dim_room
    n = cfg.num_boxes
    n_topo = topology_words(cfg.num_gen_steps)
    n_rev = reverse_words(cfg.num_candidates, cfg.search_depth)
    per_try = n_topo + (n + 1) + n_rev
    n_jitter = 2 * (cfg.jitter_max_steps + 1)
    # Two threefry call sites in all (each costs ~0.4 s of XLA compile time); the words of try i
    # are drawn inside the loop so that unused tries cost nothing (gen_tries is a cheap safety cap).
    k_jitter, k_tries = jax.random.split(key)
    jitter_words = jax.random.bits(k_jitter, (n_jitter,), jnp.uint32)

    def attempt(ws):
        floor = room_topology(ws[:n_topo], cfg.dim_room, cfg.num_gen_steps, params.p_change_direction)
        player, targets, ok = place_player_and_targets(ws[n_topo:n_topo + n + 1], floor, n)
        walls_f = ~floor.reshape(-1)
        best = reverse_play(ws[n_topo + n + 1:], walls_f, targets, player, w, cfg.num_candidates, cfg.search_depth)
        score = jnp.where(ok, best.score, 0)
        return (floor, targets, best.player, best.boxes, best.disp, score)

    dummy = (jnp.zeros((h, w), bool), jnp.zeros(n, jnp.int32), jnp.int32(0), jnp.zeros(n, jnp.int32),
             jnp.int32(0), jnp.int32(0))

    def cond(c):
        i, res = c
        return (res[-1] <= 0) & (i < cfg.gen_tries)

    def body(c):
        i, _ = c
        return i + 1, attempt(jax.random.bits(jax.random.fold_in(k_tries, i), (per_try,), jnp.uint32))

    _, (floor, targets, player, boxes, disp, score) = jax.lax.while_loop(cond, body, (jnp.int32(0), dummy))

    fb_floor, fb_targets, fb_boxes, fb_player = fallback_room(cfg.dim_room, n)
    use_fb = score <= 0
    floor = jnp.where(use_fb, jnp.asarray(fb_floor), floor)
    targets = jnp.where(use_fb, jnp.asarray(fb_targets), targets)
    boxes = jnp.where(use_fb, jnp.asarray(fb_boxes), boxes)
    player = jnp.where(use_fb, jnp.int32(fb_player), player)
    disp = jnp.where(use_fb, jnp.int32(n), disp)

    walls_f = ~floor.reshape(-1)
    player = jitter_player(jitter_words, walls_f, boxes, player, disp, w, cfg.jitter_max_steps, params)
    target_grid = jnp.zeros(h * w, bool).at[targets].set(True).reshape(h, w)
    return Room(walls=~floor, targets=target_grid, boxes=boxes.astype(jnp.int32), player=player.astype(jnp.int32))
