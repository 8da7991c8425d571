"""bench/env_rules.py: the rules-only throughput rows run, and the random-policy success it reports for
the JAX env agrees with the plain-Python port's (an independent estimate of the same probability)."""

from __future__ import annotations

import json

from bench import env_rules


def test_rules_rows_and_random_policy_success_agree_with_the_port(tmp_path):
    out = tmp_path / "env_rules.json"
    result = env_rules.main(["--envs", "rubikscube,Bandit", "--batch", "512", "--quick", "--host-episodes", "400",
                             "--out", str(out)])
    assert json.loads(out.read_text())["steps"] == json.loads(json.dumps(result["steps"]))
    rows = {r["env"]: r for r in result["steps"]}
    assert set(rows) == {"rubikscube", "Bandit"}
    for r in rows.values():
        assert r["env_steps_per_call"] == 512 * r["inner_steps"] and r["host_steps"] > 0
        assert r["jax_steps_per_cpu_s"] > 0 and r["host_steps_per_cpu_s"] > 0
    (cube,) = result["random_policy_success"]
    # A depth-1 scramble, 20 random moves: about a fifth are solved (bench/results/env_rules.json: 0.216
    # over 4,096 episodes, the port 0.202 over 500). Both sides must give that probability: |z| < 4
    # fails a broken done or success rule.
    assert cube["env"] == "rubikscube" and cube["jax_episodes"] == 512 and cube["host_episodes"] == 400
    assert 0.1 < cube["jax_success"] < 0.35 and abs(cube["z"]) < 4
