"""The onednn provider's exact 8-bit products (kernels/onednn/int8.py): MatMulInteger and
com.microsoft's DynamicQuantizeLSTM with constant weights, against int64 arithmetic, the
cpu provider's kernels and onnxruntime; and the refusals, each with its reason."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import int8_exact_reason, skip_without_vnni
from tests.test_contrib_quant import LSTM_CONSTS, _ort_one_thread, lstm_inputs, rng_for

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")

I8, U8 = np.int8, np.uint8


needs_vnni = skip_without_vnni('this CPU has no VNNI/AMX: the kernels refuse (tested below)')


def _codes(rng, dt, shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, shape).astype(dt)


def _matmul_integer(b, bz, a_shape, a_dt, az_shape):
    """MatMulInteger with B and its zero point initializers, A and its zero point inputs."""
    elem = helper.np_dtype_to_tensor_dtype
    inputs = [helper.make_tensor_value_info("a", elem(np.dtype(a_dt)), list(a_shape))]
    names, inits = ["a", "b"], [numpy_helper.from_array(b, "b")]
    if az_shape is not None:
        inputs.append(helper.make_tensor_value_info("az", elem(np.dtype(a_dt)), list(az_shape)))
        names.append("az")
    if bz is not None:
        names += [""] * (3 - len(names)) + ["bz"]
        inits.append(numpy_helper.from_array(bz, "bz"))
    node = helper.make_node("MatMulInteger", names, ["y"], name="mm")
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _kernel(sess, name):
    return {r["name"]: r for r in sess.explain()["nodes"]}[name]


def _reference(a, az, b, bz):
    az = 0 if az is None else (az.reshape(-1, 1) if az.size > 1 else az.reshape(()))
    bz = 0 if bz is None else bz.reshape(-1) if bz.size > 1 else bz.reshape(())
    return ((a.astype(np.int64) - az) @ (b.astype(np.int64) - bz)).astype(np.int32)


CASES = [  # A type, B type, A shape, A's zero point shape (None: omitted), B's zero point shape
    (U8, U8, (5, 300), (), ()),
    (I8, I8, (5, 300), (), None),
    (U8, I8, (2, 5, 300), None, (7,)),
    (I8, U8, (5, 300), (5,), (7,)),
    (U8, U8, (300,), (), ()),
    (U8, I8, (1, 600), (), ()),  # K over a VNNI group of 4 and odd N: the primitive's tails
    (I8, U8, (0, 300), (), ()),  # no rows
]


@needs_vnni
@pytest.mark.parametrize("a_dt,b_dt,a_shape,az_shape,bz_shape", CASES)
def test_matmul_integer_exact(a_dt, b_dt, a_shape, az_shape, bz_shape):
    rng = rng_for("int8-mm", a_dt, b_dt, a_shape, az_shape, bz_shape)
    k = a_shape[-1]
    b = _codes(rng, b_dt, (k, 7))
    bz = None if bz_shape is None else _codes(rng, b_dt, bz_shape)
    a = _codes(rng, a_dt, a_shape)
    az = None if az_shape is None else _codes(rng, a_dt, az_shape)
    m = _matmul_integer(b, bz, a_shape, a_dt, az_shape)
    sess = glassrt.InferenceSession(m)
    assert _kernel(sess, "mm")["kernel"] == "onednn.MatMulInteger.int8"
    feeds = {"a": a, **({"az": az} if az is not None else {})}
    for _ in range(2):  # the second run reuses the bound primitive
        got = sess.run(None, feeds)[0]
        np.testing.assert_array_equal(got, _reference(a, az, b, bz))
    cpu = glassrt.InferenceSession(m, providers=["cpu"]).run(None, feeds)[0]
    np.testing.assert_array_equal(got, cpu)


@needs_vnni
def test_matmul_integer_extremes_are_not_saturated():
    """Where a 16-bit pair sum would saturate (255 * 127 * 2 > 32767) the sums stay exact,
    and a long inner dimension of extreme codes sums to what int64 gives."""
    k = 4096
    for a_val, b_val, b_dt in ((255, 127, I8), (255, -128, I8), (0, 255, U8), (255, 0, U8)):
        a = np.full((3, k), a_val, U8)
        b = np.full((k, 5), b_val, b_dt)
        for bz in (None, np.array(b_val if b_dt == U8 else 0, b_dt)):
            sess = glassrt.InferenceSession(_matmul_integer(b, bz, a.shape, U8, ()))
            az = np.array(0, U8)
            np.testing.assert_array_equal(sess.run(None, {"a": a, "az": az})[0], _reference(a, az, b, bz))


@needs_vnni
def test_matmul_integer_agrees_with_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    rng = rng_for("int8-mm-ort")
    b, bz = _codes(rng, U8, (1024, 300)), np.array(119, U8)
    a, az = _codes(rng, U8, (40, 1024)), np.array(7, U8)
    m = _matmul_integer(b, bz, a.shape, U8, ())
    got = glassrt.InferenceSession(m).run(None, {"a": a, "az": az})[0]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a, "az": az})
    np.testing.assert_array_equal(got, want[0])


def test_empty_weights_go_to_cpu():
    """A B with no inner dimension: the product is zeros; with no columns, empty (cpu's)."""
    for b in (np.zeros((0, 3), I8), np.zeros((4, 0), U8)):
        sess = glassrt.InferenceSession(_matmul_integer(b, None, (2, b.shape[0]), U8, None))
        assert _kernel(sess, "mm")["kernel"] == "cpu.MatMulInteger"
        got = sess.run(None, {"a": np.ones((2, b.shape[0]), U8)})[0]
        np.testing.assert_array_equal(got, np.zeros((2, b.shape[1]), np.int32))


def test_matmul_integer_refusals_say_why(monkeypatch):
    rng = rng_for("int8-refuse")
    b = _codes(rng, U8, (16, 4))
    # B a graph input: cpu runs it
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mm")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 16]),
                                        helper.make_tensor_value_info("b", TensorProto.UINT8, [16, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    row = _kernel(glassrt.InferenceSession(m), "mm")
    assert row["kernel"] == "cpu.MatMulInteger"
    assert "B is not a constant" in str(row) or int8_exact_reason() is not None
    # a CPU without VNNI: oneDNN's u8 x s8 kernels would saturate, so the exact float32
    # product runs (kernels/onednn/int8_float_matmul.py), and explain says why
    lib = capi.require()
    monkeypatch.setattr(lib, "dnnl_get_effective_cpu_isa", lambda: capi.CPU_ISA["avx512_core"])
    from glassrt.kernels.onednn import int8

    assert "no VNNI" in int8.exact_reason()
    sess = glassrt.InferenceSession(_matmul_integer(b, None, (2, 16), U8, None))
    row = _kernel(sess, "mm")
    assert row["kernel"] == "onednn.MatMulInteger.float32" and "no VNNI" in str(row)
    a = _codes(rng, U8, (2, 16))
    np.testing.assert_array_equal(sess.run(None, {"a": a})[0], _reference(a, None, b, None))


def _lstm_model(inputs, consts=LSTM_CONSTS, **attrs):
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    node = helper.make_node("DynamicQuantizeLSTM", names, ["y", "yh", "yc"], domain="com.microsoft", name="lstm",
                            **attrs)
    vis = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))
           for i, (nm, x) in enumerate(zip(names, inputs)) if nm and i not in consts]
    inits = [numpy_helper.from_array(x, nm) for i, (nm, x) in enumerate(zip(names, inputs)) if nm and i in consts]
    graph = helper.make_graph([node], "g", vis, [onnx.ValueInfoProto(name=o) for o in ("y", "yh", "yc")],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    feeds = {nm: x for i, (nm, x) in enumerate(zip(names, inputs)) if nm and i not in consts}
    return model, feeds


@needs_vnni
@pytest.mark.parametrize("tw", [I8, U8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_lstm_on_onednn_is_the_cpu_kernel_bit_for_bit(tw, per_channel):
    rng = rng_for("int8-lstm", tw, per_channel)
    model, feeds = _lstm_model(lstm_inputs(rng, 9, 3, 24, 16, 2, tw, per_channel), hidden_size=16,
                               direction="bidirectional")
    sess = glassrt.InferenceSession(model)
    assert _kernel(sess, "lstm")["kernel"] == "onednn.DynamicQuantizeLSTM.int8"
    cpu = glassrt.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    for _ in range(2):
        got = sess.run(None, feeds)
        for g, c in zip(got, cpu):
            np.testing.assert_array_equal(g, c)
    pytest.importorskip("onnxruntime")
    for g, r in zip(got, _ort_one_thread(model, feeds)):
        np.testing.assert_array_equal(g, r)


def test_dynamic_quantize_lstm_weights_as_inputs_stay_on_cpu():
    rng = rng_for("int8-lstm-inputs")
    model, feeds = _lstm_model(lstm_inputs(rng, 4, 2, 8, 4, 1), consts=(), hidden_size=4)
    row = _kernel(glassrt.InferenceSession(model), "lstm")
    assert row["kernel"] == "cpu.com.microsoft::DynamicQuantizeLSTM"
    assert "W is not a constant" in str(row) or int8_exact_reason() is not None


def _conv_integer(w, wz, x_shape, x_dt, with_xz, **attrs):
    elem = helper.np_dtype_to_tensor_dtype
    inputs = [helper.make_tensor_value_info("x", elem(np.dtype(x_dt)), list(x_shape))]
    names, inits = ["x", "w"], [numpy_helper.from_array(w, "w")]
    if with_xz:
        inputs.append(helper.make_tensor_value_info("xz", elem(np.dtype(x_dt)), []))
        names.append("xz")
    if wz is not None:
        names += [""] * (3 - len(names)) + ["wz"]
        inits.append(numpy_helper.from_array(wz, "wz"))
    node = helper.make_node("ConvInteger", names, ["y"], name="conv", **attrs)
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


CONV_CASES = [  # x type, w type, x shape, w shape, w's zero point shape, attributes
    (U8, U8, (1, 3, 12, 15), (8, 3, 3, 3), (), {"pads": [1, 1, 1, 1]}),
    (U8, U8, (2, 4, 11, 9), (6, 2, 3, 3), (6,), {"group": 2, "strides": [2, 2], "pads": [1, 0, 2, 1]}),
    (I8, I8, (1, 8, 10, 10), (8, 1, 3, 3), None, {"group": 8, "pads": [1, 1, 1, 1]}),  # depthwise
    (I8, U8, (1, 5, 9, 13), (7, 5, 3, 2), (), {"dilations": [2, 1], "auto_pad": "SAME_UPPER"}),
    (U8, I8, (1, 16, 7, 7), (32, 16, 1, 1), (), {}),
    (U8, U8, (1, 1, 64, 160), (24, 1, 3, 3), (), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # ddddocr's first
]


@needs_vnni
@pytest.mark.parametrize("x_dt,w_dt,x_shape,w_shape,wz_shape,attrs", CONV_CASES)
def test_conv_integer_is_the_cpu_kernel_bit_for_bit(x_dt, w_dt, x_shape, w_shape, wz_shape, attrs):
    rng = rng_for("int8-conv", x_dt, w_dt, x_shape, w_shape, wz_shape, str(attrs))
    w = _codes(rng, w_dt, w_shape)
    wz = None if wz_shape is None else _codes(rng, w_dt, wz_shape)
    m = _conv_integer(w, wz, x_shape, x_dt, True, **attrs)
    sess = glassrt.InferenceSession(m)
    assert _kernel(sess, "conv")["kernel"] == "onednn.ConvInteger.int8"
    cpu = glassrt.InferenceSession(m, providers=["cpu"])
    for xz_value in (None, "random"):
        x = _codes(rng, x_dt, x_shape)
        xz = np.array(0 if xz_value is None else _codes(rng, x_dt, ()), x_dt)
        got = sess.run(None, {"x": x, "xz": xz})[0]
        np.testing.assert_array_equal(got, cpu.run(None, {"x": x, "xz": xz})[0])
    ort = pytest.importorskip("onnxruntime")
    if x_dt == U8 and w_dt == U8 and (wz is None or wz.size == 1):  # what onnxruntime implements
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x, "xz": xz})[0]
        np.testing.assert_array_equal(got, want)


def test_conv_integer_refusals_say_why():
    rng = rng_for("int8-conv-refuse")
    node = helper.make_node("ConvInteger", ["x", "w"], ["y"], name="conv")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2, 5, 5]),
                                        helper.make_tensor_value_info("w", TensorProto.UINT8, [4, 2, 3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    row = _kernel(glassrt.InferenceSession(m), "conv")
    assert row["kernel"] == "cpu.ConvInteger" and ("w is not a constant" in str(row) or int8_exact_reason() is not None)
    m1d = _conv_integer(_codes(rng, U8, (4, 2, 3)), None, (1, 2, 9), U8, False)  # a 1-D conv: cpu
    row = _kernel(glassrt.InferenceSession(m1d), "conv")
    assert row["kernel"] == "cpu.ConvInteger" and ("not a 4-D" in str(row) or int8_exact_reason() is not None)


QLINEAR_CASES = [  # x type, w type, per-channel weights, attributes
    (U8, I8, False, {"pads": [1, 1, 1, 1]}),
    (U8, U8, False, {"strides": [2, 2], "pads": [0, 1, 1, 0]}),
    (U8, I8, True, {"group": 2}),
    (I8, I8, True, {"pads": [1, 1, 1, 1], "dilations": [1, 2]}),
]


@needs_vnni
@pytest.mark.parametrize("x_dt,w_dt,per_channel,attrs", QLINEAR_CASES)
def test_qlinear_conv_is_the_cpu_kernel_within_a_code_at_ties(x_dt, w_dt, per_channel, attrs):
    """int8 weights (zero point 0): oneDNN requantizes in float32 as it writes (acc·M + b·M),
    cpu in float64 ((acc + b)·M): a tie rounds the other way now and then, a code apart.
    uint8 weights: oneDNN's int32 sums and cpu's requantization, the same bytes."""
    rng = rng_for("int8-qconv", x_dt, w_dt, per_channel, str(attrs))
    m_out, group = 8, attrs.get("group", 1)
    w = _codes(rng, w_dt, (m_out, 6 // group, 3, 3))
    shape = (m_out,) if per_channel else ()
    w_scale = rng.uniform(0.002, 0.02, shape).astype(np.float32)
    w_zp = (np.zeros(shape, w_dt) if w_dt == I8 else _codes(rng, w_dt, shape))
    consts = {"xs": np.array(0.05, np.float32), "xz": _codes(rng, x_dt, ()), "w": w, "ws": w_scale, "wz": w_zp,
              "ys": np.array(0.2, np.float32), "yz": _codes(rng, x_dt, ()),
              "b": rng.integers(-500, 500, (m_out,)).astype(np.int32)}
    m = _qlinear_conv_model(consts, (1, 6, 9, 11), x_dt, **attrs)
    sess = glassrt.InferenceSession(m)
    assert _kernel(sess, "conv")["kernel"] == "onednn.QLinearConv.int8"
    x = _codes(rng, x_dt, (1, 6, 9, 11))
    got = sess.run(None, {"x": x})[0]
    cpu = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    if w_dt == U8:
        np.testing.assert_array_equal(got, cpu)
    else:
        _within_a_code(got, cpu)
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got.astype(np.int64) - want).max() <= 1  # onnxruntime requantizes in float32: a code apart at most


@needs_vnni
@pytest.mark.parametrize("x_dt", [U8, I8])
def test_qlinear_convs_in_a_row_pass_their_bytes_channels_last(x_dt):
    """Between two QLinearConvs the 8-bit value stays NHWC (oneDNN's int8 layout: no
    transpose on either side, runtime/layout.py); the graph's input and output stay NCHW.
    The codes are the cpu kernels' within one at a tie (see the test above)."""
    rng = rng_for("int8-qconv-chain", x_dt)

    def conv(name, x, y, c_in, c_out, **attrs):
        consts = {f"{name}_w": _codes(rng, I8, (c_out, c_in, 3, 3)),
                  f"{name}_ws": rng.uniform(0.002, 0.02, (c_out,)).astype(np.float32),
                  f"{name}_wz": np.zeros((c_out,), I8), f"{name}_ys": np.array(0.1, np.float32),
                  f"{name}_yz": _codes(rng, x_dt, ()), f"{name}_b": rng.integers(-500, 500, (c_out,)).astype(np.int32)}
        node = helper.make_node("QLinearConv", [x, "xs", "xz", f"{name}_w", f"{name}_ws", f"{name}_wz", f"{name}_ys",
                                                f"{name}_yz", f"{name}_b"], [y], name=name, pads=[1, 1, 1, 1], **attrs)
        return node, consts

    n1, c1 = conv("conv1", "x", "h", 6, 16)
    n2, c2 = conv("conv2", "h", "y", 16, 16, strides=[2, 2])
    consts = {"xs": np.array(0.05, np.float32), "xz": _codes(rng, x_dt, ()), **c1, **c2}
    m = _qlinear_model([n1, n2], consts, (1, 6, 20, 18), x_dt)
    sess = glassrt.InferenceSession(m)
    x = _codes(rng, x_dt, (1, 6, 20, 18))
    got = sess.run(None, {"x": x})[0]
    plan = next(iter(sess.runner.plans.values()))
    assert plan.layouts == {"h": "nhwc"}  # x and y are the graph's: NCHW
    _within_a_code(got, glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0])


@needs_vnni
def test_qlinear_conv_with_uint8_weights_requantizes_in_one_pass_as_cpu_does(monkeypatch):
    """uint8 weights (zero point 128): oneDNN's exact int32 sums, then one compiled pass of
    cpu's float64 requantization (padding, x's zero point, the bias): cpu's bytes, as the
    NumPy steps give them without Numba."""
    pytest.importorskip("numba")
    from glassrt.kernels.cpu import _jit

    rng = rng_for("int8-qconv-u8w")
    consts = {"xs": np.array(0.05, np.float32), "xz": np.array(77, U8), "w": _codes(rng, U8, (12, 5, 3, 3)),
              "ws": np.array(0.004, np.float32), "wz": np.array(128, U8), "ys": np.array(0.3, np.float32),
              "yz": np.array(140, U8), "b": rng.integers(-900, 900, (12,)).astype(np.int32)}
    m = _qlinear_conv_model(consts, (1, 5, 13, 10), pads=[1, 0, 1, 2])
    x = _codes(rng, U8, (1, 5, 13, 10))
    cpu = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    for compiled in (True, False):
        monkeypatch.setattr(_jit, "use_compiled", lambda path, after=64, c=compiled: c)
        sess = glassrt.InferenceSession(m)
        assert _kernel(sess, "conv")["kernel"] == "onednn.QLinearConv.int8"
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu)


def _requantizing_consts(rng, c_in, c_out):
    """A 3x3 QLinearConv's constants as quantize_static writes them (int8 weights of zero
    point 0, scales per filter, an int32 bias): the requantizing convolution's case."""
    return {"xs": np.array(0.02, np.float32), "xz": np.array(119, U8), "w": _codes(rng, I8, (c_out, c_in, 3, 3)),
            "ws": rng.uniform(0.001, 0.01, (c_out,)).astype(np.float32), "wz": np.zeros((c_out,), I8),
            "ys": np.array(0.15, np.float32), "yz": np.array(131, U8),
            "b": rng.integers(-3000, 3000, (c_out,)).astype(np.int32)}


def _qlinear_conv_model(consts, x_shape, x_dt=U8, **attrs):
    """One QLinearConv node 'conv' reading graph input x and the constants xs, xz, w, ws, wz,
    ys, yz, b; its output y of x's type."""
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], name="conv",
                            **attrs)
    return _qlinear_model([node], consts, x_shape, x_dt)


