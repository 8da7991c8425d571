"""Jittable breadth-first Sokoban solver (shortest action sequence), the reference's
get_shortest_action_path re-expressed as dense frontier expansion.

A state is (player cell, box cells) over the room's INTERIOR cells (the border is always wall,
so it never holds the player or a box): I = (H-2)*(W-2) cells, I**(N+1) states, e.g. 256 for 6x6
with one box and 46,656 for 8x8 with two. The successor of every state under every action is
computed once (a vectorised step over all states); each BFS layer is then four scatter-mins into a
dense parent table. Scatter-MIN of (predecessor * 4 + action) makes the chosen parent, hence the
returned path, deterministic on every backend (a plain scatter-set with duplicate indices is not).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from envs_jax.sokoban.types import ACTION_DELTAS


class Solution(NamedTuple):
    actions: jax.Array   # int32[max_len], action indices, -1 after `length`
    length: jax.Array    # int32 number of actions (0 if already solved or unsolvable)
    solvable: jax.Array  # bool: a solution of at most max_len actions exists


def solve(walls: jax.Array, targets: jax.Array, boxes: jax.Array, player: jax.Array, max_len: int = 100) -> Solution:
    """Shortest action sequence that puts every box on a target (jittable, vmappable).

    walls/targets: bool[H, W] with a wall border; boxes: int32[N] and player: int32 flat cells.
    """
    h, w = walls.shape
    ih, iw = h - 2, w - 2
    n_in = ih * iw
    n_box = boxes.shape[0]
    n_states = n_in ** (n_box + 1)
    big = jnp.int32(jnp.iinfo(jnp.int32).max)
    iwalls = walls[1:-1, 1:-1].reshape(-1)
    itargets = targets[1:-1, 1:-1].reshape(-1)
    place = [n_in ** (n_box - 1 - i) for i in range(n_box)]

    def to_inner(f):
        return (f // w - 1) * iw + (f % w - 1)

    def encode(p, bx):
        s = p * n_in ** n_box
        for i in range(n_box):
            s = s + bx[..., i] * place[i]
        return s.astype(jnp.int32)

    states = jnp.arange(n_states, dtype=jnp.int32)
    p = states // n_in ** n_box
    bx = jnp.stack([(states // place[i]) % n_in for i in range(n_box)], axis=-1)  # [S, N]
    r, c = p // iw, p % iw

    def free_of_walls(rr, cc):
        inside = (rr >= 0) & (rr < ih) & (cc >= 0) & (cc < iw)
        idx = jnp.clip(rr, 0, ih - 1) * iw + jnp.clip(cc, 0, iw - 1)
        return idx, inside & ~iwalls[idx]

    succ = []
    for dr, dc in ACTION_DELTAS:
        nxt, nxt_ok = free_of_walls(r + dr, c + dc)
        nxt2, nxt2_ok = free_of_walls(r + 2 * dr, c + 2 * dc)
        box_here = bx == nxt[:, None]
        has_box = jnp.any(box_here, axis=1)
        can_push = nxt2_ok & ~jnp.any(bx == nxt2[:, None], axis=1)
        move = nxt_ok & (~has_box | can_push)
        new_bx = jnp.where(box_here & move[:, None], nxt2[:, None], bx)
        succ.append(encode(jnp.where(move, nxt, p), new_bx))
    is_goal = jnp.all(itargets[bx], axis=1)

    s0 = encode(to_inner(player), to_inner(boxes))
    visited = jnp.zeros(n_states, bool).at[s0].set(True)
    parent = jnp.full(n_states, big)

    def cond(c):
        depth, _, frontier, _, found, _ = c
        return ~found & (depth < max_len) & jnp.any(frontier)

    def body(c):
        depth, visited, frontier, parent, _, _ = c
        cand = jnp.full(n_states, big)
        for a in range(4):
            cand = cand.at[succ[a]].min(jnp.where(frontier, states * 4 + a, big))
        new = (cand < big) & ~visited
        hit = new & is_goal
        return (depth + 1, visited | new, new, jnp.where(new, cand, parent), jnp.any(hit),
                jnp.argmax(hit).astype(jnp.int32))

    init = (jnp.int32(0), visited, visited, parent, is_goal[s0], s0)
    depth, _, _, parent, found, goal = jax.lax.while_loop(cond, body, init)
    length = jnp.where(found, depth, 0)

    def back(s, _):
        code = parent[s]
        return jnp.where(code < big, code // 4, s), jnp.where(code < big, code % 4, -1)

    _, rev = jax.lax.scan(back, goal, None, length=max_len)  # rev[i] = action i steps before the goal
    j = jnp.arange(max_len)
    actions = jnp.where(j < length, rev[jnp.clip(length - 1 - j, 0, max_len - 1)], -1).astype(jnp.int32)
    return Solution(actions, length.astype(jnp.int32), found)
