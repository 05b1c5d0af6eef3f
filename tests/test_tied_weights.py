"""A weight stored twice, once transposed (a tied embedding's copy), is kept once
(glassrt/passes/tied_weights.py), and one-row products read it by rows
(kernels/onednn/row_panels.py's dot-product loop)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.passes.tied_weights import tie_transposed_weights

from .helpers import init, model, tensor

VOCAB, HIDDEN = 2048, 128  # 1 MiB each: the pass's smallest


def _tied_lm(wte, head, listed_as_input=False):
    """Gather(wte, ids) -> Tanh -> MatMul(·, head): an embedding and a (vocab) projection."""
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["h"], name="embed"),
             helper.make_node("Tanh", ["h"], ["t"], name="act"),
             helper.make_node("MatMul", ["t", "head"], ["logits"], name="lm_head")]
    inputs = [tensor("ids", [1, "seq"], TensorProto.INT64)]
    if listed_as_input:
        inputs.append(tensor("head", list(head.shape)))
    return model(nodes, inputs, [tensor("logits", None)], [init("wte", wte), init("head", head)], opset=17)


def _weights(seed=0):
    return np.random.default_rng(seed).standard_normal((VOCAB, HIDDEN)).astype(np.float32)


def _reference(wte, head, ids):
    return np.tanh(wte[ids].astype(np.float64)) @ head


def test_a_transposed_copy_of_an_embedding_becomes_a_view_of_it():
    wte = _weights()
    sess = glassrt.InferenceSession(_tied_lm(wte, wte.T.copy()), providers=["cpu"])
    record = next(r for r in sess.passes if r.name == "tie_transposed_weights")
    assert record.changes and "'head' [128, 2048] is 'wte' transposed" in record.changes[0]
    head, emb = sess.graph.initializers["head"], sess.graph.initializers["wte"]
    assert np.shares_memory(head, emb) and head.ctypes.data == emb.ctypes.data and head.flags.f_contiguous
    ids = np.array([[3, 2047, 0]], np.int64)
    np.testing.assert_allclose(sess.run(None, {"ids": ids})[0], _reference(wte, wte.T, ids), rtol=1e-5, atol=1e-5)
    held = sess.explain()["summary"]["weights"]
    assert held["copied_bytes"] == wte.nbytes and held["transformed_bytes"] == 0  # the twin's bytes not again
    # the view first in the file: still the bytes as read, once
    m = _tied_lm(wte, wte.T.copy())
    m.graph.initializer.reverse()
    held = glassrt.InferenceSession(m, providers=["cpu"]).explain()["summary"]["weights"]
    assert held["copied_bytes"] == wte.nbytes and held["transformed_bytes"] == 0


@pytest.mark.parametrize("case", ["one element differs", "signed zero", "listed as an input", "too small"])
def test_only_an_exact_transposed_constant_is_tied(case):
    wte = _weights(1)
    head = wte.T.copy()
    if case == "one element differs":
        head[HIDDEN - 1, VOCAB - 1] = np.nextafter(head[HIDDEN - 1, VOCAB - 1], np.float32(np.inf))
    elif case == "signed zero":  # equal as numbers, not as stored: kept apart
        wte[5, 7] = 0.0
        head = wte.T.copy()
        head[7, 5] = -0.0
    elif case == "too small":
        wte, head = wte[:VOCAB // 4], head[:, :VOCAB // 4].copy()
    m = _tied_lm(wte, head, listed_as_input=case == "listed as an input")
    graph = glassrt.onnx_io.load(m)
    tied, changes = tie_transposed_weights(graph)
    assert changes == [] and tied is graph


def test_nan_payloads_and_a_symmetric_matrix():
    """Bitwise equal NaNs are the same stored value (tied); a symmetric matrix is not its
    own twin, but a second copy of it is."""
    wte = _weights(2)
    wte[10, 3] = np.nan
    graph = glassrt.onnx_io.load(_tied_lm(wte, wte.T.copy()))
    assert tie_transposed_weights(graph)[1]
    s = np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32)
    s = (s + s.T).astype(np.float32)
    alone = helper.make_node("MatMul", ["x", "s"], ["y"], name="p")
    graph = glassrt.onnx_io.load(model([alone], [tensor("x", [1, 512])], [tensor("y", None)], [init("s", s)], opset=17))
    assert tie_transposed_weights(graph)[1] == []
    two = [alone, helper.make_node("MatMul", ["y", "s2"], ["z"], name="q")]
    graph = glassrt.onnx_io.load(model(two, [tensor("x", [1, 512])], [tensor("z", None)],
                                       [init("s", s), init("s2", s.copy())], opset=17))
    tied, changes = tie_transposed_weights(graph)
    assert len(changes) == 1 and np.shares_memory(tied.initializers["s"], tied.initializers["s2"])


def test_one_row_products_read_tied_weights_by_rows(monkeypatch):
    """On onednn, a one-row product over weights too large to pack (the limit lowered here)
    reads them where they lie: oneDNN's sgemm first, the dot-product loop once the plan
    keeps running; a few rows run on the matmul primitive over the same storage."""
    from glassrt.kernels.onednn import capi

    if capi.UNAVAILABLE is not None:
        pytest.skip(str(capi.UNAVAILABLE))
    pytest.importorskip("numba")
    from glassrt.kernels.onednn import matmul, row_panels

    monkeypatch.setattr(matmul, "_PACK_LIMIT", 1 << 16)
    monkeypatch.setattr(row_panels, "AFTER_RUNS", 2)
    wte = _weights(4)
    sess = glassrt.InferenceSession(_tied_lm(wte, wte.T.copy()), providers=["onednn", "cpu"])
    before = row_panels.stats["streamed"]
    rng = np.random.default_rng(5)
    for _ in range(4):
        ids = rng.integers(0, VOCAB, (1, 1))
        np.testing.assert_allclose(sess.run(None, {"ids": ids})[0], _reference(wte, wte.T, ids), rtol=2e-5, atol=2e-5)
    assert row_panels.stats["streamed"] == before + 1
    ids = rng.integers(0, VOCAB, (1, 5))
    np.testing.assert_allclose(sess.run(None, {"ids": ids})[0], _reference(wte, wte.T, ids), rtol=2e-5, atol=2e-5)


def test_a_classifiers_transposed_gemm_weights_are_read_by_rows(monkeypatch):
    """Gemm(transB=1) over (N, K) weights (a classifier's last layer) takes the same loop,
    its alpha and bias applied."""
    from glassrt.kernels.onednn import capi

    if capi.UNAVAILABLE is not None:
        pytest.skip(str(capi.UNAVAILABLE))
    pytest.importorskip("numba")
    from glassrt.kernels.onednn import matmul, row_panels

    monkeypatch.setattr(matmul, "_PACK_LIMIT", 1 << 16)
    monkeypatch.setattr(row_panels, "AFTER_RUNS", 2)
    rng = np.random.default_rng(6)
    k, n = 300, 1001
    w, c = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc", transB=1, alpha=0.5, beta=2.0)
    sess = glassrt.InferenceSession(model([node], [tensor("x", [1, k])], [tensor("y", None)],
                                          [init("w", w), init("c", c)], opset=17), providers=["onednn", "cpu"])
    before = row_panels.stats["streamed"]
    for _ in range(4):
        x = rng.standard_normal((1, k)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], 0.5 * (x.astype(np.float64) @ w.T) + 2.0 * c,
                                   rtol=2e-5, atol=2e-5)
    assert row_panels.stats["streamed"] == before + 1


def test_a_file_glassrt_optimized_is_tied_again_when_loaded(tmp_path):
    """`glassrt optimize` writes both initializers (a file cannot say that one is a view of
    the other); its passes are skipped when the file is loaded, this one is not."""
    wte = _weights(7)
    src, out = tmp_path / "lm.onnx", tmp_path / "lm.opt.onnx"
    import onnx

    onnx.save(_tied_lm(wte, wte.T.copy()), src)
    options = glassrt.SessionOptions()
    options.optimized_model_filepath = str(out)
    glassrt.InferenceSession(str(src), options, providers=["cpu"])
    sess = glassrt.InferenceSession(str(out), providers=["cpu"])
    ran = {r.name: r for r in sess.passes}
    assert ran["remove_dead_code"].skipped and not ran["tie_transposed_weights"].skipped
    assert ran["tie_transposed_weights"].changes
    assert np.shares_memory(sess.graph.initializers["head"], sess.graph.initializers["wte"])
    ids = np.array([[1, 2]], np.int64)
    np.testing.assert_allclose(sess.run(None, {"ids": ids})[0], _reference(wte, wte.T, ids), rtol=1e-5, atol=1e-5)


def test_a_copy_read_by_other_ops_than_matmul_is_left_alone():
    """The view would reach kernels that may not expect one (a custom op's): only a weight
    read as nothing but MatMul's B becomes a view."""
    wte = _weights(8)
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["h"], name="embed"),
             helper.make_node("MatMul", ["h", "head"], ["logits"], name="lm_head"),
             helper.make_node("ReduceSum", ["head"], ["total"], name="other", keepdims=0)]
    m = model(nodes, [tensor("ids", [1, 2], TensorProto.INT64)], [tensor("logits", None), tensor("total", None)],
              [init("wte", wte), init("head", wte.T.copy())], opset=17)
    assert tie_transposed_weights(glassrt.onnx_io.load(m))[1] == []


def test_tied_weights_mapped_from_external_data(tmp_path, monkeypatch):
    """Weights in external data are views of the file's mapping; the copy's view is then a
    view of its twin's mapped bytes (the pages the comparison read are given back)."""
    import onnx

    from glassrt.passes import tied_weights
    from glassrt.weights import is_mapped

    released = []
    real = tied_weights.release_pages
    monkeypatch.setattr(tied_weights, "release_pages", lambda a: released.append(real(a)) or released[-1])
    wte = _weights(9)
    path = tmp_path / "lm.onnx"
    onnx.save(_tied_lm(wte, wte.T.copy()), path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="lm.bin", size_threshold=0)
    sess = glassrt.InferenceSession(str(path), providers=["cpu"])
    head, emb = sess.graph.initializers["head"], sess.graph.initializers["wte"]
    assert is_mapped(emb) and np.shares_memory(head, emb)
    assert released and released[0] >= wte.nbytes - 2 * 4096  # the copy's whole pages
    ids = np.array([[4, 40]], np.int64)
    np.testing.assert_allclose(sess.run(None, {"ids": ids})[0], _reference(wte, wte.T, ids), rtol=1e-5, atol=1e-5)
