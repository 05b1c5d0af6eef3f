"""The onednn provider's inner-product kernel for products with constant weights: where
oneDNN's matmul has only its sgemm (which packs B again at every call: oneDNN 3.2 on AVX2),
a product of 1 to INNER_ROWS - 1 rows runs on its inner product, whose brgemm kernel reads
B packed once. Equal to NumPy with every epilogue the matmul kernel fuses, and it does not
take what it must not (many rows, A transposed, weights too large to pack). Plans of
different row counts share one packed copy of the weights.

The kernel is judged on any CPU here: `_REPACKS` is widened so that the matmul primitive
counts as one that repacks whatever its implementation."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import init, model, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=f"oneDNN: {capi.UNAVAILABLE}")
RNG = np.random.default_rng(23)


@pytest.fixture(autouse=True)
def _judged_here(monkeypatch):
    from glassrt.kernels.onednn import dnnl, matmul

    monkeypatch.setattr(matmul, "_REPACKS", ("",))
    probe = dnnl.inner_product(dnnl.MemoryDesc.create((4, 64), np.float32, "ab"), dnnl.MemoryDesc.any((64, 64)),
                               dnnl.MemoryDesc.create((4, 64), np.float32, "ab"))
    if not probe.impl.startswith("brgemm"):
        pytest.skip(f"oneDNN's inner product has no packed kernel on this CPU ({probe.impl})")


def _session(m):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(m.SerializeToString(), providers=["onednn", "cpu"])


def _row(s, name, dims=None):
    return next(n for n in s.explain(dims)["nodes"] if n["name"] == name)


def _gelu(v):
    from math import erf
    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


@pytest.mark.parametrize("x_shape", [(2, 7, 33), (5, 33), (3, 1, 33)])
def test_matmul_with_bias_and_activation_equals_numpy(x_shape):
    """FusedMatMul: scale, bias, a residual (whole or one row) and Gelu as post-ops."""
    n = 29
    w = RNG.standard_normal((33, n)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    zs = {"whole": RNG.standard_normal(x_shape[:-1] + (n,)).astype(np.float32),
          "row": RNG.standard_normal((1, n)).astype(np.float32)}
    nodes = [helper.make_node("FusedMatMul", ["x", "w", "b", f"z_{k}"], [f"y_{k}"], name=f"p_{k}", domain="glassrt",
                              alpha=0.5, activation="Gelu") for k in zs]
    nodes.append(helper.make_node("MatMul", ["x", "w"], ["y_plain"], name="p_plain"))
    m = model(nodes, [tensor("x", list(x_shape))] + [tensor(f"z_{k}", list(z.shape)) for k, z in zs.items()],
              [tensor(f"y_{k}", None) for k in [*zs, "plain"]], [init("w", w), init("b", b)], opset=17,
              domains={"glassrt": 1})
    s = _session(m)
    for k in [*zs, "plain"]:
        row = _row(s, f"p_{k}")
        assert row["kernel"].endswith(".inner_product"), row
        assert "packs B again at every call" in row["reason"]
    got = s.run(None, {"x": x, **{f"z_{k}": z for k, z in zs.items()}})
    for (k, z), y in zip(zs.items(), got):
        np.testing.assert_allclose(y, _gelu(0.5 * (x @ w) + b + z), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[-1], x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_b, alpha, beta", [(0, 1.0, 1.0), (1, 0.5, 2.0), (1, 1.0, 0.0)])
def test_gemm_equals_numpy(trans_b, alpha, beta):
    """Gemm: B stored (N, K) or (K, N), alpha as a scale post-op (the bias then a binary add)."""
    k, n = 40, 24
    b = RNG.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    c = RNG.standard_normal(n).astype(np.float32)
    a = RNG.standard_normal((6, k)).astype(np.float32)
    node = helper.make_node("Gemm", ["a", "B", "C"], ["y"], name="g", transB=trans_b, alpha=alpha, beta=beta)
    s = _session(model([node], [tensor("a", [6, k])], [tensor("y", None)], [init("B", b), init("C", c)], opset=13))
    assert _row(s, "g")["kernel"] == "onednn.Gemm.inner_product"
    ref = alpha * (a @ (b.T if trans_b else b)) + beta * c
    for _ in range(2):  # the same bound primitive, run again
        np.testing.assert_allclose(s.run(None, {"a": a})[0], ref, rtol=1e-5, atol=1e-5)


def test_rows_outside_its_range_and_transposed_a_keep_the_matmul_primitive():
    """INNER_ROWS rows and more (sgemm's per-call packing is paid off), A read transposed
    (an inner product reads A as it lies): the matmul primitive, with the reason in explain."""
    from glassrt.kernels.onednn.matmul import INNER_ROWS

    k, n = 16, 8
    w = RNG.standard_normal((k, n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="p"),
             helper.make_node("Gemm", ["xt", "w"], ["yt"], name="t", transA=1)]
    m = model(nodes, [tensor("x", ["rows", k]), tensor("xt", [k, 4])], [tensor("y", None), tensor("yt", None)],
              [init("w", w)], opset=13)
    s = _session(m)
    xt = RNG.standard_normal((k, 4)).astype(np.float32)
    for rows, kernel in ((1, "onednn.MatMul.inner_product"), (2, "onednn.MatMul.inner_product"),
                         (INNER_ROWS - 1, "onednn.MatMul.inner_product"), (INNER_ROWS, "onednn.MatMul")):
        x = RNG.standard_normal((rows, k)).astype(np.float32)
        y, yt = s.run(None, {"x": x, "xt": xt})
        np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(yt, xt.T @ w, rtol=1e-5, atol=1e-5)
        assert _row(s, "p", {"rows": rows})["kernel"] == kernel
    t = _row(s, "t", {"rows": 2})
    assert t["kernel"] == "onednn.Gemm.matmul" and "A is read transposed" in t["reason"]


def test_plans_of_other_rows_share_the_packed_weights():
    """oneDNN packs 64 x 64 weights AB8b16a for 16 rows and AB8b24a for one (AVX2): the one-row
    plan (a decode step after its prompt) reads the prompt plan's copy instead of packing a
    second; a plan made first packs what oneDNN prefers for it."""
    from glassrt.kernels.onednn import kernels

    k = n = 64
    w = RNG.standard_normal((k, n)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    node = helper.make_node("FusedMatMul", ["x", "w", "b"], ["y"], name="p", domain="glassrt", activation="Relu")
    s = _session(model([node], [tensor("x", ["rows", k])], [tensor("y", None)], [init("w", w), init("b", b)],
                       opset=17, domains={"glassrt": 1}))

    def packed():
        return sorted(str(key[4]) for key in list(kernels._PACKED.keys()) if key[1] == (n, k) or key[1] == (k, n))

    before, after_first = packed(), None
    for rows in (16, 1, 16, 3):
        x = RNG.standard_normal((rows, k)).astype(np.float32)
        np.testing.assert_allclose(s.run(None, {"x": x})[0], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
        assert _row(s, "p", {"rows": rows})["kernel"] == "onednn.FusedMatMul.inner_product"
        after_first = after_first or packed()
    added = [f for f in packed() if f not in before]
    # one copy, in the blocked layout the 16-row plan (made first) asked for: its name
    # depends on the ISA (AB8b16a on AVX2, AB16b32a on AVX-512)
    assert len(added) == 1 and packed() == after_first, added
    assert added[0].split(", ")[2] not in ("ab", "ba"), added


def test_weights_too_large_to_pack_are_read_where_they_lie(monkeypatch):
    from glassrt.kernels.onednn import matmul

    monkeypatch.setattr(matmul, "_PACK_LIMIT", 1024)
    k, n = 35, 31
    w = RNG.standard_normal((k, n)).astype(np.float32)
    s = _session(model([helper.make_node("MatMul", ["x", "w"], ["y"], name="p")], [tensor("x", [4, k])],
                       [tensor("y", None)], [init("w", w)], opset=13))
    row = _row(s, "p")
    assert row["kernel"] == "onednn.MatMul" and "too large to pack" in row["reason"]
    x = RNG.standard_normal((4, k)).astype(np.float32)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], x @ w, rtol=1e-5, atol=1e-5)


def test_packed_layouts_names_the_copies_alive():
    """kernels.packed_layouts: the layouts a weight lies packed in while a kernel holds the
    copy, for the layout it was read as; none once every copy is dropped."""
    import gc

    from glassrt.kernels.onednn import dnnl, kernels

    w = RNG.standard_normal((64, 48)).astype(np.float32)  # (K, N), read as (N, K)
    user = dnnl.MemoryDesc.create((64, 48), np.float32, "ab").permute_axes((1, 0))
    target = dnnl.inner_product(dnnl.MemoryDesc.create((16, 64), np.float32, "ab"), dnnl.MemoryDesc.any((48, 64)),
                                dnnl.MemoryDesc.create((16, 48), np.float32, "ab")).weights_md()
    copy = kernels.packed_weights(w, user, target)
    assert kernels.packed_layouts(w, user) == [target]
    assert kernels.packed_layouts(w, dnnl.MemoryDesc.create((48, 64), np.float32, "ab")) == []  # read otherwise
    del copy
    gc.collect()
    assert kernels.packed_layouts(w, user) == []