def _qlinear_model(nodes, consts, x_shape, x_dt):
    """`nodes` reading graph input x (of x_dt) and the initializers `consts`, writing y of x's type."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(x_dt))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, list(x_shape))],
                          [helper.make_tensor_value_info("y", elem, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@needs_vnni
@pytest.mark.parametrize("ta", [U8, I8])
@pytest.mark.parametrize("m, per_column, alpha, c_shape", [
    (1, True, 1.0, (300,)), (7, False, 0.5, None), (3, True, 2.0, (1,)), (2, False, 1.0, (1, 300)), (1, True, 1.0, ())])
def test_qgemm_with_zero_point_free_int8_weights_requantizes_on_onednn(monkeypatch, ta, m, per_column, alpha, c_shape):
    """QGemm as quantize_static writes a classifier (B int8, zero point 0, every parameter a
    constant): one oneDNN matmul that requantizes as it writes; at most a code from cpu's
    kernel and onnxruntime's (at a rounding tie), and rarely."""
    from glassrt.kernels.onednn.int8 import Int8Weights
    from tests.test_contrib_quant import _model, _ort, _qgemm_inputs

    calls = []
    real = Int8Weights.requantized
    monkeypatch.setattr(Int8Weights, "requantized", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    rng = rng_for("qgemm-requantized", ta, m, per_column, c_shape)
    ins = _qgemm_inputs(rng, ta, I8, m, 1280, 300, 0, 1, per_column, c_shape, True)
    ins[5] = np.zeros_like(ins[5])  # B's zero point
    model, feeds = _model("QGemm", ins, consts=set(range(1, len(ins))), alpha=alpha, transB=1)
    got = glassrt.InferenceSession(model).run(None, feeds)[0]
    assert calls and got.dtype == ta and got.shape == (m, 300)
    _within_a_code(got, glassrt.InferenceSession(model, providers=["cpu"]).run(None, feeds)[0], share=1e-2)
    _within_a_code(got, _ort(model, feeds, True)[0], share=1e-2)


@needs_vnni
def test_qgemm_with_c_per_row_keeps_the_exact_sums(monkeypatch):
    """A C that broadcasts along rows (M, 1) is not the per-column bias oneDNN adds: that
    QGemm keeps the exact int32 sums and cpu's float32 steps (the same bytes)."""
    from glassrt.kernels.onednn.int8 import Int8Weights
    from tests.test_contrib_quant import _model, _ort, _qgemm_inputs

    rng = rng_for("qgemm-c-per-row")
    ins = _qgemm_inputs(rng, U8, I8, 5, 64, 5, 0, 1, True, (5, 1), True)
    ins[5] = np.zeros_like(ins[5])
    model, feeds = _model("QGemm", ins, consts=set(range(1, len(ins))), transB=1)
    called = []
    real = Int8Weights.requantized
    monkeypatch.setattr(Int8Weights, "requantized", lambda self, *a, **k: called.append(1) or real(self, *a, **k))
    got = glassrt.InferenceSession(model).run(None, feeds)[0]
    assert not called
    np.testing.assert_array_equal(got, _ort(model, feeds, True)[0])


def _within_a_code(got, want, share=1e-3):
    """8-bit outputs requantized in another float order: at most a code apart, and rarely."""
    d = np.abs(got.astype(np.int64) - want)
    assert d.max() <= 1 and np.count_nonzero(d) <= share * d.size + 1, (d.max(), np.count_nonzero(d))


@needs_vnni
def test_qlinear_conv_requantized_by_onednn_rarely_moves_a_code():
    """A 3x3 conv of 32 to 64 channels on random codes: oneDNN's float32 output stage and
    cpu's float64 requantization agree but at a few ties; onnxruntime's float32 ((acc + b)·M)
    sits as close."""
    rng = rng_for("int8-qconv-ties")
    m = _qlinear_conv_model(_requantizing_consts(rng, 32, 64), (1, 32, 56, 56), pads=[1, 1, 1, 1])
    x = _codes(rng, U8, (1, 32, 56, 56))
    got = glassrt.InferenceSession(m).run(None, {"x": x})[0]
    _within_a_code(got, glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0], share=1e-4)
    ort = pytest.importorskip("onnxruntime")
    _within_a_code(got, ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0], share=1e-4)


