"""HardSwish written out, x·Clip(x + 3, 0, 6)/6 (passes/fuse_hardswish.py): one HardSwish (and
then part of the conv before it), equal to onnxruntime and to the unfused graph within
float32 rounding; left alone where the chain is not that function."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import glassrt

from .helpers import init, model, tensor

RNG = np.random.default_rng(9)
X = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32) * 4
W = (RNG.standard_normal((4, 4, 3, 3)) / 6).astype(np.float32)


def _chain(order="mul_then_div", three=3.0, high=6.0, leak=None, conv=True):
    src = "c" if conv else "x"
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1])] if conv else []
    nodes += [helper.make_node("Add", [src, "three"], ["a"], name="add"),
              helper.make_node("Clip", ["a", "zero", "six"], ["r"], name="clip")]
    if order == "mul_then_div":
        nodes += [helper.make_node("Mul", [src, "r"], ["m"], name="mul"),
                  helper.make_node("Div", ["m", "six_d"], ["y"], name="div")]
    elif order == "sixth_then_mul":
        nodes += [helper.make_node("Mul", ["r", "sixth"], ["m"], name="scale"),
                  helper.make_node("Mul", ["m", src], ["y"], name="mul")]
    outputs = [tensor("y", None)] + ([tensor(leak, None)] if leak else [])
    inits = [init("three", np.array(three, np.float32)), init("zero", np.array(0.0, np.float32)),
             init("six", np.array(high, np.float32)), init("six_d", np.array(6.0, np.float32)),
             init("sixth", np.array(1 / 6, np.float32))] + ([init("w", W)] if conv else [])
    return model(nodes, [tensor("x", list(X.shape))], outputs, inits)


def _ort(m):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})


@pytest.mark.parametrize("providers", [["onednn", "cpu"], ["cpu"]], ids=["onednn", "cpu"])
@pytest.mark.parametrize("order", ["mul_then_div", "sixth_then_mul"])
@pytest.mark.parametrize("conv", [True, False])
def test_written_out_hardswish_is_fused_and_agrees(providers, order, conv):
    m = _chain(order, conv=conv)
    sess = glassrt.InferenceSession(m, providers=providers)
    ops = [n.op_type for n in sess.placement.graph.nodes]
    assert ops == (["FusedConv"] if conv else ["HardSwish"]), ops
    if conv:
        assert sess.placement.graph.nodes[0].attrs["activation"] == "HardSwish"
    got = sess.run(None, {"x": X})[0]
    plain = glassrt.InferenceSession(m, providers=providers, sess_options=glassrt.SessionOptions(fusion=False))
    np.testing.assert_allclose(got, _ort(m)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, plain.run(None, {"x": X})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["add_two", "clip_to_five", "clipped_read_elsewhere"])
def test_it_does_not_fire_where_the_chain_is_another_function(case):
    m = {"add_two": lambda: _chain(three=2.0), "clip_to_five": lambda: _chain(high=5.0),
         "clipped_read_elsewhere": lambda: _chain(leak="r")}[case]()
    sess = glassrt.InferenceSession(m)
    ops = [n.op_type for n in sess.placement.graph.nodes]
    assert "HardSwish" not in ops and not any(n.attrs.get("activation") == "HardSwish"
                                              for n in sess.placement.graph.nodes), ops
    for g, w in zip(sess.run(None, {"x": X}), _ort(m)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
