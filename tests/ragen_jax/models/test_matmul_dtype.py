"""`Qwen2Config.matmul_dtype`: projections and the vocabulary head round their operands to the matmul
dtype and accumulate in float32. Truth: numpy matmuls (float64) of the operands rounded to bfloat16."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from ragen_jax.models import Qwen2, Qwen2Config
from ragen_jax.models.qwen2 import model as qwen2_model
from ragen_jax.experiment.config import Config, ConfigError

from .helpers import greedy_decode_hlo


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("transposed", [False, True])
def test_dense_rounds_operands_and_accumulates_in_float32(transposed):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 64)).astype(np.float32)
    w = rng.normal(size=(64, 48)).astype(np.float32)
    b = rng.normal(size=(48,)).astype(np.float32)
    p = {"kernel_t": jnp.asarray(w.T)} if transposed else {"kernel": jnp.asarray(w)}
    p["bias"] = jnp.asarray(b)
    got = qwen2_model.dense_layer(jnp.asarray(x), p, 0.0, "bfloat16")
    assert got.dtype == jnp.float32
    want = _bf16(x) @ _bf16(w) + b
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)
    # The operands really are rounded: float32 operands give a visibly different result.
    assert np.abs(x.astype(np.float64) @ w + b - want).max() > 1e-3


def test_logits_round_hidden_and_head():
    cfg = Qwen2Config.from_preset("tiny", vocab_size=300, num_hidden_layers=1, matmul_dtype="bfloat16")
    model = Qwen2(cfg, nnx.Rngs(0))
    h = jax.random.normal(jax.random.key(1), (2, 3, cfg.hidden_size))
    want = _bf16(h) @ _bf16(model.model.embed_tokens.embedding[...]).T
    np.testing.assert_allclose(np.asarray(model.logits(h)), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(model.logits(h, model.head_weight()), model.logits(h))


def test_token_loop_reads_bf16_kernels_and_casts_the_head_once():
    """The decode program streams bf16 bytes: its token loop carries the per-layer kernels as bf16
    buffers, and the vocabulary head is converted outside the loop (a convert inside would re-read the
    float32 matrix every token)."""
    cfg = Qwen2Config.from_preset("tiny", num_hidden_layers=3, intermediate_size=136, vocab_size=520,
                                  matmul_dtype="bfloat16")
    text, loop = greedy_decode_hlo(Qwen2(cfg, nnx.Rngs(0)))
    # gate, up and down of each layer, in either orientation (XLA may fold the [out, in] transpose into
    # the bf16 dot), and no float32 copy of them
    assert loop.count("bf16[136,64]") + loop.count("bf16[64,136]") == 3 * cfg.num_hidden_layers
    assert "bf16[520,64]" in loop and "f32[136,64]" not in loop and "f32[64,136]" not in loop
    head_converts = [ln for ln in text.splitlines() if "convert(" in ln and ln.lstrip().startswith("ROOT")
                     and "bf16[520,64]" in ln]
    assert head_converts and not [ln for ln in head_converts if "while/body" in ln]


def test_config_normalises_and_rejects_matmul_dtypes():
    cfg = Qwen2Config.from_preset("tiny", matmul_dtype=jnp.bfloat16)
    assert cfg.matmul_dtype == "bfloat16"
    assert Qwen2Config.from_preset("tiny", matmul_dtype="float32").matmul_dtype is None  # = dtype
    with pytest.raises(ValueError, match="matmul_dtype"):
        Qwen2Config.from_preset("tiny", matmul_dtype="int8")
    c = Config()
    c.model.random_init, c.model.matmul_dtype = True, "float16"
    with pytest.raises(ConfigError, match="model.matmul_dtype='float16' is not valid"):
        c.model.validate()


def test_trainer_config_reaches_the_policy():
    from ragen_jax.experiment.build import build_policy

    c = Config()
    c.model.random_init, c.model.preset, c.model.matmul_dtype = True, "tiny", "bfloat16"
    c.mesh.data = 1
    assert build_policy(c).cfg.matmul_dtype == "bfloat16"
    c.model.matmul_dtype = None
    assert build_policy(c).cfg.matmul_dtype is None
