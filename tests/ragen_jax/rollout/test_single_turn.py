"""RAGEN-2's single-turn context window (`prompt.context_window_mode="single_turn"`, window 1): every turn
is generated from the prompt prefix and its own state only, and the trainer scores it that way.

Independent truths: each turn's context is re-encoded from its host text (prefix + the first-turn
form of the segment, "(Turn k):"), and each turn's log-probs are recomputed by a plain full forward
of that standalone sequence, with no cache and no prefix sharing.

The model has the task vocabulary (models.vocab_map, as the CPU demo): single-turn scoring is the same
code for either vocabulary, and with Qwen's 151,665 logits per position the turn-block gradient test
alone held ~13 GB and the file cost minutes of CPU; both sides of every comparison map ids the same way.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import envs_jax
from ragen_jax.models import Qwen2, Qwen2Config, critic_from_policy
from ragen_jax.models.vocab_map import VocabMap
from ragen_jax.rollout import Rollout, RolloutConfig
from ragen_jax.rollout.rollout import turn_blocks
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.text.tokenizer import load_tokenizer
from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.trainer.step import sequence_logprobs, sequence_values
from ragen_jax.trainer.turn_blocks import TurnBlocks

SINGLE = dict(context_window_mode="single_turn", max_context_window=1)


@pytest.fixture(scope="module")
def setup():
    tok = load_tokenizer()
    env, params = envs_jax.make("FrozenLake")
    pc = PromptConfig(max_turns=4, max_actions_per_turn=1, think=False, max_response_tokens=6, **SINGLE)
    text_env = TextEnv(env, params, tok, pc)
    vm = VocabMap.for_text_envs([text_env], tok)
    model = Qwen2(Qwen2Config.from_preset("tiny").replace(vocab_size=vm.size), rngs=nnx.Rngs(0))
    # Temperature 1.5: answers vary, some fail to parse, episodes end at different turns.
    ro = Rollout(model, text_env, RolloutConfig(num_groups=2, group_size=4, max_context=512, temperature=1.5),
                 vocab=vm)
    graphdef, params_ = nnx.split(model)
    traj = ro(params_, jax.random.PRNGKey(1), np.array([3, 8], np.int32))
    return text_env, model, graphdef, params_, ro, jax.device_get(traj)


def _turns(traj, b):
    """(start, stop) of each taken turn's block in row b."""
    starts = [int(s) for s in traj.turn_start[b] if s >= 0]
    stops = starts[1:] + [int(traj.length[b])]
    return list(zip(starts, stops))


def _standalone(traj, p_len, width):
    """Every taken turn of every row as its own sequence, prefix + block, end-padded to p_len + width
    (not valid there; causal, so the block's positions never see the padding): one compiled forward
    for all turns, not one program per block length. -> (ids, valid, [(row, start, stop)])."""
    seqs, valid, where = [], [], []
    for b in range(traj.tokens.shape[0]):
        row = np.asarray(traj.tokens[b])
        for s, e in _turns(traj, b):
            assert e - s <= width
            seq = np.full(p_len + width, row[0], np.int32)
            seq[:p_len + e - s] = np.concatenate([row[:p_len], row[s:e]])
            seqs.append(seq)
            valid.append(np.arange(p_len + width) < p_len + e - s)
            where.append((b, s, e))
    return jnp.asarray(np.stack(seqs)), jnp.asarray(np.stack(valid)), where


def test_every_turn_sees_only_the_prefix_and_its_own_state(setup):
    text_env, *_ , traj = setup
    tok = text_env.tokenizer
    prefix = np.asarray(text_env.prefix_ids)
    assert (np.asarray(traj.num_turns) > 1).any()  # multi-turn episodes are exercised
    for b in range(traj.tokens.shape[0]):
        row = np.asarray(traj.tokens[b])
        np.testing.assert_array_equal(row[:len(prefix)], prefix)
        for k, (s, e) in enumerate(_turns(traj, b)):
            block = row[s:e]
            text = tok.decode(block.tolist())
            # No reward message, no earlier turn: the first-turn form with RAGEN-2's "(Turn k):" label.
            assert text.startswith(f"(Turn {k + 1}):\nState:\n"), text[:40]
            assert "Reward:" not in text and "<|im_start|>user" not in text
            sampled = np.asarray(traj.loss_mask[b, s:e])
            seg_len = int(np.argmax(sampled)) if sampled.any() else len(block)
            # The segment is the exact encoding of its host text (what RAGEN-2 would show this turn).
            head = tok.decode(block[:seg_len].tolist())
            assert tok.encode(head, add_special_tokens=False) == block[:seg_len].tolist()
            assert head.endswith("<|im_start|>assistant\n<answer>")


