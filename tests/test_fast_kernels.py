"""The compiled (Numba) 2-D kernels for MaxPool, AveragePool and depthwise Conv / FusedConv,
against onnxruntime on random inputs, checking that those kernels are the ones selected."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt

ort = pytest.importorskip("onnxruntime")

ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16,
             np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
TOL = {np.float32: 1e-5, np.float64: 1e-5, np.float16: 1e-2, np.uint8: 0, np.int8: 0}


def _model(nodes, x_shape, dtype, outputs, inits=()):
    elem = ONNX_TYPE[dtype]
    outs = [helper.make_tensor_value_info(o, TensorProto.INT64 if o == "idx" else elem, None) for o in outputs]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, list(x_shape))], outs,
                          initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()


def _input(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _compare(model, x, kernel_suffix, dtype, ort_model=None, ort_x=None):
    """Run glassrt and onnxruntime; check the outputs agree and which kernel ran."""
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error",
                                    sess_options=glassrt.SessionOptions(intra_op_num_threads=2))
    got = sess.run(None, {"x": x})
    o = ort.InferenceSession(ort_model or model, providers=["CPUExecutionProvider"])
    want = o.run(None, {"x": x if ort_x is None else ort_x})
    kernels = [n["kernel"] for n in sess.explain()["nodes"]]
    assert any(k.endswith(kernel_suffix) for k in kernels), kernels
    tol = TOL[dtype]
    for g, w in zip(got, want):
        assert g.shape == w.shape
        if g.dtype == np.int64:
            np.testing.assert_array_equal(g, w)
        else:
            assert g.dtype == dtype
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)
    return kernels


def _all_padding_window(size, k, s, d, b, e, ceil):
    """Whether some output window along one axis has no input cell (onnxruntime then gives
    the lowest finite value for max, glassrt -inf; the spec leaves this open)."""
    eff = d * (k - 1) + 1
    span = size + b + e - eff
    n = (-(-span // s) if ceil else span // s) + 1
    if ceil and (n - 1) * s >= size + b:
        n -= 1
    return any(all(not 0 <= o * s - b + j * d < size for j in range(k)) for o in range(n))


GEOMETRIES = [  # (H, W), kernel, strides, pads, dilations, ceil_mode
    ((7, 9), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 0),
    ((7, 9), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    ((11, 11), (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    ((13, 10), (2, 3), (3, 3), (1, 0, 0, 2), (1, 1), 0),
    ((13, 10), (2, 3), (3, 2), (1, 0, 0, 2), (1, 1), 1),
    ((12, 12), (3, 3), (1, 2), (2, 2, 2, 2), (2, 2), 0),
    ((15, 14), (3, 2), (2, 3), (1, 1, 2, 1), (2, 1), 1),
    ((9, 9), (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 0),
    ((8, 8), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 0),
    ((1, 17), (1, 3), (1, 2), (0, 1, 0, 1), (1, 1), 1),
    ((6, 5), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 0),
]


def _attrs(k, s, p, d, ceil):
    return dict(kernel_shape=list(k), strides=list(s), pads=list(p), dilations=list(d), ceil_mode=ceil)


@pytest.mark.parametrize("geo", GEOMETRIES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_max_pool(geo, dtype):
    (h, w), k, s, p, d, ceil = geo
    if any(_all_padding_window(*a, ceil) for a in zip((h, w), k, s, d, p[:2], p[2:])):
        pytest.skip("a window made only of padding")
    x = _input((2, 3, h, w), dtype, 0)
    node = helper.make_node("MaxPool", ["x"], ["y"], **_attrs(k, s, p, d, ceil))
    _compare(_model([node], x.shape, dtype, ["y"]), x, "cpu.MaxPool.max_pool_2d_nb", dtype)


@pytest.mark.parametrize("geo", GEOMETRIES[:8], ids=str)
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(geo, storage_order):
    (h, w), k, s, p, d, ceil = geo
    if any(_all_padding_window(*a, ceil) for a in zip((h, w), k, s, d, p[:2], p[2:])):
        pytest.skip("a window made only of padding")
    x = _input((2, 3, h, w), np.float32, 1)
    x[0, 0, :2, :2] = 0.5  # ties: the first in row-major window order wins
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], storage_order=storage_order, **_attrs(k, s, p, d, ceil))
    _compare(_model([node], x.shape, np.float32, ["y", "idx"]), x, "cpu.MaxPool.max_pool_2d_nb", np.float32)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_auto_pad(op, auto_pad):
    x = _input((1, 4, 10, 11), np.float32, 2)
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 3], auto_pad=auto_pad)
    suffix = "max_pool_2d_nb" if op == "MaxPool" else "average_pool_2d_nb"
    _compare(_model([node], x.shape, np.float32, ["y"]), x, suffix, np.float32)


@pytest.mark.parametrize("geo", GEOMETRIES, ids=str)
@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_average_pool(geo, include_pad, dtype):
    (h, w), k, s, p, d, ceil = geo
    x = _input((2, 3, h, w), dtype, 3)
    attrs = dict(_attrs(k, s, p, d, ceil), count_include_pad=include_pad)
    model = _model([helper.make_node("AveragePool", ["x"], ["y"], **attrs)], x.shape, dtype, ["y"])
    ort_model = ort_x = None
    if dtype == np.float64:  # onnxruntime has no float64 AveragePool: it runs the same values in float32
        ort_x = x.astype(np.float32)
        ort_model = _model([helper.make_node("AveragePool", ["x"], ["y"], **attrs)], x.shape, np.float32, ["y"])
    _compare(model, x, "cpu.AveragePool.average_pool_2d_nb", dtype, ort_model, ort_x)


def _depthwise(x_shape, k, s, p, d, dtype, bias=True, act=None, seed=4):
    c = x_shape[1]
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((c, 1) + tuple(k)).astype(np.float32).astype(dtype)
    b = rng.standard_normal(c).astype(np.float32).astype(dtype)
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if bias else [])
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["t" if act else "y"], group=c,
                            kernel_shape=list(k), strides=list(s), pads=list(p), dilations=list(d))
    nodes = [conv]
    if act == "Clip":
        inits += [numpy_helper.from_array(np.array(v, dtype), n) for v, n in ((0.0, "lo"), (0.5, "hi"))]
        nodes.append(helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))
    elif act == "LeakyRelu":
        nodes.append(helper.make_node("LeakyRelu", ["t"], ["y"], alpha=0.2))
    elif act:
        nodes.append(helper.make_node(act, ["t"], ["y"]))
    return _model(nodes, x_shape, dtype, ["y"], inits)


@pytest.mark.parametrize("geo", [g for g in GEOMETRIES if g[5] == 0], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_conv(geo, bias):
    (h, w), k, s, p, d, _ = geo
    x = _input((2, 5, h, w), np.float32, 5)
    model = _depthwise(x.shape, k, s, p, d, np.float32, bias)
    _compare(model, x, "cpu.Conv.depthwise_2d_nb", np.float32)


@pytest.mark.parametrize("act", ["Relu", "Clip", "LeakyRelu", "Sigmoid"])
@pytest.mark.parametrize("s", [1, 2])
def test_depthwise_fused_activation(act, s):
    x = _input((1, 16, 14, 13), np.float32, 6)
    model = _depthwise(x.shape, (3, 3), (s, s), (1, 1, 1, 1), (1, 1), np.float32, True, act)
    kernels = _compare(model, x, "cpu.FusedConv.depthwise_2d_nb", np.float32)
    assert len(kernels) == 1  # the activation ran inside the fused conv


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_depthwise_other_dtypes(dtype):
    x = _input((1, 8, 11, 12), dtype, 7)
    model = _depthwise(x.shape, (3, 3), (2, 1), (1, 1, 1, 1), (1, 1), dtype, True, "Relu")
    ort_model = ort_x = None
    if dtype == np.float64:  # onnxruntime has no float64 Conv: compare with float32 on the same values
        ort_x = x.astype(np.float32)
        ort_model = _depthwise(x.shape, (3, 3), (2, 1), (1, 1, 1, 1), (1, 1), np.float32, True, "Relu")
    _compare(model, x, "depthwise_2d_nb", dtype, ort_model, ort_x)


@pytest.mark.parametrize("shape,k", [((1, 32, 56, 56), 3), ((1, 96, 7, 7), 3), ((2, 24, 28, 28), 5)])
def test_cnn_shapes(shape, k):
    """Sizes from real CNNs, where the vectorized loops are long."""
    x = _input(shape, np.float32, 8)
    for s in (1, 2):
        _compare(_depthwise(shape, (k, k), (s, s), (k // 2,) * 4, (1, 1), np.float32), x,
                 "cpu.Conv.depthwise_2d_nb", np.float32)
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    _compare(_model([pool], shape, np.float32, ["y"]), x, "max_pool_2d_nb", np.float32)
    avg = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    _compare(_model([avg], shape, np.float32, ["y"]), x, "average_pool_2d_nb", np.float32)


def test_int8_max_pool_stays_numpy():
    x = _input((1, 3, 9, 9), np.uint8, 12)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    assert _compare(_model([node], x.shape, np.uint8, ["y"]), x, "cpu.MaxPool", np.uint8) == ["cpu.MaxPool"]


def test_not_2d_falls_back():
    """1-D and 3-D pooling and depthwise convs keep the NumPy kernels, saying why."""
    for shape, k in (((1, 4, 9), [3]), ((1, 4, 5, 6, 7), [2, 2, 2])):
        x = _input(shape, np.float32, 9)
        for op, name in (("MaxPool", "cpu.MaxPool"), ("AveragePool", "cpu.AveragePool")):
            node = helper.make_node(op, ["x"], ["y"], kernel_shape=k)
            sess = glassrt.InferenceSession(_model([node], shape, np.float32, ["y"]), providers=["cpu"])
            sess.run(None, {"x": x})
            info = sess.explain()["nodes"][0]
            assert info["kernel"] == name and "not 2-D" in info["reason"], info
        model = _depthwise(shape, k, [1] * len(k), [0] * 2 * len(k), [1] * len(k), np.float32)
        _compare(model, x, "cpu.Conv.depthwise", np.float32)


def test_constant_input_is_folded():
    """Constant folding hands the kernels no output buffers."""
    x = _input((1, 3, 8, 8), np.float32, 10)
    w = _input((3, 1, 3, 3), np.float32, 13)
    nodes = [helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w"], ["d"], group=3, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["x", "d"], ["y"])]
    model = _model(nodes, (1, 3, 5, 5), np.float32, ["y"], [numpy_helper.from_array(x, "c"),
                                                              numpy_helper.from_array(w, "w")])
    sess = glassrt.InferenceSession(model, providers=["cpu"])
    z = np.zeros((1, 3, 5, 5), np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": z})[0]
    np.testing.assert_allclose(sess.run(None, {"x": z})[0], want, rtol=1e-6)


def test_batch_and_channels_map_to_planes():
    """Planes are N*C: channel c of every image uses filter c."""
    x = _input((3, 7, 9, 9), np.float32, 11)
    for i, j in itertools.product(range(3), range(7)):
        x[i, j] += 10 * j
    _compare(_depthwise(x.shape, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), np.float32), x,
             "cpu.Conv.depthwise_2d_nb", np.float32)