@pytest.mark.parametrize("attrs,lens", [({}, None), ({"clip": 0.6}, None), ({"input_forget": 1}, None),
                                        ({}, np.array([5, 2, 0], np.int32)), ({"direction": "bidirectional"}, None)])
@pytest.mark.parametrize("weights", [(I8, False), (U8, False), (I8, True)])
def test_lstm_compiled_step_is_the_numpy_steps_bit_for_bit(monkeypatch, attrs, lens, weights):
    """Without peepholes and with the default activations a step's gates run as one compiled
    pass (kernels/cpu/lstm_cell.py), and without sequence_lens every step of a direction in
    one compiled call (the quantization of h, the integer product, the gates): the NumPy
    steps' bits, and onnxruntime's; int8 and uint8 weights (zero points not 0), per tensor
    and per channel."""
    pytest.importorskip("numba")  # imported: the compiled step runs from the first call (_jit.use_compiled)
    from glassrt.kernels.cpu import lstm_cell

    tw, per_channel = weights
    rng = rng_for("lstm-cell", str(attrs), lens is None, str(weights))
    num_dir = 2 if attrs.get("direction") == "bidirectional" else 1
    inputs = lstm_inputs(rng, 6, 3, 10, 8, num_dir, tw=tw, per_channel=per_channel, lens=lens)
    inputs[7] = None  # no peepholes
    model, feeds = _lstm_model(inputs, hidden_size=8, **attrs)
    calls = []
    for name in ("lstm_cell", "dq_recurrence"):
        real = getattr(lstm_cell, name)
        monkeypatch.setattr(lstm_cell, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    compiled = glassrt.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    assert calls and set(calls) == {"lstm_cell" if lens is not None else "dq_recurrence"}, calls
    monkeypatch.setattr(lstm_cell, "available", lambda: False)
    steps = glassrt.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    for c, s in zip(compiled, steps):
        np.testing.assert_array_equal(c, s)
    pytest.importorskip("onnxruntime")
    for c, r in zip(compiled, _ort_one_thread(model, feeds)):
        np.testing.assert_array_equal(c, r)


def test_lstm_cell_carries_nan_and_infinities_as_the_numpy_steps():
    from glassrt.kernels import mlas_math
    pytest.importorskip("numba")  # imported: the compiled step runs from the first call (_jit.use_compiled)
    from glassrt.kernels.cpu import lstm_cell

    rng = np.random.default_rng(3)
    h = 16
    g = (rng.standard_normal((3, 4 * h)) * 6).astype(np.float32)
    g[0, :8] = [np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, 20.0]
    g[1, 3 * h:3 * h + 4] = [np.nan, np.inf, -np.inf, -0.0]
    c = rng.standard_normal((3, h)).astype(np.float32)
    c[2, :3] = [np.nan, np.inf, -np.inf]
    b_iof, b_c = rng.standard_normal(3 * h).astype(np.float32), rng.standard_normal(h).astype(np.float32)
    for bias in (True, False):
        for lo, hi in ((-3.4e38, 3.4e38), (-0.6, 0.6)):
            for input_forget in (False, True):
                bi, bc = (b_iof, b_c) if bias else (None, None)
                lo32, hi32 = np.float32(lo), np.float32(hi)

                def gate(v, b):
                    return np.fmax(np.fmin(v + b if b is not None else v, hi32), lo32)

                iof = mlas_math.logistic(gate(g[:, :3 * h], bi))
                i, o, f = iof[:, :h], iof[:, h:2 * h], iof[:, 2 * h:]
                if input_forget:
                    f = np.float32(1) - i
                c_ref = c * f + i * mlas_math.tanh(gate(g[:, 3 * h:], bc))
                h_ref = mlas_math.tanh(c_ref) * o
                c_new, h_new = lstm_cell.lstm_cell(g, bi, bc, c, lo, hi, input_forget)
                np.testing.assert_array_equal(c_new, c_ref)
                np.testing.assert_array_equal(h_new, h_ref)
                assert np.array_equal(np.signbit(h_new), np.signbit(h_ref))


def test_lstm_directions_run_side_by_side_with_the_same_bits(monkeypatch):
    """A bidirectional node's two compiled recurrences run on two threads where the session
    has two (the second on a helper thread), the same bits as one after the other."""
    pytest.importorskip("numba")
    from glassrt.kernels import run_threads

    rng = rng_for("lstm-directions")
    inputs = lstm_inputs(rng, 7, 2, 12, 16, 2)
    inputs[7] = None  # no peepholes
    model, feeds = _lstm_model(inputs, hidden_size=16, direction="bidirectional")
    monkeypatch.setattr(run_threads, "_second", [])  # (no helper thread yet)
    one = glassrt.InferenceSession(model, sess_options=glassrt.SessionOptions(intra_op_num_threads=1,
                                                                              adaptive_threads=False))
    first = one.run(None, feeds)
    assert not run_threads._second  # one thread: one direction after the other
    two = glassrt.InferenceSession(model, sess_options=glassrt.SessionOptions(intra_op_num_threads=2,
                                                                              adaptive_threads=False))
    for a, b in zip(first, two.run(None, feeds)):
        np.testing.assert_array_equal(a, b)
    assert run_threads._second, "the second direction did not run on the helper thread"


@pytest.mark.parametrize("dt", [U8, I8])
@pytest.mark.parametrize("attrs", [{"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1]},
                                   {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]},
                                   {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
                                   {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1]}])
def test_8bit_max_pooling_on_onednn_is_cpus_exactly(dt, attrs):
    """MaxPool of 8-bit values (a quantized CNN's: YOLO's SPPF) on oneDNN, plain and between
    two channels-last values, against cpu's kernel: a maximum of bytes, padding never wins."""
    rng = rng_for("int8-maxpool", dt, str(attrs))
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    x = _codes(rng, dt, (2, 5, 11, 9))
    alone = helper.make_model(helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)], "g",
        [helper.make_tensor_value_info("x", elem, list(x.shape))], [helper.make_tensor_value_info("y", elem, None)]),
        opset_imports=[helper.make_opsetid("", 13)])
    alone.ir_version = 8
    sess = glassrt.InferenceSession(alone)
    assert _kernel(sess, "pool")["kernel"] == "onednn.MaxPool.pool8"
    cpu = glassrt.InferenceSession(alone, providers=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], cpu)
    # between two QLinearConvs (1x1, identity-like weights): the pooled value stays NHWC
    if not exact_ok():
        return
    consts = {"s": np.array(0.05, np.float32), "z": np.array(0 if dt == U8 else -3, dt), "w": np.eye(5, dtype=np.int8).reshape(5, 5, 1, 1) * 20,
              "ws": np.array(0.05 / 20, np.float32), "wz": np.zeros((), np.int8)}
    nodes = [helper.make_node("QLinearConv", ["x", "s", "z", "w", "ws", "wz", "s", "z"], ["a"], name="c1"),
             helper.make_node("MaxPool", ["a"], ["p"], name="pool", **attrs),
             helper.make_node("QLinearConv", ["p", "s", "z", "w", "ws", "wz", "s", "z"], ["y"], name="c2")]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, list(x.shape))],
                                            [helper.make_tensor_value_info("y", elem, None)],
                                            [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    sess = glassrt.InferenceSession(m)
    got = sess.run(None, {"x": x})[0]
    plan = next(iter(sess.runner.plans.values()))
    assert plan.layouts.get("a") == "nhwc" and plan.layouts.get("p") == "nhwc"
    _within_a_code(got, glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0])


