"""`StepPrograms.prepare` and `update` against a plain computation on a tiny model.

The plain side recomputes everything independently: full [B, T, V] logits and log-softmax (not the
chunked pass), the filters, reward placement, normalisation, GAE / bi-level GAE / GRPO as loops over
numpy arrays, and the PPO / critic losses written out token by token; the update is replayed as
plain SGD steps (the programs get an SGD optimizer here, so parameter differences are proportional
to gradient differences and the comparison can be tight). Only the mini-batch order is taken from the
same keys as the program (`split(state.key)`, `fold_in(perm_key, epoch)`): the order is a choice, not
a computation under test.

Three configurations, each compiled once (module fixtures), cover: several PPO epochs and
mini-batches with a step large enough that the ratios leave 1 and the clip engages, critic warm-up
(counted as verl counts it), KL in the loss and in the reward, bi-level GAE with per-turn reward
placement, the variance-cover filter, the seq-mean loss modes, a sampling temperature != 1, and a
non-finite gradient that is skipped and counted. A last test checks the rollout's recorded log-probs
against the trainer's recomputed old log-probs at temperature 0.5 (through the real Trainer).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from ragen_jax.models import Qwen2, Qwen2Config, critic_from_policy
from ragen_jax.rollout import Trajectories
from ragen_jax.experiment.config import Config, load_config
from ragen_jax.trainer.rl import Trainer
from ragen_jax.trainer.step import StepPrograms, StepSettings, TrainState
from tests.ragen_jax.trainer.algo_knobs import algo_view, set_algo
from tests.ragen_jax.trainer.tiny_runs import BANDIT_T05

V = 32  # model vocabulary
P, N, T, K = 4, 4, 12, 2  # groups, group size, tokens, turns
PROMPT = 3  # tokens 0..2 are the prompt; turn 1 samples 3..5, env text 6..7, turn 2 samples 8..10
LR = 0.5  # actor SGD step: large enough that later mini-batches see ratios beyond the clip range
CRITIC_LR = 0.05


# ------------------------------------------------------------------------------------ setup
def _config(**algo) -> Config:
    cfg = Config()
    cfg.model.random_init = True
    cfg.rollout = dataclasses.replace(cfg.rollout, num_groups=P, group_size=N, max_context=T,
                                      temperature=algo.pop("temperature", 1.0))
    set_algo(cfg, **{"value": 0.5, "mini_batch_size": 4, "ppo_epochs": 2, **algo})
    return cfg.validate()


def _trajectories(seed: int) -> Trajectories:
    rng = np.random.default_rng(seed)
    b = P * N
    tokens = rng.integers(1, V, size=(b, T)).astype(np.int32)
    two_turns = rng.random(b) < 0.6
    length = np.where(two_turns, 11, 6).astype(np.int32)
    loss_mask = np.zeros((b, T), bool)
    loss_mask[:, 3:6] = True
    loss_mask[two_turns, 8:11] = True
    tokens[np.arange(T)[None, :] >= length[:, None]] = 0
    turn_end = np.where(two_turns[:, None], [[5, 10]], [[5, -1]]).astype(np.int32)
    turn_reward = np.round(rng.normal(size=(b, K)), 1).astype(np.float32)
    turn_reward[turn_end < 0] = 0.0
    turn_reward[:N] = turn_reward[0]  # group 0: every rollout the same (std 0: never kept by the filters)
    reward = turn_reward.sum(1).astype(np.float32)
    z = lambda dt: np.zeros((b,), dt)  # noqa: E731
    return Trajectories(
        tokens=jnp.asarray(tokens), length=jnp.asarray(length), loss_mask=jnp.asarray(loss_mask),
        logprobs=jnp.zeros((b, T), jnp.float32), turn_end=jnp.asarray(turn_end),
        turn_reward=jnp.asarray(turn_reward), reward=jnp.asarray(reward),
        group=jnp.asarray(np.arange(b) // N, jnp.int32), seed=jnp.asarray(np.arange(b) // N, jnp.int32),
        success=jnp.asarray(z(bool)), action_is_valid=jnp.asarray(z(bool)), num_actions=jnp.asarray(z(np.int32)),
        num_effective=jnp.asarray(z(np.int32)), num_turns=jnp.asarray(1 + two_turns.astype(np.int32)),
        num_format_errors=jnp.asarray(z(np.int32)), response_length=jnp.asarray(loss_mask.sum(1).astype(np.int32)),
        truncated=jnp.asarray(z(bool)))


def _sgd(lr=LR):
    # Skips a non-finite step, as the trainer's optimizer (optim.make_optimizer) does.
    return optax.apply_if_finite(optax.sgd(lr), max_consecutive_errors=1_000_000)


class Setup:
    def __init__(self, cfg: Config, critic: bool):
        self.cfg = cfg
        policy = Qwen2(Qwen2Config.from_preset("tiny").replace(vocab_size=V), rngs=nnx.Rngs(0))
        self.graph, self.actor = nnx.split(policy)
        self.critic_graph, self.critic = (nnx.split(critic_from_policy(policy, nnx.Rngs(1))) if critic
                                          else (None, {}))
        noise = jax.random.PRNGKey(7)
        self.ref = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(noise, x.shape, x.dtype), self.actor)
        self.programs = StepPrograms(StepSettings.of(cfg), self.graph, self.critic_graph, _sgd(), _sgd(CRITIC_LR))
        self.prepare = jax.jit(self.programs.prepare)
        self.update = jax.jit(self.programs.update)
        self.traj = _trajectories(3)
        # The plain losses, jitted only to save dispatch time (one compile per configuration).
        self.plain_actor_vg = jax.jit(jax.value_and_grad(lambda p, mb: plain_actor_loss(self, p, mb), has_aux=True))
        self.plain_critic_vg = jax.jit(jax.value_and_grad(lambda p, mb: plain_critic_loss(self, p, mb)))

    def state(self, iteration: int) -> TrainState:
        return TrainState(iteration=jnp.asarray(iteration, jnp.int32), key=jax.random.PRNGKey(11),
                          actor=self.actor, actor_opt=_sgd().init(self.actor), critic=self.critic,
                          critic_opt=_sgd(CRITIC_LR).init(self.critic) if self.critic_graph is not None else {},
                          skipped_updates=jnp.zeros((), jnp.int32))


CONFIGS = {
    # PPO with a critic, KL (k3) in the loss, critic warm-up, sampling temperature 0.7.
    "ppo": (dict(estimator="gae", kl_coef=0.1, kl_type="k3", critic_warmup=2, temperature=0.7,
                 entropy_coef=0.01), True),
    # Bi-level GAE on per-turn rewards, KL (k1) in the reward, variance-cover filter, seq-mean-token-sum.
    # (V1's filter_type="variance_cover", filter_cover=0.3 with ratio 0.5: top_p 0.3 over at most 2 groups.)
    "bilevel": (dict(estimator="gae", bi_level_gae=True, reward_placement="turn", gamma=0.9, lam=0.8,
                     kl_coef=0.05, kl_type="k1", kl_in_reward=True, strategy="top_p", value=0.3, max_groups=2,
                     agg="seq-mean-token-sum"), True),
    # GRPO on group-normalised scores, no critic, seq-mean-token-mean, no dual clip.
    "grpo": (dict(estimator="grpo", reward_norm="mean_std", agg="seq-mean-token-mean", eps_high=0.2,
                  entropy_coef=0.0), False),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def setup(request):
    algo, critic = CONFIGS[request.param]
    s = Setup(_config(**dict(algo)), critic)
    s.name = request.param
    return s


# ------------------------------------------------------------------------------------ plain reference
def plain_logp(graph, params, tokens, valid, temperature):
    """Full logits / temperature, log-softmax, the target's entry: ([K, T-1] logp, entropy)."""
    model = nnx.merge(graph, params)
    hidden, _ = model(tokens, valid, None)
    logits = model.logits(hidden)[:, :-1] / temperature
    logsm = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logsm, tokens[:, 1:, None], axis=-1)[..., 0]
    return logp, -jnp.sum(jnp.exp(logsm) * logsm, axis=-1)


