"""The environments' rules alone: on-device steps/s against the plain-Python ports, and random-policy success.

Issue #34's throughput target compares "on-device steps/s" with "the plain-Python port" of each
environment's rules. This bench measures exactly that pair, with no text on either side:

  JAX:  `step_env` with a uniformly random action, vmapped over the batch, `--inner-steps` steps in one
        jitted `lax.scan`; an episode that ends is restored to its initial state (every step is live).
  host: the plain-Python port of the reference's rules in envs_py/ (held to the JAX envs by
        tests/envs_jax/ and tests/envs_py/), one env at a time, the same random-action
        policy and restore rule, over the same initial states.

bench/envs.py measures the other comparison, the whole agent step (render the next observation to
token ids and parse an answer's ids on device, against tokenizer.encode / decode and `re` on the
host), where the tokenizer work dominates both sides.

Random-policy success: every episode of a batch played to its end with uniformly random actions (JAX,
`--episodes` episodes from reset) next to the plain-Python port playing the same initial states with its
own random draws: two independent estimates of one probability (a binomial z-score is printed; RAGEN
reports no random-policy success for these environments, so there is nothing of theirs to put beside it).
Usage: python -m bench.env_rules [--quick] [--envs rubikscube,game_2048] [--batch 4096]
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import envs_py as npe
from bench.common import machine, write_result
from bench.envs import Timing, tree_where

ENVS = ("Bandit", "FrozenLake", "Sokoban", "rubikscube", "SimpleSudoku", "MediumSudoku", "game_2048")
SUCCESS_ENVS = ("rubikscube", "SimpleSudoku", "MediumSudoku", "game_2048")  # issue #34's new environments
RESULTS = Path(__file__).resolve().parent / "results" / "env_rules.json"


def host_success(name: str, port, s) -> bool:
    """The port's success test at an episode's end (the reference's, written on the port's state)."""
    if name == "rubikscube":
        return npe.rubiks_cube.solved(s.stickers)
    if name in ("SimpleSudoku", "MediumSudoku"):
        return bool((s.grid != 0).all())
    if name == "game_2048":
        return max(max(row) for row in s.grid) >= 2048 and not npe.game_2048.valid_actions(s.grid)
    raise ValueError(f"no host success test for {name!r}")


class Rules:
    """One registered environment, its parameters, its port and a batch of initial states."""

    def __init__(self, name: str, batch: int, seed: int = 0):
        import envs_jax

        self.name = name
        self.env, self.params = envs_jax.make(name)
        self.port = npe.host_env(name, self.env, self.params)
        self.num_actions = int(self.env.num_actions)
        keys = jax.random.split(jax.random.PRNGKey(seed), batch)
        _, self.states = jax.jit(jax.vmap(self.env.reset_env, in_axes=(0, None)))(keys, self.params)
        jax.block_until_ready(self.states)

    def host_states(self, n: int) -> list:
        convert = npe.from_jax(self.name)
        return [convert(jax.tree.map(lambda x: x[i], self.states)) for i in range(n)]


def step_program(r: Rules, inner_steps: int):
    """jitted (key, states, inits) -> (states, checksum): `inner_steps` random-action steps of every env."""
    env, params, n = r.env, r.params, r.num_actions

    def one_env(key, action, state, init):
        _, st, reward, _, _ = env.step_env(key, state, action, params)
        # The checksum keeps the reward and the state alive (nothing may be dead-code eliminated).
        return tree_where(st.done, init, st), reward + st.time.astype(jnp.float32)

    def program(key, states, inits):
        b = inits.time.shape[0]
        # The policy's actions for the whole call in one draw: a key split per env and step cost more
        # than the cube's or Sudoku's whole step (60% of the cube's program). The env's own keys are
        # split per step as the rollout does; envs that draw nothing (cube, Sudoku) drop them.
        k_policy, k_env = jax.random.split(key)
        actions = jax.random.randint(k_policy, (inner_steps, b), 0, n)

        def body(carry, i):
            states, total = carry
            keys = jax.random.split(jax.random.fold_in(k_env, i), b)
            states, check = jax.vmap(one_env)(keys, actions[i], states, inits)
            return (states, total + check), None

        (states, total), _ = jax.lax.scan(body, (states, jnp.zeros((b,), jnp.float32)), jnp.arange(inner_steps))
        return states, total

    return jax.jit(program)


def host_rule_steps(port, states: list, num_steps: int, num_actions: int, rng: random.Random) -> float:
    """`num_steps` random-action steps round-robin over `states` (restored when they end) -> a checksum."""
    inits = [s.copy() for s in states]
    states = [s.copy() for s in states]
    total, b = 0.0, len(states)
    for i in range(num_steps):
        j = i % b
        s, reward, done, _ = port.step(states[j], rng.randrange(num_actions), rng)
        states[j] = inits[j].copy() if done else s
        total += reward + s.time
    return total


def bench_rules(r: Rules, inner_steps: int, repeats: int, host_max_steps: int, seed: int = 0) -> dict:
    batch = int(r.states.time.shape[0])
    key = jax.random.PRNGKey(seed + 1)
    t0 = time.perf_counter()
    compiled = step_program(r, inner_steps).lower(key, r.states, r.states).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(key, r.states, r.states))
    tj = Timing()
    for _ in range(repeats):
        tj.run(lambda: compiled(key, r.states, r.states))
    steps = batch * inner_steps
    n_host = min(steps, host_max_steps)
    host0 = r.host_states(min(batch, n_host))
    th = Timing()
    for rep in range(repeats):
        th.run(host_rule_steps, r.port, host0, n_host, r.num_actions, random.Random(seed + rep))
    jax_rate, host_rate = steps / tj.wall_s, n_host / th.wall_s
    jax_cpu, host_cpu = steps / tj.cpu_s, n_host / th.cpu_s
    return dict(env=r.name, batch=batch, inner_steps=inner_steps, env_steps_per_call=steps, compile_s=compile_s,
                jax_call_s=tj.wall_s, jax_call_cpu_s=tj.cpu_s, jax_steps_per_s=jax_rate, jax_steps_per_cpu_s=jax_cpu,
                host_steps=n_host, host_s=th.wall_s, host_cpu_s=th.cpu_s, host_steps_per_s=host_rate,
                host_steps_per_cpu_s=host_cpu, ratio=jax_rate / host_rate, ratio_cpu=jax_cpu / host_cpu)


def jax_random_success(r: Rules, seed: int = 2) -> np.ndarray:
    """Success (bool per episode) of every episode of the batch played to its end with random actions."""
    env, params, n = r.env, r.params, r.num_actions
    horizon = int(params.max_steps_in_episode)

    def play(key, state):
        def body(carry, k):
            st, done, won = carry
            k_action, k_env = jax.random.split(k)
            # step_env leaves an ended episode as it is, so the last state is the end state.
            _, nxt, _, _, _ = env.step_env(k_env, st, jax.random.randint(k_action, (), 0, n), params)
            return (nxt, nxt.done, nxt.done & env.is_success(nxt, params)), None

        (_, done, won), _ = jax.lax.scan(body, (state, jnp.asarray(state.done), jnp.bool_(False)),
                                         jax.random.split(key, horizon))
        return won, done

    b = int(r.states.time.shape[0])
    won, done = jax.jit(jax.vmap(play))(jax.random.split(jax.random.PRNGKey(seed), b), r.states)
    if not bool(np.all(done)):
        raise RuntimeError(f"{r.name}: an episode did not end within max_steps_in_episode={horizon}")
    return np.asarray(won)


def host_random_success(r: Rules, episodes: int, seed: int = 3) -> np.ndarray:
    rng = random.Random(seed)
    out = []
    for s in r.host_states(episodes):
        done = False
        while not done:
            s, _, done, _ = r.port.step(s, rng.randrange(r.num_actions), rng)
        out.append(host_success(r.name, r.port, s))
    return np.asarray(out)


def success_row(r: Rules, host_episodes: int) -> dict:
    t0 = time.perf_counter()
    won = jax_random_success(r)
    jax_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    host = host_random_success(r, min(host_episodes, len(won)))
    host_s = time.perf_counter() - t0
    p1, p2, n1, n2 = float(won.mean()), float(host.mean()), len(won), len(host)
    pooled = (won.sum() + host.sum()) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2)) if 0 < pooled < 1 else 0.0
    return dict(env=r.name, jax_episodes=n1, jax_success=p1, jax_s=jax_s, host_episodes=n2, host_success=p2,
                host_s=host_s, z=(p1 - p2) / se if se else 0.0, max_steps_in_episode=int(r.params.max_steps_in_episode))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default=",".join(ENVS), help="comma-separated subset of " + ", ".join(ENVS))
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--quick", action="store_true", help="1 repeat, fewer inner / host steps and episodes")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--inner-steps", type=int, default=None, help="env steps per jitted call (lax.scan length)")
    p.add_argument("--host-max-steps", type=int, default=None, help="cap on the port's steps per measurement")
    p.add_argument("--host-episodes", type=int, default=None, help="random-policy episodes played by the port")
    p.add_argument("--no-success", action="store_true", help="skip the random-policy success rows")
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args(argv)
    envs = [e.strip() for e in a.envs.split(",") if e.strip()]
    bad = [e for e in envs if e not in ENVS]
    if bad:
        p.error(f"unknown env(s) {', '.join(bad)}; valid: {', '.join(ENVS)}")
    if a.batch < 1:
        p.error("--batch must be a positive integer")
    repeats = a.repeats or (1 if a.quick else 5)
    inner = a.inner_steps or (4 if a.quick else 16)
    host_steps = a.host_max_steps or (2000 if a.quick else 20000)
    host_episodes = a.host_episodes or (100 if a.quick else 1024)

    rows, success = [], []
    result = dict(
        machine=machine(),
        settings=dict(batch=a.batch, repeats=repeats, inner_steps=inner, host_max_steps=host_steps,
                      host_episodes=host_episodes, quick=a.quick,
                      step_definition="step_env with a uniformly random action, vmapped, lax.scan of inner_steps "
                                      "per jitted call; ended episodes restored to their initial state",
                      host_step_definition="the plain-Python port's step (envs_py/), same policy and "
                                           "restore rule, one env at a time"),
        steps=rows, random_policy_success=success)
    for name in envs:
        r = Rules(name, a.batch)
        row = bench_rules(r, inner, repeats, host_steps)
        rows.append(row)
        print(f"[{name}] batch {a.batch}: jax {row['jax_steps_per_s']:,.0f} steps/s ({row['jax_steps_per_cpu_s']:,.0f} "
              f"per CPU s), port {row['host_steps_per_s']:,.0f} ({row['host_steps_per_cpu_s']:,.0f}): "
              f"{row['ratio']:,.0f}x ({row['ratio_cpu']:,.0f}x per CPU s), compile {row['compile_s']:.1f} s", flush=True)
        if name in SUCCESS_ENVS and not a.no_success:
            s = success_row(r, host_episodes)
            success.append(s)
            print(f"[{name}] random-policy success: jax {s['jax_success']:.4f} over {s['jax_episodes']} episodes, "
                  f"port {s['host_success']:.4f} over {s['host_episodes']} (z = {s['z']:+.2f})", flush=True)
        write_result(result, a.out)  # a run cut short keeps its rows
    result["timestamp_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_result(result, a.out)
    print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
