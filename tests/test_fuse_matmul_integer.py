"""quantize_dynamic's layers (passes/fuse_matmul_integer.py): DynamicQuantizeLinear ->
MatMulInteger -> Cast -> Mul by the two scales' product [-> bias Add] becomes one
com.microsoft::MatMulIntegerToFloat on the onednn provider's exact int8 matmul, the same
bits as the chain; left alone where that kernel would not take it."""
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


def test_it_does_not_fire_without_an_exact_int8_engine(monkeypatch):
    m = _layer()
    assert "MatMulIntegerToFloat" not in op_types(glassrt.InferenceSession(m, providers=["cpu"]))
    lib = capi.require()
    monkeypatch.setattr(lib, "dnnl_get_effective_cpu_isa", lambda: capi.CPU_ISA["avx512_core"])
    assert "MatMulIntegerToFloat" not in op_types(glassrt.InferenceSession(m))


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
