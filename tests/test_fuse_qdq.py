"""QuantizeLinear -> DequantizeLinear on float activations (passes/fuse_qdq.py): one
glassrt::QuantizeDequantize whose values are the pair's to the bit (NaN, infinities and
values beyond the 8-bit range included), equal to onnxruntime; left alone where the pair
is not a per-tensor round trip."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import glassrt

from .helpers import init, model, tensor

RNG = np.random.default_rng(11)
X = np.concatenate([RNG.standard_normal(200).astype(np.float32) * 4,
                    np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, 2.5, -2.5, 0.1], np.float32)])
X = np.concatenate([X, RNG.standard_normal(16).astype(np.float32)]).reshape(2, 113)


def _pair(zp_dtype=np.uint8, zp=128, dq_scale=0.05, read_q_elsewhere=False, per_axis=False):
    scale = np.full(113, 0.05, np.float32) if per_axis else np.array(0.05, np.float32)
    inits = [init("s", scale), init("s2", np.array(dq_scale, np.float32))]
    q_in, dq_in = ["x", "s"], ["q", "s2" if dq_scale != 0.05 else "s"]
    if zp_dtype is not None:
        inits.append(init("z", (np.full(113, zp) if per_axis else np.array(zp)).astype(zp_dtype)))
        q_in.append("z")
        dq_in.append("z")
    nodes = [helper.make_node("QuantizeLinear", q_in, ["q"], name="quant", axis=1),
             helper.make_node("DequantizeLinear", dq_in, ["y"], name="dequant", axis=1)]
    outputs = [tensor("y", None)]
    if read_q_elsewhere:
        nodes.append(helper.make_node("Identity", ["q"], ["q_copy"], name="copy"))
        elem = TensorProto.UINT8 if zp_dtype in (None, np.uint8) else TensorProto.INT8
        outputs.append(tensor("q_copy", None, elem))
    return model(nodes, [tensor("x", list(X.shape))], outputs, inits)


def _ort(m):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})


@pytest.mark.parametrize("zp_dtype,zp", [(np.uint8, 128), (np.uint8, 0), (np.int8, -3), (None, 0)])
def test_the_pair_is_fused_and_exact(zp_dtype, zp):
    m = _pair(zp_dtype, zp)
    sess = glassrt.InferenceSession(m)
    assert [n.op_type for n in sess.placement.graph.nodes] == ["QuantizeDequantize"]
    got = sess.run(None, {"x": X})[0]
    plain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(fusion=False)).run(None, {"x": X})[0]
    np.testing.assert_array_equal(got, plain)  # to the bit, NaN where the pair gives NaN
    finite = np.isfinite(X)  # onnxruntime's NaN -> integer conversion is its own
    np.testing.assert_array_equal(got[finite], _ort(m)[0][finite])


@pytest.mark.parametrize("case", ["other_scale", "q_read_elsewhere", "per_axis"])
def test_it_does_not_fire_where_the_pair_is_not_a_round_trip(case):
    m = {"other_scale": lambda: _pair(dq_scale=0.1), "q_read_elsewhere": lambda: _pair(read_q_elsewhere=True),
         "per_axis": lambda: _pair(per_axis=True)}[case]()
    sess = glassrt.InferenceSession(m)
    assert "QuantizeDequantize" not in [n.op_type for n in sess.placement.graph.nodes]
    finite = np.isfinite(X)
    for g, w in zip(sess.run(None, {"x": X}), _ort(m)):
        np.testing.assert_array_equal(g[finite], w[finite])


def test_the_numpy_fallback_without_numba_is_the_same(monkeypatch):
    """Where Numba cannot be imported the fused kernel computes with NumPy, tile by tile:
    the same values as the compiled loop."""
    from glassrt.kernels.cpu import quantize

    m = _pair(np.int8, -3)
    compiled = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": X})[0]
    monkeypatch.setattr(quantize, "use_compiled", lambda path: False)  # (as where Numba cannot be imported)
    monkeypatch.setattr(quantize, "_fake_quant", None)  # a call to the compiled loop would fail
    fallback = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": X})[0]
    np.testing.assert_array_equal(fallback, compiled)


def _qdq_conv_chain():
    """x -> Conv -> Q -> DQ -> Conv -> y: a QDQ CNN's activation between two convolutions."""
    w1 = (RNG.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c1", "s", "z"], ["q"], name="quant"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dequant"),
             helper.make_node("Conv", ["d", "w2"], ["y"], name="conv2")]
    return model(nodes, [tensor("x", [1, 3, 10, 12])], [tensor("y", None)],
                 [init("w1", w1), init("w2", w2), init("s", np.array(0.02, np.float32)), init("z", np.array(120, np.uint8))])