def test_trainer_logprobs_equal_sampling_logprobs_and_a_standalone_forward(setup):
    text_env, model, graphdef, params, ro, traj = setup
    p_len, width = turn_blocks(text_env)
    t = jnp.asarray(traj.tokens)
    valid = jnp.arange(t.shape[1])[None, :] < jnp.asarray(traj.length)[:, None]
    blocks = TurnBlocks(start=jnp.asarray(traj.turn_start), prefix=p_len, width=width)
    temp = ro.config.temperature  # the sampler records log-probs of softmax(logits / T)
    logp, ent = jax.jit(lambda p: sequence_logprobs(graphdef, p, t, valid, vocab=ro.vocab, temperature=temp,
                                                    blocks=blocks))(params)
    logp, ent = np.asarray(logp), np.asarray(ent)
    mask = np.asarray(traj.loss_mask)[:, 1:]
    assert mask.sum() > 20
    # 1) the trainer's single-turn scoring = what the sampler recorded (KV cache rewound every turn)
    np.testing.assert_allclose(logp[mask], np.asarray(traj.logprobs)[:, 1:][mask], atol=2e-4)
    # 2) = a plain forward of each turn's standalone sequence prefix + block (no cache, no sharing)
    seqs, seq_valid, where = _standalone(traj, p_len, width)
    lps, ens = jax.device_get(jax.jit(lambda p, x, v: sequence_logprobs(
        graphdef, p, x, v, vocab=ro.vocab, temperature=temp))(params, seqs, seq_valid))
    for (b, s, e), lp, en in zip(where, lps, ens):
        cols = np.arange(s, e - 1)  # record columns of the block's targets 2..n
        np.testing.assert_allclose(logp[b, cols], lp[p_len:p_len + e - s - 1], atol=2e-4)
        np.testing.assert_allclose(ent[b, cols], en[p_len:p_len + e - s - 1], atol=2e-4)
    # 3) and differs from scoring the concatenated conversation (what "full" mode would train)
    whole, _ = jax.jit(lambda p: sequence_logprobs(graphdef, p, t, valid, vocab=ro.vocab, temperature=temp))(params)
    later = mask & (np.arange(mask.shape[1])[None, :] > np.asarray(traj.turn_start)[:, 1:2])
    assert later.any() and np.abs(np.asarray(whole)[later] - logp[later]).max() > 1e-2


def test_critic_values_of_a_turn_come_from_its_standalone_sequence(setup):
    text_env, model, graphdef, params, ro, traj = setup
    critic = critic_from_policy(model, nnx.Rngs(4))
    cgraph, cparams = nnx.split(critic)
    p_len, width = turn_blocks(text_env)
    t = jnp.asarray(traj.tokens)
    valid = jnp.arange(t.shape[1])[None, :] < jnp.asarray(traj.length)[:, None]
    blocks = TurnBlocks(start=jnp.asarray(traj.turn_start), prefix=p_len, width=width)
    # Compiled, both sides (op by op each was seconds of tiny-program compiles); every row's turns.
    v = np.asarray(jax.jit(lambda c: sequence_values(cgraph, c, t, valid, vocab=ro.vocab, blocks=blocks))(cparams))
    seqs, seq_valid, where = _standalone(traj, p_len, width)
    refs = np.asarray(jax.jit(lambda c, x, ok: nnx.merge(cgraph, c)(ro.vocab.model_ids(x), ok))(
        cparams, seqs, seq_valid))
    assert max(e - s for _, s, e in where) > 1
    for (b, s, e), ref in zip(where, refs):
        np.testing.assert_allclose(v[b, s:e - 1], ref[p_len:p_len + e - s - 1], atol=2e-4)


