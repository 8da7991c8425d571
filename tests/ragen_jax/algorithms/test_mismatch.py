"""Mismatch metrics, truncated importance sampling and the policy-loss hook: hand-computed values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algorithms import losses as L
from ragen_jax.algorithms import mismatch as M

T, F = True, False
# log r = old - sampler per token: row 0 [ln 3, 0, -ln 2, (off mask: 5.0)], row 1 [0.001, 0.002, off, off]
SAMPLER = np.array([[-1.0, -2.0, -0.5, -9.0], [-1.0, -1.0, -3.0, -3.0]], np.float32)
LOG_R = np.array([[math.log(3.0), 0.0, -math.log(2.0), 5.0], [0.001, 0.002, 7.0, 7.0]], np.float32)
OLD = SAMPLER + LOG_R
MASK = np.array([[T, T, T, F], [T, T, F, F]])


def k3(lr):  # r - 1 - log r with r = exp(lr): KL(sampler || trainer) from sampler samples
    return math.exp(lr) - 1.0 - lr


def test_mismatch_metrics_hand_values():
    m = M.mismatch_metrics(OLD, SAMPLER, MASK, tis_cap=2.0)
    lrs = [math.log(3.0), 0.0, -math.log(2.0), 0.001, 0.002]
    assert float(m["mismatch/logp_abs_diff_mean"]) == pytest.approx(sum(map(abs, lrs)) / 5, rel=1e-5)
    assert float(m["mismatch/logp_abs_diff_max"]) == pytest.approx(math.log(3.0), rel=1e-6)
    # k3: ln3 -> 2 - ln3; 0 -> 0; -ln2 -> -0.5 + ln2; tiny ones ~ lr^2 / 2
    want = (2 - math.log(3.0)) + (math.log(2.0) - 0.5) + k3(0.001) + k3(0.002)
    assert float(m["mismatch/k3_kl"]) == pytest.approx(want / 5, rel=1e-4)
    assert float(m["mismatch/ratio_above_cap"]) == pytest.approx(1 / 5)  # only the ratio 3 exceeds 2


def test_token_tis_hand_values():
    w, m = M.tis_weights(OLD, SAMPLER, MASK, "token")  # cap 2.0
    want = np.array([[2.0, 1.0, 0.5, 0.0], [math.exp(0.001), math.exp(0.002), 0.0, 0.0]])
    np.testing.assert_allclose(w, want, rtol=1e-5)
    assert float(m["tis/capped_fraction"]) == pytest.approx(0.2)
    assert float(m["tis/weight_mean"]) == pytest.approx((3.5 + math.exp(0.001) + math.exp(0.002)) / 5, rel=1e-5)
    w3, _ = M.tis_weights(OLD, SAMPLER, MASK, "token", cap=4.0)
    assert float(w3[0, 0]) == pytest.approx(3.0, rel=1e-5)


def test_sequence_tis_and_geometric_mask_hand_values():
    # row 0: product 3 * 1 * 0.5 = 1.5 (< cap 5); row 1: exp(0.003)
    w, m = M.tis_weights(OLD, SAMPLER, MASK, "sequence")
    np.testing.assert_allclose(w, [[1.5, 1.5, 1.5, 0.0], [math.exp(0.003), math.exp(0.003), 0, 0]], rtol=1e-5)
    assert float(m["tis/capped_fraction"]) == 0.0
    w, m = M.tis_weights(OLD, SAMPLER, MASK, "sequence", cap=1.2)
    np.testing.assert_allclose(w[0, :3], 1.2, rtol=1e-6)
    assert float(m["tis/capped_fraction"]) == pytest.approx(0.5)
    # geometric mean: row 0 = 1.5 ** (1/3) = 1.1447 (outside [0.99, 1.01]) -> dropped; row 1 = exp(0.0015) kept
    w, m = M.tis_weights(OLD, SAMPLER, MASK, "sequence", geo_mask=M.GEO_MASK_BOUNDS)
    np.testing.assert_allclose(w[0], 0.0)
    np.testing.assert_allclose(w[1, :2], math.exp(0.003), rtol=1e-5)
    assert float(m["tis/geo_masked_fraction"]) == pytest.approx(0.5)
    # "none" with the geometric mask alone: weight 1 on kept rows
    w, _ = M.tis_weights(OLD, SAMPLER, MASK, "none", geo_mask=(0.99, 1.01))
    np.testing.assert_array_equal(w, [[0, 0, 0, 0], [1, 1, 0, 0]])


def test_sequence_product_is_clamped_before_exp():
    old = np.zeros((1, 30), np.float32)
    sampler = np.full((1, 30), -1.0, np.float32)  # sum log r = 30 -> clamped to 20, capped anyway
    w, _ = M.tis_weights(old, sampler, np.ones((1, 30), bool), "sequence", cap=1e12)
    assert float(w[0, 0]) == pytest.approx(math.exp(20.0), rel=1e-5)


def test_policy_loss_hook_multiplies_tokens_and_blocks_gradient():
    adv = np.array([[1.0, -1.0, 2.0, 0.0], [0.5, 0.5, 0.0, 0.0]], np.float32)
    logp = OLD  # on-policy step: ratio 1, so L_t = -A_t
    w, _ = M.tis_weights(OLD, SAMPLER, MASK, "token")
    loss, _ = L.ppo_policy_loss(jnp.asarray(logp), jnp.asarray(OLD), jnp.asarray(adv), jnp.asarray(MASK),
                                tis_weights=w)
    # token-mean of -A * w over the 5 masked tokens: -(1*2 - 1*1 + 2*0.5 + 0.5 e^0.001 + 0.5 e^0.002) / 5
    want = -(2.0 - 1.0 + 1.0 + 0.5 * math.exp(0.001) + 0.5 * math.exp(0.002)) / 5
    assert float(loss) == pytest.approx(want, rel=1e-5)
    plain, _ = L.ppo_policy_loss(jnp.asarray(logp), jnp.asarray(OLD), jnp.asarray(adv), jnp.asarray(MASK))
    assert float(plain) == pytest.approx(-(1 - 1 + 2 + 0.5 + 0.5) / 5, rel=1e-6)

    # d loss / d logp_t = -A_t * w_t / 5 at ratio 1; no gradient reaches the weights' inputs.
    def f(lp, old):
        ww, _ = M.tis_weights(old, SAMPLER, MASK, "token")
        return L.ppo_policy_loss(lp, old, jnp.asarray(adv), jnp.asarray(MASK), tis_weights=ww)[0]

    g_lp, g_old = jax.grad(f, argnums=(0, 1))(jnp.asarray(logp), jnp.asarray(OLD))
    np.testing.assert_allclose(g_lp, -adv * np.asarray(w) / 5, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g_old, adv * np.asarray(w) / 5, rtol=1e-5, atol=1e-7)  # only through the ratio


def test_bad_tis_arguments():
    with pytest.raises(ValueError, match="unknown tis mode 'seq'"):
        M.tis_weights(OLD, SAMPLER, MASK, "seq")
    with pytest.raises(ValueError, match="tis_cap must be a number >= 1"):
        M.tis_weights(OLD, SAMPLER, MASK, "token", cap=0.5)
    with pytest.raises(ValueError, match="geometric mask bounds"):
        M.tis_weights(OLD, SAMPLER, MASK, "token", geo_mask=(1.1, 1.2))
