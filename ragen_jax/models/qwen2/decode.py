"""Helpers of the unrolled single-token decode path (`model.decoder_stack`, docs/experiments/decode.md).

Kept apart from model.py so the decode-specific weight handling lives in one place."""

from __future__ import annotations

def layer_weights(layers, li: int, dtype, kernel_dtype=None, transposed: bool = True):
    """Layer `li`'s weights for the unrolled decode, cast to the compute dtype, every kernel stored
    [out, in] under the name `kernel_t`: the copy is made once per program run anyway (see
    `model.decoder_stack`), and a few-row matmul streams an [out, in] kernel faster on XLA:CPU (each
    output reads one contiguous row) than an [in, out] one (docs/experiments/decode.md). Kernels take
    `kernel_dtype` (the model's `matmul_dtype`) when given: the token loop then streams those bytes.
    `transposed=False` (config `decode_transposed`) keeps them [in, out] under `kernel`. A quantized
    base's codes, scales and mins (`kernel_q`, `kernel_scale`, `kernel_min`) are sliced as they are: a
    hoisted float copy of every layer would be the whole model in float, what the quantized base
    exists to avoid (`dense_layer` dequantizes one layer per token instead)."""
    kdt = dtype if kernel_dtype is None else kernel_dtype

    def walk(d):
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = walk(v)
            elif k in ("kernel_q", "kernel_scale", "kernel_min"):
                out[k] = v[li]
            elif k == "kernel" and transposed:
                out["kernel_t"] = v[li].astype(kdt).T
            elif k == "kernel":
                out[k] = v[li].astype(kdt)
            else:
                out[k] = v[li].astype(dtype)
        return out

    return walk(layers)
