"""Environment throughput as the compiled rollout uses it, next to a plain-Python/numpy host loop.

JAX side, one "env step" = `step_env` + `TextEnv.render_ids` of the next observation (the segment
the rollout appends before the next assistant turn) + `TextEnv.parse` of an answer's token ids, all
vmapped over the batch and run `--inner-steps` times in one jitted `lax.scan` (the rollout is one
compiled program too, so per-call dispatch is not what it pays per step). The answer of each env at
each step is drawn from "<think> ok </think><answer> {a} || {b} </answer>" over the env's action
names, and its first parsed action is executed, so the parse is live work and the envs move around.
Countdown (free-text answers) draws from fixed expression answers over a fixed set of tasks
(COUNTDOWN_TASKS / COUNTDOWN_PIECES) and is stepped with the parsed `Answer`, as the rollout does.
An episode that ends is restored to its initial state (both sides), so every step is a live step.

Numpy side (the ports in envs_py/), the same work per step in a Python loop: decode the answer ids
(tokenizer.decode), `re` parse, a Python env step, the segment text, tokenizer.encode. Its speed
does not depend on the batch, so it runs min(batch * inner_steps, --numpy-max-steps) steps.

Sokoban / LargerSokoban: also rooms generated per second by vmapped, jitted `reset_env`, next to
a host implementation of the reference's generator (gym-sokoban's DFS reverse play, depth 300).

Compilation (AOT lower + compile) is timed separately; timings are the median of `--repeats`
(21 repeats for measurements under ~1,000 steps). Rates are given per wall second and per CPU
second of this process: on a shared machine the second moves much less with the others' load.
`--breakdown` adds JAX timings with the parse and/or the render left out (where the time goes).
Usage: python -m bench.envs [--quick] [--envs Sokoban,FrozenLake] [--batches 1,256,4096]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path


import jax
import jax.numpy as jnp
import numpy as np

import envs_py as npe
from envs_jax import countdown as cd
from ragen_jax.infra.machine import cpu_model

ENVS = ("Bandit", "FrozenLake", "Sokoban", "LargerSokoban", "rubikscube", "SimpleSudoku", "game_2048", "Countdown")
SOKOBAN_LIKE = ("Sokoban", "LargerSokoban")
RESULTS = Path(__file__).resolve().parent / "results" / "envs.json"

# Behaviour spec section 9: the REFERENCE environments on a machine like ours (2-core CPU, one
# process). Context only: they are not measurements of this code.
REFERENCE_SPEEDS = {
    "Sokoban": {"resets_per_s": 671, "steps_per_s": 609,
                "note": "SimpleSokoban; a step is dominated by an RGB frame gym_sokoban draws even in text mode"},
    "LargerSokoban": {"resets_per_s": 305},
    "FrozenLake": {"resets_per_s": 1956, "steps_per_s": 33800, "steps_per_s_with_text_render": 20400},
    "Bandit": {"resets_per_s": 87000, "steps_per_s": 771000},
}

# The reference's reverse-play DFS depth (RAGEN config/envs.yaml; SokobanConfig's default is 300).
REFERENCE_SEARCH_DEPTH = {"Sokoban": 300, "LargerSokoban": 10}


# Countdown's tasks (numbers, target; each solvable with + and -, as the reference's filter keeps them)
# and answer pieces. Random tasks would make every fixed answer fail the numbers check, which the host
# answers without its `eval`; here the batch cycles through tasks that share their numbers, so a drawn
# answer scores 1, 0.1 (right numbers: a wrong value, a division by zero, numbers that are no
# expression) or 0 (a number changed, missing or added), and both sides do the whole scoring.
COUNTDOWN_TASKS = (((44, 19, 35), 60), ((44, 19, 35), 98), ((44, 19, 35), 10), ((44, 19, 35), 28),
                   ((3, 5, 2, 7), 13), ((3, 5, 2, 7), 17), ((3, 5, 2, 7), 3), ((3, 5, 2, 7), 7))
COUNTDOWN_PIECES = ("44 - 19 + 35", "44 + 19 + 35", "19 + 35 - 44", "44 + 19 - 35", "(44 - 19) * 35",
                    "35 / (44 - 19)", "44 19 35", "44 - 19 + 53",
                    "3 + 5 - 2 + 7", "3 + 5 + 2 + 7", "(3 + 5 + 2) - 7", "7 / (5 - 3 - 2)", "3 * 5 + 2 * 7",
                    "3, 5, 2, 7", "2 + 5 - 3", "3 + 5 + 2 + 7 + 1")


# ---------------------------------------------------------------------------------------------------
# Setup shared by the benchmark and its smoke test
# ---------------------------------------------------------------------------------------------------
def answer_texts(action_names) -> list[str]:
    """One realistic answer per action: its name first, then the next one."""
    n = len(action_names)
    return [f"<think> ok </think><answer> {action_names[i]} || {action_names[(i + 1) % n]} </answer>"
            for i in range(n)]


class Setup:
    """Env, TextEnv and the answer ids for one registered environment."""

    def __init__(self, name: str, tokenizer=None, parse_tokens: int | None = None):
        import envs_jax
        from ragen_jax.text.conversation import PromptConfig
        from ragen_jax.text.text_env import TextEnv
        from ragen_jax.text.tokenizer import load_tokenizer

        if name not in ENVS:
            raise ValueError(f"unknown benchmark env {name!r}; valid: {', '.join(ENVS)}")
        self.name = name
        self.tokenizer = tokenizer or load_tokenizer()
        self.env, self.params = envs_jax.make(name)
        self.text_env = TextEnv(self.env, self.params, self.tokenizer, PromptConfig())
        # Countdown is stepped with the parsed `Answer` (its own parser), the others with an action index.
        self.takes_answer = self.env.answer_format == "expression"
        if self.takes_answer:
            self.answers = [f"<think> ok </think><answer> {p} </answer>" for p in COUNTDOWN_PIECES]
            # The host parse of each answer: what the program steps with when the parse is left out.
            answers = [self.text_env.parse_text(t).answer for t in self.answers]
            self.answer_table = jax.tree.map(lambda *x: np.stack(x), *answers)
        else:
            self.answers = answer_texts(self.text_env.action_names)
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in self.answers]
        width = max(len(i) for i in ids)
        if parse_tokens is not None:
            if parse_tokens < width:
                raise ValueError(f"parse_tokens={parse_tokens} is shorter than the answers ({width} tokens)")
            width = parse_tokens
        self.answer_ids_list = ids
        self.answer_ids = np.full((len(ids), width), self.text_env.pad_id, np.int32)
        for i, row in enumerate(ids):
            self.answer_ids[i, :len(row)] = row
        self.answer_len = np.array([len(r) for r in ids], np.int32)
        self.np_env = npe.host_env(name, self.env, self.params)
        self.from_jax = npe.from_jax(name)


def tree_where(c, a, b):
    return jax.tree.map(lambda x, y: jnp.where(jnp.reshape(c, c.shape + (1,) * (x.ndim - c.ndim)), x, y), a, b)


def make_step_program(setup: Setup, inner_steps: int, parse: bool = True, render: bool = True):
    """jitted (key, states [B], inits [B]) -> (states, checksum [B]): `inner_steps` full env steps.

    parse / render False leave that part out (for the cost breakdown); answer i's first action is
    action i, so without the parse the drawn index is executed directly: the same trajectory.
    Countdown steps with the parsed `Answer` (the rollout's `Parsed.answer`), without the parse with
    the host parse of the drawn answer.
    """
    te, env, params = setup.text_env, setup.env, setup.params
    answer_ids, answer_len = jnp.asarray(setup.answer_ids), jnp.asarray(setup.answer_len)
    n_answers = answer_ids.shape[0]

    def one_env(key, state, init):
        k_answer, k_env = jax.random.split(key)
        a = jax.random.randint(k_answer, (), 0, n_answers)
        if parse:
            parsed = te.parse(answer_ids[a], answer_len[a])
            action, check = jnp.maximum(parsed.actions[0], 0), parsed.num_actions
            if setup.takes_answer:
                action = parsed.answer
        else:
            action, check = a, jnp.int32(0)
            if setup.takes_answer:
                action = jax.tree.map(lambda x: jnp.asarray(x)[a], setup.answer_table)
        _, st, reward, _, _ = env.step_env(k_env, state, action, params)
        if setup.takes_answer:
            # Every answer ends its episode, whose state is then replaced by the initial one: without
            # the reward in the checksum the scoring (and the parse behind it) would be dead code.
            check = check + jnp.round(reward * 10).astype(jnp.int32)
        st = tree_where(st.done, init, st)
        if render:
            turn = jnp.minimum(st.time + 1, te.max_turns)
            ids, n = te.render_ids(st, turn, te.max_actions_per_episode - st.time, reward, True)
            # The checksum keeps every output alive (nothing may be dead-code eliminated).
            check = check + jnp.sum(jnp.where(jnp.arange(ids.shape[0]) < n, ids, 0))
        else:
            check = check + st.time + (reward > 0).astype(jnp.int32)
        return st, check

    def program(key, states, inits):
        b = inits.time.shape[0]

        def body(carry, i):
            states, total = carry
            keys = jax.random.split(jax.random.fold_in(key, i), b)
            states, check = jax.vmap(one_env)(keys, states, inits)
            return (states, total + check), None

        (states, total), _ = jax.lax.scan(body, (states, jnp.zeros((b,), jnp.int32)), jnp.arange(inner_steps))
        return states, total

    return jax.jit(program)


def countdown_states(batch: int):
    """Countdown states cycling through COUNTDOWN_TASKS (with the +- signs of a solution)."""
    rows = []
    for nums, target in COUNTDOWN_TASKS:
        padded = list(nums) + [0] * (cd.MAX_NUMS - len(nums))
        signs = next(s for s in itertools.product((1, -1), repeat=cd.MAX_NUMS)
                     if sum(x * y for x, y in zip(s, padded)) == target)
        rows.append((padded, len(nums), target, signs))
    task = np.arange(batch) % len(rows)
    nums, count, target, signs = (np.asarray(c, np.int32)[task] for c in zip(*rows))
    return cd.CountdownState(nums=jnp.asarray(nums), count=jnp.asarray(count), target=jnp.asarray(target),
                             signs=jnp.asarray(signs), reward=jnp.zeros(batch, jnp.float32),
                             time=jnp.zeros(batch, jnp.int32), done=jnp.zeros(batch, bool))


def initial_states(setup: Setup, batch: int, seed: int = 0):
    if setup.takes_answer:
        return countdown_states(batch)
    keys = jax.random.split(jax.random.PRNGKey(seed), batch)
    _, states = jax.jit(jax.vmap(setup.env.reset_env, in_axes=(0, None)))(keys, setup.params)
    return jax.block_until_ready(states)


class Timing:
    """Median wall and process-CPU seconds of repeated runs.

    The machine is shared, so wall time says what this process got; process CPU time (all its
    threads, XLA's pool included) is the work done and moves much less with the load. Rates are
    reported both ways.
    """

    def __init__(self):
        self.wall, self.cpu = [], []

    def run(self, fn, *args):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(*args))
        self.wall.append(time.perf_counter() - t0)
        self.cpu.append(time.process_time() - c0)

    @property
    def wall_s(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_s(self) -> float:
        return max(statistics.median(self.cpu), 1e-9)


def _reps(repeats: int, steps: int) -> int:
    """Short measurements (a few ms) get more repeats: one load spike must not decide the median."""
    return repeats if steps >= 1000 else max(repeats, 21)


def _timed(fn, repeats: int) -> Timing:
    t = Timing()
    for _ in range(repeats):
        t.run(fn)
    return t


def bench_steps(setup: Setup, batch: int, inner_steps: int = 8, repeats: int = 3,
                numpy_max_steps: int = 5000, seed: int = 0) -> dict:
    """Env steps per second of the jitted batch program and of the host loop, at one batch size."""
    states = initial_states(setup, batch, seed)
    program = make_step_program(setup, inner_steps)
    key = jax.random.PRNGKey(seed + 1)
    t0 = time.perf_counter()
    compiled = program.lower(key, states, states).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(key, states, states))
    first_run_s = time.perf_counter() - t0
    steps = batch * inner_steps
    tj = _timed(lambda: compiled(key, states, states), _reps(repeats, steps))

    # Host loop over the same start states (as many as it needs).
    n_np = min(steps, numpy_max_steps)
    n_states = min(batch, n_np)
    one = lambda i: jax.tree.map(lambda x: x[i], states)  # noqa: E731
    np_states0 = [setup.from_jax(one(i)) for i in range(n_states)]
    tn = Timing()
    for r in range(_reps(repeats, n_np)):
        np_states = [s.copy() for s in np_states0]
        tn.run(npe.host_steps, setup.np_env, np_states, setup.answer_ids_list, setup.tokenizer, n_np,
               random.Random(seed + r), setup.text_env.max_turns)
    jax_rate, np_rate = steps / tj.wall_s, n_np / tn.wall_s
    jax_cpu_rate, np_cpu_rate = steps / tj.cpu_s, n_np / tn.cpu_s
    return dict(env=setup.name, batch=batch, inner_steps=inner_steps, env_steps_per_call=steps,
                compile_s=compile_s, first_run_s=first_run_s, jax_call_s=tj.wall_s, jax_call_s_all=tj.wall,
                jax_call_cpu_s=tj.cpu_s, jax_steps_per_s=jax_rate, jax_steps_per_cpu_s=jax_cpu_rate,
                numpy_steps=n_np, numpy_s=tn.wall_s, numpy_cpu_s=tn.cpu_s, numpy_steps_per_s=np_rate,
                numpy_steps_per_cpu_s=np_cpu_rate, ratio=jax_rate / np_rate, ratio_cpu=jax_cpu_rate / np_cpu_rate,
                parse_tokens=int(setup.answer_ids.shape[1]))


def bench_breakdown(setup: Setup, batch: int, inner_steps: int = 8, repeats: int = 3, seed: int = 0) -> dict:
    """JAX steps per wall second with parts left out (and per CPU second, keys ending in _cpu)."""
    states = initial_states(setup, batch, seed)
    key = jax.random.PRNGKey(seed + 1)
    out = dict(env=setup.name, batch=batch)
    for label, parse, render in (("step", False, False), ("step+render", False, True),
                                 ("step+parse", True, False), ("step+render+parse", True, True)):
        compiled = make_step_program(setup, inner_steps, parse, render).lower(key, states, states).compile()
        jax.block_until_ready(compiled(key, states, states))
        t = _timed(lambda: compiled(key, states, states), _reps(repeats, batch * inner_steps))
        out[label] = batch * inner_steps / t.wall_s
        out[label + "_cpu"] = batch * inner_steps / t.cpu_s
    return out


def bench_resets(setup: Setup, batch: int, repeats: int = 3, numpy_max_rooms: int = 300, seed: int = 0) -> dict:
    """Rooms generated per second: jitted vmapped reset_env vs the host reference-like generator."""
    env, params = setup.env, setup.params
    program = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))
    keys = jax.random.split(jax.random.PRNGKey(seed), batch)
    t0 = time.perf_counter()
    compiled = program.lower(keys, params).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(keys, params))
    tj = _timed(lambda: compiled(keys, params), _reps(repeats, batch * 100))
    cfg = env.config
    n_np = min(batch, numpy_max_rooms)

    def host_rooms(rng):
        for _ in range(n_np):
            npe.generate_sokoban_room(rng, cfg.dim_room, cfg.num_boxes, REFERENCE_SEARCH_DEPTH[setup.name])

    tn = Timing()
    for r in range(_reps(repeats, n_np * 100)):
        tn.run(host_rooms, random.Random(seed + r))
    jr, nr = batch / tj.wall_s, n_np / tn.wall_s
    jc, nc = batch / tj.cpu_s, n_np / tn.cpu_s
    return dict(env=setup.name, batch=batch, compile_s=compile_s, jax_call_s=tj.wall_s, jax_call_cpu_s=tj.cpu_s,
                jax_rooms_per_s=jr, jax_rooms_per_cpu_s=jc, numpy_rooms=n_np, numpy_s=tn.wall_s,
                numpy_cpu_s=tn.cpu_s, numpy_rooms_per_s=nr, numpy_rooms_per_cpu_s=nc, ratio=jr / nr, ratio_cpu=jc / nc)


def machine() -> dict:
    return dict(cpu_count=os.cpu_count(), cpu_model=cpu_model(), platform=platform.platform(),
                processor=platform.processor(),
                python=platform.python_version(), jax=jax.__version__, backend=jax.default_backend(),
                devices=[str(d) for d in jax.devices()],
                # A shared machine: the load says how much of the CPU this run really had.
                load_average_1_5_15min=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)


# ---------------------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def print_table(rows: list[dict], resets: list[dict]) -> None:
    print("\nEnv steps/s (step_env + render_ids + parse; host: step + text + encode + decode + re)")
    print("(per wall second; in brackets per CPU second of this process, which the shared machine's load moves less)")
    print(f"{'env':<14}{'batch':>6}{'compile s':>11}{'jax steps/s':>24}{'numpy steps/s':>24}{'jax/numpy':>18}")
    for r in rows:
        print(f"{r['env']:<14}{r['batch']:>6}{r['compile_s']:>11.1f}"
              f"{_fmt(r['jax_steps_per_s']) + ' (' + _fmt(r['jax_steps_per_cpu_s']) + ')':>24}"
              f"{_fmt(r['numpy_steps_per_s']) + ' (' + _fmt(r['numpy_steps_per_cpu_s']) + ')':>24}"
              f"{r['ratio']:>9.1f}x ({r['ratio_cpu']:.1f}x)")
    if resets:
        print("\nRooms generated/s (jitted vmapped reset_env vs host reference-like generator)")
        print(f"{'env':<14}{'batch':>6}{'compile s':>11}{'jax rooms/s':>24}{'numpy rooms/s':>24}{'jax/numpy':>18}")
        for r in resets:
            print(f"{r['env']:<14}{r['batch']:>6}{r['compile_s']:>11.1f}"
                  f"{_fmt(r['jax_rooms_per_s']) + ' (' + _fmt(r['jax_rooms_per_cpu_s']) + ')':>24}"
                  f"{_fmt(r['numpy_rooms_per_s']) + ' (' + _fmt(r['numpy_rooms_per_cpu_s']) + ')':>24}"
                  f"{r['ratio']:>9.1f}x ({r['ratio_cpu']:.1f}x)")
    print("\nReference environments (behaviour spec section 9, NOT our numbers; context only):")
    for name, ref in REFERENCE_SPEEDS.items():
        print(f"  {name}: " + ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}: {v}" for k, v in ref.items()))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default=",".join(ENVS), help="comma-separated subset of " + ", ".join(ENVS))
    p.add_argument("--batches", default="1,256,4096", help="comma-separated batch sizes")
    p.add_argument("--quick", action="store_true", help="1 repeat, fewer inner/host steps")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--inner-steps", type=int, default=None, help="env steps per jitted call (lax.scan length)")
    p.add_argument("--numpy-max-steps", type=int, default=None, help="cap on host-loop steps per measurement")
    p.add_argument("--numpy-max-rooms", type=int, default=None, help="cap on host-generated rooms per measurement")
    p.add_argument("--parse-tokens", type=int, default=None,
                   help="pad the answer ids to this many tokens (the rollout parses forced + max_new tokens)")
    p.add_argument("--breakdown", action="store_true",
                   help="also time step only / +render / +parse at --breakdown-batch (4 more compiles per env)")
    p.add_argument("--breakdown-batch", type=int, default=256)
    p.add_argument("--no-resets", action="store_true", help="skip the Sokoban room generation timing")
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args(argv)
    envs = [e.strip() for e in a.envs.split(",") if e.strip()]
    bad = [e for e in envs if e not in ENVS]
    if bad:
        p.error(f"unknown env(s) {', '.join(bad)}; valid: {', '.join(ENVS)}")
    try:
        batches = [int(b) for b in a.batches.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batches must be comma-separated integers, got {a.batches!r}")
    if not batches or min(batches) < 1:
        p.error("--batches must list positive integers")
    repeats = a.repeats or (1 if a.quick else 3)
    inner = a.inner_steps or (4 if a.quick else 8)
    np_steps = a.numpy_max_steps or (2000 if a.quick else 5000)
    np_rooms = a.numpy_max_rooms or (50 if a.quick else 300)

    from ragen_jax.text.tokenizer import load_tokenizer

    tok = load_tokenizer()
    machine_at_start = machine()
    rows, resets, breakdown = [], [], []
    for name in envs:
        t0 = time.perf_counter()
        setup = Setup(name, tok, a.parse_tokens)
        setup_s = time.perf_counter() - t0
        print(f"[{name}] TextEnv built in {setup_s:.1f} s", flush=True)
        for b in batches:
            r = bench_steps(setup, b, inner, repeats, np_steps)
            r["text_env_build_s"] = setup_s
            rows.append(r)
            print(f"[{name}] batch {b}: compile {r['compile_s']:.1f} s, jax {_fmt(r['jax_steps_per_s'])} steps/s, "
                  f"numpy {_fmt(r['numpy_steps_per_s'])} steps/s", flush=True)
            if name in SOKOBAN_LIKE and not a.no_resets:
                g = bench_resets(setup, b, repeats, np_rooms)
                resets.append(g)
                print(f"[{name}] batch {b}: resets compile {g['compile_s']:.1f} s, jax {_fmt(g['jax_rooms_per_s'])} "
                      f"rooms/s, numpy {_fmt(g['numpy_rooms_per_s'])} rooms/s", flush=True)
        if a.breakdown:
            d = bench_breakdown(setup, a.breakdown_batch, inner, repeats)
            breakdown.append(d)
            print(f"[{name}] breakdown at batch {d['batch']}: " + ", ".join(
                f"{k} {_fmt(d[k])} steps/s" for k in ("step", "step+render", "step+parse", "step+render+parse")),
                  flush=True)
    print_table(rows, resets)
    if breakdown:
        print("\nJAX steps/s with parts left out (where the time goes)")
        labels = ("step", "step+render", "step+parse", "step+render+parse")
        print(f"{'env':<14}{'batch':>6}" + "".join(f"{k:>20}" for k in labels))
        for d in breakdown:
            print(f"{d['env']:<14}{d['batch']:>6}" + "".join(f"{_fmt(d[k]):>20}" for k in labels))
        print("per CPU second:")
        for d in breakdown:
            print(f"{d['env']:<14}{d['batch']:>6}" + "".join(f"{_fmt(d[k + '_cpu']):>20}" for k in labels))
    result = dict(
        machine=machine_at_start,
        load_average_at_end=machine()["load_average_1_5_15min"],
        settings=dict(repeats=repeats, inner_steps=inner, numpy_max_steps=np_steps, numpy_max_rooms=np_rooms,
                      quick=a.quick, parse_tokens=a.parse_tokens,
                      step_definition="step_env + TextEnv.render_ids(next state) + TextEnv.parse(answer ids), "
                                      "vmapped, lax.scan of inner_steps per jitted call; ended episodes restored",
                      numpy_step_definition="tokenizer.decode(answer) + re parse + Python env step + segment text "
                                            "+ tokenizer.encode, one env at a time",
                      numpy_reset_definition="gym-sokoban-like host generator (DFS reverse play, depth 300 "
                                             "for Sokoban and 10 for LargerSokoban as in RAGEN's envs.yaml, "
                                             "4 tries then start over) + RAGEN player jitter, envs_py/sokoban.py"),
        steps=rows,
        resets=resets,
        breakdown=breakdown,
        reference_speeds_context_only=REFERENCE_SPEEDS,
        timestamp_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")
    return result


if __name__ == "__main__":
    main()
