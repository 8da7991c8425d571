"""Losses: PPO clip / dual clip / aggregation, KL, entropy, chunked log-probs, value loss."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algorithms import losses as L

T, F = True, False

# Hand-picked tokens (ratio r, advantage A), row 0 has 4 sampled tokens, row 1 has 2 (+ masked junk).
#  (0,0) r=1.1  A=+1: inside the range            L = -1.1
#  (0,1) r=1.5  A=+1: above 1.28 -> clipped high   L = -1.28      (vanilla 0.2: -1.2)
#  (0,2) r=1.25 A=+1: clip-higher asymmetry: inside 0.28 -> -1.25; vanilla 0.2 clips it -> -1.2
#  (0,3) r=0.5  A=-1: below 0.8 -> clipped low    L = max(0.5, 0.8) = 0.8
#  (1,0) r=5.0  A=-1: dual clip                   L = min(max(5, 1.28), 3) = 3
#  (1,1) r=0.5  A=+1: below the range but the clip would raise the loss: not clipped, L = -0.5
#  (0,4), (1,2..4): off the mask, with wild values that must not matter
RATIO = np.array([[1.1, 1.5, 1.25, 0.5, 1e6], [5.0, 0.5, 1e-6, 3.0, 7.0]])
ADV = np.array([[1.0, 1.0, 1.0, -1.0, 50.0], [-1.0, 1.0, -9.0, 9.0, 1.0]])
MASK = np.array([[T, T, T, T, F], [T, T, F, F, F]])
LOSS_S = np.array([[-1.1, -1.28, -1.25, 0.8], [3.0, -0.5, 0, 0]])  # StarPO-S per-token losses
LOSS_V = np.array([[-1.1, -1.2, -1.2, 0.8], [3.0, -0.5, 0, 0]])  # vanilla 0.2 / 0.2


def _ppo(eps_high, mode="token-mean"):
    logp = jnp.log(jnp.asarray(RATIO, jnp.float32))
    return L.ppo_policy_loss(logp, jnp.zeros_like(logp), jnp.asarray(ADV), jnp.asarray(MASK),
                             eps_low=0.2, eps_high=eps_high, dual_clip=3.0, agg_mode=mode)


def test_ppo_token_mean_and_clip_metrics():
    loss, m = _ppo(0.28)
    assert float(loss) == pytest.approx(LOSS_S.sum() / 6, rel=1e-5)
    assert float(m["pg_clipfrac_high"]) == pytest.approx(1 / 6)  # (0,1)
    assert float(m["pg_clipfrac_low"]) == pytest.approx(1 / 6)  # (0,3)
    assert float(m["pg_clipfrac"]) == pytest.approx(2 / 6)
    assert float(m["pg_clipfrac_dual"]) == pytest.approx(1 / 6)  # (1,0)
    want_kl = -np.mean(np.log(RATIO[MASK]))
    assert float(m["ppo_kl"]) == pytest.approx(want_kl, rel=1e-5)
    loss_v, m_v = _ppo(0.2)
    assert float(loss_v) == pytest.approx(LOSS_V.sum() / 6, rel=1e-5)
    assert float(m_v["pg_clipfrac_high"]) == pytest.approx(2 / 6)  # (0,1) and now (0,2)


def test_ppo_seq_aggregation_with_uneven_masks():
    loss, _ = _ppo(0.28, "seq-mean-token-sum")
    assert float(loss) == pytest.approx((LOSS_S[0].sum() + LOSS_S[1].sum()) / 2, rel=1e-5)
    loss, _ = _ppo(0.28, "seq-mean-token-mean")
    assert float(loss) == pytest.approx((LOSS_S[0].sum() / 4 + LOSS_S[1].sum() / 2) / 2, rel=1e-5)
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'; valid: token-mean"):
        _ppo(0.28, "sum")


def test_ppo_gradient_only_on_masked_unclipped_tokens():
    def f(logp):
        return L.ppo_policy_loss(logp, jnp.zeros_like(logp), jnp.asarray(ADV), jnp.asarray(MASK))[0]

    g = np.asarray(jax.grad(f)(jnp.log(jnp.asarray(RATIO, jnp.float32))))
    # d(-A r)/d logp = -A r on active tokens, / 6 for the token mean; clipped and dual-clipped tokens
    # and every unmasked position get exactly zero.
    want = np.zeros_like(RATIO)
    want[0, 0] = -1.1 / 6
    want[0, 2] = -1.25 / 6
    want[1, 1] = -0.5 / 6
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=0)
    assert np.all(g[~MASK] == 0.0)


def test_agg_loss_empty_rows_and_norm():
    x = jnp.array([[1.0, 2.0], [5.0, 7.0], [3.0, 3.0]])
    m = jnp.array([[T, T], [F, F], [T, F]])
    assert float(L.agg_loss(x, m, "token-mean")) == pytest.approx(2.0)
    assert float(L.agg_loss(x, m, "token-mean", norm=10.0)) == pytest.approx(0.6)
    assert float(L.agg_loss(x, m, "seq-mean-token-sum")) == pytest.approx(3.0)  # (3 + 3) / 2 rows
    assert float(L.agg_loss(x, m, "seq-mean-token-mean")) == pytest.approx(2.25)  # (1.5 + 3) / 2
    assert float(L.agg_loss(x, jnp.zeros_like(m), "token-mean")) == 0.0


def test_ppo_bad_args():
    z = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        L.ppo_policy_loss(z, z, z, z > 0, dual_clip=0.5)
    with pytest.raises(ValueError, match="PPO clip range"):
        L.ppo_policy_loss(z, z, z, z > 0, eps_low=1.5)


def test_kl_estimators():
    logp, ref = jnp.array([-1.0, -30.0]), jnp.array([-2.0, 0.0])
    np.testing.assert_allclose(L.kl_penalty(logp, ref, "k1"), [1.0, -30.0], rtol=1e-6)
    np.testing.assert_allclose(L.kl_penalty(logp, ref, "k2"), [0.5, 450.0], rtol=1e-6)
    # k3: exp(ref - logp) - (ref - logp) - 1 = e^-1 for the first; the second (ref - logp = 30, clamped
    # to 20 -> e^20 - 21) is clamped to 10 as verl's low_var_kl does.
    np.testing.assert_allclose(L.kl_penalty(logp, ref, "k3"), [math.exp(-1.0), 10.0], rtol=1e-6)
    np.testing.assert_allclose(L.kl_penalty(logp, ref, "low_var_kl"), L.kl_penalty(logp, ref, "k3"))
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; valid: abs, k1, k2, k3"):
        L.kl_penalty(logp, ref, "k4")
    m = jnp.array([[T, F]])
    out, met = L.kl_in_reward(jnp.array([[1.0, 2.0]]), logp[None], ref[None], m, 0.1, "k1")
    np.testing.assert_allclose(out, [[0.9, 2.0]], rtol=1e-6)
    assert float(met["reward_kl_penalty"]) == pytest.approx(1.0)
    assert float(L.kl_loss(logp[None], ref[None], m, "k2")) == pytest.approx(0.5)


def test_entropy_known_distributions():
    v = 151_936
    assert float(L.entropy_from_logits(jnp.zeros((v,)))) == pytest.approx(math.log(v), rel=1e-5)
    p = jnp.array([0.5, 0.25, 0.25])
    assert float(L.entropy_from_logits(jnp.log(p) + 7.0)) == pytest.approx(1.5 * math.log(2), rel=1e-6)
    # Nearly one-hot at a huge logit: stable (no log(0) / nan), entropy ~ 0.
    peaked = float(L.entropy_from_logits(jnp.array([1e4, 0.0, 0.0])))
    assert math.isfinite(peaked) and abs(peaked) < 1e-6
    ent = jnp.array([[1.0, 2.0, 40.0]])
    assert float(L.entropy_loss(ent, jnp.array([[T, T, F]]))) == pytest.approx(1.5)


def test_chunked_logprobs_entropy_match_full_logits_values_and_grads():
    b, t, h, v, chunk = 2, 7, 4, 11, 3  # T not divisible by the chunk
    k = jax.random.split(jax.random.key(0), 5)
    hidden = jax.random.normal(k[0], (b, t, h))
    targets = jax.random.randint(k[1], (b, t), 0, v)
    w = jax.random.normal(k[2], (h, v)) * 2.0
    c1, c2 = jax.random.normal(k[3], (b, t)), jax.random.normal(k[4], (b, t))

    def chunked(w, hidden):
        lp, ent = L.token_logprobs_and_entropy(hidden, targets, lambda x: jnp.tanh(x) @ w, chunk=chunk)
        return jnp.sum(lp * c1) + jnp.sum(ent * c2), (lp, ent)

    def direct(w, hidden):
        z = jnp.tanh(hidden) @ w  # [B, T, V]
        lp = jax.nn.log_softmax(z)[jnp.arange(b)[:, None], jnp.arange(t)[None], targets]
        p = jax.nn.softmax(z)
        ent = -jnp.sum(p * jnp.log(p), -1)
        return jnp.sum(lp * c1) + jnp.sum(ent * c2), (lp, ent)

    (lc, (lp_c, ent_c)), gc = jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True)(w, hidden)
    (ld, (lp_d, ent_d)), gd = jax.value_and_grad(direct, argnums=(0, 1), has_aux=True)(w, hidden)
    assert lp_c.shape == (b, t) and ent_c.shape == (b, t)
    np.testing.assert_allclose(lp_c, lp_d, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent_c, ent_d, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gc[0], gd[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gc[1], gd[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(L.logprobs_from_logits(jnp.tanh(hidden) @ w, targets), lp_d, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="expected hidden"):
        L.token_logprobs_and_entropy(hidden[0], targets, lambda x: x)


def test_value_loss_clipping_both_sides():
    # V_old = 0, clip 0.5:
    #  V=.2  R=1:   clip inactive, both (.2-1)^2 = .64          -> .64, not clipped
    #  V=1   R=1:   clipped V = .5 -> (.5-1)^2 = .25 > 0        -> .25, clipped (upper side)
    #  V=-1  R=-1:  clipped V = -.5 -> .25 > 0                  -> .25, clipped (lower side)
    #  V=1   R=0:   unclipped 1 > clipped .25                   -> 1,   not clipped
    #  masked-out junk
    v = jnp.array([[0.2, 1.0, -1.0, 1.0, 50.0]])
    r = jnp.array([[1.0, 1.0, -1.0, 0.0, -50.0]])
    m = jnp.array([[T, T, T, T, F]])
    loss, met = L.value_loss(v, jnp.zeros_like(v), r, m, clip=0.5)
    assert float(loss) == pytest.approx(0.5 * (0.64 + 0.25 + 0.25 + 1.0) / 4, rel=1e-5)
    assert float(met["vf_clipfrac"]) == pytest.approx(0.5)
    g = jax.grad(lambda v: L.value_loss(v, jnp.zeros_like(v), r, m)[0])(v)
    # d/dV of 0.5 * mean: token 0: (V - R) / 4 = -.2; clipped tokens 1, 2: 0; token 3: 1 / 4; junk 0
    np.testing.assert_allclose(g, [[-0.2, 0.0, 0.0, 0.25, 0.0]], rtol=1e-5, atol=1e-7)


def test_chunked_helper_memory_does_not_grow_with_t():
    # XLA's buffer analysis of the compiled gradient: the temporaries stay at a few chunk-sized
    # logits blocks whatever T is, far below the [B, T, V] logits a direct computation holds.
    b, h, v, chunk = 1, 8, 4096, 16

    def temp_bytes(t):
        w = jnp.zeros((h, v))
        y = jnp.zeros((b, t), jnp.int32)

        def f(w, x):
            lp, ent = L.token_logprobs_and_entropy(x, y, lambda z: z @ w, chunk=chunk)
            return jnp.sum(lp) + jnp.sum(ent)

        compiled = jax.jit(jax.grad(f, argnums=(0, 1))).lower(w, jnp.zeros((b, t, h))).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = temp_bytes(64), temp_bytes(512)
    full_logits = b * 512 * v * 4
    assert large < 1.2 * small + 64 * 1024
    assert large < full_logits / 4