def exact_ok():
    return int8_exact_reason() is None


@needs_vnni
def test_qlinear_conv_parameters_fed_at_run_time_are_checked_as_cpu_checks_them():
    """x_scale / x_zero_point as graph inputs: a zero point of two values, or of x's other
    signedness, is a node error naming them (as on cpu's kernel), never a silent first value."""
    rng = rng_for("int8-qconv-params")
    consts = {"w": _codes(rng, I8, (8, 6, 3, 3)), "ws": np.full(8, 0.01, np.float32), "wz": np.zeros(8, I8),
              "ys": np.array(0.2, np.float32), "yz": np.array(3, U8)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="conv",
                            pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 6, 9, 11]),
                                        helper.make_tensor_value_info("xs", TensorProto.FLOAT, None),
                                        helper.make_tensor_value_info("xz", TensorProto.UINT8, None)],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = _codes(rng, U8, (1, 6, 9, 11))
    sess = glassrt.InferenceSession(m)
    good = sess.run(None, {"x": x, "xs": np.array(0.05, np.float32), "xz": np.array(3, U8)})[0]
    # (placement saw the scales' shapes unknown; the plan, whose shapes are concrete, asked oneDNN again)
    assert [st.kernel.name for p in sess.runner.plans.values() for st in p.steps] == ["onednn.QLinearConv.int8"]
    cpu = glassrt.InferenceSession(m, providers=["cpu"])
    _within_a_code(good, cpu.run(None, {"x": x, "xs": np.array(0.05, np.float32), "xz": np.array(3, U8)})[0])
    for xs, xz in ((np.array(0.05, np.float32), np.array([3, 4], U8)), (np.array([0.05, 0.1], np.float32), np.array(3, U8))):
        with pytest.raises(glassrt.GlassrtError, match="conv"):
            sess.run(None, {"x": x, "xs": xs, "xz": xz})
        with pytest.raises(glassrt.GlassrtError, match="conv"):
            cpu.run(None, {"x": x, "xs": xs, "xz": xz})


