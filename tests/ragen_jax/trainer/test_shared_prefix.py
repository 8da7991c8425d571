"""The prompt prefix every full-context record starts with is run through the model once per batch
(`StepPrograms(shared_prefix=P)`, `step.prefixed_forward`), not once per row.

Truth: the per-row computation (`shared_prefix=0`: every row's whole record through the model), on
the same records: per-token log-probs and entropies at EVERY column, critic values, and the loss and
gradients of the actor and critic updates, float32 within 1e-5 relative; and the LoRA model's adapter
gradients. The updates' truth is one pass (no micro-batches), computed once for the file: the
prompt-prefix and the group-shared updates, micro-batched or not, are each checked against it, and the
group-shared scoring against the first test's whole-row forward (the same compiled programs). A record
whose prefix differs from row 0's would be scored wrongly, so the rollout's records are checked to share
it (test_rollout covers the rollout side).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.experiment.config import Config
from ragen_jax.models import Qwen2, Qwen2Config, critic_from_policy
from ragen_jax.trainer.step import Batch, StepPrograms, StepSettings, sequence_logprobs, sequence_values

ROWS, T, P, VOCAB = 8, 40, 17, 97
RTOL, ATOL = 1e-5, 1e-6


def _records(seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (ROWS, T)).astype(np.int32)
    tokens[:, :P] = tokens[0, :P]  # the shared prompt prefix
    length = np.array([T, T - 3, P + 1, T, P + 7, T - 1, 25, 30], np.int32)  # row 2: one token after it
    valid = np.arange(T)[None, :] < length[:, None]
    mask = np.zeros((ROWS, T - 1), bool)
    for r in range(ROWS):
        mask[r, P:length[r] - 1] = rng.random(length[r] - 1 - P) < 0.8
    return jnp.asarray(tokens), jnp.asarray(valid), jnp.asarray(mask), rng


@pytest.fixture(scope="module")
def setup():
    model = Qwen2(Qwen2Config.from_preset("tiny").replace(vocab_size=VOCAB), rngs=nnx.Rngs(0))
    critic = critic_from_policy(model, nnx.Rngs(1))
    tokens, valid, mask, rng = _records()
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    graph, params = nnx.split(model)
    logp, _ = sequence_logprobs(graph, params, tokens, valid)
    batch = Batch(tokens=tokens, valid=valid, mask=mask, old_logp=logp + f(rng.normal(0, 0.3, logp.shape)),
                  ref_logp=logp + f(rng.normal(0, 0.2, logp.shape)), values=f(rng.normal(0, 1, mask.shape)),
                  advantages=f(rng.normal(0, 1, mask.shape)), returns=f(rng.normal(0, 1, mask.shape)),
                  row_weight=jnp.ones(ROWS, jnp.float32))
    return model, critic, batch


def _close(got, want, what):
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=RTOL, atol=ATOL, err_msg=what)


@pytest.fixture(scope="module")
def forwards(setup):
    """The jitted log-prob and value passes, the records an argument: the first test's programs are the
    group-shared scoring test's truths (one compile each)."""
    model, critic, _ = setup
    graph, _ = nnx.split(model)
    cgraph, _ = nnx.split(critic)

    def logprobs(p, tokens, valid, group, t, prefix, shape):
        groups = None if shape is None else (group, 2, shape)
        return sequence_logprobs(graph, p, tokens, valid, temperature=t, prefix=prefix, groups=groups)

    def values(p, tokens, valid, group, prefix, shape):
        groups = None if shape is None else (group, 2, shape)
        return sequence_values(cgraph, p, tokens, valid, prefix=prefix, groups=groups)

    return (jax.jit(logprobs, static_argnames=("t", "prefix", "shape")),
            jax.jit(values, static_argnames=("prefix", "shape")))