def _gae_row(r, v, m, gamma, lam, reset=None):
    adv = np.zeros_like(r)
    next_v = next_a = 0.0
    for t in reversed(range(len(r))):
        if reset is not None and reset[t]:
            next_v = next_a = 0.0
        if m[t]:
            a = r[t] + gamma * next_v - v[t] + gamma * lam * next_a
            adv[t], next_v, next_a = a, v[t], a
    return adv


def _whiten(x, m):
    vals = x[m]
    n = vals.size
    var = vals.var() * n / (n - 1)
    return np.where(m, (x - vals.mean()) / np.sqrt(var + 1e-8), 0.0)


def _plain_token_rewards(a, rw, n: int, k: int, mask, traj, rows, old, ref):
    """Group-normalised scores placed on tokens (plus KL in the reward), as `plain_prepare` needs."""
    scores = rw.copy()
    if a.reward_norm == "mean_std":
        for g in range(k):
            x = rw[g * n:(g + 1) * n]
            sd = np.std(x, ddof=1)
            scores[g * n:(g + 1) * n] = (x - x.mean()) / (sd + 1e-6) if sd > 1e-6 else 0.0
    kk = len(rows)
    tok_r = np.zeros((kk, T - 1))
    te = np.asarray(traj.turn_end)[rows] - 1  # target coordinates
    tr = np.asarray(traj.turn_reward)[rows]
    for b in range(kk):
        if a.reward_placement == "trajectory":
            if mask[b].any():
                tok_r[b, np.nonzero(mask[b])[0][-1]] = scores[b]
        else:
            for j in range(K):
                if te[b, j] >= 0:
                    tok_r[b, te[b, j]] += tr[b, j]
    if a.kl_coef > 0 and a.kl_in_reward:
        assert a.kl_type == "k1"
        tok_r = tok_r - a.kl_coef * np.where(mask, old - ref, 0.0)
    tok_r = np.where(mask, tok_r, 0.0)
    return tok_r


