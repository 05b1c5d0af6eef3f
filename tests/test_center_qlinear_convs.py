"""Two QLinearConv in a row hand each other float32 codes (passes/center_qlinear_convs.py,
glassrt::CenteredQLinearConv): the first's epilogue clips its result to the codes minus
their zero point, the second convolves them as they are, no 8-bit bytes between them; the
same bytes out as the two convs with their reorders, on oneDNN and on cpu's kernel alike;
left alone where the 8-bit value is needed as it is."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import init, model, session_without_pass, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")
RNG = np.random.default_rng(31)
X = RNG.standard_normal((1, 8, 10, 12)).astype(np.float32)


@pytest.fixture(autouse=True)
def no_vnni(monkeypatch):
    """As on an AVX2 CPU, where oneDNN runs 8-bit convs as float32 ones and the pass fires."""
    from glassrt.kernels.onednn import int8

    monkeypatch.setattr(int8, "exact_reason", lambda: "no VNNI (this test)")


def _conv(name, x, y, m, c, k, zp_in, zp_out, dt, group=1, w_zero=None, **attrs):
    """QLinearConv `name`: its weights (int8, 7-bit as onnxruntime's reduce_range), scales,
    zero points and bias as initializers."""
    w = RNG.integers(-63, 64, (m, c // group, k, k)).astype(np.int8)
    inits = [init(f"{name}/w", w), init(f"{name}/ws", RNG.uniform(0.002, 0.01, m).astype(np.float32)),
             init(f"{name}/b", RNG.integers(-300, 300, m).astype(np.int32)),
             init(f"{name}/ys", np.array(0.05, np.float32)), init(f"{name}/yz", np.array(zp_out, dt))]
    wz = w_zero or f"{name}/wz"
    if w_zero is None:
        inits.append(init(wz, np.zeros(m, np.int8)))
    node = helper.make_node("QLinearConv", [x, "xs", zp_in, f"{name}/w", f"{name}/ws", wz, f"{name}/ys", f"{name}/yz",
                                            f"{name}/b"], [y], name=name, group=group, **attrs)
    return [node], inits


def _chain(dt=np.uint8, zp=(100, 100, 100), read_middle=False, w_zero_input=False, depthwise_x_zp=None):
    """QuantizeLinear → 1x1 QLinearConv → depthwise 3x3 → 1x1 → DequantizeLinear: a QOperator
    MobileNet block. zp: the three convs' output zero points (the next conv's x_zero_point,
    but the depthwise's where depthwise_x_zp is given)."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["q"], name="quantize")]
    inits = [init("xs", np.array(0.05, np.float32)), init("xz", np.array(zp[0], dt))]
    dw_xz = "expand/yz"
    if depthwise_x_zp is not None:
        inits.append(init("depthwise/xz", np.array(depthwise_x_zp, dt)))
        dw_xz = "depthwise/xz"
    parts = [_conv("expand", "q", "a", 16, 8, 1, "xz", zp[0], dt),
             _conv("depthwise", "a", "b", 16, 16, 3, dw_xz, zp[1], dt, group=16, pads=[1, 1, 1, 1],
                   w_zero="wz_in" if w_zero_input else None),
             _conv("project", "b", "c", 8, 16, 1, "depthwise/yz", zp[2], dt)]
    for n, i in parts:
        nodes += n
        inits += i
    nodes.append(helper.make_node("DequantizeLinear", ["c", "project/ys", "project/yz"], ["y"], name="dequantize"))
    inputs = [tensor("x", list(X.shape))] + ([tensor("wz_in", [16], TensorProto.INT8)] if w_zero_input else [])
    outputs = [tensor("y", [1, 8, 10, 12])] + ([tensor("a", [1, 16, 10, 12], TensorProto.UINT8 if dt == np.uint8 else TensorProto.INT8)]
                                     if read_middle else [])
    return model(nodes, inputs, outputs, inits, opset=13)


def _feeds(w_zero_input=False):
    return {"x": X, **({"wz_in": np.zeros(16, np.int8)} if w_zero_input else {})}


def _without_the_pass(m, feeds, providers):
    sess = session_without_pass(m, "center_qlinear_convs", providers=providers)
    assert "CenteredQLinearConv" not in [n.op_type for n in sess.placement.graph.nodes]
    return sess.run(None, feeds)


def _centered(sess):
    return {n.name: (n.attrs.get("x_centered", 0), n.attrs.get("y_centered", 0))
            for n in sess.placement.graph.nodes if n.op_type == "CenteredQLinearConv"}


@pytest.mark.parametrize("dt,zp", [(np.uint8, 100), (np.uint8, 0), (np.int8, -7)])
def test_a_chain_of_convs_hands_over_float32_codes_with_the_same_bytes_out(dt, zp):
    m = _chain(dt, (zp, zp, zp))
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    assert _centered(sess) == {"expand": (0, 1), "depthwise": (1, 1), "project": (1, 0)}
    assert {n["kernel"] for n in sess.explain()["nodes"] if n["op"] == "CenteredQLinearConv"} == \
        {"onednn.CenteredQLinearConv.float32"}
    got = sess.run(None, _feeds())
    plan_layouts = next(iter(sess.runner.plans.values())).layouts
    assert plan_layouts.get("a/centered") == "nhwc" and plan_layouts.get("b/centered") == "nhwc"
    np.testing.assert_array_equal(got[0], _without_the_pass(m, _feeds(), ["onednn", "cpu"])[0])
    # cpu's kernels (float64 requantization: a code apart at a rounding tie at most)
    cpu = glassrt.InferenceSession(m, providers=["cpu"]).run(None, _feeds())[0]
    assert np.max(np.abs(got[0] - cpu)) <= 0.05 * 1.001


def test_the_next_conv_on_cpu_reads_the_float32_codes():
    """A conv oneDNN refuses (its weights' zero point fed at run time) runs on cpu's
    CenteredQLinearConv, reading the float32 codes the conv before wrote: the same bytes."""
    m = _chain(w_zero_input=True)
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    kernels = {n["name"]: n["kernel"] for n in sess.explain()["nodes"]}
    assert kernels["depthwise"] == "cpu.CenteredQLinearConv" and kernels["expand"].startswith("onednn.")
    got = sess.run(None, _feeds(True))[0]
    np.testing.assert_array_equal(got, _without_the_pass(m, _feeds(True), ["onednn", "cpu"])[0])


@pytest.mark.parametrize("case", ["middle_is_an_output", "zero_points_differ", "no_onednn"])
def test_it_does_not_fire_where_the_bytes_are_needed(case):
    m = _chain(read_middle=case == "middle_is_an_output",
               depthwise_x_zp=90 if case == "zero_points_differ" else None)
    providers = ["cpu"] if case == "no_onednn" else ["onednn", "cpu"]
    sess = glassrt.InferenceSession(m, providers=providers)
    want = {"middle_is_an_output": {"depthwise": (0, 1), "project": (1, 0)},
            "zero_points_differ": {"depthwise": (0, 1), "project": (1, 0)}, "no_onednn": {}}[case]
    assert _centered(sess) == want
    for g, w in zip(sess.run(None, _feeds()), _without_the_pass(m, _feeds(), providers)):
        np.testing.assert_array_equal(g, w)


def test_it_does_not_fire_where_oneDNN_has_exact_8bit_products(monkeypatch):
    pass_module = importlib.import_module("glassrt.passes.center_qlinear_convs")  # (the package names the function so)
    monkeypatch.setattr(pass_module, "int8_engine_reason", lambda providers: None)
    sess = glassrt.InferenceSession(_chain(), providers=["onednn", "cpu"])
    assert _centered(sess) == {}


def test_an_optimized_model_holds_them_as_functions_onnxruntime_runs(tmp_path):
    """`glassrt optimize` writes them as model-local functions whose body is the
    decomposition (Cast, Add, QLinearConv, Cast, Sub): onnxruntime runs the file to the bytes
    it gives for the original, and glassrt loads it back to its own bytes."""
    import onnx
    from click.testing import CliRunner

    from glassrt.cli import main

    from .helpers import ort_outputs

    src, out = tmp_path / "chain.onnx", tmp_path / "chain.opt.onnx"
    m = _chain()
    onnx.save(m, src)
    result = CliRunner().invoke(main, ["optimize", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    optimized = onnx.load(out)
    onnx.checker.check_model(optimized)
    assert [n.op_type for n in optimized.graph.node].count("CenteredQLinearConv") == 3
    np.testing.assert_array_equal(ort_outputs(optimized, _feeds())[0], ort_outputs(m, _feeds())[0])
    np.testing.assert_array_equal(glassrt.InferenceSession(str(out)).run(None, _feeds())[0],
                                  glassrt.InferenceSession(m).run(None, _feeds())[0])


def test_a_conv_cut_into_channel_runs_reads_and_writes_float32_codes(monkeypatch):
    """A conv whose sums could pass 2**24 runs as one float32 conv per run of input channels
    (int8_float's parts): centered on both sides too, the same bytes out."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["q"], name="quantize")]
    inits = [init("xs", np.array(0.05, np.float32)), init("xz", np.array(100, np.uint8))]
    for n, i in (_conv("wide", "q", "a", 512, 8, 1, "xz", 90, np.uint8),
                 _conv("parts", "a", "b", 16, 512, 3, "wide/yz", 80, np.uint8, pads=[1, 1, 1, 1]),
                 _conv("narrow", "b", "c", 8, 16, 1, "parts/yz", 70, np.uint8)):
        nodes += n
        inits += i
    big = next(i for i in inits if i.name == "parts/w")  # full-range weights: sums past 2**24
    big.CopyFrom(init("parts/w", RNG.integers(-128, 128, (16, 512, 3, 3)).astype(np.int8)))
    nodes.append(helper.make_node("DequantizeLinear", ["c", "narrow/ys", "narrow/yz"], ["y"], name="dequantize"))
    m = model(nodes, [tensor("x", [1, 8, 6, 5])], [tensor("y", [1, 8, 6, 5])], inits, opset=13)
    feeds = {"x": RNG.standard_normal((1, 8, 6, 5)).astype(np.float32)}
    from glassrt.kernels.onednn import int8_float

    bound_in_parts = []
    bind_parts = int8_float._bind_parts
    monkeypatch.setattr(int8_float, "_bind_parts", lambda spec, layout: bound_in_parts.append(len(spec.parts))
                        or bind_parts(spec, layout))
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    assert _centered(sess) == {"wide": (0, 1), "parts": (1, 1), "narrow": (1, 0)}
    kernels = {n["name"]: n["kernel"] for n in sess.explain()["nodes"]}
    assert kernels["parts"] == "onednn.CenteredQLinearConv.float32"
    got = sess.run(None, feeds)[0]
    assert bound_in_parts and min(bound_in_parts) >= 2
    np.testing.assert_array_equal(got, _without_the_pass(m, feeds, ["onednn", "cpu"])[0])


def test_the_float32_codes_take_a_name_no_value_has():
    """A model that already names a value `a/centered`: the codes between the convs get another."""
    m = _chain()
    m.graph.node.append(helper.make_node("Identity", ["x"], ["a/centered"], name="taken"))
    m.graph.output.append(tensor("a/centered", list(X.shape)))
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    assert _centered(sess) == {"expand": (0, 1), "depthwise": (1, 1), "project": (1, 0)}
    got = sess.run(None, _feeds())
    np.testing.assert_array_equal(got[1], X)
    np.testing.assert_array_equal(got[0], _without_the_pass(m, _feeds(), ["onednn", "cpu"])[0])
