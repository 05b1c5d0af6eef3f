"""Swish (SiLU), HardSwish and HardSigmoid after a Conv or an inference BatchNormalization:
fused into glassrt::FusedConv / FusedBatchNormalization (passes/fuse_conv.py), equal to the
unfused graph and to onnxruntime on every provider, and left alone where they must be."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import glassrt
from glassrt.errors import ShapeInferenceError

from .helpers import init, model, tensor

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32) * 3  # wide enough to reach every branch
W = (RNG.standard_normal((5, 3, 3, 3)) / 4).astype(np.float32)
B = RNG.standard_normal(5).astype(np.float32)
STATS = [RNG.uniform(0.5, 1.5, 3), RNG.standard_normal(3), RNG.standard_normal(3), RNG.uniform(0.5, 1.5, 3)]


def _producer(kind):
    """The node whose output "c" the activation reads, its initializers."""
    if kind == "conv":
        return (helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                [init("w", W), init("b", B)])
    # on the graph input: nothing to fold it into, so it stays a BatchNormalization
    return (helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["c"], name="bn"),
            [init(n, a.astype(np.float32)) for n, a in zip(("s", "bb", "m", "v"), STATS)])


def _activation(pattern):
    """Nodes reading "c" and writing "y", and the (activation, params) they fuse into."""
    if pattern == "silu":
        return [helper.make_node("Sigmoid", ["c"], ["g"], name="gate"),
                helper.make_node("Mul", ["c", "g"], ["y"], name="mul")], ("Swish", [])
    if pattern == "silu_gate_first":
        return [helper.make_node("Sigmoid", ["c"], ["g"], name="gate"),
                helper.make_node("Mul", ["g", "c"], ["y"], name="mul")], ("Swish", [])
    if pattern == "hardsigmoid_mul":
        return [helper.make_node("HardSigmoid", ["c"], ["g"], name="gate", alpha=0.3, beta=0.4),
                helper.make_node("Mul", ["c", "g"], ["y"], name="mul")], ("HardSwish", [0.3, 0.4])
    if pattern == "hardswish":
        return [helper.make_node("HardSwish", ["c"], ["y"], name="act")], ("HardSwish", [1 / 6, 0.5])
    assert pattern == "hardsigmoid"
    return [helper.make_node("HardSigmoid", ["c"], ["y"], name="act", alpha=0.25, beta=0.6)], \
        ("HardSigmoid", [0.25, 0.6])


PATTERNS = ["silu", "silu_gate_first", "hardsigmoid_mul", "hardswish", "hardsigmoid"]


def _model(kind, pattern):
    prod, inits = _producer(kind)
    acts, fused = _activation(pattern)
    return model([prod, *acts], [tensor("x", list(X.shape))], [tensor("y", None)], inits), fused


@pytest.mark.parametrize("providers", [["onednn", "cpu"], ["cpu"]], ids=["onednn", "cpu"])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("kind", ["conv", "bn"])
def test_the_activation_is_fused_and_exact(kind, pattern, providers):
    m, (act, params) = _model(kind, pattern)
    sess = glassrt.InferenceSession(m, providers=providers)
    nodes = sess.placement.graph.nodes
    assert [n.op_type for n in nodes] == ["FusedConv" if kind == "conv" else "FusedBatchNormalization"]
    assert nodes[0].attrs["activation"] == act
    np.testing.assert_allclose(nodes[0].attrs["activation_params"], params, rtol=1e-6)
    got = sess.run(None, {"x": X})[0]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    plain = glassrt.InferenceSession(m, providers=providers, sess_options=glassrt.SessionOptions(fusion=False))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, plain.run(None, {"x": X})[0], rtol=1e-5, atol=1e-5)
    row = sess.explain()["nodes"][0]
    # oneDNN's batch normalization takes no other post-op than a Relu: such a node runs on cpu, saying why
    where = "cpu" if kind == "bn" else providers[0]
    assert row["kernel"].startswith(where + "."), row
    if where != providers[0]:
        assert "takes a Relu or LeakyRelu post-op only" in str(row)
    assert "fused in" in row["origin"]


def test_fused_activations_run_on_onednn_with_the_layout_unbroken():
    """A stack of convs with SiLU between them: every node a oneDNN FusedConv (the
    unfused Sigmoid and Mul would run on cpu, in NCHW, between NHWC convs)."""
    w2 = (RNG.standard_normal((4, 5, 3, 3)) / 6).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["g"], name="gate"),
             helper.make_node("Mul", ["c", "g"], ["h"], name="mul"),
             helper.make_node("Conv", ["h", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c2"], ["y"], name="hswish")]
    m = model(nodes, [tensor("x", list(X.shape))], [tensor("y", None)], [init("w", W), init("b", B), init("w2", w2)])
    sess = glassrt.InferenceSession(m)
    kernels = [r["kernel"] for r in sess.explain()["nodes"]]
    assert kernels == ["onednn.FusedConv.conv", "onednn.FusedConv.conv"], kernels
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], want, rtol=1e-5, atol=1e-5)


def _not_fused(nodes, outputs=("y",), inputs=(("x", list(X.shape)),)):
    prod, inits = _producer("conv")
    m = model([prod, *nodes], [tensor(n, s) for n, s in inputs], [tensor(o, None) for o in outputs], inits)
    sess = glassrt.InferenceSession(m, providers=["cpu"])
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in inputs}
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, ref in zip(sess.run(None, feeds), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    return [n.op_type for n in sess.placement.graph.nodes]


def test_gated_activations_that_must_not_fuse():
    sig = helper.make_node("Sigmoid", ["c"], ["g"], name="gate")
    # the conv output has a third reader
    assert _not_fused([sig, helper.make_node("Mul", ["c", "g"], ["y"], name="mul"),
                       helper.make_node("Neg", ["c"], ["z"], name="other")], outputs=("y", "z")) == \
        ["Conv", "Sigmoid", "Mul", "Neg"]
    # the gate's output is read elsewhere too (a graph output)
    assert _not_fused([sig, helper.make_node("Mul", ["c", "g"], ["y"], name="mul")], outputs=("y", "g")) == \
        ["Conv", "Sigmoid", "Mul"]
    # the conv output is a graph output
    assert _not_fused([sig, helper.make_node("Mul", ["c", "g"], ["y"], name="mul")], outputs=("y", "c")) == \
        ["Conv", "Sigmoid", "Mul"]
    # the Mul gates something else by the conv's sigmoid: not c·σ(c) (the Sigmoid alone is fused)
    assert _not_fused([sig, helper.make_node("Mul", ["d", "g"], ["y"], name="mul")],
                      inputs=(("x", list(X.shape)), ("d", [2, 5, 9, 8]))) == ["FusedConv", "Mul"]
    # the gate reads another value: c·σ(d)
    assert _not_fused([helper.make_node("Sigmoid", ["d"], ["g"], name="gate"),
                       helper.make_node("Mul", ["c", "g"], ["y"], name="mul")],
                      inputs=(("x", list(X.shape)), ("d", [2, 5, 9, 8]))) == ["Conv", "Sigmoid", "Mul"]
    # c·c·σ... a Mul of the conv output by itself is not a gate
    assert _not_fused([helper.make_node("Mul", ["c", "c"], ["y"], name="mul")]) == ["Conv", "Mul"]


@pytest.mark.parametrize("act,params,message", [
    ("Foo", [], "activation 'Foo' is not one of"),
    ("HardSwish", [0.2], "activation HardSwish takes 2 activation_params, got 1"),
    ("Clip", [], "activation Clip takes 2 activation_params, got 0"),
])
def test_a_fused_conv_with_a_bad_activation_is_refused_naming_the_node(act, params, message):
    attrs = {"activation": act, "pads": [1, 1, 1, 1]}
    if params:
        attrs["activation_params"] = params
    m = model([helper.make_node("FusedConv", ["x", "w", "b"], ["y"], name="handmade", domain="glassrt", **attrs)],
              [tensor("x", list(X.shape))], [tensor("y", None)], [init("w", W), init("b", B)],
              domains={"glassrt": 1})
    with pytest.raises(ShapeInferenceError, match=f"handmade.*{message}"):
        glassrt.InferenceSession(m, providers=["cpu"])


@pytest.mark.parametrize("act,attrs", [("HardSwish", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.45})])
def test_hard_activations_alone_run_on_onednn(act, attrs):
    """After a pooling (nothing to fuse into): oneDNN's eltwise, in the NHWC region."""
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[2, 2]),
             helper.make_node(act, ["p"], ["y"], name="act", **attrs)]
    m = model(nodes, [tensor("x", list(X.shape))], [tensor("y", None)])
    sess = glassrt.InferenceSession(m)
    assert [r["kernel"] for r in sess.explain()["nodes"]] == ["onednn.MaxPool.pool", f"onednn.{act}.eltwise"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], want, rtol=1e-6, atol=1e-6)


