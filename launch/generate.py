"""Command line text generation with the JAX sampler.

    python launch/generate.py --model DIR|tiny --prompt "..." --max-new-tokens N [--greedy]
        [--temperature T --top-p P --top-k K --seed S] [--chat] [--stop STR ...]

`--model tiny` (or any preset name that is not an existing directory) builds a model with random
weights and uses the built-in offline Qwen2.5 tokenizer; a directory is loaded with `from_pretrained`
and its own tokenizer files when it has them. Prints the continuation (without the stop token).
"""

from __future__ import annotations

import argparse
import os
import sys


import jax
import numpy as np
from flax import nnx

from ragen_jax.models import PRESETS, Qwen2, Qwen2Config, from_pretrained
from ragen_jax.models.gguf import expand_model_path, is_gguf, resolve_model_path
from ragen_jax.rollout import sampler
from ragen_jax.text.tokenizer import DEFAULT_SYSTEM_PROMPT, load_tokenizer, token_bytes_table

_DEFAULT_SYSTEM = None  # use the tokenizer module's default system prompt


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python launch/generate.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face Qwen2 directory, or a preset name (tiny) for random weights")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (ignores temperature/top-p/top-k)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template (system + user turn)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable); the output ends with it")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    return p


def _load(model_arg: str, dtype: str):
    model_arg = str(expand_model_path(model_arg))  # pkg:<module>/<file> -> the installed file
    if is_gguf(model_arg):
        model_arg = resolve_model_path(model_arg)  # converted once into a cached HF directory
    if os.path.isdir(model_arg):
        model = from_pretrained(model_arg, dtype=dtype)
        has_tok = any(os.path.isfile(os.path.join(model_arg, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
        return model, load_tokenizer(model_arg if has_tok else None)
    if model_arg in PRESETS:
        cfg = Qwen2Config.from_preset(model_arg, dtype=dtype, param_dtype=dtype)
        return Qwen2(cfg, nnx.Rngs(0)), load_tokenizer()
    raise FileNotFoundError(f"model directory not found: {model_arg} (or use a preset: {', '.join(PRESETS)})")


def chat_prompt(tok, user: str) -> str:
    """The chat-formatted prompt ending with the assistant header, as the model expects."""
    if getattr(tok, "chat_template", None):
        try:
            return tok.apply_chat_template(
                [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
            )
        except ImportError:  # jinja2 missing: fall through to the fixed Qwen2.5 layout
            pass
    return (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )


def run(args) -> str:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    model, tok = _load(args.model, args.dtype)
    text = chat_prompt(tok, args.prompt) if args.chat else args.prompt
    ids = tok.encode(text, add_special_tokens=False)
    if not ids:
        raise ValueError("the prompt is empty after tokenization")
    vocab = model.cfg.vocab_size
    if max(ids) >= vocab:
        raise ValueError(f"the tokenizer produced id {max(ids)}, outside the model's vocabulary of {vocab}")
    stop_ids = tuple(i for i in (tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id, tok.pad_token_id) if isinstance(i, int) and 0 <= i < vocab)
    stop_ids = tuple(dict.fromkeys(stop_ids))
    token_bytes = token_bytes_table(tok, vocab) if args.stop else None
    tokens = np.asarray([ids], np.int32)
    out = sampler.generate(
        model,
        tokens,
        np.ones_like(tokens, bool),
        jax.random.key(args.seed),
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        greedy=args.greedy,
        stop_ids=stop_ids,
        stop_strings=tuple(args.stop),
        token_bytes=token_bytes,
        logprobs=False,  # only the text is printed: greedy then skips the exp over the vocabulary
    )
    n = int(out.lengths[0])
    gen = [int(t) for t in np.asarray(out.tokens[0, :n])]
    if gen and int(out.stopped_by[0]) == sampler.STOP_EOS:
        gen = gen[:-1]
    return tok.decode(gen, skip_special_tokens=False)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        text = run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