def plain_prepare(s: Setup, traj: Trajectories) -> dict:
    a, r = algo_view(s.cfg), s.cfg.rollout
    n, temp = r.group_size, r.temperature
    reward = np.asarray(traj.reward)
    std = np.array([np.std(reward[g * n:(g + 1) * n], ddof=1) for g in range(P)])
    order = sorted(range(P), key=lambda g: -std[g])  # stable: the lower index wins a tie
    k = int(a.value * P) if a.strategy == "top_k" else a.max_groups
    groups = order[:k]
    if a.strategy == "top_k":
        used = [True] * k
    else:
        used, before = [], 0.0
        for g in groups:
            used.append(bool(before < a.value * std.sum() - 0.01 and std[g] > 0))
            before += std[g]
    rows = np.array([g * n + j for g in groups for j in range(n)])
    row_w = np.repeat(np.array(used, np.float32), n)
    tokens = np.asarray(traj.tokens)[rows]
    length = np.asarray(traj.length)[rows]
    valid = np.arange(T)[None, :] < length[:, None]
    mask = np.asarray(traj.loss_mask)[rows][:, 1:] & (row_w[:, None] > 0)
    old, _ = plain_logp(s.graph, s.actor, tokens, valid, temp)
    old = np.asarray(old)
    ref = np.asarray(plain_logp(s.graph, s.ref, tokens, valid, temp)[0]) if a.kl_coef > 0 else np.zeros_like(old)
    values = np.zeros_like(old)
    if s.critic_graph is not None:
        values = np.asarray(nnx.merge(s.critic_graph, s.critic)(tokens, valid))[:, :-1]
    values = np.where(mask, values, 0.0)

    kk = len(rows)
    tok_r = _plain_token_rewards(a, reward[rows], n, k, mask, traj, rows, old, ref)
    te = np.asarray(traj.turn_end)[rows] - 1  # target coordinates

    adv = np.zeros_like(tok_r)
    if a.estimator == "gae" and not a.bi_level_gae:
        for b in range(kk):
            adv[b] = _gae_row(tok_r[b], values[b], mask[b], a.gamma, a.lam)
        ret = np.where(mask, adv + values, 0.0)
        adv = _whiten(adv, mask)
    elif a.estimator == "gae":
        hg = 0.95  # bi-level GAE's turn-level discount (advantages.bilevel_gae default)
        for b in range(kk):
            ends = [int(e) for e in te[b] if e >= 0]
            g_turn, next_v, next_a = {}, 0.0, 0.0
            for e in reversed(ends):
                a_k = tok_r[b, e] + hg * next_v - values[b, e] + hg * a.lam * next_a
                g_turn[e] = a_k + values[b, e]
                next_v, next_a = values[b, e], a_k
            r2 = tok_r[b].copy()
            reset = np.zeros(T - 1, bool)
            for e, g in g_turn.items():
                r2[e], reset[e] = g, True
            adv[b] = _gae_row(r2, values[b], mask[b], a.gamma, a.lam, reset)
        ret = np.where(mask, adv + values, 0.0)
        adv = _whiten(adv, mask)
    else:
        sc = np.where(mask, tok_r, 0.0).sum(1)
        for g in range(k):
            x = sc[g * n:(g + 1) * n]
            sc[g * n:(g + 1) * n] = (x - x.mean()) / (np.std(x, ddof=1) + 1e-6)
        adv = np.where(mask, sc[:, None], 0.0)
        ret = adv
    return dict(tokens=tokens, valid=valid, mask=mask, old_logp=old, ref_logp=ref, values=values,
                advantages=adv, returns=ret, row_weight=row_w)


