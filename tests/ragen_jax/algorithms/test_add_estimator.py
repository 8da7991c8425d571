"""docs/algorithms.md "Adding an estimator", run verbatim: the record it registers is what the config
and compute_advantages use, with no other file touched. The truth: the estimator's arithmetic redone in
numpy (group-mean baseline, then verl's masked whitening with the unbiased variance)."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.algorithms import advantages as A
from ragen_jax.experiment.config import ConfigError, load_config
from tests.docs_example import run_example


@pytest.fixture(scope="module")
def example():
    module = run_example("algorithms.md", "Adding an estimator", "reinforce_pp_example")
    yield module
    A.unregister_estimator("reinforce_pp")


def _numpy_truth(rewards, mask, group_size, baseline):
    score = np.where(mask, rewards, 0.0).sum(-1)
    if baseline == "group":
        g = score.reshape(-1, group_size)
        score = (g - g.mean(-1, keepdims=True)).reshape(-1)
    adv = np.where(mask, score[:, None], 0.0)
    vals = adv[mask]
    white = (adv - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8)
    return np.where(mask, white, 0.0), np.where(mask, score[:, None], 0.0)


def test_the_example_registers_a_working_estimator(example):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(6, 5)).astype(np.float32)
    mask = rng.random((6, 5)) < 0.7
    mask[:, 0] = True
    record = A.get_estimator("reinforce_pp")
    assert (record.needs_critic, record.whiten, record.options) == (False, True, example.ReinforcePPOptions)
    for baseline in ("group", "none"):
        adv, ret = A.compute_advantages("reinforce_pp", jnp.asarray(rewards), jnp.asarray(mask), group_size=3,
                                        options={"baseline": baseline})
        want_adv, want_ret = _numpy_truth(rewards.astype(np.float64), mask, 3, baseline)
        np.testing.assert_allclose(adv, want_adv, atol=2e-5)
        np.testing.assert_allclose(ret, want_ret, atol=1e-5)


def test_the_config_takes_it_and_its_options(example):
    cfg = load_config("tiny_cpu.py", ["advantage.estimator=reinforce_pp", "model.critic=none",
                                      "advantage.options.baseline=none"])
    assert cfg.advantage.estimator_options == example.ReinforcePPOptions(baseline="none")
    assert not cfg.advantage.needs_state_keys
    with pytest.raises(ConfigError, match=r"advantage\.options: baseline='batch' is not valid; choose one of"):
        load_config("tiny_cpu.py", ["advantage.estimator=reinforce_pp", "model.critic=none",
                                    "advantage.options.baseline=batch"])
    with pytest.raises(ConfigError, match=r"advantage\.options: options 'base' are not options of the "
                                          r"'reinforce_pp' estimator; valid: baseline"):
        load_config("tiny_cpu.py", ["advantage.estimator=reinforce_pp", "model.critic=none",
                                    "advantage.options.base=none"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="already registered"):
            A.register_estimator(A.get_estimator("reinforce_pp"))
