"""oneDNN's quantizing kernels (glassrt/kernels/onednn/quantize.py): DynamicQuantizeLinear's
codes and glassrt::QuantizeDequantize, each one binary primitive; both cpu's kernel's bytes."""
from __future__ import annotations

import numpy as np
import pytest

from glassrt.kernels.onednn import capi

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=str(capi.UNAVAILABLE))

from glassrt.kernels.cpu import quantize as cpu  # noqa: E402
from glassrt.kernels.onednn import quantize  # noqa: E402

RNG = np.random.default_rng(5)


def _not_called(*args, **kwargs):
    raise AssertionError("cpu's kernel ran where the oneDNN primitive should have")


def _cases():
    big = quantize.SHARED_FROM * 3 + 7  # (blocks of unequal sizes)
    x = RNG.standard_normal(big).astype(np.float32) * 3
    yield "random", x
    yield "one sign", np.abs(x) + 0.5
    yield "negative", -np.abs(x)
    yield "zeros", np.zeros(big, np.float32)
    special = x.copy()
    special[[0, 5, big - 1]] = [np.inf, -np.inf, 1e30]
    yield "inf", special
    nan = x.copy()
    nan[big // 2] = np.nan
    yield "nan", nan
    yield "ties", (np.arange(big, dtype=np.float32) % 512 - 255.5) / 2  # (codes on rounding ties)
    yield "small", x[:100]


@pytest.mark.parametrize("case", [c for c, _ in _cases()])
@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_codes_are_cpus_bytes(case, threads, monkeypatch):
    x = dict(_cases())[case].reshape(1, -1)
    monkeypatch.setattr(capi, "get_max_threads", lambda: threads)
    want = cpu.dynamic_quantize_linear(x)
    monkeypatch.setattr(cpu, "dynamic_quantize_linear", _not_called)  # (the primitive runs, not cpu's kernel)
    got = quantize.dynamic_quantize_linear_threads(x, out=(np.empty(x.shape, np.uint8), None, None))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == w.dtype and g.shape == w.shape


@pytest.mark.parametrize("kernel", ["threads", "cpu"])
def test_channels_last_values_give_the_same_codes(kernel, monkeypatch):
    """DynamicQuantizeLinear takes channels-last views (a quantize_dynamic CNN's activations
    between its convolutions): the codes of each element land in its place, the same bytes
    as for plain arrays; every mix of layouts."""
    from glassrt.runtime.layout import channels_last_view

    shape = (1, 24, 30, 40)  # (28,800 values: the threaded path's size)
    x = RNG.standard_normal(shape).astype(np.float32) * 4
    if kernel == "threads":
        monkeypatch.setattr(capi, "get_max_threads", lambda: 2)
        fn = quantize.dynamic_quantize_linear_threads
    else:
        monkeypatch.setattr(cpu, "use_compiled", lambda path, after=64: True)
        fn = cpu.dynamic_quantize_linear
    real = cpu.dynamic_quantize_linear
    want = real(x)

    def nhwc(a, dt):
        return channels_last_view(np.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(-1).astype(dt), a.shape)

    for xs in (x, nhwc(x, np.float32)):
        for y in (np.empty(shape, np.uint8), nhwc(np.zeros(shape), np.uint8), None):
            # the threaded pass must run (not cpu's kernel as its fallback) but for plain values
            # into channels-last codes, which it leaves to cpu's tile path
            falls_back = xs is x and y is not None and not y.flags.c_contiguous
            monkeypatch.setattr(cpu, "dynamic_quantize_linear",
                                _not_called if kernel == "threads" and not falls_back else real)
            got = fn(xs, out=(y, None, None))
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)


