"""The transformer fast paths: GELU written out in five nodes fused into one Gelu, the
float32 erf/GELU passes, and the compiled row loops for Softmax, LogSoftmax and
LayerNormalization, each against onnxruntime on the same inputs (and the unfused graph)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8).SerializeToString()


def _ort(model, feeds):
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _gelu_nodes(order, divisor="sqrt2"):
    """x·0.5·(1 + erf(x/√2)) in the node orders exporters write."""
    scale = [helper.make_node("Div", ["x", divisor], ["d"], name="div")] if divisor == "sqrt2" else \
        [helper.make_node("Mul", [divisor, "x"], ["d"], name="mul_inv")]
    common = scale + [helper.make_node("Erf", ["d"], ["e"], name="erf"),
                      helper.make_node("Add", ["one", "e"], ["a"], name="add")]
    if order == "torch":  # Mul(x, 1 + erf) then Mul 0.5
        return common + [helper.make_node("Mul", ["x", "a"], ["m"], name="m1"),
                         helper.make_node("Mul", ["m", "half"], ["y"], name="m2")]
    if order == "half_first":  # Mul(x, 0.5) then Mul by 1 + erf
        return [helper.make_node("Mul", ["x", "half"], ["h"], name="h")] + common + \
            [helper.make_node("Mul", ["a", "h"], ["y"], name="m1")]
    return common + [helper.make_node("Mul", ["a", "half"], ["m"], name="m1"),  # Mul(1 + erf, 0.5) then x
                     helper.make_node("Mul", ["m", "x"], ["y"], name="m2")]


CONSTS = {"sqrt2": math.sqrt(2), "inv_sqrt2": 1 / math.sqrt(2), "one": 1.0, "half": 0.5}


@pytest.mark.parametrize("order", ["torch", "half_first", "half_of_sum"])
@pytest.mark.parametrize("divisor", ["sqrt2", "inv_sqrt2"])
def test_gelu_written_out_becomes_one_node(order, divisor):
    model = _model(_gelu_nodes(order, divisor), [("x", [4, 96])], CONSTS)
    x = (np.random.default_rng(0).standard_normal((4, 96)) * 3).astype(np.float32)
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    ops = [n["op"] for n in sess.explain()["nodes"]]
    assert ops == ["Gelu"], ops
    assert any("into Gelu" in line for line in sess.pass_log)
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, _ort(model, {"x": x}), rtol=2e-6, atol=1e-6)


def test_gelu_lookalikes_are_left_alone():
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    wrong_constant = _model(_gelu_nodes("torch"), [("x", [3, 8])], {**CONSTS, "sqrt2": 1.5})
    nodes = _gelu_nodes("torch") + [helper.make_node("Add", ["e", "y"], ["y2"], name="reads_erf")]
    nodes[-2].output[0] = "y"
    shared = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in CONSTS.items()]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    for model in (wrong_constant, shared):  # not GELU; erf's output read elsewhere
        sess = glassrt.InferenceSession(model, providers=["cpu"])
        assert "Gelu" not in [n["op"] for n in sess.explain()["nodes"]]
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(model, {"x": x}), rtol=1e-6, atol=1e-6)


def _gelu_tanh_nodes(cube_first=True):
    """GPT-2's gelu_new: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as its export writes it."""
    return [helper.make_node("Mul", ["x", "half"], ["h"], name="half"),
            helper.make_node("Pow", ["x", "three"], ["p"], name="pow"),
            helper.make_node("Mul", ["p", "k"] if cube_first else ["k", "p"], ["pk"], name="mul_k"),
            helper.make_node("Add", ["x", "pk"] if cube_first else ["pk", "x"], ["inner"], name="inner"),
            helper.make_node("Mul", ["inner", "c"], ["sc"], name="scale"),
            helper.make_node("Tanh", ["sc"], ["t"], name="tanh"),
            helper.make_node("Add", ["t", "one"], ["a"], name="add"),
            helper.make_node("Mul", ["h", "a"], ["y"], name="m1")]


TANH_CONSTS = {"half": 0.5, "three": 3.0, "k": 0.044715, "c": math.sqrt(2 / math.pi), "one": 1.0}


@pytest.mark.parametrize("cube_first", [True, False])
def test_gelu_tanh_written_out_becomes_one_node(cube_first):
    model = _model(_gelu_tanh_nodes(cube_first), [("x", [4, 96])], TANH_CONSTS, opset=17)
    x = (np.random.default_rng(0).standard_normal((4, 96)) * 3).astype(np.float32)
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    assert [(n["op"]) for n in sess.explain()["nodes"]] == ["Gelu"]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(model, {"x": x}), rtol=2e-6, atol=2e-6)


