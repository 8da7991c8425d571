"""The SFT trainer on the tiny CPU model (task vocabulary): the loss is the token-mean NLL of the
assistant's tokens computed from full logits, an empty mask moves nothing, a fixed batch is
overfitted, the run logs/checkpoints/exports, RL starts from the export, and a resumed run ends with
exactly the parameters of an uninterrupted one."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ragen_jax.experiment.config import ConfigError, load_config
from hypothesis import given, settings, strategies as st

from ragen_jax.trainer.sft import (SFTTrainer, bucketed_batches, length_buckets, prompt_groups,
                                  shared_prefix_length, sft_loss)
from ragen_jax.trainer.rl import Trainer

ROOT = Path(__file__).resolve().parents[3]
FAST = ["--config.model.vocab=task", "--config.prompt.max_turns=2", "--config.prompt.max_response_tokens=32",
        "--config.rollout.max_context=512", "--config.sft.num_demos=8", "--config.sft.batch_size=4",
        "--config.sft.epochs=3", "--config.sft.lr=3e-3", "--config.sft.save_every=2", "--config.train.val_size=2",
        "--config.train.val_every=1", "--config.mesh.data=1"]


def _cfg(*extra):
    return load_config("tiny_cpu.py", [*FAST, *extra])


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("sft")
    tr = SFTTrainer(_cfg(), wd, quiet=True, demo_chunk=8)
    hist = tr.train()
    return wd, tr, hist


def test_run_demos_logs_checkpoints_and_export(run):
    wd, tr, hist = run
    d = tr.demo_stats
    # BFS teacher: every demo whose room is solvable within the budget succeeds; only successes are kept.
    assert d["demo/num_generated"] == 8 and d["demo/num_kept"] == tr.demos.num >= 6
    assert d["demo/format_ok"] == 1.0 and d["demo/action_is_valid"] == 1.0
    assert bool(np.all(tr.demos.length <= tr.demos.tokens.shape[1]))
    steps = [h["step"] for h in hist if "sft/loss" in h]
    assert steps == list(range(1, 3 * (tr.demos.num // 4) + 1))
    assert tr.trace_count == len(np.unique(tr.demos.width))  # one compiled step per batch width
    for h in hist:
        for k, v in h.items():
            assert math.isfinite(v), k
    vals = [h for h in hist if "val/Sokoban/success" in h]
    assert [v["step"] for v in vals] == [0, steps[-1]]  # before and after training
    rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    assert any("sft/token_accuracy" in r and "sft/grad_norm" in r for r in rows)
    assert any("demo/success" in r for r in rows) and json.loads((wd / "demos.json").read_text())["demo/num_kept"] >= 6
    assert list((wd / "tb").glob("events.out.tfevents.*"))
    ck = sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
    assert ck[-1] == steps[-1]
    assert (wd / "policy").is_dir()
    # Learning on a handful of demos: the last epoch fits far better than the first step.
    first, last = hist[1], hist[-2]
    assert last["sft/loss"] < first["sft/loss"] - 1.0


def test_loss_is_the_token_mean_nll_of_the_assistant_tokens(run):
    _, tr, _ = run
    idx = np.arange(4)
    loss, m = tr.loss(idx)
    tokens, mask, length = (np.asarray(x[idx]) for x in (tr.demos.tokens, tr.demos.loss_mask, tr.demos.length))
    ids = tr.vocab.model_ids(tokens)
    valid = np.arange(tokens.shape[1])[None] < length[:, None]

    @jax.jit
    def full_logits(params, ids, valid):  # [B, T, V] in full (small: the task vocabulary)
        model = nnx.merge(tr.policy_graph, params)
        return model.logits(model(ids, valid, None)[0])

    logits = np.asarray(full_logits(tr.state.params, ids, jnp.asarray(valid)), np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    ids = np.asarray(ids)
    # Token t+1 is predicted at position t; only the teacher's (assistant's) tokens count.
    tgt = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], axis=-1)[..., 0]
    w = mask[:, 1:] & valid[:, 1:]
    assert w.sum() > 0 and w.sum() == mask.sum() - mask[:, 0].sum()
    np.testing.assert_allclose(loss, -(tgt * w).sum() / w.sum(), rtol=2e-5)
    hits = (np.argmax(logits[:, :-1], -1) == ids[:, 1:])
    np.testing.assert_allclose(m["sft/token_accuracy"], (hits * w).sum() / w.sum(), atol=1e-6)
    assert m["sft/tokens"] == w.sum()


def test_empty_mask_gives_zero_loss_and_zero_gradients(run):
    _, tr, hist = run
    traces = tr.trace_count
    prefix, tokens, mask, length = tr.put_batch(tr.batch_indices(0))
    # The training step itself (same compiled program): no assistant token, no loss, no gradient.
    # The step donates its state: give it a copy so that the trainer's own state stays alive.
    _, m = tr.step_fn(jax.tree.map(jnp.copy, tr.state), prefix, tokens, jnp.zeros_like(mask), length)
    assert float(m["sft/loss"]) == 0.0 and float(m["sft/grad_norm"]) == 0.0 and float(m["sft/tokens"]) == 0.0
    assert all(h["sft/grad_norm"] > 0 for h in hist if "sft/loss" in h)  # ... while real batches have one
    assert tr.trace_count == traces


def test_fixed_batch_is_overfitted(run):
    _, tr, _ = run
    traces = tr.trace_count
    batch = tr.put_batch(tr.batch_indices(0))
    state = jax.tree.map(jnp.copy, tr.state)  # the step donates its state; the trainer's stays alive
    accs, losses = [], []
    for _ in range(20):
        state, m = tr.step_fn(state, *batch)
        accs.append(float(m["sft/token_accuracy"]))
        losses.append(float(m["sft/loss"]))
    assert losses[-1] < 0.5 * losses[0]
    assert accs[-1] >= accs[0] + 0.2 and accs[-1] >= 0.6
    assert tr.trace_count == traces


def test_shared_prefix_buckets_and_head_at_targets_give_the_full_sequence_loss_and_gradients(tmp_path):
    # Truth: the same demos run as whole sequences, padded to the longest (prefix and buckets off),
    # the head at every position.
    # Full-history conversations: 1-turn and 2-turn demos of different lengths (the demo config's
    # single-turn rows would all fall into one bucket).
    cfg = load_config("demo_cpu.py", ["sft.num_demos=96", "sft.batch_size=8", "prompt.context_window_mode=full",
                                      "prompt.max_context_window=-1"])
    tr = SFTTrainer(cfg, tmp_path / "s", quiet=True)
    d = tr.make_demos()
    assert d.prefix_len > 100  # Sokoban: system prompt + instructions
    widths = np.unique(d.width)
    assert len(widths) >= 2 and widths.max() < d.tokens.shape[1] - d.prefix_len  # 1-turn and 2-turn demos
    loss_full = jax.jit(jax.value_and_grad(lambda p, *b: sft_loss(tr.policy_graph, p, None, *b, vocab=tr.vocab)[0]))
    loss_shared = jax.jit(jax.value_and_grad(lambda p, *b: sft_loss(tr.policy_graph, p, *b, vocab=tr.vocab)[0]))
    # The step's loss: the head only at each row's loss-carrying targets (at most d.max_targets).
    assert tr.max_targets == d.max_targets and 0 < d.max_targets < widths.min() - 1
    loss_targets = jax.jit(jax.value_and_grad(
        lambda p, *b: sft_loss(tr.policy_graph, p, *b, vocab=tr.vocab, max_targets=tr.max_targets), has_aux=True))
    for w in widths:
        idx = np.flatnonzero(d.width == w)[:8]
        prefix, tokens, mask, length = tr.put_batch(idx)
        assert tokens.shape[1] == w and int(jnp.max(length)) <= w
        la, ga = loss_full(tr.state.params, d.tokens[idx], d.loss_mask[idx], d.length[idx])
        lb, gb = loss_shared(tr.state.params, prefix, tokens, mask, length)
        (lc, mc), gc = loss_targets(tr.state.params, prefix, tokens, mask, length)
        _, m_full = sft_loss(tr.policy_graph, tr.state.params, None, d.tokens[idx], d.loss_mask[idx], d.length[idx],
                             vocab=tr.vocab)
        np.testing.assert_allclose(la, lb, rtol=1e-5)
        np.testing.assert_allclose(la, lc, rtol=1e-5)
        for k in ("sft/token_accuracy", "sft/tokens"):
            np.testing.assert_allclose(m_full[k], mc[k], rtol=1e-6)
        for g in (gb, gc):
            for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(g)):
                np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-6)


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(2, 12), t=st.integers(2, 12), data=st.data())
def test_shared_prefix_length_is_the_longest_valid_prefix(rows, t, data):
    common = data.draw(st.integers(0, t))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    tokens = rng.integers(0, 3, (rows, t))
    tokens[:, :common] = tokens[0, :common]
    loss_mask = rng.random((rows, t)) < data.draw(st.sampled_from([0.0, 0.1, 0.5]))
    length = rng.integers(1, t + 1, rows)
    p = shared_prefix_length(tokens, loss_mask, length)

    def ok(n):  # shared, no assistant token at 0..n (token n is predicted by the prefix), every row longer
        return (n == 0 or bool(np.all(tokens[:, :n] == tokens[:1, :n]))) and not loss_mask[:, :n + 1].any() \
            and n < length.min()

    assert p == 0 or ok(p)
    assert not any(ok(n) for n in range(p + 1, t + 1))


@settings(max_examples=150, deadline=None)
@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=80), bucket=st.sampled_from([0, 16, 64]),
       b=st.integers(1, 9), epoch=st.integers(0, 3))
def test_length_buckets_and_epoch_batches(lens, bucket, b, epoch):
    lens = np.asarray(lens)
    full = -(-int(lens.max()) // 64) * 64
    width = length_buckets(lens, bucket, full, b)
    assert np.all(width >= lens) and np.all(width <= full)  # every row fits its width
    assert np.all((width % bucket == 0) | (width == full)) if bucket else np.all(width == full)
    sizes = np.unique(width, return_counts=True)[1]
    assert sizes.min() >= b or len(sizes) == 1  # every width fills a batch (or there is only one)
    if bucket and len(lens) >= 2 * b:  # a row pads only up to the narrowest width in use that fits it
        used = np.unique(width)
        rounded = np.minimum(-(-lens // bucket) * bucket, full)
        assert all(w == used[used >= r].min() for w, r in zip(width, rounded))
    batches = bucketed_batches(width, b, seed=0, epoch=epoch)
    flat = np.concatenate(batches) if batches else np.zeros(0, int)
    assert len(flat) == len(set(flat.tolist()))  # no row twice in an epoch
    assert all(len(x) == b and len(set(width[x].tolist())) == 1 for x in batches)  # full, one width each
    for w, n in zip(*np.unique(width, return_counts=True)):  # only a partial batch per width is left out
        assert np.sum(width[flat] == w) == n // b * b
    again = bucketed_batches(width, b, seed=0, epoch=epoch)
    assert all(np.array_equal(x, y) for x, y in zip(batches, again))  # a pure function: resumes replay it


def test_rl_trainer_starts_from_the_export(run, tmp_path):
    wd, tr, _ = run
    rl = Trainer(_cfg("--config.train.val_every=0", f"--config.model.init_from={wd}"), tmp_path / "rl", quiet=True)
    for a, b in zip(_leaves(rl.state.actor), _leaves(tr.state.params)):
        np.testing.assert_array_equal(a, b)


def test_resume_ends_with_the_uninterrupted_parameters(run, tmp_path):
    _, full, hist = run
    wd = tmp_path / "resume"
    over = ("--config.train.val_every=0",)
    first = SFTTrainer(_cfg(*over), wd, quiet=True, demo_chunk=8).train(max_steps=3)  # "killed" after step 3
    assert not (wd / "policy").exists()
    second = SFTTrainer(_cfg(*over), wd, quiet=True, demo_chunk=8)
    assert second.step == 2  # the last checkpoint (save_every=2)
    # The interrupted run evaluates from its checkpoint (its `params` field): the parameters resumed.
    from ragen_jax.evaluation.policies import load_for_eval

    for a, b in zip(_leaves(load_for_eval(wd).params), _leaves(second.state.params)):
        np.testing.assert_array_equal(a, b)
    rest = second.train()
    assert [h["step"] for h in rest][0] == 3 and (wd / "policy").is_dir()
    want = {h["step"]: h["sft/loss"] for h in hist if "sft/loss" in h}
    for h in first + rest:
        np.testing.assert_allclose(h["sft/loss"], want[h["step"]], rtol=1e-5)
    for a, b in zip(_leaves(second.state.params), _leaves(full.state.params)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_launcher_reports_bad_input_in_one_line(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("sft_launch", ROOT / "launch" / "sft.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--config", "tiny_cpu.py", "--workdir", str(tmp_path / "a"), "--config.sft.lr=fast"]) == 2
    assert capsys.readouterr().err.strip() == "error: sft.lr expects a number, got 'fast'"
    assert mod.main(["--config", "tiny_cpu.py", "--workdir", str(tmp_path / "b"), "--config.sft.batch_size=3"]) == 2
    assert "sft.batch_size = 3 is not divisible by the 8 devices" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="demo_filter='best' is not valid"):
        SFTTrainer(_cfg(), tmp_path / "c", demo_filter="best")


# --------------------------------------------------------------------------- Bandit arm balance
from fractions import Fraction  # noqa: E402

from ragen_jax.trainer.sft import balance_arm_choices  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(high=st.lists(st.booleans(), max_size=60), p=st.sampled_from([0.0, 0.25, 0.5, 0.6, 1.0]))
def test_bandit_demos_are_balanced_to_exactly_the_high_arm_probability(high, p):
    high = np.asarray(high, bool)
    keep = balance_arm_choices(high, p)
    m, k = int(keep.sum()), int((keep & high).sum())
    # Brute force: the largest subset size whose high-arm fraction can be exactly p.
    feasible = [(n, j) for n in range(len(high) + 1) for j in range(n + 1)
                if j <= high.sum() and n - j <= (~high).sum() and Fraction(j, max(n, 1)) == Fraction(str(p)) * (n > 0)]
    assert (m, k) == max(feasible)
    # The earliest demos of each arm are the ones kept (deterministic, seed order).
    for arm in (True, False):
        idx = np.flatnonzero(high == arm)
        assert keep[idx].tolist() == sorted(keep[idx].tolist(), reverse=True)


@pytest.fixture(scope="module")
def bandit_sft(tmp_path_factory):
    # Micro-batches of 4: the prompt-groups test also covers a step accumulated over two passes.
    cfg = load_config("demo_cpu_bandit.py", ["sft.num_demos=64", "sft.batch_size=8", "sft.epochs=1",
                                             "sft.micro_batch_size=4"])
    tr = SFTTrainer(cfg, tmp_path_factory.mktemp("bandit_sft"), quiet=True)
    return tr, tr.make_demos()


def test_bandit_warm_start_keeps_a_balanced_subset(bandit_sft):
    tr, demos = bandit_sft
    assert tr.demo_stats["demo/num_kept"] == len(demos.length)
    # Which arm each kept demo pulled, read back from its tokens with the tokenizer (independent of
    # the rollout's success flag that the balancing used).
    texts = [tr.tokenizer.decode(t[:n].tolist()) for t, n in zip(demos.tokens, demos.length)]
    answers = [t.rsplit("<answer>", 1)[1].split("</answer>", 1)[0].strip() for t in texts]
    from envs_jax.bandit import HIGH

    high_names = set()
    for te in tr.text_envs.values():
        high_names.add(te.action_names[HIGH])
    n_high = sum(a in high_names for a in answers)
    assert 2 * n_high == len(answers) and len(answers) >= 16


def test_prompt_groups_give_the_per_row_loss_and_gradients(bandit_sft):
    tr, d = bandit_sft
    # Bandit's demos show one of 2 prompts (the arms in either order), ~215 tokens before a ~20-token
    # answer: the trainer groups them. The groups, read back as text with the tokenizer: demos share
    # a group exactly when everything before their answer is the same text.
    assert d.grouping is not None and tr.demo_stats["demo/prompt_groups"] == 2
    first = np.argmax(d.loss_mask, axis=1)
    prompts = [tr.tokenizer.decode(t[:f].tolist()) for t, f in zip(d.tokens, first)]
    assert len(set(prompts)) == 2
    assert all((d.group[i] == d.group[j]) == (prompts[i] == prompts[j]) for i in range(d.num) for j in range(i))
    # Truth: each row's whole sequence through the model (no shared prefix, no groups, the head at
    # every position), one pass.
    loss_full = jax.jit(jax.value_and_grad(lambda p, *b: sft_loss(tr.policy_graph, p, None, *b, vocab=tr.vocab),
                                           has_aux=True))
    loss_grouped = jax.jit(jax.value_and_grad(
        lambda p, *b, group: sft_loss(tr.policy_graph, p, *b, vocab=tr.vocab, max_targets=tr.max_targets,
                                      group=group, grouping=tr.grouping), has_aux=True))
    step = jax.jit(tr.step_body)  # the trainer's step: two micro-batches of 4 rows, each grouped
    traces = tr.trace_count
    for k in range(2):
        idx = tr.batch_indices(k)
        (la, ma), ga = loss_full(tr.state.params, d.tokens[idx], d.loss_mask[idx], d.length[idx])
        (lb, mb), gb = loss_grouped(tr.state.params, *tr.put_batch(idx), group=tr.put_group(idx))
        np.testing.assert_allclose(la, lb, rtol=1e-5)
        for key in ("sft/token_accuracy", "sft/tokens"):
            np.testing.assert_allclose(ma[key], mb[key], rtol=1e-6)
        for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
            np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-6)
        _, m = step(tr.state, *tr.put_batch(idx), group=tr.put_group(idx))
        gnorm = np.sqrt(sum(float(jnp.sum(x * x)) for x in jax.tree.leaves(ga)))
        np.testing.assert_allclose(m["sft/loss"], la, rtol=1e-5)
        np.testing.assert_allclose(m["sft/grad_norm"], gnorm, rtol=1e-4)
    assert tr.trace_count == traces + 1  # both batches: one compiled step


@settings(max_examples=100, deadline=None)
@given(rows=st.integers(1, 12), t=st.integers(1, 10), data=st.data())
def test_prompt_groups_match_the_prompts_before_the_first_assistant_token(rows, t, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    tokens = rng.integers(0, 2, (rows, t))
    loss_mask = rng.random((rows, t)) < data.draw(st.sampled_from([0.0, 0.2, 0.6]))
    length = rng.integers(1, t + 1, rows)
    group, first = prompt_groups(tokens, loss_mask, length)
    prompts = []
    for r in range(rows):  # plain Python: the tokens before the row's first assistant token
        f = next((c for c in range(t) if loss_mask[r, c]), int(length[r]))
        assert first[r] == f
        prompts.append(tuple(tokens[r, :f].tolist()))
    for i in range(rows):
        for j in range(rows):
            assert (group[i] == group[j]) == (prompts[i] == prompts[j])
    assert sorted(set(group.tolist())) == list(range(len(set(prompts))))
