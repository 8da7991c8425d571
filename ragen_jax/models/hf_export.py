"""A trained policy as a Hugging Face model directory: what transformers, vLLM and PEFT load.

    write_hf_directory(model, tokenizer, "out/agent", dtype="bfloat16", vocab=run_vocab, adapter=peft_dir)

The directory holds config.json of the model's family (`weights.save_pretrained`: LoRA adapters
merged), the safetensors in the dtype asked, the run's tokenizer files with its chat template
(a GGUF-started run's tokenizer is the one rebuilt from the file), generation_config.json (the
chat format's end-of-turn ids, pad) and, for a LoRA run, `adapter/` (the PEFT adapter of the same
policy). It is written into a temporary directory beside `out` and renamed into place when
complete: a failure or a kill leaves no half-written `out`.

A model with a task vocabulary (`model.vocab='task'`, the CPU demo's small output layer,
`vocab_map.VocabMap`) is written as it is: vocab_size = the task vocabulary, and the tokenizer is
the run's tokenizer with its ids renumbered (`task_vocab_tokenizer`): the task's tokens get the
model's ids 0..n-1, every other token an id from n on, so any text tokenizes as before (up to the
numbering) and the task's texts give exactly the ids the model was trained on. Text that needs a
token outside the task vocabulary has ids >= vocab_size, which the model has no embedding for
(it never saw such text; inside the run they read as <|endoftext|>).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np

from ragen_jax.models.qwen2.weights import CONFIG_FILE, save_pretrained
from ragen_jax.text.tokenizer import chat_ids

GENERATION_CONFIG = "generation_config.json"
ADAPTER_SUBDIR = "adapter"


def check_new_directory(out: str | os.PathLike) -> Path:
    """`out` as a Path, when it does not exist or is an empty directory; ValueError (one sentence) else."""
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists and is not an empty directory; choose a new output path or "
                         "delete it")
    return out


def check_new_file(out: str | os.PathLike, suffix: str = ".gguf") -> Path:
    """`out` as a Path, when it names a new `suffix` file in an existing directory; ValueError else."""
    p = Path(out).expanduser()
    if p.suffix.lower() != suffix:
        raise ValueError(f"{out} must name a {suffix} file")
    if p.exists():
        raise ValueError(f"{p} already exists; choose a new output path or delete it")
    if not p.parent.is_dir():
        raise ValueError(f"the directory {p.parent} of {p.name} does not exist")
    return p


def task_vocab_tokenizer(tokenizer, vocab):
    """The run's tokenizer with the task vocabulary's ids renumbered to the model's (see the module
    docstring): a `PreTrainedTokenizerFast` with the same pre-tokenizer, merges, special tokens and
    chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    old = {**spec["model"]["vocab"], **{a["content"]: a["id"] for a in spec["added_tokens"]}}
    n = max(old.values()) + 1
    kept = np.asarray(vocab.to_qwen)
    if kept.max() >= n:
        raise ValueError(f"the task vocabulary has id {int(kept.max())}, beyond the tokenizer's {n} ids")
    new_id = np.empty(n, np.int64)
    new_id[kept] = np.arange(len(kept))
    rest = np.setdiff1d(np.arange(n), kept)
    new_id[rest] = len(kept) + np.arange(len(rest))
    # Every token (the added ones too) in the model's vocabulary with its new id: the tokenizers
    # library gives an added token found there that id, instead of numbering it after the vocabulary.
    spec["model"]["vocab"] = {t: int(new_id[i]) for t, i in old.items()}
    for a in spec["added_tokens"]:
        a["id"] = int(new_id[a["id"]])
    backend = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, chat_template=tokenizer.chat_template, model_max_length=tokenizer.model_max_length,
        clean_up_tokenization_spaces=False, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
        unk_token=tokenizer.unk_token, pad_token=tokenizer.pad_token)


def generation_config(tokenizer) -> dict:
    """generation_config.json: a reply ends at the chat format's end-of-turn ids (<|im_end|>, eos)."""
    chat = chat_ids(tokenizer)
    out = {"eos_token_id": list(chat.stop), "pad_token_id": chat.pad}
    if tokenizer.bos_token_id is not None:
        out["bos_token_id"] = int(tokenizer.bos_token_id)
    return out


def write_hf_directory(model, tokenizer, out, *, dtype: str = "float32", vocab=None, adapter=None,
                       max_shard_size=None) -> Path:
    """Write the HF directory described in the module docstring; returns its path. `vocab`: the run's
    VocabMap (model.vocab='task'), else None. `adapter`: a PEFT adapter directory to keep beside the
    merged weights (`<out>/adapter`). Every process calls it (the gather of sharded weights is a
    collective); process 0 writes."""
    out = check_new_directory(out)
    if vocab is not None and model.cfg.vocab_size != vocab.size:
        raise ValueError(f"the model has {model.cfg.vocab_size} output ids but the task vocabulary {vocab.size}")
    tok = task_vocab_tokenizer(tokenizer, vocab) if vocab is not None else tokenizer
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if jax.process_index() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    try:
        save_pretrained(model, str(tmp), max_shard_size=max_shard_size, dtype=dtype)  # collective
        if jax.process_index() != 0:
            return out
        gen = generation_config(tok)
        cfg_file = tmp / CONFIG_FILE
        hf = json.loads(cfg_file.read_text())
        hf.update(gen)  # the ids of this tokenizer, not Qwen's defaults
        hf["eos_token_id"] = gen["eos_token_id"][0]
        cfg_file.write_text(json.dumps(hf, indent=2))
        (tmp / GENERATION_CONFIG).write_text(json.dumps(gen, indent=2) + "\n")
        tok.save_pretrained(str(tmp))
        if adapter is not None:
            shutil.copytree(adapter, tmp / ADAPTER_SUBDIR)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    finally:
        if jax.process_index() == 0 and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


__all__ = ["ADAPTER_SUBDIR", "GENERATION_CONFIG", "check_new_directory", "check_new_file", "generation_config", "task_vocab_tokenizer",
           "write_hf_directory"]
