"""LoRA in the trainers (model.lora_rank > 0) on the tiny CPU config: only the adapters (and the critic's
value head) train and hold optimizer state, the frozen base never changes and is not checkpointed, a
fresh adapter gives exactly the full model's numbers, the rollout's log-probs equal the trainer's with
non-zero adapters, a resumed run continues exactly, 8 devices give the numbers of 1, the exports are
the merged policy and a PEFT adapter (loaded by transformers + PEFT when installed), and the SFT
trainer's adapters continue in RL through `model.init_from`."""

from __future__ import annotations

import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from ragen_jax.models import Qwen2, Qwen2Config, save_pretrained
from ragen_jax.models.lora import ALL_TARGETS, TARGETS, LoRAParam, add_lora
from ragen_jax.experiment.policy_export import save_lora_exports
from ragen_jax.infra.checkpoint import load_policy_params
from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.trainer.rl import Trainer
from ragen_jax.trainer.sft import SFTTrainer
from tests.ragen_jax.trainer.tiny_runs import BANDIT_T05

RANK = 4
# The run of test_train_loop.py (PPO with a critic), with adapters of rank 4 and the AOT memory check.
# One mini-batch of 4 per iteration: the mini-batch the 8-device mesh (data 2 x fsdp 2) can split, so
# the 8-device test compares against this very run (its iteration 1 and checkpoint 1), not a new one.
FAST = ["--config.train.iterations=3", "--config.train.val_every=0", "--config.train.save_every=1",
        "--config.rollout.num_groups=2", "--config.rollout.group_size=4", "--config.filter.value=0.5",
        "--config.batching.mini_batch_size=4", "--config.prompt.max_turns=2", "--config.prompt.max_response_tokens=8",
        "--config.rollout.max_context=512", "--config.train.log_samples=0", "--config.mesh.data=1",
        f"--config.model.lora_rank={RANK}", "--config.model.lora_alpha=8", "--config.train.device_memory_gib=16"]


def _cfg(*extra):
    return load_config("tiny_cpu.py", [*FAST, *extra])


def _host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def _paths(state):
    return ["/".join(str(k) for k in path) for path, _ in nnx.to_flat_state(state)]


def _adapter_elements(qcfg, rank):
    """Parameters of the adapters of all seven projections, from the model's shapes (independent of
    the code under test): L x (in + out) x r per projection."""
    h, i, hd = qcfg.hidden_size, qcfg.intermediate_size, qcfg.head_dim
    q, kv = qcfg.num_attention_heads * hd, qcfg.num_key_value_heads * hd
    dims = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
    return qcfg.num_hidden_layers * rank * sum(a + b for a, b in dims)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("lora")
    tr = Trainer(_cfg(), wd, quiet=True)
    before = {"actor": _host(tr.state.actor), "critic": _host(tr.state.critic), "frozen": _host(tr.frozen)}
    hist = tr.train()
    return wd, tr, before, hist


def test_only_adapters_and_value_head_train(lora_run):
    wd, tr, before, hist = lora_run
    assert tr.memory is not None  # the run used the AOT-compiled programs of the memory check
    qcfg = tr.policy.cfg
    actor = _host(tr.state.actor)
    assert all(p.endswith(("lora_a", "lora_b")) for p in _paths(actor))
    assert sum(x.size for x in jax.tree.leaves(actor)) == _adapter_elements(qcfg, RANK)
    # Adam's moments exist for the adapters alone.
    opt_sizes = sum(x.size for x in jax.tree.leaves(_host(tr.state.actor_opt)) if x.ndim)
    assert opt_sizes == 2 * _adapter_elements(qcfg, RANK)
    critic_paths = _paths(tr.state.critic)
    assert all(p.endswith(("lora_a", "lora_b")) or p.startswith("value_head/") for p in critic_paths)
    assert {"value_head/kernel", "value_head/bias"} <= set(critic_paths)
    # The frozen base is bitwise what it was (never donated, never updated).
    for a, b in zip(jax.tree.leaves(before["frozen"]), jax.tree.leaves(_host(tr.frozen))):
        np.testing.assert_array_equal(a, b)
    # Every adapter B moved away from 0, and the critic's head and adapters moved.
    for path, x in nnx.to_flat_state(actor):
        if path[-1] == "lora_b":
            assert np.abs(x[...]).max() > 0, path
    after_critic = _host(tr.state.critic)
    moved = {p: float(np.abs(np.asarray(a[...]) - np.asarray(b[...])).max()) for (p, a), (_, b) in
             zip(nnx.to_flat_state(before["critic"]), nnx.to_flat_state(after_critic))}
    assert moved[("value_head", "kernel")] > 0 and moved[("model", "layers", "mlp", "down_proj", "lora_b")] > 0
    assert [h["step"] for h in hist] == [1, 2, 3]