def test_logprobs_entropies_and_values_equal_the_per_row_forward_at_every_column(setup, forwards):
    model, critic, b = setup
    fn, values = forwards
    (_, params), (_, cparams) = nnx.split(model), nnx.split(critic)
    for temperature in (1.0, 0.7):
        _close(fn(params, b.tokens, b.valid, None, t=temperature, prefix=P, shape=None),
               fn(params, b.tokens, b.valid, None, t=temperature, prefix=0, shape=None),
               f"log-probs and entropies, temperature {temperature}")
    _close(values(cparams, b.tokens, b.valid, None, prefix=P, shape=None),
           values(cparams, b.tokens, b.valid, None, prefix=0, shape=None), "values")


def _config(micro: int) -> Config:
    cfg = Config()
    cfg.model.random_init = True
    cfg.rollout.num_groups, cfg.rollout.group_size = ROWS // 2, 2
    cfg.filter.value, cfg.batching.mini_batch_size, cfg.batching.micro_batch_size = 1.0, ROWS, micro
    cfg.loss.entropy_coef, cfg.loss.kl_coef = 0.01, 0.1
    return cfg.validate()


def _passes(setup, b, micro: int, prefix: int, shape):
    """The actor's and critic's ((loss, metrics), gradients) of the batch `b` (two groups of `N` rows)."""
    model, critic, _ = setup
    graph, params = nnx.split(model)
    cgraph, cparams = nnx.split(critic)
    cfg = _config(micro)
    cfg.rollout.num_groups, cfg.rollout.group_size = ROWS // N, N
    prog = StepPrograms(StepSettings.of(cfg.validate()), graph, cgraph, None, None, shared_prefix=prefix,
                        group_prefix=shape)
    assert (prog.micro_batch_groups(b) is not None) == (shape is not None)
    return jax.jit(prog.actor_value_and_grad)(params, b), jax.jit(prog.critic_value_and_grad)(cparams, b)


