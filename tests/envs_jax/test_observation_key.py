"""observation_key: equal keys iff equal observation text (the host `render_text`, an independent
path through numpy and string formatting), over visited FrozenLake states in three observation setups."""

import itertools

import jax
import numpy as np
import pytest

from envs_jax.frozen_lake import FrozenLake, FrozenLakeParams
from envs_jax.observation_key import observation_key

ENV = FrozenLake()


def _states(params, n_maps=3, steps=6):
    out = []
    for seed in range(n_maps):
        key = jax.random.PRNGKey(seed % 2)  # seeds 0 and 2 share a map: equal observations across episodes
        _, state = ENV.reset_env(key, params)
        rng = np.random.default_rng(seed)
        out.append(state)
        for t in range(steps):
            _, state, *_ = ENV.step_env(jax.random.PRNGKey(100 * seed + t), state, int(rng.integers(0, 4)), params)
            out.append(state)
    return out


@pytest.mark.parametrize("kw", [{}, {"observation_format": "grid_coord"}, {"surroundings": True}],
                         ids=["grid", "grid_coord", "surroundings"])
def test_equal_keys_iff_equal_observation_text(kw):
    params = FrozenLakeParams(**kw)
    states = _states(params)
    key_fn = jax.jit(lambda s: observation_key(ENV, s, params))
    keys = [np.asarray(key_fn(s)) for s in states]
    texts = [ENV.render_text(s, params) for s in states]
    assert len({k.shape for k in keys}) == 1  # static width: keys stack into [B, K, D]
    equal_pairs = 0
    for i, j in itertools.combinations(range(len(states)), 2):
        same_key = bool(np.array_equal(keys[i], keys[j]))
        assert same_key == (texts[i] == texts[j]), (i, j)
        equal_pairs += same_key
    assert 0 < equal_pairs < len(states) * (len(states) - 1) // 2  # both outcomes occur
