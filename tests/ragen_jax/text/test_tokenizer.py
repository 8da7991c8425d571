"""The offline Qwen2.5 tokenizer against independent truths: the published id sequence, tiktoken
itself (the reference BPE over the same ranks), the Qwen2.5 chat template output, and decode."""

import json
import random
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_jax.text import tokenizer as tkz
from ragen_jax.text.tokenizer import ENDOFTEXT, IM_END, IM_START, load_tokenizer, token_bytes_table


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def tiktoken_enc():
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(tkz.tiktoken_path()))
    specials = {t: ENDOFTEXT + i for i, (t, _) in enumerate(tkz.ADDED_TOKENS)}
    return tiktoken.Encoding("qwen", pat_str=tkz.QWEN_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def test_known_sequence_and_constants(tok):
    text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    assert tok.encode(text) == [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198]
    assert len(tok) == 151665
    assert tok.eos_token_id == IM_END == 151645
    assert tok.pad_token_id == ENDOFTEXT == 151643
    assert tok.convert_tokens_to_ids("<|im_start|>") == IM_START
    assert tok.convert_tokens_to_ids("<|file_sep|>") == 151664
    assert tok.bos_token is None


def test_pieces_the_project_relies_on(tok):
    assert len(tok.encode("######\n")) == 1
    assert len(tok.encode("__")) == 1
    assert len(tok.encode("#\n")) == 1
    assert tok.encode("<think>") == tok.encode("<think>")  # stable
    assert tok.decode(tok.encode("<answer>Up || Left</answer>")) == "<answer>Up || Left</answer>"


def test_chat_template(tok):
    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi #1"},
    ]
    s = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert s == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi #1<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(s)
    assert ids[:11] == [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198]
    assert ids[-3:] == [IM_START, tok.convert_tokens_to_ids("assistant"), 198]
    # Without a system message: Qwen2.5's default one.
    s2 = tok.apply_chat_template(msgs[1:], tokenize=False, add_generation_prompt=False)
    assert s2 == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi #1<|im_end|>\n"
    )


_TEXT = st.lists(
    st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(list("#_√\n\r\t  0123456789.,;:!?'\"()[]{}<>|/\\-+=*&^%$@~`")),
        st.sampled_from(["'s", "'LL", "<|im_end|>", "<think>", "</answer>", "\u00a0", "\u3000", "é", "e\u0301"]),
    ),
    max_size=40,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=_TEXT)
def test_encode_matches_tiktoken_and_round_trips(tok, tiktoken_enc, text):
    # The HF tokenizer applies NFC first; tiktoken does not.
    nfc = unicodedata.normalize("NFC", text)
    ids = tok.encode(text)
    assert ids == tiktoken_enc.encode(nfc, allowed_special="all")
    assert tok.decode(ids) == nfc


def test_token_bytes_table(tok):
    table, lengths = token_bytes_table(tok, vocab_size=151936)
    assert table.shape[0] == lengths.shape[0] == 151936 and table.dtype == np.uint8
    assert table.shape[1] == lengths.max() == 128
    assert token_bytes_table(tok, vocab_size=151936)[0] is table  # memoised
    assert (lengths[151665:] == 0).all() and (lengths[:151665] > 0).all()
    for i, (t, _) in enumerate(tkz.ADDED_TOKENS):
        assert bytes(table[ENDOFTEXT + i, : lengths[ENDOFTEXT + i]]) == t.encode()
    # Rows are zero padded.
    col = np.arange(table.shape[1])[None, :]
    assert (table[col >= lengths[:, None]] == 0).all()

    def row(i):
        return bytes(table[i, : lengths[i]])

    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(151665) for _ in range(rng.randrange(1, 12))]
        raw = b"".join(row(i) for i in ids)
        # Any sequence, also ones cutting UTF-8 characters: decode == lossy UTF-8 of the bytes.
        assert tok.decode(ids) == raw.decode("utf-8", errors="replace")
    for text in ["héllo wörld √2 ≈ 1.41 #__", "日本語のテキスト", "emoji 🙂🚀 mixed", "######\n#_$.#\n"]:
        ids = tok.encode(text)
        assert b"".join(row(i) for i in ids) == text.encode()


def test_model_dir_tokenizer_is_used(tok, tmp_path):
    tok.save_pretrained(str(tmp_path))
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eos_token"] = "<|endoftext|>"
    cfg_path.write_text(json.dumps(cfg))
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    t2 = load_tokenizer(tmp_path)
    assert t2.eos_token_id == ENDOFTEXT
    assert t2.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "[x]"
    assert t2.encode("######\n") == tok.encode("######\n")
    assert load_tokenizer() is tok  # the built-in one is untouched


def test_missing_dir_errors(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_tokenizer(missing)
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="vocab_size"):
        token_bytes_table(load_tokenizer(), vocab_size=0)


def test_cache_build_is_atomic_and_race_safe(tmp_path, monkeypatch):
    """A second builder that loses the rename race leaves the first cache intact and no temp dirs;
    a fresh cache dir is found through $RAGEN_JAX_CACHE."""
    from tokenizers import Tokenizer, models

    def tiny_backend(_):
        return Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))

    monkeypatch.setattr(tkz, "_build_backend", tiny_backend)
    target = tmp_path / "tokenizer" / "v"
    tkz.build_into_cache(tkz.tiktoken_path(), target)
    first = (target / "tokenizer.json").read_bytes()
    tkz.build_into_cache(tkz.tiktoken_path(), target)  # loses the race: rename onto a full dir
    assert (target / "tokenizer.json").read_bytes() == first
    assert sorted(p.name for p in target.parent.iterdir()) == ["v"]

    monkeypatch.setenv("RAGEN_JAX_CACHE", str(tmp_path / "fresh"))
    d = tkz.default_tokenizer_dir()
    assert d.parent == tmp_path / "fresh" / "tokenizer" and (d / "tokenizer.json").is_file()