@needs_vnni
@pytest.mark.parametrize("ta, tb", [(U8, I8), (I8, I8), (U8, U8)])
@pytest.mark.parametrize("trans_a, trans_b, per_column, alpha, quantized", [
    (0, 1, True, 1.0, True), (0, 0, False, 0.5, True), (1, 1, False, 2.0, False), (0, 1, True, 1.0, False)])
def test_qgemm_on_onednn_is_cpus_bytes(ta, tb, trans_a, trans_b, per_column, alpha, quantized):
    """QGemm with a constant B: the int32 sums on oneDNN's exact matmul (B's zero point
    compensated), cpu's float32 steps after: the same bytes as cpu's kernel and onnxruntime's."""
    from tests.test_contrib_quant import _model, _ort, _qgemm_inputs

    rng = rng_for("qgemm-onednn", ta, tb, trans_a, trans_b, per_column, quantized)
    ins = _qgemm_inputs(rng, ta, tb, 7, 300, 65, trans_a, trans_b, per_column, (65,), quantized)
    model, feeds = _model("QGemm", ins, consts=set(range(1, len(ins))), alpha=alpha, transA=trans_a,
                          transB=trans_b)
    sess = glassrt.InferenceSession(model)
    assert {r["name"]: r["kernel"] for r in sess.explain()["nodes"]}["node"] == "onednn.QGemm.int8"
    got = sess.run(None, feeds)[0]
    np.testing.assert_array_equal(got, glassrt.InferenceSession(model, providers=["cpu"]).run(None, feeds)[0])
    np.testing.assert_array_equal(got, _ort(model, feeds, True)[0])


