"""A pool whose window reaches past its padded input by less than a stride (a kernel larger
than the input: rapidocr's recognizer fed a short text line) gives one output there, as
onnx's shape inference and onnxruntime give it, its window pooled over what lies inside
(ops/meta/nn.py: conv_out_dim). A convolution like it, or a wider overrun, is still refused."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import glassrt

CASES = [((3, 1), [3, 2], [3, 2], [0, 0, 0, 0], 0), ((1, 5), [2, 2], [2, 2], [0, 0, 0, 0], 0),
         ((2, 3), [3, 3], [2, 2], [0, 1, 0, 0], 0)]


def _model(op, hw, kernel, strides, pads, ceil_mode, **extra):
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads, **extra)
    if op != "LpPool":
        attrs["ceil_mode"] = ceil_mode
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, *hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


@pytest.mark.parametrize("providers", [["onednn", "cpu"], ["cpu"]])
@pytest.mark.parametrize("op, extra", [("MaxPool", {}), ("AveragePool", {"count_include_pad": 0}),
                                       ("AveragePool", {"count_include_pad": 1}), ("LpPool", {"p": 2})])
@pytest.mark.parametrize("case", CASES)
def test_a_window_past_the_input_pools_what_lies_inside_as_onnxruntime(providers, op, extra, case):
    model = _model(op, *case, **extra)
    want_shape = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type.shape
    x = np.random.default_rng(0).standard_normal((1, 2, *case[0])).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = glassrt.InferenceSession(model.SerializeToString(), providers=providers).run(None, {"x": x})[0]
    assert got.shape == want.shape == tuple(d.dim_value for d in want_shape.dim)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_wider_overrun_and_a_convolution_are_still_refused():
    with pytest.raises(glassrt.GlassrtError, match="larger than the padded input"):
        glassrt.InferenceSession(_model("MaxPool", (1, 1), [3, 3], [1, 1], [0, 0, 0, 0], 0).SerializeToString())
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 2, 3, 2], np.ones(24, np.float32))
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], strides=[3, 2])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    with pytest.raises(glassrt.GlassrtError, match="larger than the padded input"):
        glassrt.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString())
