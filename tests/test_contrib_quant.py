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
            bad = np.flatnonzero(g.reshape(-1) != r.reshape(-1))
            assert bad.size == 0, (f"{op} (onnxruntime optimizations {'on' if optimize else 'off'}): {bad.size} of "
                                   f"{g.size} differ, first at flat index {bad[0]}: {g.reshape(-1)[bad[0]]} vs "
                                   f"{r.reshape(-1)[bad[0]]}")
    return got[0]


def _require_zeros(inputs, omit):
    assert all(not np.any(inputs[i]) for i in omit), "an omitted zero point stands for 0"


def rng_for(*key):
    return np.random.default_rng(abs(hash(key)) % 2**32)


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


@pytest.mark.parametrize("dt", QTYPES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_qlinear_concat(dt, axis):
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
