"""quantize_dynamic's layers (passes/fuse_matmul_integer.py): DynamicQuantizeLinear ->
MatMulInteger -> Cast -> Mul by the two scales' product [-> bias Add] becomes one
com.microsoft::MatMulIntegerToFloat on the onednn provider's exact int8 matmul (or, without
VNNI, its exact float32 product), the same bits as the chain; left alone where no such
kernel would take it."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import init, model, op_types, ort_outputs, skip_without_vnni, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")
RNG = np.random.default_rng(11)
K, N = 48, 20
X = (RNG.standard_normal((2, 7, K)) * 2).astype(np.float32)


needs_vnni = skip_without_vnni()


def _layer(w_dtype=np.int8, per_column=False, w_zp=0, bias="after", scale_first=False, cast_to=TensorProto.FLOAT,
           extra_reader=False):
    """x -> DynamicQuantizeLinear -> MatMulInteger(., W) -> Cast -> Mul(., a_scale · w_scale) [-> Add bias],
    as onnxruntime.quantization.quantize_dynamic writes a MatMul (bias: "after", "before" (Add(bias, y)) or None)."""
    info = np.iinfo(w_dtype)
    w = RNG.integers(info.min, info.max + 1, (K, N)).astype(w_dtype)
    w_scale = (RNG.uniform(0.002, 0.02, N) if per_column else np.array(0.01)).astype(np.float32)
    inits = [init("w", w), init("w_s", w_scale), init("w_z", np.full(w_scale.shape, w_zp, w_dtype)),
             init("b", RNG.standard_normal(N).astype(np.float32))]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "w_z"], ["acc"], name="mmi"),
             helper.make_node("Cast", ["acc"], ["accf"], name="cast", to=cast_to),
             helper.make_node("Mul", ["xs", "w_s"], ["s"], name="scales"),
             helper.make_node("Mul", ["s", "accf"] if scale_first else ["accf", "s"], ["mm"], name="scale")]
    outputs = [tensor("y", None)]
    if bias:
        nodes.append(helper.make_node("Add", ["mm", "b"] if bias == "after" else ["b", "mm"], ["y"], name="bias"))
    else:
        nodes.append(helper.make_node("Identity", ["mm"], ["y"], name="out"))
    if extra_reader:  # the int32 sums read by another node too
        nodes.append(helper.make_node("Cast", ["acc"], ["acc64"], name="other", to=TensorProto.INT64))
        outputs.append(tensor("acc64", None, TensorProto.INT64))
    return model(nodes, [tensor("x", list(X.shape))], outputs, inits, opset=17)


def _ort(m):
    return ort_outputs(m, {"x": X})[0]


@needs_vnni
@pytest.mark.parametrize("per_column,bias,scale_first", [(False, "after", False), (True, "after", False),
                                                         (False, "before", True), (True, None, False)])
def test_the_layer_becomes_one_integer_product_with_the_same_bits(per_column, bias, scale_first):
    m = _layer(per_column=per_column, bias=bias, scale_first=scale_first)
    sess = glassrt.InferenceSession(m)
    ops = op_types(sess)
    assert "MatMulIntegerToFloat" in ops and not {"MatMulInteger", "Cast", "Mul", "Add"} & set(ops)
    rows = {r["name"]: r for r in sess.explain()["nodes"]}
    assert rows["mmi"]["kernel"] == "onednn.MatMulIntegerToFloat.int8"
    assert any("MatMulInteger 'mmi'" in c for r in sess.explain()["passes"] for c in r.get("changes", []))
    got = sess.run(None, {"x": X})[0]
    chain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(fusion=False))
    assert "MatMulInteger" in op_types(chain)
    np.testing.assert_array_equal(got, chain.run(None, {"x": X})[0])  # the chain's float steps, bit for bit
    np.testing.assert_allclose(got, _ort(m), rtol=1e-6, atol=1e-6)


@needs_vnni
@pytest.mark.parametrize("case", ["uint8_weights", "weight_zero_point", "cast_to_double", "sums_read_elsewhere"])
def test_it_does_not_fire_where_the_program_or_the_kernel_differs(case):
    m = {"uint8_weights": lambda: _layer(w_dtype=np.uint8, w_zp=128),
         "weight_zero_point": lambda: _layer(w_zp=2),
         "cast_to_double": lambda: _layer(cast_to=TensorProto.DOUBLE, bias=None),
         "sums_read_elsewhere": lambda: _layer(extra_reader=True)}[case]()
    if case == "cast_to_double":  # Mul(double, float) would not type: scale in double too
        m.graph.node[3].op_type = "Cast"
        m.graph.node[3].input[:] = ["xs"]
        m.graph.node[3].attribute.append(helper.make_attribute("to", TensorProto.DOUBLE))
        m.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    sess = glassrt.InferenceSession(m)
    assert "MatMulIntegerToFloat" not in op_types(sess) and "MatMulInteger" in op_types(sess)
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], _ort(m), rtol=1e-6, atol=1e-6)


def test_without_an_int8_engine_it_fires_for_the_float32_kernel(monkeypatch):
    """No oneDNN among the providers: not fused. No VNNI: the product on the exact float32
    kernel (tests/test_onednn_int8_float_matmul.py)."""
    m = _layer()
    assert "MatMulIntegerToFloat" not in op_types(glassrt.InferenceSession(m, providers=["cpu"]))
    lib = capi.require()
    monkeypatch.setattr(lib, "dnnl_get_effective_cpu_isa", lambda: capi.CPU_ISA["avx512_core"])
    sess = glassrt.InferenceSession(m)
    assert "MatMulIntegerToFloat" in op_types(sess)
    assert {r["name"]: r for r in sess.explain()["nodes"]}["mmi"]["kernel"] == "onednn.MatMulIntegerToFloat.float32"
    # (against cpu's exact chain: onnxruntime's u8 x s8 products saturate on such CPUs)
    chain = glassrt.InferenceSession(m, providers=["cpu"])
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], chain.run(None, {"x": X})[0])


@needs_vnni
def test_a_model_quantized_by_onnxruntime_runs_fused_as_onnxruntime_computes_it(tmp_path):
    """Two Linear layers with a Gelu between, through onnxruntime.quantization.quantize_dynamic."""
    pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w1, w2 = (RNG.standard_normal((K, 64)) * 0.2).astype(np.float32), (RNG.standard_normal((64, N)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Gelu", ["hb"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    m = model(nodes, [tensor("x", list(X.shape))], [tensor("y", None)],
              [init("w1", w1), init("b1", RNG.standard_normal(64).astype(np.float32)), init("w2", w2),
               init("b2", RNG.standard_normal(N).astype(np.float32))], opset=20, ir_version=9)
    src, dst = tmp_path / "f32.onnx", tmp_path / "int8.onnx"
    src.write_bytes(m.SerializeToString())
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    sess = glassrt.InferenceSession(str(dst))
    ops = op_types(sess)
    assert ops.count("MatMulIntegerToFloat") == 2 and "MatMulInteger" not in ops and "Cast" not in ops
    import onnx

    np.testing.assert_allclose(sess.run(None, {"x": X})[0], _ort(onnx.load(str(dst))), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- ConvInteger -> glassrt::ConvIntegerToFloat

IMAGE = RNG.standard_normal((1, 8, 12, 14)).astype(np.float32)


def _cnn():
    """conv 3x3 (bias) -> Relu -> depthwise 3x3 stride 2 (bias) -> Clip -> conv 1x1 (no bias)."""
    w = lambda *s: (RNG.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="dw", pads=[1, 1, 1, 1], strides=[2, 2],
                              group=16),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"], name="clip"),
             helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3")]
    return model(nodes, [tensor("x", list(IMAGE.shape))], [tensor("y", None)],
                 [init("w1", w(16, 8, 3, 3)), init("b1", w(16)), init("w2", w(16, 1, 3, 3)), init("b2", w(16)),
                  init("lo", np.array(0, np.float32)), init("hi", np.array(6, np.float32)), init("w3", w(10, 16, 1, 1))],
                 opset=13, ir_version=8)


def _dynamic(tmp_path, weight_type="QInt8", per_channel=False):
    pytest.importorskip("onnxruntime")
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = tmp_path / "f32.onnx", tmp_path / "int8.onnx"
    src.write_bytes(_cnn().SerializeToString())
    quantize_dynamic(str(src), str(dst), weight_type=getattr(QuantType, weight_type), per_channel=per_channel,
                     op_types_to_quantize=["Conv"])
    return onnx.load(str(dst))


@needs_vnni
@pytest.mark.parametrize("per_channel", [False, True])
def test_a_dynamically_quantized_conv_becomes_one_convolution_with_the_same_bits(tmp_path, per_channel):
    """quantize_dynamic's ConvInteger -> Cast -> Mul(x_scale · w_scale) [-> Add bias] becomes
    glassrt::ConvIntegerToFloat on oneDNN (the sums scaled and biased as they are written):
    the chain's bits (fusion off), onnxruntime's bits; its output channels-last between
    the convolution and the oneDNN activation after it."""
    m = _dynamic(tmp_path, per_channel=per_channel)
    sess = glassrt.InferenceSession(m)
    ops = op_types(sess)
    assert ops.count("ConvIntegerToFloat") == 3 and not {"ConvInteger", "Cast"} & set(ops), ops
    kernels = {r["kernel"] for r in sess.explain()["nodes"] if r["op"] == "ConvIntegerToFloat"}
    assert kernels == {"onednn.ConvIntegerToFloat.int8"}
    got = sess.run(None, {"x": IMAGE})[0]
    chain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(fusion=False))
    assert "ConvInteger" in op_types(chain)
    np.testing.assert_array_equal(got, chain.run(None, {"x": IMAGE})[0])
    np.testing.assert_array_equal(got, ort_outputs(m, {"x": IMAGE})[0])
    # channels-last from the first DynamicQuantizeLinear's codes to the last convolution's input
    plan = next(iter(sess.runner.plans.values()))
    inner = [o for st in plan.steps if st.node.op_type in ("DynamicQuantizeLinear", "ConvIntegerToFloat", "Relu", "Clip")
             for o in st.node.outputs[:1] if o != "y"]
    assert inner and all(plan.layouts.get(v) == "nhwc" for v in inner), plan.layouts


def _old_style_conv(w_dtype, w_zp):
    """x -> DynamicQuantizeLinear -> ConvInteger(., W, x_zp, w_zp) -> Add(the bias quantized at
    run time in x_scale · w_scale, int32, (M, 1, 1)) -> Cast -> Mul(x_scale · w_scale): what
    older onnxruntime.quantization writes (ddddocr's models: uint8 weights, zero point 121)."""
    info = np.iinfo(w_dtype)
    m = 12
    w = RNG.integers(info.min, info.max + 1, (m, 8, 3, 3)).astype(w_dtype)
    b = (RNG.standard_normal(m) * 2).astype(np.float32)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
             helper.make_node("Mul", ["xs", "ws"], ["s"], name="scales"),
             helper.make_node("Div", ["b", "s"], ["bq_f"], name="bias_div"),
             helper.make_node("Round", ["bq_f"], ["bq_r"], name="bias_round"),
             helper.make_node("Cast", ["bq_r"], ["bq"], name="bias_cast", to=TensorProto.INT32),
             helper.make_node("Reshape", ["bq", "shape"], ["bq3"], name="bias_shape"),
             helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["acc", "bq3"], ["acc_b"], name="bias_add"),
             helper.make_node("Cast", ["acc_b"], ["f"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "s"], ["y"], name="scale")]
    return model(nodes, [tensor("x", list(IMAGE.shape))], [tensor("y", None)],
                 [init("w", w), init("wz", np.array(w_zp, w_dtype)), init("ws", np.array(0.004, np.float32)),
                  init("b", b), init("shape", np.array([m, 1, 1], np.int64))], opset=13, ir_version=8)