def test_a_channel_split_between_convs_stays_in_the_nhwc_region():
    """YOLOv8's C2f: conv → Split in two → conv on one piece, Add of that piece and its conv
    → Concat. Every node on oneDNN (the pieces dense in NHWC: before onednn.Split the cpu
    Split's NCHW pieces met NHWC convs in a reference Add, 4 ms at 16x80x80); uneven pieces,
    both layouts at the edges (the graph input and outputs are NCHW)."""
    w1 = (RNG.standard_normal((6, 3, 1, 1)) / 2).astype(np.float32)
    w2 = (RNG.standard_normal((4, 4, 3, 3)) / 6).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1"),
             helper.make_node("Split", ["c", "sizes"], ["a", "b"], name="split", axis=1),
             helper.make_node("Conv", ["b", "w2"], ["d"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["b", "d"], ["e"], name="add"),
             helper.make_node("Concat", ["a", "b", "e"], ["y"], name="concat", axis=1)]
    m = model(nodes, [tensor("x", list(X.shape))], [tensor("y", None), tensor("a", None)],
              [init("w1", w1), init("w2", w2), init("sizes", np.array([2, 4], np.int64))])
    sess = glassrt.InferenceSession(m)
    kernels = {r["name"]: r["kernel"] for r in sess.explain()["nodes"]}
    # (the Add became conv2's residual: a FusedConv reading the piece as its Z)
    assert kernels == {"conv1": "onednn.Conv", "split": "onednn.Split", "conv2": "onednn.FusedConv.conv",
                       "concat": "onednn.Concat"}, kernels
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})
    for _ in range(2):  # the second run reuses what the first bound
        for got, ref in zip(sess.run(None, {"x": X}), want):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_splits_onednn_leaves_to_cpu_say_why():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Split", ["c", "sizes"], ["p", "q"], name="split", axis=2)]
    m = model(nodes, [tensor("x", list(X.shape))], [tensor("p", None), tensor("q", None)],
              [init("w", W), init("sizes", np.array([4, 5], np.int64))])
    sess = glassrt.InferenceSession(m)
    row = next(r for r in sess.explain()["nodes"] if r["name"] == "split")
    assert row["kernel"].startswith("cpu.Split") and "an axis other than the channels" in row["reason"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})
    for got, ref in zip(sess.run(None, {"x": X}), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", ["Clip", "Sigmoid", "Relu"])
def test_batch_norm_post_ops_onednn_cannot_run_go_to_cpu(act):
    """oneDNN 3.2's batch normalization takes a Relu post-op only: a FusedBatchNormalization
    with Clip (ReLU6) or Sigmoid used to be accepted and failed when the plan was built."""
    prod, inits = _producer("bn")
    extra = [init("lo", np.float32(0)), init("hi", np.float32(6))] if act == "Clip" else []
    node = helper.make_node(act, ["c", "lo", "hi"] if act == "Clip" else ["c"], ["y"], name="act")
    m = model([prod, node], [tensor("x", list(X.shape))], [tensor("y", None)], inits + extra)
    sess = glassrt.InferenceSession(m)
    row = sess.explain()["nodes"][0]
    assert row["op"] == "FusedBatchNormalization"
    assert row["kernel"].startswith("onednn." if act == "Relu" else "cpu."), row
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], want, rtol=1e-5, atol=1e-5)
