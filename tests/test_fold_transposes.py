"""passes/fold_transposes.py: attention's head Transposes read and written through the
product's strides (glassrt::FusedMatMul perm_a / perm_b / perm_y), on every provider."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi
from glassrt.tools.bench_models import bert, bert_feeds

from .helpers import init, model, tensor

RNG = np.random.default_rng(0)
PROVIDERS = [["cpu"]] + ([] if capi.UNAVAILABLE else [["onednn", "cpu"]])


def _session(m, providers=None, level=None):
    so = glassrt.SessionOptions()
    if level:
        so.graph_optimization_level = level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(m.SerializeToString(), so, providers=providers)


def _folds(s):
    return [c for p in s.explain()["passes"] if p["name"] == "fold_transposes" for c in p["changes"]]


def _attention(b=2, s=5, h=3, d=4, mask=True):
    """Heads split from (b, s, h·d) as PyTorch's exporter writes them: Q and V by
    Transpose(0, 2, 1, 3), K by Transpose(0, 2, 3, 1), the result merged back by
    Transpose(0, 2, 1, 3) and a Reshape."""
    shape = init("heads", np.array([b, s, h, d], np.int64))
    merged = init("merged", np.array([b, s, h * d], np.int64))
    nodes = []
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [name, "heads"], [name + "4"], name=name + "_split"),
                  helper.make_node("Transpose", [name + "4"], [name + "t"], name=name + "_t", perm=perm)]
    nodes += [helper.make_node("MatMul", ["qt", "kt"], ["scores"], name="qk"),
              helper.make_node("Div", ["scores", "scale"], ["scaled"], name="scale")]
    if mask:
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask_add"))
    nodes += [helper.make_node("Softmax", ["masked" if mask else "scaled"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["ctx"], name="pv"),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="merge_t", perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merged"], ["y"], name="merge")]
    inputs = [tensor(n, [b, s, h * d]) for n in "qkv"] + ([tensor("mask", [b, 1, 1, s])] if mask else [])
    m = model(nodes, inputs, [tensor("y", None)], [shape, merged, init("scale", np.array(2.0, np.float32))], opset=17)
    feeds = {n: RNG.standard_normal((b, s, h * d)).astype(np.float32) for n in "qkv"}
    if mask:
        feeds["mask"] = (RNG.random((b, 1, 1, s)) < 0.3).astype(np.float32) * -1e4
    return m, feeds


def _reference(feeds, b=2, s=5, h=3, d=4):
    q, k, v = (feeds[n].reshape(b, s, h, d) for n in "qkv")
    sc = q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1) / 2 + feeds.get("mask", 0)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3).reshape(b, s, h * d)


@pytest.mark.parametrize("providers", PROVIDERS, ids="+".join)
@pytest.mark.parametrize("mask", [True, False])
def test_attention_heads_fold_into_the_products_and_keep_the_values(providers, mask):
    m, feeds = _attention(mask=mask)
    s = _session(m, providers)
    assert _folds(s) == ["fold Transpose 'q_t', Transpose 'k_t' into FusedMatMul 'qk'",
                         "fold Transpose 'v_t', Transpose 'merge_t' into MatMul 'pv'"]
    assert not [n for n in s.explain()["nodes"] if n["op"] == "Transpose"]
    for _ in range(2):  # a replay reuses the bound kernels and their views
        np.testing.assert_allclose(s.run(None, feeds)[0], _reference(feeds), rtol=1e-4, atol=1e-5)
    unfused = _session(m, providers, level="basic")
    assert not _folds(unfused)
    np.testing.assert_allclose(s.run(None, feeds)[0], unfused.run(None, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")
def test_onednn_runs_the_folded_products_through_strides():
    m, _ = _attention()
    rows = {n["name"]: n for n in _session(m, ["onednn", "cpu"]).explain()["nodes"]}
    assert rows["qk"]["kernel"] == rows["pv"]["kernel"] == "onednn.FusedMatMul.batched_matmul"


def test_the_fold_does_not_fire_where_it_must_not():
    """A Transpose another node also reads, one that is a graph output, and a product with
    constant weights keep their Transposes."""
    x, w = tensor("x", [2, 3, 4]), RNG.standard_normal((3, 5)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], name="shared_t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["xt", "x"], ["a"], name="uses_shared"),  # (2,4,3)@(2,3,4)
             helper.make_node("Relu", ["xt"], ["r"], name="second_reader"),
             helper.make_node("Transpose", ["x"], ["out_t"], name="output_t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["out_t", "x"], ["b"], name="reads_an_output"),
             helper.make_node("Transpose", ["x"], ["wt_in"], name="before_weights", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["wt_in", "w"], ["c"], name="weights")]
    m = model(nodes, [x], [tensor(n, None) for n in ("a", "r", "out_t", "b", "c")],
              [init("w", w)], opset=17)
    s = _session(m, ["cpu"])
    assert not _folds(s)
    xv = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    a, r, out_t, b, c = s.run(None, {"x": xv})
    np.testing.assert_allclose(a, xv.transpose(0, 2, 1) @ xv, rtol=1e-5)
    np.testing.assert_allclose(b, xv.transpose(0, 2, 1) @ xv, rtol=1e-5)
    np.testing.assert_allclose(c, xv.transpose(0, 2, 1) @ w, rtol=1e-5)


def test_a_perm_that_is_not_a_permutation_is_a_clear_error():
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], name="bad", domain="glassrt", perm_a=[0, 0, 1])
    m = model([node], [tensor("a", [2, 3, 4]), tensor("b", [2, 4, 5])], [tensor("y", None)], opset=17,
              domains={"glassrt": 1})
    with pytest.raises(glassrt.GlassrtError, match=r"bad.*perm_a \[0, 0, 1\] is not a permutation"):
        _session(m, ["cpu"])


def test_a_small_bert_folds_every_head_transpose_and_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    m = bert(layers=2, hidden=64, heads=4, intermediate=128, vocab=100, max_positions=64)
    feeds = bert_feeds(2, 16, 100)
    s = _session(m)
    assert len(_folds(s)) == 2 * 2  # per layer: Q·Kᵀ (Q's and K's), P·V (V's and the merge)
    assert not [n for n in s.explain()["nodes"] if n["op"] == "Transpose"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, r in zip(s.run(None, feeds), want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")
def test_a_result_written_transposed_with_z_added_stays_off_onednn():
    """oneDNN 3.2's matmul ended the process adding Z to a result written through permuted
    strides: such a product runs on cpu, and says why."""
    a, b = RNG.standard_normal((2, 5, 3, 4)).astype(np.float32), RNG.standard_normal((2, 6, 3, 4)).astype(np.float32)
    z = RNG.standard_normal((2, 1, 1, 6)).astype(np.float32)
    node = helper.make_node("FusedMatMul", ["a", "b", "", "z"], ["y"], name="mm", domain="glassrt", alpha=0.5,
                            perm_a=[0, 2, 1, 3], perm_b=[0, 2, 3, 1], perm_y=[0, 2, 1, 3])
    m = model([node], [tensor("a", [2, 5, 3, 4]), tensor("b", [2, 6, 3, 4]), tensor("z", [2, 1, 1, 6])],
              [tensor("y", None)], opset=17, domains={"glassrt": 1})
    s = _session(m, ["onednn", "cpu"])
    row = s.explain()["nodes"][0]
    assert row["provider"] == "cpu" and "written transposed" in row["reason"]
    want = (0.5 * (a.transpose(0, 2, 1, 3) @ b.transpose(0, 2, 3, 1)) + z).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(s.run(None, {"a": a, "b": b, "z": z})[0], want, rtol=1e-5, atol=1e-6)


def test_a_transpose_after_a_product_that_adds_z_stays():
    """The scores (Q·Kᵀ + mask) transposed: the Transpose after stays (oneDNN cannot add Z to a
    result it writes transposed); the operands' Transposes still fold."""
    q, k = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32), RNG.standard_normal((2, 3, 7, 4)).astype(np.float32)
    mask = RNG.standard_normal((2, 1, 1, 7)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Add", ["s", "mask"], ["sm"], name="mask_add"),
             helper.make_node("Transpose", ["sm"], ["y"], name="after", perm=[0, 2, 1, 3])]
    m = model(nodes, [tensor("q", [2, 3, 5, 4]), tensor("k", [2, 3, 7, 4]), tensor("mask", [2, 1, 1, 7])],
              [tensor("y", None)], opset=17)
    s = _session(m, ["cpu"])
    assert _folds(s) == ["fold Transpose 'k_t' into FusedMatMul 'qk'"]
    want = (q @ k.transpose(0, 1, 3, 2) + mask).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(s.run(None, {"q": q, "k": k, "mask": mask})[0], want, rtol=1e-5, atol=1e-6)


def test_a_transpose_with_a_bad_perm_is_not_folded_and_is_reported_at_its_node():
    nodes = [helper.make_node("Transpose", ["a"], ["at"], name="bad_t", perm=[0, 2, 2]),
             helper.make_node("MatMul", ["at", "b"], ["y"], name="mm")]
    m = model(nodes, [tensor("a", [2, 4, 3]), tensor("b", [2, 4, 5])], [tensor("y", None)], opset=17)
    with pytest.raises(glassrt.GlassrtError, match="bad_t"):
        _session(m, ["cpu"])