def test_codes_made_on_two_threads_at_once_are_each_their_own(monkeypatch):
    """Each thread binds its own codes primitive (the scale and zero point are its arguments):
    two threads quantizing different values at once each get cpu's bytes for theirs."""
    import threading

    xs = [RNG.standard_normal((1, 40000)).astype(np.float32) * k for k in (1, 50)]
    want = [cpu.dynamic_quantize_linear(x) for x in xs]
    errors = []

    def work(i):
        for _ in range(50):
            got = quantize.dynamic_quantize_linear_threads(xs[i])
            if not all(np.array_equal(g, w) for g, w in zip(got, want[i])):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ---------------------------------------------------------------- DequantizeLinear


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("n", [5, 1000, 40000])
@pytest.mark.parametrize("scale", [0.0123457, 3.0e5, 0.0, -0.5, np.inf, np.nan])
@pytest.mark.parametrize("zero", [None, "low", "high"])
def test_dequantize_is_cpus_bytes(dt, n, scale, zero):
    """(x - z) * s per tensor on oneDNN's reorder: cpu's float32 steps, bit for bit (signed
    zeros, infinities and NaN too)."""
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max + 1, (1, n)).astype(dt)
    s = np.array(scale, np.float32)
    z = None if zero is None else np.array(info.min + 3 if zero == "low" else info.max - 5, dt)
    with np.errstate(invalid="ignore", over="ignore"):
        want = cpu.dequantize_linear(x, s, z)
        got = quantize.dequantize_linear_binary(x, s, z, out=np.empty(x.shape, np.float32))
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_dequantize_channels_last_and_the_rest_as_cpu(monkeypatch):
    """Channels-last codes into a channels-last output, each element in its place; per-axis
    scales, another output type or a zero point of another type go to cpu's kernel, which
    gives its answer or its error."""
    from glassrt.runtime.layout import channels_last_view

    shape = (1, 24, 30, 40)
    x = RNG.integers(0, 256, shape).astype(np.uint8)
    s, z = np.array(0.05, np.float32), np.array(128, np.uint8)
    want = cpu.dequantize_linear(x, s, z)

    def nhwc(a, dt):
        return channels_last_view(np.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(-1).astype(dt), a.shape)

    for xs in (x, nhwc(x, np.uint8)):
        for y in (np.empty(shape, np.float32), nhwc(np.zeros(shape), np.float32)):
            np.testing.assert_array_equal(quantize.dequantize_linear_binary(xs, s, z, out=y), want)
    per_axis = np.linspace(0.01, 0.2, 24).astype(np.float32)
    np.testing.assert_array_equal(quantize.dequantize_linear_binary(x, per_axis, np.full(24, 7, np.uint8)),
                                  cpu.dequantize_linear(x, per_axis, np.full(24, 7, np.uint8)))
    with pytest.raises(ValueError, match="zero_point"):
        quantize.dequantize_linear_binary(x, s, np.array(3, np.int8))


_NO_NUMBA = """
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import glassrt
w = numpy_helper.from_array(np.random.default_rng(0).integers(-127, 128, (64, 32)).astype(np.int8), "w")
nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
         helper.make_node("MatMulInteger", ["q", "w", "qz"], ["acc"]),
         helper.make_node("DequantizeLinear", ["c", "cs", "cz"], ["d"]),
         helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 64]),
                                   helper.make_tensor_value_info("c", TensorProto.UINT8, [128, 768])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                       helper.make_tensor_value_info("d", TensorProto.FLOAT, None)],
                      [w, numpy_helper.from_array(np.array(0.5, np.float32), "cs"),
                       numpy_helper.from_array(np.array(100, np.uint8), "cz")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
s = glassrt.InferenceSession(m.SerializeToString())
rng = np.random.default_rng(1)
for _ in range(5):
    s.run(None, {"x": rng.standard_normal((128, 64)).astype(np.float32),
                 "c": rng.integers(0, 256, (128, 768)).astype(np.uint8)})
kinds = sorted({r["kernel"] for r in s.explain()["nodes"] if r["op"] in ("DynamicQuantizeLinear", "DequantizeLinear")})
print(kinds, "numba" in sys.modules)
"""