def _agg(x, m, mode):
    m = np.asarray(m, bool) if not isinstance(m, jax.Array) else m
    mf = m.astype(jnp.float32)
    x = jnp.where(m, x, 0.0)
    if mode == "token-mean":
        return jnp.sum(x) / jnp.maximum(jnp.sum(mf), 1.0)
    cnt = jnp.sum(mf, axis=1)
    seq = jnp.sum(x, axis=1)
    if mode == "seq-mean-token-mean":
        seq = seq / jnp.maximum(cnt, 1.0)
    return jnp.sum(seq) / jnp.maximum(jnp.sum(cnt > 0), 1)


def plain_actor_loss(s: Setup, params, mb: dict):
    a = algo_view(s.cfg)
    logp, ent = plain_logp(s.graph, params, mb["tokens"], mb["valid"], s.cfg.rollout.temperature)
    m, adv = mb["mask"], mb["advantages"]
    log_ratio = jnp.clip(logp - mb["old_logp"], -20, 20)  # verl clamps before exp and in its approx KL
    ratio = jnp.exp(log_ratio)
    l1, l2 = -adv * ratio, -adv * jnp.clip(ratio, 1 - a.eps_low, 1 + a.eps_high)
    per_tok = jnp.maximum(l1, l2)
    per_tok = jnp.where(adv < 0, jnp.minimum(per_tok, -adv * a.dual_clip), per_tok)
    pg = _agg(per_tok, m, a.agg)
    loss = pg - a.entropy_coef * _agg(ent, m, a.agg)
    if a.kl_coef > 0 and not a.kl_in_reward:
        d = jnp.clip(mb["ref_logp"] - logp, -20, 20)
        loss = loss + a.kl_coef * _agg(jnp.clip(jnp.exp(d) - d - 1, -10, 10), m, a.agg)
    mf = m.astype(jnp.float32)
    clipped = ((adv > 0) & (ratio > 1 + a.eps_high)) | ((adv < 0) & (ratio < 1 - a.eps_low))
    metrics = {"actor/pg_loss": pg, "actor/pg_clipfrac": jnp.sum(clipped * mf) / jnp.sum(mf),
               "actor/approx_kl": jnp.sum(-log_ratio * mf) / jnp.sum(mf)}
    return loss, metrics


def plain_critic_loss(s: Setup, params, mb: dict):
    v = nnx.merge(s.critic_graph, params)(mb["tokens"], mb["valid"])[:, :-1]
    c = s.cfg.loss.value_clip
    vc = jnp.clip(v, mb["values"] - c, mb["values"] + c)
    return 0.5 * _agg(jnp.maximum((v - mb["returns"]) ** 2, (vc - mb["returns"]) ** 2), mb["mask"], "token-mean")


