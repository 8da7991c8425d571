"""Splash over several devices: `attention.partitioned` runs a kernel shard by shard in a shard_map over
the context mesh (`sharding.on_mesh`), since XLA cannot partition a Mosaic call.

The kernel cannot run on this CPU, so the wrapper's partitioning is checked with the reference
(einsum) attention inside the same shard_map, on 8 simulated devices (tests/conftest.py), against the
unsharded einsum attention: values and gradients wrt q, k, v (float32, atol 2e-5 / 5e-5: the same
arithmetic per row and head, only placed elsewhere). Each shard's shape is recorded at trace time, so
a wrapper that silently replicated everything would fail. Then the real splash call (the Pallas
interpreter off TPU) inside the wrapper, and the TPU lowering of the sharded kernel (`jax.export`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.models import make_mesh, on_mesh
from ragen_jax.models.attention import attention, partitioned, resolve, visible_mask, xla_attention

f32 = jnp.float32
PALLAS_TPU = "tpu_custom_call"

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices: tests/conftest.py")


def _case(b, t, nh, nkv, d, dtype=f32, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (b, t, nh, d), f32).astype(dtype)
    k = jax.random.normal(ks[1], (b, t, nkv, d), f32).astype(dtype)
    v = jax.random.normal(ks[2], (b, t, nkv, d), f32).astype(dtype)
    w = jax.random.normal(ks[3], (b, t, nh * d), f32)
    lengths = np.maximum(1, (np.arange(b) * 7919) % t + 1)  # ragged right padding, one row full
    lengths[0] = t
    valid = jnp.asarray(np.arange(t)[None] < lengths[:, None])
    return q, k, v, w, valid


def _placed(mesh, *arrays):
    """The arrays on the mesh as a trainer holds them: rows over the batch axes (replicated where the
    batch does not divide). A program's devices come from its arguments' shardings."""
    rows = mesh.shape["data"] * mesh.shape["fsdp"]
    spec = jax.sharding.PartitionSpec(("data", "fsdp") if arrays[0].shape[0] % rows == 0 else None)
    return jax.device_put(arrays, jax.sharding.NamedSharding(mesh, spec))


def _reference_kernel(seen, q, k, v, kv_valid):
    """The einsum attention of one shard, [B, T, nH, D]; records the shard's shapes."""
    seen.append((q.shape, k.shape, kv_valid.shape))
    b, t, nh, d = q.shape
    slot = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    return xla_attention(q, k, v, visible_mask(kv_valid, slot, t)).reshape(b, t, nh, d)


def _value_and_grads(fn, q, k, v, w, valid):
    def loss(q, k, v):
        out = fn(q, k, v, valid).reshape(w.shape)
        return jnp.sum(jnp.where(valid[..., None], out.astype(f32) * w, 0.0)), out

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)


def _assert_close(ref, got, valid, out_tol=2e-5, grad_tol=5e-5):
    (_, o_ref), g_ref = ref
    (_, o), g = got
    m = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(o, f32)[m], np.asarray(o_ref, f32)[m], rtol=0, atol=out_tol)
    for name, a, b in zip("qkv", g_ref, g):
        np.testing.assert_allclose(np.asarray(b, f32), np.asarray(a, f32), rtol=0, atol=grad_tol, err_msg=f"d{name}")


# (data, fsdp, tensor), batch, kv heads -> the shard each device must see: rows over data x fsdp where
# the batch divides, key/value heads (with their query heads) over tensor where they divide; where
# neither divides, every device holds the whole arrays.
MESHES = [((2, 2, 2), 8, 2, (2, 1)), ((4, 1, 2), 6, 1, (6, 1))]


@pytest.mark.parametrize("sizes,b,nkv,shard", MESHES, ids=["rows-and-heads", "neither-divides"])
def test_partitioned_reference_attention_equals_unsharded(sizes, b, nkv, shard):
    t, g, d = 12, 3, 8
    q, k, v, w, valid = _case(b, t, nkv * g, nkv, d)
    mesh = make_mesh(*sizes)
    seen: list = []
    kernel = functools.partial(_reference_kernel, seen)
    sharded = jax.jit(on_mesh(lambda *a: _value_and_grads(functools.partial(partitioned, kernel), *a), mesh))
    got = sharded(*_placed(mesh, q, k, v, w, valid))
    ref = jax.jit(lambda *a: _value_and_grads(functools.partial(attention, implementation="xla"), *a))(q, k, v, w, valid)
    _assert_close(ref, got, valid)
    rows, kv_heads = shard
    assert seen[0] == ((rows, t, kv_heads * g, d), (rows, t, kv_heads, d), (rows, t))
    # Without a context mesh the kernel sees the whole arrays (one device, or XLA's own partitioning).
    seen.clear()
    jax.jit(functools.partial(partitioned, kernel))(q, k, v, valid)
    assert seen[0][0] == q.shape


def test_sharded_splash_in_the_pallas_interpreter_equals_xla():
    """The real call path: attention(implementation="splash") traced on a data x tensor mesh."""
    q, k, v, w, valid = _case(2, 120, 4, 2, 16, seed=1)
    mesh = make_mesh(2, 1, 2, devices=jax.devices()[:4])
    splash = functools.partial(attention, implementation="splash")
    got = jax.jit(on_mesh(lambda *a: _value_and_grads(splash, *a), mesh))(*_placed(mesh, q, k, v, w, valid))
    ref = jax.jit(lambda *a: _value_and_grads(functools.partial(attention, implementation="xla"), *a))(q, k, v, w, valid)
    _assert_close(ref, got, valid)


def test_sharded_splash_lowers_for_tpu_with_the_kernel():
    """Forward and backward of the sharded call, exported for a TPU from this CPU: 8 devices, the
    Mosaic kernel inside (not its interpreter)."""
    mesh = make_mesh(4, 1, 2)
    q, k, v, w, valid = _case(8, 256, 4, 2, 64, dtype=jnp.bfloat16)
    splash = functools.partial(attention, implementation="splash")
    fn = jax.jit(on_mesh(lambda *a: _value_and_grads(splash, *a), mesh))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
    args = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=spec) for x in (q, k, v, w, valid)]
    exp = jax.export.export(fn, platforms=["tpu"])(*args)
    assert exp.nr_devices == 8 and PALLAS_TPU in exp.mlir_module()


def test_auto_picks_splash_on_several_tpu_devices_only_on_a_context_mesh():
    kw = dict(t=1024, s=1024, self_layout=True, dtype=jnp.bfloat16, head_dim=64, backend="tpu")
    assert resolve("auto", n_devices=8, on_mesh=True, **kw) == "splash"
    assert resolve("auto", n_devices=8, on_mesh=False, **kw) == "chunked"  # nothing to build the shard_map from
    assert resolve("auto", n_devices=1, on_mesh=False, **kw) == "splash"
    # `on_mesh` unset reads the context: none here, set inside a program traced with `on_mesh`.
    assert resolve("auto", n_devices=8, **kw) == "chunked"
    picked = []
    jax.jit(on_mesh(lambda x: picked.append(resolve("auto", n_devices=8, **kw)) or x, make_mesh(8)))(jnp.ones(8))
    assert picked == ["splash"]