def test_the_cache_holds_one_turn_and_full_mode_is_unchanged(setup):
    text_env, model, graphdef, params, ro, traj = setup
    p_len, width = turn_blocks(text_env)
    assert ro.cache_len == p_len + width < ro.config.max_context
    full_env = TextEnv(text_env.env, text_env.env_params, text_env.tokenizer,
                       dataclasses.replace(text_env.config, context_window_mode="full", max_context_window=-1))
    full = Rollout(model, full_env, ro.config, vocab=ro.vocab)
    assert full.cache_len == ro.config.max_context
    ft = jax.device_get(full(params, jax.random.PRNGKey(1), np.array([3, 8], np.int32)))
    # The first turn is the same in both modes but for the label: "Turn 1:" instead of "(Turn 1):".
    tok = text_env.tokenizer
    s = int(ft.turn_start[0, 0])
    assert s == p_len and tok.decode(np.asarray(ft.tokens[0, s:s + 4]).tolist()).startswith("Turn 1:")
    second = int(ft.turn_start[0, 1]) if ft.turn_start[0, 1] >= 0 else None
    if second is not None:
        assert "Reward:" in tok.decode(np.asarray(ft.tokens[0, second:second + 12]).tolist())


def test_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="max_context_window must be 1"):
        load_config("tiny_cpu.py", ["prompt.context_window_mode=single_turn"])
    with pytest.raises(ConfigError, match="limited_multi_turn"):
        load_config("tiny_cpu.py", ["prompt.context_window_mode=limited_multi_turn"])
    with pytest.raises(ConfigError, match="env.mix"):
        load_config("mix_cpu.py", ["prompt.context_window_mode=single_turn", "prompt.max_context_window=1"])


def test_single_turn_demonstrations_become_one_row_per_turn():
    """Hand-made record: prefix [1 2 3], turn 1 = [10 11 | 12] (segment | answer), turn 2 = [20 | 21]."""
    from ragen_jax.text.tokenizer import ENDOFTEXT
    from ragen_jax.trainer.sft import unfold_turn_rows

    tokens = np.array([[1, 2, 3, 10, 11, 12, 20, 21, 0], [1, 2, 3, 30, 31, 32, 0, 0, 0]], np.int32)
    mask = np.zeros(tokens.shape, bool)
    mask[0, [5, 7]] = True
    mask[1, 5] = True
    rows, rmask, n = unfold_turn_rows(tokens, mask, np.array([8, 6]), np.array([[3, 6, -1], [3, -1, -1]]), 3,
                                     width=3, pad_id=ENDOFTEXT)
    p = ENDOFTEXT
    np.testing.assert_array_equal(rows, [[1, 2, 3, 10, 11, 12], [1, 2, 3, 20, 21, p], [1, 2, 3, 30, 31, 32]])
    np.testing.assert_array_equal(n, [6, 5, 6])
    np.testing.assert_array_equal(rmask, [[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1]])
    # Blocks wider than any turn: the same rows, no wider than the longest (SFT pads batches to it).
    wide = unfold_turn_rows(tokens, mask, np.array([8, 6]), np.array([[3, 6, -1], [3, -1, -1]]), 3,
                            width=5, pad_id=ENDOFTEXT)
    for x, y in zip(wide, (rows, rmask, n)):
        np.testing.assert_array_equal(x, y)


