"""QLoRA in the RL trainer (model.base_quant with model.lora_rank > 0) on the tiny CPU config: the
frozen base the programs receive is stored in 4 bits (its byte count computed here from the model's
shapes), never changes, the run passes the AOT memory check and trains its adapters, the rollout's
log-probs are the trainer's (the sampler reads the same quantized base), and the exported policy is
the dequantized base plus the adapters (computed here in numpy). Config errors come first."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.infra.checkpoint import load_policy_params
from ragen_jax.models import Qwen2
from ragen_jax.models.quant import NF4_TABLE
from ragen_jax.trainer.memory import bytes_per_device
from ragen_jax.trainer.rl import Trainer

RANK = 4
# test_lora_trainer.py's run (PPO with a critic, the AOT memory check), shorter, over an nf4 base.
FAST = ["--config.train.iterations=2", "--config.train.val_every=0", "--config.train.save_every=2",
        "--config.rollout.num_groups=2", "--config.rollout.group_size=4", "--config.filter.value=0.5",
        "--config.batching.mini_batch_size=4", "--config.prompt.max_turns=2", "--config.prompt.max_response_tokens=8",
        "--config.rollout.max_context=512", "--config.train.log_samples=0", "--config.mesh.data=1",
        f"--config.model.lora_rank={RANK}", "--config.model.lora_alpha=8", "--config.train.device_memory_gib=16",
        "--config.model.base_quant=nf4"]
PROJ = {("self_attn", n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")} | {("mlp", n) for n in
                                                                              ("gate_proj", "up_proj", "down_proj")}


def _host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


@pytest.fixture(scope="module")
def qlora_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("qlora")
    tr = Trainer(load_config("tiny_cpu.py", FAST), wd, quiet=True)
    before = {"actor": _host(tr.state.actor), "frozen": _host(tr.frozen)}
    hist = tr.train()
    return wd, tr, before, hist


def _numpy_nf4(q, scale):
    """Dequantized kernel [L, in, out] from packed codes [L, in/2, out] and scales [L, in/64, out],
    from the layout's definition (byte j of a block: element j low nibble, j + 32 high nibble)."""
    n_layers, half, n_out = q.shape
    nb = scale.shape[1]
    qb = q.reshape(n_layers, nb, half // nb, n_out)
    codes = np.concatenate([qb & 15, qb >> 4], axis=2)
    return (NF4_TABLE[codes] * scale[:, :, None, :].astype(np.float32)).reshape(n_layers, 2 * half, n_out)


def test_the_base_is_4_bit_frozen_and_the_adapters_train(qlora_run):
    wd, tr, before, hist = qlora_run
    assert tr.memory is not None  # the run used the AOT-compiled programs of the memory check
    cfg = tr.policy.cfg
    assert cfg.base_quant == "nf4"
    frozen = dict(nnx.to_flat_state(_host(tr.frozen)))
    expect_proj = 0
    for group, name in PROJ:
        path = ("model", "layers", group, name)
        assert path + ("kernel",) not in frozen
        q, scale = frozen[path + ("kernel_q",)][...], frozen[path + ("kernel_scale",)][...]
        n_in = q.shape[1] * 2
        assert q.dtype == np.uint8 and scale.shape == (cfg.num_hidden_layers, n_in // 64, q.shape[2])
        expect_proj += q.size + scale.size * 4  # half a byte per weight, one float32 scale per 64
    others = sum(v[...].nbytes for p, v in frozen.items() if p[-1] not in ("kernel_q", "kernel_scale"))
    assert bytes_per_device(tr.frozen) == expect_proj + others
    for a, b in zip(jax.tree.leaves(before["frozen"]), jax.tree.leaves(_host(tr.frozen))):
        np.testing.assert_array_equal(a, b)  # never donated, never updated
    moved = [np.abs(x[...]).max() for p, x in nnx.to_flat_state(_host(tr.state.actor)) if p[-1] == "lora_b"]
    assert moved and min(moved) > 0
    assert [h["step"] for h in hist] == [1, 2]
    # The sampler scored its tokens with the trainer's quantized model: the log-probs agree.
    assert all(h["mismatch/logp_abs_diff_max"] < 1e-4 for h in hist), [h["mismatch/logp_abs_diff_max"] for h in hist]


def test_export_is_the_dequantized_base_plus_adapters(qlora_run):
    wd, tr, _, _ = qlora_run
    actor, frozen = _host(tr.state.actor), _host(tr.frozen)
    plain_cfg = tr.policy.cfg.replace(lora_rank=0, lora_targets=(), base_quant="none")
    plain = nnx.state(nnx.eval_shape(lambda: Qwen2(plain_cfg, nnx.Rngs(0))))
    merged = _host(load_policy_params(wd, plain))
    for group, name in (("mlp", "down_proj"), ("self_attn", "k_proj")):
        base = frozen["model"]["layers"][group][name]
        adapter = actor["model"]["layers"][group][name]
        a, b = adapter["lora_a"][...], adapter["lora_b"][...]
        delta = (8.0 / RANK) * np.einsum("lir,lro->lio", a, b)
        want = _numpy_nf4(base["kernel_q"][...], base["kernel_scale"][...]) + delta
        np.testing.assert_allclose(merged["model"]["layers"][group][name]["kernel"][...], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(merged["model"]["norm"]["scale"][...], frozen["model"]["norm"]["scale"][...])


def test_base_quant_needs_lora():
    with pytest.raises(ConfigError, match=r"model.base_quant='nf4'.*model.lora_rank=0.*set model.lora_rank"):
        load_config("tiny_cpu.py", ["--config.model.base_quant=nf4"])
    with pytest.raises(ConfigError, match=r"model.base_quant='fp8' is not valid; choose one of 'none', 'int8'"):
        load_config("tiny_cpu.py", [f"--config.model.lora_rank={RANK}", "--config.model.base_quant=fp8"])
    assert load_config("tiny_cpu.py", [f"--config.model.lora_rank={RANK}", "--config.model.base_quant=int8"])


def test_a_lora_run_that_does_not_fit_names_the_quantized_base(tmp_path):
    over = [x for x in FAST if "base_quant" not in x and "device_memory_gib" not in x]
    cfg = load_config("tiny_cpu.py", [*over, "--config.train.device_memory_gib=0.001"])
    with pytest.raises(ConfigError, match=r"model.base_quant=nf4"):
        Trainer(cfg, tmp_path / "small", quiet=True)


def test_export_cli_of_a_checkpoint_writes_the_float_model_and_the_adapter(qlora_run, tmp_path):
    """launch/export.py on the run's checkpoint (no policy export read: the base is rebuilt and
    quantized as the run did it, the checkpoint's adapters put on top): the HF directory's weights,
    read back by our loader, give the trained QLoRA model's logits, and <out>/adapter is its adapters."""
    from safetensors.numpy import load_file

    from launch import export as export_cli
    from ragen_jax.models import from_pretrained
    from ragen_jax.trainer.step import full_params

    wd, tr, _, _ = qlora_run
    out = tmp_path / "hf"
    assert export_cli.main([str(wd / "checkpoints" / "2"), "--out", str(out)]) == 0
    trained = nnx.merge(tr.policy_graph, full_params(tr.state.actor, tr.frozen))
    exported = from_pretrained(str(out))
    assert exported.cfg.base_quant == "none" and not exported.cfg.lora_rank
    tokens = np.random.default_rng(0).integers(0, trained.cfg.vocab_size, (2, 16)).astype(np.int32)
    valid = np.ones(tokens.shape, bool)
    got, want = (np.asarray(m.logits(m(tokens, valid)[0])) for m in (exported, trained))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    peft = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    a = _host(tr.state.actor)["model"]["layers"]["self_attn"]["q_proj"]["lora_a"][...]
    np.testing.assert_array_equal(peft["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"], a[1].T)


SFT = ["--config.model.vocab=task", "--config.prompt.max_turns=2", "--config.prompt.max_response_tokens=32",
       "--config.rollout.max_context=512", "--config.sft.num_demos=8", "--config.sft.batch_size=4",
       "--config.sft.epochs=1", "--config.sft.lr=3e-3", "--config.sft.save_every=100", "--config.train.val_every=0",
       "--config.mesh.data=1", f"--config.model.lora_rank={RANK}", "--config.model.lora_alpha=8",
       "--config.model.base_quant=int8"]


def test_sft_over_an_int8_base_and_rl_from_its_adapter_share_the_quantized_base(tmp_path):
    """The SFT trainer trains adapters over an int8 base (Q8_0 codes, frozen) and exports them;
    an RL run started from that adapter quantizes the same float base to the same codes (quantization
    is a function of the weights), so the adapters continue over exactly the base they were trained on."""
    from ragen_jax.trainer.sft import SFTTrainer

    sft = SFTTrainer(load_config("tiny_cpu.py", SFT), tmp_path / "sft", quiet=True, demo_chunk=8)
    frozen0, a0 = _host(sft.frozen), _host(sft.state.params)
    sft.train()
    frozen = dict(nnx.to_flat_state(_host(sft.frozen)))
    q = frozen[("model", "layers", "mlp", "up_proj", "kernel_q")][...]
    assert q.dtype == np.int8 and frozen[("model", "layers", "mlp", "up_proj", "kernel_scale")].shape[1] == q.shape[1] // 32
    for a, b in zip(jax.tree.leaves(frozen0), jax.tree.leaves(_host(sft.frozen))):
        np.testing.assert_array_equal(a, b)
    trained = _host(sft.state.params)
    assert max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(a0))) > 1e-4
    assert (tmp_path / "sft" / "adapter" / "adapter_config.json").is_file()
    rl_over = [x for x in SFT if "sft." not in x] + [
        "--config.train.iterations=1", "--config.rollout.num_groups=2", "--config.rollout.group_size=4",
        "--config.batching.mini_batch_size=4", "--config.model.critic=none", "--config.advantage.estimator=grpo",
        "--config.advantage.reward_norm=mean_std", f"--config.model.init_from={tmp_path / 'sft' / 'adapter'}"]
    rl = Trainer(load_config("tiny_cpu.py", rl_over), tmp_path / "rl", quiet=True)
    # The PEFT adapter round trip (save, then load onto the base) may round the last bit: 1 ulp measured.
    for a, b in zip(jax.tree.leaves(_host(rl.state.actor)), jax.tree.leaves(trained)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)
    # The codes are the same integers; the float leaves (embeddings, scales) of the two trainers' seeded
    # initialisations may differ in the last bit (1 ulp measured on the embedding).
    for a, b in zip(jax.tree.leaves(_host(rl.frozen)), jax.tree.leaves(_host(sft.frozen))):
        if np.issubdtype(np.asarray(a).dtype, np.integer):
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)
