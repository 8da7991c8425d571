"""A run's policy exports, written by both trainers at the end of training (every process calls them).

- `<run>/policy`: the policy's parameters in the plain model's layout (orbax), what evaluation and
  `model.init_from` read. With LoRA the merged weights W + (alpha / rank) A B.
- `<run>/adapter` (LoRA only): the adapters alone in Hugging Face PEFT's layout
  (`PeftModel.from_pretrained(<base>, <run>/adapter)`).
"""

from __future__ import annotations

import os
import tempfile

import jax
from flax import nnx

from ragen_jax.models.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, merged_state, save_peft_adapter
from ragen_jax.rollout.metrics import host_copy
from ragen_jax.infra.checkpoint import POLICY_DIR, save_policy
from ragen_jax.infra.distributed import run_path

ADAPTER_DIR = "adapter"


def save_lora_exports(workdir, graphdef, adapters, frozen, base_model: str | None = None):
    """The exports of a LoRA run: `<workdir>/policy` (merged) and `<workdir>/adapter` (PEFT layout).
    Returns the adapter directory."""
    full = nnx.merge_state(adapters, frozen)
    cfg = nnx.merge(graphdef, full).cfg
    # A QLoRA run's policy is float: its quantized base dequantized, plus the adapters.
    save_policy(workdir, jax.jit(merged_state, static_argnums=(1, 2))(full, cfg.lora_scale, cfg.base_quant))
    model = nnx.merge(graphdef, nnx.merge_state(host_copy(adapters), frozen))  # gathered from every process
    if jax.process_index() == 0:
        out = run_path(workdir) / ADAPTER_DIR
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:  # PEFT files are written locally; the run dir may be a bucket
            save_peft_adapter(model, tmp, base_model=base_model)
            for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):  # each whole or absent, whenever the process dies
                (out / (name + ".tmp")).write_bytes(open(os.path.join(tmp, name), "rb").read())
                (out / (name + ".tmp")).replace(out / name)
    return run_path(workdir) / ADAPTER_DIR


def save_policy_exports(workdir, graphdef, trainable, frozen=None, base_model: str | None = None) -> None:
    """`<workdir>/policy` from the trained parameters (`trainable`; with LoRA the adapters, `frozen`
    the base) and, with LoRA, `<workdir>/adapter`."""
    if frozen is not None:
        save_lora_exports(workdir, graphdef, trainable, frozen, base_model)
    else:
        save_policy(workdir, trainable)


def exports_complete(workdir, lora: bool) -> bool:
    """Whether `workdir` holds a complete policy export (orbax renames it into place when it is
    complete) and, for a LoRA run, both adapter files."""
    root = run_path(workdir)
    if not (root / POLICY_DIR / "_CHECKPOINT_METADATA").exists():
        return False
    return not lora or all((root / ADAPTER_DIR / name).exists() for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS))


__all__ = ["ADAPTER_DIR", "exports_complete", "save_lora_exports", "save_policy_exports"]
