"""HF checkpoint I/O: name table vs files written by transformers, round trips, transformers loading ours,
and the error messages."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from ragen_jax.models import from_pretrained, save_pretrained
from ragen_jax.models.qwen2.weights import INDEX_FILE, hf_state_dict

from tests.ragen_jax.numpy_qwen2 import NumpyQwen2

from .helpers import VARIANTS, fixture_dir, reference


def _params(model):
    return jax.tree.map(np.asarray, nnx.state(model, nnx.Param).to_pure_dict())


def _assert_same_params(a, b):
    pa, pb = _params(a), _params(b)
    assert jax.tree.structure(pa) == jax.tree.structure(pb)
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def _read_all(path):
    with safe_open(path, framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_state_dict_equals_the_transformers_file(variant):
    # Names, shapes and values of what we would write == what transformers wrote (tied: no lm_head).
    model = from_pretrained(fixture_dir(variant))
    theirs = _read_all(os.path.join(fixture_dir(variant), "model.safetensors"))
    ours = hf_state_dict(model)
    assert set(ours) == set(theirs)
    assert ("lm_head.weight" in ours) == (variant == "untied")
    for name, a in theirs.items():
        np.testing.assert_array_equal(ours[name], a, err_msg=name)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shard", [None, "60KB"])
def test_save_load_round_trip_f32(tmp_path, variant, shard):
    model = from_pretrained(fixture_dir(variant))
    save_pretrained(model, tmp_path, max_shard_size=shard)
    files = sorted(os.listdir(tmp_path))
    if shard is None:
        assert files == ["config.json", "model.safetensors"]
    else:
        index = json.load(open(tmp_path / INDEX_FILE))
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) > 1 and files == sorted(["config.json", INDEX_FILE, *shards])
        for s in shards:
            assert os.path.getsize(tmp_path / s) < 60_000 + 20_000  # one tensor may overshoot; none here
    _assert_same_params(from_pretrained(tmp_path), model)


@pytest.mark.parametrize("variant", VARIANTS)
def test_save_load_round_trip_bf16_sharded(tmp_path, variant):
    model = from_pretrained(fixture_dir(variant), dtype="bfloat16")
    save_pretrained(model, tmp_path, max_shard_size=50_000)
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["dtype"] == "bfloat16" and cfg["rope_parameters"]["rope_type"] == "default"
    index = json.load(open(tmp_path / INDEX_FILE))
    some = next(iter(index["weight_map"].items()))
    with safe_open(str(tmp_path / some[1]), framework="numpy") as f:
        assert str(f.get_tensor(some[0]).dtype) == "bfloat16"
    _assert_same_params(from_pretrained(tmp_path, dtype="bfloat16"), model)
    # bf16 checkpoint loaded as f32 params: values exactly the bf16 values.
    up = from_pretrained(tmp_path).model.layers.mlp.up_proj.kernel[...]
    assert up.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(up), np.asarray(model.model.layers.mlp.up_proj.kernel[...], np.float32))


@pytest.mark.parametrize("variant, shard", [("tied", None), ("untied", "60KB")])
def test_transformers_loads_our_checkpoint_with_same_logits(tmp_path, variant, shard):
    torch = pytest.importorskip("torch")
    from transformers import Qwen2ForCausalLM

    save_pretrained(from_pretrained(fixture_dir(variant)), tmp_path, max_shard_size=shard)
    ref = reference(variant)
    hf = Qwen2ForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    with torch.no_grad():
        logits = hf(
            input_ids=torch.tensor(ref["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(ref["attention_mask"], dtype=torch.long),
            position_ids=torch.tensor(ref["position_ids"], dtype=torch.long),
        ).logits.float().numpy()
    valid = ref["attention_mask"].astype(bool)
    # The fixture's logits were computed by torch on another CPU: its kernels sum in another order
    # per CPU (up to 7e-6 apart measured on an Intel Xeon), so 1e-5, the bound the exports are held to.
    np.testing.assert_allclose(logits[valid], ref["logits"][valid], rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant, shard", [("tied", None), ("untied", "60KB")])
def test_our_checkpoint_read_by_numpy_qwen2_gives_transformers_logits(tmp_path, variant, shard):
    """The export in CI without torch: read back by the numpy Qwen2 written from transformers' code
    (tests/ragen_jax/numpy_qwen2.py, itself checked against these stored logits), names, layout, shards
    and index included, it gives transformers' stored logits."""
    save_pretrained(from_pretrained(fixture_dir(variant)), tmp_path, max_shard_size=shard)
    assert (tmp_path / "model.safetensors.index.json").exists() == (shard is not None)
    ref = reference(variant)
    model = NumpyQwen2(tmp_path)
    for row in range(len(ref["lengths"])):
        ids = ref["input_ids"][row][ref["attention_mask"][row].astype(bool)]
        np.testing.assert_allclose(model.logits(ids), ref["logits_single"][row][: len(ids)], atol=5e-5)


