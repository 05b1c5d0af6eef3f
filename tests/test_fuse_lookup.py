"""A quantized SiLU, QLinearMul(x, QLinearSigmoid(x)), as one glassrt::LookupTable
(passes/fuse_lookup.py): the two kernels' bytes for every code, one gather pass (channels-last
values too); left alone where the program differs. And `glassrt check` on LookupTable."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.tools import check as checks

from .helpers import init, model, tensor

RNG = np.random.default_rng(17)
SHAPE = [1, 16, 12, 10]


def _silu(dt=np.uint8, x_first=True, mul_x_scale=0.05, extra_reader=False):
    """x -> QLinearSigmoid -> s; QLinearMul(x, s) (or (s, x)) -> y, as onnxruntime's quantizer writes a SiLU."""
    elem = TensorProto.UINT8 if dt == np.uint8 else TensorProto.INT8
    inits = [init("xs", np.array(0.05, np.float32)), init("xz", np.array(120 if dt == np.uint8 else -8, dt)),
             init("mxs", np.array(mul_x_scale, np.float32)),
             init("ss", np.array(1 / 255, np.float32)), init("sz", np.array(0 if dt == np.uint8 else -128, dt)),
             init("ys", np.array(0.03, np.float32)), init("yz", np.array(10 if dt == np.uint8 else -100, dt))]
    x_params, s_params = ["x", "mxs", "xz"], ["s", "ss", "sz"]
    operands = x_params + s_params if x_first else s_params + x_params
    nodes = [helper.make_node("QLinearSigmoid", ["x", "xs", "xz", "ss", "sz"], ["s"], name="sigmoid",
                              domain="com.microsoft"),
             helper.make_node("QLinearMul", operands + ["ys", "yz"], ["y"], name="silu", domain="com.microsoft")]
    outputs = [tensor("y", None, elem)]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["s"], ["s_copy"], name="peek"))
        outputs.append(tensor("s_copy", None, elem))
    return model(nodes, [tensor("x", SHAPE, elem)], outputs, inits, opset=13, domains={"com.microsoft": 1})


def _x(dt):
    codes = np.arange(256, dtype=np.uint8).view(dt)
    return RNG.choice(codes, size=SHAPE).astype(dt)


def _ops(sess):
    return sorted(n.op_type for n in sess.placement.graph.nodes)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("x_first", [True, False])
def test_a_quantized_silu_is_one_table_with_the_kernels_bytes(dt, x_first):
    m = _silu(dt, x_first)
    sess = glassrt.InferenceSession(m)
    assert _ops(sess) == ["LookupTable"]
    x = _x(dt)
    got = sess.run(None, {"x": x})[0]
    plain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(fusion=False))
    assert _ops(plain) == ["QLinearMul", "QLinearSigmoid"]
    np.testing.assert_array_equal(got, plain.run(None, {"x": x})[0])
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got.astype(np.int64) - want).max() <= 1


@pytest.mark.parametrize("case", ["other_x_scale", "sigmoid_read_elsewhere"])
def test_it_does_not_fire_where_the_program_differs(case):
    m = _silu(mul_x_scale=0.06) if case == "other_x_scale" else _silu(extra_reader=True)
    sess = glassrt.InferenceSession(m)
    assert "LookupTable" not in _ops(sess)
    x = _x(np.uint8)
    plain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(fusion=False)).run(None, {"x": x})
    for g, w in zip(sess.run(None, {"x": x}), plain):
        np.testing.assert_array_equal(g, w)


def test_the_table_kernel_reads_channels_last_bytes_as_plain_ones(monkeypatch):
    from glassrt.kernels.cpu import quantize
    from glassrt.runtime.layout import channels_last_view

    table = RNG.integers(0, 256, 256).astype(np.uint8)
    x = _x(np.int8)
    want = table[x.view(np.uint8)]
    nhwc = channels_last_view(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(-1), x.shape)
    for compiled in (True, False):
        monkeypatch.setattr(quantize, "use_compiled", lambda path, after=64, c=compiled: c)
        for xs, out in ((x, np.empty(x.shape, np.uint8)), (nhwc, channels_last_view(np.empty(x.size, np.uint8), x.shape)),
                        (nhwc, np.empty(x.shape, np.uint8))):
            np.testing.assert_array_equal(quantize.lookup_table(xs, table, out=out), want)
    with pytest.raises(ValueError, match="256 values"):
        quantize.lookup_table(x, table[:255], out=np.empty(x.shape, np.uint8))


def test_glassrt_check_passes_on_lookup_table():
    rows = checks.run_checks("LookupTable", builtins=True)
    assert {r.check for r in rows} >= {"meta_vs_real", "decomposition"}
    assert all(r.status == "pass" for r in rows), [(r.check, r.message) for r in rows]
