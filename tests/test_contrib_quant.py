"""onnxruntime's quantized contrib ops (glassrt/contrib/microsoft_quant.py) against onnxruntime.

Every case builds a one-node model (scales and zero points as initializers, as quantized
models carry them), runs it in onnxruntime's CPU provider, with graph optimizations off
and on, and in glassrt with native kernels only (providers=["cpu"], fallback="error"), on
the same random inputs. Outputs must be equal: integer outputs bit for bit, and the float
outputs (QGemm without y_scale, MatMulIntegerToFloat, DynamicQuantizeMatMul) too, since
they come from the same float32 operations. No off-by-one is allowed anywhere: the kernels
follow MLAS's float32 steps (see the module), and where a formula only equal to
onnxruntime's in exact arithmetic would differ, the inputs here are chosen to show it
(every pair of codes for QLinearAdd/Mul, every code for the lookup-table ops).
The end-to-end tests quantize small float models with onnxruntime's own tool (static
QOperator, dynamic) and compare every intermediate tensor.
"""
from __future__ import annotations

import functools
import os
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt
from glassrt.tools import check as checks

from .helpers import expose

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
U8, I8, F32, F16 = np.uint8, np.int8, np.float32, np.float16
QTYPES = [U8, I8]


# ---------------------------------------------------------------- harness