def test_checkpoints_hold_adapters_value_head_and_optimizer_only(lora_run):
    wd = lora_run[0]
    keys = json.loads((wd / "checkpoints" / "3" / "state" / "_METADATA").read_text())["tree_metadata"]
    arrays = [k for k in keys if "'actor'" in k or "'critic'" in k]
    assert arrays
    for k in arrays:
        assert "lora_a" in k or "lora_b" in k or "value_head" in k, k


def test_exports_are_the_merged_policy_and_the_peft_adapter(lora_run):
    wd, tr, _, _ = lora_run
    actor, frozen = _host(tr.state.actor), _host(tr.frozen)
    cfg = json.loads((wd / "adapter" / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], set(cfg["target_modules"])) == (RANK, 8.0, set(ALL_TARGETS))
    tensors = load_file(str(wd / "adapter" / "adapter_model.safetensors"))
    assert len(tensors) == 2 * len(ALL_TARGETS) * tr.policy.cfg.num_hidden_layers
    a = actor["model"]["layers"]["mlp"]["down_proj"]["lora_a"][...]  # [L, in, r]
    b = actor["model"]["layers"]["mlp"]["down_proj"]["lora_b"][...]  # [L, r, out]
    np.testing.assert_array_equal(tensors["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"], a[1].T)
    np.testing.assert_array_equal(tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"], b[1].T)
    # <run>/policy holds the plain model's weights: W + (alpha / r) A B, computed here in numpy.
    plain = nnx.state(nnx.eval_shape(lambda: Qwen2(tr.policy.cfg.replace(lora_rank=0, lora_targets=()), nnx.Rngs(0))))
    merged = _host(load_policy_params(wd, plain))
    w = frozen["model"]["layers"]["mlp"]["down_proj"]["kernel"][...]
    want = w + (8.0 / RANK) * np.einsum("lir,lro->lio", a, b)
    np.testing.assert_allclose(merged["model"]["layers"]["mlp"]["down_proj"]["kernel"][...], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(merged["model"]["norm"]["scale"][...], frozen["model"]["norm"]["scale"][...])


def test_resume_continues_exactly(lora_run, tmp_path):
    _, _, _, full = lora_run
    wd = tmp_path / "resume"
    first = Trainer(_cfg("--config.train.iterations=2"), wd, quiet=True).train()
    rest = Trainer(_cfg(), wd, quiet=True).train()
    assert [h["step"] for h in first + rest] == [1, 2, 3]
    for g, w in zip(first + rest, full):
        for k in g:
            if not k.startswith("timing/"):
                np.testing.assert_allclose(g[k], w[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_eval_of_an_interrupted_run_rebuilds_the_base_under_its_checkpointed_adapters(lora_run, tmp_path):
    """A LoRA run stopped before its exports has only checkpoints/, which hold the adapters alone:
    the evaluation rebuilds the frozen base as the run did and puts the latest adapters on it. Truth:
    the merged policy export of the same run (plain weights, W + (alpha/r) A B), same logits."""
    import shutil

    from ragen_jax.evaluation.policies import load_for_eval

    wd, tr, _, _ = lora_run
    ck = tmp_path / "ckonly"
    shutil.copytree(wd, ck, ignore=shutil.ignore_patterns("policy", "adapter"))
    got, want = load_for_eval(ck), load_for_eval(wd)
    loaded = dict(nnx.to_flat_state(_host(got.params)))
    adapters = dict(nnx.to_flat_state(_host(tr.state.actor)))
    assert adapters and set(adapters) <= set(loaded)  # adapters applied on the fly, not merged
    for path, x in adapters.items():  # the checkpoint's adapters, bit for bit
        np.testing.assert_array_equal(loaded[path][...], x[...])
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, tr.policy.cfg.vocab_size, (2, 24)), jnp.int32)
    valid = jnp.ones((2, 24), bool)

    def logits(loaded):
        model = nnx.merge(nnx.graphdef(loaded.policy), loaded.params)
        return np.asarray(model.logits(model(tokens, valid)[0]))

    np.testing.assert_allclose(logits(got), logits(want), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------- forward equivalences
BANDIT = list(BANDIT_T05)  # the config of test_step.py's temperature test: its programs compile once


def _set_b(adapters, rng):
    """The adapters with every B drawn from N(0, 0.05) (A unchanged)."""
    pure = adapters.to_pure_dict()

    def walk(d):
        for k, v in d.items():
            if k == "lora_b":
                d[k] = jnp.asarray(rng.normal(0, 0.05, v.shape), v.dtype)
            elif isinstance(v, dict):
                walk(v)

    walk(pure)
    out = jax.tree.map(lambda x: x, adapters)
    nnx.replace_by_pure_dict(out, pure)
    return out


def test_fresh_adapters_equal_the_base_and_rollout_logprobs_equal_the_trainers(tmp_path):
    base = Trainer(load_config("tiny_cpu.py", BANDIT), tmp_path / "base", quiet=True)
    lora = Trainer(load_config("tiny_cpu.py", [*BANDIT, f"model.lora_rank={RANK}"]), tmp_path / "lora", quiet=True)
    key, seeds = jax.random.PRNGKey(0), np.arange(2, dtype=np.int32)
    traj = base.rollout(base.actor_params, key, seeds)
    # B = 0: sampling, log-probs and values are the full model's.
    traj_l = lora.rollout(lora.actor_params, key, seeds)
    np.testing.assert_array_equal(np.asarray(traj_l.tokens), np.asarray(traj.tokens))
    np.testing.assert_allclose(np.asarray(traj_l.logprobs), np.asarray(traj.logprobs), atol=1e-6)
    b0, _ = base.prepare_fn(base.state.actor, base.state.critic, base.ref, traj)
    b1, _ = lora.prepare_fn(lora.state.actor, lora.state.critic, lora.ref, traj, lora.frozen)
    m = np.asarray(b0.mask)
    assert m.sum() >= 8
    np.testing.assert_allclose(np.asarray(b1.old_logp)[m], np.asarray(b0.old_logp)[m], atol=1e-6)
    np.testing.assert_allclose(np.asarray(b1.values)[m], np.asarray(b0.values)[m], atol=1e-6)

    # Non-zero adapters: the rollout samples from base + adapters and records the log-probs the
    # trainer recomputes (same temperature), which differ from the base model's.
    lora.state = lora.state.replace(actor=_set_b(lora.state.actor, np.random.default_rng(1)))
    traj2 = lora.rollout(lora.actor_params, key, seeds)
    b2, _ = lora.prepare_fn(lora.state.actor, lora.state.critic, lora.ref, traj2, lora.frozen)
    m2 = np.asarray(b2.mask)
    rec = np.asarray(traj2.logprobs)[:, 1:][m2]
    np.testing.assert_allclose(np.asarray(b2.old_logp)[m2], rec, atol=2e-4)
    b3, _ = base.prepare_fn(base.state.actor, base.state.critic, base.ref, traj2)
    assert np.abs(np.asarray(b3.old_logp)[m2] - rec).max() > 0.05


def test_eight_devices_match_one_device(lora_run, tmp_path):
    """The 1-device run is the module's LoRA run: its iteration 1 metrics, and its adapters after
    iteration 1 read back from its checkpoint 1 (no second 1-device trainer)."""
    import shutil

    from ragen_jax.infra.checkpoint import Checkpointer

    if jax.device_count() < 8:
        pytest.skip("needs 8 (simulated) devices")
    wd, _, before, hist = lora_run
    init, h1 = before["actor"], hist[0]
    eight = Trainer(_cfg("--config.train.iterations=1", "--config.train.device_memory_gib=0", "--config.mesh.data=2",
                         "--config.mesh.fsdp=2", "--config.mesh.tensor=2"), tmp_path / "eight", quiet=True)
    shutil.copytree(wd / "checkpoints", tmp_path / "one_ckpts")  # read a copy: the other tests read wd
    ckpt = Checkpointer(tmp_path / "one_ckpts")
    one_after, extra = ckpt.restore(1, eight.state)
    ckpt.close()
    assert extra["iteration"] == 1
    one_after = _host(one_after.actor)
    h8 = eight.train()[0]
    for k in ("train/reward_mean", "actor/pg_loss", "actor/entropy", "critic/value_loss", "actor/grad_norm"):
        np.testing.assert_allclose(h8[k], h1[k], rtol=2e-4, atol=1e-5, err_msg=k)
    for a, b in zip(jax.tree.leaves(one_after), jax.tree.leaves(_host(eight.state.actor))):
        np.testing.assert_allclose(a, b, atol=5e-6)
    assert max(np.abs(a - c).max() for a, c in zip(jax.tree.leaves(one_after), jax.tree.leaves(init))) > 1e-5


# ------------------------------------------------------------------------------- exports and warm starts
@pytest.mark.skipif(importlib.util.find_spec("peft") is None or importlib.util.find_spec("torch") is None,
                    reason="peft and torch are not installed (pip install torch==2.13.0 peft)")
def test_export_loads_with_peft_and_transformers(tmp_path):
    import torch  # optional: only for this cross-check
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    qcfg = Qwen2Config.from_preset("tiny")
    model = Qwen2(qcfg, nnx.Rngs(0))
    save_pretrained(model, str(tmp_path / "base"))
    plain_graph, plain_like = nnx.split(model)
    add_lora(model, RANK, 8.0, rngs=nnx.Rngs(1))
    graphdef, adapters, frozen = nnx.split(model, LoRAParam, ...)
    adapters = _set_b(adapters, np.random.default_rng(3))
    save_lora_exports(tmp_path / "run", graphdef, adapters, frozen, base_model=str(tmp_path / "base"))
    tokens = np.random.default_rng(0).integers(0, qcfg.vocab_size, (1, 8)).astype(np.int32)
    valid = np.ones_like(tokens, bool)
    ours_model = nnx.merge(graphdef, adapters, frozen)
    ours = np.asarray(ours_model.logits(ours_model(tokens, valid)[0]))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), dtype=torch.float32)
    hf = PeftModel.from_pretrained(hf, str(tmp_path / "run" / "adapter")).eval()
    with torch.no_grad():
        ref = hf(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
    merged = nnx.merge(plain_graph, load_policy_params(tmp_path / "run", plain_like))
    np.testing.assert_allclose(np.asarray(merged.logits(merged(tokens, valid)[0])), ours, rtol=1e-4, atol=1e-5)


SFT = ["--config.model.vocab=task", "--config.prompt.max_turns=2", "--config.prompt.max_response_tokens=32",
       "--config.rollout.max_context=512", "--config.sft.num_demos=8", "--config.sft.batch_size=4",
       "--config.sft.epochs=1", "--config.sft.lr=3e-3", "--config.sft.save_every=100", "--config.train.val_every=0",
       "--config.mesh.data=1", f"--config.model.lora_rank={RANK}", "--config.model.lora_alpha=8"]


def test_sft_lora_trains_adapters_and_rl_continues_from_them(tmp_path):
    wd = tmp_path / "sft"
    sft = SFTTrainer(load_config("tiny_cpu.py", SFT), wd, quiet=True, demo_chunk=8)
    frozen0, a0 = _host(sft.frozen), _host(sft.state.params)
    hist = sft.train()
    assert any("sft/loss" in h for h in hist)
    assert all(p.endswith(("lora_a", "lora_b")) for p in _paths(sft.state.params))
    for a, b in zip(jax.tree.leaves(frozen0), jax.tree.leaves(_host(sft.frozen))):
        np.testing.assert_array_equal(a, b)
    trained = _host(sft.state.params)
    assert max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(a0))) > 1e-4
    assert (wd / "policy").is_dir() and (wd / "adapter" / "adapter_config.json").is_file()

    rl_over = ["--config.train.iterations=1", "--config.train.val_every=0", "--config.rollout.num_groups=2",
               "--config.rollout.group_size=4", "--config.batching.mini_batch_size=4", "--config.mesh.data=1",
               "--config.model.critic=none", "--config.advantage.estimator=grpo", "--config.advantage.reward_norm=mean_std"]
    # A PEFT adapter directory: the RL run's adapters start as the SFT run's.
    rl = Trainer(load_config("tiny_cpu.py", [*rl_over, f"--config.model.lora_rank={RANK}", "--config.model.lora_alpha=8",
                                             f"--config.model.init_from={wd / 'adapter'}"]), tmp_path / "rl", quiet=True)
    for a, b in zip(jax.tree.leaves(_host(rl.state.actor)), jax.tree.leaves(trained)):
        np.testing.assert_array_equal(a, b)
    # Full fine-tuning from the adapter (merged into the weights) equals starting from the merged export.
    full_a = Trainer(load_config("tiny_cpu.py", [*rl_over, f"--config.model.init_from={wd / 'adapter'}"]),
                     tmp_path / "full_a", quiet=True)
    full_p = Trainer(load_config("tiny_cpu.py", [*rl_over, f"--config.model.init_from={wd}"]), tmp_path / "full_p",
                     quiet=True)
    for a, b in zip(jax.tree.leaves(_host(full_a.state.actor)), jax.tree.leaves(_host(full_p.state.actor))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # Another rank than the adapter's is refused in one sentence.
    with pytest.raises(ConfigError, match="model.init_from: .*rank"):
        Trainer(load_config("tiny_cpu.py", [*rl_over, "--config.model.lora_rank=2",
                                            f"--config.model.init_from={wd / 'adapter'}"]), tmp_path / "bad", quiet=True)


def test_lora_dropout_is_rejected_in_one_sentence():
    with pytest.raises(ConfigError, match="model.lora_dropout=0.1 is not supported"):
        load_config("tiny_cpu.py", ["--config.model.lora_dropout=0.1"])
