"""A QDQ CNN (onnxruntime.quantization.quantize_static, QuantFormat.QDQ) runs its layers as
integer ones (passes/fuse_qdq_conv.py): Conv between DequantizeLinear and QuantizeLinear
becomes QLinearConv, Add likewise QLinearAdd, as onnxruntime's QDQ transformer makes them;
the outputs are onnxruntime's within a quantization step; left alone where the program or
the engine differs."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import init, model, skip_without_vnni, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")
RNG = np.random.default_rng(21)
SHAPE = [1, 8, 20, 24]


needs_vnni = skip_without_vnni()


def _float_cnn():
    """conv 3x3 + Relu -> conv 1x1 -> + x (a residual block) -> conv 3x3 stride 2 -> SiLU
    (x · Sigmoid(x), as YOLO exports write it) -> LeakyRelu."""
    w = lambda *s: (RNG.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    b = lambda n: (RNG.standard_normal(n) * 0.1).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
             helper.make_node("Add", ["c2", "x"], ["s"], name="residual"),
             helper.make_node("Conv", ["s", "w3", "b3"], ["c3"], name="conv3", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Sigmoid", ["c3"], ["sig"], name="sigmoid"),
             helper.make_node("Mul", ["c3", "sig"], ["silu"], name="silu"),
             helper.make_node("LeakyRelu", ["silu"], ["y"], name="leaky", alpha=0.1)]
    return model(nodes, [tensor("x", SHAPE)], [tensor("y", None)],
                 [init("w1", w(8, 8, 3, 3)), init("b1", b(8)), init("w2", w(8, 8, 1, 1)), init("b2", b(8)),
                  init("w3", w(16, 8, 3, 3)), init("b3", b(16))], opset=13, ir_version=8)


def _quantized(tmp_path, weight_type="QInt8", per_channel=True, float_model=None, quant_format="QDQ"):
    pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": RNG.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    src, dst = tmp_path / "f32.onnx", tmp_path / "qdq.onnx"
    onnx.save(float_model or _float_cnn(), src)
    quantize_static(str(src), str(dst), Reader(), quant_format=getattr(QuantFormat, quant_format),
                    per_channel=per_channel,
                    activation_type=QuantType.QUInt8, weight_type=getattr(QuantType, weight_type))
    return onnx.load(dst)


def _ops(sess):
    return sorted(n.op_type for n in sess.placement.graph.nodes)


def _run_ort(m, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _step(m):
    """The output's quantization step (its last DequantizeLinear's scale)."""
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    last = next(n for n in m.graph.node if m.graph.output[0].name in n.output)
    return float(consts[last.input[1]])


@needs_vnni
@pytest.mark.parametrize("per_channel", [True, False])
def test_a_qdq_cnn_runs_integer_layers_as_onnxruntime_does(tmp_path, per_channel):
    m = _quantized(tmp_path, per_channel=per_channel)
    sess = glassrt.InferenceSession(m)
    ops = _ops(sess)
    assert ops.count("QLinearConv") == 3 and ops.count("QLinearAdd") == 1 and "Conv" not in ops
    # the SiLU's Sigmoid and Mul became QLinearSigmoid and QLinearMul, then one table (fuse_lookup)
    assert ops.count("LookupTable") == 1 and ops.count("QLinearLeakyRelu") == 1
    assert not {"Sigmoid", "Mul", "LeakyRelu", "Add"} & set(ops)
    rows = {r["name"]: r for r in sess.explain()["nodes"]}
    assert rows["conv1"]["kernel"] == "onednn.QLinearConv.int8" and "Conv 'conv1'" in rows["conv1"]["origin"]
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    got, step = sess.run(None, {"x": x})[0], _step(m)
    # every 8-bit value stays channels-last, from the input's QuantizeLinear to the output's DequantizeLinear
    plan = next(iter(sess.runner.plans.values()))
    eight_bit = [st.node.outputs[0] for st in plan.steps if st.node.op_type != "DequantizeLinear"]
    assert eight_bit and all(plan.layouts.get(v) == "nhwc" for v in eight_bit), plan.layouts
    # onnxruntime's integer layers: a step apart at most, at a tie; the float program (fake
    # quantization, fusion off), which onnxruntime's layers leave as far: a tie moved before a
    # Mul or a Sigmoid can come out two steps apart
    plain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(fusion=False))
    assert "QLinearConv" not in _ops(plain)
    for want, steps in ((_run_ort(m, x), 1), (plain.run(None, {"x": x})[0], 2)):
        diff = np.abs(got - want)
        assert diff.max() <= steps * step * 1.01 and np.count_nonzero(diff) <= 0.02 * diff.size


@needs_vnni
def test_uint8_weights_stay_float(tmp_path):
    m = _quantized(tmp_path, weight_type="QUInt8", per_channel=False)
    ops = _ops(glassrt.InferenceSession(m))
    assert "QLinearConv" not in ops and ops.count("QLinearAdd") == 1  # the Add's operands are activations


@needs_vnni
def test_a_conv_whose_float_result_is_read_elsewhere_stays_float(tmp_path):
    m = _quantized(tmp_path)
    conv_out = next(n for n in m.graph.node if n.op_type == "Conv" and n.name.startswith("conv3")).output[0]
    m.graph.node.append(helper.make_node("Identity", [conv_out], ["raw"], name="peek"))
    m.graph.output.append(tensor("raw", None))
    sess = glassrt.InferenceSession(m)
    assert _ops(sess).count("QLinearConv") == 2 and "Conv" in _ops(sess)
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[1], _run_ort_all(m, x)[1], rtol=1e-4, atol=1e-4)


def _run_ort_all(m, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the float Conv's own value
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_it_does_not_fire_without_an_exact_int8_engine(tmp_path, monkeypatch):
    m = _quantized(tmp_path)
    assert "QLinearConv" not in _ops(glassrt.InferenceSession(m, providers=["cpu"]))
    lib = capi.require()
    monkeypatch.setattr(lib, "dnnl_get_effective_cpu_isa", lambda: capi.CPU_ISA["avx512_core"])
    assert "QLinearConv" not in _ops(glassrt.InferenceSession(m))


def _c2f_cnn():
    """YOLOv8's C2f block: conv -> Split of the channels in two -> a conv on the second half
    -> Concat(first half, second half, conv) -> conv."""
    w = lambda *s: (RNG.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Split", ["r1", "halves"], ["p1", "p2"], name="split", axis=1),
             helper.make_node("Conv", ["p2", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Concat", ["p1", "p2", "r2"], ["cat"], name="concat", axis=1),
             helper.make_node("Conv", ["cat", "w3"], ["y"], name="conv3")]
    return model(nodes, [tensor("x", SHAPE)], [tensor("y", None)],
                 [init("w1", w(16, 8, 3, 3)), init("halves", np.array([8, 8], np.int64)), init("w2", w(8, 8, 3, 3)),
                  init("w3", w(8, 24, 1, 1))], opset=13, ir_version=8)


@needs_vnni
@pytest.mark.parametrize("quant_format", ["QOperator", "QDQ"])
def test_a_quantized_c2f_split_and_concat_stay_channels_last(tmp_path, quant_format):
    """The 8-bit Split between QLinearConvs copies its pieces channels-last (onednn.Split), so
    the QLinearConcat reading them takes channels-last bytes throughout: every 8-bit value
    of the plan is NHWC; the output within a quantization step of onnxruntime's."""
    m = _quantized(tmp_path, float_model=_c2f_cnn(), quant_format=quant_format)
    sess = glassrt.InferenceSession(m)
    rows = {r["name"]: r for r in sess.explain()["nodes"]}
    split = next(r for r in rows.values() if r["op"] == "Split")
    assert split["kernel"] == "onednn.Split", split
    assert _ops(sess).count("QLinearConcat") == 1 and _ops(sess).count("QLinearConv") == 3
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    plan = next(iter(sess.runner.plans.values()))
    eight_bit = [o for st in plan.steps if st.node.op_type != "DequantizeLinear" for o in st.node.outputs]
    assert eight_bit and all(plan.layouts.get(v) == "nhwc" for v in eight_bit), plan.layouts
    diff = np.abs(got - _run_ort(m, x))
    assert diff.max() <= _step(m) * 1.01 and np.count_nonzero(diff) <= 0.02 * diff.size