def _model(op, inputs, consts=(), n_out=1, onnx_opset=17, **attrs):
    """A one-node model: inputs[i] is a graph input, an initializer (i in consts) or
    omitted (None)."""
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, domain=MS, name="node", **attrs)
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))
           for i, (n, x) in enumerate(zip(names, inputs)) if n and i not in consts]
    inits = [numpy_helper.from_array(np.asarray(x), n) for i, (n, x) in enumerate(zip(names, inputs))
             if n and i in consts]
    graph = helper.make_graph([node], "g", vis, [onnx.ValueInfoProto(name=o) for o in outs], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx_opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    feeds = {n: x for i, (n, x) in enumerate(zip(names, inputs)) if n and i not in consts}
    return model, feeds


def _ort(model, feeds, optimize=False):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _glassrt(model, feeds):
    return glassrt.InferenceSession(model, providers=["cpu"], fallback="error").run(None, feeds)


def _params(inputs):
    """The indices of the scale and zero-point inputs (0-d or one-element), made initializers."""
    return {i for i, x in enumerate(inputs) if x is not None and x.size == 1 and x.ndim <= 1 and i > 0}


def compare(op, inputs, consts=None, omit=(), **attrs):
    """Run op in glassrt and in onnxruntime (optimizations off and on); outputs must be equal.
    omit: zero points (given as zeros) that glassrt's model leaves out. onnxruntime gets the
    zeros: its type inference refuses most models without zero points, and for some ops
    (QLinearSigmoid) its assertion-enabled build aborts the process."""
    consts = _params(inputs) if consts is None else consts
    model, feeds = _model(op, inputs, consts, **attrs)
    if omit:
        _require_zeros(inputs, omit)
        model_g, feeds_g = _model(op, [None if i in omit else x for i, x in enumerate(inputs)], consts, **attrs)
    else:
        model_g, feeds_g = model, feeds
    got = _glassrt(model_g, feeds_g)
    for optimize in (False, True):
        ref = _ort(model, feeds, optimize)
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert g.dtype == r.dtype and g.shape == r.shape, \
                f"{op}: {g.dtype}{g.shape} vs onnxruntime {r.dtype}{r.shape}"
            bad = _differ(g, r)
            assert bad.size == 0, (f"{op} (onnxruntime optimizations {'on' if optimize else 'off'}): {bad.size} of "
                                   f"{g.size} differ, first at flat index {bad[0]}: {g.reshape(-1)[bad[0]]} vs "
                                   f"{r.reshape(-1)[bad[0]]}")
    return got[0]


def _require_zeros(inputs, omit):
    assert all(not np.any(inputs[i]) for i in omit), "an omitted zero point stands for 0"


def rng_for(*key):
    """A generator seeded by `key` the same way in every process (str hashes are salted per
    process: a test's inputs, NaNs from an overflowing Relu among them, changed run to run)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _differ(g, r):
    """Flat indices where two outputs differ bit for bit, NaN against NaN counting as equal."""
    g, r = g.reshape(-1), r.reshape(-1)
    both_nan = np.isnan(g) & np.isnan(r) if g.dtype.kind == "f" else False
    return np.flatnonzero((g != r) & ~both_nan)


def q(rng, dt, *shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, shape).astype(dt)


@functools.lru_cache(maxsize=None)
def ort_saturates_u8s8() -> bool:
    """Whether this machine's onnxruntime adds uint8 x int8 products in int16 pairs that
    saturate (MLAS's AVX2 kernel without VNNI: vpmaddubsw). [255, 255] . [127, 127] is 64770
    exactly; such a build gives 32767. glassrt computes the exact sum, as the ONNX spec says."""
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
                          [numpy_helper.from_array(np.full((2, 1), 127, I8), "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return int(_ort(model, {"a": np.full((1, 2), 255, U8)})[0][0, 0]) != 64770


def weights(rng, ta, tb, *shape):
    """B of a uint8 x int8 product. Where onnxruntime saturates such products (see above),
    int8 weights keep to 7 bits, as its quantizer's reduce_range does for this reason:
    then no pair of products leaves int16 and both runtimes must agree exactly."""
    if ta == U8 and tb == I8 and ort_saturates_u8s8():
        return rng.integers(-64, 64, shape).astype(I8)
    return q(rng, tb, *shape)


def scale(v):
    return np.asarray(v, F32)


def zp(rng, dt):
    info = np.iinfo(dt)
    return np.asarray(rng.integers(info.min, info.max + 1), dt)


def all_pairs(dt):
    """Every (a, b) pair of 8-bit codes: A and B of 65536 elements."""
    codes = np.arange(256, dtype=np.uint8).view(dt)
    return np.tile(codes, 256), np.repeat(codes, 256)


# ---------------------------------------------------------------- QLinearAdd, QLinearMul


# Scales whose ratios sit one float32 ulp off 1/2 (with the other ratio 1 or just under 1/2)
# put thousands of exact results within an ulp of .5: a float32 step done in another order
# than MLAS's, or unfused, rounds them the other way.
NEAR_TIES = [(0.5 + 2 ** -24, 1.0, 1.0), (0.5 - 2 ** -25, 1.0, 1.0), (0.75 + 2 ** -24, 0.5 - 2 ** -25, 1.0)]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("layout", ["flat", "A per span", "B per span"])
def test_binary_every_pair_of_codes(op, dt, layout):
    """Every pair of codes, laid out so that onnxruntime's broadcast loop hands MLAS two
    vectors, or A (then B) as the per-span scalar (QLinearAdd's fused multiply-adds then
    come in another order), under near-tie and random scales."""
    rng = rng_for(op, dt, layout)
    codes = np.arange(256, dtype=np.uint8).view(dt)
    a, b = {"flat": all_pairs(dt), "A per span": (codes.reshape(256, 1), codes.reshape(1, 256)),
            "B per span": (codes.reshape(1, 256), codes.reshape(256, 1))}[layout]
    params = [(*s, True) for s in NEAR_TIES] + [(*rng.uniform(0.002, 0.1, 3), False) for _ in range(3)]
    for sa, sb, sc, zero in params:
        zps = [np.zeros((), dt)] * 3 if zero else [zp(rng, dt) for _ in range(3)]
        compare(op, [a, scale(sa), zps[0], b, scale(sb), zps[1], scale(sc), zps[2]])
        if zero:
            compare(op, [a, scale(sa), zp(rng, dt), b, scale(sb), zp(rng, dt), scale(sc), zp(rng, dt)])


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", QTYPES)
def test_binary_compiled_pass_is_the_tile_path_bit_for_bit(monkeypatch, op, dt):
    """Same-shape QLinearAdd / QLinearMul (a CNN's residual, its SiLU) run one compiled pass,
    over the bytes in memory order where all three values are channels-last: the tile-by-tile
    path's codes for every pair of codes, near-tie scales included."""
    pytest.importorskip("numba")
    from glassrt.contrib import microsoft_quant as mq
    from glassrt.runtime.layout import channels_last_view

    rng = rng_for("qbinary-compiled", op, dt)
    kernel = (mq.qlinear_add if op == "QLinearAdd" else mq.qlinear_mul).kernels["cpu"]
    a, b = all_pairs(dt)
    shape = (1, 16, 64, 64)  # 65,536 pairs
    for sa, sb, sc in NEAR_TIES + [tuple(rng.uniform(0.002, 0.1, 3)) for _ in range(3)]:
        params = [scale(sa), zp(rng, dt), scale(sb), zp(rng, dt), scale(sc), zp(rng, dt)]
        args = lambda x, y: (x, params[0], params[1], y, params[2], params[3], params[4], params[5])  # noqa: E731
        monkeypatch.setattr(mq, "use_compiled", lambda path: False)
        tiles = kernel(*args(a.reshape(shape), b.reshape(shape)), out=np.empty(shape, dt))
        monkeypatch.setattr(mq, "use_compiled", lambda path: True)
        plain = kernel(*args(a.reshape(shape), b.reshape(shape)), out=np.empty(shape, dt))
        np.testing.assert_array_equal(plain, tiles)
        nhwc = lambda v: channels_last_view(np.ascontiguousarray(v.reshape(shape).transpose(0, 2, 3, 1)).reshape(-1), shape)  # noqa: E731
        out = channels_last_view(np.empty(a.size, dt), shape)
        np.testing.assert_array_equal(kernel(*args(nhwc(a), nhwc(b)), out=out), tiles)
        # mixed layouts (a residual read plain beside a channels-last one): the elements line up
        for x, y, o in ((nhwc(a), b.reshape(shape), np.empty(shape, dt)), (a.reshape(shape), nhwc(b), out)):
            np.testing.assert_array_equal(kernel(*args(x, y), out=o), tiles)


@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dt", QTYPES)
def test_lookup_compiled_pass_is_the_tile_path_bit_for_bit(monkeypatch, op, dt):
    """The table activations run one compiled gather where input and output share a layout
    (plain, or both channels-last: each byte on its own): the tile path's codes."""
    pytest.importorskip("numba")
    from glassrt.contrib import microsoft_quant as mq
    from glassrt.runtime.layout import channels_last_view

    from glassrt.kernels.cpu import quantize

    rng = rng_for("qlookup-compiled", op, dt)
    kernel = (mq.qlinear_sigmoid if op == "QLinearSigmoid" else mq.qlinear_leaky_relu).kernels["cpu"]
    shape = (2, 8, 8, 4)
    x = np.tile(np.arange(256, dtype=np.uint8).view(dt), 2).reshape(shape)
    params = [scale(0.04), zp(rng, dt), scale(0.01), zp(rng, dt)]
    monkeypatch.setattr(quantize, "use_compiled", lambda path, after=64: False)
    tiles = kernel(x, *params, out=np.empty(shape, dt))
    monkeypatch.setattr(quantize, "use_compiled", lambda path, after=64: True)
    np.testing.assert_array_equal(kernel(x, *params, out=np.empty(shape, dt)), tiles)
    nhwc_x = channels_last_view(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(-1), shape)
    out = channels_last_view(np.empty(x.size, dt), shape)
    np.testing.assert_array_equal(kernel(nhwc_x, *params, out=out), tiles)
    np.testing.assert_array_equal(kernel(nhwc_x, *params, out=np.empty(shape, dt)), tiles)  # mixed: the tile path


def test_qlinear_concat_takes_channels_last_values():
    """QLinearConcat along the channels reads and writes channels-last views (a quantized
    YOLO's C2f concat between QLinearConvs) as it does plain arrays."""
    from glassrt.contrib import microsoft_quant as mq
    from glassrt.runtime.layout import channels_last_view

    rng = rng_for("qconcat-nhwc")
    parts = [q(rng, U8, 1, c, 5, 6) for c in (3, 4)]
    params = [scale(0.05), zp(rng, U8), scale(0.04), zp(rng, U8)]
    y_params = [scale(0.06), zp(rng, U8)]
    shape = (1, 7, 5, 6)
    nhwc = lambda a: channels_last_view(np.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(-1), a.shape)  # noqa: E731
    plain = mq._qlinear_concat(*y_params, parts[0], *params[:2], parts[1], *params[2:], out=np.empty(shape, U8), axis=1)
    out = channels_last_view(np.empty(int(np.prod(shape)), U8), shape)
    got = mq._qlinear_concat(*y_params, nhwc(parts[0]), *params[:2], nhwc(parts[1]), *params[2:], out=out, axis=1)
    np.testing.assert_array_equal(got, plain)
    # the bound kernel's compiled pass writes each input's rows into its channel slice
    pytest.importorskip("numba")
    from glassrt.ir import type_of_value
    from glassrt.kernels.registry import BindContext

    inputs = [*y_params, parts[0], *params[:2], parts[1], *params[2:]]
    node = type("Node", (), {"inputs": ["v%d" % i for i in range(len(inputs))], "outputs": ["y"], "opset": 1,
                             "name": "concat", "op_type": "QLinearConcat", "domain": "com.microsoft"})()
    step = mq.qlinear_concat.kernels["cpu"].builder(
        BindContext(node, {"axis": 1}, [type_of_value(x) for x in inputs], [], inputs))
    for xs, out in (([nhwc(p) for p in parts], channels_last_view(np.empty(int(np.prod(shape)), U8), shape)),
                    (parts, np.empty(shape, U8)),
                    ([nhwc(parts[0]), parts[1]], channels_last_view(np.empty(int(np.prod(shape)), U8), shape))):
        got = step(*y_params, xs[0], *params[:2], xs[1], *params[2:], out=out)
        np.testing.assert_array_equal(got, plain)
    # the same arrays again with other bytes (a plan's arena views, run after run): the kept
    # spans read the new bytes
    xs, out = [nhwc(p) for p in parts], channels_last_view(np.empty(int(np.prod(shape)), U8), shape)
    step(*y_params, xs[0], *params[:2], xs[1], *params[2:], out=out)
    for x in xs:
        x[...] = 255 - x
    again = mq._qlinear_concat(*y_params, 255 - parts[0], *params[:2], 255 - parts[1], *params[2:],
                               out=np.empty(shape, U8), axis=1)
    np.testing.assert_array_equal(step(*y_params, xs[0], *params[:2], xs[1], *params[2:], out=out), again)


BROADCASTS = [
    ((3, 4, 5), (3, 4, 5)),
    ((2, 3, 4, 5), (5,)),
    ((5,), (2, 3, 4, 5)),
    ((64, 33), (64, 1)),       # B is the per-span scalar
    ((64, 1), (64, 33)),       # A is: onnxruntime hands the inputs to MLAS the other way round
    ((1, 33), (40, 1)),
    ((2, 3, 1), (3, 40)),
    ((4, 1, 40), (4, 40, 1)),
    ((40,), ()), ((), (40,)), ((), ()), ((1,), ()),
    ((2, 1), (1,)),            # both innermost dims 1: A counts as the scalar
    ((1,), (3, 1)),
    ((30, 1), (1, 30, 1)),
]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("sa, sb", BROADCASTS)
def test_binary_broadcasting(op, dt, sa, sb):
    rng = rng_for(op, dt, sa, sb)
    for _ in range(3):
        compare(op, [q(rng, dt, *sa), scale(rng.uniform(0.005, 0.1)), zp(rng, dt), q(rng, dt, *sb),
                     scale(rng.uniform(0.005, 0.1)), zp(rng, dt), scale(rng.uniform(0.005, 0.1)), zp(rng, dt)])


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", QTYPES)
def test_binary_optional_zero_points_and_dynamic_parameters(op, dt):
    rng = rng_for(op, dt, "zp")
    a, b = all_pairs(dt)
    zero = np.zeros((), dt)
    compare(op, [a, scale(0.03), zero, b, scale(0.05), zero, scale(0.06), zero], omit={2, 5, 7})
    compare(op, [a, scale(0.03), zp(rng, dt), b, scale(0.05), zero, scale(0.06), zp(rng, dt)], omit={5})
    compare(op, [a, scale(0.03), zp(rng, dt), b, scale(0.05), zp(rng, dt), scale(0.06), None])
    # Parameters as graph inputs (onnxruntime computes them per run).
    ins = [q(rng, dt, 7, 9), scale(0.02), zp(rng, dt), q(rng, dt, 9), scale(0.03), zp(rng, dt), scale(0.04),
           zp(rng, dt)]
    y = compare(op, ins, consts=())
    # One-element 1-D parameters are per-tensor too (onnxruntime's kernels take them, its
    # type inference refuses them as graph inputs).
    ones = [x.reshape(1) if i in (1, 2, 4, 5, 6, 7) else x for i, x in enumerate(ins)]
    np.testing.assert_array_equal(_glassrt(*_model(op, ones))[0], y)


# ---------------------------------------------------------------- lookup-table activations


def every_code(dt, *shape):
    codes = np.arange(256, dtype=np.uint8).view(dt)
    return np.resize(codes, shape) if shape else codes


@pytest.mark.parametrize("dt", QTYPES)
def test_qlinear_sigmoid(dt):
    rng = rng_for("sigmoid", dt)
    for _ in range(25):
        # Output steps as fine as 1/512 put table entries next to rounding boundaries.
        compare("QLinearSigmoid", [every_code(dt), scale(rng.uniform(0.005, 0.2)), zp(rng, dt),
                                   scale(rng.uniform(1 / 512, 1 / 64)), zp(rng, dt)])
    zero = np.zeros((), dt)
    compare("QLinearSigmoid", [every_code(dt, 2, 3, 50), scale(0.08), zero, scale(1 / 256), zero], omit={2, 4})


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("alpha", [None, 0.1, 0.33])
def test_qlinear_leaky_relu(dt, alpha):
    rng = rng_for("leaky", dt, alpha)
    attrs = {} if alpha is None else {"alpha": alpha}
    for _ in range(25):
        compare("QLinearLeakyRelu", [every_code(dt), scale(rng.uniform(0.005, 0.2)), zp(rng, dt),
                                     scale(rng.uniform(0.005, 0.2)), zp(rng, dt)], **attrs)
    zero = np.zeros((), dt)
    compare("QLinearLeakyRelu", [every_code(dt, 4, 70), scale(0.05), zero, scale(0.04), zero], consts=(),
            omit={2, 4}, **attrs)


# ---------------------------------------------------------------- pooling


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (3, 4, 20), (2, 3, 4, 5, 6), (1, 1, 300)])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(dt, shape, channels_last):
    rng = rng_for("gap", dt, shape, channels_last)
    for _ in range(4):
        compare("QLinearGlobalAveragePool", [q(rng, dt, *shape), scale(rng.uniform(0.005, 0.2)), zp(rng, dt),
                                             scale(rng.uniform(0.005, 0.2)), zp(rng, dt)], channels_last=channels_last)


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("compiled", [True, False])
def test_qlinear_global_average_pool_reads_channels_last_values(dt, compiled, monkeypatch):
    """A quantized CNN's head reads channels-last bytes (its last QLinearConv's output): each
    pixel's channels summed by a compiled pass, the same bytes as the plain array's sums."""
    from glassrt.contrib import microsoft_quant as mq
    from glassrt.runtime.layout import channels_last_view

    if compiled:
        pytest.importorskip("numba")
    monkeypatch.setattr(mq, "use_compiled", lambda path: compiled)
    rng = rng_for("gap-nhwc", dt)
    x = q(rng, dt, 2, 37, 7, 5)
    nhwc = channels_last_view(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(-1), x.shape)
    kernel = mq.qlinear_global_average_pool.kernels["cpu"]
    for params in ([scale(0.05), zp(rng, dt), scale(0.02), zp(rng, dt)], [scale(0.3), None, scale(0.001), None]):
        want = kernel(x, *params)
        np.testing.assert_array_equal(kernel(nhwc, *params), want)
        np.testing.assert_array_equal(kernel(nhwc, *params, out=np.empty(want.shape, dt)), want)


POOLS = [
    ((2, 3, 9, 8), {"kernel_shape": [3, 3]}),
    ((2, 3, 9, 8), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}),
    ((2, 3, 9, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ((2, 3, 9, 8), {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1}),
    # count_include_pad with ceil-mode windows past the end padding: onnxruntime divides by the whole kernel
    ((2, 3, 9, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0], "ceil_mode": 1,
                    "count_include_pad": 1}),
    ((2, 3, 9, 8), {"kernel_shape": [3, 3], "strides": [2, 3], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 9, 8), {"kernel_shape": [4, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER", "count_include_pad": 1}),
    ((2, 3, 9, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    ((2, 4, 25), {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [1, 0, 1, 0, 1, 1]}),
    # A window over the whole unpadded image: onnxruntime switches to the global pool's integer path
    ((2, 3, 7, 5), {"kernel_shape": [7, 5]}),
    ((2, 3, 7, 5), {"kernel_shape": [7, 5], "strides": [2, 2], "ceil_mode": 1}),
]


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("shape, attrs", POOLS)
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_average_pool(dt, shape, attrs, channels_last):
    rng = rng_for("avgpool", dt, shape, str(attrs), channels_last)
    x = q(rng, dt, *shape)
    if channels_last:
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    for _ in range(3):
        compare("QLinearAveragePool", [x, scale(rng.uniform(0.005, 0.2)), zp(rng, dt), scale(rng.uniform(0.005, 0.2)),
                                       zp(rng, dt)], channels_last=channels_last, **attrs)


@pytest.mark.parametrize("dt", QTYPES)
def test_pooling_rounds_half_to_even(dt):
    """Unit scales and windows of 2 or 4 cells make exact halves: rounded to even, as MLAS's
    conversion does (the float path of QLinearAveragePool and the integer path of the
    global pool both)."""
    rng = rng_for("pool-ties", dt)
    for zero in (True, False):
        zx, zy = (np.zeros((), dt), np.zeros((), dt)) if zero else (zp(rng, dt), zp(rng, dt))
        x = q(rng, dt, 2, 3, 8, 6)
        compare("QLinearAveragePool", [x, scale(1), zx, scale(1), zy], kernel_shape=[2, 2], strides=[2, 1])
        compare("QLinearAveragePool", [x, scale(1), zx, scale(1), zy], kernel_shape=[2, 1], pads=[1, 0, 1, 0])
        compare("QLinearGlobalAveragePool", [q(rng, dt, 2, 30, 2, 2), scale(1), zx, scale(1), zy])
        compare("QLinearGlobalAveragePool", [q(rng, dt, 2, 30, 2, 2), scale(0.5), zx, scale(0.25), zy])


@pytest.mark.parametrize("dt", QTYPES)
def test_qlinear_average_pool_optional_zero_points(dt):
    rng = rng_for("avgpool-zp", dt)
    zero = np.zeros((), dt)
    compare("QLinearAveragePool", [q(rng, dt, 2, 3, 8, 8), scale(0.05), zero, scale(0.03), zero], omit={2, 4},
            kernel_shape=[3, 3], pads=[1, 1, 1, 1])


# ---------------------------------------------------------------- QLinearConcat, QLinearWhere


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_qlinear_concat(dt, axis, compiled, monkeypatch):
    """Both ways: the compiled pass per input into its place, and the NumPy path."""
    from glassrt.contrib import microsoft_quant as mq

    if compiled:
        pytest.importorskip("numba")
    monkeypatch.setattr(mq, "use_compiled", lambda path: compiled)
    rng = rng_for("concat", dt, axis)
    ys, yz = scale(rng.uniform(0.01, 0.1)), zp(rng, dt)
    inputs = [ys, yz]
    for k in range(4):
        shape = [2, 3, 4]
        shape[axis] = int(rng.integers(1, 4))
        if k == 1:  # the same parameters as Y: onnxruntime copies the bytes
            inputs += [q(rng, dt, *shape), ys.copy(), yz.copy()]
        else:
            inputs += [q(rng, dt, *shape), scale(rng.uniform(0.005, 0.2)), zp(rng, dt)]
    compare("QLinearConcat", inputs, axis=axis)
    compare("QLinearConcat", inputs, consts=(), axis=axis)


WHERES = [((2, 3, 4), (2, 3, 4), (2, 3, 4)), ((3, 1), (1, 4), (3, 4)), ((4,), (3, 4), ()), ((), (2, 1, 1), (1,)),
          ((2, 1, 4), (3, 1), (1, 3, 4))]


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("sc, sx, sy", WHERES)
def test_qlinear_where(dt, sc, sx, sy):
    rng = rng_for("where", dt, sc, sx, sy)
    cond = np.asarray(rng.random(sc) > 0.5)
    for same in (False, True):
        sz, zz = scale(rng.uniform(0.01, 0.1)), zp(rng, dt)
        xs, xz = (sz.copy(), zz.copy()) if same else (scale(rng.uniform(0.01, 0.1)), zp(rng, dt))
        compare("QLinearWhere", [cond, q(rng, dt, *sx), xs, xz, q(rng, dt, *sy), scale(rng.uniform(0.01, 0.1)),
                                 zp(rng, dt), sz, zz])


# ---------------------------------------------------------------- QGemm


def _qgemm_inputs(rng, ta, tb, m, k, n, trans_a, trans_b, per_column, c_shape, quantized):
    a = q(rng, ta, *((k, m) if trans_a else (m, k)))
    b = weights(rng, ta, tb, *((n, k) if trans_b else (k, n)))
    if per_column:
        bs, bz = rng.uniform(0.001, 0.05, n).astype(F32), q(rng, tb, n)
    else:
        bs, bz = scale(rng.uniform(0.001, 0.05)), zp(rng, tb)
    c = None if c_shape is None else rng.integers(-5000, 5000, c_shape).astype(np.int32)
    ys, yz = (scale(rng.uniform(0.05, 0.5)), zp(rng, ta)) if quantized else (None, None)
    return [a, scale(rng.uniform(0.001, 0.05)), zp(rng, ta), b, bs, bz, c, ys, yz]


@pytest.mark.parametrize("ta, tb", [(U8, U8), (U8, I8), (I8, I8)])
@pytest.mark.parametrize("quantized", [True, False])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (6,), (1, 6), (5, 1), (5, 6)])
def test_qgemm(ta, tb, quantized, c_shape):
    rng = rng_for("qgemm", ta, tb, quantized, c_shape)
    for trans_a, trans_b, per_column, alpha in [(0, 0, False, 1.0), (1, 0, True, 0.5), (0, 1, False, 2.5),
                                                (1, 1, True, 1.0)]:
        ins = _qgemm_inputs(rng, ta, tb, 5, 37, 6, trans_a, trans_b, per_column, c_shape, quantized)
        compare("QGemm", ins, consts={1, 2, 4, 5, 6, 7, 8}, alpha=alpha, transA=trans_a, transB=trans_b)


@pytest.mark.parametrize("ta, tb", [(U8, I8), (I8, I8)])
def test_qgemm_rounds_half_to_even(ta, tb):
    """a_scale · b_scale / y_scale = 1/2 exactly: every odd accumulator is a tie."""
    rng = rng_for("qgemm-ties", ta, tb)
    ins = _qgemm_inputs(rng, ta, tb, 16, 9, 16, 0, 0, False, (16,), True)
    ins[1], ins[4], ins[7] = scale(0.5), scale(0.25), scale(0.25)
    compare("QGemm", ins)


def test_qgemm_large_and_weights_as_inputs():
    rng = rng_for("qgemm-large")
    ins = _qgemm_inputs(rng, U8, I8, 33, 300, 70, 0, 1, True, (70,), True)
    compare("QGemm", ins, consts=(), transB=1)


def test_qgemm_y_scale_or_zero_point_alone():
    """As onnxruntime: y_scale without y_zero_point gives a float32 output divided by it;
    y_zero_point without y_scale a quantized output whose scale is not divided."""
    rng = rng_for("qgemm-alone")
    ins = _qgemm_inputs(rng, U8, U8, 4, 9, 5, 0, 0, False, None, True)
    assert compare("QGemm", ins[:8]).dtype == F32
    assert compare("QGemm", ins[:7] + [None, ins[8]]).dtype == U8


# ---------------------------------------------------------------- QLinearSoftmax


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("shape, axis, opset", [((4, 7, 10), -1, 13), ((4, 7, 10), 1, 13), ((4, 7, 10), 0, 13),
                                                ((3, 300), -1, 13), ((2, 3, 4, 5), 2, 12), ((2, 3, 4, 5), -3, 12),
                                                ((6, 9), None, 12), ((6, 9), None, 13), ((17,), 0, 13)])
def test_qlinear_softmax(dt, shape, axis, opset):
    rng = rng_for("softmax", dt, shape, axis, opset)
    attrs = {"opset": opset} if axis is None else {"opset": opset, "axis": axis}
    lo = np.iinfo(dt).min
    # What onnxruntime's quantizer writes (scale 1/256, zero point at the bottom), then others.
    params = [(1 / 256, lo)] + [(rng.uniform(1 / 300, 1 / 100), int(rng.integers(lo, lo + 20))) for _ in range(2)]
    for ys, yz in params:
        compare("QLinearSoftmax", [q(rng, dt, *shape), scale(rng.uniform(0.01, 0.3)), zp(rng, dt), scale(ys),
                                   np.asarray(yz, dt)], **attrs)


def test_qlinear_softmax_saturates_int8():
    """A probability near 1 is 256 steps of 1/256 above the zero point -128: int8 saturates
    at 127 (onnxruntime once wrapped it around)."""
    x = np.array([[100, -50, -60, -70, -128, -100]], I8)
    y = compare("QLinearSoftmax", [x, scale(0.2), np.zeros((), I8), scale(1 / 256), np.asarray(-128, I8)], omit={2},
                opset=13)
    assert y[0, 0] == 127


# ---------------------------------------------------------------- MatMulIntegerToFloat, DynamicQuantizeMatMul


def _b_params(rng, tb, kind, b_shape):
    n = b_shape[-1]
    if kind == "tensor":
        return scale(rng.uniform(0.001, 0.05)), zp(rng, tb)
    if kind == "column":
        return rng.uniform(0.001, 0.05, n).astype(F32), q(rng, tb, n)
    if kind == "matrix":  # one per column of each matrix of B
        shape = tuple(b_shape[:-2]) + (1, n)
        return rng.uniform(0.001, 0.05, shape).astype(F32), q(rng, tb, *shape)
    return scale(rng.uniform(0.001, 0.05)), None


MATMULS = [((5, 16), (16, 7), "tensor"), ((2, 5, 16), (16, 7), "column"), ((3, 1, 4, 16), (3, 2, 16, 7), "matrix"),
           ((2, 5, 16), (2, 16, 7), "none"), ((16,), (16, 7), "column"), ((3, 1, 4, 40), (40, 9), "tensor")]


@pytest.mark.parametrize("ta, tb", [(U8, U8), (U8, I8), (I8, I8)])
@pytest.mark.parametrize("sa, sb, kind", MATMULS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_integer_to_float(ta, tb, sa, sb, kind, with_bias):
    rng = rng_for("mitf", ta, tb, sa, sb, kind, with_bias)
    bs, bz = _b_params(rng, tb, kind, sb)
    bias = rng.standard_normal(sb[-1]).astype(F32) if with_bias else None
    az = zp(rng, ta) if kind != "none" else None
    compare("MatMulIntegerToFloat", [q(rng, ta, *sa), weights(rng, ta, tb, *sb), scale(rng.uniform(0.001, 0.05)), bs, az, bz,
                                     bias], consts={1, 2, 3, 4, 5, 6})


def test_matmul_integer_to_float_float16():
    rng = rng_for("mitf16")
    compare("MatMulIntegerToFloat", [q(rng, U8, 3, 7, 20), weights(rng, U8, I8, 20, 9), np.asarray(0.02, F16),
                                     rng.uniform(0.001, 0.05, 9).astype(F16), zp(rng, U8), None,
                                     rng.standard_normal(9).astype(F16)], consts={1, 2, 3, 4, 6})


def test_matmul_integer_to_float_scales_onnxruntime_moves():
    """onnxruntime's fusion may leave B's per-column scale in a_scale's place (it swaps them
    back), and a per-row a_scale or a b_scale of another shape is applied after the bias."""
    rng = rng_for("mitf-fixup")
    a, b = q(rng, U8, 2, 5, 16), weights(rng, U8, I8, 16, 7)
    col = rng.uniform(0.001, 0.05, 7).astype(F32)
    bias = rng.standard_normal(7).astype(F32)
    compare("MatMulIntegerToFloat", [a, b, col, scale(0.02), zp(rng, U8), None, bias])
    compare("MatMulIntegerToFloat", [a, b, rng.uniform(0.001, 0.05, (2, 5, 1)).astype(F32), scale(0.03), zp(rng, U8),
                                     None, bias])
    compare("MatMulIntegerToFloat", [a, weights(rng, U8, I8, 2, 16, 7), scale(0.02), col, zp(rng, U8), None, bias])


@pytest.mark.parametrize("tb", QTYPES)
@pytest.mark.parametrize("sa, sb, kind", MATMULS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_dynamic_quantize_matmul(tb, sa, sb, kind, with_bias):
    rng = rng_for("dqmm", tb, sa, sb, kind, with_bias)
    bs, bz = _b_params(rng, tb, kind, sb)
    bias = rng.standard_normal(sb[-1]).astype(F32) if with_bias else None
    for a in (rng.standard_normal(sa).astype(F32) * 3, np.abs(rng.standard_normal(sa)).astype(F32)):
        compare("DynamicQuantizeMatMul", [a, weights(rng, U8, tb, *sb), bs, bz, bias], consts={1, 2, 3, 4})


def test_dynamic_quantize_matmul_all_zero_input():
    rng = rng_for("dqmm-zero")
    compare("DynamicQuantizeMatMul", [np.zeros((3, 8), F32), weights(rng, U8, I8, 8, 4), scale(0.02), None,
                                      rng.standard_normal(4).astype(F32)])


# ---------------------------------------------------------------- validation


def _run(op, inputs, **attrs):
    model, feeds = _model(op, inputs, (), **attrs)
    return _glassrt(model, feeds)


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("QLinearAdd", lambda r: [q(r, U8, 3), np.ones(3, F32), None, q(r, U8, 3), scale(1), None, scale(1), None], {},
     "A_scale must be a scalar"),
    ("QLinearAdd", lambda r: [q(r, U8, 3), scale(1), np.asarray(0, I8), q(r, U8, 3), scale(1), None, scale(1), None],
     {}, "A_zero_point is int8 but the data it belongs to is uint8"),
    ("QLinearMul", lambda r: [q(r, U8, 3), scale(1), None, q(r, U8, 4), scale(1), None, scale(1), None], {},
     "do not broadcast"),
    ("QLinearMul", lambda r: [q(r, U8, 3), scale(1), None, q(r, I8, 3), scale(1), None, scale(1), None], {},
     "B is int8 but A is uint8"),
    ("QLinearSigmoid", lambda r: [q(r, I8, 3), scale(1), None, scale(0), None], {}, "positive finite"),
    ("QLinearLeakyRelu", lambda r: [np.ones(3, F32), scale(1), None, scale(1), None], {}, "uint8 or int8"),
    ("QLinearGlobalAveragePool", lambda r: [q(r, U8, 2, 3), scale(1), np.asarray(0, U8), scale(1),
                                            np.asarray(0, U8)], {}, "rank 3 or more"),
    ("QLinearAveragePool", lambda r: [q(r, U8, 1, 1, 5, 5), scale(1), None, scale(1), None],
     {"kernel_shape": [3, 3], "pads": [3, 0, 0, 0]}, "smaller than the kernel"),
    ("QLinearAveragePool", lambda r: [q(r, U8, 1, 1, 5, 5), scale(1), None, scale(1), None], {"kernel_shape": [3]},
     "one entry per spatial dim"),
    ("QLinearConcat", lambda r: [scale(1), np.asarray(0, U8), q(r, U8, 2, 3), scale(1)], {"axis": 0}, "triples"),
    ("QLinearConcat", lambda r: [scale(1), np.asarray(0, U8), q(r, U8, 2, 3), scale(1), np.asarray(0, U8),
                                 q(r, U8, 2, 4), scale(1), np.asarray(0, U8)], {"axis": 0}, "differ outside axis"),
    ("QLinearConcat", lambda r: [scale(1), np.asarray(0, U8), q(r, I8, 2, 3), scale(1), np.asarray(0, I8)],
     {"axis": 0}, "input 0 is int8 but Y_zero_point is uint8"),
    ("QLinearWhere", lambda r: [np.ones(3, bool), q(r, U8, 3), scale(1), np.asarray(0, U8), q(r, U8, 4), scale(1),
                                np.asarray(0, U8), scale(1), np.asarray(0, U8)], {}, "do not broadcast"),
    ("QGemm", lambda r: [q(r, U8, 2, 3), scale(1), np.asarray(0, U8), q(r, U8, 4, 5), scale(1), np.asarray(0, U8)],
     {}, "inner dimensions differ"),
    ("QGemm", lambda r: [q(r, U8, 2, 3), scale(1), np.asarray(0, U8), q(r, U8, 3, 5), np.ones(5, F32),
                         np.asarray(0, U8)], {}, "same shape"),
    ("QGemm", lambda r: [q(r, U8, 2, 3), scale(1), np.asarray(0, U8), q(r, U8, 3, 5), scale(1), np.asarray(0, U8),
                         np.ones((3, 5), np.int32)], {}, "does not broadcast"),
    ("QLinearSoftmax", lambda r: [q(r, U8, 2, 3), scale(1), None, scale(1 / 256), np.asarray(0, U8)],
     {"opset": 13, "axis": 2}, "out of range"),
    ("MatMulIntegerToFloat", lambda r: [q(r, U8, 2, 3), q(r, I8, 3, 4), scale(1), scale(1), None,
                                        np.zeros(3, I8)], {}, "b_zero_point"),
    ("MatMulIntegerToFloat", lambda r: [q(r, U8, 2, 3), q(r, I8, 3, 4), scale(1), np.asarray(1, F16)], {},
     "both be float32 or both float16"),
    ("DynamicQuantizeMatMul", lambda r: [np.ones((2, 3), F32), q(r, I8, 3, 4), scale(1), None,
                                         np.ones(3, F32)], {}, "bias must be 1-D"),
])
def test_invalid_inputs_are_refused(op, inputs, attrs, message):
    with pytest.raises(glassrt.GlassrtError, match=message) as info:
        _run(op, inputs(np.random.default_rng(0)), **attrs)
    assert "node" in str(info.value)  # the error names the node


# ---------------------------------------------------------------- graph level: symbolic dims, decompositions


def test_symbolic_dims_are_kept():
    """QuantizeLinear -> QLinearAdd -> QLinearAveragePool -> QLinearConcat -> QLinearSigmoid
    -> QLinearGlobalAveragePool -> Flatten -> QGemm -> QLinearSoftmax, batch and spatial
    dims symbolic."""
    inits = {"s": np.asarray(0.05, F32), "z": np.asarray(128, U8), "s2": np.asarray(0.08, F32),
             "z2": np.asarray(120, U8), "w": np.random.default_rng(0).integers(-128, 128, (6, 5)).astype(I8),
             "ws": np.asarray(0.01, F32), "wz": np.asarray(0, I8), "ss": np.asarray(1 / 256, F32),
             "sz": np.asarray(0, U8)}

    def node(op, ins, outs, dom=MS, **a):
        return helper.make_node(op, ins, outs, domain=dom, name=outs[0], **a)

    nodes = [node("QuantizeLinear", ["x", "s", "z"], ["xq"], dom=""),
             node("QLinearAdd", ["xq", "s", "z", "xq", "s", "z", "s2", "z2"], ["a"]),
             node("QLinearAveragePool", ["a", "s2", "z2", "s2", "z2"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             node("QLinearConcat", ["s", "z", "p", "s2", "z2", "xq", "s", "z"], ["c"], axis=1),
             node("QLinearSigmoid", ["c", "s", "z", "s", "z"], ["sg"]),
             node("QLinearGlobalAveragePool", ["sg", "s", "z", "s", "z"], ["g"]),
             node("Flatten", ["g"], ["fl"], dom=""),
             node("QGemm", ["fl", "s", "z", "w", "ws", "wz", "", "s2", "z2"], ["gm"]),
             node("QLinearSoftmax", ["gm", "s2", "z2", "ss", "sz"], ["y"], opset=13)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])
    g = helper.make_graph(nodes, "g", [x], [onnx.ValueInfoProto(name="y"), onnx.ValueInfoProto(name="p")],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    assert [o.shape for o in sess.get_outputs()] == [["batch", 5], ["batch", 3, "h", "w"]]
    xv = np.random.default_rng(1).standard_normal((4, 3, 6, 5)).astype(F32)
    got = sess.run(None, {"x": xv})
    for optimize in (False, True):
        for g_, r in zip(got, _ort(model, {"x": xv}, optimize)):
            np.testing.assert_array_equal(g_, r)


@pytest.fixture
def without_kernel():
    """Remove an op's cpu kernel for the test (its decomposition then runs), and restore it."""
    from glassrt.kernels import registry

    saved = {}

    def remove(op):
        saved[op] = list(registry.kernels_for("cpu", MS, op))
        registry.unregister("cpu", MS, op)

    yield remove
    for op, ks in saved.items():
        registry.unregister("cpu", MS, op)
        for k in ks:
            registry.register(k)


# The decompositions whose float32 steps are the kernel's are exact; the others (a float
# operation in another order, or a float softmax for onnxruntime's table) are within one step.
DECOMPOSED = {
    "QLinearAdd": (lambda r: [q(r, U8, 40, 30), scale(0.03), zp(r, U8), q(r, U8, 30), scale(0.05), zp(r, U8),
                              scale(0.06), zp(r, U8)], {}, 1),
    "QLinearMul": (lambda r: [q(r, I8, 40, 30), scale(0.03), zp(r, I8), q(r, I8, 30), scale(0.05), zp(r, I8),
                              scale(0.6), zp(r, I8)], {}, 1),
    "QLinearSigmoid": (lambda r: [every_code(I8), scale(0.05), zp(r, I8), scale(1 / 256), zp(r, I8)], {}, 1),
    "QLinearLeakyRelu": (lambda r: [every_code(U8), scale(0.05), zp(r, U8), scale(0.03), zp(r, U8)],
                         {"alpha": 0.2}, 0),
    "QLinearGlobalAveragePool": (lambda r: [q(r, U8, 2, 3, 5, 6), scale(0.05), zp(r, U8), scale(0.01), zp(r, U8)],
                                 {"channels_last": 1}, 1),
    "QLinearAveragePool": (lambda r: [q(r, I8, 2, 3, 9, 8), scale(0.05), zp(r, I8), scale(0.02), zp(r, I8)],
                           {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 1),
    "QLinearConcat": (lambda r: [scale(0.04), zp(r, U8), q(r, U8, 2, 3), scale(0.05), zp(r, U8), q(r, U8, 2, 5),
                                 scale(0.02), zp(r, U8)], {"axis": 1}, 0),
    "QLinearWhere": (lambda r: [np.asarray(r.random((3, 4)) > 0.5), q(r, I8, 3, 4), scale(0.05), zp(r, I8),
                                q(r, I8, 4), scale(0.02), zp(r, I8), scale(0.04), zp(r, I8)], {}, 0),
    "QGemm": (lambda r: [q(r, U8, 6, 20), scale(0.02), zp(r, U8), weights(r, U8, I8, 7, 20), r.uniform(0.01, 0.03, 7).astype(F32),
                         q(r, I8, 7), r.integers(-500, 500, 7).astype(np.int32), scale(0.3), zp(r, U8)],
              {"transB": 1, "alpha": 0.5}, 0),
    "QLinearSoftmax": (lambda r: [q(r, U8, 3, 4, 9), scale(0.1), zp(r, U8), scale(1 / 256), np.asarray(0, U8)],
                       {"opset": 12, "axis": 1}, 1),
    "MatMulIntegerToFloat": (lambda r: [q(r, U8, 2, 3, 20), weights(r, U8, I8, 20, 7), scale(0.02),
                                        r.uniform(0.01, 0.03, 7).astype(F32), zp(r, U8), q(r, I8, 7),
                                        r.standard_normal(7).astype(F32)], {}, 0),
    "DynamicQuantizeMatMul": (lambda r: [r.standard_normal((2, 3, 20)).astype(F32), q(r, U8, 20, 7), scale(0.02),
                                         zp(r, U8), r.standard_normal(7).astype(F32)], {}, 0),
}


@pytest.mark.parametrize("op", sorted(DECOMPOSED))
def test_decomposition_runs_in_a_session(op, without_kernel):
    make, attrs, steps = DECOMPOSED[op]
    inputs = make(np.random.default_rng(0))
    without_kernel(op)
    model, feeds = _model(op, inputs, _params(inputs), **attrs)
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    assert sess.explain()["summary"]["expansions"][0]["op"] == op
    got, ref = sess.run(None, feeds)[0], _ort(model, feeds)[0]
    assert got.dtype == ref.dtype and got.shape == ref.shape
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    if got.dtype.kind == "f":
        assert err.max() <= 1e-6 * max(1.0, float(np.abs(ref).max()))
    else:
        assert err.max() <= steps, f"{op}: decomposition differs from onnxruntime by {err.max()} steps"


@pytest.mark.parametrize("op", sorted(DECOMPOSED))
def test_glassrt_check_passes(op):
    rows = checks.run_checks(op, builtins=False)
    assert rows, f"glassrt check lists no rows for {op}"
    failed = [(r.check, r.message) for r in rows if r.status == "fail"]
    assert not failed, failed
    assert any(r.check == "decomposition" and r.status == "pass" for r in rows)
    assert any(r.check == "dynamic_dims" and r.status == "pass" for r in rows)


def test_variadic_schema():
    """`Tensor... name` takes one or more tensors; it must be the last tensor input."""
    from glassrt.ops.custom_schema import SchemaError, parse_schema

    s = parse_schema("d::Cat(Tensor s, Tensor... xs, int axis) -> Tensor y")
    assert s.variadic and s.inputs == [("s", False), ("xs", False)]
    with pytest.raises(SchemaError, match="must be the last tensor input"):
        parse_schema("d::Cat(Tensor... xs, Tensor s) -> Tensor y")


# ---------------------------------------------------------------- end to end: onnxruntime's quantization tool


def _conv_net(seed=0):
    """A small float CNN: Conv/Relu, a residual Add, Sigmoid-gated (x·sigmoid(x)) Conv,
    Average/Max pooling into a Concat, GlobalAveragePool, Flatten, Gemm, Softmax."""
    rng = np.random.default_rng(seed)
    w = lambda name, *shape, s=0.3: numpy_helper.from_array((rng.standard_normal(shape) * s).astype(F32), name)  # noqa
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), node("Relu", ["c1"], ["r1"]),
             node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), node("Add", ["c2", "r1"], ["s"]),
             node("Relu", ["s"], ["r2"]),
             node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2]),
             node("Sigmoid", ["c3"], ["sg"]), node("Mul", ["c3", "sg"], ["sw"]),
             node("AveragePool", ["sw"], ["ap"], kernel_shape=[2, 2], strides=[1, 1]),
             node("MaxPool", ["sw"], ["mp"], kernel_shape=[2, 2], strides=[1, 1]),
             node("Concat", ["ap", "mp"], ["cat"], axis=1), node("GlobalAveragePool", ["cat"], ["g"]),
             node("Flatten", ["g"], ["f"]), node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
             node("Softmax", ["logits"], ["y"], axis=-1)]
    inits = [w("w1", 8, 3, 3, 3), w("b1", 8, s=0.1), w("w2", 8, 8, 3, 3, s=0.15), w("b2", 8, s=0.1),
             w("w3", 16, 8, 3, 3, s=0.15), w("b3", 16, s=0.1), w("wf", 10, 32), w("bf", 10, s=0.1)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _with_every_output(model):
    outputs = {o.name for o in model.graph.output}
    return expose(model, [o for n in model.graph.node for o in n.output if o and o not in outputs])


def _compare_models(model, feeds):
    """Every output (every intermediate tensor, exposed) of glassrt vs onnxruntime, equal."""
    got = _glassrt(model, feeds)
    names = [o.name for o in model.graph.output]
    for optimize in (False, True):
        for name, g, r in zip(names, got, _ort(model, feeds, optimize)):
            assert g.dtype == r.dtype and g.shape == r.shape, name
            assert np.array_equal(g, r), (f"{name} (onnxruntime optimizations {'on' if optimize else 'off'}): "
                                          f"{int((g != r).sum())} of {g.size} differ")


@pytest.mark.parametrize("activation, weight", [("QUInt8", "QInt8"), ("QInt8", "QInt8"), ("QUInt8", "QUInt8")])
def test_static_qoperator_quantized_cnn(tmp_path, activation, weight):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.batches = iter([{"x": rng.standard_normal((2, 3, 16, 16)).astype(F32)} for _ in range(6)])

        def get_next(self):
            return next(self.batches, None)

    src, dst = os.fspath(tmp_path / "float.onnx"), os.fspath(tmp_path / "int8.onnx")
    onnx.save(_conv_net(), src)
    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=getattr(QuantType, activation), weight_type=getattr(QuantType, weight),
                    reduce_range=activation == "QUInt8" and weight == "QInt8" and ort_saturates_u8s8())
    model = onnx.load(dst)
    ops = {n.op_type for n in model.graph.node if n.domain == MS}
    assert {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearAveragePool", "QLinearConcat",
            "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax"} <= ops
    x = np.random.default_rng(2).standard_normal((4, 3, 16, 16)).astype(F32) * 1.5
    _compare_models(_with_every_output(model), {"x": x})


def _mlp(seed=0):
    rng = np.random.default_rng(seed)
    w = lambda name, *shape: numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(F32), name)  # noqa
    node = helper.make_node
    nodes = [node("MatMul", ["x", "w1"], ["h"]), node("Add", ["h", "b1"], ["hb"]), node("Relu", ["hb"], ["r"]),
             node("MatMul", ["r", "w2"], ["o"]), node("Add", ["o", "b2"], ["y"]), node("MatMul", ["x", "w3"], ["z"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 8]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, ["B", "S", 4])],
                          [w("w1", 16, 32), w("b1", 32), w("w2", 32, 8), w("b2", 8), w("w3", 16, 4)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("weight, per_channel", [("QInt8", False), ("QUInt8", False), ("QInt8", True)])
def test_dynamic_quantized_mlp(tmp_path, weight, per_channel):
    """quantize_dynamic writes DynamicQuantizeLinear / MatMulInteger / Mul; onnxruntime's
    optimizer fuses them into MatMulIntegerToFloat and DynamicQuantizeMatMul, and a model
    saved after it (what onnxruntime.transformers leaves) carries those: both run."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst, opt = (os.fspath(tmp_path / n) for n in ("float.onnx", "int8.onnx", "int8_opt.onnx"))
    onnx.save(_mlp(), src)
    quantize_dynamic(src, dst, weight_type=getattr(QuantType, weight), per_channel=per_channel,
                     reduce_range=weight == "QInt8" and ort_saturates_u8s8())  # activations are uint8
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = opt
    ort.InferenceSession(dst, so, providers=["CPUExecutionProvider"])
    fused = onnx.load(opt)
    assert {n.op_type for n in fused.graph.node if n.domain == MS} == {"MatMulIntegerToFloat", "DynamicQuantizeMatMul"}
    x = np.random.default_rng(3).standard_normal((2, 5, 16)).astype(F32)
    for model in (onnx.load(dst), fused):
        _compare_models(model, {"x": x})
        sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
        assert [o.shape for o in sess.get_outputs()] == [["B", "S", 8], ["B", "S", 4]]


# ---------------------------------------------------------------- MatMulInteger16


I16, U16 = np.int16, np.uint16


@pytest.mark.parametrize("sa, sb", [((3, 4, 300), (300, 5)), ((2, 1, 3, 7), (4, 7, 2)), ((7,), (7, 2)),
                                    ((5, 7), (7,)), ((1, 9), (9, 1)), ((0, 4), (4, 3))])
def test_matmul_integer16(sa, sb):
    """int16 x int16 in int32, full range: sums past 2**31 wrap as onnxruntime's do."""
    rng = rng_for("mmi16", sa, sb)
    a, b = q(rng, I16, *sa), q(rng, I16, *sb)
    y = compare("MatMulInteger16", [a, b], consts=())
    np.testing.assert_array_equal(y, np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(np.int32))


def test_matmul_integer16_wraps_and_takes_uint16():
    """The extremes (every product 2**30, four of them wrap), and the schema's uint16 (no
    onnxruntime kernel: the exact product, wrapped to int32, is the reference)."""
    lowest = np.full((2, 4), -32768, I16)
    y = compare("MatMulInteger16", [lowest, np.full((4, 3), -32768, I16)], consts=())
    assert (y == 0).all()  # 4 · 2**30 = 2**32
    rng = rng_for("mmi16-u")
    for ta, tb in [(U16, U16), (I16, U16), (U16, I16)]:
        a, b = q(rng, ta, 3, 2, 40), q(rng, tb, 40, 6)
        got = _glassrt(*_model("MatMulInteger16", [a, b]))[0]
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(np.int32))


# ---------------------------------------------------------------- QAttention


def _q_outputs(model, feeds):
    return _glassrt(model, feeds), [_ort(model, feeds, optimize) for optimize in (False, True)]


def compare_attention(inputs, consts=None, ort_inputs=None, n_out=2, **attrs):
    """QAttention in glassrt and onnxruntime: present (this step's K and V, from the quantized
    projection) bit for bit; the output, after a float softmax attention, to 1e-4 relative.
    ort_inputs: what onnxruntime runs instead (an equivalent uint8 input)."""
    consts = _params(inputs) if consts is None else consts
    model, feeds = _model("QAttention", inputs, consts, n_out=n_out, **attrs)
    got = _glassrt(model, feeds)
    ref_model, ref_feeds = (model, feeds) if ort_inputs is None else \
        _model("QAttention", ort_inputs, consts, n_out=n_out, **attrs)
    for optimize in (False, True):
        ref = _ort(ref_model, ref_feeds, optimize)
        for k, (g, r) in enumerate(zip(got, ref)):
            assert g.dtype == r.dtype and g.shape == r.shape, f"output {k}: {g.dtype}{g.shape} vs {r.dtype}{r.shape}"
            if k == 1:
                np.testing.assert_array_equal(g, r, err_msg="present")
            else:  # float sums whose order may follow the thread count (each runtime picks its own under load):
                # 3e-5 relative was seen in a full parallel test run
                np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(r).max())))
    return got


