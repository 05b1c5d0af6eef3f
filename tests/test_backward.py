"""Backward formulas (ops/backward/) against central finite differences.

Every case builds a one-node model with float64 inputs kept away from kinks and domain
edges, and checks sess.gradients with tools.gradcheck for a random grad_output. Tie rules
(where finite differences say nothing) are checked directly.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import glassrt
from glassrt.tools.gradcheck import gradcheck, single_node_model

OPSET = onnx.defs.onnx_opset_version()


def _rng(seed=0):
    return np.random.default_rng(seed)


def randn(*shape, seed=0):
    return _rng(seed).standard_normal(shape)


def away(*shape, points=(0.0,), gap=0.1, lo=-3.0, hi=3.0, seed=0):
    """Uniform values in [lo, hi] at least `gap` from every kink in `points`."""
    x = _rng(seed).uniform(lo, hi, shape)
    for p in points:
        close = np.abs(x - p) < gap
        x = np.where(close, p + np.where(x >= p, gap, -gap) * 1.5, x)
    return x


def pos(*shape, lo=0.5, hi=2.0, seed=0):
    return _rng(seed).uniform(lo, hi, shape)


def ints(v):
    return np.asarray(v, dtype=np.int64)


def check(op, inputs, attrs=None, wrt=(0,), opset=None, n_outputs=1, output=0, **tol):
    """Assert gradcheck passes for `output` w.r.t. the inputs at positions `wrt`."""
    sess = glassrt.InferenceSession(single_node_model(op, inputs, attrs, opset=opset, n_outputs=n_outputs),
                                    fallback="silent")
    feeds = {f"in{i}": x for i, x in enumerate(inputs) if x is not None}
    ok, worst, msg = gradcheck(sess, feeds, f"out{output}", [f"in{i}" for i in wrt], **tol)
    assert ok, f"{op} {attrs} opset={opset}: worst rel err {worst:.3g}: {msg}"


def gradients(op, inputs, attrs=None, wrt=(0,), grad_output=None, opset=None, n_outputs=1, output=0):
    sess = glassrt.InferenceSession(single_node_model(op, inputs, attrs, opset=opset, n_outputs=n_outputs),
                                    fallback="silent")
    feeds = {f"in{i}": x for i, x in enumerate(inputs) if x is not None}
    return sess.gradients(feeds, f"out{output}", [f"in{i}" for i in wrt], grad_output)


def has_op(op, opset=OPSET):
    try:
        onnx.defs.get_schema(op, opset)
        return True
    except onnx.defs.SchemaError:
        return False


# ---------------------------------------------------------------- elementwise arithmetic

BINARY = [
    ("Add", lambda: [randn(2, 3, 4), randn(3, 1, seed=1)]),
    ("Add", lambda: [randn(4), randn(3, 4, seed=1)]),
    ("Sub", lambda: [randn(3, 4), randn(4, seed=1)]),
    ("Sub", lambda: [randn(1, 4), randn(3, 1, seed=1)]),
    ("Mul", lambda: [randn(3, 1), randn(1, 4, seed=1)]),
    ("Mul", lambda: [randn(2, 3, 4), randn(seed=1)]),
    ("Div", lambda: [randn(3, 4), away(4, seed=1, gap=0.5)]),
    ("Div", lambda: [randn(2, 1, 4), away(3, 1, seed=1, gap=0.5)]),
    ("Pow", lambda: [pos(3, 4), _rng(1).uniform(-2, 2, (4,))]),
    ("Pow", lambda: [pos(2, 3, 4), np.array(1.7)]),
    ("Pow", lambda: [pos(3, 1), _rng(1).uniform(-2, 2, (1, 4))]),
]


@pytest.mark.parametrize("op,make", BINARY, ids=[f"{b[0]}-{i}" for i, b in enumerate(BINARY)])
def test_binary(op, make):
    check(op, make(), wrt=(0, 1))


def test_pow_negative_base_integer_exponent():
    # a^b for a < 0 is differentiable in a at an integer b.
    check("Pow", [away(3, 4, gap=0.3), np.array(3.0)], wrt=(0,))


def test_pow_opsets():
    check("Pow", [pos(3, 4), _rng(1).uniform(-2, 2, (3, 4))], wrt=(0, 1), opset=7)
    check("Pow", [pos(3, 4), _rng(1).uniform(-2, 2, (3, 4))], wrt=(0, 1), opset=13)


UNARY = [
    ("Neg", lambda: randn(3, 4)),
    ("Abs", lambda: away(3, 4)),
    ("Sqrt", lambda: pos(3, 4)),
    ("Exp", lambda: randn(3, 4)),
    ("Log", lambda: pos(3, 4)),
    ("Reciprocal", lambda: away(3, 4, gap=0.3)),
    ("Relu", lambda: away(3, 4)),
    ("Sigmoid", lambda: randn(3, 4) * 3),
    ("Tanh", lambda: randn(3, 4) * 2),
    ("Softplus", lambda: randn(3, 4) * 5),
    ("Softsign", lambda: away(3, 4)),
    ("Erf", lambda: randn(3, 4)),
    ("HardSwish", lambda: away(4, 5, points=(-3.0, 3.0), lo=-5, hi=5)),
    ("Mish", lambda: randn(3, 4) * 3),
    ("Sin", lambda: randn(3, 4) * 3),
    ("Cos", lambda: randn(3, 4) * 3),
    ("Tan", lambda: _rng(0).uniform(-1.2, 1.2, (3, 4))),
    ("Asin", lambda: _rng(0).uniform(-0.8, 0.8, (3, 4))),
    ("Acos", lambda: _rng(0).uniform(-0.8, 0.8, (3, 4))),
    ("Atan", lambda: randn(3, 4) * 2),
    ("Sinh", lambda: randn(3, 4)),
    ("Cosh", lambda: randn(3, 4)),
    ("Asinh", lambda: randn(3, 4) * 2),
    ("Acosh", lambda: pos(3, 4, lo=1.2, hi=4)),
    ("Atanh", lambda: _rng(0).uniform(-0.8, 0.8, (3, 4))),
]


@pytest.mark.parametrize("op,make", UNARY, ids=[u[0] for u in UNARY])
def test_unary(op, make):
    check(op, [make()])


ACTIVATIONS = [
    ("LeakyRelu", {}, lambda: away(3, 4)),
    ("LeakyRelu", {"alpha": 0.2}, lambda: away(3, 4)),
    ("LeakyRelu", {"alpha": 2.0}, lambda: away(3, 4)),
    ("Elu", {}, lambda: away(3, 4)),
    ("Elu", {"alpha": 0.5}, lambda: away(3, 4)),
    ("Selu", {}, lambda: away(3, 4)),
    ("Selu", {"alpha": 1.5, "gamma": 0.8}, lambda: away(3, 4)),
    ("Celu", {}, lambda: away(3, 4)),
    ("Celu", {"alpha": 2.0}, lambda: away(3, 4)),
    ("Gelu", {}, lambda: randn(3, 4) * 2),
    ("Gelu", {"approximate": "tanh"}, lambda: randn(3, 4) * 2),
    ("HardSigmoid", {}, lambda: away(4, 5, points=(-2.5, 2.5), lo=-4, hi=4)),
    ("HardSigmoid", {"alpha": 0.4, "beta": 0.3}, lambda: away(4, 5, points=(-0.75, 1.75), lo=-3, hi=3)),
    ("ThresholdedRelu", {}, lambda: away(3, 4, points=(1.0,))),
    ("ThresholdedRelu", {"alpha": 0.5}, lambda: away(3, 4, points=(0.5,))),
    ("Shrink", {"lambd": 0.7, "bias": 0.2}, lambda: away(3, 4, points=(-0.7, 0.7))),
]


@pytest.mark.parametrize("op,attrs,make", ACTIVATIONS, ids=[f"{a[0]}-{i}" for i, a in enumerate(ACTIVATIONS)])
def test_activation(op, attrs, make):
    check(op, [make()], attrs)


def test_activation_old_opsets():
    check("Gelu", [randn(3, 4)], {"approximate": "tanh"}, opset=20)
    check("Elu", [away(3, 4)], {"alpha": 0.7}, opset=6)
    check("Selu", [away(3, 4)], opset=6)
    check("HardSigmoid", [away(3, 4, points=(-2.5, 2.5))], opset=6)
    check("Softmax", [randn(2, 3)], opset=11)


@pytest.mark.skipif(not has_op("Swish"), reason="no Swish in this onnx")
def test_swish():
    check("Swish", [randn(3, 4) * 2], {"alpha": 1.5})


@pytest.mark.parametrize("slope_shape", [(4,), (3, 1), (1,), (3, 4)])
def test_prelu(slope_shape):
    check("PRelu", [away(2, 3, 4), randn(*slope_shape, seed=1)], wrt=(0, 1))


def test_prelu_opset9():
    check("PRelu", [away(2, 3, 4), randn(3, 1, seed=1)], wrt=(0, 1), opset=9)


# ---------------------------------------------------------------- variadic, Where, Cast, Clip


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic(op):
    check(op, [randn(2, 3, 4), randn(3, 1, seed=1), randn(4, seed=2)], wrt=(0, 1, 2))
    check(op, [randn(3, 4), randn(3, 4, seed=1)], wrt=(0, 1))
    check(op, [randn(3, 4)], wrt=(0,))


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic_old_opset(op):
    check(op, [randn(3, 4), randn(3, 4, seed=1)], wrt=(0, 1), opset=6)


def test_max_min_ties_split_evenly():
    a = randn(3, 4)
    g = randn(3, 4, seed=5)
    for op in ("Max", "Min"):
        ga, gb = gradients(op, [a, a.copy()], wrt=(0, 1), grad_output=g)
        np.testing.assert_allclose(ga, g / 2)
        np.testing.assert_allclose(gb, g / 2)
    # Three inputs tied at one element, broadcast input included.
    a = np.array([[1.0, 5.0], [0.0, 2.0]])
    b = np.array([1.0, 3.0])
    c = np.array([[1.0, 0.0], [1.0, 2.0]])
    ga, gb, gc = gradients("Max", [a, b, c], wrt=(0, 1, 2), grad_output=np.ones((2, 2)))
    np.testing.assert_allclose(ga, [[1 / 3, 1], [0, 0]])
    np.testing.assert_allclose(gb, [1 / 3 + 1 / 2, 1])
    np.testing.assert_allclose(gc, [[1 / 3, 0], [1 / 2, 0]])


def test_where():
    cond = _rng(3).random((3, 4)) > 0.5
    check("Where", [cond, randn(3, 4), randn(4, seed=1)], wrt=(1, 2))
    check("Where", [cond[:, :1].copy(), randn(1, 4), randn(3, 1, seed=1)], wrt=(1, 2))


def test_cast():
    check("Cast", [randn(3, 4)], {"to": onnx.TensorProto.DOUBLE}, wrt=(0,))
    x = randn(3, 4).astype(np.float32)
    (g,) = gradients("Cast", [x], {"to": onnx.TensorProto.DOUBLE}, grad_output=randn(3, 4, seed=1))
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, randn(3, 4, seed=1).astype(np.float32))
    (g,) = gradients("Cast", [x], {"to": onnx.TensorProto.INT64}, grad_output=np.ones((3, 4), np.int64))
    assert not g.any()  # no gradient through a cast to integers


def test_clip_v6_attributes():
    check("Clip", [away(3, 4, points=(-0.5, 0.6))], {"min": -0.5, "max": 0.6}, opset=6)
    check("Clip", [away(3, 4, points=(-0.5,))], {"min": -0.5}, opset=6)


@pytest.mark.parametrize("opset", [11, 12, 13, OPSET])
def test_clip_inputs(opset):
    x = away(4, 5, points=(-0.5, 0.6))
    check("Clip", [x, np.array(-0.5), np.array(0.6)], wrt=(0, 1, 2), opset=opset)
    check("Clip", [x, np.array(-0.5)], wrt=(0, 1), opset=opset)
    check("Clip", [x, None, np.array(0.6)], wrt=(0, 2), opset=opset)
    check("Clip", [x], wrt=(0,), opset=opset)


def test_clip_min_above_max():
    x = away(3, 4, points=(0.6, 0.2))
    check("Clip", [x, np.array(0.6), np.array(0.2)], wrt=(0, 1, 2))


# ---------------------------------------------------------------- MatMul, Gemm


MATMUL = [((3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
          ((2, 3, 4), (4,)), ((4,), (2, 4, 3))]


@pytest.mark.parametrize("sa,sb", MATMUL)
def test_matmul(sa, sb):
    check("MatMul", [randn(*sa), randn(*sb, seed=1)], wrt=(0, 1))


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [(5,), (3, 1), (3, 5), (), None])
def test_gemm(ta, tb, c_shape):
    a = randn(4, 3) if ta else randn(3, 4)
    b = randn(5, 4, seed=1) if tb else randn(4, 5, seed=1)
    c = None if c_shape is None else randn(*c_shape, seed=2)
    attrs = {"transA": ta, "transB": tb, "alpha": 0.7, "beta": 1.3}
    check("Gemm", [a, b, c], attrs, wrt=(0, 1) if c is None else (0, 1, 2))


def test_gemm_old_opsets():
    check("Gemm", [randn(3, 4), randn(4, 5, seed=1), randn(3, 5, seed=2)], {"alpha": 2.0}, wrt=(0, 1, 2), opset=9)
    check("Gemm", [randn(3, 4), randn(5, 4, seed=1), randn(5, seed=2)], {"transB": 1, "beta": 0.5},
          wrt=(0, 1, 2), opset=11)


# ---------------------------------------------------------------- Conv, ConvTranspose

CONV = [
    ((2, 3, 7), (4, 3, 3), {}),
    ((1, 2, 6), (3, 2, 2), {"strides": [2], "pads": [1, 2], "dilations": [2]}),
    ((2, 3, 6, 5), (4, 3, 3, 3), {}),
    ((2, 3, 6, 5), (4, 3, 3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1]}),
    ((1, 4, 7, 7), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1], "pads": [2, 1, 2, 1]}),
    ((2, 3, 6, 6), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),  # depthwise kernel
    ((2, 3, 6, 6), (6, 1, 3, 3), {"group": 3, "strides": [2, 2]}),
    ((2, 3, 5, 4), (4, 3, 1, 1), {}),  # 1x1 kernel
    ((1, 3, 7, 6), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 7, 6), (2, 3, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    ((1, 3, 7, 6), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 1]}),
    ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV, ids=[f"conv{i}" for i in range(len(CONV))])
def test_conv(xs, ws, attrs):
    x, w, b = randn(*xs), randn(*ws, seed=1), randn(ws[0], seed=2)
    check("Conv", [x, w, b], attrs, wrt=(0, 1, 2))


def test_conv_no_bias_and_opset():
    check("Conv", [randn(1, 2, 5, 5), randn(3, 2, 3, 3, seed=1)], {"pads": [1, 1, 1, 1]}, wrt=(0, 1))
    check("Conv", [randn(1, 2, 5, 5), randn(3, 2, 3, 3, seed=1), randn(3, seed=2)],
          {"kernel_shape": [3, 3], "strides": [2, 2]}, wrt=(0, 1, 2), opset=11)


CONV_T = [
    ((2, 3, 4), (3, 2, 3), {}),
    ((1, 2, 3, 4), (2, 3, 3, 3), {}),
    ((2, 3, 3, 4), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}),
    ((1, 4, 3, 3), (4, 2, 2, 3), {"group": 2, "strides": [2, 1], "dilations": [1, 2]}),
    ((1, 3, 3, 3), (3, 1, 3, 3), {"group": 3, "strides": [2, 2]}),
    ((1, 2, 3, 4), (2, 2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 3, 4), (2, 2, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [8, 7]}),
    ((1, 2, 2, 3, 2), (2, 2, 2, 2, 2), {"strides": [2, 1, 2]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_T, ids=[f"convT{i}" for i in range(len(CONV_T))])
def test_conv_transpose(xs, ws, attrs):
    x, w, b = randn(*xs), randn(*ws, seed=1), randn(ws[1] * attrs.get("group", 1), seed=2)
    check("ConvTranspose", [x, w, b], attrs, wrt=(0, 1, 2))


# ---------------------------------------------------------------- pooling

MAXPOOL = [
    ((2, 3, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 2, 5, 5), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # overlapping windows, padding
    ((1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 7, 7), {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [1, 2]}),
    ((1, 2, 7, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 7, 6), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((2, 2, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 0]}),
    ((1, 2, 4, 5, 4), {"kernel_shape": [2, 2, 2], "strides": [1, 2, 2]}),
]


@pytest.mark.parametrize("xs,attrs", MAXPOOL, ids=[f"maxpool{i}" for i in range(len(MAXPOOL))])
def test_max_pool(xs, attrs):
    check("MaxPool", [randn(*xs)], attrs)


def test_max_pool_with_indices_and_opsets():
    check("MaxPool", [randn(1, 2, 6, 6)], {"kernel_shape": [3, 3], "strides": [2, 2]}, n_outputs=2)
    check("MaxPool", [randn(1, 2, 6, 6)], {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=8)
    check("MaxPool", [randn(1, 2, 7, 6)], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, opset=10)


def test_max_pool_ties_route_to_first():
    x = np.zeros((1, 1, 2, 4))
    x[0, 0, 1, 1] = -1.0
    (g,) = gradients("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [2, 2]},
                     grad_output=np.array([[[[3.0, 5.0]]]]))
    expected = np.zeros((1, 1, 2, 4))
    expected[0, 0, 0, 0], expected[0, 0, 0, 2] = 3.0, 5.0
    np.testing.assert_array_equal(g, expected)
    (g,) = gradients("GlobalMaxPool", [x], grad_output=np.array([[[[2.0]]]]))
    expected = np.zeros((1, 1, 2, 4))
    expected[0, 0, 0, 0] = 2.0
    np.testing.assert_array_equal(g, expected)


AVGPOOL = [
    ((2, 3, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 2, 5, 5), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 2, 5, 5), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ((1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1,
                    "count_include_pad": 1}),
    ((1, 2, 7, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 7, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER", "count_include_pad": 1}),
    ((2, 2, 9), {"kernel_shape": [3], "strides": [2], "pads": [2, 1]}),
    ((1, 2, 4, 5, 4), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2]}),
    ((1, 2, 7, 7), {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 0, 0]}),
]


@pytest.mark.parametrize("xs,attrs", AVGPOOL, ids=[f"avgpool{i}" for i in range(len(AVGPOOL))])
def test_average_pool(xs, attrs):
    check("AveragePool", [randn(*xs)], attrs)


def test_average_pool_old_opsets():
    check("AveragePool", [randn(1, 2, 5, 5)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=7)
    check("AveragePool", [randn(1, 2, 7, 6)], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
          opset=11)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("xs", [(2, 3, 4, 5), (2, 3, 6), (1, 2, 3, 2, 3)])
def test_global_pool(op, xs):
    check(op, [randn(*xs)])


# ---------------------------------------------------------------- softmax


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis", [(11, None), (11, 0), (11, 2), (11, -1), (13, None), (13, 1), (13, 0),
                                        (OPSET, -2)])
def test_softmax(op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    check(op, [randn(2, 3, 4) * 2], attrs, opset=opset)


def test_softmax_old_flattens():
    # Opset < 13 flattens at axis: the gradient couples the whole trailing block.
    x = randn(2, 3, 4)
    g = randn(2, 3, 4, seed=1)
    (old,) = gradients("Softmax", [x], {"axis": 1}, grad_output=g, opset=11)
    (new,) = gradients("Softmax", [x], {"axis": 1}, grad_output=g, opset=13)
    assert not np.allclose(old, new)


# ---------------------------------------------------------------- normalizations


@pytest.mark.parametrize("xs,axis,with_bias", [((2, 3, 4), -1, True), ((2, 3, 4), 1, True), ((2, 3, 4), 1, False),
                                               ((3, 5), 0, True), ((2, 3, 2, 2), -2, True)])
def test_layer_normalization(xs, axis, with_bias):
    x = randn(*xs)
    a = axis % len(xs)
    scale, bias = randn(*xs[a:], seed=1), randn(*xs[a:], seed=2)
    ins = [x, scale, bias] if with_bias else [x, scale]
    check("LayerNormalization", ins, {"axis": axis, "epsilon": 1e-3}, wrt=tuple(range(len(ins))))


def test_layer_normalization_broadcast_scale_and_stats_outputs():
    x = randn(2, 3, 4)
    check("LayerNormalization", [x, randn(1, 4, seed=1), randn(4, seed=2)], {"axis": 1}, wrt=(0, 1, 2))
    # Mean and InvStdDev are float32 (stash_type): a coarser step and tolerance.
    for k in (1, 2):
        check("LayerNormalization", [x, randn(3, 4, seed=1), randn(3, 4, seed=2)], {"axis": 1}, n_outputs=3,
              output=k, eps=1e-3, rtol=1e-2, atol=1e-4)


@pytest.mark.parametrize("opset", [9, 14, 15])
@pytest.mark.parametrize("xs", [(4, 3), (2, 3, 4), (2, 3, 3, 2)])
def test_batch_normalization_inference(opset, xs):
    c = xs[1]
    ins = [randn(*xs), randn(c, seed=1), randn(c, seed=2), randn(c, seed=3), pos(c, seed=4)]
    check("BatchNormalization", ins, {"epsilon": 1e-3}, wrt=(0, 1, 2, 3, 4), opset=opset)


def test_batch_normalization_inference_old_opset():
    ins = [randn(2, 3, 4), randn(3, seed=1), randn(3, seed=2), randn(3, seed=3), pos(3, seed=4)]
    check("BatchNormalization", ins, {}, wrt=(0, 1, 2, 3, 4), opset=7)


def test_batch_normalization_training():
    ins = [randn(4, 3, 2), randn(3, seed=1), randn(3, seed=2), randn(3, seed=3), pos(3, seed=4)]
    attrs = {"training_mode": 1, "momentum": 0.8, "epsilon": 1e-3}
    for k in (0, 1, 2):
        check("BatchNormalization", ins, attrs, wrt=(0, 1, 2, 3, 4), n_outputs=3, output=k)


def test_instance_normalization():
    check("InstanceNormalization", [randn(2, 3, 4, 2), randn(3, seed=1), randn(3, seed=2)], {"epsilon": 1e-3},
          wrt=(0, 1, 2))
    check("InstanceNormalization", [randn(2, 3, 5), randn(3, seed=1), randn(3, seed=2)], wrt=(0, 1, 2), opset=6)


def test_group_normalization():
    x = randn(2, 4, 3, 2)
    check("GroupNormalization", [x, randn(4, seed=1), randn(4, seed=2)], {"num_groups": 2}, wrt=(0, 1, 2))
    check("GroupNormalization", [x, randn(2, seed=1), randn(2, seed=2)], {"num_groups": 2}, wrt=(0, 1, 2),
          opset=18)


@pytest.mark.skipif(not has_op("RMSNormalization"), reason="no RMSNormalization in this onnx")
def test_rms_normalization():
    check("RMSNormalization", [randn(2, 3, 4), randn(4, seed=1)], wrt=(0, 1))
    check("RMSNormalization", [randn(2, 3, 4), randn(3, 4, seed=1)], {"axis": 1, "epsilon": 1e-3}, wrt=(0, 1))


# ---------------------------------------------------------------- dropout


def test_dropout_inference():
    x = randn(3, 4)
    check("Dropout", [x], opset=OPSET)
    check("Dropout", [x, np.array(0.3), np.array(False)], wrt=(0,), n_outputs=2)
    check("Dropout", [x], {"ratio": 0.3}, opset=7, n_outputs=2)
    check("Dropout", [x], {"ratio": 0.3}, opset=10)


def test_dropout_training_seeded():
    x = randn(4, 5)
    check("Dropout", [x, np.array(0.3), np.array(True)], {"seed": 7}, wrt=(0,), n_outputs=2)
    check("Dropout", [x, np.array(0.3), np.array(True)], {"seed": 7}, wrt=(0,))


# ---------------------------------------------------------------- data movement


def test_reshape_likes():
    x = randn(2, 3, 4)
    check("Reshape", [x, ints([4, -1])])
    check("Flatten", [x], {"axis": 2})
    check("Squeeze", [randn(2, 1, 3), ints([1])])
    check("Squeeze", [randn(2, 1, 3)], {"axes": [1]}, opset=11)
    check("Unsqueeze", [x, ints([0, -1])])
    check("Unsqueeze", [x], {"axes": [1]}, opset=11)
    check("Identity", [x])


@pytest.mark.parametrize("perm", [None, [1, 0, 2], [2, 0, 1]])
def test_transpose(perm):
    check("Transpose", [randn(2, 3, 4)], None if perm is None else {"perm": perm})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[axis] = i + 1
    check("Concat", [randn(*s, seed=i) for i, s in enumerate(shapes)], {"axis": axis}, wrt=(0, 1, 2))


def test_split():
    x = randn(2, 7, 3)
    check("Split", [x], {"axis": 1, "split": [2, 5]}, n_outputs=2, output=1, opset=11)
    check("Split", [x[:, :6].copy()], {"axis": 1}, n_outputs=3, output=2, opset=11)
    check("Split", [x, ints([3, 1, 3])], {"axis": 1}, n_outputs=3, output=0, opset=13)
    check("Split", [x, ints([3, 4])], {"axis": -2}, n_outputs=2, output=1)
    check("Split", [x], {"axis": 1, "num_outputs": 3}, n_outputs=3, output=2, opset=18)
    check("Split", [x], {"axis": 2}, n_outputs=3, output=1)


SLICE = [
    ([1, 0], [3, 3], [1, 2], None),
    ([0], [-1], [0], None),
    ([-3, 1], [100, -1], None, None),
    ([4, 0], [0, 4], [1, 2], [-1, 2]),
    ([-1], [1], [2], [-2]),
    ([3, 2, 1], [0, 0, 0], [0, 1, 2], [-1, -1, -1]),
    ([0, 0], [1, 5], [0, 2], [1, 3]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICE, ids=[f"slice{i}" for i in range(len(SLICE))])
def test_slice_inputs(starts, ends, axes, steps):
    x = randn(4, 3, 5)
    ins = [x, ints(starts), ints(ends), None if axes is None else ints(axes), None if steps is None else ints(steps)]
    check("Slice", ins, opset=13)
    if steps is None:
        check("Slice", ins, opset=10)


def test_slice_v1_attributes():
    x = randn(4, 3, 5)
    check("Slice", [x], {"starts": [1, 0], "ends": [3, 100], "axes": [0, 2]}, opset=1)
    check("Slice", [x], {"starts": [0, -2, 1], "ends": [-1, 3, 4]}, opset=1)


def test_slice_index_negative_step_through_zero():
    from glassrt.ops.backward.shape import _slice_index

    x = np.arange(6)
    for s, e, st in [(5, -100, -1), (4, -7, -2), (-1, -2**63, -3)]:
        idx = _slice_index(x.shape, [s], [e], [0], [st])
        expected = x[s:(None if e < -6 else e):st]
        np.testing.assert_array_equal(x[idx], expected)


def test_slice_negative_step_to_start_end_to_end():
    check("Slice", [randn(6, 2), ints([-1]), ints([-100]), ints([0]), ints([-1])])


def test_gather():
    x = randn(4, 3, 5)
    check("Gather", [x, ints([0, 2, 0, -1])], {"axis": 0})  # repeated and negative indices
    check("Gather", [x, ints([[0, 1], [-1, 0]])], {"axis": 1})
    check("Gather", [x, ints(3)], {"axis": 2})  # scalar index
    check("Gather", [x, ints([[4, 4, 4]])], {"axis": -1}, opset=11)


def test_gather_elements():
    x = randn(3, 4)
    check("GatherElements", [x, ints([[0, 2, 2, 1], [1, 1, -1, 0]])], {"axis": 0})
    check("GatherElements", [x, ints([[0, 0], [3, 1], [2, 2]])], {"axis": 1})
    check("GatherElements", [x, ints([[0, 0, 1], [3, -1, 1]])], {"axis": -1}, opset=11)


def test_expand():
    check("Expand", [randn(3, 1), ints([2, 3, 4])])
    check("Expand", [randn(1, 4), ints([3, 1])])
    check("Expand", [randn(2, 3), ints([2, 3])], opset=8)


def test_tile():
    check("Tile", [randn(2, 3), ints([2, 3])])
    check("Tile", [randn(2, 1, 3), ints([1, 4, 2])])


PADS = [
    ("constant", [1, 0, 2, 0, 3, 1]),
    ("constant", [0, -1, 1, 2, 1, -2]),
    ("reflect", [1, 2, 0, 2, 1, 2]),
    ("edge", [2, 0, 1, 0, 3, 2]),
    ("wrap", [1, 2, 3, 1, 0, 4]),
]


@pytest.mark.parametrize("mode,pads", PADS, ids=[f"pad-{p[0]}-{i}" for i, p in enumerate(PADS)])
def test_pad(mode, pads):
    x = randn(3, 4, 5)
    if mode != "wrap":
        check("Pad", [x], {"mode": mode, "pads": pads, "value": 0.3} if mode == "constant" else
              {"mode": mode, "pads": pads}, opset=2)
        check("Pad", [x, ints(pads)], {"mode": mode}, opset=11)
    check("Pad", [x, ints(pads), np.array(0.25) if mode == "constant" else None], {"mode": mode},
          wrt=(0, 2) if mode == "constant" else (0,))


def test_pad_axes():
    x = randn(3, 4, 5)
    check("Pad", [x, ints([1, -1, 2, 3]), np.array(-0.5), ints([0, -1])], {"mode": "constant"}, wrt=(0, 2))
    check("Pad", [x, ints([1, 2]), None, ints([1])], {"mode": "reflect"})


# ---------------------------------------------------------------- reductions

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum"]
AXES_INPUT_FROM = {op: 18 for op in REDUCE_OPS} | {"ReduceSum": 13}


def _reduce_input(op):
    if op in ("ReduceL1",):
        return away(2, 3, 4, gap=0.2)
    if op == "ReduceLogSum":
        return pos(2, 3, 4)
    if op == "ReduceProd":
        x = _rng(0).uniform(0.5, 1.5, (2, 3, 4)) * np.where(_rng(1).random((2, 3, 4)) < 0.5, -1, 1)
        x[0, 1, 2] = 0.0  # a zero: the product of the others must not divide by x
        return x
    return randn(2, 3, 4)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), ([-1], 0), (None, 1), (None, 0), ([0, 1, 2], 0)])
def test_reduce_axes_input(op, axes, keepdims):
    x = _reduce_input(op)
    ins = [x] if axes is None else [x, ints(axes)]
    check(op, ins, {"keepdims": keepdims}, opset=max(AXES_INPUT_FROM[op], 18))


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, -1], 0), (None, 0)])
def test_reduce_axes_attribute(op, axes, keepdims):
    x = _reduce_input(op)
    attrs = {"keepdims": keepdims} if axes is None else {"axes": axes, "keepdims": keepdims}
    check(op, [x], attrs, opset=11 if op == "ReduceSum" else 13)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(op):
    x = _reduce_input(op)
    opset = max(AXES_INPUT_FROM[op], 18)
    check(op, [x], {"noop_with_empty_axes": 1}, opset=opset)
    check(op, [x, ints([])], {"noop_with_empty_axes": 0, "keepdims": 0}, opset=opset)


def test_reduce_max_min_ties_split_evenly():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    (g,) = gradients("ReduceMax", [x, ints([1])], {"keepdims": 0}, grad_output=np.array([6.0, 3.0]))
    np.testing.assert_allclose(g, [[0, 3, 3], [1, 1, 1]])
    (g,) = gradients("ReduceMin", [x, ints([1])], {"keepdims": 1}, grad_output=np.array([[6.0], [3.0]]))
    np.testing.assert_allclose(g, [[6, 0, 0], [1, 1, 1]])


def test_reduce_prod_with_zeros():
    x = np.array([[0.0, 2.0, 3.0], [0.0, 0.0, 5.0]])
    (g,) = gradients("ReduceProd", [x, ints([1])], {"keepdims": 0}, grad_output=np.ones(2))
    np.testing.assert_allclose(g, [[6, 0, 0], [0, 0, 0]])


# ---------------------------------------------------------------- a small chain


def test_chain_through_several_ops():
    from onnx import helper

    x, w = randn(2, 3, 6, 6), randn(4, 3, 3, 3, seed=1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Softmax", ["f"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, list(x.shape)),
                               helper.make_tensor_value_info("w", onnx.TensorProto.DOUBLE, list(w.shape))],
                              [onnx.ValueInfoProto(name="y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    sess = glassrt.InferenceSession(model)
    ok, worst, msg = gradcheck(sess, {"x": x, "w": w}, "y", ["x", "w"])
    assert ok, msg


# ---------------------------------------------------------------- extras: selection, scatter, einsum...


def test_top_k():
    x = randn(3, 6)
    check("TopK", [x, ints([3])], n_outputs=2)
    check("TopK", [x, ints([2])], {"axis": 0, "largest": 0}, n_outputs=2)
    check("TopK", [x], {"k": 2}, n_outputs=2, opset=1)
    check("TopK", [x, ints([2])], n_outputs=2, opset=10)


def test_cum_sum():
    x = randn(3, 5)
    for exclusive in (0, 1):
        for reverse in (0, 1):
            check("CumSum", [x, ints(1)], {"exclusive": exclusive, "reverse": reverse})
    check("CumSum", [x, ints([-2])], {"exclusive": 1})


def test_gather_nd():
    x = randn(3, 4, 2)
    check("GatherND", [x, ints([[0, 1], [2, 3], [0, 1]])])  # a repeated tuple
    check("GatherND", [x, ints([[[1], [0]], [[2], [-1]]])])
    check("GatherND", [x, ints([[1], [0], [2]])], {"batch_dims": 1})


def test_scatter():
    data = randn(3, 4)
    upd = randn(2, 4, seed=1)
    idx = ints([[1, 0, 2, 2], [0, 2, 1, 1]])
    check("ScatterElements", [data, idx, upd], {"axis": 0}, wrt=(0, 2))
    check("ScatterElements", [data, idx, upd], {"axis": 0, "reduction": "add"}, wrt=(0, 2))
    check("ScatterElements", [data, ints([[0, 3], [1, 1]]), randn(2, 2, seed=2)], {"axis": 1}, wrt=(0, 2))
    # Duplicate targets (reduction none): only the last write reaches the output.
    check("ScatterElements", [data, ints([[1, 1], [2, 2]]), randn(2, 2, seed=2)], {"axis": 1}, wrt=(0, 2))
    check("Scatter", [data, idx, upd], {"axis": 0}, wrt=(0, 2), opset=9)
    check("ScatterND", [randn(4, 3), ints([[1], [3]]), randn(2, 3, seed=1)], wrt=(0, 2))
    check("ScatterND", [randn(4, 3), ints([[1, 2], [3, 0], [1, 2]]), randn(3, seed=1)], wrt=(0, 2))
    check("ScatterND", [randn(4, 3), ints([[1, 2], [3, 0], [1, 2]]), randn(3, seed=1)], {"reduction": "add"},
          wrt=(0, 2))


def test_trilu():
    x = randn(2, 4, 5)
    check("Trilu", [x])
    check("Trilu", [x, ints(1)], {"upper": 0})
    check("Trilu", [x, ints(-1)])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(mode):
    check("DepthToSpace", [randn(2, 8, 2, 3)], {"blocksize": 2, "mode": mode})
    check("SpaceToDepth", [randn(2, 2, 4, 6)], {"blocksize": 2})


EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 2)]),
    ("...ij->...j", [(2, 3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("ij,k->ijk", [(2, 3), (4,)]),
    ("ijk->i", [(2, 3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("iij,j->i", [(3, 3, 4), (4,)]),
]


@pytest.mark.parametrize("eq,shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum(eq, shapes):
    check("Einsum", [randn(*s, seed=i) for i, s in enumerate(shapes)], {"equation": eq},
          wrt=tuple(range(len(shapes))))