def test_a_dynamically_quantized_product_runs_without_loading_numba():
    """DynamicQuantizeLinear and DequantizeLinear on oneDNN ask nothing of Numba: a
    quantize_dynamic model's runs (its embeddings' DequantizeLinear of 128 x 768 codes) do
    not start its load (~0.5 s of the GIL, ~100 MB)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _NO_NUMBA], capture_output=True, text=True, timeout=300,
                         check=True).stdout.strip()
    assert out == "['onednn.DequantizeLinear.binary', 'onednn.DynamicQuantizeLinear.threads'] False", out


# ---------------------------------------------------------------- glassrt::QuantizeDequantize


def _fake_quant_values(n):
    x = (RNG.standard_normal(n) * 6).astype(np.float32)
    special = np.array([np.inf, -np.inf, 1e30, -1e30, 3e38, 0.0, -0.0, 1e-40, -1e-40, 1e-45], np.float32)
    x[:special.size] = special
    k = min(400, n - special.size)
    ties = (np.arange(k, dtype=np.float32) - k // 2) * np.float32(0.5) * np.float32(0.04)  # (k / 2) * s: ties
    x[special.size:special.size + k] = ties
    return x


def _qdq_model(shape, zp, conv=False):
    """x -> [Conv ->] QuantizeLinear -> DequantizeLinear -> y (the pair fused into one node)."""
    from onnx import helper

    from .helpers import init, model, tensor

    nodes, inits, src = [], [init("s", np.array(0.04, np.float32))], "x"
    if conv:
        w = (RNG.standard_normal((shape[1], shape[1], 1, 1)) * 0.5).astype(np.float32)
        nodes.append(helper.make_node("Conv", ["x", "w"], ["c"], name="conv"))
        inits.append(init("w", w))
        src = "c"
    q_in = [src, "s"] + (["z"] if zp is not None else [])
    dq_in = ["q", "s"] + (["z"] if zp is not None else [])
    if zp is not None:
        inits.append(init("z", np.array(zp)))
    nodes += [helper.make_node("QuantizeLinear", q_in, ["q"], name="quant"),
              helper.make_node("DequantizeLinear", dq_in, ["y"], name="dequant")]
    return model(nodes, [tensor("x", list(shape))], [tensor("y", None)], inits)


@pytest.mark.parametrize("zp", [np.uint8(128), np.uint8(0), np.int8(-7), None])
@pytest.mark.parametrize("shape", [(3, 50), (1, 16, 48, 64)])  # (one thread; over SMALL_ELEMENTS: two)
def test_quantize_dequantize_is_cpus_bytes(shape, zp):
    """The binary division and its epilogue give cpu's kernel's bits: rounding ties, values
    past the range, infinities, signed zeros, subnormals."""
    import glassrt

    x = _fake_quant_values(int(np.prod(shape))).reshape(shape)
    m = _qdq_model(shape, zp)
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"], sess_options=glassrt.SessionOptions(nan_handling="fast"))
    assert [n["kernel"] for n in sess.explain()["nodes"]] == ["onednn.QuantizeDequantize.binary"]
    want = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("zp", [np.uint8(128), np.int8(-7)])
def test_quantize_dequantize_nan(zp):
    """A NaN: oneDNN's clip makes it the range's minimum, the reference's 0 for uint8 (so the
    kernel keeps the reference's value), -128 for int8: that kernel says it loses the NaN, and
    a run fed one takes the plan of kernels that keep it."""
    import glassrt

    shape = (1, 16, 48, 64)
    x = _fake_quant_values(int(np.prod(shape))).reshape(shape)
    x.reshape(-1)[[3, 777, x.size - 1]] = np.nan
    m = _qdq_model(shape, zp)
    want = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    node = sess.explain()["nodes"][0]
    assert node["kernel"] == "onednn.QuantizeDequantize.binary"
    assert bool(node.get("drops_nan")) == (zp.dtype == np.int8)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    assert sess.memory_stats()["runs_with_nan"] == (zp.dtype == np.int8)  # (uint8: the fast plan, kept as is)


def test_quantize_dequantize_between_convolutions_keeps_channels_last(monkeypatch):
    """After a oneDNN convolution the pair runs on the channels-last value in memory order, no
    reorder around it; the values are cpu's. (As a node of its own: fuse_conv_qdq, off here,
    would take it into the conv.)"""
    import glassrt
    from glassrt import passes

    monkeypatch.setattr(passes, "PIPELINE", [p for p in passes.PIPELINE if p.name != "fuse_conv_qdq"])

    shape = (1, 8, 20, 24)
    x = RNG.standard_normal(shape).astype(np.float32)
    m = _qdq_model(shape, np.uint8(120), conv=True)
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    got = sess.run(None, {"x": x})[0]
    plan = next(iter(sess.runner.plans.values()))
    step = next(st for st in plan.steps if st.node.op_type == "QuantizeDequantize")
    assert step.kernel.name == "onednn.QuantizeDequantize.binary"
    assert plan.layouts.get(step.node.inputs[0]) == "nhwc"
    want = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # (the convolutions' sums may differ)


def test_quantize_dequantize_with_a_computed_scale_is_left_to_cpu():
    """A glassrt::QuantizeDequantize node written with a computed scale (the fusion makes them
    with constants only): oneDNN's kernel fixes the scale into its primitive, so cpu's runs."""
    from onnx import helper

    import glassrt

    from .helpers import init, model, tensor

    nodes = [helper.make_node("Abs", ["s_in"], ["s"], name="abs"),
             helper.make_node("QuantizeDequantize", ["x", "s", "z"], ["y"], name="fake_quant", domain="glassrt")]
    m = model(nodes, [tensor("x", [2, 40]), tensor("s_in", [])], [tensor("y", None)], [init("z", np.array(3, np.uint8))],
              domains={"glassrt": 1})
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    x = RNG.standard_normal((2, 40)).astype(np.float32)
    node = next(n for n in sess.explain()["nodes"] if n["op"] == "QuantizeDequantize")
    assert node["kernel"] == "cpu.QuantizeDequantize"
    assert "computed at run time" in str(node)
    want = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x, "s_in": np.array(0.05, np.float32)})[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x, "s_in": np.array(0.05, np.float32)})[0], want)


def test_quantize_dequantize_step_reads_each_runs_values():
    """The step keeps its flat views while the same arrays come back (a plan's arena views):
    values written into them between runs are read, and an input read through a copy (plain
    into a channels-last output) is copied again every run."""
    import glassrt
    from glassrt.runtime.layout import channels_last_view

    shape = (1, 16, 48, 64)
    m = _qdq_model(shape, np.uint8(120))
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    x0 = RNG.standard_normal(shape).astype(np.float32)
    sess.run(None, {"x": x0})
    step = next(iter(sess.runner.plans.values())).steps[0]
    assert step.kernel.name == "onednn.QuantizeDequantize.binary"
    cpu = glassrt.InferenceSession(m, providers=["cpu"])

    def nhwc(a):
        return channels_last_view(np.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(-1), a.shape)

    for x, out in ((x0.copy(), np.empty(shape, np.float32)),  # plain into plain: views kept
                   (nhwc(x0), channels_last_view(np.empty(x0.size, np.float32), shape)),  # channels-last: kept
                   (x0.copy(), channels_last_view(np.empty(x0.size, np.float32), shape))):  # plain into NHWC: a copy
        for scale in (1.0, 3.0, -0.5):
            x[...] = x0 * np.float32(scale)  # (the same array objects, new values)
            step.fn(x, None, None, out=out)
            np.testing.assert_array_equal(out, cpu.run(None, {"x": np.ascontiguousarray(x)})[0])


def test_a_few_values_to_dequantize_stay_on_cpu_and_say_why():
    """A static DequantizeLinear of fewer than SMALL_ELEMENTS values (a classifier's logits)
    is left to cpu's kernel at placement, with the reason."""
    from onnx import TensorProto, helper

    import glassrt

    from .helpers import init, model, tensor

    m = model([helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")],
              [tensor("q", [1, 1000], TensorProto.UINT8)], [tensor("y", None)],
              [init("s", np.array(0.1, np.float32)), init("z", np.array(3, np.uint8))])
    row = {r["name"]: r for r in glassrt.InferenceSession(m).explain()["nodes"]}["dq"]
    assert row["kernel"] == "cpu.DequantizeLinear" and "1,000 values" in str(row["reason"])