@needs_vnni
@pytest.mark.parametrize("requantizing", [True, False])
def test_int8_convolution_runs_on_a_descriptor_made_for_the_runs_thread_count(monkeypatch, requantizing):
    """oneDNN fixes how many threads a convolution starts when its descriptor is made: a run
    under one OpenMP thread (a 1-thread session, the thread choice under load) must not use
    the descriptor placement made under two (it ran on two: 116 us a call where one thread
    takes 227, a 1x1 conv of 16 to 96 channels at 112x112)."""
    from glassrt.kernels.onednn import dnnl, int8

    made = []
    real = dnnl.convolution
    monkeypatch.setattr(dnnl, "convolution", lambda *a, **k: made.append(capi.get_max_threads()) or real(*a, **k))
    rng = rng_for("int8-conv-threads", requantizing)
    w = _codes(rng, I8, (24, 16, 1, 1))
    before = capi.get_max_threads()
    try:
        capi.set_num_threads(2)
        shape = (1, 16, 9, 7 + requantizing)  # (a geometry no other test makes: its descriptors are new)
        if requantizing:
            conv = int8._RequantizingConv(shape, w, 1, [1, 1], [1, 1], [0, 0], [0, 0], U8, True, True)
            y = np.empty((1, 9, shape[3], 24), U8)
            run = lambda: conv.run(_codes(rng, U8, (1, 9, shape[3], 16)), (3, np.full(24, 0.01, np.float32),  # noqa: E731
                                                                               np.zeros(24, np.float32), 5), y)
        else:
            conv = int8._Int8Conv(shape, w, 1, [1, 1], [1, 1], [0, 0], [0, 0])
            run = lambda: conv.run(_codes(rng, U8, (1, 9, shape[3], 16)))  # noqa: E731
        assert made == [2]
        capi.set_num_threads(1)
        run()
        assert made == [2, 1]  # a descriptor of its own for one thread
        capi.set_num_threads(2)
        run()
        assert made == [2, 1]  # (the first one's, kept)
    finally:
        capi.set_num_threads(before)


