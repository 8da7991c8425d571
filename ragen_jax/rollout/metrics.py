"""Host-side views of trajectories: read what the agent saw and did, and summary metrics."""

from __future__ import annotations

import jax
import numpy as np

from ragen_jax.rollout.types import Trajectories

SAMPLED_OPEN, SAMPLED_CLOSE = "\u27e6", "\u27e7"  # ⟦ ⟧ around the tokens the policy sampled (loss mask 1)


def format_trajectory(traj: Trajectories, row: int, tokenizer, *, mark: bool = True) -> str:
    """The full chat text of one episode; sampled spans wrapped in ⟦ ⟧ so the loss mask is visible."""
    t = jax.device_get(traj)
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
    """Batch summaries (behaviour spec sections 6-7): success, reward, validity, in-group std, pass@N."""
    t = jax.device_get(traj)
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