QB, QS, QD, QN, QH = 2, 4, 20, 3, 4  # batch, sequence, input hidden, heads, head size
QHID = QN * QH
QMASKS = {
    "raw_2d": np.array([[1, 1, 0, 1], [1, 1, 1, 0]], np.int32),
    "end_positions": np.array([3, 2], np.int32),
    "end_and_start": np.array([3, 4, 1, 2], np.int32),
    "3b_plus_2": np.array([3, 2, 0, 0, 0, 0, 0, 0], np.int32),
    "raw_3d": (np.random.default_rng(7).random((QB, QS, QS)) > 0.4).astype(np.int32),
    "all_masked_row": np.array([[0, 0, 0, 0], [1, 1, 1, 1]], np.int32),
}


def _qattention_inputs(rng, tw, per_column, mask=None, d=QD, hidden=QHID):
    x = q(rng, U8, QB, QS, d)
    w = weights(rng, U8, tw, d, 3 * hidden)
    cols = (3 * hidden,) if per_column else ()
    ws = rng.uniform(0.005, 0.03, cols).astype(F32)
    wz = (rng.integers(-3, 4, cols) if tw == I8 else rng.integers(110, 146, cols)).astype(tw)
    return [x, w, rng.standard_normal(3 * hidden).astype(F32), scale(rng.uniform(0.01, 0.05)), ws, mask,
            zp(rng, U8), wz]


