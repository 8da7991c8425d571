"""A scripted 'policy' for rollout tests: row b, turn k emits a fixed token sequence.

It follows the model protocol the rollout uses (`init_cache`, `__call__(tokens, valid, cache) ->
(hidden, cache)`, `logits(hidden)`). The turn is read from the CONTENT: the number of
`<|im_start|>assistant` headers seen so far, so it works the same whether a conversation is appended
turn by turn to one cache (the compiled rollout) or re-encoded whole into a fresh cache every turn
(the host reference loop). A prefill call (T > 1) restarts the emitted-token counter. The 'hidden state' is the id of the token to emit next; `logits` turns it into a
one-hot-like distribution, so greedy sampling reproduces the script exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

IM_END = 151645
ASSISTANT = 77091  # "assistant", as in "<|im_start|>assistant\n"


@struct.dataclass
class ScriptCache:
    end: jax.Array  # [B] tokens seen
    turn: jax.Array  # [B] assistant headers seen, minus 1
    gen: jax.Array  # [B] tokens emitted in the current turn


class Script(nnx.Variable):
    pass


class ScriptedPolicy(nnx.Module):
    def __init__(self, script: np.ndarray, vocab_size: int = 151936):
        """script: int [B, turns, G]; entries past a sequence's end should be IM_END."""
        self.script = Script(jnp.asarray(script, jnp.int32))
        self.vocab_size = vocab_size

    def init_cache(self, batch, max_len, dtype=None):
        z = jnp.zeros((batch,), jnp.int32)
        return ScriptCache(end=z, turn=z - 1, gen=z)

    def __call__(self, tokens, valid, cache):
        script = self.script[...]
        b, t = tokens.shape
        any_valid = jnp.any(valid, axis=1)
        turn = cache.turn + jnp.sum(valid & (tokens == ASSISTANT), axis=1, dtype=jnp.int32)
        if t > 1:  # a prefill: the assistant's message starts after it
            gen = jnp.where(any_valid, 0, cache.gen)
        else:
            gen = cache.gen + valid[:, 0].astype(jnp.int32)
        n_turns, g = script.shape[1], script.shape[2]
        tt = jnp.clip(turn, 0, n_turns - 1)
        nxt = script[jnp.arange(b), tt, jnp.clip(gen, 0, g - 1)]
        nxt = jnp.where(gen < g, nxt, IM_END)
        hidden = jnp.broadcast_to(nxt.astype(jnp.float32)[:, None, None], (b, t, 1))
        cache = ScriptCache(end=cache.end + jnp.sum(valid, axis=1, dtype=jnp.int32), turn=turn, gen=gen)
        return hidden, cache

    def logits(self, hidden):
        ids = hidden[..., 0].astype(jnp.int32)
        return jax.nn.one_hot(ids, self.vocab_size, dtype=jnp.float32) * 60.0 - 30.0


def make_script(tokenizer, turn_texts, group_size_rows: int, max_len: int | None = None) -> np.ndarray:
    """turn_texts[row][turn] -> int [B, turns, G] script of token ids, each turn ending in <|im_end|>."""
    seqs = [[tokenizer.encode(t, add_special_tokens=False) + [IM_END] for t in row] for row in turn_texts]
    n_turns = max(len(r) for r in seqs)
    g = max_len or max(len(s) for r in seqs for s in r)
    out = np.full((len(seqs), n_turns, g), IM_END, np.int32)
    for i, r in enumerate(seqs):
        for k, s in enumerate(r):
            out[i, k, : len(s)] = s[:g]
    return out
