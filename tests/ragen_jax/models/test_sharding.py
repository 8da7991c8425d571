"""Sharding rules on 8 simulated CPU devices (tests/conftest.py): sharded forward == unsharded."""

import re

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from ragen_jax.models import KVCache, Qwen2, Qwen2Config, Qwen2Critic, from_pretrained, make_mesh, param_shardings
from ragen_jax.models.qwen2.sharding import LOGICAL_AXES, path_str, batch_sharding, cache_sharding, logical_axes

from .helpers import fixture_dir, logits_nocache, logits_step, reference

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(data=2, fsdp=2, tensor=2)


def test_every_parameter_has_a_table_entry():
    cfg = Qwen2Config.from_preset("tiny", tie_word_embeddings=False)
    for cls in (Qwen2, Qwen2Critic):
        module = nnx.eval_shape(lambda: cls(cfg, nnx.Rngs(0)))
        for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(module, nnx.Param))[0]:
            name = path_str(path)
            assert any(re.search(pat, name) and len(ax) == leaf.ndim for pat, ax in LOGICAL_AXES), name


def test_specs_follow_rules_and_replicate_indivisible_dims(mesh):
    cfg = Qwen2Config.from_preset("qwen2.5-0.5b")
    abstract = nnx.state(nnx.eval_shape(lambda: Qwen2(cfg, nnx.Rngs(0))), nnx.Param)
    sh = param_shardings(abstract, mesh).to_pure_dict()
    layers = sh["model"]["layers"]
    assert sh["model"]["embed_tokens"]["embedding"].spec == P("tensor", "fsdp")
    assert layers["self_attn"]["q_proj"]["kernel"].spec == P(None, "fsdp", "tensor")
    assert layers["self_attn"]["o_proj"]["kernel"].spec == P(None, "tensor", "fsdp")
    assert layers["mlp"]["down_proj"]["kernel"].spec == P(None, "tensor", "fsdp")
    assert layers["input_layernorm"]["scale"].spec == P(None, None)
    # 14 heads * 64 = 896 splits over tensor=4 only if divisible: 896 % 4 == 0 -> sharded; the
    # vocab 151936 over tensor=3 is not divisible -> replicated.
    m3 = make_mesh(data=1, fsdp=2, tensor=-1, devices=jax.devices()[:6])
    assert dict(m3.shape) == {"data": 1, "fsdp": 2, "tensor": 3}
    sh3 = param_shardings(abstract, m3).to_pure_dict()
    assert sh3["model"]["embed_tokens"]["embedding"].spec == P(None, "fsdp")
    assert logical_axes("opt/0/mu/model/layers/mlp/up_proj/kernel", 3) == ("layers", "embed", "mlp")
    assert logical_axes("opt/count", 0) == ()


def test_make_mesh_errors():
    with pytest.raises(ValueError, match=r"mesh data=3 x fsdp=1 x tensor=1 = 3 devices, but 8 are available"):
        make_mesh(data=3)
    with pytest.raises(ValueError, match="8 devices cannot be split into data=-1, fsdp=3"):
        make_mesh(data=-1, fsdp=3)
    with pytest.raises(ValueError, match="mesh sizes must be positive"):
        make_mesh(data=0)


def test_sharded_forward_equals_unsharded(mesh):
    model = from_pretrained(fixture_dir("untied"))
    ref = reference("untied")
    g, p = nnx.split(model)
    sh = param_shardings(p, mesh)
    ps = jax.device_put(p, sh)
    assert ps["lm_head"]["kernel"][...].sharding.spec == P("fsdp", "tensor")
    # batch 4 (divisible by data*fsdp) so the batch is really split.
    ids = np.concatenate([ref["input_ids"], ref["input_ids"][:1]])
    valid = np.concatenate([ref["attention_mask"], ref["attention_mask"][:1]]).astype(bool)
    want = np.asarray(logits_nocache(g, p, ids, valid))
    ids_s, valid_s = (jax.device_put(x, batch_sharding(mesh)) for x in (ids, valid))
    got = logits_nocache(g, ps, ids_s, valid_s)
    np.testing.assert_allclose(np.asarray(got)[valid], want[valid], rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got)[:3][valid[:3]], ref["logits"][valid[:3]], rtol=0, atol=1e-5)
    # Cache path with a sharded cache too.
    cache = KVCache.init(model.cfg, batch=4, max_len=16)
    cache = jax.device_put(cache, cache_sharding(cache, mesh))
    got_c, cache = logits_step(g, ps, ids_s, valid_s, cache)
    np.testing.assert_allclose(np.asarray(got_c)[valid], want[valid], rtol=0, atol=1e-5)


def test_from_pretrained_places_params_on_the_mesh(mesh):
    plain = from_pretrained(fixture_dir("tied"))
    placed = from_pretrained(fixture_dir("tied"), mesh=mesh)
    want = param_shardings(nnx.state(plain, nnx.Param), mesh)
    got_leaves = jax.tree.leaves(nnx.state(placed, nnx.Param))
    for a, b, s in zip(jax.tree.leaves(nnx.state(plain, nnx.Param)), got_leaves, jax.tree.leaves(want)):
        assert b.sharding == s
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    emb = placed.model.embed_tokens.embedding[...]
    assert emb.sharding.spec == P("tensor", "fsdp") and emb.addressable_shards[0].data.shape == (128, 32)


def test_save_pretrained_from_sharded_params(tmp_path, mesh):
    from ragen_jax.models import save_pretrained

    placed = from_pretrained(fixture_dir("untied"), mesh=mesh)
    save_pretrained(placed, tmp_path, max_shard_size="50KB")
    again = from_pretrained(tmp_path)
    for a, b in zip(jax.tree.leaves(nnx.state(placed, nnx.Param)), jax.tree.leaves(nnx.state(again, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
