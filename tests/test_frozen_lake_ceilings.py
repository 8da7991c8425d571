"""scripts/frozen_lake_ceilings.py: policies restricted to a view of the state, evaluated exactly.

Truths: no policy beats the value-iteration teacher on any map (so not on average either); the
constant view is the one action the teacher takes most often, whose exact value a hand-built table
gives; the uniform policy's value is the plain-Python reference's (envs_py/frozen_lake.py).
"""

from __future__ import annotations


import jax
import numpy as np

from scripts import frozen_lake_ceilings as fc
from envs_jax.frozen_lake import rows_from_state
from envs_py import frozen_lake as ref


def test_views_against_the_teacher_and_the_reference():
    res = fc.ceilings(train_maps=400, test_maps=60, seed=3)
    views = res["views"]
    assert set(views) == set(fc.VIEWS)
    for name, v in views.items():
        assert v["success"] <= res["teacher"] + 1e-6, name
    test = fc.maps(4, 60)
    rows = [rows_from_state(jax.tree.map(lambda x: x[i], test)) for i in range(60)]
    assert abs(res["uniform"] - np.mean([ref.policy_value(r, None, fc.K) for r in rows])) < 1e-5
    train = fc.maps(3, 400)
    table, _, _, ks, live = fc.grids(train)
    mask = np.broadcast_to(live & (ks >= 1), table.shape)
    common = int(np.bincount(table[mask], minlength=4).argmax())
    want = np.mean([ref.policy_value(r, lambda cell, k: common, fc.K) for r in rows])
    assert abs(views["nothing"]["success"] - want) < 1e-5
    # Reading the neighbours and the goal's direction gets most of the way to the teacher.
    assert views["neighbours + goal direction"]["success"] > views["neighbours"]["success"] + 0.05