def _moved_model(op, second_scale=0.1, second_zp=3):
    """x_q -> DequantizeLinear(0.1, 3) -> Split / MaxPool -> QuantizeLinear each piece (the
    second's parameters given) -> outputs."""
    p = lambda s, z: [init(f"s{s}", np.array(s, np.float32)), init(f"z{z}", np.array(z, np.uint8))]  # noqa: E731
    nodes = [helper.make_node("DequantizeLinear", ["x", "s0.1", "z3"], ["d"], name="dq")]
    if op == "Split":
        nodes += [helper.make_node("Split", ["d", "sizes"], ["a", "b"], name="op", axis=1),
                  helper.make_node("QuantizeLinear", ["a", "s0.1", "z3"], ["ya"], name="qa"),
                  helper.make_node("QuantizeLinear", ["b", f"s{second_scale}", f"z{second_zp}"], ["yb"], name="qb")]
        outs = [tensor("ya", None, onnx.TensorProto.UINT8), tensor("yb", None, onnx.TensorProto.UINT8)]
    elif op == "Concat":  # (the second input dequantized with the second parameters)
        nodes += [helper.make_node("DequantizeLinear", ["x", f"s{second_scale}", f"z{second_zp}"], ["d2"], name="dq2"),
                  helper.make_node("Concat", ["d", "d2"], ["a"], name="op", axis=1),
                  helper.make_node("QuantizeLinear", ["a", "s0.1", "z3"], ["ya"], name="qa")]
        outs = [tensor("ya", None, onnx.TensorProto.UINT8)]
    elif op in ("Flatten", "Transpose"):
        nodes += [helper.make_node(op, ["d"], ["a"], name="op", **({"perm": [0, 2, 3, 1]} if op == "Transpose" else {})),
                  helper.make_node("QuantizeLinear", ["a", f"s{second_scale}", f"z{second_zp}"], ["ya"], name="qa")]
        outs = [tensor("ya", None, onnx.TensorProto.UINT8)]
    else:
        nodes += [helper.make_node("MaxPool", ["d"], ["a"], name="op", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                   strides=[2, 2]),
                  helper.make_node("QuantizeLinear", ["a", f"s{second_scale}", f"z{second_zp}"], ["ya"], name="qa")]
        outs = [tensor("ya", None, onnx.TensorProto.UINT8)]
    inits = {i.name: i for i in [*p(0.1, 3), *p(second_scale, second_zp), init("sizes", np.array([3, 5], np.int64))]}
    return model(nodes, [tensor("x", SHAPE, onnx.TensorProto.UINT8)], outs, list(inits.values()), opset=13,
                 ir_version=8)