def plain_update(s: Setup, state: TrainState, batch: dict):
    """Epochs x mini-batches of plain SGD; a non-finite gradient leaves the parameters as they are."""
    a = algo_view(s.cfg)
    kk = batch["tokens"].shape[0]
    _, perm_key = jax.random.split(state.key)
    actor, critic = state.actor, state.critic
    train_actor = int(state.iteration) + 1 >= a.critic_warmup  # verl: critic_warmup <= global_steps (from 1)
    skipped, metrics = 0, []
    for epoch in range(a.ppo_epochs):
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(perm_key, epoch), kk))
        perm = perm[np.argsort(batch["row_weight"][perm] <= 0, kind="stable")]  # kept rows first
        for j in range(kk // a.mini_batch_size):
            idx = perm[j * a.mini_batch_size:(j + 1) * a.mini_batch_size]
            if not (batch["row_weight"][idx] > 0).any():
                continue  # only filtered-out rows: no optimizer step
            mb = {k_: jnp.asarray(v[idx]) for k_, v in batch.items()}
            (_, m), g = s.plain_actor_vg(actor, mb)
            finite = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(g))
            if train_actor and finite:
                actor = jax.tree.map(lambda p, g_: p - LR * g_, actor, g)
            skipped += int(train_actor and not finite)
            if s.critic_graph is not None:
                cl, cg = s.plain_critic_vg(critic, mb)
                critic = jax.tree.map(lambda p, g_: p - CRITIC_LR * g_, critic, cg)
                m = {**m, "critic/value_loss": cl}
            metrics.append(m)
    mean = {k_: float(np.mean([float(m[k_]) for m in metrics])) for k_ in metrics[0]}
    return actor, critic, skipped, mean


def _batch_dict(batch) -> dict:
    return {f.name: np.asarray(getattr(batch, f.name)) for f in dataclasses.fields(batch)
            if getattr(batch, f.name) is not None}


def _assert_trees_close(got, want, atol, rtol=1e-4):
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


def _moved(new, old) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in
               zip(jax.tree.leaves(new), jax.tree.leaves(old)))


# ------------------------------------------------------------------------------------ tests
def test_prepare_matches_plain_computation(setup):
    batch, _ = setup.prepare(setup.actor, setup.critic, setup.ref, setup.traj)
    got, want = _batch_dict(batch), plain_prepare(setup, setup.traj)
    np.testing.assert_array_equal(got["tokens"], want["tokens"])
    np.testing.assert_array_equal(got["mask"], want["mask"])
    np.testing.assert_array_equal(got["row_weight"], want["row_weight"])
    m = want["mask"]
    assert m.sum() > 10
    for key in ("old_logp", "ref_logp", "values"):
        np.testing.assert_allclose(got[key][m], want[key][m], rtol=1e-5, atol=1e-5, err_msg=key)
    for key in ("advantages", "returns"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-4, err_msg=key)
    if setup.name == "bilevel":
        # The variance-cover filter used only part of its slots here, so some rows train with weight 0.
        assert 0 < want["row_weight"].sum() < want["row_weight"].size
    assert np.abs(want["advantages"][m]).max() > 0.1


def test_update_matches_plain_sgd_epochs_and_minibatches(setup):
    batch, _ = setup.prepare(setup.actor, setup.critic, setup.ref, setup.traj)
    state = setup.state(iteration=5)
    new, metrics = setup.update(state, batch)
    actor, critic, skipped, want = plain_update(setup, state, _batch_dict(batch))
    _assert_trees_close(new.actor, actor, atol=2e-5)
    if setup.critic_graph is not None:
        _assert_trees_close(new.critic, critic, atol=2e-5)
    for key, v in want.items():
        np.testing.assert_allclose(float(metrics[key]), v, rtol=1e-3, atol=1e-5, err_msg=key)
    assert int(new.skipped_updates) == skipped == 0
    assert int(new.iteration) == 6
    # Several SGD steps on the same rollout: the later mini-batches see ratios away from 1 and the
    # clip engages (an on-policy single step would have approx_kl = 0 and clip fraction 0).
    assert want["actor/pg_clipfrac"] > 0.01
    assert abs(want["actor/approx_kl"]) > 1e-3


