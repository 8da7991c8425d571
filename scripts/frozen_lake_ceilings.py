"""How well can a FrozenLake policy do that sees only part of the state? (issue 15)

    python scripts/frozen_lake_ceilings.py [--train-maps 6000] [--test-maps 4000] [--out ceilings.json]

For each view of the state (what the surroundings lines of `env.surroundings=True` say, with or
without the actions left), the best deterministic policy on that view is approximated by the
value-iteration teacher's most common action per view key, counted over every non-terminal
(map, cell, actions left) of the training maps; its success is then computed exactly
(`FrozenLake.policy_success`, policy evaluation under the slips) on other maps, next to the teacher
(the whole map) and the uniform policy. A key never seen in training gets the teacher's most common
action overall; the script prints how often that happened on the test maps' non-terminal states. Reference slip (2/3),
4x4 maps, 10 actions.

The numbers say which parts of the observation a policy must read to approach the teacher: a warm
start whose greedy success sits between the one-feature rows has learned only part of the
conjunction. They are in docs/experiments/demo.md ("What a policy must read").
"""

from __future__ import annotations

import argparse
import json
import sys


import jax
import jax.numpy as jnp
import numpy as np

import envs_jax

ENV, PARAMS = envs_jax.make("FrozenLake")
N = PARAMS.size
N2 = N * N
K = PARAMS.max_steps_in_episode
SPAN = 2 * N - 1  # goal offsets per axis, -(N-1) .. N-1


def _direction(goal):
    """Goal offset index -> the signs of its (rows, cols) from the player, as one index in [0, 9)."""
    rows, cols = goal // SPAN - (N - 1), goal % SPAN - (N - 1)
    return (np.sign(rows) + 1) * 3 + np.sign(cols) + 1


# View name -> key of (neighbour code [0, 81), goal offset index [0, SPAN^2), actions left [1, K]);
# keys are ints (each factor below its own radix).
VIEWS = {
    "nothing": lambda near, goal, k: np.zeros_like(near),
    "neighbours": lambda near, goal, k: near,
    "goal offset": lambda near, goal, k: goal,
    "neighbours + goal direction": lambda near, goal, k: near * 9 + _direction(goal),
    "neighbours + goal offset": lambda near, goal, k: near * SPAN**2 + goal,
    "neighbours + goal offset + actions left": lambda near, goal, k: (near * SPAN**2 + goal) * (K + 1) + k,
}


@jax.jit
def _maps(key):
    return jax.vmap(ENV.reset_env, in_axes=(0, None))(key, PARAMS)[1]


def maps(seed: int, count: int):
    return _maps(jax.random.split(jax.random.PRNGKey(seed), count))


@jax.jit
def _features(state):
    """int32[maps, cell, 2]: the surroundings lines' indices (neighbours, goal offset) at every cell."""
    def at(s, cell):
        return ENV.extra_line_index(s.replace(pos=cell), PARAMS)
    return jax.vmap(lambda s: jax.vmap(lambda c: at(s, c))(jnp.arange(N2)))(state)


_solve = jax.jit(jax.vmap(ENV.solve, in_axes=(0, None)), static_argnums=1)
_success = jax.jit(jax.vmap(ENV.policy_success, in_axes=(0, 0, None)), static_argnums=2)


def grids(state):
    """(teacher table [M, K+1, N2], neighbours [M, 1, N2], goal offset [M, 1, N2], actions left
    [1, K+1, 1], non-terminal mask [M, 1, N2]) as numpy."""
    table = np.asarray(_solve(state, PARAMS)[0])
    f = np.asarray(_features(state))
    live = ~(np.asarray(state.hole).reshape(-1, N2) | (np.arange(N2)[None] == np.asarray(state.goal)[:, None]))
    return table, f[:, None, :, 0], f[:, None, :, 1], np.arange(K + 1)[None, :, None], live[:, None, :]


def ceilings(train_maps: int = 6000, test_maps: int = 4000, seed: int = 0) -> dict:
    train, test = maps(seed, train_maps), maps(seed + 1, test_maps)
    t_table, t_near, t_goal, ks, t_live = grids(train)
    e_table, e_near, e_goal, _, e_live = grids(test)
    # Every non-terminal (map, cell, actions left) of the training maps is counted.
    rows = np.broadcast_to(t_live & (ks >= 1), t_table.shape)
    acts = t_table[rows]
    fallback = int(np.bincount(acts, minlength=4).argmax())
    e_rows = np.broadcast_to(e_live & (ks >= 1), e_table.shape)
    out = {"train_maps": train_maps, "test_maps": test_maps, "slip": float(PARAMS.slip), "max_steps": K, "views": {}}
    for name, key_fn in VIEWS.items():
        keys = np.broadcast_to(key_fn(t_near, t_goal, ks), t_table.shape)[rows]
        uniq, inv = np.unique(keys, return_inverse=True)
        counts = np.zeros((len(uniq), 4), np.int64)
        np.add.at(counts, (inv, acts), 1)
        best = counts.argmax(axis=1)
        e_keys = np.broadcast_to(key_fn(e_near, e_goal, ks), e_table.shape)
        pos = np.clip(np.searchsorted(uniq, e_keys), 0, len(uniq) - 1)
        seen = uniq[pos] == e_keys
        table = np.where(seen, best[pos], fallback)
        success = np.asarray(_success(test, jax.nn.one_hot(table, 4), PARAMS))
        out["views"][name] = {"success": float(success.mean()), "keys": int(len(uniq)),
                              "unseen_fraction": float(1.0 - seen[e_rows].mean())}
    out["teacher"] = float(np.asarray(_success(test, jax.nn.one_hot(e_table, 4), PARAMS)).mean())
    out["uniform"] = float(np.asarray(_success(test, jnp.full(e_table.shape + (4,), 0.25), PARAMS)).mean())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-maps", type=int, default=6000)
    p.add_argument("--test-maps", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the numbers as JSON here")
    args = p.parse_args(argv)
    if args.train_maps < 1 or args.test_maps < 1:
        p.error("--train-maps and --test-maps must be >= 1")
    res = ceilings(args.train_maps, args.test_maps, args.seed)
    print(f"exact success on {args.test_maps} maps (views learned from the teacher on {args.train_maps} others)")
    print(f"  {'the whole map (value-iteration teacher)':44s} {res['teacher']:.3f}")
    for name, v in sorted(res["views"].items(), key=lambda kv: -kv[1]["success"]):
        print(f"  {name:44s} {v['success']:.3f}   ({v['keys']} keys, {v['unseen_fraction']:.2%} of the test states unseen)")
    print(f"  {'uniform random':44s} {res['uniform']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
