"""A plain-Python port of verl-agent's `compute_gigpo_outcome_advantage` (gigpo/core_gigpo.py): the
independent truth of the GiGPO tests (algorithms and trainer).

The port works as verl-agent does: one row per STEP (turn) with its episode-group id, trajectory id,
anchor observation, episode reward and discounted step return; dicts keyed by group id / hashed
observation, `statistics.stdev` (torch `.std()`, ddof 1), a group of one row: mean 0 / std 1 for
episodes, mean x / std 1 for steps.
"""

import statistics
from collections import defaultdict

EPS = 1e-6


def port_gigpo(episodes, gamma, weight, remove_std, cross_steps=True):
    """episodes: list of (group id, score, [(obs, reward), ...]) -> per episode the list of per-turn
    advantages. Mirrors verl-agent: episode_norm_reward + build_step_group + step_norm_reward."""
    rows = []  # (group, traj, obs, score, step_return)
    for traj, (grp, score, turns) in enumerate(episodes):
        ret, rets = 0.0, []
        for _, r in reversed(turns):
            ret = r + gamma * ret
            rets.append(ret)
        rets.reverse()
        for (obs, _), g in zip(turns, rets):
            rows.append((grp, traj, obs, score, g))

    def norm(groups, single_mean):
        stats = {}
        for key, xs in groups.items():
            if len(xs) == 1:
                stats[key] = (xs[0] if single_mean else 0.0, 1.0)
            else:
                stats[key] = (statistics.mean(xs), statistics.stdev(xs))
        return stats

    ep_groups, seen = defaultdict(list), set()
    for grp, traj, _, score, _ in rows:
        if (grp, traj) in seen:
            continue
        ep_groups[grp].append(score)
        if not cross_steps:
            seen.add((grp, traj))
    ep_stats = norm(ep_groups, single_mean=False)
    st_groups = defaultdict(list)
    for grp, _, obs, _, g in rows:
        st_groups[(grp, obs)].append(g)
    st_stats = norm(st_groups, single_mean=True)

    def z(x, stats):
        m, s = stats
        return x - m if remove_std else (x - m) / (s + EPS)

    out = defaultdict(list)
    for grp, traj, obs, score, g in rows:
        out[traj].append(z(score, ep_stats[grp]) + weight * z(g, st_stats[(grp, obs)]))
    return [out[i] for i in range(len(episodes))]
