"""The compiled rollout against independent truths: a scripted policy with known outcomes (BFS
solutions, garbage answers), the slow host loop of ragen_jax/rollout/host_loop.py, and 1 vs 8 devices."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import envs_jax
from ragen_jax.models import Qwen2, Qwen2Config, save_pretrained
from ragen_jax.rollout import Rollout, RolloutConfig, format_trajectory, rollout_metrics
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.text.tokenizer import IM_END, load_tokenizer, token_bytes_table

from ragen_jax.rollout.host_loop import host_rollout
from tests.ragen_jax.numpy_qwen2 import NumpyQwen2
from tests.ragen_jax.rollout.scripted import ScriptedPolicy, make_script

ACTION_NAMES = ("Up", "Down", "Left", "Right")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _text_env(tok, name, **prompt):
    env, params = envs_jax.make(name)
    return TextEnv(env, params, tok, PromptConfig(**prompt))


def _initial_states(text_env, seeds):
    """`reset_env(PRNGKey(seed))` of each seed, as host states: one compiled batch (op by op, each
    reset compiled and dispatched every op, e.g. Sokoban's room generation)."""
    batch = jax.device_get(jax.jit(text_env.reset_rows)(jnp.asarray(seeds, jnp.int32)))
    return [jax.tree.map(lambda x: x[i], batch) for i in range(len(seeds))]


def _sampled(traj, row):
    n = int(traj.length[row])
    ids = np.asarray(traj.tokens[row, :n])
    return ids[np.asarray(traj.loss_mask[row, :n])].tolist()


# ------------------------------------------------------------------------------------ scripted
# The BFS and the garbage-answer tests run one program: the same text env, batch and script shape
# [6 rows, 3 turns, 48 tokens] (the script is a parameter of the scripted policy, so its shape is part of
# the program), so the second compile is a persistent-cache hit.
SCRIPT_TOKENS = 48


@pytest.fixture(scope="module")
def sokoban3(tok):
    te = _text_env(tok, "Sokoban", max_turns=3, max_response_tokens=SCRIPT_TOKENS)
    return te, RolloutConfig(num_groups=3, group_size=2, max_context=1024, greedy=True)


def test_scripted_bfs_solution_solves_sokoban(tok, sokoban3):
    te, cfg = sokoban3
    # Rooms whose BFS solution fits the 10-action budget (99.8% of them in the reference).
    seeds, solutions = [], []
    solve = jax.jit(lambda st: te.env.solve(st, te.env_params))
    # Seeds 11.. in compiled batches of 8 (the first batch holds enough rooms: one compile).
    rooms = ((s, st) for c in range(11, 43, 8) for s, st in zip(range(c, c + 8), _initial_states(te, range(c, c + 8))))
    for seed, st in rooms:
        acts, n, solvable = solve(st)
        assert bool(solvable)
        if 1 <= int(n) <= 10:
            seeds.append(seed)
            solutions.append([int(a) for a in np.asarray(acts)[: int(n)]])
        if len(seeds) == 3:
            break
    seeds = np.array(seeds)
    texts, expected = [], []
    for acts in solutions:
        turns = [acts[i : i + 5] for i in range(0, len(acts), 5)]
        row_texts = [" plan</think><answer>" + " || ".join(ACTION_NAMES[a] for a in t) + "</answer>" for t in turns]
        expected.append((len(turns), -0.1 * len(acts) + 1.0 + 10.0))
        texts += [row_texts, row_texts]  # both rollouts of the group follow the same script
    script = make_script(tok, texts, cfg.group_size, max_len=SCRIPT_TOKENS)
    policy = ScriptedPolicy(script)
    ro = Rollout(policy, te, cfg)
    traj = ro(nnx.state(policy), jax.random.PRNGKey(0), seeds)
    for r in range(cfg.batch_size):
        n_turns, reward = expected[r // 2]
        assert bool(traj.success[r])
        assert int(traj.num_turns[r]) == n_turns
        np.testing.assert_allclose(float(traj.reward[r]), reward, atol=1e-5)
        assert int(traj.num_format_errors[r]) == 0 and bool(traj.action_is_valid[r])
        # The loss mask covers exactly the scripted tokens, nothing else; generation stopped at the
        # completed "</answer>" (the stop string), so the script's trailing <|im_end|> is never sampled.
        want = sum((tok.encode(t, add_special_tokens=False) for t in texts[r]), [])
        assert _sampled(traj, r) == want
        assert int(traj.response_length[r]) == len(want)
        # The reward sits at the last sampled token of the last turn.
        ends = np.asarray(traj.turn_end[r])
        assert ends[n_turns - 1] == int(traj.length[r]) - 1 and np.all(ends[n_turns:] == -1)
    view = format_trajectory(traj, 0, tok)
    assert "<|im_start|>assistant\n<think>\u27e6 plan</think><answer>" in view


@pytest.fixture(scope="module")
def garbage(tok, sokoban3):
    """The garbage-answer rollout; the shape-assertion test reads it too (no program of its own)."""
    te, cfg = sokoban3
    texts = [["hello world"] * 3, ["</think><answer>jump || fly</answer>"] * 3,
             ["<answer>Up</answer>"] * 3, ["x</think><answer>Up || Sideways</answer>"] * 3]
    texts += texts[:2]  # rows 4, 5: no valid action either
    policy = ScriptedPolicy(make_script(tok, texts, 2, max_len=SCRIPT_TOKENS))
    return Rollout(policy, te, cfg)(nnx.state(policy), jax.random.PRNGKey(1), np.array([5, 6, 7]))


def test_garbage_answers_get_the_format_penalty_every_turn(sokoban3, garbage):
    cfg, traj = sokoban3[1], garbage
    for r in (0, 1, 2, 4, 5):  # no valid action: only the penalty, every turn, no env step
        assert int(traj.num_turns[r]) == 3 and int(traj.num_actions[r]) == 0
        np.testing.assert_allclose(np.asarray(traj.turn_reward[r]), [-0.1] * 3, atol=1e-6)
        assert int(traj.num_format_errors[r]) == 3 and not bool(traj.action_is_valid[r])
    # A valid action next to an invalid piece executes, and the turn still pays the penalty.
    assert int(traj.num_format_errors[3]) >= 1 and int(traj.num_actions[3]) >= 1
    m = rollout_metrics(traj, cfg.group_size)
    assert m["format_ok"] == 0.0 and m["num_turns"] == 3.0


def test_bandit_pairs_answer_naming_another_pairs_arm_gets_the_format_penalty(tok):
    """BanditPairs draws each episode's arm pair at reset: a name of another pair is no valid action
    for that episode (issue 16, the reference's per-state action lookup). Hand-computed outcomes."""
    te = _text_env(tok, "BanditPairs", max_turns=1, max_response_tokens=24)
    env, params = te.env, te.env_params
    names = env.action_names(params)
    pair_of = {s: int(st.pair) for s, st in enumerate(_initial_states(te, range(40)))}
    s0 = 0
    s1 = next(s for s in range(1, 40) if pair_of[s] != pair_of[s0])  # two groups, two different pairs
    low0, high0 = names[2 * pair_of[s0]], names[2 * pair_of[s0] + 1]
    low1, high1 = names[2 * pair_of[s1]], names[2 * pair_of[s1] + 1]
    answer = " x</think><answer>{}</answer>".format
    texts = [[answer(low0)],  # own pair, low arm: its reward, no penalty
             [answer(low1)],  # the other group's arm: dropped, nothing pulled, penalty only
             [answer(f"{low0} || {low1}")],  # another pair's name next to an own one: own pulled + penalty
             [answer(high1)]]  # own pair, high arm: success, no penalty
    cfg = RolloutConfig(num_groups=2, group_size=2, max_context=1024, greedy=True)
    policy = ScriptedPolicy(make_script(tok, texts, cfg.group_size))
    traj = Rollout(policy, te, cfg)(nnx.state(policy), jax.random.PRNGKey(3), np.array([s0, s1]))
    pen, low = -0.1, params.low_reward
    np.testing.assert_allclose(np.asarray(traj.reward[:3]), [low, pen, low + pen], atol=1e-6)
    assert float(traj.reward[3]) in (params.high_reward, params.high_fail_reward)
    assert np.asarray(traj.num_format_errors).tolist() == [0, 1, 1, 0]
    assert np.asarray(traj.num_actions).tolist() == [1, 0, 1, 1]
    assert np.asarray(traj.action_is_valid).tolist() == [True, False, False, True]
    assert np.asarray(traj.success).tolist() == [False, False, False, True]


def test_context_overflow_truncates_cleanly(tok):
    te = _text_env(tok, "Sokoban", max_turns=5, max_response_tokens=40)
    first = len(te.prefix_ids) + te.max_segment_len
    cfg = RolloutConfig(num_groups=1, group_size=2, max_context=first + 60, greedy=True)
    texts = [["a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h"] * 5] * 2
    policy = ScriptedPolicy(make_script(tok, texts, 2))
    traj = Rollout(policy, te, cfg)(nnx.state(policy), jax.random.PRNGKey(2), np.array([3]))
    assert np.all(np.asarray(traj.truncated))
    assert np.all(np.asarray(traj.length) <= cfg.max_context)
    assert np.all(np.asarray(traj.num_turns) < 5)


# ------------------------------------------------------------------------ tiny model vs host loop
@pytest.fixture(scope="module")
def tiny_model():
    cfg = Qwen2Config.from_preset("tiny")
    return Qwen2(cfg, rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def numpy_twin(tiny_model, tmp_path_factory):
    """The same weights, read back from the HF layout by a numpy Qwen2 written from transformers' code."""
    path = tmp_path_factory.mktemp("tiny_hf")
    save_pretrained(tiny_model, str(path))
    return NumpyQwen2(path)


@pytest.mark.parametrize("env_name,turns", [("FrozenLake", 3), ("Bandit", 1), ("Sokoban", 2)])
def test_compiled_rollout_equals_host_loop(tok, tiny_model, numpy_twin, env_name, turns):
    """The compiled rollout (in-graph rendering, parsing, KV cache, JAX model) against the host loop
    decoding greedily with the numpy forward (host text, re-encoded whole each token, Python regex)."""
    te = _text_env(tok, env_name, max_turns=turns, max_response_tokens=12)
    cfg = RolloutConfig(num_groups=2, group_size=2, max_context=640, greedy=True)
    ro = Rollout(tiny_model, te, cfg)
    key, seeds = jax.random.PRNGKey(7), np.array([101, 202])
    traj = jax.device_get(ro(nnx.state(tiny_model), key, seeds))
    ref = host_rollout(None, te, ro.parser, cfg, key, seeds, token_bytes_table(tok),
                       next_logits=numpy_twin.next_logits)
    for r in range(cfg.batch_size):
        n = int(traj.length[r])
        assert traj.tokens[r, :n].tolist() == ref["ids"][r]
        assert traj.loss_mask[r, :n].tolist() == ref["mask"][r]
        k = len(ref["turn_rewards"][r])
        assert int(traj.num_turns[r]) == k
        np.testing.assert_allclose(traj.turn_reward[r, :k], ref["turn_rewards"][r], atol=1e-5)
        assert bool(traj.success[r]) == ref["success"][r]
        assert bool(traj.truncated[r]) == ref["truncated"][r]


def test_scripted_actions_equal_host_loop_with_env_randomness(tok):
    """Valid answers every turn, so FrozenLake's slips (env keys) and multi-action turns are exercised."""
    te = _text_env(tok, "FrozenLake", max_turns=3, max_response_tokens=24)
    cfg = RolloutConfig(num_groups=2, group_size=3, max_context=1024, greedy=True)
    rng = np.random.default_rng(0)
    names = ("Left", "Down", "Right", "Up")
    texts = [[("ok</think><answer>" + " || ".join(rng.choice(names, size=rng.integers(1, 4)))
               + "</answer>") for _ in range(3)] for _ in range(cfg.batch_size)]
    policy = ScriptedPolicy(make_script(tok, texts, 3))
    ro = Rollout(policy, te, cfg)
    key, seeds = jax.random.PRNGKey(9), np.array([1, 2])
    traj = jax.device_get(ro(nnx.state(policy), key, seeds))
    ref = host_rollout(policy, te, ro.parser, cfg, key, seeds, token_bytes_table(tok))
    assert sum(int(x) for x in traj.num_actions) > 0
    for r in range(cfg.batch_size):
        n = int(traj.length[r])
        assert traj.tokens[r, :n].tolist() == ref["ids"][r]
        k = len(ref["turn_rewards"][r])
        np.testing.assert_allclose(traj.turn_reward[r, :k], ref["turn_rewards"][r], atol=1e-5)
        assert bool(traj.success[r]) == ref["success"][r]


@pytest.fixture(scope="module")
def one_pass(tok, tiny_model):
    """One sampled FrozenLake rollout program (4 groups x 2, one pass) that both tests below read: the
    no-recompilation check calls it, and the passes test compares each pass against it, so it compiles
    once (a second trace raises: chex.assert_max_traces)."""
    te = _text_env(tok, "FrozenLake", max_turns=2, max_response_tokens=8)
    cfg = RolloutConfig(num_groups=4, group_size=2, max_context=512, temperature=1.0)
    return te, Rollout(tiny_model, te, cfg, max_traces=1)


def _mesh8():
    devices = np.array(jax.devices()[:8])
    if len(devices) < 8:
        pytest.skip("needs 8 (simulated) devices")
    return jax.sharding.Mesh(devices.reshape(4, 2, 1), ("data", "fsdp", "tensor"))


def _assert_sharded_equal(t8, t1):
    floats = ("logprobs", "turn_reward", "reward")
    # Every token, mask, position, count and flag identical; the float fields close.
    chex.assert_trees_all_equal(t8.replace(**dict.fromkeys(floats)), t1.replace(**dict.fromkeys(floats)))
    chex.assert_trees_all_close(t8.logprobs, t1.logprobs, atol=1e-4)
    chex.assert_trees_all_close((t8.turn_reward, t8.reward), (t1.turn_reward, t1.reward), atol=1e-6)


def test_no_recompilation_and_sharded_equals_single_device(tiny_model, one_pass):
    te, ro = one_pass
    params = nnx.state(tiny_model)
    outs = [ro(params, jax.random.PRNGKey(i), np.array([i, i + 50, i + 60, i + 70])) for i in range(3)]
    assert not np.array_equal(np.asarray(outs[0].tokens), np.asarray(outs[1].tokens))
    with pytest.raises(AssertionError, match="traced > 1 times"):  # the check can fail: a new key type
        ro(params, jax.random.key(0), np.array([0, 50, 60, 70]))

    mesh = _mesh8()
    ro8 = Rollout(tiny_model, te, ro.config, mesh=mesh)
    with mesh:
        t8 = jax.device_get(ro8(params, jax.random.PRNGKey(0), np.array([0, 50, 60, 70])))
    _assert_sharded_equal(t8, jax.device_get(outs[0]))


def test_passes_equal_one_pass_rollouts_of_their_groups(tiny_model, one_pass):
    """groups_per_pass: the P groups run in passes inside one program. Truth: pass i is the one-pass
    rollout of its groups with fold_in(key, i); the rows come back in group order, group ids global.
    Sampled (temperature 1) FrozenLake, so the key and the env slips matter; also on 8 devices."""
    te, one = one_pass
    params, key = nnx.state(tiny_model), jax.random.PRNGKey(4)
    seeds = np.arange(20, 28)
    cfg = RolloutConfig(num_groups=8, group_size=2, max_context=512, temperature=1.0, groups_per_pass=4)
    got = jax.device_get(Rollout(tiny_model, te, cfg)(params, key, seeds))
    parts = [jax.device_get(one(params, jax.random.fold_in(key, i), seeds[4 * i: 4 * i + 4])) for i in range(2)]
    want = jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
    want = want.replace(group=np.repeat(np.arange(8, dtype=np.int32), 2))
    chex.assert_trees_all_equal(got.replace(logprobs=None), want.replace(logprobs=None))
    chex.assert_trees_all_close(got.logprobs, want.logprobs, atol=1e-6)
    assert not np.array_equal(parts[0].tokens, parts[1].tokens)  # the two passes sampled differently

    mesh = _mesh8()
    with mesh:
        t8 = jax.device_get(Rollout(tiny_model, te, cfg, mesh=mesh)(params, key, seeds))
    _assert_sharded_equal(t8, got)


def test_first_turn_prefilled_once_per_group_equals_every_row_prefilling_it(tok, tiny_model):
    """One-turn episodes: each group's first observation is prefilled once and copied to its rows
    (`Rollout.share_first`). Truth: every row prefilling the prefix and its observation itself
    (`shared_prefix=False`): the same sampled tokens (temperature 1, so a changed logit shows), log-probs
    within float32 rounding. FrozenLake with random maps: the groups' observations differ."""
    te = _text_env(tok, "FrozenLake", max_turns=1, max_response_tokens=8)
    params, key, seeds = nnx.state(tiny_model), jax.random.PRNGKey(7), np.arange(30, 34)
    outs = {}
    for shared in (True, False):
        ro = Rollout(tiny_model, te, RolloutConfig(num_groups=4, group_size=3, max_context=512, temperature=1.0,
                                                    shared_prefix=shared))
        assert ro.share_first == shared
        outs[shared] = jax.device_get(ro(params, key, seeds))
    got, want = outs[True], outs[False]
    prompts = {tuple(np.asarray(want.tokens[r])[~np.asarray(want.loss_mask[r])].tolist()) for r in range(0, 12, 3)}
    assert len(prompts) > 1  # the groups' observations differ
    chex.assert_trees_all_equal(got.replace(logprobs=None), want.replace(logprobs=None))
    chex.assert_trees_all_close(got.logprobs, want.logprobs, atol=1e-5)


def test_each_distinct_first_observation_prefilled_once_equals_every_row_prefilling_it(tok, tiny_model,
                                                                                         monkeypatch):
    """One-turn episodes whose seeds render few texts (BanditPairs: 12 name pairs x 2 orders): each
    distinct first observation is prefilled once and copied to its groups, found at run time. Truth:
    every row prefilling the prefix and its observation itself (`shared_prefix=False`): the same sampled
    tokens, log-probs within float32 rounding. A spy records the batch of every prefill that RAN."""
    from ragen_jax.rollout import sampler

    te = _text_env(tok, "BanditPairs", max_turns=1, max_response_tokens=8)
    ran, extend = [], sampler.extend

    def spy(model, cache, tokens, valid):
        jax.debug.callback(lambda: ran.append(tokens.shape[0]))
        return extend(model, cache, tokens, valid)

    monkeypatch.setattr(sampler, "extend", spy)
    params, key, seeds = nnx.state(tiny_model), jax.random.PRNGKey(5), np.arange(40, 104)
    cfg = RolloutConfig(num_groups=64, group_size=1, max_context=512, temperature=1.0)
    want = jax.device_get(Rollout(tiny_model, te, dataclasses.replace(cfg, shared_prefix=False))(params, key, seeds))
    prompts = [tuple(np.asarray(want.tokens[r])[~np.asarray(want.loss_mask[r])].tolist()) for r in range(64)]
    assert 1 < len(set(prompts)) < 48  # seeds share texts; fewer than the room made for them
    ro = Rollout(tiny_model, te, cfg)
    assert ro.share_first and ro.first_rows == te.distinct_first_segments == 48
    got = jax.device_get(ro(params, key, seeds))
    assert ran == [48]  # one prefill of 48 rows, not 64
    chex.assert_trees_all_equal(got.replace(logprobs=None), want.replace(logprobs=None))
    chex.assert_trees_all_close(got.logprobs, want.logprobs, atol=1e-5)
    off = Rollout(tiny_model, te, dataclasses.replace(cfg, distinct_first=False))
    assert off.first_rows == 64 and not off.share_first  # one row per group: nothing to share


@pytest.mark.parametrize("name,texts", [("Bandit", 2), ("BanditPairs", 24), ("BanditPairsTest", 16),
                                        ("FrozenLake", None)])
def test_distinct_first_segments_bounds_what_start_states_render(tok, name, texts):
    """The count the rollout makes room for is never below the distinct turn-1 segments of 600 start
    states (rendered in-graph, counted on the host); for the Bandits the texts are their arm orders x
    name pairs."""
    te = _text_env(tok, name, max_turns=1)
    seeds = jnp.arange(600)
    ids, length = jax.jit(lambda s: jax.vmap(te.render_ids, in_axes=(0, None, None, None, None))(
        te.reset_rows(s), 1, te.max_actions_per_episode, 0.0, True))(seeds)
    distinct = {tuple(np.asarray(i)[:n].tolist()) for i, n in zip(ids, length)}
    assert len(distinct) <= te.distinct_first_segments
    if texts is not None:
        assert len(distinct) == texts
        assert te.distinct_first_segments == 2 * texts  # x the two action-count tails (0 or 1 left)


def test_groups_per_pass_must_divide_the_groups(tok):
    with pytest.raises(ValueError, match="groups_per_pass must be 0 .* or a divisor of num_groups = 4, got 3"):
        RolloutConfig(num_groups=4, groups_per_pass=3)


def test_bad_settings_are_rejected(tok):
    te = _text_env(tok, "Bandit", max_turns=1, max_response_tokens=8)
    with pytest.raises(ValueError, match="max_context"):
        Rollout(ScriptedPolicy(np.zeros((1, 1, 1))), te, RolloutConfig(num_groups=1, group_size=1, max_context=8))
    with pytest.raises(ValueError, match="group_size"):
        RolloutConfig(group_size=0)
    ro = Rollout(ScriptedPolicy(np.zeros((2, 1, 1))), te, RolloutConfig(num_groups=2, group_size=1, max_context=512))
    with pytest.raises(ValueError, match="group_seeds"):
        ro(None, jax.random.PRNGKey(0), np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="params do not match"):  # another model's parameters
        ro(nnx.state(ScriptedPolicy(np.zeros((2, 1, 3)))), jax.random.PRNGKey(0), np.array([1, 2]))


def test_teacher_mode_writes_the_teacher_tokens_without_a_model(tok):
    te = _text_env(tok, "Sokoban", max_turns=2, max_response_tokens=16)
    ids = tok.encode(" go</think><answer>Up || Left</answer>", add_special_tokens=False) + [IM_END]
    table = jnp.asarray(ids + [0] * (16 - len(ids)), jnp.int32)

    def teacher(state, turn, key):
        return table, jnp.int32(len(ids))

    cfg = RolloutConfig(num_groups=1, group_size=2, max_context=512)
    traj = Rollout(None, te, cfg, teacher=teacher)(None, jax.random.PRNGKey(0), np.array([4]))
    for r in range(2):
        turns = int(traj.num_turns[r])
        assert _sampled(traj, r) == ids * turns
        assert int(traj.num_format_errors[r]) == 0 and int(traj.num_actions[r]) == 2 * turns


def test_trajectories_shape_assertions(garbage):
    traj = garbage  # 6 rows, max_context 1024, 3 turns
    traj.assert_shapes(6, 1024, 3)
    with pytest.raises(AssertionError):
        traj.assert_shapes(6, 1024, 2)  # turn_end / turn_reward have max_turns columns
    with pytest.raises(AssertionError):
        traj.assert_shapes(6, 512, 3)
    with pytest.raises(AssertionError):
        traj.replace(length=traj.length.astype(jnp.float32)).assert_shapes(6, 1024, 3)
    with pytest.raises(AssertionError):
        traj.replace(success=traj.success.astype(jnp.int32)).assert_shapes(6, 1024, 3)