@pytest.fixture(scope="module")
def per_row(setup):
    """The records of the update tests (each group's rows share a beginning after the prompt prefix) and
    their truth: every row's whole record through the model (`shared_prefix=0`), in one pass (no
    micro-batches). The prompt-prefix passes and the group-shared ones, micro-batched or not, are
    each checked against it."""
    tokens, valid, mask = _group_records()
    b = setup[2].replace(tokens=tokens, valid=valid, mask=mask, group=jnp.arange(ROWS, dtype=jnp.int32) // N)
    return b, _passes(setup, b, 0, 0, None)


@pytest.mark.parametrize("micro", [0, 4])
def test_actor_and_critic_losses_and_gradients_equal_the_per_row_passes(setup, per_row, micro):
    b, (actor0, critic0) = per_row
    actor, critic_out = _passes(setup, b, micro, P, None)
    assert float(actor0[0][0]) != 0.0
    _close(actor, actor0, "actor loss, metrics, gradients")
    _close(critic_out, critic0, "critic loss, metrics, gradients")
    # The prefix's weights get their gradient from every row (the embedding rows of prefix-only ids).
    g = actor[1]["model"]["embed_tokens"]["embedding"]
    assert float(jnp.abs(g[b.tokens[0, 0]]).sum()) > 0


def test_lora_adapter_gradients_equal_the_per_row_pass(setup):
    from ragen_jax.models.lora import add_lora, lora_split

    _, _, b = setup
    lora = Qwen2(Qwen2Config.from_preset("tiny").replace(vocab_size=VOCAB), rngs=nnx.Rngs(0))
    add_lora(lora, rank=4, alpha=8.0, rngs=nnx.Rngs(5))
    graph, trainable, frozen = lora_split(lora)
    # B starts at zero (no gradient into A): perturb it so every adapter leaf has a gradient.
    trainable = jax.tree.map(lambda x: x + 0.01 * jax.random.normal(jax.random.PRNGKey(2), x.shape, x.dtype), trainable)
    out = {}
    for prefix in (P, 0):
        prog = StepPrograms(StepSettings.of(_config(0)), graph, None, None, None, shared_prefix=prefix)
        out[prefix] = jax.jit(prog.actor_value_and_grad)(trainable, b, frozen)
    _close(out[P], out[0], "LoRA actor loss, metrics, adapter gradients")


# ------------------------------------------------------------------ each group's beginning run once
N = 4  # rows per group: rows 0-3 and 4-7
SHARED = (P + 9, P)  # group 0's rows share 9 tokens after the prompt prefix; in group 1 one row parts at once


def _group_records():
    tokens, valid, mask, rng = _records(1)
    tokens = np.array(tokens)
    tokens[:N, P:SHARED[0]] = tokens[0, P:SHARED[0]]
    tokens[N:, P:P + 3] = tokens[N, P:P + 3]
    tokens[N + 2, P] = (tokens[N, P] + 1) % VOCAB  # parts right after the prompt prefix
    return jnp.asarray(tokens), valid, mask


def test_group_split_is_read_from_the_rows():
    from ragen_jax.trainer.group_prefix import GroupShape, split_groups

    tokens, valid, _ = _group_records()
    group = jnp.arange(ROWS, dtype=jnp.int32) // N
    rows = split_groups(tokens, valid, group, 2, GroupShape(width=P + 12, tail=T - P))
    assert bool(rows.fits)
    # Hand-computed: group 0 shares P + 9 tokens (row 2 has P + 1 valid tokens: it shares P + 1).
    assert rows.group_len.tolist() == [P + 1, SHARED[1]]
    np.testing.assert_array_equal(np.asarray(rows.tail_ids[1, :3]), np.asarray(tokens[1, P + 1:P + 4]))
    assert not bool(split_groups(tokens, valid, group, 2, GroupShape(width=P + 12, tail=10)).fits)


@pytest.mark.parametrize("tail", [T - P, 10])  # 10: the rows do not fit, the prompt-prefix path runs
def test_group_shared_scoring_equals_the_per_row_forward(setup, forwards, tail):
    """Against the whole rows' forward (`prefix=0`): the first test's programs, shared."""
    from ragen_jax.trainer.group_prefix import GroupShape

    model, critic, _ = setup
    fn, values = forwards
    tokens, valid, _ = _group_records()
    group, shape = jnp.arange(ROWS, dtype=jnp.int32) // N, GroupShape(width=P + 12, tail=tail)
    (_, params), (_, cparams) = nnx.split(model), nnx.split(critic)
    _close(fn(params, tokens, valid, group, t=0.7, prefix=P, shape=shape),
           fn(params, tokens, valid, None, t=0.7, prefix=0, shape=None), "log-probs and entropies")
    _close(values(cparams, tokens, valid, group, prefix=P, shape=shape),
           values(cparams, tokens, valid, None, prefix=0, shape=None), "values")


@pytest.mark.parametrize("micro", [0, 4])
def test_group_shared_update_equals_the_per_row_passes(setup, per_row, micro):
    from ragen_jax.trainer.group_prefix import GroupShape

    b, want = per_row
    grouped = _passes(setup, b, micro, P, GroupShape(width=P + 12, tail=T - P))
    _close(grouped, want, "actor and critic loss, metrics, gradients")


def test_after_adds_a_dependency_and_nothing_else():
    """`step.after`, which chains the group-shared passes (several processes, gloo): the values are
    the input's whatever the dependency holds (NaN and inf included), and the compiled program still
    reads the dependency (not folded away as a multiplication by 0)."""
    import re

    from ragen_jax.trainer.step import after

    x = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
    for d in ([1.0, 2.0, 3.0, 4.0], [np.nan, 1.0, 0.0, 0.0], [np.inf, -np.inf, 0.0, 0.0], [-3.5, 0.0, 0.0, 1e30]):
        np.testing.assert_array_equal(np.asarray(jax.jit(after)(x, jnp.asarray(d, jnp.float32))), np.asarray(x))
    text = jax.jit(after).lower(x, jnp.ones(4)).compile().as_text()
    (dep,) = re.findall(r"(%\S+) = f32\[4\]\S* parameter\(1\)", text)
    assert sum(dep in line for line in text.splitlines()) >= 2, text  # declared, then read