@pytest.mark.parametrize("tw", [I8, U8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("mask", [None, *QMASKS])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_qattention(tw, per_column, mask, unidirectional):
    rng = rng_for("qattention", tw, per_column, mask, unidirectional)
    compare_attention(_qattention_inputs(rng, tw, per_column, QMASKS.get(mask)), num_heads=QN,
                      unidirectional=unidirectional)


@pytest.mark.parametrize("attrs", [{"scale": 0.3}, {"mask_filter_value": -3.0}, {"unidirectional": 1, "scale": 0.1}])
def test_qattention_attributes(attrs):
    rng = rng_for("qattention-attrs", str(attrs))
    compare_attention(_qattention_inputs(rng, I8, True, QMASKS["raw_2d"]), num_heads=QN, **attrs)


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("with_mask", [False, True])
def test_qattention_past_and_present(unidirectional, with_mask):
    rng = rng_for("qattention-past", unidirectional, with_mask)
    mask = np.ones((QB, 3 + QS), np.int32)
    mask[0, :2] = 0
    inputs = _qattention_inputs(rng, I8, False, mask if with_mask else None)
    inputs.append(rng.standard_normal((2, QB, QN, 3, QH)).astype(F32))
    compare_attention(inputs, num_heads=QN, unidirectional=unidirectional)
    compare_attention(inputs[:5], num_heads=QN, n_out=1)  # no mask, zero points or past; output only


def test_qattention_sizes_and_weights_as_inputs():
    """A pruned input hidden size (D != hidden), one head, larger sequences; every parameter
    a graph input; the zero points omitted."""
    rng = rng_for("qattention-sizes")
    inputs = _qattention_inputs(rng, I8, True, d=7, hidden=10)
    compare_attention(inputs, consts=(), num_heads=2)
    compare_attention(inputs[:5], consts=(), num_heads=1)
    big = [q(rng, U8, 3, 33, 64), weights(rng, U8, I8, 64, 96), rng.standard_normal(96).astype(F32), scale(0.02),
           scale(0.01), np.array([33, 20, 7], np.int32), zp(rng, U8), zp(rng, I8)]
    compare_attention(big, num_heads=4, unidirectional=1)


def test_qattention_int8_input_and_float16():
    """onnxruntime's cpu kernel takes a uint8 input only. An int8 input x with zero point z
    is the uint8 input x + 128 with z + 128 (the same integer products); a float16 bias and
    scales run in float32, rounded once (onnxruntime on the float32 values is the reference)."""
    rng = rng_for("qattention-int8")
    inputs = _qattention_inputs(rng, I8, True, QMASKS["end_positions"])
    signed = list(inputs)
    signed[0] = (inputs[0].astype(np.int16) - 128).astype(I8)
    signed[6] = np.asarray(int(inputs[6]) - 128, I8)
    compare_attention(signed, ort_inputs=inputs, num_heads=QN, unidirectional=1)
    half = [x.astype(F16) if x is not None and x.dtype == F32 else x for x in inputs]
    model, feeds = _model("QAttention", half, _params(half), n_out=2, num_heads=QN)
    got = _glassrt(model, feeds)
    ref = _ort(*_model("QAttention", [x.astype(F32) if x is not None and x.dtype == F16 else x for x in half],
                       _params(half), n_out=2, num_heads=QN))
    for g, r in zip(got, ref):
        assert g.dtype == F16
        np.testing.assert_allclose(g.astype(F32), r, rtol=2e-3, atol=2e-3)


def test_qattention_decomposition(without_kernel):
    """Without the kernel, the decomposition (MatMulInteger, the float steps of the projection,
    attention in standard ops) runs: present still bit for bit, the output within Attention's
    tolerance. Every mask form decomposes (a 1-D mask with a known batch)."""
    rng = rng_for("qattention-decomposed")
    without_kernel("QAttention")
    for mask in [None, *QMASKS]:
        for uni in (0, 1):
            model, feeds = _model("QAttention", _qattention_inputs(rng, I8, mask is None, QMASKS.get(mask)),
                                  n_out=2, num_heads=QN, unidirectional=uni)
            sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
            assert sess.explain()["summary"]["expansions"][0]["op"] == "QAttention"
            got, ref = sess.run(None, feeds), _ort(model, feeds)
            np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(ref[0]).max())))
            np.testing.assert_array_equal(got[1], ref[1])
    inputs = _qattention_inputs(rng, I8, False) + [rng.standard_normal((2, QB, QN, 3, QH)).astype(F32)]
    model, feeds = _model("QAttention", inputs, n_out=2, num_heads=QN, unidirectional=1, scale=0.2)
    got, ref = glassrt.InferenceSession(model, providers=["cpu"], fallback="error").run(None, feeds), _ort(model, feeds)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], ref[1])