def test_between_convolutions_the_pair_runs_on_their_channels_last_values(monkeypatch):
    """The fused pair takes any layout (each element on its own): its input and output stay
    channels-last between oneDNN's convolutions, no reorder around it; the values are those
    of the pair on plain arrays. (As a node of its own: fuse_conv_qdq, off here, would take
    it into the conv before it; tests/test_fuse_conv_qdq.py.)"""
    from glassrt import passes
    from glassrt.kernels.onednn import capi

    if capi.UNAVAILABLE is not None:
        pytest.skip("oneDNN unavailable")
    monkeypatch.setattr(passes, "PIPELINE", [p for p in passes.PIPELINE if p.name != "fuse_conv_qdq"])
    m = _qdq_conv_chain()
    x = RNG.standard_normal((1, 3, 10, 12)).astype(np.float32)
    sess = glassrt.InferenceSession(m)
    got = sess.run(None, {"x": x})[0]
    plan = next(iter(sess.runner.plans.values()))
    qdq = next(st for st in plan.steps if st.node.op_type == "QuantizeDequantize")
    assert plan.layouts.get(qdq.node.inputs[0]) == "nhwc" and plan.layouts.get(qdq.node.outputs[0]) == "nhwc"
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the kernel on channels-last views gives the bits it gives on plain arrays
    from glassrt.runtime.layout import channels_last_view

    c1 = (RNG.standard_normal((2, 8, 5, 6)) * 2).astype(np.float32)
    c1.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 1e30]
    nhwc_in = channels_last_view(np.ascontiguousarray(c1.transpose(0, 2, 3, 1)).reshape(-1), c1.shape)
    nhwc_out = channels_last_view(np.empty(c1.size, np.float32), c1.shape)
    plain_out = np.empty_like(c1)
    qdq.fn(nhwc_in, None, None, out=nhwc_out)
    qdq.fn(c1, None, None, out=plain_out)
    np.testing.assert_array_equal(nhwc_out, plain_out)


@pytest.mark.parametrize("zp", [np.uint8(120), np.int8(-7)])
@pytest.mark.parametrize("channels", [6, 3])
@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
def test_per_tensor_quantize_and_dequantize_take_channels_last_values(monkeypatch, op, channels, zp):
    """QuantizeLinear / DequantizeLinear per tensor compute each element on its own, so they
    take NHWC views (a QDQ CNN's values around float Splits and Concats stay channels-last):
    plain or channels-last input and output, every mix, the NumPy path's values. Three
    channels: an RGB image quantized into a channels-last value has its own interleaving pass."""
    pytest.importorskip("numba")
    from glassrt.kernels.cpu import quantize
    from glassrt.runtime.layout import channels_last_view

    shape = (2, channels, 5, 7)
    x = (RNG.standard_normal(shape) * 5).astype(np.float32)
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, 2.5, -2.5, 1e30]
    x[1, -1, -1, -3:] = [np.nan, -1e30, 0.02]  # (the last image's last channel: the pass's far end)
    scale, zp = np.array(0.04, np.float32), np.array(zp)
    if op == "DequantizeLinear":
        x = RNG.integers(0, 256, shape).astype(np.uint8).view(zp.dtype)
    kernel = quantize.quantize_linear if op == "QuantizeLinear" else quantize.dequantize_linear
    out_dt = zp.dtype if op == "QuantizeLinear" else np.float32

    def nhwc(a):
        return channels_last_view(np.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(-1), a.shape)

    monkeypatch.setattr(quantize, "use_compiled", lambda path, after=64: False)
    want = kernel(x, scale, zp, out=np.empty(shape, out_dt))
    monkeypatch.setattr(quantize, "use_compiled", lambda path, after=64: True)
    for xs in (x, nhwc(x)):
        for out in (np.empty(shape, out_dt), channels_last_view(np.empty(int(np.prod(shape)), out_dt), shape)):
            np.testing.assert_array_equal(kernel(xs, scale, zp, out=out), want)