@needs_vnni
@pytest.mark.parametrize("w_dtype, w_zp", [(np.uint8, 121), (np.uint8, 128), (np.int8, 3), (np.int8, 0)])
def test_older_quantize_dynamic_convs_fuse_over_the_exact_sums(w_dtype, w_zp):
    """uint8 weights, a weight zero point, an int32 bias added to the sums (computed at run
    time): glassrt::ConvIntegerToFloat on oneDNN's exact sums (corrected for the weights'
    offset) and one compiled pass of the chain's steps: the chain's bits, onnxruntime's."""
    m = _old_style_conv(w_dtype, w_zp)
    sess = glassrt.InferenceSession(m)
    ops = op_types(sess)
    names = {n.name for n in sess.placement.graph.nodes}
    assert "ConvIntegerToFloat" in ops and "ConvInteger" not in ops and not {"bias_add", "cast", "scale"} & names
    assert {r["kernel"] for r in sess.explain()["nodes"] if r["op"] == "ConvIntegerToFloat"} == \
        {"onednn.ConvIntegerToFloat.int8"}
    pytest.importorskip("numba")
    for x in (IMAGE, IMAGE * 3 - 1):
        got = sess.run(None, {"x": x})[0]
        chain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(fusion=False))
        np.testing.assert_array_equal(got, chain.run(None, {"x": x})[0])
        np.testing.assert_array_equal(got, ort_outputs(m, {"x": x})[0])


def test_the_conv_chain_is_not_fused_without_an_exact_int8_engine(tmp_path, monkeypatch):
    m = _dynamic(tmp_path)
    assert "ConvIntegerToFloat" not in op_types(glassrt.InferenceSession(m, providers=["cpu"]))
    lib = capi.require()
    monkeypatch.setattr(lib, "dnnl_get_effective_cpu_isa", lambda: capi.CPU_ISA["avx512_core"])
    assert "ConvIntegerToFloat" not in op_types(glassrt.InferenceSession(m))


def test_glassrt_check_passes_on_conv_integer_to_float():
    """`glassrt check`: the kernel against the contract's decomposition (ConvInteger -> Cast ->
    Mul -> Add) and its meta against what it returns, on uint8 and int8 x, per-tensor and
    per-channel scales, with and without a bias."""
    from glassrt.tools import check as checks

    rows = checks.run_checks("ConvIntegerToFloat", builtins=True)
    assert {r.check for r in rows} >= {"meta_vs_real", "decomposition"}
    assert all(r.status == "pass" for r in rows), [(r.check, r.message) for r in rows]