def test_qattention_quantized_by_onnxruntime(tmp_path):
    """quantize_dynamic turns com.microsoft Attention into DynamicQuantizeLinear + QAttention."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(11)
    node = helper.make_node("Attention", ["x", "w", "b", "mask"], ["y"], domain=MS, num_heads=QN)
    g = helper.make_graph([node], "att", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", QD]),
                                          helper.make_tensor_value_info("mask", TensorProto.INT32, ["B", "S"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", QHID])],
                          [numpy_helper.from_array((rng.standard_normal((QD, 3 * QHID)) * 0.3).astype(F32), "w"),
                           numpy_helper.from_array((rng.standard_normal(3 * QHID) * 0.1).astype(F32), "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    src, dst = os.fspath(tmp_path / "float.onnx"), os.fspath(tmp_path / "int8.onnx")
    onnx.save(model, src)
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=ort_saturates_u8s8())
    quantized = onnx.load(dst)
    assert "QAttention" in {n.op_type for n in quantized.graph.node}
    feeds = {"x": rng.standard_normal((3, 6, QD)).astype(F32), "mask": np.array([[1] * 6, [1] * 4 + [0] * 2,
                                                                                 [1] * 2 + [0] * 4], np.int32)}
    sess = glassrt.InferenceSession(quantized, providers=["cpu"], fallback="error")
    assert sess.get_outputs()[0].shape == ["B", "S", QHID]
    got = sess.run(None, feeds)[0]
    np.testing.assert_array_equal(sess.run(None, feeds)[0], got)
    for optimize in (False, True):
        np.testing.assert_allclose(got, _ort(quantized, feeds, optimize)[0], rtol=1e-5, atol=1e-5)
    # ... and stays near the float model (the quantization error, not a bug, is the difference)
    ref = _ort(model, feeds)[0]
    np.testing.assert_allclose(got, ref, atol=0.05 * float(np.abs(ref).max()))


def test_qattention_invalid_inputs_are_refused():
    rng = rng_for("qattention-invalid")
    good = _qattention_inputs(rng, I8, True)
    cases = [({2: good[2][:5]}, {}, "bias must be 1-D"),
             ({4: np.ones(5, F32)}, {}, "weight_scale must be a scalar or 1-D"),
             ({7: np.zeros(3 * QHID, U8)}, {}, "weight_zero_point must have the weight's type"),
             ({5: np.ones((QB, 1, QS, QS), np.int32)}, {}, "4-D mask"),
             ({1: good[1][:, :30]}, {}, "3 x hidden with hidden divisible by num_heads"),
             ({}, {"do_rotary": 1}, "do_rotary")]
    for change, attrs, message in cases:
        inputs = [change.get(i, x) for i, x in enumerate(good)]
        with pytest.raises(glassrt.GlassrtError, match=message) as info:
            _glassrt(*_model("QAttention", inputs, (), n_out=2, num_heads=QN, **attrs))
        assert "node" in str(info.value)
    with pytest.raises(glassrt.GlassrtError, match="1-D mask must have"):
        _glassrt(*_model("QAttention", good[:5] + [np.ones(5, np.int32)], (), n_out=2, num_heads=QN))


# ---------------------------------------------------------------- DynamicQuantizeLSTM


def _ort_one_thread(model, feeds):
    """onnxruntime with one intra-op thread. Its LSTM quantizes the hidden state once per
    step for the rows one thread computes: with more threads and a batch it splits (batch
    above 4, or 2 and up with hidden <= 256), each share gets a range of its own, and the
    result depends on the machine's thread count. glassrt quantizes the whole batch: one
    thread's numbers."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _lstm_weights(rng, tw, shape):
    # Full-range int8 weights with a uint8 input would saturate in onnxruntime's AVX2 kernel (see ort_saturates_u8s8)
    return weights(rng, U8, tw, *shape) if tw == I8 else q(rng, U8, *shape)


