"""A small model vocabulary inside the Qwen id space (the CPU demo's speed trick).

A tiny policy with Qwen2.5's 151,936-entry vocabulary spends nearly all of its time in the output
layer and in sampling over it. `VocabMap` lists the Qwen ids the task can ever need (every id the
environments' text tables, the chat scaffolding and the demonstrations use, plus the 256 single-byte
tokens so any text stays expressible) and gives the model its own vocabulary of just those. The map
is applied INSIDE the compiled programs, at the model boundary only:

    model input  = to_model[qwen_ids]          (embedding of the model's own id)
    model output = logits over the small vocabulary; a sampled index i is the Qwen id to_qwen[i]

Everything else (rendering, parsing, the loss mask, the tokens stored in trajectories, checkpoints
of the conversation) stays in Qwen ids, so rendering and parsing remain exact. A Qwen id outside
the map never occurs in text the task produces; if one is fed anyway it reads as <|endoftext|>.

"Qwen ids" (the names `to_qwen`, `qwen_ids`, `qwen_vocab` are kept) means the run tokenizer's ids:
`for_text_envs` builds the map from any ChatML byte-level tokenizer (Qwen2.5's, SmolLM2's, ...), its
special ids (<|im_start|>, <|im_end|>, pad, stop ids) read from the tokenizer, never assumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import jax.numpy as jnp
import numpy as np

from ragen_jax.text.tokenizer import ENDOFTEXT, IM_END, IM_START, chat_ids, token_bytes_table

QWEN_VOCAB = 151936
# Bytes the task vocabulary must hold as single-byte tokens: printable ASCII, tab, newline, return.
BASIC_TEXT_BYTES = (9, 10, 13, *range(32, 127))


class VocabMap:
    """`specials`: ids always kept (the tokenizer's chat ids; Qwen's by default). `fallback`: the id an
    id outside the map reads as (the tokenizer's <|endoftext|>, else its pad)."""

    def __init__(self, qwen_ids: Iterable[int], qwen_vocab: int = QWEN_VOCAB,
                 specials: Iterable[int] = (ENDOFTEXT, IM_START, IM_END), fallback: int = ENDOFTEXT):
        ids = sorted({int(i) for i in qwen_ids} | {int(i) for i in specials} | {int(fallback)})
        if ids[0] < 0 or ids[-1] >= qwen_vocab:
            raise ValueError(f"vocabulary map ids must lie in [0, {qwen_vocab}), got {ids[0]}..{ids[-1]}")
        self.to_qwen = np.asarray(ids, np.int32)
        self.qwen_vocab = qwen_vocab
        self.fallback = int(fallback)
        lut = np.full((qwen_vocab,), ids.index(int(fallback)), np.int32)
        lut[self.to_qwen] = np.arange(len(ids), dtype=np.int32)
        self.to_model = lut

    @property
    def size(self) -> int:
        return int(self.to_qwen.shape[0])

    def model_ids(self, qwen_ids):
        """Qwen ids -> model ids (jittable)."""
        return jnp.asarray(self.to_model)[jnp.clip(jnp.asarray(qwen_ids, jnp.int32), 0, self.qwen_vocab - 1)]

    def qwen_ids(self, model_ids):
        """Model ids (e.g. sampled indices) -> Qwen ids (jittable)."""
        return jnp.asarray(self.to_qwen)[jnp.asarray(model_ids, jnp.int32)]

    def wrap(self, model) -> "MappedModel":
        return MappedModel(model, self)

    # ---- building ------------------------------------------------------------------------------
    @classmethod
    def for_text_envs(cls, text_envs: Sequence, tokenizer, extra_ids: Iterable[int] = (),
                      extra_texts: Iterable[str] = ()) -> "VocabMap":
        """Every id the given TextEnvs can render, the single-byte tokens, the tokenizer's chat ids, and
        any extras; one sentence when the tokenizer is not ChatML or not byte-level."""
        chat = chat_ids(tokenizer)
        table, lengths = token_bytes_table(tokenizer)
        single = np.nonzero(np.asarray(lengths) == 1)[0]
        # Not all 256: SmolLM2's vocabulary itself has no token for 21 bytes (some control characters
        # and bytes that never occur in UTF-8), so its texts never contain them either.
        missing = sorted(set(BASIC_TEXT_BYTES) - set(np.asarray(table)[single, 0].tolist()))
        if missing:
            raise ValueError(f"the tokenizer has no single-byte token for {len(missing)} printable ASCII characters "
                             f"(e.g. {chr(missing[0])!r}); the task vocabulary (model.vocab='task') keeps any text "
                             "expressible through them and needs a byte-level BPE tokenizer (Qwen2.5, SmolLM2, ...)")
        ids: set[int] = set(int(i) for i in extra_ids)
        for te in text_envs:
            ids.update(int(i) for i in np.asarray(te.prefix_ids).ravel())
            ids.update(int(i) for i in np.asarray(te.forced_prefix_ids).ravel())
            for table in te.token_tables:
                ids.update(int(i) for i in np.unique(np.asarray(table)))
        for text in extra_texts:
            ids.update(tokenizer.encode(text, add_special_tokens=False))
        ids.update(int(i) for i in single)
        fallback = tokenizer.get_vocab().get("<|endoftext|>", chat.pad)
        full = max(len(tokenizer), max(ids | set(chat.stop) | {chat.im_start, chat.pad}) + 1)
        return cls(ids, full, specials=(chat.im_start, chat.im_end, chat.pad, *chat.stop), fallback=fallback)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"qwen_vocab": self.qwen_vocab, "ids": self.to_qwen.tolist(),
                                          "fallback": self.fallback}))

    @classmethod
    def load(cls, path: str | Path) -> "VocabMap":
        d = json.loads(Path(path).read_text())
        # Maps saved before `fallback` existed were all built from Qwen's tokenizer.
        return cls(d["ids"], d.get("qwen_vocab", QWEN_VOCAB), specials=(), fallback=d.get("fallback", ENDOFTEXT))


class MappedModel:
    """The model protocol (`__call__`, `logits`, `cfg`) over Qwen ids, for a small-vocabulary model.

    Created inside the traced function around the merged model; `output_ids` tells the sampler
    which Qwen id a sampled logit index stands for.
    """

    def __init__(self, model, vmap: VocabMap):
        self.model, self.vmap = model, vmap
        self.cfg = model.cfg

    def __call__(self, tokens, valid, cache=None):
        return self.model(self.vmap.model_ids(tokens), valid, cache)

    def extend(self, tokens, valid, cache):
        return self.model.extend(self.vmap.model_ids(tokens), valid, cache)

    def logits(self, hidden, head=None):
        return self.model.logits(hidden, head)

    def head_weight(self):
        return self.model.head_weight()

    def output_ids(self, index):
        return self.vmap.qwen_ids(index)

    def target_ids(self, qwen_ids):
        return self.vmap.model_ids(qwen_ids)