def test_critic_warmup_counted_as_verl(setup):
    """verl updates the actor iff `critic_warmup <= global_steps`, global_steps = 1, 2, ... : with
    critic_warmup = 2 the first iteration trains only the critic, the second trains both."""
    if setup.name != "ppo":
        pytest.skip("the ppo configuration carries critic_warmup = 2")
    assert setup.cfg.batching.critic_warmup == 2
    batch, _ = setup.prepare(setup.actor, setup.critic, setup.ref, setup.traj)
    first, _ = setup.update(setup.state(iteration=0), batch)
    assert _moved(first.actor, setup.actor) == 0.0
    assert _moved(first.actor_opt, setup.state(0).actor_opt) == 0.0
    assert _moved(first.critic, setup.critic) > 1e-3
    second, _ = setup.update(first.replace(actor=setup.actor), batch)  # iteration 1 = global step 2
    assert _moved(second.actor, setup.actor) > 1e-3
    _, critic, _, _ = plain_update(setup, setup.state(0), _batch_dict(batch))
    _assert_trees_close(first.critic, critic, atol=2e-5)


def test_nonfinite_gradient_is_skipped_and_counted(setup):
    if setup.name != "grpo":
        pytest.skip("one configuration suffices (same compiled update)")
    batch, _ = setup.prepare(setup.actor, setup.critic, setup.ref, setup.traj)
    d = _batch_dict(batch)
    bad_row = int(np.nonzero(d["mask"].any(1))[0][0])
    adv = d["advantages"].copy()
    adv[bad_row][d["mask"][bad_row]] = np.nan
    bad = batch.replace(advantages=jnp.asarray(adv))
    state = setup.state(iteration=3).replace(skipped_updates=jnp.asarray(4, jnp.int32))
    new, metrics = setup.update(state, bad)
    actor, _, skipped, _ = plain_update(setup, state, {**d, "advantages": adv})
    # The bad row sits in exactly one mini-batch per epoch: one skipped step per epoch, added to the count.
    assert skipped == setup.cfg.batching.ppo_epochs
    assert int(new.skipped_updates) == 4 + skipped
    assert float(metrics["train/skipped_updates"]) == 4 + skipped
    _assert_trees_close(new.actor, actor, atol=2e-5)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(new.actor))
    assert _moved(new.actor, setup.actor) > 1e-3  # the finite mini-batches still trained


# ------------------------------------------------------------------------------------ temperature
def test_rollout_logprobs_equal_trainer_old_logprobs_at_temperature(tmp_path):
    """The sampler draws from softmax(logits / T) and records those log-probs; the trainer's
    old log-probs (PPO's denominator) must be of the same distribution. Measured difference ~1e-6
    (KV-cache decode vs one full forward, float32); at T = 0.5 without the scaling it is ~O(1)."""
    # With a critic (the estimator does not enter the log-probs): the config of test_lora_trainer.py's
    # Bandit test, so the session compiles this rollout and prepare once.
    cfg = load_config("tiny_cpu.py", list(BANDIT_T05))
    tr = Trainer(cfg, tmp_path, quiet=True)
    traj = tr.rollout(tr.state.actor, jax.random.PRNGKey(0), np.arange(2, dtype=np.int32))
    batch, _ = tr.prepare_fn(tr.state.actor, tr.state.critic, tr.ref, traj)
    m = np.asarray(batch.mask)
    assert m.sum() >= 8
    rec = np.asarray(traj.logprobs)[:, 1:][m]  # filter_ratio 1 keeps the rows in order
    np.testing.assert_allclose(np.asarray(batch.old_logp)[m], rec, atol=2e-4)
    # The unscaled log-probs differ: the test can tell the two apart.
    raw = StepPrograms(StepSettings.of(dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, temperature=1.0))),
                       tr.policy_graph, tr.critic_graph, None, None, vocab=tr.vocab)
    raw_batch, _ = jax.jit(raw.prepare)(tr.state.actor, tr.state.critic, tr.ref, traj)
    assert np.abs(np.asarray(raw_batch.old_logp)[m] - rec).max() > 0.05