def lstm_inputs(rng, t, n, i, h, num_dir=1, tw=I8, per_channel=False, lens=None, optional=True):
    """X, W [D, I, 4H], R [D, H, 4H], B, sequence_lens, initial_h, initial_c, P, then scales and
    zero points as quantize_dynamic writes them ([D] per tensor, [D, 4H] per channel)."""
    cols = (num_dir, 4 * h) if per_channel else (num_dir,)
    params = []
    for _ in range(2):
        if tw == I8:  # per channel: zero points all 0, as onnxruntime requires
            z = np.zeros(cols, I8) if per_channel else rng.integers(-3, 4, cols).astype(I8)
        else:  # per channel: one value throughout
            z = np.full(cols, rng.integers(120, 136), U8) if per_channel else rng.integers(120, 136, cols).astype(U8)
        params += [rng.uniform(0.004, 0.02, cols).astype(F32), z]
    f = lambda *shape, s=1.0: (rng.standard_normal(shape) * s).astype(F32)  # noqa: E731
    return [f(t, n, i), _lstm_weights(rng, tw, (num_dir, i, 4 * h)), _lstm_weights(rng, tw, (num_dir, h, 4 * h)),
            f(num_dir, 8 * h, s=0.5) if optional else None, lens, f(num_dir, n, h, s=0.5) if optional else None,
            f(num_dir, n, h, s=0.5) if optional else None, f(num_dir, 3 * h, s=0.3) if optional else None] + params


