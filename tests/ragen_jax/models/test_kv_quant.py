"""The int8 KV cache (`rollout.kv_cache_quant=int8`, models/qwen2/model.py `quantize_kv`): codes and
per-token, per-head scales against numpy's rounding; a cache filled by prefill + decode against the float
cache filled by the same steps (every stored key/value within half a step of the float one); the
logits of those steps within a stated tolerance of the float cache's; and the config knob."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import KVCache, Qwen2, Qwen2Config
from ragen_jax.models.qwen2.model import dequantize_kv, quantize_kv

CFG = Qwen2Config.from_preset("tiny")


def test_codes_and_scales_are_numpys_rounding_per_token_and_head():
    x = np.random.default_rng(0).normal(0, 1.5, (2, 3, 4, 16)).astype(np.float32)  # [B, S, heads, D]
    x[1, 2, 3] = 0.0  # an all-zero vector: scale 0, codes 0, dequantized 0
    q, scale = quantize_kv(jnp.asarray(x))
    s = np.abs(x).max(-1) / np.float32(127)
    want = np.clip(np.round(x / np.where(s == 0, 1, s)[..., None]), -127, 127).astype(np.int8)
    assert q.dtype == jnp.int8 and scale.shape == (2, 3, 4) and scale.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(scale), s, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(np.asarray(q), want)
    np.testing.assert_allclose(np.asarray(dequantize_kv(q, scale)), want * s[..., None], rtol=1e-6, atol=0)
    assert np.abs(np.asarray(dequantize_kv(q, scale)) - x).max() <= np.max(s) / 2 * (1 + 1e-5)
    _, bf = quantize_kv(jnp.asarray(x), jnp.bfloat16)  # a bfloat16 cache stores bfloat16 scales
    assert bf.dtype == jnp.bfloat16 and dequantize_kv(q, bf).dtype == jnp.bfloat16


@functools.partial(jax.jit, static_argnums=(0, 3))
def _steps(graphdef, params, tokens, quant):
    """Prefill 5 tokens of each row (row 1 left-padded by 2), then decode the rest one at a time: the
    logits of every step and the final cache."""
    model = nnx.merge(graphdef, params)
    valid = jnp.ones(tokens.shape, bool).at[1, :2].set(False)
    cache = KVCache.init(model.cfg, tokens.shape[0], 16, "float32", quant=quant)
    hidden, cache = model(tokens[:, :5], valid[:, :5], cache)
    out = [model.logits(hidden)]
    for t in range(5, tokens.shape[1]):
        hidden, cache = model(tokens[:, t:t + 1], valid[:, t:t + 1], cache)
        out.append(model.logits(hidden))
    return jnp.concatenate(out, axis=1), cache


def test_int8_cache_against_the_float_cache():
    model = Qwen2(CFG, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 7)), jnp.int32)
    want, ref = _steps(graphdef, params, tokens, "none")
    got, cache = _steps(graphdef, params, tokens, "int8")
    assert ref.k_scale is None and ref.k.dtype == jnp.float32  # "none": the float cache as before
    assert cache.k.dtype == jnp.int8 and cache.k_scale.shape == cache.k.shape[:-1]
    np.testing.assert_array_equal(np.asarray(cache.end), np.asarray(ref.end))
    # Layer 0's keys/values depend on the tokens alone, so each stored one is the float cache's within
    # half a step of its own scale (slots never written: 0 in both); later layers read the rounded
    # cache of the layers before them.
    for q, s, f in ((cache.k, cache.k_scale, ref.k), (cache.v, cache.v_scale, ref.v)):
        err = np.abs(np.asarray(dequantize_kv(q[0], s[0])) - np.asarray(f[0]))
        assert np.all(err <= np.asarray(s[0])[..., None] / 2 * (1 + 1e-4) + 1e-7)
    # The logits through the int8 cache (each step reads the earlier steps' rounded keys/values):
    # within 2% of the float cache's largest logit, and the same argmax on every step and row.
    want, got = np.asarray(want), np.asarray(got)
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_the_config_knob():
    from ragen_jax.experiment.config import ConfigError, load_config

    assert load_config("tiny_cpu.py", []).rollout.kv_cache_quant == "none"
    assert load_config("tiny_cpu.py", ["rollout.kv_cache_quant=int8"]).rollout.kv_cache_quant == "int8"
    with pytest.raises(ConfigError, match="rollout.kv_cache_quant='int4' is not valid; choose one of 'none', 'int8'"):
        load_config("tiny_cpu.py", ["rollout.kv_cache_quant=int4"])
    with pytest.raises(ValueError, match="unknown KV cache quantization 'int4'"):
        KVCache.init(CFG, 1, 4, quant="int4")


def test_a_rollout_samples_through_the_int8_cache():
    """A multi-turn FrozenLake rollout with rollout.kv_cache_quant=int8 (prefix broadcast, per-turn
    prefill and decode on the int8 cache): the log-probs it records against the trainer's plain forward
    of the same conversations (no cache): above float noise (the cache is really int8; the float cache's
    gap is below 1e-4, test_single_turn.py) and within 0.05 per token."""
    import envs_jax
    from ragen_jax.models.vocab_map import VocabMap
    from ragen_jax.rollout import Rollout, RolloutConfig
    from ragen_jax.text import PromptConfig, TextEnv
    from ragen_jax.text.tokenizer import load_tokenizer
    from ragen_jax.trainer.step import sequence_logprobs

    tok = load_tokenizer()
    env, params = envs_jax.make("FrozenLake")
    text_env = TextEnv(env, params, tok, PromptConfig(max_turns=2, max_actions_per_turn=1, think=False,
                                                      max_response_tokens=6))
    vm = VocabMap.for_text_envs([text_env], tok)
    model = Qwen2(CFG.replace(vocab_size=vm.size), rngs=nnx.Rngs(0))
    ro = Rollout(model, text_env, RolloutConfig(num_groups=2, group_size=2, max_context=384, temperature=1.5,
                                                kv_cache_quant="int8"), vocab=vm)
    graphdef, state = nnx.split(model)
    traj = jax.device_get(ro(state, jax.random.PRNGKey(1), np.array([3, 8], np.int32)))
    t = jnp.asarray(traj.tokens)
    valid = jnp.arange(t.shape[1])[None, :] < jnp.asarray(traj.length)[:, None]
    logp, _ = jax.jit(lambda p: sequence_logprobs(graphdef, p, t, valid, vocab=vm, temperature=1.5))(state)
    mask = np.asarray(traj.loss_mask)[:, 1:]
    assert mask.sum() > 10
    gap = np.abs(np.asarray(logp)[mask] - np.asarray(traj.logprobs)[:, 1:][mask])
    assert 1e-4 < gap.max() <= 0.05, gap.max()