# ----------------------------------------------------------------------------- errors
@pytest.fixture
def tied_copy(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(fixture_dir("tied"), d)
    os.remove(d / "reference.npz")
    return d


def _edit_config(d, **changes):
    cfg = json.load(open(d / "config.json"))
    cfg.update(changes)
    json.dump(cfg, open(d / "config.json", "w"))


def test_error_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope: model directory does not exist"):
        from_pretrained(tmp_path / "nope")


def test_error_missing_config(tied_copy):
    os.remove(tied_copy / "config.json")
    with pytest.raises(FileNotFoundError, match=r"m/config.json: not found"):
        from_pretrained(tied_copy)


def test_error_missing_weight_file(tied_copy):
    os.remove(tied_copy / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="no weights found .expected model.safetensors or model.safetensors.index.json"):
        from_pretrained(tied_copy)


def test_error_unknown_architecture(tied_copy):
    _edit_config(tied_copy, architectures=["LlamaForCausalLM"])
    with pytest.raises(ValueError, match=r"config.json: unknown architecture \['LlamaForCausalLM'\]"):
        from_pretrained(tied_copy)


def test_error_shape_mismatch_names_weight_and_shapes(tied_copy):
    _edit_config(tied_copy, vocab_size=300)
    with pytest.raises(ValueError, match=r"model.safetensors: weight 'model.embed_tokens.weight' has shape \(256, 64\), expected \(300, 64\)"):
        from_pretrained(tied_copy)


def test_error_missing_weight(tied_copy):
    _edit_config(tied_copy, tie_word_embeddings=False)  # now lm_head.weight is required
    with pytest.raises(ValueError, match="weight 'lm_head.weight' is missing from the checkpoint"):
        from_pretrained(tied_copy)


def test_error_index_lists_missing_shard_or_weight(tmp_path):
    model = from_pretrained(fixture_dir("tied"))
    save_pretrained(model, tmp_path, max_shard_size="60KB")
    index = json.load(open(tmp_path / INDEX_FILE))
    # A weight the index places in a shard that does not hold it.
    name, shard = "model.norm.weight", index["weight_map"]["model.norm.weight"]
    other = next(s for s in set(index["weight_map"].values()) if s != shard)
    index["weight_map"][name] = other
    json.dump(index, open(tmp_path / INDEX_FILE, "w"))
    with pytest.raises(ValueError, match=f"{other}: weight 'model.norm.weight' listed in {INDEX_FILE} is not in the file"):
        from_pretrained(tmp_path)
    os.remove(tmp_path / other)
    with pytest.raises(FileNotFoundError, match=f"{INDEX_FILE}: lists shard '{other}', which does not exist"):
        from_pretrained(tmp_path)


# ----------------------------------------------------------------------------- sharded loading
class _SpyOpen:
    """safe_open whose tensor slices record the shape of every block the loader reads."""

    def __init__(self, real, reads):
        self.real, self.reads = real, reads

    def __call__(self, file, framework):
        spy = self
        handle = spy.real(file, framework=framework)

        class Handle:
            def keys(self):
                return handle.keys()

            def get_slice(self, name):
                sl = handle.get_slice(name)

                class Slice:
                    def get_shape(self):
                        return sl.get_shape()

                    def __getitem__(self, idx):
                        a = sl[idx]
                        spy.reads.append((name, tuple(sl.get_shape()), a.shape))
                        return a

                return Slice()

        return Handle()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("axes", [dict(data=1, fsdp=8), dict(data=2, fsdp=2, tensor=2)])
def test_sharded_load_reads_each_devices_shard_only(tmp_path, monkeypatch, variant, axes):
    from ragen_jax.models import make_mesh, param_shardings
    from ragen_jax.models.qwen2 import weights

    plain = from_pretrained(fixture_dir(variant))  # the unsharded load: the truth
    save_pretrained(plain, tmp_path, max_shard_size="60KB")  # several files
    reads = []
    monkeypatch.setattr(weights, "safe_open", _SpyOpen(weights.safe_open, reads))
    mesh = make_mesh(**axes)
    placed = from_pretrained(tmp_path, mesh=mesh)

    want = param_shardings(nnx.state(plain, nnx.Param), mesh)
    n_sharded = 0
    for a, b, s in zip(jax.tree.leaves(nnx.state(plain, nnx.Param)), jax.tree.leaves(nnx.state(placed, nnx.Param)),
                       jax.tree.leaves(want)):
        assert b.sharding == s and b.dtype == a.dtype
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
        shard = s.shard_shape(a.shape)
        assert {x.device for x in b.addressable_shards} == set(mesh.devices.flat)
        for x in b.addressable_shards:  # each device holds its block, not the parameter
            assert x.data.shape == shard
        n_sharded += shard != a.shape
    assert n_sharded >= 8  # the embedding and every stacked kernel are split on these meshes
    # The host read blocks, never a whole tensor that is split over the mesh: the embedding's
    # columns are split over fsdp on both meshes.
    emb = [(full, got) for name, full, got in reads if name == "model.embed_tokens.weight"]
    assert emb and all(got[1] < full[1] for full, got in emb)
    kernels = [(full, got) for name, full, got in reads if name.endswith("mlp.up_proj.weight")]
    assert kernels and all(np.prod(got) < np.prod(full) for full, got in kernels)