LSTM_CONSTS = {1, 2, 8, 9, 10, 11}


def compare_lstm(inputs, outputs=("y", "yh", "yc"), consts=LSTM_CONSTS, exact=True, ort_run=_ort_one_thread,
                 **attrs):
    """DynamicQuantizeLSTM in glassrt and onnxruntime (one intra-op thread): every output bit for
    bit, or within an ulp or two (exact=False: activations through libm's exp/log)."""
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    node = helper.make_node("DynamicQuantizeLSTM", names, list(outputs), domain=MS, name="node", **attrs)
    vis = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))
           for i, (nm, x) in enumerate(zip(names, inputs)) if nm and i not in consts]
    inits = [numpy_helper.from_array(x, nm) for i, (nm, x) in enumerate(zip(names, inputs)) if nm and i in consts]
    graph = helper.make_graph([node], "g", vis, [onnx.ValueInfoProto(name=o) for o in outputs if o], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    feeds = {nm: x for i, (nm, x) in enumerate(zip(names, inputs)) if nm and i not in consts}
    got, ref = _glassrt(model, feeds), ort_run(model, feeds)
    assert len(got) == len(ref)
    for name, g, r in zip([o for o in outputs if o], got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape, f"{name}: {g.dtype}{g.shape} vs {r.dtype}{r.shape}"
        if exact:
            bad = _differ(g, r)
            assert bad.size == 0, (f"{name}: {bad.size} of {g.size} differ, first at {bad[0]}: "
                                   f"{g.reshape(-1)[bad[0]]} vs {r.reshape(-1)[bad[0]]}")
        else:
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-7, err_msg=name)
    return got


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("tw", [I8, U8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_lstm(direction, tw, per_channel):
    rng = rng_for("dqlstm", direction, tw, per_channel)
    num_dir = 2 if direction == "bidirectional" else 1
    compare_lstm(lstm_inputs(rng, 7, 3, 5, 4, num_dir, tw, per_channel), hidden_size=4, direction=direction)
    # Larger, parameters as graph inputs (onnxruntime then reads them at run time: no prepacking).
    compare_lstm(lstm_inputs(rng, 12, 5, 24, 16, num_dir, tw, per_channel), consts=(), hidden_size=16,
                 direction=direction)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_dynamic_quantize_lstm_sequence_lens(direction):
    """Shorter sequences: their rows stop (zeros in Y, the last state in Y_h/Y_c, zeros for
    length 0), and the rows the next step's GEMM reads for them are Y's zeros when Y is an
    output, the last h when it is not — which moves the quantization range: both followed."""
    rng = rng_for("dqlstm-lens", direction)
    num_dir = 2 if direction == "bidirectional" else 1
    lens = np.array([7, 2, 0, 5], np.int32)
    compare_lstm(lstm_inputs(rng, 7, 4, 5, 4, num_dir, lens=lens), hidden_size=4, direction=direction)
    lens = np.array([3, 6, 2, 5], np.int32)  # the longest shorter than X: steps past it are never computed
    compare_lstm(lstm_inputs(rng, 7, 4, 5, 4, num_dir, lens=lens), hidden_size=4, direction=direction)
    compare_lstm(lstm_inputs(rng, 7, 4, 5, 4, num_dir, lens=lens), ("", "yh", "yc"), hidden_size=4,
                 direction=direction)
    compare_lstm(lstm_inputs(rng, 7, 4, 5, 4, num_dir, lens=np.zeros(4, np.int32)), hidden_size=4,
                 direction=direction)


@pytest.mark.parametrize("attrs", [{"clip": 0.6}, {"input_forget": 1}, {"clip": 2.0, "input_forget": 1}])
def test_dynamic_quantize_lstm_attributes(attrs):
    rng = rng_for("dqlstm-attrs", str(attrs))
    compare_lstm(lstm_inputs(rng, 6, 3, 5, 4, 2, U8, True), hidden_size=4, direction="bidirectional", **attrs)


def test_dynamic_quantize_lstm_optional_inputs_and_outputs():
    rng = rng_for("dqlstm-optional")
    compare_lstm(lstm_inputs(rng, 6, 3, 5, 4, optional=False), hidden_size=4)
    inputs = lstm_inputs(rng, 6, 3, 5, 4, optional=True)
    compare_lstm(inputs, ("y",), hidden_size=4)
    compare_lstm(inputs, ("", "", "yc"), hidden_size=4)
    compare_lstm(lstm_inputs(rng, 1, 1, 3, 2), hidden_size=2)  # one step, one row


# f (the i, o, f gates), g (the cell input), h (the output) — per direction. MLAS's Sigmoid/Tanh,
# Relu and the arithmetic functors are followed bit for bit; the ones through libm's exp and
# log (Elu, Softplus, ScaledTanh) to an ulp (libm rounds a few near-ties the other way).
LSTM_ACTIVATIONS = [
    (["Relu", "Tanh", "Sigmoid"], True), (["HardSigmoid", "Affine", "LeakyRelu"], True),
    (["Sigmoid", "Softsign", "ThresholdedRelu"], True),
    (["sigmoid", "TANH", "Relu", "HardSigmoid", "Tanh", "Tanh"], True),
    (["Sigmoid", "Elu", "ScaledTanh"], False), (["Sigmoid", "Softplus", "Tanh"], False),
    (["ScaledTanh", "ScaledTanh", "Elu"], False),
]


@pytest.mark.parametrize("activations, exact", LSTM_ACTIVATIONS)
def test_dynamic_quantize_lstm_activations(activations, exact):
    rng = rng_for("dqlstm-acts", str(activations))
    direction = "bidirectional" if len(activations) == 6 else "forward"
    compare_lstm(lstm_inputs(rng, 8, 4, 6, 8, len(activations) // 3), exact=exact, hidden_size=8,
                 direction=direction, activations=activations, activation_alpha=[0.9, 0.7, 0.5],
                 activation_beta=[0.8, 0.9])


def test_dynamic_quantize_lstm_against_multithreaded_onnxruntime():
    """With its default thread pool onnxruntime splits a batch between threads and quantizes
    each share's hidden state apart (see _ort_one_thread). A batch of one is never split:
    equal bit for bit. A split batch differs by quantization noise: the step of H's 8-bit
    grid is its range / 255 (here about 0.004), and the differences stay of that order: a
    few steps where a split share's grid moved an element across a rounding boundary that
    later steps amplify (0.028 seen once in a full parallel test run, 2026-12)."""
    rng = rng_for("dqlstm-threads")

    def default_threads(model, feeds):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)

    compare_lstm(lstm_inputs(rng, 8, 1, 16, 8, 2), ort_run=default_threads, hidden_size=8, direction="bidirectional")
    inputs = lstm_inputs(rng, 8, 6, 16, 8)
    got = compare_lstm(inputs, hidden_size=8)
    for g, r in zip(got, _lstm_run(inputs, default_threads, hidden_size=8)):
        np.testing.assert_allclose(g, r, atol=0.05)


def _lstm_run(inputs, run, **attrs):
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    node = helper.make_node("DynamicQuantizeLSTM", names, ["y", "yh", "yc"], domain=MS, **attrs)
    vis = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))
           for nm, x in zip(names, inputs) if nm]
    graph = helper.make_graph([node], "g", vis, [onnx.ValueInfoProto(name=o) for o in ("y", "yh", "yc")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return run(model, {nm: x for nm, x in zip(names, inputs) if nm})


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantized_lstm_model(tmp_path, direction, per_channel):
    """quantize_dynamic turns a float LSTM into DynamicQuantizeLSTM (int8 weights, whatever
    weight_type asks: its LSTM quantizer writes int8): glassrt runs the result as onnxruntime
    does (one thread), symbolic dims kept, and stays near the float model."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(5)
    num_dir, i, h = (2 if direction == "bidirectional" else 1), 8, 6
    inits = [numpy_helper.from_array((rng.standard_normal(s) * sd).astype(F32), nm) for nm, s, sd in
             (("W", (num_dir, 4 * h, i), 0.4), ("R", (num_dir, 4 * h, h), 0.4), ("B", (num_dir, 8 * h), 0.1))]
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh", "yc"], hidden_size=h, direction=direction)
    g = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "N", i])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "yh", "yc")],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    src, dst = os.fspath(tmp_path / "float.onnx"), os.fspath(tmp_path / "int8.onnx")
    onnx.save(model, src)
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=per_channel,
                     reduce_range=ort_saturates_u8s8())
    quantized = onnx.load(dst)
    assert [n.op_type for n in quantized.graph.node] == ["DynamicQuantizeLSTM"]
    feeds = {"x": rng.standard_normal((9, 3, i)).astype(F32)}
    got = _glassrt(quantized, feeds)
    for g_, r in zip(got, _ort_one_thread(quantized, feeds)):
        np.testing.assert_array_equal(g_, r)
    for g_, r in zip(got, _ort(model, feeds)):
        np.testing.assert_allclose(g_, r, atol=0.05)
    sess = glassrt.InferenceSession(quantized, providers=["cpu"], fallback="error")
    assert [o.shape for o in sess.get_outputs()] == [["T", num_dir, "N", h], [num_dir, "N", h], [num_dir, "N", h]]
    for _ in range(2):  # the plan's replay writes the same numbers into its arena
        for g_, r in zip(sess.run(None, feeds), got):
            np.testing.assert_array_equal(g_, r)


def test_dynamic_quantize_lstm_invalid_inputs_are_refused():
    rng = rng_for("dqlstm-invalid")
    good = lstm_inputs(rng, 5, 2, 3, 4, 1, I8, True)
    cases = [({1: good[1][:, :2]}, {}, "W must have shape"),
             ({2: good[2].astype(U8)}, {}, "R is uint8 but W is int8|W and R must both be"),
             ({3: good[3][:, :5]}, {}, "B must have shape"),
             ({4: np.array([5, 6], np.int32)}, {}, "sequence_lens"),
             ({8: np.ones((1, 3), F32)}, {}, "W_scale must have shape"),
             ({9: np.ones((1, 16), I8)}, {}, "per channel must be all zero"),
             ({}, {"activations": ["Sigmoid", "Tanh"]}, "3 functions per direction"),
             ({}, {"activations": ["Sigmoid", "Tanh", "Gelu"]}, "unknown activation"),
             ({}, {"direction": "sideways"}, "direction must be"),
             ({}, {"hidden_size": 3}, "must have shape")]
    for change, attrs, message in cases:
        inputs = [change.get(k, x) for k, x in enumerate(good)]
        with pytest.raises(glassrt.GlassrtError, match=message) as info:
            _lstm_run(inputs, _glassrt, **{"hidden_size": 4, **attrs})
        assert "node" in str(info.value)


# ---------------------------------------------------------------- the contracts of the three


@pytest.mark.parametrize("op", ["MatMulInteger16", "QAttention", "DynamicQuantizeLSTM"])
def test_glassrt_check_passes_for_the_sequence_ops(op):
    rows = checks.run_checks(op, builtins=False)
    failed = [(r.check, r.message) for r in rows if r.status == "fail"]
    assert rows and not failed, failed
    for check in ("meta_vs_real", "dynamic_dims", "dtype_coverage"):
        assert any(r.check == check and r.status == "pass" for r in rows), check
    decomposed = any(r.check == "decomposition" and r.status == "pass" for r in rows)
    assert decomposed == (op != "DynamicQuantizeLSTM")


INFINITE_RANGES = [[1, 2, np.inf, -3, 0.5, -1], [1, 2, 3, -np.inf, 0.5, 1], [1e30, -1e30, 1, 2, 3, 4],
                   [np.inf, -np.inf, 1, 2, 3, 4]]


def _dql_model(shape):
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [onnx.ValueInfoProto(name=o) for o in "ysz"])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("values", INFINITE_RANGES)
def test_dynamic_quantization_of_infinities_is_onnxruntimes(values, compiled, monkeypatch):
    """DynamicQuantizeLinear and DynamicQuantizeMatMul on data with infinities: an infinite
    range gives onnxruntime's zero point (its std::min keeps 255 for the NaN of -inf / inf),
    no crash, and the codes onnxruntime writes."""
    from glassrt.kernels.cpu import quantize as cpu_quantize

    if compiled:
        pytest.importorskip("numba")
    monkeypatch.setattr(cpu_quantize, "use_compiled", lambda path, after=64: compiled)
    x = np.array(values * 3, F32).reshape(3, 6)
    m = _dql_model(x.shape)
    with np.errstate(all="ignore"):
        got = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})
        for g, r in zip(got, _ort(m, {"x": x})):
            np.testing.assert_array_equal(g, r)
        b = np.arange(-12, 12, dtype=np.int8).reshape(6, 4)
        compare("DynamicQuantizeMatMul", [x, b, scale(0.05), np.zeros((), np.int8)], consts={1, 2, 3})


@pytest.mark.parametrize("compiled", [False, True])
def test_dynamic_quantization_leaves_nan_out_of_the_range(compiled, monkeypatch):
    """NaN is left out of DynamicQuantizeLinear's range and quantizes to code 0. (onnxruntime's
    MLAS leaves NaN out too, except where one lands last in its vector lanes, where it
    spreads to the whole range: which, depends on the NaN's position and the CPU's kernel.)"""
    from glassrt.kernels.cpu import quantize as cpu_quantize

    if compiled:
        pytest.importorskip("numba")
    monkeypatch.setattr(cpu_quantize, "use_compiled", lambda path, after=64: compiled)
    x = RNG_NAN.standard_normal((4, 50)).astype(F32)
    clean = x.copy()
    x[[0, 1, 3], [0, 17, 49]] = np.nan
    clean[[0, 1, 3], [0, 17, 49]] = 0.0  # (inside the range: it already holds 0)
    sess = glassrt.InferenceSession(_dql_model(x.shape), providers=["cpu"])
    with np.errstate(all="ignore"):
        y, s, z = sess.run(None, {"x": x})
    y_clean, s_clean, z_clean = sess.run(None, {"x": clean})
    assert s == s_clean and z == z_clean
    assert (y[[0, 1, 3], [0, 17, 49]] == 0).all()
    keep = ~np.isnan(x)
    np.testing.assert_array_equal(y[keep], y_clean[keep])
    with np.errstate(all="ignore"):
        all_nan = sess.run(None, {"x": np.full(x.shape, np.nan, F32)})
    assert not all_nan[0].any() and all_nan[2] == 0


RNG_NAN = np.random.default_rng(77)


def test_qlinear_add_fused_loop_is_the_float64_emulation_on_every_code_pair():
    """Where the CPU has FMA instructions QLinearAdd's compiled pass is float32 with the
    compiler fusing a·r + c (fastmath "contract"); it must round as the exact float64
    emulation of two FMAs does (onnxruntime's AVX2 kernel): every pair of codes, for
    random scales and zero points."""
    pytest.importorskip("numba")
    import llvmlite.binding as llvm

    from glassrt.contrib import microsoft_quant as mq

    if not llvm.get_host_cpu_features().get("fma"):
        pytest.skip("no FMA instructions on this CPU: the float64 emulation runs")
    assert mq._qlinear_add_loop_here().__name__ == "_qlinear_add_loop_fused"
    rng = rng_for("qlinear-add-fused")
    for dt in (U8, I8):
        codes = np.arange(256, dtype=np.uint8).view(dt)
        a, b = np.repeat(codes, 256), np.tile(codes, 256)
        for _ in range(40):
            s = [np.array(v, F32) for v in rng.uniform(1e-3, 0.3, 3)]
            z = [np.array(v).astype(dt) for v in rng.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, 3)]
            args = mq._qlinear_add_constants(*mq._binary_params(a[:1], s[0], z[0], b[:1], s[1], z[1], s[2], z[2]))
            fused, exact = np.empty(a.size, dt), np.empty(a.size, dt)
            mq._qlinear_add_loop_fused(a, b, *args, fused)
            mq._qlinear_add_loop(a, b, *args, exact)
            np.testing.assert_array_equal(fused, exact)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_add_numpy_steps_are_the_fma_definition_on_every_byte_pair(dt):
    """QLinearAdd's NumPy steps (run where the compiled pass is not loaded yet) compute
    saturate(fma(outer, r, fma(inner, r, c))) with _fma's roundings, on every pair of bytes,
    with the operands broadcast as onnxruntime's loop hands them (either one a scalar)."""
    from glassrt.contrib import microsoft_quant as mq

    f32 = np.dtype(np.float32)
    codes = np.arange(256, dtype=np.uint8).view(dt)
    a_all, b_all = np.meshgrid(codes, codes, indexing="ij")
    rng = np.random.default_rng(3)
    for trial in range(12):
        sa, sb, sc = (np.float32(rng.uniform(1e-3, 0.2)) for _ in range(3))
        if trial % 3 == 0:
            sc = np.float32(sa + sb)  # (sums land on halves more often)
        za, zb, zc = (np.array(rng.integers(-128, 128) if dt == np.int8 else rng.integers(0, 256), dt) for _ in range(3))
        for a, b in ((a_all, b_all), (a_all[:1, :1].reshape(()), b_all), (a_all[:, :1], b_all[:1, :]), (a_all, b_all[2:3, 5:6])):
            ra, rb = sa / sc, sb / sc
            if mq._scalar_input(a.shape, b.shape) == 0:
                v = mq._fma(b, rb, mq._fma(a, ra, f32.type(zc) - mq._fma(rb, zb, ra * f32.type(za))))
            else:
                v = mq._fma(a, ra, mq._fma(b, rb, f32.type(zc) - mq._fma(ra, za, rb * f32.type(zb))))
            want = mq._saturate(v, 0, np.dtype(dt))
            out = np.empty(want.shape, dt)
            got = mq._qlinear_add(a, sa, za, b, sb, zb, sc, zc, out=out)
            assert got is out
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(mq._qlinear_add(a, sa, za, b, sb, zb, sc, zc), want)
