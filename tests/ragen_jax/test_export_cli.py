"""launch/export.py on run directories as the trainers write them (config.json, vocab.json, policy/,
adapter/, checkpoints/): a task-vocabulary run (the CPU demo's kind), a LoRA run exported from one of
its checkpoints, and a run started from a .gguf file, plus the bad inputs.

Truths: the run's own tokenizer and model (what the run trained and sampled with): the exported
tokenizer gives the run's ids (renumbered to the task vocabulary where there is one) on the run's
prompts, and transformers' AutoModelForCausalLM on the export gives our logits (float32, 1e-5) and our
greedy tokens. Without torch (CI) the exported weights are read back by our own loader instead."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from launch import export as export_cli
from ragen_jax.experiment.build import build_policy, build_text_envs, build_vocab, load_task_tokenizer
from ragen_jax.experiment.config import load_config
from ragen_jax.infra.checkpoint import Checkpointer, save_policy, save_run_files
from ragen_jax.models import from_pretrained
from ragen_jax.models.gguf import open_gguf, resolve_model_path, tokenizer_fields, write_gguf
from ragen_jax.models.lora import LoRAParam
from ragen_jax.text.tokenizer import load_tokenizer

HAVE_TORCH = importlib.util.find_spec("torch") is not None
RTOL = ATOL = 1e-5
SMALL = ["prompt.max_turns=1", "prompt.max_response_tokens=8", "rollout.max_context=512", "mesh.data=1"]


def make_run(wd: Path, overrides, lora_step: int | None = None):
    """A run directory as the Trainer leaves it: its files and policy/ (or, with `lora_step`, only a
    checkpoint of that step holding the adapters, numpy-seeded so that they matter)."""
    cfg = load_config("tiny_cpu.py", [*SMALL, *overrides])
    tok = load_task_tokenizer(cfg)
    envs = build_text_envs(cfg, tok)
    vocab = build_vocab(cfg, envs, tok)
    policy = build_policy(cfg, vocab)
    save_run_files(wd, json.loads(json.dumps(cfg.to_dict(), default=str)), vocab)
    if lora_step is None:
        save_policy(wd, nnx.state(policy))
    else:
        rng = np.random.default_rng(3)
        adapters = nnx.state(policy, LoRAParam)
        adapters.replace_by_pure_dict(jax.tree.map(lambda x: jnp.asarray(0.05 * rng.standard_normal(x.shape), x.dtype),
                                                   adapters.to_pure_dict()))
        nnx.update(policy, adapters)
        ckpt = Checkpointer(wd / "checkpoints")
        ckpt.save(lora_step, {"actor": adapters}, extra={"iteration": lora_step})
        ckpt.close()
    return cfg, tok, envs, vocab, policy


def prompt_texts(envs) -> list[str]:
    """The run's prompts: each environment's rendered opening (system prompt, rules, first state)."""
    texts = []
    for te in envs.values():
        ids = np.concatenate([np.asarray(te.prefix_ids), np.asarray(te.forced_prefix_ids)])
        texts.append(te.tokenizer.decode(ids))
    return texts


WIDTH = 48  # prompts are cut to 40 tokens; + the greedy tokens: one shape, the ops compile once


def logits_of(model, ids) -> np.ndarray:
    """[len(ids), V]: the ids right-padded to WIDTH (causal: the padding changes nothing before it)."""
    n = len(ids)
    x, valid = np.zeros((1, WIDTH), np.int32), np.zeros((1, WIDTH), bool)
    x[0, :n], valid[0, :n] = ids, True
    hidden, _ = model(jnp.asarray(x), jnp.asarray(valid))
    return np.asarray(model.logits(hidden)[0, :n])


def check_model(out: Path, model, ids, greedy: int = 4) -> None:
    """transformers (or, without torch, our loader) on `out` gives `model`'s logits and greedy tokens."""
    ours = logits_of(model, ids)
    if not HAVE_TORCH:
        np.testing.assert_allclose(logits_of(from_pretrained(str(out)), ids), ours, rtol=RTOL, atol=ATOL)
        return
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    x = torch.tensor(np.asarray(ids)[None], dtype=torch.long)
    with torch.no_grad():
        np.testing.assert_allclose(hf(x).logits[0].numpy(), ours, rtol=RTOL, atol=ATOL)
        got = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=greedy, min_new_tokens=greedy,
                          do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    seq = list(ids)
    for _ in range(greedy):
        seq.append(int(np.argmax(logits_of(model, seq)[-1])))
    assert got == seq[len(ids):]


