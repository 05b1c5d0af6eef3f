"""A conv whose output a glassrt::QuantizeDequantize alone reads (a QDQ CNN run in float,
passes/fuse_conv_qdq.py): one glassrt::FusedConv that quantizes in its epilogue, oneDNN's
post-ops or cpu's pass after the activation, to the bit what the two nodes give; left
alone where the conv's output is read elsewhere or the scale is computed."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import init, model, session_without_pass, tensor

RNG = np.random.default_rng(23)
X = RNG.standard_normal((1, 8, 14, 14)).astype(np.float32)
ONEDNN = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=str(capi.UNAVAILABLE))


def _qdq(name, x, scale="s", zero="z"):
    return [helper.make_node("QuantizeLinear", [x, scale, zero], [f"{name}/q"], name=f"{name}/quantize"),
            helper.make_node("DequantizeLinear", [f"{name}/q", scale, zero], [name], name=f"{name}/dequantize")]


def _net(zp=np.uint8(128), read_conv_elsewhere=False, scale_input=False):
    """Conv → QDQ, Conv → Relu → QDQ, Conv → Add(residual) → QDQ, a depthwise Conv → Clip →
    QDQ: a QDQ MobileNet's layers as quantize_static writes them (weights already float)."""
    w1 = (RNG.standard_normal((16, 8, 1, 1)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32)
    w3 = (RNG.standard_normal((16, 1, 3, 3)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32) * 0.1
    inits = [init("w1", w1), init("w2", w2), init("w3", w3), init("b", b), init("z", np.array(zp))]
    if not scale_input:
        inits.append(init("s", np.array(0.02, np.float32)))
    nodes = [helper.make_node("Conv", ["x", "w1", "b"], ["c1"], name="conv1"), *_qdq("a1", "c1"),
             helper.make_node("Conv", ["a1", "w2", "b"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"), *_qdq("a2", "r2"),
             helper.make_node("Conv", ["a2", "w2"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c3", "a1"], ["s3"], name="add3"), *_qdq("a3", "s3"),
             helper.make_node("Conv", ["a3", "w3", "b"], ["c4"], name="conv4", pads=[1, 1, 1, 1], group=16),
             helper.make_node("Clip", ["c4", "lo", "hi"], ["r4"], name="clip4"), *_qdq("y", "r4")]
    inits += [init("lo", np.array(0.0, np.float32)), init("hi", np.array(6.0, np.float32))]
    outputs = [tensor("y", None)]
    if read_conv_elsewhere:
        outputs.append(tensor("c1", None))
    inputs = [tensor("x", list(X.shape))] + ([tensor("s", [])] if scale_input else [])
    return model(nodes, inputs, outputs, inits, opset=19)


def _feeds(scale_input=False):
    return {"x": X, **({"s": np.array(0.02, np.float32)} if scale_input else {})}


def _reference(m, feeds):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(m).run(None, feeds)


def _close(got, want):
    """The same codes but where two conv sums straddle a rounding tie (one step: 0.02)."""
    assert np.mean(got == want) > 0.99 and np.max(np.abs(got - want)) <= 0.02 * 1.001


def _quantizing_convs(sess) -> int:
    return sum(1 for n in sess.placement.graph.nodes if n.op_type == "FusedConv" and len(n.inputs) > 4 and n.inputs[4])


def _plain(m, providers, feeds):
    """The same model with the conv fusions off (fuse_qdq still on: QuantizeDequantize nodes)."""
    sess = session_without_pass(m, "fuse_conv_qdq", providers=providers)
    assert _quantizing_convs(sess) == 0 and "QuantizeDequantize" in [n.op_type for n in sess.placement.graph.nodes]
    return sess.run(None, feeds)


@pytest.mark.parametrize("providers", [pytest.param(["onednn", "cpu"], marks=ONEDNN), ["cpu"]])
@pytest.mark.parametrize("zp", [np.uint8(128), np.uint8(0), np.int8(-5)])
def test_convs_quantize_in_their_epilogue_to_the_bit(providers, zp):
    m = _net(zp)
    sess = glassrt.InferenceSession(m, providers=providers)
    assert _quantizing_convs(sess) == 4
    assert "QuantizeDequantize" not in [n.op_type for n in sess.placement.graph.nodes]
    if providers[0] == "onednn":
        assert {n["kernel"] for n in sess.explain()["nodes"]} <= {"onednn.FusedConv.conv"}
    got = sess.run(None, {"x": X})[0]
    np.testing.assert_array_equal(got.view(np.uint32), _plain(m, providers, {"x": X})[0].view(np.uint32))
    # and onnx.reference's (onnxruntime runs a QDQ model's Add as QLinearAdd, its own rounding)
    _close(got, _reference(m, {"x": X})[0])


@pytest.mark.parametrize("case", ["conv_output_read_elsewhere", "scale_computed"])
def test_it_does_not_fire_where_the_conv_output_is_needed_or_the_scale_is_not_constant(case):
    m = _net(read_conv_elsewhere=case == "conv_output_read_elsewhere", scale_input=case == "scale_computed")
    sess = glassrt.InferenceSession(m)
    fused = _quantizing_convs(sess)
    assert fused == (3 if case == "conv_output_read_elsewhere" else 0)  # (conv1's output is a graph output)
    feeds = _feeds(case == "scale_computed")
    got, want = sess.run(None, feeds), _reference(m, feeds)
    _close(got[0], want[0])
    if len(got) > 1:  # (conv1's float output)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


@ONEDNN
@pytest.mark.parametrize("zp", [np.uint8(128), np.int8(-5)])
def test_a_nan_takes_the_kernels_that_keep_the_references_value(zp):
    """oneDNN's relu and clip are max/min instructions (NaN becomes a bound) and so is the
    quantization's clip: with nan_handling="exact" the fused convs that would change a NaN's
    value run on cpu's kernels, and the outputs are the two nodes' values."""
    m = _net(zp)
    x = X.copy()
    x[0, :, 3, 4] = np.nan
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"], sess_options=glassrt.SessionOptions(nan_handling="exact"))
    assert _quantizing_convs(sess) == 4
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, _plain(m, ["cpu"], {"x": x})[0])
    if zp.dtype == np.int8:  # (the quantization's clip alone changes a NaN's value: no conv keeps oneDNN)
        assert all(n["kernel"].startswith("cpu.FusedConv.") for n in sess.explain()["nodes"])


@pytest.mark.parametrize("zp,lo,hi", [(128.0, 0.0, 255.0), (-5.0, -128.0, 127.0)])
def test_the_in_place_loop_gives_the_bytes_of_the_two_array_one(zp, lo, hi, monkeypatch):
    """cpu's fused conv quantizes its output in place, on a loop of its own (the two-array
    loop fed one array fails LLVM's alias check): the same bits as into another array, and
    as NumPy's path. Ties, values past the range, NaN, infinities and signed zeros."""
    pytest.importorskip("numba")
    from glassrt.kernels.cpu import quantize

    x = np.concatenate([RNG.standard_normal(4000).astype(np.float32) * 5,
                        (np.arange(-300, 300, dtype=np.float32) + 0.5) * 0.02,
                        np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, -1e-3], np.float32)])
    s, z = np.float32(0.02), np.float32(zp)
    monkeypatch.setattr(quantize, "use_compiled", lambda path: False)
    numpy_path = quantize.fake_quantize(x, s, z, lo, hi, np.empty_like(x))
    monkeypatch.setattr(quantize, "use_compiled", lambda path: True)
    apart = quantize.fake_quantize(x, s, z, lo, hi, np.empty_like(x))
    called = []
    in_place_loop = quantize._fake_quant_in_place
    monkeypatch.setattr(quantize, "_fake_quant_in_place", lambda *a: called.append(1) or in_place_loop(*a))
    y = x.copy()
    in_place = quantize.fake_quantize(y, s, z, lo, hi, y)
    assert called and in_place is y
    np.testing.assert_array_equal(in_place.view(np.uint32), apart.view(np.uint32))
    np.testing.assert_array_equal(apart.view(np.uint32), numpy_path.view(np.uint32))