def test_conv_integer_to_float_numpy_twin_is_the_compiled_pass_bit_for_bit():
    """The exact-sums path's output step (older quantize_dynamic models) runs as NumPy until
    the process has Numba: the same bits as the compiled pass, wrapping int32 sums included."""
    pytest.importorskip("numba")
    from glassrt.kernels.onednn import int8

    rng = rng_for("conv-integer-to-float-twin")
    n, h, w, m = 2, 3, 5, 7
    acc = rng.integers(-2**31, 2**31 - 1, (n, h, w, m), dtype=np.int64).astype(np.int32)
    acc[0, 0, 0, :3] = [2**31 - 1, -2**31, 0]
    c1 = rng.integers(-2**20, 2**20, (h, w, m), dtype=np.int32)
    ibias = rng.integers(-2**31, 2**31 - 1, m, dtype=np.int64).astype(np.int32)
    scale = rng.uniform(1e-6, 1e-2, m).astype(np.float32)
    fbias = rng.standard_normal(m).astype(np.float32)
    for xz, has_fbias in ((0, False), (255, True), (131, False)):
        got, want = (np.empty((n, m, h, w), np.float32) for _ in range(2))
        int8._dequantize_nhwc_numpy(acc, xz, c1, ibias, scale, fbias, has_fbias, got.transpose(0, 2, 3, 1))
        int8._dequantize_nhwc(acc, xz, c1, ibias, scale, fbias, has_fbias, want.transpose(0, 2, 3, 1))
        assert got.tobytes() == want.tobytes()



@needs_vnni
def test_requantizing_conv_is_made_once_per_binding_context(monkeypatch):
    """Placement asks the kernel's reason on its own context (once); a plan asks the reason
    and binds the kernel with one context: one requantizing convolution made there, not two."""
    from glassrt.kernels.onednn import int8

    rng = rng_for("int8-requantizing-once")
    m = _qlinear_conv_model(_requantizing_consts(rng, 8, 16), (1, 8, 10, 10), pads=[1, 1, 1, 1])
    made = []
    real = int8._make_requantizing
    monkeypatch.setattr(int8, "_make_requantizing", lambda ctx, g: made.append(1) or real(ctx, g))
    sess = glassrt.InferenceSession(m)
    at_placement = len(made)
    sess.run(None, {"x": _codes(rng, U8, (1, 8, 10, 10))})
    assert at_placement == 1 and len(made) == 2
    assert [st.kernel.name for p in sess.runner.plans.values() for st in p.steps] == ["onednn.QLinearConv.int8"]


@needs_vnni
@pytest.mark.parametrize("x_dt,x_layout", [(U8, "nhwc"), (U8, "nchw"), (I8, "nhwc")])
def test_a_replayed_qlinear_conv_step_reads_the_values_its_arrays_hold_now(monkeypatch, x_dt, x_layout):
    """The requantizing conv's step called again with the very arrays of its last call (a
    plan's channels-last arena views) only executes its primitive; an input it copies (a
    plain NCHW one, transposed; an int8 one, shifted) never replays. Each call's bytes are
    the cpu kernel's for what the input holds then, changed in place between calls."""
    from glassrt.kernels.onednn import int8 as onednn_int8
    from glassrt.runtime.layout import channels_last_view

    replays = []
    real = onednn_int8._RequantizingConv.replay
    monkeypatch.setattr(onednn_int8._RequantizingConv, "replay",
                        lambda self, step: replays.append(real(self, step)) or replays[-1])
    rng = rng_for("int8-qconv-replay")
    consts = _requantizing_consts(rng, 8, 16)
    if x_dt == I8:
        consts["xz"], consts["yz"] = np.array(-9, I8), np.array(3, I8)
    m = _qlinear_conv_model(consts, (1, 8, 10, 10), x_dt=x_dt, pads=[1, 1, 1, 1])
    so = glassrt.SessionOptions()
    so.intra_op_num_threads, so.adaptive_threads = 1, False
    fast = glassrt.InferenceSession(m, so)
    cpu = glassrt.InferenceSession(m, so, providers=["cpu"])
    fast.run(None, {"x": _codes(rng, x_dt, (1, 8, 10, 10))})
    (plan,) = fast.runner.plans.values()
    (conv,) = plan.steps
    assert conv.kernel.name == "onednn.QLinearConv.int8"
    x = channels_last_view(np.empty(800, x_dt), (1, 8, 10, 10)) if x_layout == "nhwc" else np.empty((1, 8, 10, 10), x_dt)
    out = channels_last_view(np.empty(1600, x_dt), (1, 16, 10, 10))
    consts_in_order = [np.asarray(consts[k]) for k in ("xs", "xz", "w", "ws", "wz", "ys", "yz", "b")]
    for _ in range(4):
        x[...] = _codes(rng, x_dt, x.shape)
        want = cpu.run(None, {"x": np.ascontiguousarray(x)})[0]
        conv.fn(x, *consts_in_order, out=out)
        _within_a_code(out, want, share=1e-2)
    assert any(replays) == (x_dt == U8 and x_layout == "nhwc"), replays


