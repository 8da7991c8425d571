"""The slow, obvious rollout: a Python loop over episodes and turns.

It is the independent reference the compiled rollout is tested against (tests/ragen_jax/rollout: it
then decodes with `next_logits`, a plain-numpy Qwen2 forward, so not even the model or the sampler is
shared) and the baseline `bench/rollout.py` times it against (then with the JAX sampler).

Everything the compiled rollout does in-graph is done here the plain way: the conversation is
assembled from host TEXT (`TextEnv.render_text`) encoded by the real tokenizer, every turn is a
fresh `generate` call over the whole re-encoded conversation (no cache reuse across turns), answers
are parsed with Python's `re` (`Parser.parse_text` on the decoded text), and the env is stepped one
action at a time from Python. Sampled ids are kept as sampled (never re-tokenized), as in RAGEN-JAX.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ragen_jax.rollout import sampler
from ragen_jax.rollout.rollout import init_cache
from ragen_jax.text.parse import format_penalty_applies


_GEN = {}


def _generate(model, prompt, valid, key, max_new, cfg, stop_table, chat):
    """Fresh cache, prefill the whole conversation, decode: no state survives between turns."""
    graphdef, params = nnx.split(model)
    fkey = (graphdef, prompt.shape, max_new, cfg.greedy, chat.stop, chat.pad)
    if fkey not in _GEN:
        def run(params, prompt, valid, key, stop_table):
            m = nnx.merge(graphdef, params)
            cache = init_cache(m, prompt.shape[0], prompt.shape[1] + max_new)
            logits, cache = sampler.prefill(m, cache, prompt, valid)
            return sampler.decode(m, cache, logits, key, max_new_tokens=max_new, active=jnp.any(valid, axis=1),
                                  temperature=cfg.temperature, greedy=cfg.greedy, use_top_p=False,
                                  stop_ids=chat.stop, pad_id=chat.pad, stop_table=stop_table)
        _GEN[fkey] = jax.jit(run)
    return _GEN[fkey](params, jnp.asarray(prompt), jnp.asarray(valid), key, stop_table)


def _greedy_on_host(next_logits, ids, max_new, stop_ids, stop_text, tok):
    """Greedy decoding with `next_logits(ids) -> [V]` (no cache: the whole sequence each token), stopping
    after a stop id or once the generated text holds `stop_text` (the compiled stop table's rule)."""
    gen = []
    while len(gen) < max_new:
        gen.append(int(np.argmax(next_logits(ids + gen))))
        if gen[-1] in stop_ids or (stop_text and stop_text in tok.decode(gen, skip_special_tokens=False)):
            break
    return gen


def _generate_turn(model, next_logits, ids, active, key, cfg, text_env, token_bytes):
    """Every active row's answer -> (tokens [B, max_new], lengths [B]): one batched JAX generate over
    left-padded whole conversations (inactive rows have no valid token), or row by row with `next_logits`."""
    chat, b, t_max = text_env.ids, cfg.batch_size, cfg.max_context
    max_new = text_env.config.max_response_tokens
    if next_logits is not None:
        stop_text = "</answer>" if cfg.stop_at_answer else ""
        gens = [_greedy_on_host(next_logits, ids[r], max_new, set(chat.stop), stop_text, text_env.tokenizer)
                if active[r] else [] for r in range(b)]
        return np.array([g + [chat.pad] * (max_new - len(g)) for g in gens], np.int64), np.array([len(g) for g in gens])
    prompt = np.full((b, t_max), chat.pad, np.int32)
    valid = np.zeros((b, t_max), bool)
    for r in range(b):
        if active[r]:
            prompt[r, t_max - len(ids[r]):] = ids[r]
            valid[r, t_max - len(ids[r]):] = True
    stop_table = sampler.make_stop_table(("</answer>",), token_bytes) if cfg.stop_at_answer else None
    out = _generate(model, prompt, valid, key, max_new, cfg, stop_table, chat)
    return np.asarray(out.tokens), np.asarray(out.lengths)


def host_rollout(model, text_env, parser, cfg, key, group_seeds, token_bytes, next_logits=None):
    """The rollout as a Python loop (module docstring) -> dict of per-row lists. `next_logits`: an
    independent forward (`ids -> [V]` logits of the next token, e.g. a numpy Qwen2) to decode with,
    greedily, instead of the JAX sampler; the model is then not used."""
    if next_logits is not None and not cfg.greedy:
        raise ValueError("host_rollout decodes with next_logits greedily only; set RolloutConfig.greedy=True")
    env, params = text_env.env, text_env.env_params
    tok = text_env.tokenizer
    chat = text_env.ids
    pc = text_env.config
    n_per, b, t_max = cfg.group_size, cfg.batch_size, cfg.max_context
    max_new = pc.max_response_tokens
    forced_text = pc.forced_prefix
    seeds = np.repeat(np.asarray(group_seeds), n_per)
    # The env's own functions, compiled (as `step` below): op by op, a Sokoban reset compiled each of
    # its ops per seed.
    reset, is_success = jax.jit(env.reset_env), jax.jit(env.is_success)
    states = [reset(jax.random.PRNGKey(int(s)), params)[1] for s in seeds]
    prefix = tok.encode(text_env.prefix_text, add_special_tokens=False)
    ids = [list(prefix) for _ in range(b)]
    mask = [[False] * len(prefix) for _ in range(b)]
    done = [False] * b
    prev_reward, prev_closed = [0.0] * b, [True] * b
    turn_rewards = [[] for _ in range(b)]
    truncated = [False] * b
    step = jax.jit(env.step_env)

    for turn in range(1, text_env.max_turns + 1):
        if all(done):
            break
        key, k_sample, k_env = jax.random.split(key, 3)
        active, budgets = [False] * b, [0] * b
        for r in range(b):
            if done[r]:
                continue
            left = text_env.max_actions_per_episode - int(states[r].time)
            seg = tok.encode(text_env.render_text(states[r], turn, left, prev_reward[r], prev_closed[r]),
                             add_special_tokens=False)
            room = t_max - len(ids[r]) - len(seg)
            if room < 1:
                truncated[r], done[r] = True, True
                continue
            ids[r] += seg
            mask[r] += [False] * len(seg)
            active[r], budgets[r] = True, min(room, max_new)
        gen_all, n_all = _generate_turn(model, next_logits, ids, active, k_sample, cfg, text_env, token_bytes)
        for a_row in range(b):
            if not active[a_row]:
                continue
            # The per-row budget only cuts the same greedy sequence shorter.
            gen = [int(x) for x in gen_all[a_row, : min(n_all[a_row], budgets[a_row])]]
            ids[a_row] += gen
            mask[a_row] += [True] * len(gen)
            parsed = parser.parse_text(forced_text + tok.decode(gen, skip_special_tokens=False))
            reward = 0.0
            st = states[a_row]
            # Names this episode does not accept: dropped, penalised (identity for most envs).
            parsed = jax.tree.map(np.asarray, text_env.restrict_to_state(parsed, st))
            for a in range(int(parsed.num_actions)):
                k = jax.random.fold_in(jax.random.fold_in(k_env, a), a_row)
                _, st, rew, _, _ = step(k, st, jnp.int32(parsed.actions[a]), params)
                reward += float(rew)
            states[a_row] = st
            bad = bool(format_penalty_applies(parsed))
            reward += cfg.format_penalty if bad else 0.0
            turn_rewards[a_row].append(np.float32(reward))
            prev_reward[a_row] = reward
            prev_closed[a_row] = len(gen) > 0 and gen[-1] == chat.im_end
            if bool(st.done) or turn == text_env.max_turns:
                done[a_row] = True
    success = [bool(is_success(s, params)) for s in states]
    return dict(ids=ids, mask=mask, turn_rewards=turn_rewards, success=success, truncated=truncated)
