"""The numpy Qwen2 the host loop decodes with (tests/ragen_jax/numpy_qwen2.py) is transformers' Qwen2:
its logits equal the stored transformers logits of the parity fixtures (tied and untied heads, GQA 2:1,
4:1 and 3:1, two rope thetas), each row run alone."""

from pathlib import Path

import numpy as np
import pytest

from tests.ragen_jax.numpy_qwen2 import NumpyQwen2

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("name", ["qwen2_tied", "qwen2_untied", "qwen2_gqa3"])
def test_logits_equal_transformers(name):
    model, ref = NumpyQwen2(FIXTURES / name), np.load(FIXTURES / name / "reference.npz")
    for row in range(len(ref["lengths"])):
        n = int(ref["lengths"][row])
        ids = ref["input_ids"][row][ref["attention_mask"][row].astype(bool)]  # the row without its padding
        assert len(ids) == n
        np.testing.assert_allclose(model.logits(ids), ref["logits_single"][row][:n], atol=5e-5)