@needs_vnni
def test_qlinear_conv_verdict_is_reached_once_per_types_and_constants(monkeypatch):
    """Placement judges an 8-bit conv (on its stand-in batch of 1, three times), and a plan
    for batch 1 finds that verdict rather than reaching it again; a plan for batch 2, other
    types, reaches its own; a context with other constants of the same types, its own."""
    from dataclasses import replace

    from glassrt.ir import TensorType
    from glassrt.kernels.onednn import int8
    from glassrt.kernels.registry import BindContext

    rng = rng_for("int8-qconv-verdict")
    consts = _requantizing_consts(rng, 8, 16)
    m = _qlinear_conv_model(consts, ("batch", 8, 12, 12), pads=[1, 1, 1, 1])
    reference = glassrt.InferenceSession(m)
    xs = [_codes(rng, U8, (n, 8, 12, 12)) for n in (1, 1, 2, 2)]
    want = [reference.run(None, {"x": x})[0] for x in xs]
    reached = []
    now = int8._qlinear_conv_reason_now
    monkeypatch.setattr(int8, "_qlinear_conv_reason_now", lambda ctx: reached.append(ctx.shape(0)) or now(ctx))
    sess = glassrt.InferenceSession(m)
    assert sess.placement.decisions["conv"].provider == "onednn"
    assert reached == [(1, 8, 12, 12)]  # (asked three times)
    for x, y in zip(xs, want):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], y)
    assert reached == [(1, 8, 12, 12), (2, 8, 12, 12)]

    # a verdict is kept with the constants it read: the same types with another array, its own
    node = sess.placement.decisions["conv"].node
    types = [sess.placement.graph.types.get(i) for i in node.inputs], [TensorType(U8, (1, 16, 12, 12))]
    w = np.zeros((16, 8, 3, 3), I8)
    ctx = BindContext(node, dict(node.attrs), *types, [None, None, None, w] + [None] * 5)
    assert ctx.verdict("probe", lambda: "first") == "first"
    assert replace(ctx, layouts={}).verdict("probe", lambda: "again") == "first"  # (its derived contexts share them)
    assert BindContext(node, dict(node.attrs), *types, [None, None, None, w.copy()] + [None] * 5,
                       verdicts=ctx.verdicts).verdict("probe", lambda: "its own") == "its own"


def _zero_points_fed(consts, x_shape, x_dt, **attrs):
    """_qlinear_conv_model with xz and yz as graph inputs (fed at run time) instead of constants."""
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], name="conv",
                            **attrs)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(x_dt))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, list(x_shape)),
                                        helper.make_tensor_value_info("xz", elem, []),
                                        helper.make_tensor_value_info("yz", elem, [])],
                          [helper.make_tensor_value_info("y", elem, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()
                           if k not in ("xz", "yz")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@needs_vnni
@pytest.mark.parametrize("x_dt,xz,yz,made_with", [
    (U8, 0, 0, (False, False)), (U8, 0, 131, (False, True)), (U8, 119, 0, (True, False)), (I8, 0, 0, (True, False))])
def test_a_conv_whose_zero_points_are_constant_zeros_is_made_without_them(monkeypatch, x_dt, xz, yz, made_with):
    """A depthwise QLinearConv (as MobileNetV2's, between ReLU6s) whose x and y zero points
    are constant zeros: its primitive takes no zero point (oneDNN's faster depthwise kernel
    takes none). An int8 x is read as uint8 with zero point 128, so it keeps x's. The bytes
    are those of the same conv fed the same zero points at run time (made with both), and
    onnxruntime's within a code."""
    from glassrt.kernels.onednn import int8

    rng = rng_for("int8-qconv-zero-points", x_dt, xz, yz)
    c, shape = 64, (1, 64, 14, 14)
    consts = {"xs": np.array(0.02, np.float32), "xz": np.array(xz, x_dt), "w": _codes(rng, I8, (c, 1, 3, 3)),
              "ws": rng.uniform(0.001, 0.01, (c,)).astype(np.float32), "wz": np.zeros((c,), I8),
              "ys": np.array(0.05, np.float32), "yz": np.array(yz, x_dt),
              "b": rng.integers(-3000, 3000, (c,)).astype(np.int32)}
    made, convs = [], []
    real = int8._RequantizingConv.__init__

    def record(self, *a, **k):
        real(self, *a, **k)
        made.append((self.x_zero_point, self.y_zero_point))
        convs.append(self)

    monkeypatch.setattr(int8._RequantizingConv, "__init__", record)
    attrs = {"group": c, "pads": [1, 1, 1, 1]}
    m = _qlinear_conv_model(consts, shape, x_dt, **attrs)
    x = _codes(rng, x_dt, shape)
    got = glassrt.InferenceSession(m).run(None, {"x": x})[0]
    assert set(made) == {made_with}
    from glassrt.kernels.onednn.capi import ARG_ATTR_ZERO_POINTS
    from glassrt.kernels.onednn.dnnl import ARG_DST, ARG_SRC

    bound = [c.current_step() for c in convs if c.current_step() is not None]
    assert bound and all((ARG_ATTR_ZERO_POINTS | ARG_SRC in st.mems, ARG_ATTR_ZERO_POINTS | ARG_DST in st.mems)
                         == made_with for st in bound)  # (the primitive the run bound takes just those)
    made.clear()
    fed = glassrt.InferenceSession(_zero_points_fed(consts, shape, x_dt, **attrs)).run(
        None, {"x": x, "xz": np.array(xz, x_dt), "yz": np.array(yz, x_dt)})[0]
    assert set(made) == {(True, True)}
    np.testing.assert_array_equal(got, fed)
    ort = pytest.importorskip("onnxruntime")
    _within_a_code(got, ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0])
