"""Layer normalization written out (passes/fuse_layernorm.py): fused into one
LayerNormalization where it is the formula, equal to onnxruntime and to the unfused graph;
left alone where it is not."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import glassrt

from .helpers import init, model, tensor

RNG = np.random.default_rng(5)
X = RNG.standard_normal((2, 5, 16)).astype(np.float32) * 3 + 1
GAMMA = RNG.standard_normal(16).astype(np.float32)
BETA = RNG.standard_normal(16).astype(np.float32)


def _layernorm(square="pow", affine=True, axes=(-1,), eps=1e-5, opset=13, extra_reader=None):
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=list(axes)),
             helper.make_node("Sub", ["x", "m"], ["d"], name="sub"),
             (helper.make_node("Pow", ["d", "two"], ["p"], name="pow") if square == "pow"
              else helper.make_node("Mul", ["d", "d"], ["p"], name="sq")),
             helper.make_node("ReduceMean", ["p"], ["v"], name="var", axes=list(axes)),
             helper.make_node("Add", ["v", "eps"], ["ve"], name="addeps"),
             helper.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
             helper.make_node("Div", ["d", "s"], ["n"], name="div")]
    inits = [init("two", np.array(2.0, np.float32)), init("eps", np.array(eps, np.float32))]
    out = "n"
    if affine:
        nodes += [helper.make_node("Mul", ["n", "g"], ["gy"], name="scale"),
                  helper.make_node("Add", ["gy", "b"], ["y"], name="shift")]
        inits += [init("g", GAMMA), init("b", BETA)]
        out = "y"
    outputs = [tensor(out, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", [extra_reader], ["extra"], name="extra"))
        outputs.append(tensor("extra", None))
    return model(nodes, [tensor("x", list(X.shape))], outputs, inits, opset=opset)


def _ort(m):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})


@pytest.mark.parametrize("providers", [["onednn", "cpu"], ["cpu"]], ids=["onednn", "cpu"])
@pytest.mark.parametrize("square,affine,axes", [("pow", True, (-1,)), ("mul", True, (-1,)), ("pow", False, (-1,)),
                                                ("pow", True, (2,))])
def test_written_out_layernorm_is_fused_and_agrees(providers, square, affine, axes):
    m = _layernorm(square, affine, axes)
    sess = glassrt.InferenceSession(m, providers=providers)
    ops = [n.op_type for n in sess.placement.graph.nodes]
    assert ops == ["LayerNormalization"], ops
    got = sess.run(None, {"x": X})[0]
    plain = glassrt.InferenceSession(m, providers=providers, sess_options=glassrt.SessionOptions(fusion=False))
    np.testing.assert_allclose(got, _ort(m)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, plain.run(None, {"x": X})[0], rtol=1e-5, atol=1e-5)
    assert any("into LayerNormalization" in c for c in sess.pass_log)


@pytest.mark.parametrize("case", ["middle_axis", "two_axes", "mean_read_elsewhere", "centered_read_elsewhere"])
def test_it_does_not_fire_where_it_is_not_the_formula(case):
    m = {"middle_axis": lambda: _layernorm(axes=(1,)),
         "two_axes": lambda: _layernorm(axes=(1, 2)),
         "mean_read_elsewhere": lambda: _layernorm(extra_reader="m"),
         "centered_read_elsewhere": lambda: _layernorm(extra_reader="d")}[case]()
    sess = glassrt.InferenceSession(m)
    assert "LayerNormalization" not in [n.op_type for n in sess.placement.graph.nodes]
    for g, w in zip(sess.run(None, {"x": X}), _ort(m)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
