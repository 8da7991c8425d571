"""bench/sampler.py's target verdicts: each of our sides is judged against the peers doing the same
work (tokens only vs tokens only, log-probs vs log-probs). Hand-made rows, verdicts worked out by hand."""

from __future__ import annotations

from bench.sampler import targets_met, same_work_peer


def test_same_work_peer_pairs_log_prob_sides_with_log_prob_peers():
    assert same_work_peer("ours_nolp", "torch_bf16") == "torch_bf16"
    assert same_work_peer("ours_nolp", "torch_bf16_lp") is None
    assert same_work_peer("ours_bf16", "torch_bf16") == "torch_bf16_lp"
    assert same_work_peer("ours", "torch_lp") == "torch_lp"
    assert same_work_peer("ours", "tunix") is None  # Tunix's sampler has no log-prob side


def test_targets_like_for_like_and_strict():
    row = {"ours_tok_s": 10.0, "ours_nolp_tok_s": 30.0, "torch_tok_s": 12.0, "torch_lp_tok_s": 3.0, "tunix_tok_s": 8.0}
    sides = ["ours", "ours_nolp"]
    # Strict: every side against the fastest of all peers (torch, 12): 3x needs 36.
    assert targets_met(row, {"best_peer": 3.0}, sides, lambda o, p: p) == {
        "ours": {"best_peer": False}, "ours_nolp": {"best_peer": False}}
    # Like for like: ours (log-probs) vs torch_lp (3): 10 >= 9; ours_nolp vs torch (12): 30 < 36.
    assert targets_met(row, {"best_peer": 3.0}, sides, same_work_peer) == {
        "ours": {"best_peer": True}, "ours_nolp": {"best_peer": False}}
    # Named peers: no log-prob side of Tunix -> None; a peer not measured -> None.
    assert targets_met(row, {"tunix": 1.5, "torch_bf16": 1.0}, sides, same_work_peer) == {
        "ours": {"tunix": None, "torch_bf16": None}, "ours_nolp": {"tunix": True, "torch_bf16": None}}
