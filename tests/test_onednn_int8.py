"""The onednn provider's exact 8-bit products (kernels/onednn/int8.py): MatMulInteger and
com.microsoft's DynamicQuantizeLSTM with constant weights, against int64 arithmetic, the
cpu provider's kernels and onnxruntime; and the refusals, each with its reason."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt
from glassrt.kernels.onednn import capi
from tests.test_contrib_quant import LSTM_CONSTS, _ort_one_thread, lstm_inputs, rng_for

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")

I8, U8 = np.int8, np.uint8


def _exact():
    from glassrt.kernels.onednn import int8

    return int8.exact_reason()


needs_vnni = pytest.mark.skipif(capi.UNAVAILABLE is None and _exact() is not None,
                                reason="this CPU has no VNNI/AMX: the kernels refuse (tested below)")


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
    assert "B is not a constant" in str(row) or _exact() is not None
    # a CPU without VNNI: oneDNN's u8 x s8 kernels would saturate, so cpu's exact path runs
    lib = capi.require()
    monkeypatch.setattr(lib, "dnnl_get_effective_cpu_isa", lambda: capi.CPU_ISA["avx512_core"])
    from glassrt.kernels.onednn import int8

    assert "no VNNI" in int8.exact_reason()
    sess = glassrt.InferenceSession(_matmul_integer(b, None, (2, 16), U8, None))
    row = _kernel(sess, "mm")
    assert row["kernel"] == "cpu.MatMulInteger" and "no VNNI" in str(row)
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
    assert "W is not a constant" in str(row) or _exact() is not None