def test_task_vocabulary_run_exports_with_its_renumbered_tokenizer(tmp_path):
    cfg, tok, envs, vocab, policy = make_run(tmp_path / "run", [])
    assert vocab is not None and policy.cfg.vocab_size == vocab.size
    out = tmp_path / "hf"
    assert export_cli.main([str(tmp_path / "run"), "--out", str(out)]) == 0
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(out))
    for text in prompt_texts(envs):
        want = vocab.to_model[np.asarray(tok.encode(text, add_special_tokens=False))]
        assert hf_tok.encode(text, add_special_tokens=False) == want.tolist()
        assert hf_tok.decode(want.tolist()) == text
    chat = [{"role": "user", "content": "Push the box."}]
    assert (hf_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            == tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [int(vocab.to_model[i]) for i in (151645, 151643)]  # <|im_end|>, <|endoftext|>
    assert json.loads((out / "config.json").read_text())["vocab_size"] == vocab.size
    ids = vocab.to_model[np.asarray(tok.encode(prompt_texts(envs)[0], add_special_tokens=False))]
    check_model(out, policy, ids[:40])


def test_lora_checkpoint_exports_merged_weights_and_its_peft_adapter(tmp_path):
    """A LoRA run that has only checkpoints (interrupted): the export of checkpoint 3 is the base with
    that checkpoint's adapters merged, and <out>/adapter holds those adapters in PEFT's layout."""
    from safetensors.numpy import load_file

    over = ["model.vocab=full", "model.lora_rank=4", "model.lora_alpha=8"]
    cfg, tok, envs, vocab, policy = make_run(tmp_path / "run", over, lora_step=3)
    out = tmp_path / "hf"
    assert export_cli.main([str(tmp_path / "run" / "checkpoints" / "3"), "--out", str(out)]) == 0
    peft = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    a = np.asarray(policy.model.layers.self_attn.q_proj.lora_a[...])
    np.testing.assert_array_equal(peft["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"], a[1].T)
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 4
    ids = tok.encode(prompt_texts(envs)[0], add_special_tokens=False)[:40]
    check_model(out, policy, ids)
    assert export_cli.main([str(tmp_path / "run" / "checkpoints" / "7"), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def chatml_byte_tokenizer():
    """256 byte tokens + <|endoftext|>, <|im_start|>, <|im_end|>, with a ChatML template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ragen_jax.text.tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    backend = Tokenizer(models.BPE(vocab={table[i]: i for i in range(256)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=template, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")


def test_gguf_started_run_keeps_the_gguf_tokenizer(tmp_path, monkeypatch):
    """A run whose model.path is a .gguf file: the exports carry the tokenizer rebuilt from that file
    (its ids on the run's prompts, its chat template), as an HF directory and as a GGUF file."""
    from ragen_jax.models import Qwen2, Qwen2Config
    from scripts.export_fixtures import seeded

    monkeypatch.setenv("RAGEN_JAX_CACHE", str(tmp_path / "cache"))  # the GGUF's converted directory
    tok0 = chatml_byte_tokenizer()
    base = Qwen2(Qwen2Config(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024), nnx.Rngs(0))
    seeded(base, 5)
    gguf_file = write_gguf(base, tok0, tmp_path / "base.gguf")
    over = [f"model.path={gguf_file}", "model.random_init=false", "model.vocab=full"]
    cfg, tok, envs, vocab, policy = make_run(tmp_path / "run", over)
    assert Path(tok.name_or_path) == Path(resolve_model_path(gguf_file))  # the run's tokenizer: the GGUF's
    out = tmp_path / "hf"
    assert export_cli.main([str(tmp_path / "run"), "--out", str(out)]) == 0
    exported = load_tokenizer(str(out))
    for text in prompt_texts(envs):
        assert exported.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert exported.chat_template == tok0.chat_template
    check_model(out, policy, tok0.encode(prompt_texts(envs)[0], add_special_tokens=False)[:40])
    # The same run as a GGUF file: the tokenizer fields of the run's tokenizer (the GGUF's vocabulary,
    # merges, special tokens and template; transformers gives a qwen2 directory Qwen's pre-tokenizer).
    assert export_cli.main([str(tmp_path / "run"), "--to", "gguf", "--out", str(tmp_path / "again.gguf")]) == 0
    want, got = tokenizer_fields(tok, 259), tokenizer_fields(exported, 259)
    assert got == want and want["tokens"] == tokenizer_fields(tok0, 259)["tokens"]
    assert open_gguf(tmp_path / "again.gguf").fields["tokenizer.ggml.tokens"].contents() == want["tokens"]


def test_bad_sources_and_targets_fail_in_one_line_and_write_nothing(tmp_path, capsys):
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 7)
    (tmp_path / "junk.gguf").write_bytes(b"<html>not a model</html>")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "mamba", "vocab_size": 8}))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    cases = {
        str(tmp_path / "broken.gguf"): "broken.gguf is a truncated or corrupt GGUF file",
        str(tmp_path / "junk.gguf"): "junk.gguf is not a GGUF file (it starts with b'<htm'",
        str(tmp_path / "odd"): "model_type 'mamba' is not supported",
        str(tmp_path / "nothing"): "does not exist",
    }
    for source, message in cases.items():
        capsys.readouterr()
        assert export_cli.main([source, "--out", str(tmp_path / "out")]) == 2, source
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (source, err)
        assert not (tmp_path / "out").exists()
    assert export_cli.main([str(tmp_path / "odd"), "--out", str(tmp_path / "full")]) == 2
    assert "already exists and is not an empty directory" in capsys.readouterr().err
    assert export_cli.main([str(tmp_path / "odd"), "--to", "gguf", "--out", str(tmp_path / "a.bin")]) == 2
    assert "must name a .gguf file" in capsys.readouterr().err