@needs_vnni
@pytest.mark.parametrize("op", ["Split", "MaxPool", "Concat", "Flatten", "Transpose"])
def test_split_and_max_pool_of_dequantized_values_run_on_the_bytes(op):
    """Quantized again with the input's own scale and zero point, a Split's pieces and a
    MaxPool's result are the same op on the 8-bit values, byte for byte the float program;
    a Concat of dequantized values is QLinearConcat (each input's codes through a table of
    the float program's), byte for byte too."""
    m = _moved_model(op, *((0.23, 200) if op == "Concat" else ()))
    x = RNG.integers(0, 256, SHAPE).astype(np.uint8)
    sess = glassrt.InferenceSession(m)
    assert _ops(sess) == ["QLinearConcat" if op == "Concat" else op], _ops(sess)
    plain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(fusion=False))
    assert "QuantizeLinear" in _ops(plain)
    for got, want in zip(sess.run(None, {"x": x}), plain.run(None, {"x": x})):
        np.testing.assert_array_equal(got, want)


@needs_vnni
@pytest.mark.parametrize("op", ["Split", "MaxPool", "Flatten"])
@pytest.mark.parametrize("scale, zp", [(0.2, 3), (0.1, 4)])
def test_split_and_max_pool_stay_float_where_a_piece_is_requantized(op, scale, zp):
    """A piece quantized with other parameters is requantized by the float program: left alone."""
    sess = glassrt.InferenceSession(_moved_model(op, scale, zp))
    assert op in _ops(sess) and "DequantizeLinear" in _ops(sess) and "QuantizeLinear" in _ops(sess)


