"""Micro-batches with gradient accumulation (`batching.micro_batch_size`, `sft.micro_batch_size`) change
memory, not the optimizer step: the loss, metrics and gradients accumulated over k micro-batches
equal those of one pass over the whole mini-batch, for every `loss_agg` mode (token-mean weighs the
micro-batches by their masked tokens, the seq-mean modes by their rows), for the critic, the whole
update program and the SFT step. The truth is the single pass with the losses' own denominators
(`agg_loss` with no `norm`), computed here independently of the trainer's accumulation code."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.algorithms import losses as loss_lib
from ragen_jax.algorithms.losses import LOSS_AGG_MODES
from ragen_jax.models import Qwen2, Qwen2Config, critic_from_policy
from ragen_jax.experiment.config import Config, ConfigError, load_config
from ragen_jax.trainer.optim import make_optimizer
from ragen_jax.trainer.sft import SFTTrainer, sft_loss
from ragen_jax.trainer.step import (Batch, StepPrograms, StepSettings, TrainState, accumulated_value_and_grad,
                                    in_consecutive_blocks, join_rows, sequence_logprobs, sequence_values, split_rows)

ROWS, T, VOCAB = 8, 24, 97
RTOL, ATOL = 2e-5, 1e-6  # float32 sums in another order


def _model():
    return Qwen2(Qwen2Config.from_preset("tiny").replace(vocab_size=VOCAB), rngs=nnx.Rngs(0))


def _config(loss_agg: str, micro: int, kl: bool) -> Config:
    cfg = Config()
    cfg.model.random_init = True
    cfg.rollout.num_groups, cfg.rollout.group_size = ROWS // 2, 2
    cfg.filter.value, cfg.batching.mini_batch_size, cfg.batching.micro_batch_size = 1.0, ROWS, micro
    a = cfg.loss
    a.agg = loss_agg
    a.entropy_coef = 0.01  # large enough that the entropy gradient matters
    a.kl_coef, a.kl_type = (0.1, "k3") if kl else (0.0, "k3")
    return cfg.validate()


def _batch(model, seed=0) -> Batch:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (ROWS, T)).astype(np.int32)
    length = np.array([T, T - 3, 10, T, 7, T - 1, 15, 20], np.int32)
    valid = np.arange(T)[None, :] < length[:, None]
    mask = np.zeros((ROWS, T - 1), bool)
    for r in range(ROWS):  # ragged numbers of sampled tokens; row 4 trains nothing
        if r != 4:
            lo = rng.integers(1, length[r] // 2)
            mask[r, lo:length[r] - 1] = rng.random(length[r] - 1 - lo) < 0.8
    graph, params = nnx.split(model)
    logp, _ = sequence_logprobs(graph, params, jnp.asarray(tokens), jnp.asarray(valid))
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return Batch(tokens=jnp.asarray(tokens), valid=jnp.asarray(valid), mask=jnp.asarray(mask),
                 old_logp=logp + f(rng.normal(0, 0.3, logp.shape)),  # ratios off 1: the clips bind somewhere
                 ref_logp=logp + f(rng.normal(0, 0.2, logp.shape)),
                 values=f(rng.normal(0, 1, mask.shape)), advantages=f(rng.normal(0, 1, mask.shape)),
                 returns=f(rng.normal(0, 1, mask.shape)), row_weight=jnp.ones(ROWS, jnp.float32))


def _single_pass_actor(cfg, graph, params, b: Batch):
    """The truth: one pass over all rows, every loss with its own denominator."""
    a = cfg.loss

    def loss_fn(p):
        logp, ent = sequence_logprobs(graph, p, b.tokens, b.valid)
        pg, pm = loss_lib.ppo_policy_loss(logp, b.old_logp, b.advantages, b.mask, eps_low=a.eps_low,
                                          eps_high=a.eps_high, dual_clip=a.dual_clip, agg_mode=a.agg)
        e = loss_lib.entropy_loss(ent, b.mask, a.agg)
        loss = pg - a.entropy_coef * e
        m = {f"actor/{k}": v for k, v in pm.items()}
        m["actor/approx_kl"] = pm["ppo_kl"]
        m["actor/entropy"] = e
        if a.kl_coef > 0:
            kl = loss_lib.kl_loss(logp, b.ref_logp, b.mask, a.kl_type, a.agg)
            loss = loss + a.kl_coef * kl
            m["actor/kl_loss"] = kl
        return loss, m

    return jax.value_and_grad(loss_fn, has_aux=True)(params)


def _assert_close(got, want, what):
    gl, wl = jax.tree.leaves(got), jax.tree.leaves(want)
    assert jax.tree.structure(got) == jax.tree.structure(want), what
    for x, y in zip(gl, wl):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=RTOL, atol=ATOL, err_msg=what)


@pytest.fixture(scope="module")
def setup():
    model = _model()
    graph, params = nnx.split(model)
    critic = critic_from_policy(model, nnx.Rngs(1))
    cgraph, cparams = nnx.split(critic)
    return model, graph, params, cgraph, cparams, _batch(model)


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("micro", [2])  # 4 micro-batches (the update test covers one pass)
def test_actor_loss_and_gradient_equal_the_single_pass(setup, loss_agg, micro):
    _, graph, params, _, _, b = setup
    cfg = _config(loss_agg, micro, kl=True)
    prog = StepPrograms(StepSettings.of(cfg), graph, None, None, None)
    (loss, m), g = jax.jit(prog.actor_value_and_grad)(params, b)
    (loss0, m0), g0 = _single_pass_actor(cfg, graph, params, b)
    assert float(loss0) != 0.0 and float(m0["actor/pg_clipfrac"]) > 0  # a non-trivial case
    _assert_close(loss, loss0, "loss")
    _assert_close(m, m0, "metrics")
    _assert_close(g, g0, "gradients")


@pytest.mark.parametrize("micro", [1])  # 8 micro-batches of one row
def test_critic_loss_and_gradient_equal_the_single_pass(setup, micro):
    _, graph, _, cgraph, cparams, b = setup
    cfg = _config("token-mean", micro, kl=False)
    prog = StepPrograms(StepSettings.of(cfg), graph, cgraph, None, None)
    (loss, m), g = jax.jit(prog.critic_value_and_grad)(cparams, b)

    def truth(p):
        v = sequence_values(cgraph, p, b.tokens, b.valid)
        return loss_lib.value_loss(v, b.values, b.returns, b.mask, clip=cfg.loss.value_clip)

    (loss0, m0), g0 = jax.value_and_grad(truth, has_aux=True)(cparams)
    _assert_close(loss, loss0, "loss")
    _assert_close((m["critic/value_loss"], m["critic/vf_clipfrac"], m["critic/vpred_mean"]),
                  (m0["vf_loss"], m0["vf_clipfrac"], m0["vpred_mean"]), "metrics")
    _assert_close(g, g0, "gradients")


def test_update_program_with_micro_batches_takes_the_same_optimizer_steps(setup):
    # Two optimizer steps (mini-batch 4 of 8 rows) with a critic; micro-batches of 2 rows.
    _, graph, params, cgraph, cparams, b = setup
    out = []
    for micro in (0, 2):
        cfg = _config("seq-mean-token-mean", micro, kl=False)
        cfg.batching.mini_batch_size = 4
        opt = make_optimizer(1e-3, cfg.optim)
        prog = StepPrograms(StepSettings.of(cfg), graph, cgraph, opt, opt)
        state = TrainState(iteration=jnp.zeros((), jnp.int32), key=jax.random.PRNGKey(0), actor=params,
                           actor_opt=opt.init(params), critic=cparams, critic_opt=opt.init(cparams),
                           skipped_updates=jnp.zeros((), jnp.int32))
        out.append(jax.jit(prog.update)(state, b))
    (s1, m1), (s0, m0) = out[1], out[0]
    _assert_close((s1.actor_opt, s1.critic_opt), (s0.actor_opt, s0.critic_opt), "optimizer state")
    # Adam divides by sqrt(v): for a gradient within rounding of 0 its step (about lr * g / |g|)
    # amplifies the rounding, so the parameters agree to a tenth of the learning rate, not to float precision.
    for x, y in zip(jax.tree.leaves((s1.actor, s1.critic)), jax.tree.leaves((s0.actor, s0.critic))):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=0.1 * 1e-3)
    _assert_close(m1, m0, "metrics")


def test_split_rows_is_strided_and_join_rows_inverts_it():
    x = jnp.arange(12 * 3).reshape(12, 3)
    blocks = split_rows(x, 4)
    assert blocks.shape == (4, 3, 3)
    np.testing.assert_array_equal(blocks[1][:, 0], [3, 15, 27])  # rows 1, 5, 9
    np.testing.assert_array_equal(join_rows(blocks), x)


@pytest.mark.parametrize("rows,mb", [(12, 4), (12, 3), (12, 12), (12, 20), (8, 1)])
def test_consecutive_blocks_hold_consecutive_rows_in_the_original_order(rows, mb):
    # Each row learns its block's smallest and largest row index (a block-wise reduction), and its own.
    x = jnp.arange(rows, dtype=jnp.int32)
    lo, hi, own = jax.jit(lambda a: in_consecutive_blocks(
        lambda b: (jnp.broadcast_to(b.min(), b.shape), jnp.broadcast_to(b.max(), b.shape), b), rows, mb, a))(x)
    want_lo = (np.arange(rows) // min(mb, rows)) * min(mb, rows)
    np.testing.assert_array_equal(lo, want_lo)
    np.testing.assert_array_equal(hi, want_lo + min(mb, rows) - 1)
    np.testing.assert_array_equal(own, np.arange(rows))


def test_accumulation_sums_values_and_gradients():
    w = jnp.array([1.0, -2.0])
    x = jnp.arange(12.0).reshape(6, 2)

    def f(p, rows):
        return jnp.sum((rows @ p) ** 2) / 6, {"n": jnp.float32(rows.shape[0])}

    (l1, m1), g1 = accumulated_value_and_grad(f, w, x, 3)
    (l0, _), g0 = jax.value_and_grad(f, has_aux=True)(w, x)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    np.testing.assert_allclose(g1, g0, rtol=1e-6)
    assert float(m1["n"]) == 6.0  # metrics add up too


@pytest.mark.parametrize("section,key,batch_key", [("batching", "micro_batch_size", "mini_batch_size"),
                                                   ("sft", "micro_batch_size", "batch_size")])
def test_micro_batch_size_must_divide_the_batch(section, key, batch_key):
    with pytest.raises(ConfigError, match=rf"{section}.{key}=3 must divide {section}.{batch_key}=4"):
        load_config("tiny_cpu.py", [f"--config.{section}.{key}=3", f"--config.{section}.{batch_key}=4"])
    with pytest.raises(ConfigError, match=rf"{section}.{key} must be a whole number"):
        load_config("tiny_cpu.py", [f"--config.{section}.{key}=-1"])


# ----------------------------------------------------------------------------- SFT
def test_sft_micro_batches_equal_the_single_pass(tmp_path):
    base = ["--config.model.vocab=task", "--config.prompt.max_turns=2", "--config.rollout.max_context=512",
            "--config.sft.batch_size=4", "--config.train.val_every=0", "--config.mesh.data=1"]
    trainers = [SFTTrainer(load_config("tiny_cpu.py", [*base, f"--config.sft.micro_batch_size={m}"]),
                           tmp_path / str(m), quiet=True, demo_chunk=4) for m in (0, 1)]
    rng = np.random.default_rng(0)
    t = 40
    vocab = trainers[0].vocab
    ids = np.asarray(vocab.to_qwen)[rng.integers(0, vocab.size, (4, t))].astype(np.int32)
    loss_mask = rng.random((4, t)) < 0.5
    length = np.array([t, 31, 17, 25], np.int32)
    prefix = jnp.asarray(ids[0, :6])  # a shared prefix, as the trainer passes one
    args = (prefix, jnp.asarray(ids), jnp.asarray(loss_mask), jnp.asarray(length))

    # Truth: one pass of the loss with its own token count.
    tr = trainers[0]
    params = tr.state.params
    # Jitted: one small program instead of an op-by-op forward and backward (a compile per new op shape).
    @jax.jit
    def truth(p):
        (loss, m), g = jax.value_and_grad(lambda p: sft_loss(tr.policy_graph, p, *args, vocab), has_aux=True)(p)
        return (loss, m), g, jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g)))

    (loss0, m0), g0, gnorm0 = truth(params)
    states = []
    for tr in trainers:
        state, m = jax.jit(tr.step_body)(tr.state, *args)  # the trainer's compiled step body
        _assert_close(m["sft/loss"], loss0, "loss")
        _assert_close(m["sft/token_accuracy"], m0["sft/token_accuracy"], "accuracy")
        _assert_close(m["sft/tokens"], m0["sft/tokens"], "tokens")
        _assert_close(m["sft/grad_norm"], gnorm0, "grad norm")
        states.append(state)
    # Adam's moments are linear in the gradient (the parameters move by about lr * sign(g), which a
    # gradient within rounding of 0 may flip): they carry the gradient's equality into the step.
    _assert_close(states[1].opt_state, states[0].opt_state, "optimizer state after the step")
