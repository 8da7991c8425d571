"""Take a trained agent out: a Hugging Face model directory (transformers, vLLM, PEFT) or a GGUF file (llama.cpp).

    python launch/export.py runs/sokoban --out exports/sokoban                      # HF directory
    python launch/export.py runs/sokoban/checkpoints/40 --out exports/it40 --dtype bfloat16
    python launch/export.py runs/sokoban --to gguf --out exports/sokoban.gguf --gguf-type F16

SOURCE: a run directory (its policy export, else its latest complete checkpoint), one checkpoint
of a run (<run>/checkpoints/<step>), or a model directory / .gguf file. The HF directory holds
config.json of the model's family (qwen2, llama, qwen3), the safetensors in --dtype (default: the
run's parameter dtype), the run's tokenizer files with its chat template (a GGUF-started run keeps
the GGUF's tokenizer), generation_config.json and, for a LoRA run, the merged weights plus the PEFT
adapter in <out>/adapter. A run with a task vocabulary (model.vocab='task', the CPU demo) is written
with its own small vocabulary and the tokenizer renumbered to it (ragen_jax/models/hf_export.py).
The GGUF file is F32 or F16 (--gguf-type), read by llama.cpp and transformers' GGUF loader.

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("exports/sokoban")
    tokenizer = AutoTokenizer.from_pretrained("exports/sokoban")

Errors (a missing or corrupt source, an output that exists): one line on stderr, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # before jax is imported: glibc malloc huge pages (why and when: ragen_jax/runtime.py)
    from ragen_jax.runtime import use_transparent_hugepages

    use_transparent_hugepages()

DTYPES = ("float32", "bfloat16", "float16")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="run directory, <run>/checkpoints/<step>, model directory or .gguf file")
    p.add_argument("--out", required=True, help="the new HF directory (--to hf) or .gguf file (--to gguf)")
    p.add_argument("--to", choices=("hf", "gguf"), default="hf")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="safetensors dtype of an HF directory (default: the run's parameter dtype)")
    p.add_argument("--gguf-type", choices=("F32", "F16"), default="F32", help="tensor type of a GGUF file")
    return p.parse_args(argv)


def checkpoint_step(source: str) -> tuple[str, int | None]:
    """(run directory, step) for `<run>/checkpoints/<step>`, else (source, None)."""
    p = Path(source).expanduser()
    if p.name.isdigit() and p.parent.name == "checkpoints":
        return str(p.parent.parent), int(p.name)
    return source, None


def export(args) -> Path:
    """Load the source and write the export (raises the project's one-sentence errors)."""
    from ragen_jax.evaluation.policies import load_source
    from ragen_jax.models.gguf import write_gguf
    from ragen_jax.models.hf_export import check_new_directory, check_new_file, write_hf_directory
    from ragen_jax.models.lora import is_peft_dir, save_peft_adapter

    out = check_new_file(args.out) if args.to == "gguf" else check_new_directory(args.out)  # before any loading
    source, step = checkpoint_step(args.source)
    loaded, run_cfg = load_source(source, step=step)
    model = loaded.policy
    if args.to == "gguf":
        if loaded.vocab is not None:
            raise ValueError(f"{source} has a task vocabulary (model.vocab='task'), which a GGUF file cannot hold "
                             "(one token per model id); export a Hugging Face directory instead (--to hf)")
        return write_gguf(model, loaded.tokenizer, out, args.gguf_type)
    dtype = args.dtype or model.cfg.param_dtype
    with tempfile.TemporaryDirectory() as tmp:
        adapter = None
        if model.cfg.lora_rank:  # restored from a checkpoint: the adapters are the model's own
            save_peft_adapter(model, tmp, base_model=run_cfg.model.path if run_cfg is not None else None)
            adapter = tmp
        elif run_cfg is not None and run_cfg.model.lora_rank and is_peft_dir(str(Path(source) / "adapter")):
            adapter = str(Path(source) / "adapter")  # a finished LoRA run: its PEFT export
        return write_hf_directory(model, loaded.tokenizer, out, dtype=dtype, vocab=loaded.vocab, adapter=adapter)


def main(argv=None) -> int:
    args = parse_args(argv)
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's restore chatter
    from ragen_jax.experiment.cli import fail, is_input_error

    try:
        out = export(args)
    except Exception as e:  # noqa: BLE001 - bad input in one line (exit 2), a bug with its traceback (exit 1)
        return fail(e, 2 if is_input_error(e) else 1)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