def test_gelu_tanh_lookalikes_are_left_alone():
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    for consts in ({**TANH_CONSTS, "k": 0.05}, {**TANH_CONSTS, "three": 2.0}):
        model = _model(_gelu_tanh_nodes(), [("x", [3, 8])], consts, opset=17)
        sess = glassrt.InferenceSession(model, providers=["cpu"])
        assert "Gelu" not in [n["op"] for n in sess.explain()["nodes"]]
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(model, {"x": x}), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op,opset", [("Erf", 13), ("Gelu", 20)])
def test_float32_erf_and_gelu_match_onnxruntime(op, opset):
    """The three-pass float32 erf: faithfully rounded, like onnxruntime's; special values kept."""
    rng = np.random.default_rng(2)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.9277, -0.9278, 3.9, 4.0, 4.1, -30, 1e-38, 1e-45],
                       np.float32)
    x = np.concatenate([(rng.standard_normal(50_000) * 3).astype(np.float32), special])
    model = _model([helper.make_node(op, ["x"], ["y"])], [("x", None)], {}, opset)
    got = glassrt.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    want = _ort(model, {"x": x})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=5e-7)
    exact = np.array([math.erf(v) for v in x.astype(np.float64)]) if op == "Erf" else None
    if exact is not None:  # within 1.5 ulp of the exact value
        finite = np.isfinite(exact)
        ulp = np.spacing(np.abs(exact[finite]).astype(np.float32)).astype(np.float64)
        assert (np.abs(got[finite] - exact[finite]) / ulp).max() <= 1.5


def test_erf_in_place_and_strided():
    from glassrt.kernels.cpu.erf import erf

    x = np.random.default_rng(3).standard_normal((6, 10)).astype(np.float32)
    want = np.array([math.erf(v) for v in x.astype(np.float64).ravel()]).reshape(x.shape)
    y = x.copy()
    erf(y, out=y)  # the planner's in-place reuse
    np.testing.assert_allclose(y, want, rtol=2e-7, atol=1e-7)
    np.testing.assert_allclose(erf(x.T), want.T, rtol=2e-7, atol=1e-7)  # a transposed view


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis,opset", [(-1, 13), (1, 11), (0, 13)])
def test_softmax_rows(op, axis, opset):
    x = np.random.default_rng(4).standard_normal((6, 5, 33)).astype(np.float32) * 4
    x[0, 0, 3] = np.nan  # a NaN makes its own row NaN, no other
    x[1, 2, :] = -np.inf  # all -inf: NaN, as in onnxruntime
    x[2, 1, 5] = np.inf
    model = _model([helper.make_node(op, ["x"], ["y"], axis=axis)], [("x", [6, 5, 33])], {}, opset)
    got = glassrt.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    want = _ort(model, {"x": x})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # log(sum(exp)) near 1 loses float32 digits in any order of summation: absolute 1e-6
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 if op == "LogSoftmax" else 2e-7)


@pytest.mark.parametrize("x_shape,axis,scale_shape", [
    ((2, 7, 64), -1, (64,)),  # the transformer case: the compiled rows
    ((3, 4, 5), 1, (4, 5)),  # normalized over two dims
    ((3, 4, 5), -1, (1,)),  # a broadcast scale: the NumPy path
    ((2, 3, 8), 0, (3, 8)),
])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm(x_shape, axis, scale_shape, with_bias):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(x_shape) * 3 + 1).astype(np.float32)
    inits = {"s": rng.standard_normal(scale_shape)}
    inputs = ["x", "s"]
    if with_bias:
        inits["b"] = rng.standard_normal(scale_shape)
        inputs.append("b")
    nodes = [helper.make_node("LayerNormalization", inputs, ["y", "mean", "inv"], axis=axis, epsilon=1e-5)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "mean", "inv")],
                          initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    got = glassrt.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g_, w in zip(got, want):
        assert g_.shape == w.shape and g_.dtype == w.dtype
        np.testing.assert_allclose(g_, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("with_bias", [True, False])
def test_onednn_layer_norm_of_a_row_moves_to_the_row_loop_once_the_plan_keeps_running(with_bias):
    """A one-row LayerNormalization on the onednn provider: oneDNN's primitive first, the
    compiled row loop from AFTER_RUNS runs on (Numba loaded); every run against onnxruntime,
    with Scale (and B) graph inputs that change between runs, so the loop reads each run's."""
    pytest.importorskip("numba")
    from glassrt.kernels.onednn import capi
    from glassrt.kernels.onednn.row_panels import AFTER_RUNS

    if capi.UNAVAILABLE:
        pytest.skip(capi.UNAVAILABLE)
    inputs = [("x", [1, 1, 48]), ("s", [48])] + ([("b", [48])] if with_bias else [])
    model = _model([helper.make_node("LayerNormalization", [n for n, _ in inputs], ["y"], axis=-1, epsilon=1e-3)],
                   inputs, {})
    sess = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    assert sess.explain()["nodes"][0]["kernel"].startswith("onednn.")
    rng = np.random.default_rng(3)
    calls = []
    from glassrt.kernels.cpu import rows as cpu_rows
    from glassrt.kernels.cpu._jit import compiled

    loop = compiled(cpu_rows._layer_norm)
    cpu_rows._layer_norm = lambda *a: (calls.append(1), loop(*a))[1]  # the onednn kernel finds it here
    try:
        for _ in range(AFTER_RUNS + 4):
            feeds = {n: (rng.standard_normal(s) * 2 + 0.5).astype(np.float32) for n, s in inputs}
            np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(model, feeds), rtol=1e-5, atol=1e-5)
    finally:
        cpu_rows._layer_norm = loop
    assert len(calls) == 4
    assert sess.explain()["summary"]["row_norms"]["row_loop"] >= 1  # explain counts them (this process's)
