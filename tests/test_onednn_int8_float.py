"""8-bit convolutions as exact float32 ones on oneDNN (kernels/onednn/int8_float.py), the
kernels that run QLinearConv and ConvInteger where the CPU has no VNNI or AMX. The int8
kernels are made to refuse here (as they do on such a CPU), so that these run on any CPU;
each is checked against int64 arithmetic requantized as onnxruntime does it (float32)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt
from glassrt.kernels.onednn import capi

from tests.test_contrib_quant import rng_for
from tests.test_onednn_int8 import _codes, _conv_integer, _kernel, _qlinear_conv_model, _qlinear_model

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")

I8, U8 = np.int8, np.uint8


@pytest.fixture(autouse=True)
def no_vnni(monkeypatch):
    """As on an AVX2 CPU: oneDNN's 8-bit products refuse."""
    from glassrt.kernels.onednn import int8

    monkeypatch.setattr(int8, "exact_reason", lambda: "no VNNI (this test)")


def _exact_sums(x, xz, w, wz, attrs):
    """The int64 convolution of (x - xz) with (w - wz), by windows (N, M, OH, OW)."""
    group = attrs.get("group", 1)
    pads = attrs.get("pads", [0, 0, 0, 0])
    st, dil = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    xc = np.pad(x.astype(np.int64) - int(xz), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    wc = w.astype(np.int64) - (wz.astype(np.int64).reshape(-1, 1, 1, 1) if wz.size > 1 else int(wz))
    kh, kw = w.shape[2:]
    oh = (xc.shape[2] - dil[0] * (kh - 1) - 1) // st[0] + 1
    ow = (xc.shape[3] - dil[1] * (kw - 1) - 1) // st[1] + 1
    m, cg = w.shape[:2]
    out = np.zeros((x.shape[0], m, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = xc[:, :, i * dil[0]:i * dil[0] + st[0] * (oh - 1) + 1:st[0],
                       j * dil[1]:j * dil[1] + st[1] * (ow - 1) + 1:st[1]]
            for g in range(group):
                fs = slice(g * (m // group), (g + 1) * (m // group))
                out[:, fs] += np.einsum("nchw,mc->nmhw", patch[:, g * cg:(g + 1) * cg], wc[fs, :, i, j])
    return out


def _requantized(acc, b, xs, ws, ys, yz, dt):
    """onnxruntime's requantization: rint(float32(acc + b) * M) + yz, M = xs * ws / ys in float32."""
    mult = (xs * ws.reshape(-1) / ys).astype(np.float32).reshape(1, -1, 1, 1)
    v = (acc + b.reshape(1, -1, 1, 1)).astype(np.float32) * mult
    info = np.iinfo(dt)
    return np.clip(np.rint(v.astype(np.float64)) + int(yz), info.min, info.max).astype(dt)


CASES = [  # x type, w type, per-channel weights, with a bias, attributes, x shape, filters
    (U8, I8, False, True, {"pads": [1, 1, 1, 1]}, (1, 6, 9, 11), 8),
    (U8, U8, False, True, {"strides": [2, 2], "pads": [0, 1, 1, 0]}, (1, 6, 9, 11), 8),
    (U8, I8, True, False, {"group": 2}, (2, 6, 7, 5), 8),
    (I8, I8, True, True, {"pads": [1, 1, 1, 1], "dilations": [1, 2]}, (1, 6, 9, 11), 8),
    (U8, I8, True, True, {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]}, (1, 16, 14, 14), 16),  # depthwise
    (I8, U8, True, True, {}, (1, 64, 7, 7), 24),  # pointwise, u8 weights with a zero point per filter
]


@pytest.mark.parametrize("x_dt,w_dt,per_channel,bias,attrs,x_shape,m_out", CASES)
def test_qlinear_conv_is_onnxruntimes_requantization_of_the_exact_sums(x_dt, w_dt, per_channel, bias, attrs,
                                                                       x_shape, m_out):
    rng = rng_for("int8-float-qconv", x_dt, w_dt, per_channel, bias, str(attrs), x_shape)
    group = attrs.get("group", 1)
    w = _codes(rng, w_dt, (m_out, x_shape[1] // group, 3, 3) if x_shape[1] < 64 else (m_out, x_shape[1], 1, 1))
    shape = (m_out,) if per_channel else ()
    consts = {"xs": np.array(0.05, np.float32), "xz": _codes(rng, x_dt, ()), "w": w,
              "ws": rng.uniform(0.002, 0.02, shape).astype(np.float32),
              "wz": np.zeros(shape, w_dt) if w_dt == I8 else _codes(rng, w_dt, shape),
              "ys": np.array(0.2, np.float32), "yz": _codes(rng, x_dt, ()),
              "b": rng.integers(-500, 500, (m_out,)).astype(np.int32) if bias else np.zeros(m_out, np.int32)}
    m = _qlinear_conv_model(consts, x_shape, x_dt, **attrs)
    if not bias:
        del m.graph.node[0].input[8]
    sess = glassrt.InferenceSession(m)
    assert _kernel(sess, "conv")["kernel"] == "onednn.QLinearConv.float32"
    for _ in range(2):  # (the second run: the bound primitives again, on new bytes)
        x = _codes(rng, x_dt, x_shape)
        got = sess.run(None, {"x": x})[0]
        acc = _exact_sums(x, consts["xz"], w, consts["wz"], attrs)
        want = _requantized(acc, consts["b"], consts["xs"], consts["ws"], consts["ys"], consts["yz"], x_dt)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("x_dt,w_dt,wz_shape,attrs", [
    (U8, U8, (), {"pads": [1, 1, 1, 1]}),
    (I8, I8, None, {"group": 2, "strides": [2, 2]}),
    (U8, I8, (8,), {"dilations": [2, 1], "auto_pad": "SAME_UPPER"}),
])
def test_conv_integer_is_the_exact_sums(x_dt, w_dt, wz_shape, attrs):
    rng = rng_for("int8-float-convinteger", x_dt, w_dt, wz_shape, str(attrs))
    group = attrs.get("group", 1)
    w = _codes(rng, w_dt, (8, 6 // group, 3, 3))
    wz = None if wz_shape is None else _codes(rng, w_dt, wz_shape)
    m = _conv_integer(w, wz, (1, 6, 10, 9), x_dt, False, **attrs)
    sess = glassrt.InferenceSession(m)
    assert _kernel(sess, "conv")["kernel"] == "onednn.ConvInteger.float32"
    cpu = glassrt.InferenceSession(m, providers=["cpu"])
    x = _codes(rng, x_dt, (1, 6, 10, 9))
    got = sess.run(None, {"x": x})[0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, cpu.run(None, {"x": x})[0])


def _past_the_bound(group: int, x_dt=U8):
    """A QLinearConv of 256 input channels (128 per group with group 2) and 3 x 3 full-range
    weights, filter 0 all +127: its sums at a window inside the image reach 255 * 127 * 1152
    or more, past 2**24; x all 255 reaches it. (model, consts, x, the int64 sums)"""
    rng = rng_for("int8-float-bound", group, x_dt)
    w = np.where(rng.random((4, 256 // group, 3, 3)) < 0.5, -127, 127).astype(I8)
    w[0] = 127
    consts = {"xs": np.array(0.05, np.float32), "xz": np.array(0, x_dt), "w": w, "ws": np.array(0.01, np.float32),
              "wz": np.array(0, I8), "ys": np.array(0.2, np.float32), "yz": np.array(128 if x_dt == U8 else 0, x_dt),
              "b": rng.integers(-5000, 5000, 4).astype(np.int32)}
    m = _qlinear_conv_model(consts, (1, 256, 5, 5), x_dt, pads=[1, 1, 1, 1], group=group)
    x = np.full((1, 256, 5, 5), np.iinfo(x_dt).max, x_dt)
    x[0, :, 0] = _codes(rng, x_dt, (256, 5))  # (a row of other values)
    acc = _exact_sums(x, consts["xz"], w, consts["wz"], {"pads": [1, 1, 1, 1], "group": group})
    assert np.abs(acc).max() > 1 << 24  # (the case is what it claims)
    return m, consts, x, acc


def test_sums_that_float32_cannot_hold_stay_on_cpus_exact_path():
    """A grouped conv whose filters reach past 2**24 (its input channels are not cut into
    parts): refused with the bound in the reason, and cpu's exact kernel runs."""
    m, consts, x, acc = _past_the_bound(group=2)
    sess = glassrt.InferenceSession(m)
    row = _kernel(sess, "conv")
    assert row["kernel"] == "cpu.QLinearConv" and "2**24" in str(row), row
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], _requantized(
        acc, consts["b"], consts["xs"], consts["ws"], consts["ys"], consts["yz"], U8))


@pytest.mark.parametrize("x_dt", [U8, I8])
def test_sums_past_2_24_run_in_parts_of_the_input_channels_exactly(x_dt):
    """A dense conv whose filters reach past 2**24: its input channels cut into runs whose sums
    float32 holds, one convolution each, added in float64 and requantized as onnxruntime
    does it (float32 of acc + b): the int64 sums' requantization, bit for bit."""
    m, consts, x, acc = _past_the_bound(group=1, x_dt=x_dt)
    sess = glassrt.InferenceSession(m)
    assert _kernel(sess, "conv")["kernel"] == "onednn.QLinearConv.float32"
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], _requantized(
            acc, consts["b"], consts["xs"], consts["ws"], consts["ys"], consts["yz"], x_dt))


def test_conv_integer_sums_past_2_24_run_in_parts_exactly():
    rng = rng_for("int8-float-convinteger-parts")
    w = np.full((3, 256, 3, 3), 127, I8)
    w[1] = -128
    m = _conv_integer(w, None, (1, 256, 6, 6), U8, False, pads=[1, 1, 1, 1])
    sess = glassrt.InferenceSession(m)
    assert _kernel(sess, "conv")["kernel"] == "onednn.ConvInteger.float32"
    x = np.full((1, 256, 6, 6), 255, U8)
    x[0, :, 2] = _codes(rng, U8, (256, 6))
    want = _exact_sums(x, np.array(0, U8), w, np.array(0, I8), {"pads": [1, 1, 1, 1]})
    assert np.abs(want).max() > 1 << 24
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


def test_scales_fed_at_run_time_stay_on_cpu():
    rng = rng_for("int8-float-fed")
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="conv")
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "xz": np.array(0, U8), "w": _codes(rng, I8, (4, 3, 3, 3)), "ws": np.array(0.01, np.float32),
        "wz": np.array(0, I8), "ys": np.array(0.2, np.float32), "yz": np.array(0, U8)}.items()]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 8, 8]),
                                        helper.make_tensor_value_info("xs", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    row = _kernel(glassrt.InferenceSession(m), "conv")
    assert row["kernel"] == "cpu.QLinearConv" and "run time" in str(row), row


def _centered_or_not(monkeypatch, centered: bool):
    """Two QLinearConvs in a row hand each other float32 codes (center_qlinear_convs) or, with
    that pass off, their 8-bit bytes: (the value between them, the kernel that runs them)."""
    from glassrt import passes

    if not centered:
        monkeypatch.setattr(passes, "PIPELINE", [p for p in passes.PIPELINE if p.name != "center_qlinear_convs"])
        return "h", "onednn.QLinearConv.float32"
    return "h/centered", "onednn.CenteredQLinearConv.float32"


@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("x_dt", [U8, I8])
def test_qlinear_convs_in_a_row_keep_their_bytes_channels_last(x_dt, centered, monkeypatch):
    """Between two of these kernels the 8-bit value (or its float32 codes, centered) stays
    NHWC (their reorders read and write either layout); the graph's input and output stay
    NCHW. Each conv the exact requantization."""
    between, kernel = _centered_or_not(monkeypatch, centered)
    rng = rng_for("int8-float-chain", x_dt)
    consts, nodes = {"xs": np.array(0.05, np.float32), "xz": _codes(rng, x_dt, ())}, []
    for name, x, y, c_in, strides in (("conv1", "x", "h", 6, [1, 1]), ("conv2", "h", "y", 16, [2, 2])):
        consts.update({f"{name}_w": _codes(rng, I8, (16, c_in, 3, 3)),
                       f"{name}_ws": rng.uniform(0.002, 0.02, (16,)).astype(np.float32),
                       f"{name}_wz": np.zeros((16,), I8), f"{name}_ys": np.array(0.1 if name == "conv1" else 0.05,
                                                                                    np.float32),
                       f"{name}_yz": _codes(rng, x_dt, ()), f"{name}_b": rng.integers(-500, 500, (16,)).astype(np.int32)})
        scale_in = ("xs", "xz") if name == "conv1" else ("conv1_ys", "conv1_yz")
        nodes.append(helper.make_node("QLinearConv", [x, *scale_in, *(f"{name}_{k}" for k in ("w", "ws", "wz", "ys",
                                                                                             "yz", "b"))],
                                      [y], name=name, pads=[1, 1, 1, 1], strides=strides))
    m = _qlinear_model(nodes, consts, (1, 6, 20, 18), x_dt)
    sess = glassrt.InferenceSession(m)
    assert [_kernel(sess, n)["kernel"] for n in ("conv1", "conv2")] == [kernel] * 2
    x = _codes(rng, x_dt, (1, 6, 20, 18))
    got = sess.run(None, {"x": x})[0]
    assert next(iter(sess.runner.plans.values())).layouts == {between: "nhwc"}
    c = consts
    h = _requantized(_exact_sums(x, c["xz"], c["conv1_w"], c["conv1_wz"], {"pads": [1, 1, 1, 1]}), c["conv1_b"],
                     c["xs"], c["conv1_ws"], c["conv1_ys"], c["conv1_yz"], x_dt)
    y = _requantized(_exact_sums(h, c["conv1_yz"], c["conv2_w"], c["conv2_wz"],
                                 {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
                     c["conv2_b"], c["conv1_ys"], c["conv2_ws"], c["conv2_ys"], c["conv2_yz"], x_dt)
    np.testing.assert_array_equal(got, y)


def test_a_zero_y_scale_is_left_to_cpus_kernel():
    """A multiplier that is not finite (y_scale 0) would reach oneDNN's post-ops as inf: the
    kernel refuses and cpu's takes the node as it takes it anywhere."""
    rng = rng_for("int8-float-zero-scale")
    consts = {"xs": np.array(0.05, np.float32), "xz": np.array(3, U8), "w": _codes(rng, I8, (4, 3, 3, 3)),
              "ws": np.array(0.01, np.float32), "wz": np.array(0, I8), "ys": np.array(0.0, np.float32),
              "yz": np.array(0, U8), "b": np.zeros(4, np.int32)}
    row = _kernel(glassrt.InferenceSession(_qlinear_conv_model(consts, (1, 3, 6, 6), U8)), "conv")
    assert row["kernel"] == "cpu.QLinearConv" and "not finite" in str(row), row


@pytest.mark.parametrize("centered", [False, True])
def test_a_conv_in_parts_reads_its_input_channels_last(centered, monkeypatch):
    """The second of two QLinearConvs reaches past 2**24 and runs in parts: its reorders cut
    runs of channels out of the NHWC value between them; the exact chain's bytes."""
    between, kernel = _centered_or_not(monkeypatch, centered)
    rng = rng_for("int8-float-parts-chain")
    w2 = np.where(rng.random((4, 256, 3, 3)) < 0.5, -127, 127).astype(I8)
    w2[0] = 127
    consts = {"xs": np.array(0.05, np.float32), "xz": np.array(0, U8), "w1": _codes(rng, I8, (256, 6, 1, 1)),
              "ws1": np.array(0.01, np.float32), "wz1": np.array(0, I8), "ys1": np.array(0.01, np.float32),
              "yz1": np.array(0, U8), "b1": np.full(256, 2000, np.int32), "w2": w2, "ws2": np.array(0.01, np.float32),
              "wz2": np.array(0, I8), "ys2": np.array(0.5, np.float32), "yz2": np.array(128, U8),
              "b2": rng.integers(-500, 500, 4).astype(np.int32)}
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w1", "ws1", "wz1", "ys1", "yz1", "b1"], ["h"],
                              name="conv1"),
             helper.make_node("QLinearConv", ["h", "ys1", "yz1", "w2", "ws2", "wz2", "ys2", "yz2", "b2"], ["y"],
                              name="conv2", pads=[1, 1, 1, 1])]
    m = _qlinear_model(nodes, consts, (1, 6, 7, 7), U8)
    sess = glassrt.InferenceSession(m)
    assert [_kernel(sess, n)["kernel"] for n in ("conv1", "conv2")] == [kernel] * 2
    x = _codes(rng, U8, (1, 6, 7, 7))
    got = sess.run(None, {"x": x})[0]
    assert next(iter(sess.runner.plans.values())).layouts == {between: "nhwc"}
    c = consts
    h = _requantized(_exact_sums(x, c["xz"], c["w1"], c["wz1"], {}), c["b1"], c["xs"], c["ws1"], c["ys1"], c["yz1"], U8)
    acc = _exact_sums(h, c["yz1"], w2, c["wz2"], {"pads": [1, 1, 1, 1]})
    from glassrt.kernels.onednn.int8_float import _channel_parts

    reaches = 255 * np.abs(w2.astype(np.int64)).sum(axis=(2, 3))  # (x's zero point 0: |x - 0| up to 255)
    assert len(_channel_parts(reaches)) > 1  # (the case is what it claims: conv2 runs in parts)
    np.testing.assert_array_equal(got, _requantized(acc, c["b2"], c["ys1"], c["ws2"], c["ys2"], c["yz2"], U8))
