"""sess.gradients: vector-Jacobian products that match central finite differences."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.tools import light_models as lm
from glassrt.tools.gradcheck import gradcheck, model_to_float64
from tests.helpers import init, model, tensor

D = TensorProto.DOUBLE


def _mlp(rng):
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1),
             helper.make_node("Tanh", ["h1"], ["a1"]),
             helper.make_node("MatMul", ["a1", "w2"], ["h2"]),
             helper.make_node("Add", ["h2", "b2"], ["h3"]),
             helper.make_node("Sigmoid", ["h3"], ["a2"]),
             helper.make_node("Gemm", ["a2", "w3"], ["logits"], alpha=0.5),
             helper.make_node("LogSoftmax", ["logits"], ["y"], axis=1)]
    inits = [init("w1", rng.standard_normal((16, 8))), init("b1", rng.standard_normal(16)),
             init("w2", rng.standard_normal((16, 12)) / 4), init("b2", rng.standard_normal(12)),
             init("w3", rng.standard_normal((12, 5)))]
    return model(nodes, [tensor("x", [4, 8], D)], [tensor("y", [4, 5], D)], inits)


def _cnn(rng):
    nodes = [helper.make_node("Conv", ["x", "k1", "c1"], ["h1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h1"], ["a1"]),
             helper.make_node("MaxPool", ["a1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "k2"], ["h2"], strides=[2, 2], group=2),
             helper.make_node("BatchNormalization", ["h2", "s", "bb", "m", "v"], ["n2"]),
             helper.make_node("AveragePool", ["n2"], ["p2"], kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("Flatten", ["p2"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["y"])]
    inits = [init("k1", rng.standard_normal((4, 2, 3, 3)) / 3), init("c1", rng.standard_normal(4) / 10),
             init("k2", rng.standard_normal((6, 2, 3, 3)) / 3), init("s", rng.uniform(0.5, 1.5, 6)),
             init("bb", rng.standard_normal(6) / 10), init("m", rng.standard_normal(6) / 10),
             init("v", rng.uniform(0.5, 1.5, 6)), init("fc", rng.standard_normal((6 * 2 * 2, 3)) / 3)]
    return model(nodes, [tensor("x", [2, 2, 12, 12], D)], [tensor("y", [2, 3], D)], inits, opset=13)


@pytest.mark.parametrize("build, shape, wrt", [
    (_mlp, (4, 8), ["x", "w1", "b1", "w2", "w3"]),
    (_cnn, (2, 2, 12, 12), ["x", "k1", "c1", "k2", "s", "bb", "fc"]),
])
def test_small_models_match_finite_differences(build, shape, wrt):
    rng = np.random.default_rng(0)
    sess = glassrt.InferenceSession(build(rng), providers=["cpu"], fallback="error")
    x = rng.standard_normal(shape)
    ok, worst, msg = gradcheck(sess, {"x": x}, "y", wrt, max_elems=24)
    assert ok, msg


def test_squeezenet_input_gradient_matches_finite_differences():
    m = model_to_float64(lm.randomize_weights(onnx.load(lm.path("squeezenet")), seed=3))
    soft = [n for n in m.graph.node if n.op_type == "Softmax"][-1]
    m.graph.output.append(onnx.ValueInfoProto(name=soft.input[0]))  # the logits too
    sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
    x_name, shape = lm.input_shape(m)
    x = np.random.default_rng(1).random(shape)
    for out in (soft.input[0], sess.get_outputs()[0].name):
        ok, worst, msg = gradcheck(sess, {x_name: x}, out, [x_name], max_elems=12)
        assert ok, f"{out}: {msg}"


def test_grad_output_default_is_ones_and_shapes_match():
    rng = np.random.default_rng(0)
    sess = glassrt.InferenceSession(_mlp(rng))
    x = rng.standard_normal((4, 8))
    g_default = sess.gradients({"x": x}, "y", ["x"])[0]
    g_ones = sess.gradients({"x": x}, "y", ["x"], np.ones((4, 5)))[0]
    np.testing.assert_array_equal(g_default, g_ones)
    assert g_default.shape == x.shape


def test_gradient_through_an_op_without_backward_names_it():
    m = model([helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Det", ["e"], ["y"], name="det")],
              [tensor("x", [2, 2], D)], [tensor("y", [], D)])
    sess = glassrt.InferenceSession(m)
    with pytest.raises(glassrt.GlassrtError, match="Det node 'det'.*no backward"):
        sess.gradients({"x": np.eye(2)}, "y", ["x"])


def test_integer_paths_carry_no_gradient():
    # Through NonZero (integer indices) the gradient is zero, not an error.
    m = model([helper.make_node("Erf", ["x"], ["e"]), helper.make_node("NonZero", ["e"], ["nz"]),
               helper.make_node("Cast", ["nz"], ["c"], to=D), helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
              [tensor("x", [3], D)], [tensor("y", [], D)])
    g = glassrt.InferenceSession(m).gradients({"x": np.array([0.0, 1.0, 2.0])}, "y", ["x"])[0]
    np.testing.assert_array_equal(g, np.zeros(3))


def test_wrt_must_be_an_input_or_initializer():
    sess = glassrt.InferenceSession(_mlp(np.random.default_rng(0)))
    with pytest.raises(glassrt.GlassrtError, match="h1"):
        sess.gradients({"x": np.zeros((4, 8))}, "y", ["h1"])