def test_untaken_turn_blocks_are_skipped_exactly(setup):
    """`TurnBlocks.skip_untaken` (the default) skips the chunks of block rows past the last taken turn.
    Truth: the plain pass over every block, log-probs, entropies, values and the gradient of a
    masked loss through them; and the fixture leaves at least one whole chunk untaken."""
    text_env, model, graphdef, params, ro, traj = setup
    p_len, width = turn_blocks(text_env)
    t = jnp.asarray(traj.tokens)
    # Record b keeps its first 1 + b % m turns (as if its episode had ended there): 20 of 32 blocks.
    start = np.asarray(traj.turn_start).copy()
    k, m = start.shape
    length = np.asarray(traj.length).copy()
    for b in range(k):
        n = 1 + b % m
        if n < m:
            length[b] = start[b, n]
            start[b, n:] = -1
    assert (start >= 0).sum() <= (m - 1) * k  # at least one chunk of k blocks is skipped
    valid = jnp.arange(t.shape[1])[None, :] < jnp.asarray(length)[:, None]
    start = jnp.asarray(start)
    mask = jnp.asarray(traj.loss_mask)[:, 1:] & valid[:, 1:]
    temp = ro.config.temperature
    critic = critic_from_policy(model, nnx.Rngs(4))
    cgraph, cparams = nnx.split(critic)

    def run(skip):
        blocks = TurnBlocks(start=start, prefix=p_len, width=width, skip_untaken=skip)

        def loss(p):
            lp, en = sequence_logprobs(graphdef, p, t, valid, vocab=ro.vocab, temperature=temp, blocks=blocks)
            return jnp.sum(jnp.where(mask, lp + 0.1 * en, 0.0)), (lp, en)

        (_, (lp, en)), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        v = jax.jit(lambda c: sequence_values(cgraph, c, t, valid, vocab=ro.vocab, blocks=blocks))(cparams)
        return jax.device_get((lp, en, v, g))

    lp, en, v, g = run(True)
    lp0, en0, v0, g0 = run(False)
    np.testing.assert_allclose(lp, lp0, atol=1e-5)
    np.testing.assert_allclose(en, en0, atol=1e-5)
    np.testing.assert_allclose(v, v0, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    assert max(float(np.abs(a).max()) for a in jax.tree.leaves(g)) > 1e-3  # the gradient is not trivially 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=6, max_size=6), st.sampled_from([1, 2, 3, 4, 6]), st.sampled_from([1, 2, 3]))
def test_over_taken_blocks_computes_every_taken_row_and_skips_whole_untaken_chunks(turns, n_chunks, shards):
    """Rows of 6 records x 4 turn slots (record r took `turns[r]` turns), in `shards` data-parallel
    parts. Truth: `fn` on every row for taken rows; a skipped row reads 0 (fn returns 1 + its id, never
    0), and exactly the chunks past the last taken row of the fullest part are skipped."""
    from ragen_jax.trainer.turn_blocks import over_taken_blocks

    taken = np.array([[j < n for j in range(4)] for n in turns]).reshape(-1)
    ok = jnp.asarray(np.repeat(taken[:, None], 3, axis=1))
    ids = jnp.arange(24 * 3, dtype=jnp.int32).reshape(24, 3)
    out = np.asarray(over_taken_blocks(lambda i, o: 1.0 + i[:, 0].astype(jnp.float32), ids, ok, n_chunks, shards))
    plain = 1.0 + np.arange(24) * 3
    np.testing.assert_array_equal(out[taken], plain[taken])
    if n_chunks == 1 or 24 % (n_chunks * shards):
        computed = 24  # the plain pass
    else:
        c = 24 // shards // n_chunks
        fullest = taken.reshape(shards, -1).sum(axis=1).max()
        computed = -(-int(fullest) // c) * c * shards  # whole chunks up to the fullest part's last taken row
    assert int((out != 0).sum()) == computed
    assert set(np.flatnonzero(out == 0)) <= set(np.flatnonzero(~taken))


def test_skipping_keeps_the_rows_partitioned_over_data_parallel_devices(setup):
    """Rows sharded over the 8 simulated devices (`shards=8`: each device compacts its own rows).
    Truths: the plain pass's numbers, and its per-device work: XLA's cost analysis counts a loop body
    once, so one chunk's per-device FLOPs times the chunks must equal the plain pass's per-device
    FLOPs; a compaction across devices (`shards=1`) would run every chunk whole on every device."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    text_env, *_, traj = setup
    # Qwen's full vocabulary here (the trajectory's tokens are Qwen ids): the FLOPs identity holds where
    # the per-block work dominates, as Qwen's 151,665-way head does; with the task vocabulary the work
    # outside the chunk loop (the shared prefix) is a third of the pass. Forward only: no gradient.
    model = Qwen2(Qwen2Config.from_preset("tiny").replace(vocab_size=len(text_env.tokenizer)), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    p_len, width = turn_blocks(text_env)
    k, m = traj.turn_start.shape
    assert jax.device_count() == 8 == k
    start = np.asarray(traj.turn_start).copy()
    length = np.asarray(traj.length).copy()
    for b in range(k):
        n = 1 + b % m
        if n < m:
            length[b], start[b, n:] = start[b, n], -1
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    t = jax.device_put(jnp.asarray(traj.tokens), rows)
    valid = jax.device_put(jnp.arange(t.shape[1])[None, :] < jnp.asarray(length)[:, None], rows)
    start = jax.device_put(jnp.asarray(start), rows)

    def compiled(skip, shards):
        def f(p, t, valid, start):
            blocks = TurnBlocks(start=start, prefix=p_len, width=width, skip_untaken=skip, shards=shards)
            return sequence_logprobs(graphdef, p, t, valid, blocks=blocks)[0]
        return jax.jit(f).lower(params, t, valid, start).compile()

    def flops(c):
        cost = c.cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    plain, local, across = compiled(False, 1), compiled(True, 8), compiled(True, 1)
    np.testing.assert_allclose(np.asarray(local(params, t, valid, start)), np.asarray(plain(params, t, valid, start)),
                               atol=1e-5)
    assert flops(local) * m == pytest.approx(flops(plain), rel=0.1)
    assert flops(across) * m > 4 * flops(plain)
