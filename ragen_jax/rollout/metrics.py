"""Host-side views of trajectories: read what the agent saw and did, and summary metrics.

Both functions take host arrays or device arrays. A batch sharded over several processes' devices
cannot be copied to the host by one process alone (`np.asarray` raises): `host_copy` gathers it,
which is a collective, so in a multi-process run every process must call it at the same point (the
trainers gather a rollout's trajectories once per iteration and pass the host copy on).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from ragen_jax.rollout.types import Trajectories

SAMPLED_OPEN, SAMPLED_CLOSE = "\u27e6", "\u27e7"  # ⟦ ⟧ around the tokens the policy sampled (loss mask 1)


def _identity(*xs):
    return xs


def host_copy(tree):
    """Numpy copies of a pytree's arrays. Arrays with shards on other processes' devices are gathered
    from all processes (the global array; a collective: every process must call this); fully
    replicated or local arrays are copied directly; host values pass through."""

    def spans_processes(x):
        return isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated

    leaves, treedef = jax.tree.flatten(tree)
    far = [i for i, x in enumerate(leaves) if spans_processes(x)]
    named = [i for i in far if isinstance(leaves[i].sharding, NamedSharding)]
    if named:
        # One program replicates them all (process_allgather would compile one per leaf shape).
        out = jax.jit(_identity, out_shardings=tuple(NamedSharding(leaves[i].sharding.mesh, PartitionSpec())
                                                     for i in named))(*(leaves[i] for i in named))
        for i, x in zip(named, out):
            leaves[i] = np.asarray(x)
    rest = [i for i in far if i not in named]
    if rest:
        for i, g in zip(rest, multihost_utils.process_allgather([leaves[i] for i in rest], tiled=True)):
            leaves[i] = np.asarray(g)
    leaves = [np.asarray(x) if isinstance(x, jax.Array) else x for x in leaves]
    return jax.tree.unflatten(treedef, leaves)


def format_trajectory(traj: Trajectories, row: int, tokenizer, *, mark: bool = True) -> str:
    """The full chat text of one episode; sampled spans wrapped in ⟦ ⟧ so the loss mask is visible.
    (`traj` sharded over several processes: pass `host_copy(traj)`, or call this on every process.)"""
    t = host_copy(traj)
    n = int(t.length[row])
    ids = np.asarray(t.tokens[row, :n])
    mask = np.asarray(t.loss_mask[row, :n])
    out, start = [], 0
    # Decode maximal runs of equal mask value, so multi-token characters inside a run stay intact.
    for i in range(1, n + 1):
        if i == n or mask[i] != mask[start]:
            text = tokenizer.decode(ids[start:i].tolist(), skip_special_tokens=False)
            out.append(f"{SAMPLED_OPEN}{text}{SAMPLED_CLOSE}" if (mark and mask[start]) else text)
            start = i
    rewards = ", ".join(f"{r:g}" for r, e in zip(t.turn_reward[row], t.turn_end[row]) if e >= 0)
    footer = (f"\n--- group {int(t.group[row])} seed {int(t.seed[row])}: reward {float(t.reward[row]):g} "
              f"(turns: {rewards}), success {bool(t.success[row])}, actions {int(t.num_actions[row])}, "
              f"format errors {int(t.num_format_errors[row])}, truncated {bool(t.truncated[row])}")
    return "".join(out) + footer


def rollout_metrics(traj: Trajectories, group_size: int) -> dict[str, float]:
    """Batch summaries (behaviour spec sections 6-7): success, reward, validity, in-group std, pass@N.
    (`traj` sharded over several processes: pass `host_copy(traj)`, or call this on every process.)"""
    t = host_copy(traj)
    reward = np.asarray(t.reward, np.float64)
    grouped = reward.reshape(-1, group_size)
    std = grouped.std(axis=1)
    n_act = np.maximum(np.asarray(t.num_actions), 1)
    return {
        "success": float(np.mean(t.success)),
        "reward_mean": float(reward.mean()),
        "reward_std": float(reward.std()),
        "format_ok": float(np.mean(t.num_format_errors == 0)),
        "action_is_valid": float(np.mean(t.action_is_valid)),
        "action_is_effective": float(np.mean(np.asarray(t.num_effective) / n_act)),
        "num_actions": float(np.mean(t.num_actions)),
        "num_turns": float(np.mean(t.num_turns)),
        "response_length": float(np.mean(t.response_length)),
        "truncated": float(np.mean(t.truncated)),
        "in_group_std": float(std.mean()),
        "in_group_std_max": float(std.max()),
        "pass_at_n": float(np.mean(np.asarray(t.success).reshape(-1, group_size).any(axis=1))),
    }


def mix_metrics(traj: Trajectories, group_size: int, mix) -> dict[str, float]:
    """`rollout_metrics` of each environment of a mixed batch, as "<Env>/<metric>".

    `mix`: ((name, groups), ...) in batch order (`MixedTextEnv.mix`): the first groups_0 groups are
    the first env's, and so on. Each env's rows are told apart by their group index (`traj.group`).
    (`traj` sharded over several processes: pass `host_copy(traj)`, or call this on every process.)"""
    t = host_copy(traj)
    group = np.asarray(t.group)
    out, start = {}, 0
    for name, groups in mix:
        rows = (group >= start) & (group < start + groups)
        start += groups
        part = jax.tree.map(lambda x: np.asarray(x)[rows], t)
        out.update({f"{name}/{k}": v for k, v in rollout_metrics(part, group_size).items()})
    return out