def _head_cnn():
    """A classifier's head: conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm (with a bias)."""
    w = lambda *s: (RNG.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("GlobalAveragePool", ["r1"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wc", "bc"], ["y"], name="classifier", transB=1)]
    return model(nodes, [tensor("x", SHAPE)], [tensor("y", None)],
                 [init("w1", w(16, 8, 3, 3)), init("b1", w(16)), init("wc", w(10, 16)), init("bc", w(10))],
                 opset=13, ir_version=8)


def _float_bias(m, op="Gemm"):
    """m with each `op`'s int32 bias DequantizeLinear replaced by its float32 values (as some
    quantizers write them)."""
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    for k, node in enumerate([n for n in m.graph.node if n.op_type == op and len(n.input) > 2]):
        dq = next(n for n in m.graph.node if n.output[0] == node.input[2])
        values = consts[dq.input[0]].astype(np.float32) * consts[dq.input[1]]
        m.graph.node.remove(dq)
        m.graph.initializer.append(onnx.numpy_helper.from_array(values.astype(np.float32), f"float_bias{k}"))
        node.input[2] = f"float_bias{k}"
    return m


@needs_vnni
def test_a_conv_with_a_float_bias_quantizes_it_as_onnxruntime_does(tmp_path):
    """A QDQ Conv whose bias is float32 (no DequantizeLinear of int32): QLinearConv with the
    bias quantized in x_scale · w_scale (onnxruntime's BiasQuantization), within a step of
    onnxruntime's output; explain's origin says so."""
    m = _float_bias(_quantized(tmp_path), op="Conv")
    floats = {i.name for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    assert all(n.input[2] in floats for n in m.graph.node if n.op_type == "Conv")  # (every bias float32 now)
    sess = glassrt.InferenceSession(m)
    assert _ops(sess).count("QLinearConv") == 3
    rows = {r["name"]: r for r in sess.explain()["nodes"]}
    assert "bias quantized" in rows["conv1"]["origin"]
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    diff = np.abs(sess.run(None, {"x": x})[0] - _run_ort(m, x))
    assert diff.max() <= _step(m) * 1.01 and np.count_nonzero(diff) <= 0.02 * diff.size


@needs_vnni
@pytest.mark.parametrize("bias", ["int32", "float"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_a_qdq_classifier_head_runs_as_onnxruntimes_integer_ops(tmp_path, per_channel, bias):
    """GlobalAveragePool between DequantizeLinear and QuantizeLinear -> QLinearGlobalAveragePool,
    the Flatten on the bytes, the Gemm -> QGemm, its bias the int32 one, or a float bias
    quantized in x_scale · w_scale (onnxruntime's BiasQuantization): onnxruntime's
    program, within a quantization step of its output."""
    m = _quantized(tmp_path, per_channel=per_channel, float_model=_head_cnn())
    if bias == "float":
        m = _float_bias(m)
    sess = glassrt.InferenceSession(m)
    ops = _ops(sess)
    assert {"QLinearConv", "QLinearGlobalAveragePool", "Flatten", "QGemm"} <= set(ops), ops
    assert not {"GlobalAveragePool", "Gemm", "QuantizeDequantize"} & set(ops), ops
    rows = {r["name"]: r for r in sess.explain()["nodes"]}
    assert ("bias quantized" in rows["classifier"]["origin"]) == (bias == "float")
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    diff = np.abs(sess.run(None, {"x": x})[0] - _run_ort(m, x))
    assert diff.max() <= _step(m) * 1.01 and np.count_nonzero(diff) <= 0.1 * diff.size


@needs_vnni
def test_a_gemm_whose_bias_does_not_quantize_stays_float(tmp_path):
    """A Gemm with alpha other than 1 (or a bias that would overflow int32) is left float."""
    m = _quantized(tmp_path, float_model=_head_cnn())
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    gemm.attribute.append(helper.make_attribute("alpha", 0.5))
    assert "Gemm" in _ops(glassrt.InferenceSession(m))
