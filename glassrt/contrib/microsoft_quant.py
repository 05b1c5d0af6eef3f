"""onnxruntime's quantized contrib operators (domain `com.microsoft`), run natively.

onnxruntime's quantization tool writes these in QOperator format (`quantize_static(...,
quant_format=QuantFormat.QOperator)`), and so are the ONNX model zoo's int8 models
(resnet50-v1-12-int8, mobilenetv2-12-int8...): QLinearConv and QLinearMatMul are standard
ONNX, the ops around them (Add, Mul, pooling, Concat, Gemm, Softmax, activations) are
contrib ops. Dynamic quantization (`quantize_dynamic`) leaves DynamicQuantizeMatMul and
MatMulIntegerToFloat in transformer models, QAttention for onnxruntime's Attention and
DynamicQuantizeLSTM for an LSTM; MatMulInteger16 is the 16-bit integer product. They are
defined as the ops of microsoft.py are, with the public custom-op API: a schema, a meta
(symbolic dims kept), a NumPy kernel for the cpu provider and, where standard ops can say
the same (DequantizeLinear -> standard op(s) -> QuantizeLinear, mostly), a decomposition.

The numbers are onnxruntime's CPU provider's to the last bit. A quantized result is within
one step of the ideal formula either way, and which way a value near a rounding boundary
goes depends on the exact float32 operations, so the kernels follow MLAS's arithmetic step
by step (named where it matters) rather than the formula: float32 throughout, fused
multiply-adds where onnxruntime's AVX2 kernels fuse them, results rounded half to even
(MLAS converts with cvtps2dq under the default rounding mode) and saturated. Where
onnxruntime's kernel has semantics of its own (QLinearSoftmax's lookup table,
QLinearAveragePool's divisor and its switch to integer arithmetic for global windows) the
kernel follows them. Integer products run as float64 GEMMs, exact for 8-bit data, as
glassrt's QLinearMatMul does. The decompositions agree with the kernels exactly where
their float steps are the same (Concat, Where, LeakyRelu, QGemm, the MatMuls) and to
within one quantization step otherwise.

QAttention's projection is onnxruntime's to the bit; the attention after it is microsoft.py's
float Attention (equal to float rounding). DynamicQuantizeLSTM follows onnxruntime's LSTM
step by step — dynamic quantization of X and of H, MLAS's sigmoid and tanh, its order of
float32 operations — and equals it bit for bit when onnxruntime runs on one intra-op thread
(with more it quantizes H per thread's share of the batch; see _lstm_direction). It has no
decomposition: the per-step quantization would need a Scan body.

QLinearReduceMean is not defined: onnxruntime's CPU provider has no kernel for it, so there
are no numbers to follow.

Every kernel writes into its planned output buffer (out=True): the elementwise ones (Add,
Mul, Where, the lookup-table activations) tile by tile, so that the float64 steps of their
fused multiply-adds need a tile of scratch, not the tensor's size; the rest compute an
output-sized result and copy it in.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..ir import TensorType as Meta
from ..kernels import mlas_math, run_threads
from ..kernels.int_gemm import Centered, Prepared, int_matmul
from ..kernels.buffers import NHWC, TILE_ELEMENTS, as_out, memory_order, new_out, same_layout, write_elementwise
from ..kernels.cpu._jit import compiled, jit, use_compiled
from ..kernels.custom import custom_op
from ..kernels.registry import kernel
from ..ops.geometry import broadcast_shapes, matmul_shape, normalize_axis, spatial_pads
from ..ops.windows import pad_spatial, window_views

MS = "com.microsoft"
U8, I8, I32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32)
F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
Q8 = [U8, I8]
_F32_MAX = float(np.finfo(np.float32).max)


# Half the cpu kernels' tile: the float64 steps of the fused multiply-adds keep several
# temporaries per element, and a replayed run should stay within a megabyte of scratch
# (tests/test_replay_memory.py).
_TILE = TILE_ELEMENTS // 2


# ====================================================================== shared helpers


def _require(cond, message):
    """ValueError(message) unless cond; the message a string or, where it names values, a
    function that formats it (an f-string naming a dtype costs ~5 us, and the checks run on
    every inference: an int8 BERT-base's 73 MatMulIntegerToFloat metas made ~440 of them)."""
    if not cond:
        raise ValueError(message() if callable(message) else message)


# The helpers below run on every call of a kernel: they test before they format a message
# (an f-string naming a dtype costs ~4 us; _binary_params made twelve: 50 us a QLinearAdd).


def _qrange(dt):
    return (0, 255) if dt == U8 else (-128, 127)


def _q8(x, what):
    if x.dtype not in (U8, I8):
        raise ValueError(f"{what} must be uint8 or int8, got {x.dtype}")
    return x.dtype


def _is_one_value(t):
    """onnxruntime's IsScalarOr1ElementVector: a scalar or a 1-D tensor of one element."""
    return t.ndim == 0 or t.shape == (1,)


def _one_value(t, what):
    if not _is_one_value(t):
        raise ValueError(f"{what} must be a scalar (per-tensor), got shape {list(t.shape)}")


def _scale(s, what, divisor=False):
    """A per-tensor float32 scale as a NumPy float32. One that is divided by (an output's)
    must be positive and finite: anything else makes every result saturate or NaN."""
    if s is None:
        raise ValueError(f"{what} is missing")
    if s.dtype != F32:
        raise ValueError(f"{what} must be float32, got {s.dtype}")
    _one_value(s, what)
    v = F32.type(s.reshape(()))
    if divisor and not (np.isfinite(v) and v > 0):
        raise ValueError(f"{what} must be a positive finite number, got {v}")
    return v


def _zero_point(z, dt, what):
    """A per-tensor zero point (absent: 0) as an int; its type must be the data's."""
    if z is None:
        return 0
    if z.dtype != dt:
        raise ValueError(f"{what} is {z.dtype} but the data it belongs to is {dt}: they must match")
    _one_value(z, what)
    return int(z.reshape(()))


def _fma(a, b, c):
    """float32 a·b + c rounded once, as an FMA instruction rounds it. The product of two
    float32 (or of a float32 and an 8-bit integer) is exact in float64; the float64 sum,
    rounded to float32, differs from a single rounding only if it was itself rounded (its
    addends some 30 binary orders of magnitude apart) onto a point exactly halfway between
    two float32 values."""
    return (np.asarray(a, F64) * F64.type(b) + np.asarray(c, F64)).astype(F32)


def _saturate(v, zp, dt):
    """MLAS's requantization tail: clamp float32 v to [min - zp, max - zp] (a NaN becomes
    the minimum, as MAXPS returns it), round half to even, add the zero point."""
    lo, hi = _qrange(dt)
    v = np.fmin(np.fmax(np.asarray(v, F32), F32.type(lo - zp)), F32.type(hi - zp))
    return (np.rint(v).astype(np.int16) + np.int16(zp)).astype(dt)


def _quantize(v, scale, zp, dt):
    """MlasQuantizeLinear: saturate(round_half_even(float32 v / scale) + zp)."""
    return _saturate(np.asarray(v, F32) / scale, zp, dt)


def _codes(dt):
    """Every value of an 8-bit type, in the order of its bytes (index = the byte)."""
    return np.arange(256, dtype=np.uint8).view(dt)


def _dequantized_codes(dt, scale, zp):
    """scale · (q - zp) in float32 for every q, as onnxruntime's lookup tables compute it."""
    return scale * (_codes(dt).astype(np.int32) - zp).astype(F32)


def _lookup(x, table, out=None):
    """table[byte of x], written into out (a tile at a time) when given; one compiled pass
    where x and out share a layout and the path keeps running (kernels/cpu/quantize.py)."""
    from ..kernels.cpu.quantize import lookup_bytes  # (imported where an 8-bit op runs)

    if out is not None and lookup_bytes(x, table, out) is not None:
        return out
    return write_elementwise(out, lambda v: table[v.view(np.uint8)], x, limit=_TILE)


def _requantize_table(dt, sx, zx, sy, zy):
    """What onnxruntime's QLinearConcat / QLinearWhere map each input byte to."""
    return _quantize(_dequantized_codes(dt, sx, zx), sy, zy, dt)


def _int_matmul(a, za, b, zb):
    """The exact int32 product (A - za) @ (B - zb) (zb broadcasts against B; B may be
    int_gemm.Centered, converted once): float32 GEMMs over slices of the inner dimension,
    each exact for 8-bit data (kernels/int_gemm.py); int32 wraps as onnxruntime's
    accumulator would (after some 33000 terms)."""
    return int_matmul(a, za, b, zb)


def _meta_one_value(t, what, dtypes=None):
    """The meta-time checks of a per-tensor scale or zero point (t None: omitted)."""
    if t is None:
        return
    # (explicit ifs, not _require: its message, naming dtypes, would be formatted at every
    # check, ~4 us a dtype, several per node and inference of an 8-bit model)
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{what} must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if t.shape is not None and all(isinstance(d, int) for d in t.shape) \
            and not (len(t.shape) == 0 or tuple(t.shape) == (1,)):
        raise ValueError(f"{what} must be a scalar (per-tensor), got shape {list(t.shape)}")


def _meta_zero_point(z, dt, what):
    if z is not None:
        if z.dtype != dt:
            raise ValueError(f"{what} is {z.dtype} but the data it belongs to is {dt}: they must match")
        _meta_one_value(z, what)


def _zero_like(g, x):
    """A scalar 0 of x's type, inside a decomposition (QuantizeLinear without a zero point
    would produce uint8 whatever the data)."""
    return g.CastLike(g.constant(0, np.int32), x)


def _rank(g, i):
    """Input i's rank in a decomposition, or None where its shape is unknown."""
    t = g.input_types[i] if i < len(g.input_types) else None
    return None if t is None or t.shape is None else len(t.shape)


class _Raise:
    """Stands in for the MetaContext the built-in shape helpers report errors through."""

    @staticmethod
    def fail(message):
        raise ValueError(message)


# ====================================================================== QLinearAdd, QLinearMul

_BINARY = ("(Tensor A, Tensor A_scale, Tensor? A_zero_point, Tensor B, Tensor B_scale, Tensor? B_zero_point, "
           "Tensor C_scale, Tensor? C_zero_point) -> Tensor C")
qlinear_add = custom_op(f"{MS}::QLinearAdd{_BINARY}", dtypes=Q8)
qlinear_mul = custom_op(f"{MS}::QLinearMul{_BINARY}", dtypes=Q8)


def _binary_meta(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp):
    if a.dtype not in (U8, I8):
        raise ValueError(f"A must be uint8 or int8, got {a.dtype}")
    if b.dtype != a.dtype:
        raise ValueError(f"B is {b.dtype} but A is {a.dtype}: they must match")
    for s, what in ((a_scale, "A_scale"), (b_scale, "B_scale"), (c_scale, "C_scale")):
        _meta_one_value(s, what, [F32])
    for z, what in ((a_zp, "A_zero_point"), (b_zp, "B_zero_point"), (c_zp, "C_zero_point")):
        _meta_zero_point(z, a.dtype, what)
    return Meta(a.dtype, broadcast_shapes(a.shape, b.shape))


def _binary_params(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp):
    dt = _q8(a, "A")
    if b.dtype != dt:
        raise ValueError(f"B is {b.dtype} but A is {dt}: they must match")
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"A {list(a.shape)} and B {list(b.shape)} do not broadcast") from None
    return (dt, _scale(a_scale, "A_scale"), _zero_point(a_zp, dt, "A_zero_point"), _scale(b_scale, "B_scale"),
            _zero_point(b_zp, dt, "B_zero_point"), _scale(c_scale, "C_scale", divisor=True),
            _zero_point(c_zp, dt, "C_zero_point"))


def _scalar_input(sa, sb):
    """Which input onnxruntime's broadcast loop hands its kernels as a scalar per span: 0
    (A), 1 (B) or None (both are spans). A port of the setup of its Broadcaster: the
    innermost dim (skipping dims of 1 in both, but never the last shared one) decides,
    and an input whose dim there is 1 is the scalar; a 0-d input always is."""
    if not sa or not sb:
        return 0 if not sa or sa[-1] <= 1 else 1
    n = min(len(sa), len(sb))
    for k in range(1, n + 1):
        x, y = sa[-k], sb[-k]
        if max(x, y) == 1 and k < n:
            continue
        return 0 if x <= 1 else (1 if y <= 1 else None)
    return None


def _qlinear_add(a, a_scale, a_zp, b, b_scale, b_zp=None, c_scale=None, c_zp=None, *, out=None):
    """C = saturate(round((sa·(A - za) + sb·(B - zb)) / sc) + zc), in the float32 steps of
    MLAS's AVX2 kernel (what onnxruntime runs on x86 CPUs with AVX2; its SSE2 and ARM
    kernels round a few near-ties the other way): with rA = sa/sc, rB = sb/sc and the
    constant part zc - fma(rA, za, rB·zb) (the compiler fuses it),
    C = fma(A, rA, fma(B, rB, constant)). When onnxruntime's broadcast loop treats A as
    the scalar it passes the inputs to MLAS the other way round, and the two fused steps
    come in the other order."""
    dt, sa, za, sb, zb, sc, zc = _binary_params(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp)
    ra, rb = sa / sc, sb / sc  # float32 divisions
    a_scalar = _scalar_input(a.shape, b.shape) == 0  # decided on the whole shapes
    if a_scalar:  # (inner, its ratio, outer, its ratio) of fma(outer, r, fma(inner, r, c))
        order, c = (0, ra, 1, rb), F32.type(zc) - _fma(rb, zb, ra * F32.type(za))
    else:
        order, c = (1, rb, 0, ra), F32.type(zc) - _fma(ra, za, rb * F32.type(zb))
    lo, hi = (F32.type(v) for v in _qrange(dt))

    def add(a, b):
        # _fma's steps, each in one float64 buffer (8-bit x float32 products are exact there):
        # the same roundings as _fma(outer, r, _fma(inner, r, c)) and _saturate(v, 0, dt),
        # in fewer passes (a 56x56x24 residual: 257 -> 228 us)
        ab = (a, b)
        t = np.empty(np.broadcast_shapes(a.shape, b.shape), F64)
        np.multiply(ab[order[0]], F64.type(order[1]), out=t)
        t += F64.type(c)
        inner = t.astype(F32)
        np.multiply(ab[order[2]], F64.type(order[3]), out=t)
        t += inner
        v = t.astype(F32)
        np.fmax(v, lo, out=v)  # (a NaN becomes the minimum, as _saturate)
        np.fmin(v, hi, out=v)
        np.rint(v, out=v)
        return v.astype(dt)

    return write_elementwise(out, add, a, b, limit=_TILE)


def _qlinear_add_constants(dt, sa, za, sb, zb, sc, zc):
    """_qlinear_add_loop's arguments after the inputs: rA, rB, the constant part, the range."""
    ra, rb = sa / sc, sb / sc
    c = F32.type(zc) - _fma(ra, za, rb * F32.type(zb))
    lo, hi = _qrange(dt)
    return ra, rb, F32.type(c), F32.type(lo), F32.type(hi)


@jit(error_model="numpy")
def _qlinear_add_loop(a, b, ra, rb, c, lo, hi, out):  # pragma: no cover - compiled
    """_qlinear_add's steps per element (A a span): fma(A, rA, fma(B, rB, c)), each fma one
    float32 rounding of the exact float64 value (as _fma), clamped, rounded half to even."""
    for i in range(a.size):
        inner = np.float32(np.float64(b[i]) * np.float64(rb) + np.float64(c))
        v = np.float32(np.float64(a[i]) * np.float64(ra) + np.float64(inner))
        v = min(max(v, lo), hi)
        out[i] = np.rint(v)


@jit(error_model="numpy", fastmath={"contract"})
def _qlinear_add_loop_fused(a, b, ra, rb, c, lo, hi, out):  # pragma: no cover - compiled
    """_qlinear_add_loop in float32, each product and sum left to the compiler to fuse into
    one FMA instruction ("contract": only where the CPU has them, _qlinear_add_loop_here):
    the same single roundings, in vectors twice as wide (a 56x56x24 residual: 38 -> 9 us)."""
    for i in range(a.size):
        inner = np.float32(b[i]) * rb + c
        v = np.float32(a[i]) * ra + inner
        v = min(max(v, lo), hi)
        out[i] = np.rint(v)


@functools.cache
def _qlinear_add_loop_here():
    """The fused loop where the CPU has FMA instructions (LLVM then fuses each a·r + c, as
    MLAS's AVX2 kernel does); else the float64 emulation. (Numba is imported by then.)"""
    import llvmlite.binding as llvm

    return _qlinear_add_loop_fused if llvm.get_host_cpu_features().get("fma") else _qlinear_add_loop


def _qlinear_mul(a, a_scale, a_zp, b, b_scale, b_zp=None, c_scale=None, c_zp=None, *, out=None):
    """C = saturate(round((A - za)(B - zb) · sa·sb/sc) + zc): the integer product (exact),
    times the float32 ratio (sa·sb)/sc, plus zc, two float32 roundings, unfused (MLAS's
    x86 kernel is SSE2 only)."""
    dt, sa, za, sb, zb, sc, zc = _binary_params(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp)
    ratio = (sa * sb) / sc

    def mul(a, b):
        p = (a.astype(np.int32) - za) * (b.astype(np.int32) - zb)
        return _saturate(p.astype(F32) * ratio + F32.type(zc), 0, dt)

    return write_elementwise(out, mul, a, b, limit=_TILE)


def _qlinear_mul_constants(dt, sa, za, sb, zb, sc, zc):
    """_qlinear_mul_loop's arguments after the inputs: the zero points, ratio, zc, the range."""
    lo, hi = _qrange(dt)
    return np.int32(za), np.int32(zb), F32.type((sa * sb) / sc), F32.type(zc), F32.type(lo), F32.type(hi)


@jit(error_model="numpy")
def _qlinear_mul_loop(a, b, za, zb, ratio, zc, lo, hi, out):  # pragma: no cover - compiled
    """_qlinear_mul's steps per element: the exact int32 product, float32 times the ratio
    plus zc (two roundings, unfused), clamped, rounded half to even."""
    for i in range(a.size):
        p = (np.int32(a[i]) - za) * (np.int32(b[i]) - zb)
        v = np.float32(p) * ratio + zc
        v = min(max(v, lo), hi)
        out[i] = np.rint(v)


def _binary_kernel(name, eager, constants, loop):
    """A QLinearAdd / QLinearMul step. Where A and B have the output's shape and the three
    are laid out alike (a quantized CNN's residual Add, its SiLU's product: channels-last
    views), one compiled pass over the bytes in memory order; else the tile-by-tile NumPy
    steps (`eager`: broadcasting, mixed layouts), the same bits. The scales and zero points
    are checked and turned into the pass's constants once, here, when they are constants
    (quantize_static's): per call that was 15-50 us of a 10-40 us pass. `loop()` gives the
    compiled pass (QLinearAdd's is chosen by the CPU: _qlinear_add_loop_here)."""

    def bind(ctx):
        at = (1, 2, 4, 5, 6, 7)
        consts = [ctx.const(i) if ctx.has(i) else None for i in at]
        fixed = None
        if all(c is not None or not ctx.has(i) for c, i in zip(consts, at)) and ctx.dtype(0) in (U8, I8) \
                and ctx.dtype(3) == ctx.dtype(0):
            sa, za, sb, zb, sc, zc = consts
            a0 = np.zeros((), ctx.dtype(0))
            fixed = constants(*_binary_params(a0, sa, za, a0, sb, zb, sc, zc))  # (a bad one: a node error now)

        def step(a, a_scale, a_zp, b, b_scale, b_zp=None, c_scale=None, c_zp=None, *, out=None):
            if out is not None and a.shape == b.shape == out.shape and use_compiled(name):
                flat = same_layout(a, b, out)  # (one layout for the three, or the tile path)
                if flat is not None:
                    args = fixed or constants(*_binary_params(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp))
                    compiled(loop())(flat[0], flat[1], *args, flat[2])
                    return out
            return eager(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp, out=out)

        return step

    return bind


qlinear_add.register_kernel("cpu", _binary_kernel("QLinearAdd", _qlinear_add, _qlinear_add_constants,
                                                  _qlinear_add_loop_here), bind=True, out=True, layouts=(NHWC,),
                            blas=False)
qlinear_mul.register_kernel("cpu", _binary_kernel("QLinearMul", _qlinear_mul, _qlinear_mul_constants,
                                                  lambda: _qlinear_mul_loop), bind=True, out=True, layouts=(NHWC,),
                            blas=False)


def _binary_decomposition(op):
    def decompose(g, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp):
        y = g.op(op, g.DequantizeLinear(a, a_scale, a_zp), g.DequantizeLinear(b, b_scale, b_zp))
        return g.QuantizeLinear(y, c_scale, c_zp or _zero_like(g, a))
    return decompose


def _binary_example(dt):
    rng = np.random.default_rng(0)
    lo, hi = _qrange(np.dtype(dt))
    q = lambda *shape: rng.integers(lo, hi + 1, shape).astype(dt)  # noqa: E731
    s = lambda v: np.asarray(v, F32)  # noqa: E731
    z = lambda v: np.asarray(v, dt)  # noqa: E731
    return [q(2, 3, 4), s(0.05), z(lo + 7), q(4), s(0.03), z(hi - 9), s(0.07), z(lo + 100)]


for _op, _name in ((qlinear_add, "Add"), (qlinear_mul, "Mul")):
    _op.register_meta(_binary_meta)
    _op.register_decomposition(_binary_decomposition(_name))
    _op.register_example(_binary_example)


# ====================================================================== QLinearSigmoid, QLinearLeakyRelu

_UNARY = "(Tensor X, Tensor X_scale, Tensor? X_zero_point, Tensor Y_scale, Tensor? Y_zero_point"
qlinear_sigmoid = custom_op(f"{MS}::QLinearSigmoid{_UNARY}) -> Tensor Y", dtypes=Q8)
qlinear_leaky_relu = custom_op(f"{MS}::QLinearLeakyRelu{_UNARY}, float alpha=0.01) -> Tensor Y", dtypes=Q8)


def _unary_meta(x, x_scale, x_zp, y_scale, y_zp, **_):
    _require(x.dtype in (U8, I8), lambda: f"X must be uint8 or int8, got {x.dtype}")
    _meta_one_value(x_scale, "X_scale", [F32])
    _meta_one_value(y_scale, "Y_scale", [F32])
    _meta_zero_point(x_zp, x.dtype, "X_zero_point")
    _meta_zero_point(y_zp, x.dtype, "Y_zero_point")
    return x


def _unary_table(x, x_scale, x_zp, y_scale, y_zp, fn, out, key=None):
    """onnxruntime's lookup-table activations: dequantize all 256 codes, apply fn in
    float32, quantize back; the input bytes then index the table. `key` names fn (with its
    parameters): the table is then kept for the next call with the same scales and zero
    points (a dozen NumPy calls, ~30 us, per call otherwise: a YOLO's 27 SiLUs a run)."""
    dt = _q8(x, "X")
    params = (_scale(x_scale, "X_scale"), _zero_point(x_zp, dt, "X_zero_point"),
              _scale(y_scale, "Y_scale", divisor=True), _zero_point(y_zp, dt, "Y_zero_point"))
    table = _TABLES.get((key, dt.str, *params)) if key is not None else None
    if table is None:
        d = _dequantized_codes(dt, params[0], params[1])
        table = _quantize(fn(d), params[2], params[3], dt)
        if key is not None:
            if len(_TABLES) >= 1024:
                _TABLES.clear()
            _TABLES[(key, dt.str, *params)] = table
    return _lookup(x, table, out)


_TABLES: dict = {}  # (activation, dtype, scales and zero points) -> its 256-entry table



@qlinear_sigmoid.register_kernel("cpu", out=True, layouts=(NHWC,), blas=False)
def _qlinear_sigmoid(x, x_scale, x_zp=None, y_scale=None, y_zp=None, *, out=None):
    """Y = quantize(sigmoid(dequantize(X))), through onnxruntime's 256-entry table."""
    return _unary_table(x, x_scale, x_zp, y_scale, y_zp, mlas_math.logistic, out, key="sigmoid")


@qlinear_leaky_relu.register_kernel("cpu", out=True, layouts=(NHWC,), blas=False)
def _qlinear_leaky_relu(x, x_scale, x_zp=None, y_scale=None, y_zp=None, *, out=None, alpha=0.01):
    """Y = quantize(leaky_relu(dequantize(X), alpha)), through onnxruntime's 256-entry table."""
    a = F32.type(alpha)
    return _unary_table(x, x_scale, x_zp, y_scale, y_zp, lambda v: np.where(v >= 0, v, a * v), out,
                        key=("leaky_relu", float(a)))


def _unary_decomposition(make):
    def decompose(g, x, x_scale, x_zp, y_scale, y_zp, **attrs):
        y = make(g, g.DequantizeLinear(x, x_scale, x_zp), **attrs)
        return g.QuantizeLinear(y, y_scale, y_zp or _zero_like(g, x))
    return decompose


def _unary_example(dt, y_scale=1 / 200, y_zp=3):
    lo, hi = _qrange(np.dtype(dt))
    x = np.random.default_rng(0).integers(lo, hi + 1, (2, 3, 4)).astype(dt)
    return [x, np.asarray(0.05, F32), np.asarray(lo + 120, dt), np.asarray(y_scale, F32), np.asarray(lo + y_zp, dt)]


qlinear_sigmoid.register_meta(_unary_meta)
qlinear_sigmoid.register_decomposition(_unary_decomposition(lambda g, v: g.Sigmoid(v)))
qlinear_sigmoid.register_example(_unary_example)
qlinear_leaky_relu.register_meta(_unary_meta)
qlinear_leaky_relu.register_decomposition(_unary_decomposition(lambda g, v, alpha: g.LeakyRelu(v, alpha=alpha)))
qlinear_leaky_relu.register_example(lambda dt: (_unary_example(dt, y_scale=0.03, y_zp=120), {"alpha": 0.2}))


# ====================================================================== QLinearGlobalAveragePool

_POOL_IO = "(Tensor X, Tensor x_scale, Tensor{zp} x_zero_point, Tensor y_scale, Tensor{zp} y_zero_point"
qlinear_global_average_pool = custom_op(
    f"{MS}::QLinearGlobalAveragePool{_POOL_IO.format(zp='')}, int channels_last=0) -> Tensor Y", dtypes=Q8)


def _pool_params(x, x_scale, x_zp, y_scale, y_zp):
    dt = _q8(x, "X")
    _require(x.ndim >= 3, lambda: f"X must have rank 3 or more (batch, channels, spatial...), got {list(x.shape)}")
    return (dt, _scale(x_scale, "x_scale"), _zero_point(x_zp, dt, "x_zero_point"),
            _scale(y_scale, "y_scale", divisor=True), _zero_point(y_zp, dt, "y_zero_point"))


def _integer_average(x, sx, zx, sy, zy, dt, axes):
    """MLAS's global average: the int32 sum minus zx·size, times the float32 scale
    sx / (sy · size), requantized. (MLAS refuses images of 2**24 elements or more and
    scales outside [2**-32, 256); the arithmetic is computed here anyway.)"""
    size = int(np.prod([x.shape[a] for a in axes]))
    scale = sx / (sy * F32.type(size))
    acc = x.sum(axis=axes, keepdims=True, dtype=np.int64) - zx * size  # widened as it is summed
    return _saturate(acc.astype(np.int32).astype(F32) * scale, zy, dt)


def _pool_meta_checks(x, x_scale, x_zp, y_scale, y_zp):
    if x.dtype not in (U8, I8):
        raise ValueError(f"X must be uint8 or int8, got {x.dtype}")
    _require(x.shape is None or len(x.shape) >= 3, lambda: f"X must have rank 3 or more, got rank {len(x.shape or ())}")
    _meta_one_value(x_scale, "x_scale", [F32])
    _meta_one_value(y_scale, "y_scale", [F32])
    _meta_zero_point(x_zp, x.dtype, "x_zero_point")
    _meta_zero_point(y_zp, x.dtype, "y_zero_point")


@qlinear_global_average_pool.register_meta
def _qlinear_global_average_pool_meta(x, x_scale, x_zp, y_scale, y_zp, channels_last):
    _pool_meta_checks(x, x_scale, x_zp, y_scale, y_zp)
    if x.shape is None:
        return Meta(x.dtype, None)
    r = len(x.shape)
    spatial = range(1, r - 1) if channels_last else range(2, r)
    return Meta(x.dtype, tuple(1 if k in spatial else d for k, d in enumerate(x.shape)))


@qlinear_global_average_pool.register_kernel("cpu", out=True, layouts=(NHWC,), blas=False)
def _qlinear_global_average_pool(x, x_scale, x_zp, y_scale, y_zp, *, out=None, channels_last=0):
    """The mean over the spatial dims (2.. or, channels_last, 1..-2), in integers."""
    dt, sx, zx, sy, zy = _pool_params(x, x_scale, x_zp, y_scale, y_zp)
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    flat = None if channels_last or x.ndim != 4 else memory_order(x)
    if flat is not None and use_compiled("QLinearGlobalAveragePool"):
        # a quantized CNN's head reading channels-last bytes: each pixel's channels a row,
        # summed per channel and requantized by one compiled pass (NumPy's strided sum over
        # (H, W) of the NHWC view of (1, 1280, 7, 7) in a quantized MobileNetV2's plan:
        # 116-120 us a run; the compiled sums and NumPy's float32 steps 28 us alone; this 9)
        n, c = x.shape[:2]
        lo, hi = _qrange(dt)
        y = out if out is not None and out.flags.c_contiguous else np.empty((n, c, 1, 1), dt)
        compiled(_channel_average)(flat.reshape(n, -1, c), zx, sx / (sy * F32.type(x.shape[2] * x.shape[3])),
                                   F32.type(lo - zy), F32.type(hi - zy), zy, np.empty(c, np.int64), y.reshape(n, c))
        return as_out(y, out) if y is not out else y
    return as_out(_integer_average(x, sx, zx, sy, zy, dt, axes), out)


@jit(error_model="numpy", boundscheck=False)
def _channel_average(x, zx, scale, lo, hi, zy, sums, out):  # pragma: no cover - compiled
    """out[n, c] = _integer_average of x[n, :, c] over its pixels (8-bit codes): the int64
    sum minus zx·pixels as int32, times the float32 scale, clamped to [lo, hi] (NaN to lo,
    as MAXPS), rounded half to even, plus zy: _saturate's steps, element by element."""
    n, pixels, c = x.shape
    for a in range(n):
        for k in range(c):
            sums[k] = 0
        for p in range(pixels):
            for k in range(c):
                sums[k] += np.int64(x[a, p, k])
        for k in range(c):
            v = np.float32(np.int32(sums[k] - zx * pixels)) * scale
            if not v >= lo:
                v = lo
            if v > hi:
                v = hi
            out[a, k] = np.int16(np.rint(v)) + zy


@qlinear_global_average_pool.register_decomposition
def _qlinear_global_average_pool_decomposition(g, x, x_scale, x_zp, y_scale, y_zp, channels_last):
    d = g.DequantizeLinear(x, x_scale, x_zp)
    if channels_last:
        rank = _rank(g, 0)
        if rank is None:
            raise NotImplementedError("channels_last QLinearGlobalAveragePool needs the input's rank to decompose")
        y = g.ReduceMean(d, g.constant(list(range(1, rank - 1)), np.int64), keepdims=1)
    else:
        y = g.GlobalAveragePool(d)
    return g.QuantizeLinear(y, y_scale, y_zp)


@qlinear_global_average_pool.register_example
def _qlinear_global_average_pool_example(dt):
    lo, hi = _qrange(np.dtype(dt))
    x = np.random.default_rng(0).integers(lo, hi + 1, (2, 3, 5, 6)).astype(dt)
    return [x, np.asarray(0.05, F32), np.asarray(lo + 110, dt), np.asarray(0.01, F32), np.asarray(lo + 20, dt)]


# ====================================================================== QLinearAveragePool

qlinear_average_pool = custom_op(
    f"{MS}::QLinearAveragePool{_POOL_IO.format(zp='?')}, int[] kernel_shape, str auto_pad='NOTSET', "
    "int ceil_mode=0, int channels_last=0, int count_include_pad=0, int[] pads=[], int[] strides=[]) -> Tensor Y",
    dtypes=Q8)


def _pool_attrs(rank, kernel_shape, pads, strides, auto_pad):
    """kernel, pads, strides validated as onnxruntime's PoolAttributes does."""
    k = [int(v) for v in kernel_shape]
    n = len(k)
    _require(n == rank - 2, lambda: f"kernel_shape {k} must have one entry per spatial dim ({rank - 2})")
    _require(all(v > 0 for v in k), lambda: f"kernel_shape {k} must be positive")
    strides = [int(v) for v in strides] or [1] * n
    pads = [int(v) for v in pads] or [0] * (2 * n)
    _require(len(strides) == n and all(s > 0 for s in strides),
             lambda: f"strides {strides} must be {n} positive values")
    _require(len(pads) == 2 * n and all(p >= 0 for p in pads), lambda: f"pads {pads} must be {2 * n} values >= 0")
    _require(all(pads[i] < k[i] and pads[i + n] < k[i] for i in range(n)),
             lambda: f"pads {pads} must be smaller than the kernel {k}")
    _require(auto_pad in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"), lambda: f"unknown auto_pad {auto_pad!r}")
    return k, pads, strides


@qlinear_average_pool.register_meta
def _qlinear_average_pool_meta(x, x_scale, x_zp, y_scale, y_zp, kernel_shape, auto_pad, ceil_mode, channels_last,
                               count_include_pad, pads, strides):
    from ..ops.meta.nn import conv_out_dim

    _pool_meta_checks(x, x_scale, x_zp, y_scale, y_zp)
    if x.shape is None:
        return Meta(x.dtype, None)
    k, pads, strides = _pool_attrs(len(x.shape), kernel_shape, pads, strides, auto_pad)
    n = len(k)
    spatial = x.shape[1:-1] if channels_last else x.shape[2:]
    out = [conv_out_dim(_Raise, spatial[i], k[i], strides[i], 1, pads[i], pads[i + n], auto_pad, bool(ceil_mode))
           for i in range(n)]
    if channels_last:
        return Meta(x.dtype, (x.shape[0], *out, x.shape[-1]))
    return Meta(x.dtype, (x.shape[0], x.shape[1], *out))


@qlinear_average_pool.register_kernel("cpu", out=True, blas=False)
def _qlinear_average_pool(x, x_scale, x_zp=None, y_scale=None, y_zp=None, *, out=None, kernel_shape,
                          auto_pad="NOTSET", ceil_mode=0, channels_last=0, count_include_pad=0, pads=(), strides=()):
    """onnxruntime's quantized average pool: X dequantized to float32, each window summed
    in float32 in row-major order (padding adds nothing), divided by the count, then
    quantized as round_half_even(sum / count / y_scale + y_zero_point). The count is the
    window's cells inside the input, or with count_include_pad the whole kernel (cells
    past the end padding that ceil_mode adds included). A window covering the whole
    unpadded image is computed by the global pool's integer path instead, as onnxruntime
    switches to it."""

    dt, sx, zx, sy, zy = _pool_params(x, x_scale, x_zp, y_scale, y_zp)
    k, pads, strides = _pool_attrs(x.ndim, kernel_shape, pads, strides, auto_pad)
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    size = list(x.shape[2:])
    begin, end, out_sp, strides, _ = spatial_pads(size, k, strides, None, pads, auto_pad, bool(ceil_mode))
    _require(all(o > 0 for o in out_sp), lambda: f"kernel {k} does not fit the padded input {size}")
    shape = x.shape[:2] + tuple(out_sp)
    y = new_out(None if out is None else (np.moveaxis(out, -1, 1) if channels_last else out), shape, dt)
    if y.shape != shape:
        raise ValueError(f"the pooled shape is {list(shape)}, the planned output {list(y.shape)}")
    if size == k and not any(begin) and not any(end):
        y[...] = _integer_average(x, sx, zx, sy, zy, dt, tuple(range(2, x.ndim)))
        return out if out is not None else (np.moveaxis(y, 1, -1) if channels_last else y)
    # Ceil mode may place windows past the end padding: pad further, with zeros that add nothing.
    extra = [max(0, (o - 1) * s + kk - (n + b + e)) for o, s, kk, n, b, e in zip(out_sp, strides, k, size, begin, end)]
    count = _pool_count(size, k, begin, out_sp, strides, count_include_pad)
    plane = int(np.prod(size, dtype=np.int64))
    step = max(1, _TILE // max(plane, 1))
    for c0 in range(0, x.shape[1], step):  # planes are independent: a block of channels at a time
        xd = pad_spatial(sx * (x[:, c0:c0 + step].astype(np.int32) - zx).astype(F32), begin,
                         [e + x_ for e, x_ in zip(end, extra)], 0)
        acc = np.zeros(xd.shape[:2] + tuple(out_sp), F32)
        for _, view in window_views(xd, k, strides, [1] * len(k), out_sp):
            acc += view
        # quantize_value in qlinear_pool.cc: the zero point is added before rounding, in float32.
        acc /= count
        acc /= sy
        acc += F32.type(zy)
        np.rint(acc, out=acc)
        y[:, c0:c0 + step] = np.clip(acc, *_qrange(dt), out=acc)
    return out if out is not None else (np.moveaxis(y, 1, -1) if channels_last else y)


def _pool_count(size, k, begin, out_sp, strides, count_include_pad):
    """The float32 divisor of every output cell: the whole kernel with count_include_pad,
    else the window's cells inside the input."""
    if count_include_pad:
        return F32.type(np.prod(k))
    count = np.ones((), np.int64)
    for i, (n, kk, b, o, s) in enumerate(zip(size, k, begin, out_sp, strides)):
        start = np.arange(o) * s - b
        c = np.minimum(start + kk, n) - np.maximum(start, 0)
        count = count * c.reshape([-1 if j == i else 1 for j in range(len(out_sp))])
    return count.astype(F32)


@qlinear_average_pool.register_decomposition
def _qlinear_average_pool_decomposition(g, x, x_scale, x_zp, y_scale, y_zp, kernel_shape, auto_pad, ceil_mode,
                                        channels_last, count_include_pad, pads, strides):
    # ONNX's AveragePool leaves the ceil-mode overhang out of count_include_pad's divisor,
    # onnxruntime's QLinearAveragePool does not; and NHWC needs the rank to transpose.
    if ceil_mode and count_include_pad:
        raise NotImplementedError("QLinearAveragePool with ceil_mode and count_include_pad has no decomposition")
    rank = _rank(g, 0)
    if channels_last and rank is None:
        raise NotImplementedError("channels_last QLinearAveragePool needs the input's rank to decompose")
    d = g.DequantizeLinear(x, x_scale, x_zp)
    if channels_last:
        d = g.Transpose(d, perm=[0, rank - 1, *range(1, rank - 1)])
    y = g.AveragePool(d, kernel_shape=list(kernel_shape), auto_pad=auto_pad, ceil_mode=ceil_mode,
                      count_include_pad=count_include_pad, pads=list(pads) or None, strides=list(strides) or None)
    if channels_last:
        y = g.Transpose(y, perm=[0, *range(2, rank), 1])
    return g.QuantizeLinear(y, y_scale, y_zp or _zero_like(g, x))


@qlinear_average_pool.register_example
def _qlinear_average_pool_example(dt):
    lo, hi = _qrange(np.dtype(dt))
    x = np.random.default_rng(0).integers(lo, hi + 1, (2, 3, 7, 6)).astype(dt)
    return ([x, np.asarray(0.05, F32), np.asarray(lo + 110, dt), np.asarray(0.02, F32), np.asarray(lo + 30, dt)],
            {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]})


# ====================================================================== QLinearConcat

qlinear_concat = custom_op(f"{MS}::QLinearConcat(Tensor Y_scale, Tensor Y_zero_point, Tensor... inputs, int axis) "
                           "-> Tensor Y", dtypes=Q8)


def _triples(inputs):
    _require(len(inputs) >= 3 and len(inputs) % 3 == 0,
             lambda: "the inputs after Y_scale, Y_zero_point must be (tensor, scale, zero point) triples, "
                     f"got {len(inputs)}")
    for k in range(0, len(inputs), 3):
        _require(all(t is not None for t in inputs[k:k + 3]),
                 lambda: f"input {k // 3} of the concatenation is missing a part")
        yield k // 3, inputs[k:k + 3]


@qlinear_concat.register_meta
def _qlinear_concat_meta(y_scale, y_zp, *inputs, axis):
    _meta_one_value(y_scale, "Y_scale", [F32])
    _require(y_zp.dtype in (U8, I8), lambda: f"Y_zero_point must be uint8 or int8, got {y_zp.dtype}")
    _meta_one_value(y_zp, "Y_zero_point")
    shapes = []
    for i, (x, s, z) in _triples(inputs):
        _require(x.dtype == y_zp.dtype,
                 lambda: f"input {i} is {x.dtype} but Y_zero_point is {y_zp.dtype}: they must match")
        _meta_one_value(s, f"the scale of input {i}", [F32])
        _meta_zero_point(z, x.dtype, f"the zero point of input {i}")
        shapes.append(x.shape)
    if any(s is None for s in shapes):
        return Meta(y_zp.dtype, None)
    rank = len(shapes[0])
    _require(all(len(s) == rank for s in shapes), lambda: f"the inputs' ranks differ: {[len(s) for s in shapes]}")
    _require(-rank <= axis < rank, lambda: f"axis {axis} is out of range for rank {rank}")
    a = axis % rank
    out = list(shapes[0])
    for s in shapes[1:]:
        for k in range(rank):
            if k != a and isinstance(out[k], int) and isinstance(s[k], int):
                _require(out[k] == s[k],
                         lambda: f"the inputs' shapes {[list(s) for s in shapes]} differ outside axis {axis}")
            elif k != a and not isinstance(out[k], int) and isinstance(s[k], int):
                out[k] = s[k]
    total = sum(s[a] for s in shapes)
    out[a] = total
    return Meta(y_zp.dtype, tuple(out))


def _qlinear_concat(y_scale, y_zp, *inputs, out=None, axis):
    """Each input requantized to Y's scale and zero point through a 256-entry table (its
    bytes copied when its parameters are Y's, as onnxruntime does), then concatenated."""
    dt = _q8(y_zp, "Y_zero_point")
    sy, zy = _scale(y_scale, "Y_scale", divisor=True), _zero_point(y_zp, dt, "Y_zero_point")
    parts = []
    for i, (x, s, z) in _triples(inputs):
        _require(x.dtype == dt, lambda: f"input {i} is {x.dtype} but Y_zero_point is {dt}: they must match")
        sx, zx = _scale(s, f"the scale of input {i}"), _zero_point(z, dt, f"the zero point of input {i}")
        parts.append(x if (sx, zx) == (sy, zy) else _lookup(x, _requantize_table(dt, sx, zx, sy, zy)))
    rank = parts[0].ndim
    _require(rank > 0 and all(p.ndim == rank for p in parts),
             lambda: f"the inputs must have the same rank (>= 1), got shapes {[list(p.shape) for p in parts]}")
    _require(-rank <= axis < rank, lambda: f"axis {axis} is out of range for rank {rank}")
    a = axis % rank
    _require(all(p.shape[:a] + p.shape[a + 1:] == parts[0].shape[:a] + parts[0].shape[a + 1:] for p in parts),
             lambda: f"the inputs' shapes {[list(p.shape) for p in parts]} differ outside axis {axis}")
    return np.concatenate(parts, axis=a, out=out)


def _concat_tables(dt, y_scale, y_zp, inputs):
    """Each input's 256-entry table of output codes (indexed by its bytes): the identity where
    its parameters are Y's, as onnxruntime copies those bytes."""
    sy, zy = _scale(y_scale, "Y_scale", divisor=True), _zero_point(y_zp, dt, "Y_zero_point")
    tables = []
    for i, (x, s, z) in _triples(inputs):
        sx, zx = _scale(s, f"the scale of input {i}"), _zero_point(z, dt, f"the zero point of input {i}")
        tables.append(_IDENTITY if (sx, zx) == (sy, zy) else _requantize_table(dt, sx, zx, sy, zy).view(U8))
    return tables


_IDENTITY = np.arange(256, dtype=np.uint8)


def _concat_spans(xs, out, axis):
    """How each input's bytes land in out's, for one compiled pass per input: [(x's bytes in
    memory order, rows, row length, out's row stride, offset)], all arrays C-contiguous, or
    all channels-last and the axis the channels; None otherwise (NumPy's concatenate). A
    channel slice of a channels-last output is a strided block of rows: each pixel's
    channels of one input, a row."""
    a = axis % out.ndim
    if all(x.flags.c_contiguous for x in xs) and out.flags.c_contiguous:
        flat, order = out.reshape(-1), list(range(out.ndim))
    elif a == 1 and (flat := memory_order(out)) is not None and all(memory_order(x) is not None for x in xs):
        order = [0, *range(2, out.ndim), 1]
    else:
        return None
    at = order.index(a)  # the axis's place in memory order
    stride = int(np.prod([out.shape[d] for d in order[at:]]))
    spans, offset = [], 0
    for x in xs:
        row = int(np.prod([x.shape[d] for d in order[at:]]))
        xb = x.reshape(-1) if x.flags.c_contiguous else memory_order(x)
        if row:
            spans.append((xb.view(U8), xb.size // row, row, stride, offset))
        else:
            spans.append(None)
        offset += row
    return flat.view(U8), spans


@jit(error_model="numpy")
def _concat_rows(x, table, rows, row, stride, offset, out):  # pragma: no cover - compiled
    """out[r·stride + offset + i] = table[x[r·row + i]]: one input's rows into its place."""
    for r in range(rows):
        o, xo = r * stride + offset, r * row
        for i in range(row):
            out[o + i] = table[x[xo + i]]


def _qlinear_concat_kernel(ctx):
    """QLinearConcat's step: each input through its table straight into its place in the
    output (a compiled pass per input, any shared layout: a quantized YOLO's C2f concats
    channels-last values; requantizing into temporaries then NumPy's concatenate took
    1 ms for (1, 48, 80, 80)). The tables are made once, here, when the scales and zero
    points are constants."""
    axis = int(ctx.attrs["axis"])
    n = len(ctx.node.inputs)
    params = [i for i in range(n) if i in (0, 1) or (i - 2) % 3]
    fixed = None
    if all(ctx.has(i) and ctx.const(i) is not None for i in params) and ctx.dtype(1) in (U8, I8):
        dt = ctx.dtype(1)
        fixed = _concat_tables(dt, ctx.const(0), ctx.const(1),
                               [np.zeros((), dt) if (i - 2) % 3 == 0 else ctx.const(i) for i in range(2, n)])

    # the spans of the last inputs and output (views of them, ~25 us to work out for four
    # inputs): a plan hands the step the same arena arrays every run
    last = [(), None, None]

    def step(y_scale, y_zp, *inputs, out=None):
        xs = inputs[::3]
        if out is not None and out is last[1] and len(xs) == len(last[0]) \
                and all(a is b for a, b in zip(xs, last[0])) and use_compiled("QLinearConcat"):
            placed = last[2]
        elif out is not None and use_compiled("QLinearConcat") and all(isinstance(x, np.ndarray) for x in xs) \
                and all(x.dtype == out.dtype and x.ndim == out.ndim for x in xs) and out.ndim:
            placed = _concat_spans(xs, out, axis) if -out.ndim <= axis < out.ndim else None
            if placed is not None and sum(x.shape[axis] for x in xs) != out.shape[axis]:
                placed = None
            last[:] = [xs, out, placed] if placed is not None else [(), None, None]
        else:
            placed = None
        if placed is None:
            return _qlinear_concat(y_scale, y_zp, *inputs, out=out, axis=axis)
        tables = fixed or _concat_tables(_q8(y_zp, "Y_zero_point"), y_scale, y_zp, inputs)
        flat, spans = placed
        for span, table in zip(spans, tables):
            if span is not None:
                compiled(_concat_rows)(span[0], table, *span[1:], flat)
        return out

    return step


# The first input is the output's float32 scale: that is the dtype the kernel is chosen by.
qlinear_concat.register_kernel("cpu", _qlinear_concat_kernel, dtypes=[F32], bind=True, out=True, layouts=(NHWC,),
                               blas=False)


@qlinear_concat.register_decomposition
def _qlinear_concat_decomposition(g, y_scale, y_zp, *inputs, axis):
    parts = [g.DequantizeLinear(*inputs[k:k + 3]) for k in range(0, len(inputs), 3)]
    return g.QuantizeLinear(g.Concat(*parts, axis=axis), y_scale, y_zp)


@qlinear_concat.register_example
def _qlinear_concat_example(dt):
    rng = np.random.default_rng(0)
    lo, hi = _qrange(np.dtype(dt))
    q = lambda *shape: rng.integers(lo, hi + 1, shape).astype(dt)  # noqa: E731
    s, z = (lambda v: np.asarray(v, F32)), (lambda v: np.asarray(v, dt))
    return ([s(0.04), z(lo + 100), q(2, 3, 4), s(0.04), z(lo + 100), q(2, 2, 4), s(0.09), z(lo + 20),
             q(2, 1, 4), s(0.01), z(hi - 5)], {"axis": 1})


# ====================================================================== QLinearWhere

qlinear_where = custom_op(
    f"{MS}::QLinearWhere(Tensor condition, Tensor X, Tensor x_scale, Tensor x_zero_point, Tensor Y, Tensor y_scale, "
    "Tensor y_zero_point, Tensor z_scale, Tensor z_zero_point) -> Tensor Z", dtypes=Q8)


@qlinear_where.register_meta
def _qlinear_where_meta(cond, x, x_scale, x_zp, y, y_scale, y_zp, z_scale, z_zp):
    _require(cond.dtype == np.bool_, lambda: f"condition must be bool, got {cond.dtype}")
    _require(x.dtype in (U8, I8), lambda: f"X must be uint8 or int8, got {x.dtype}")
    _require(y.dtype == x.dtype, lambda: f"Y is {y.dtype} but X is {x.dtype}: they must match")
    for s, what in ((x_scale, "x_scale"), (y_scale, "y_scale"), (z_scale, "z_scale")):
        _meta_one_value(s, what, [F32])
    for z, what in ((x_zp, "x_zero_point"), (y_zp, "y_zero_point"), (z_zp, "z_zero_point")):
        _meta_zero_point(z, x.dtype, what)
    return Meta(x.dtype, broadcast_shapes(cond.shape, x.shape, y.shape))


def _qlinear_where(cond, x, x_scale, x_zp, y, y_scale, y_zp, z_scale, z_zp, *, out=None):
    """Z = X requantized to Z's parameters where the condition holds, else Y requantized
    (each through a 256-entry table, as onnxruntime builds them)."""
    _require(cond.dtype == np.bool_, lambda: f"condition must be bool, got {cond.dtype}")
    dt = _q8(x, "X")
    _require(y.dtype == dt, lambda: f"Y is {y.dtype} but X is {dt}: they must match")
    try:
        np.broadcast_shapes(cond.shape, x.shape, y.shape)
    except ValueError:
        raise ValueError(f"condition {list(cond.shape)}, X {list(x.shape)} and Y {list(y.shape)} "
                         "do not broadcast") from None
    sz, zz = _scale(z_scale, "z_scale", divisor=True), _zero_point(z_zp, dt, "z_zero_point")
    tx = _requantize_table(dt, _scale(x_scale, "x_scale"), _zero_point(x_zp, dt, "x_zero_point"), sz, zz)
    ty = _requantize_table(dt, _scale(y_scale, "y_scale"), _zero_point(y_zp, dt, "y_zero_point"), sz, zz)
    return write_elementwise(out, lambda c, u, v: np.where(c, _lookup(u, tx), _lookup(v, ty)), cond, x, y,
                             limit=_TILE)


# The first input is the bool condition: that is the dtype the kernel is chosen by.
qlinear_where.register_kernel("cpu", _qlinear_where, dtypes=[np.bool_], out=True, blas=False)


@qlinear_where.register_decomposition
def _qlinear_where_decomposition(g, cond, x, x_scale, x_zp, y, y_scale, y_zp, z_scale, z_zp):
    v = g.Where(cond, g.DequantizeLinear(x, x_scale, x_zp), g.DequantizeLinear(y, y_scale, y_zp))
    return g.QuantizeLinear(v, z_scale, z_zp)


@qlinear_where.register_example
def _qlinear_where_example(dt):
    rng = np.random.default_rng(0)
    lo, hi = _qrange(np.dtype(dt))
    q = lambda *shape: rng.integers(lo, hi + 1, shape).astype(dt)  # noqa: E731
    s, z = (lambda v: np.asarray(v, F32)), (lambda v: np.asarray(v, dt))
    return [rng.random((2, 3, 4)) > 0.5, q(2, 3, 4), s(0.05), z(lo + 90), q(3, 4), s(0.02), z(hi - 40), s(0.04),
            z(lo + 128)]


# ====================================================================== QGemm

qgemm = custom_op(
    f"{MS}::QGemm(Tensor A, Tensor a_scale, Tensor a_zero_point, Tensor B, Tensor b_scale, Tensor b_zero_point, "
    "Tensor? C, Tensor? y_scale, Tensor? y_zero_point, float alpha=1.0, int transA=0, int transB=0) -> Tensor Y",
    dtypes=Q8)


def _column_param(p, n, what):
    """b's scale or zero point: per tensor (one value) or per column ([N])."""
    _require(p.ndim == 0 or (p.ndim == 1 and p.shape[0] in (1, n)),
             lambda: f"{what} must be a scalar or a 1-D tensor of 1 or N={n} values, got shape {list(p.shape)}")
    return p.reshape(()) if p.size == 1 else p


@qgemm.register_meta
def _qgemm_meta(a, a_scale, a_zp, b, b_scale, b_zp, c, y_scale, y_zp, alpha, transA, transB):
    if a.dtype not in (U8, I8) or b.dtype not in (U8, I8):
        raise ValueError(f"A and B must be uint8 or int8, got {a.dtype}, {b.dtype}")
    _meta_one_value(a_scale, "a_scale", [F32])
    _meta_zero_point(a_zp, a.dtype, "a_zero_point")
    if b_scale.dtype != F32:
        raise ValueError(f"b_scale must be float32, got {b_scale.dtype}")
    if b_zp.dtype != b.dtype:
        raise ValueError(f"b_zero_point is {b_zp.dtype} but B is {b.dtype}: they must match")
    if c is not None and c.dtype != I32:
        raise ValueError(f"C must be int32, got {c.dtype}")
    _meta_one_value(y_scale, "y_scale", [F32])
    _meta_zero_point(y_zp, a.dtype, "y_zero_point")
    out_dt = y_zp.dtype if y_zp is not None else F32
    if a.shape is None or b.shape is None:
        return Meta(out_dt, None)
    _require(len(a.shape) == 2 and len(b.shape) == 2,
             lambda: f"A and B must be 2-D, got ranks {len(a.shape)}, {len(b.shape)}")
    m, ka = (a.shape[1], a.shape[0]) if transA else a.shape
    kb, n = (b.shape[1], b.shape[0]) if transB else b.shape
    _require(not (isinstance(ka, int) and isinstance(kb, int) and ka != kb),
             lambda: f"inner dimensions differ: {ka} vs {kb}")
    return Meta(out_dt, (m, n))


def _qgemm(a, a_scale, a_zp, b, b_scale, b_zp, c=None, y_scale=None, y_zp=None, *, out=None, alpha=1.0, transA=0,
           transB=0, product=None):
    """Y = alpha · a_scale · b_scale · ((A - a_zp) @ (B - b_zp) + C), A and B optionally
    transposed, C int32 (in the accumulator's scale). With y_scale and y_zero_point, Y is
    requantized (MLAS: the int32 accumulator in float32, times the float32 scale
    alpha·a_scale·b_scale / y_scale, rounded half to even, plus the zero point); without
    them Y is float32. As onnxruntime: y_scale alone gives a float32 Y divided by it,
    y_zero_point alone a quantized Y with the scale not divided.

    product(A', za) -> the int32 sums, where another engine computes them (onednn's kernel
    below: B constant, made ready once); else the exact float32 GEMMs of _int_matmul."""
    _q8(a, "A"), _q8(b, "B")
    _require(a.ndim == 2 and b.ndim == 2, lambda: f"A {list(a.shape)} and B {list(b.shape)} must be 2-D")
    a2, b2 = (a.T if transA else a), (b.T if transB else b)
    (m, k), (kb, n) = a2.shape, b2.shape
    _require(k == kb, lambda: f"inner dimensions differ: A {list(a.shape)} (transA={transA}) and B {list(b.shape)} "
                              f"(transB={transB})")
    sa, za = _scale(a_scale, "a_scale"), _zero_point(a_zp, a.dtype, "a_zero_point")
    _require(b_scale is not None and b_scale.dtype == F32, "b_scale must be float32")
    if b_zp is None or b_zp.dtype != b.dtype:  # (tested before formatting: see _q8)
        raise ValueError(f"b_zero_point must have B's type {b.dtype}")
    _require(b_scale.shape == b_zp.shape or b_scale.size == b_zp.size == 1,
             lambda: f"b_scale {list(b_scale.shape)} and b_zero_point {list(b_zp.shape)} must have the same shape")
    bs, bz = _column_param(b_scale, n, "b_scale"), _column_param(b_zp, n, "b_zero_point")
    acc = _int_matmul(a2, za, b2, bz.astype(F64)) if product is None else product(a2, za)
    if c is not None:
        if c.dtype != I32:
            raise ValueError(f"C must be int32, got {c.dtype}")
        try:
            acc = acc + np.broadcast_to(c, (m, n))
        except ValueError:
            raise ValueError(f"C {list(c.shape)} does not broadcast to the output [{m}, {n}]") from None
    scale = F32.type(alpha) * sa * bs  # float32, in onnxruntime's order
    if y_scale is not None:
        scale = scale / _scale(y_scale, "y_scale", divisor=True)
    y = acc.astype(F32) * scale
    if y_zp is None:
        return as_out(y, out)
    if y_zp.dtype != a.dtype:
        raise ValueError(f"y_zero_point is {y_zp.dtype} but A is {a.dtype}: they must match")
    return as_out(_saturate(y, _zero_point(y_zp, a.dtype, "y_zero_point"), a.dtype), out)


qgemm.register_kernel("cpu", _qgemm, out=True)


def _qgemm_b_reason(ctx):
    """Why B (input 3) and its zero point are not constants oneDNN's kernels make ready once,
    when the plan is built, or None."""
    b = ctx.const(3)
    if b is None:
        return "B is not a constant (its bytes are reordered once, when the plan is built)"
    if b.ndim != 2 or b.dtype not in (U8, I8) or b.size == 0:
        return f"B is {b.dtype}{list(b.shape)}, not a non-empty 2-D 8-bit matrix"
    n = b.shape[0] if ctx.attrs.get("transB", 0) else b.shape[1]
    bz = ctx.const(5)
    if bz is None or bz.dtype != b.dtype or bz.size not in (1, n) or bz.ndim > 1:
        return "b_zero_point is computed at run time, or is neither one value nor one per column"
    return None


def _onednn_qgemm_reason(ctx):
    from ..kernels.onednn.int8 import exact_reason

    return exact_reason() or _qgemm_b_reason(ctx)


@kernel("QGemm", provider="onednn", domain=MS, dtypes=Q8, out=True, bind=True, accepts=_onednn_qgemm_reason,
        name="int8")
def _qgemm_onednn(ctx):
    """cpu's QGemm with its int32 sums on oneDNN's exact u8 x s8 matmul (B constant, reordered
    once; its zero point compensated): the same float32 steps after, the same bytes. A
    quantize_static MobileNetV2's classifier (1280 -> 1000): 0.5 ms on cpu's float GEMMs."""
    from ..kernels.onednn.int8 import Int8Weights

    b = ctx.const(3)
    attrs = {k: ctx.attrs[k] for k in ("alpha", "transA", "transB") if k in ctx.attrs}
    weights = Int8Weights(b.T if attrs.get("transB", 0) else b, ctx.const(5).reshape(-1))
    whole = _requantizing_qgemm(ctx, weights, attrs)
    if whole is not None:
        return whole

    def step(a, a_scale, a_zp, b_, b_scale, b_zp, c=None, y_scale=None, y_zp=None, *, out=None):
        return _qgemm(a, a_scale, a_zp, b_, b_scale, b_zp, c, y_scale, y_zp, out=out, product=weights.product,
                      **attrs)

    return step


def _onednn_qgemm_float_reason(ctx):
    from ..kernels.onednn.int8_float_matmul import qgemm_reason  # (oneDNN loaded only where it runs)

    return _qgemm_b_reason(ctx) or qgemm_reason(ctx)


@kernel("QGemm", provider="onednn", domain=MS, dtypes=Q8, out=True, bind=True, accepts=_onednn_qgemm_float_reason,
        name="float32")
def _qgemm_onednn_float(ctx):
    """cpu's QGemm with its int32 sums as an exact float32 oneDNN product (B centered and
    packed once), where the CPU's 8-bit products saturate (kernels/onednn/int8_float_matmul.py):
    the same float32 steps after, the same bytes. A quantize_static MobileNetV2's classifier
    (1280 -> 1000) on a 2-core AVX2 EPYC: 1.9 ms a run on cpu's float GEMMs over slices of
    K (B converted to float32 at every call)."""
    from ..kernels.onednn.int8_float_matmul import qgemm_product

    product = qgemm_product(ctx)
    attrs = {k: ctx.attrs[k] for k in ("alpha", "transA", "transB") if k in ctx.attrs}

    def step(a, a_scale, a_zp, b_, b_scale, b_zp, c=None, y_scale=None, y_zp=None, *, out=None):
        return _qgemm(a, a_scale, a_zp, b_, b_scale, b_zp, c, y_scale, y_zp, out=out, product=product, **attrs)

    return step


def _requantizing_qgemm(ctx, weights, attrs):
    """QGemm in one oneDNN matmul that requantizes as it writes (Int8Weights.requantized:
    a code apart from cpu's kernel at a rounding tie, as QLinearConv's), or None where it
    does not apply: B int8 with zero point 0, A not transposed, an 8-bit Y, every scale,
    zero point and C a constant (quantize_static's classifier), C one value or one per
    column. A MobileNetV2's 1280 -> 1000 classifier: 185 -> 78 us in its plan's profile (the
    exact int32 sums, then NumPy's float32 steps, before); a session of that node alone
    107 -> 54 us a run."""
    n = weights.n
    consts = {i: ctx.const(i) for i in (1, 2, 4, 6, 7, 8) if ctx.has(i)}
    if attrs.get("transA", 0) or not ctx.has(8) or any(v is None for v in consts.values()) \
            or ctx.dtype(8) not in (U8, I8) or ctx.dtype(0) != ctx.dtype(8) or not ctx.has(7):
        return None
    c = consts.get(6)
    if c is not None and (c.dtype != I32 or c.size not in (1, n) or (c.size == n and c.shape[-1] != n)):
        return None
    try:  # the checks and the multiplier as the cpu kernel makes them (its messages for bad constants)
        a_dt = ctx.dtype(0)
        za = _zero_point(consts.get(2), a_dt, "a_zero_point")
        sa = _scale(consts[1], "a_scale")
        bs = _column_param(consts[4], n, "b_scale")
        mult = F32.type(attrs.get("alpha", 1.0)) * sa * bs / _scale(consts[7], "y_scale", divisor=True)
        yz = _zero_point(consts[8], a_dt, "y_zero_point")
    except ValueError:
        return None  # (cpu's steps say what is wrong, at run time)
    if not weights.requantizes(a_dt):
        return None
    mult = np.ascontiguousarray(np.broadcast_to(np.asarray(mult, F32), (n,)))
    bias = None if c is None else np.ascontiguousarray(np.broadcast_to(c.reshape(-1).astype(F32), (n,)) * mult)

    def step(a, a_scale, a_zp, b_, b_scale, b_zp, c=None, y_scale=None, y_zp=None, *, out=None):
        _q8(a, "A")
        _require(a.ndim == 2 and a.shape[1] == weights.k,
                 lambda: f"A {list(a.shape)} must be 2-D with {weights.k} columns")
        return weights.requantized(a, za, mult, bias, yz, a_dt, out=out)

    return step


@qgemm.register_decomposition
def _qgemm_decomposition(g, a, a_scale, a_zp, b, b_scale, b_zp, c, y_scale, y_zp, alpha, transA, transB):
    # Exact: the same integer product, then the same float32 multiplications as the kernel.
    a = g.Transpose(a, perm=[1, 0]) if transA else a
    b = g.Transpose(b, perm=[1, 0]) if transB else b
    acc = g.MatMulInteger(a, b, a_zp, b_zp)
    if c:
        acc = g.Add(acc, c)
    scale = g.Mul(g.Mul(g.constant(alpha, np.float32), a_scale), b_scale)
    if y_scale:
        scale = g.Div(scale, y_scale)
    y = g.Mul(g.Cast(acc, to=1), scale)
    return g.QuantizeLinear(y, g.constant(1.0, np.float32), y_zp) if y_zp else y


@qgemm.register_example
def _qgemm_example(dt):
    rng = np.random.default_rng(0)
    lo, hi = _qrange(np.dtype(dt))
    # Not transposed: `glassrt check` takes every input's first dim for the batch, and B's
    # (K) then only has to agree with A's last.
    a = rng.integers(lo, hi + 1, (2, 5)).astype(dt)
    b = rng.integers(-128, 128, (5, 3)).astype(I8)
    return ([a, np.asarray(0.02, F32), np.asarray(lo + 120, dt), b, rng.uniform(0.01, 0.03, 3).astype(F32),
             np.zeros(3, I8), rng.integers(-500, 500, 3).astype(np.int32), np.asarray(0.05, F32),
             np.asarray(lo + 100, dt)], {"alpha": 0.5})


# ====================================================================== QLinearSoftmax

# axis: absent means 1 below opset 13 and -1 from 13 on (the Softmax the node replaced);
# this default stands for "absent".
_AXIS_UNSET = -(2 ** 31)
qlinear_softmax = custom_op(
    f"{MS}::QLinearSoftmax(Tensor X, Tensor X_scale, Tensor? x_zero_point, Tensor y_scale, Tensor y_zero_point, "
    f"int opset, int axis={_AXIS_UNSET}) -> Tensor Y", dtypes=Q8)


def _softmax_axis(axis, opset, rank):
    return normalize_axis((1 if opset < 13 else -1) if axis == _AXIS_UNSET else axis, rank)


@qlinear_softmax.register_meta
def _qlinear_softmax_meta(x, x_scale, x_zp, y_scale, y_zp, opset, axis):
    _require(x.dtype in (U8, I8), lambda: f"X must be uint8 or int8, got {x.dtype}")
    _meta_one_value(x_scale, "X_scale", [F32])
    _meta_one_value(y_scale, "y_scale", [F32])
    _meta_zero_point(x_zp, x.dtype, "x_zero_point")
    _meta_zero_point(y_zp, x.dtype, "y_zero_point")
    if x.shape is not None:
        _require(len(x.shape) >= 1, "X must have rank 1 or more")
        _softmax_axis(axis, opset, len(x.shape))
    return x


@qlinear_softmax.register_kernel("cpu", out=True)
def _qlinear_softmax(x, x_scale, x_zp=None, y_scale=None, y_zp=None, *, out=None, opset, axis=_AXIS_UNSET):
    """onnxruntime's table-driven softmax over `axis` (opset >= 13) or over the dims from
    `axis` on, flattened (opset < 13). Its semantics, not a float softmax requantized:
      - e = float32(exp((x - max(row) + shift) · X_scale)), from a 256-entry table
        computed in double (shift = max(0, ln(FLT_MAX / D) - 5) / X_scale scales every
        entry up, short of overflowing a sum of D of them), so X's zero point plays no part;
      - the row sum is accumulated in float32, in order;
      - Y = round_half_even(e · floor(1 / y_scale) / sum) + y_zero_point, saturated: the
        output scale is taken as 1 / floor(1 / y_scale), not y_scale."""
    dt = _q8(x, "X")
    sx = _scale(x_scale, "X_scale")
    _zero_point(x_zp, dt, "x_zero_point")
    sy, zy = _scale(y_scale, "y_scale", divisor=True), _zero_point(y_zp, dt, "y_zero_point")
    _require(x.ndim >= 1, "X must have rank 1 or more")
    a = _softmax_axis(axis, opset, x.ndim)
    if x.size == 0:
        return as_out(x.copy(), out)
    if opset < 13:
        rows, perm = x.reshape(int(np.prod(x.shape[:a], dtype=np.int64)), -1), None
    elif a == x.ndim - 1:
        rows, perm = x.reshape(-1, x.shape[a]), None
    else:
        perm = list(range(x.ndim))
        perm[a], perm[-1] = perm[-1], perm[a]
        rows = x.transpose(perm).reshape(-1, x.shape[a])
    d = rows.shape[1]
    # FLT_MAX / D and its log in float32 (the kernel's C++ types: float / size_t, then logf).
    shift = max(0.0, float(F32.type(math.log(float(F32.type(_F32_MAX) / F32.type(d))))) - 5) / float(sx)
    # libm's exp, as onnxruntime's std::exp: NumPy's own float64 exp (SIMD, e.g. on AVX-512)
    # can differ by an ulp, enough to move a float32 entry and so an output step.
    table = np.array([math.exp((i - 255 + shift) * float(sx)) for i in range(256)], F64).astype(F32)
    inv_sy = F32.type(math.floor(F32.type(1) / sy))
    direct = perm is None and out is not None
    y = out.reshape(rows.shape) if direct else np.empty(rows.shape, dt)
    # Every step is per row: a block of rows at a time (a quarter tile: the integer steps are int64).
    step = max(1, _TILE // 4 // d)
    for r0 in range(0, rows.shape[0], step):
        r = rows[r0:r0 + step].astype(np.int32)
        e = table[r - r.max(axis=1, keepdims=True) + 255]
        total = np.add.accumulate(e, axis=1, dtype=F32)[:, -1:]  # in order, as the kernel's loop adds
        q = np.rint(e * inv_sy / total)
        y[r0:r0 + len(r)] = np.clip(q.astype(np.int64) + zy, *_qrange(dt))
    if direct:
        return out
    if perm is None:
        return y.reshape(x.shape)
    return as_out(y.reshape([x.shape[p] for p in perm]).transpose(perm), out)


@qlinear_softmax.register_decomposition
def _qlinear_softmax_decomposition(g, x, x_scale, x_zp, y_scale, y_zp, opset, axis):
    # A float softmax with the same output scale, 1 / floor(1 / y_scale): within one step
    # of the kernel's table (exp in float32 rather than a rounded table).
    a = (1 if opset < 13 else -1) if axis == _AXIS_UNSET else axis
    v = g.Cast(x, to=1)
    if opset < 13:
        shape, v, a = g.Shape(x), g.Flatten(v, axis=a), 1
    axes = g.constant([a], np.int64)
    e = g.Exp(g.Mul(g.Sub(v, g.ReduceMax(v, axes, keepdims=1)), x_scale))
    p = g.Div(e, g.ReduceSum(e, axes, keepdims=1))
    y = g.QuantizeLinear(g.Mul(p, g.Floor(g.Reciprocal(y_scale))), g.constant(1.0, np.float32), y_zp)
    return g.Reshape(y, shape) if opset < 13 else y


@qlinear_softmax.register_example
def _qlinear_softmax_example(dt):
    lo, hi = _qrange(np.dtype(dt))
    x = np.random.default_rng(0).integers(lo, hi + 1, (2, 3, 6)).astype(dt)
    return ([x, np.asarray(0.1, F32), np.asarray(lo, dt), np.asarray(1 / 256, F32), np.asarray(lo, dt)],
            {"opset": 13, "axis": -1})


# ====================================================================== MatMulIntegerToFloat, DynamicQuantizeMatMul

matmul_integer_to_float = custom_op(
    f"{MS}::MatMulIntegerToFloat(Tensor A, Tensor B, Tensor a_scale, Tensor b_scale, Tensor? a_zero_point, "
    "Tensor? b_zero_point, Tensor? bias) -> Tensor Y", dtypes=Q8)
dynamic_quantize_matmul = custom_op(
    f"{MS}::DynamicQuantizeMatMul(Tensor A, Tensor B, Tensor b_scale, Tensor? b_zero_point, Tensor? bias) -> Tensor Y",
    dtypes=[F32])


def _b_param_fits(p_shape, b_shape):
    """onnxruntime's IsBQuantParamSupported: one value, one per column of a 2-D B, or one per
    column of each matrix of B (B's shape with its second-to-last dim 1)."""
    r = len(p_shape)
    if r == 0 or p_shape == (1,):
        return True
    if r == 1 and len(b_shape) == 2:
        return p_shape[0] == b_shape[1]
    return r == len(b_shape) and r > 1 and p_shape[-2] == 1 and p_shape[:-2] == b_shape[:-2] and \
        p_shape[-1] == b_shape[-1]


def _float_output(acc, scale, bias):
    """MLAS's scale-and-bias output stage: float32(acc) · scale, then + bias."""
    y = acc.astype(F32) * scale
    if bias is not None:
        y += bias
    return y


def _matmul_to_float(aq, a_scale, a_zp, b, b_scale, b_zp, bias):
    """(A - a_zp) @ (B - b_zp) in int32, times a_scale · b_scale, plus bias, all float32,
    as onnxruntime's MatMulIntegerToFloat computes it. a_scale is one value, or one per row
    of A ([..., M, 1]), applied after the bias as onnxruntime applies it; b_scale one value,
    one per column or per column of each matrix, any other shape that broadcasts applied
    after the bias too."""
    _require(b.ndim >= 1, "B must have rank 1 or more")
    z = 0
    if a_zp is not None:
        _one_value(a_zp, "a_zero_point")
        z = int(a_zp.reshape(()))
    bz = np.zeros((), F64)
    if b_zp is not None:
        _require(_b_param_fits(b_zp.shape, b.shape),
                 lambda: f"b_zero_point {list(b_zp.shape)} must be one value, one per column of B {list(b.shape)} or "
                         "B's shape with its second-to-last dim 1")
        bz = (b_zp.reshape(()) if b_zp.size == 1 else b_zp).astype(F64)
    try:
        acc = _int_matmul(aq, z, b, bz)
    except ValueError:
        raise ValueError(f"A {list(aq.shape)} and B {list(b.shape)} do not multiply") from None
    if bias is not None:
        _require(bias.shape == (b.shape[-1],),
                 lambda: f"bias must be 1-D of B's last dim {b.shape[-1]}, got {list(bias.shape)}")
        bias = bias.astype(F32)
    a_late = not _is_one_value(a_scale)
    sa = F32.type(1) if a_late else F32.type(a_scale.reshape(()))
    if _b_param_fits(b_scale.shape, b.shape):
        bs = b_scale.astype(F32)
        y = _float_output(acc, sa * (bs.reshape(()) if bs.size == 1 else bs), bias)
    else:
        y = _float_output(acc, sa, bias)
        y = _scale_output(y, b_scale, "b_scale")
    if a_late:
        y = _scale_output(y, a_scale, "a_scale")
    return y


def _scale_output(y, scale, what):
    """onnxruntime's ScaleOutput: the output times a scale that broadcasts onto it."""
    try:
        fits = np.broadcast_shapes(scale.shape, y.shape) == y.shape
    except ValueError:
        fits = False
    _require(fits, lambda: f"{what} {list(scale.shape)} does not broadcast onto the output {list(y.shape)}")
    return y * scale.astype(F32)


def _mitf_scales(a_scale, b_scale):
    """onnxruntime's FixupScaleTensor: its fusion may have put B's per-column scale in
    a_scale's place (or A's per-row scale in b_scale's); swap them back."""
    if not _is_one_value(a_scale):
        if a_scale.ndim == 1 or a_scale.shape[-1] != 1:
            return b_scale, a_scale
    elif not _is_one_value(b_scale) and b_scale.ndim > 1 and b_scale.shape[-2] != 1:
        return b_scale, a_scale
    return a_scale, b_scale


@matmul_integer_to_float.register_meta
def _matmul_integer_to_float_meta(a, b, a_scale, b_scale, a_zp, b_zp, bias):
    _require(a.dtype in (U8, I8) and b.dtype in (U8, I8),
             lambda: f"A and B must be uint8 or int8, got {a.dtype}, {b.dtype}")
    _require(a_scale.dtype in (F32, F16) and b_scale.dtype == a_scale.dtype,
             lambda: f"a_scale and b_scale must both be float32 or both float16, got {a_scale.dtype}, {b_scale.dtype}")
    _meta_zero_point(a_zp, a.dtype, "a_zero_point")
    _require(b_zp is None or b_zp.dtype == b.dtype, lambda: f"b_zero_point must have B's type {b.dtype}")
    _require(bias is None or bias.dtype == a_scale.dtype, lambda: f"bias must have the scales' type {a_scale.dtype}")
    return Meta(a_scale.dtype, None if a.shape is None or b.shape is None else matmul_shape(a.shape, b.shape))


def _onednn_mitf_reason(ctx):
    from ..kernels.onednn.int8 import matmul_integer_to_float_reason  # (oneDNN loaded only where it runs)

    return matmul_integer_to_float_reason(ctx)


@kernel("MatMulIntegerToFloat", provider="onednn", domain=MS, dtypes=Q8, out=True, bind=True,
        accepts=_onednn_mitf_reason, name="int8")
def _matmul_integer_to_float_onednn(ctx):
    """One oneDNN int8 matmul (B constant int8, zero point 0): the exact sums, A's zero point
    compensated, scaled and biased as they are written, float32 as onnxruntime's MLAS forms
    them (kernels/onednn/int8.py)."""
    from ..kernels.onednn.int8 import matmul_integer_to_float

    return matmul_integer_to_float(ctx)


def _onednn_mitf_float_reason(ctx):
    from ..kernels.onednn.int8_float_matmul import matmul_integer_to_float_reason

    return matmul_integer_to_float_reason(ctx)


@kernel("MatMulIntegerToFloat", provider="onednn", domain=MS, dtypes=Q8, out=True, bind=True,
        accepts=_onednn_mitf_float_reason, name="float32")
def _matmul_integer_to_float_onednn_float(ctx):
    """The exact sums as a float32 oneDNN product (B centered and packed once), scaled and
    biased by its post-ops, where the CPU's 8-bit products saturate (kernels/onednn/int8_float_matmul.py)."""
    from ..kernels.onednn.int8_float_matmul import matmul_integer_to_float

    return matmul_integer_to_float(ctx)


@matmul_integer_to_float.register_kernel("cpu", out=True)
def _matmul_integer_to_float(a, b, a_scale, b_scale, a_zp=None, b_zp=None, bias=None, *, out=None):
    """Y = (A - a_zp) @ (B - b_zp) · a_scale · b_scale + bias, the integer product exact,
    the rest float32 (float16 scales: computed in float32, rounded once)."""
    _q8(a, "A"), _q8(b, "B")
    dt = a_scale.dtype
    _require(dt in (F32, F16) and b_scale.dtype == dt,
             lambda: f"a_scale and b_scale must both be float32 or both float16, got {a_scale.dtype}, {b_scale.dtype}")
    _require(a_zp is None or a_zp.dtype == a.dtype, lambda: f"a_zero_point must have A's type {a.dtype}")
    _require(b_zp is None or b_zp.dtype == b.dtype, lambda: f"b_zero_point must have B's type {b.dtype}")
    _require(bias is None or bias.dtype == dt, lambda: f"bias must have the scales' type {dt}")
    a_scale, b_scale = _mitf_scales(a_scale, b_scale)
    y = _matmul_to_float(a, a_scale, a_zp, b, b_scale, b_zp, bias)
    return y.astype(dt) if out is None else as_out(y, out, cast=True)  # float16 scales: rounded once


def _matmul_to_float_decomposition(g, a, a_scale, a_zp, b, b_scale, b_zp, bias):
    # Exact for per-tensor / per-column scales (a_scale one value): the same integer
    # product and float32 steps.
    y = g.Mul(g.Cast(g.MatMulInteger(a, b, a_zp, b_zp), to=1), g.Mul(a_scale, b_scale))
    return g.Add(y, bias) if bias else y


@matmul_integer_to_float.register_decomposition
def _matmul_integer_to_float_decomposition(g, a, b, a_scale, b_scale, a_zp, b_zp, bias):
    types = g.input_types
    if len(types) > 3 and types[2] is not None and (types[2].dtype != F32 or types[2].shape not in ((), (1,))):
        raise NotImplementedError("MatMulIntegerToFloat decomposes with a float32 per-tensor a_scale only")
    return _matmul_to_float_decomposition(g, a, a_scale, a_zp, b, b_scale, b_zp, bias)


@matmul_integer_to_float.register_example
def _matmul_integer_to_float_example(dt):
    rng = np.random.default_rng(0)
    lo, hi = _qrange(np.dtype(dt))
    return [rng.integers(lo, hi + 1, (2, 3, 5)).astype(dt), rng.integers(-128, 128, (5, 4)).astype(I8),
            np.asarray(0.02, F32), rng.uniform(0.01, 0.03, 4).astype(F32), np.asarray(lo + 100, dt),
            rng.integers(-3, 3, 4).astype(I8), rng.standard_normal(4).astype(F32)]


def _dynamic_quantize(a):
    """onnxruntime's per-tensor uint8 parameters of A (GetQuantizationParameter: the range
    widened to include 0, scale = range / 255 or 1 for an all-zero A, zero point rounded
    half to even), and A quantized with them (MlasQuantizeLinear)."""
    from ..kernels.cpu.quantize import data_range  # (NaN left out of the range, as MLAS leaves it)

    a_min, a_max = data_range(a)
    lo, hi = min(F32.type(a_min), F32.type(0)), max(F32.type(a_max), F32.type(0))
    scale = F32.type(1) if hi == lo else (hi - lo) / F32.type(255)
    with np.errstate(invalid="ignore"):
        initial = float(F32.type(0) - lo / scale)
    zp = round(max(0.0, min(255.0, initial)))  # (std::min's order: NaN, from an infinite range, gives 255)
    return _quantize(a, scale, zp, U8), np.asarray(scale, F32), zp


@dynamic_quantize_matmul.register_meta
def _dynamic_quantize_matmul_meta(a, b, b_scale, b_zp, bias):
    _require(a.dtype == F32, lambda: f"A must be float32, got {a.dtype}")
    _require(b.dtype in (U8, I8), lambda: f"B must be uint8 or int8, got {b.dtype}")
    _require(b_scale.dtype == F32, lambda: f"b_scale must be float32, got {b_scale.dtype}")
    _require(b_zp is None or b_zp.dtype == b.dtype, lambda: f"b_zero_point must have B's type {b.dtype}")
    _require(bias is None or bias.dtype == F32,
             lambda: f"bias must be float32, got {None if bias is None else bias.dtype}")
    return Meta(F32, None if a.shape is None or b.shape is None else matmul_shape(a.shape, b.shape))


@dynamic_quantize_matmul.register_kernel("cpu", out=True)
def _dynamic_quantize_matmul(a, b, b_scale, b_zp=None, bias=None, *, out=None):
    """A quantized to uint8 with parameters from its own range (as DynamicQuantizeLinear),
    then MatMulIntegerToFloat."""
    _require(a.dtype == F32, lambda: f"A must be float32, got {a.dtype}")
    _q8(b, "B")
    _require(b_scale.dtype == F32, lambda: f"b_scale must be float32, got {b_scale.dtype}")
    _require(b_zp is None or b_zp.dtype == b.dtype, lambda: f"b_zero_point must have B's type {b.dtype}")
    _require(bias is None or bias.dtype == F32,
             lambda: f"bias must be float32, got {None if bias is None else bias.dtype}")
    aq, a_scale, a_zp = _dynamic_quantize(a)
    return as_out(_matmul_to_float(aq, a_scale, np.asarray(a_zp, U8), b, b_scale, b_zp, bias), out)


@dynamic_quantize_matmul.register_decomposition
def _dynamic_quantize_matmul_decomposition(g, a, b, b_scale, b_zp, bias):
    aq, a_scale, a_zp = g.op("DynamicQuantizeLinear", a, outputs=3)
    return _matmul_to_float_decomposition(g, aq, a_scale, a_zp, b, b_scale, b_zp, bias)


@dynamic_quantize_matmul.register_example
def _dynamic_quantize_matmul_example(dt):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, 3, 5)).astype(dt), rng.integers(-128, 128, (5, 4)).astype(I8),
            rng.uniform(0.01, 0.03, 4).astype(F32), None, rng.standard_normal(4).astype(F32)]


# ====================================================================== MatMulInteger16

I16, U16 = np.dtype(np.int16), np.dtype(np.uint16)
matmul_integer16 = custom_op(f"{MS}::MatMulInteger16(Tensor A, Tensor B) -> Tensor Y", dtypes=[I16, U16])


@matmul_integer16.register_meta
def _matmul_integer16_meta(a, b):
    _require(a.dtype in (I16, U16) and b.dtype in (I16, U16),
             lambda: f"A and B must be int16 or uint16, got {a.dtype}, "
                     f"{b.dtype}")
    return Meta(I32, None if a.shape is None or b.shape is None else matmul_shape(a.shape, b.shape))


@matmul_integer16.register_kernel("cpu", out=True)
def _matmul_integer16(a, b, *, out=None):
    """Y = A @ B (numpy.matmul's broadcasting), int32: every product exact, the sum wrapping
    at 32 bits as onnxruntime's (Eigen's int32 GEMM) does. onnxruntime runs int16 x int16
    only; the schema's uint16 is taken too, and Y is int32 whatever the inputs, as
    onnxruntime's type inference makes it."""
    _require(a.dtype in (I16, U16) and b.dtype in (I16, U16),
             lambda: f"A and B must be int16 or uint16, got {a.dtype}, "
                     f"{b.dtype}")
    _require(a.ndim >= 1 and b.ndim >= 1, lambda: f"A {list(a.shape)} and B {list(b.shape)} must have rank 1 or more")
    try:
        matmul_shape(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"A {list(a.shape)} and B {list(b.shape)} do not multiply") from None
    if a.shape[-1] <= 1 << 21:  # products below 2**32, partial sums below 2**53: the float64 GEMM is exact
        acc = _int_matmul(a, 0, b, 0.0)
    else:
        acc = np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(np.int32)
    return as_out(acc, out)


@matmul_integer16.register_decomposition
def _matmul_integer16_decomposition(g, a, b):
    # Exact: int64 products and sums, then Cast wraps to int32 as the kernel's sum does.
    return g.Cast(g.MatMul(g.Cast(a, to=7), g.Cast(b, to=7)), to=6)


@matmul_integer16.register_example
def _matmul_integer16_example(dt):
    rng = np.random.default_rng(0)
    info = np.iinfo(dt)
    return [rng.integers(info.min, info.max + 1, (2, 3, 5)).astype(dt),
            rng.integers(info.min, info.max + 1, (5, 4)).astype(dt)]


# ====================================================================== QAttention

qattention = custom_op(
    f"{MS}::QAttention(Tensor input, Tensor weight, Tensor bias, Tensor input_scale, Tensor weight_scale, "
    "Tensor? mask_index, Tensor? input_zero_point, Tensor? weight_zero_point, Tensor? past, int num_heads, "
    "int unidirectional=0, float scale=0.0, float mask_filter_value=-10000.0, int do_rotary=0, "
    "int past_present_share_buffer=0) -> (Tensor output, Tensor present)", dtypes=Q8)


def _qattention_sizes(x_shape, w_shape, num_heads):
    """(hidden, head size) from weight (D, 3·hidden), D being the input's last dim."""
    _require(num_heads > 0, lambda: f"num_heads must be positive, got {num_heads}")
    _require(len(x_shape) == 3, lambda: f"input must be 3-D (batch, sequence, input hidden), got rank {len(x_shape)}")
    _require(len(w_shape) == 2, lambda: f"weight must be 2-D (input hidden, 3 x hidden), got rank {len(w_shape)}")
    d, h3 = w_shape
    _require(not (isinstance(d, int) and isinstance(x_shape[2], int) and d != x_shape[2]),
             lambda: f"weight's first dim {d} must be the input's last dim {x_shape[2]}")
    _require(h3 % 3 == 0 and (h3 // 3) % num_heads == 0,
             lambda: f"weight's second dim {h3} must be 3 x hidden with hidden divisible by num_heads={num_heads}")
    return h3 // 3, h3 // 3 // num_heads


def _per_column(p, n, what):
    """A weight scale or zero point: one value, or one per column of the weight ([n])."""
    _require(_is_one_value(p) or p.shape == (n,),
             lambda: f"{what} must be a scalar or 1-D of the weight's {n} columns, got shape {list(p.shape)}")
    return p.reshape(()) if _is_one_value(p) else p


@qattention.register_meta
def _qattention_meta(x, w, bias, x_scale, w_scale, mask_index=None, x_zp=None, w_zp=None, past=None, *, num_heads,
                     unidirectional, scale, mask_filter_value, do_rotary, past_present_share_buffer):
    from .microsoft import _attention_unsupported, _mask_rank_supported

    _attention_unsupported(do_rotary, past_present_share_buffer)
    _mask_rank_supported(mask_index)
    _require(x.dtype in (U8, I8) and w.dtype in (U8, I8),
             lambda: f"input and weight must be uint8 or int8, got {x.dtype}, "
                     f"{w.dtype}")
    dt = bias.dtype
    _require(dt in (F32, F16), lambda: f"bias must be float32 or float16, got {dt}")
    _meta_one_value(x_scale, "input_scale", [dt])
    _require(w_scale.dtype == dt, lambda: f"weight_scale must be {dt} as the bias, got {w_scale.dtype}")
    _meta_zero_point(x_zp, x.dtype, "input_zero_point")
    _require(w_zp is None or w_zp.dtype == w.dtype, lambda: f"weight_zero_point must have the weight's type {w.dtype}")
    _require(mask_index is None or mask_index.dtype == I32,
             lambda: f"mask_index must be int32, got {getattr(mask_index, 'dtype', None)}")
    _require(past is None or past.dtype == dt,
             lambda: f"past must be {dt} as the bias, got {getattr(past, 'dtype', None)}")
    if x.shape is None or w.shape is None or (len(w.shape) == 2 and not isinstance(w.shape[1], int)):
        return Meta(dt, None), Meta(dt, None)  # the sizes follow from the weight's columns
    hidden, head = _qattention_sizes(x.shape, w.shape, num_heads)
    b, s = x.shape[:2]
    total = s + past.shape[3] if past is not None and past.shape is not None else s
    return Meta(dt, (b, s, hidden)), Meta(dt, (2, b, num_heads, total, head))


@qattention.register_kernel("cpu", out=True)
def _qattention(x, w, bias, x_scale, w_scale, mask_index=None, x_zp=None, w_zp=None, past=None, *, out=None,
                num_heads, unidirectional=0, scale=0.0, mask_filter_value=-10000.0, do_rotary=0,
                past_present_share_buffer=0):
    """onnxruntime's QAttention: the Q/K/V projection as its quantized GEMM computes it —
    (input - input_zero_point) @ (weight - weight_zero_point) exact in int32, then
    float32(acc) · (weight_scale · input_scale) + bias (per-tensor or per-column scale and
    zero point), so Q, K and V are onnxruntime's to the bit — then the float attention that
    Attention runs (masks, unidirectional, past/present). float16 bias and scales run in
    float32, rounded once. onnxruntime's cpu kernel takes a uint8 input only; int8 is taken
    too (the same integer arithmetic)."""
    from .microsoft import _attention_unsupported, attend

    _attention_unsupported(do_rotary, past_present_share_buffer)
    _q8(x, "input"), _q8(w, "weight")
    hidden, _ = _qattention_sizes(x.shape, w.shape, num_heads)
    dt = bias.dtype
    _require(dt in (F32, F16), lambda: f"bias must be float32 or float16, got {dt}")
    _require(bias.shape == (3 * hidden,), lambda: f"bias must be 1-D of the weight's {3 * hidden} columns, got "
                                                  f"{list(bias.shape)}")
    _require(x_scale.dtype == dt and w_scale.dtype == dt,
             lambda: f"input_scale and weight_scale must be {dt} as the bias, got {x_scale.dtype}, {w_scale.dtype}")
    _one_value(x_scale, "input_scale")
    ws = _per_column(w_scale, 3 * hidden, "weight_scale").astype(F32)
    zx = _zero_point(x_zp, x.dtype, "input_zero_point")
    wz = np.zeros((), F64)
    if w_zp is not None:
        _require(w_zp.dtype == w.dtype,
                 lambda: f"weight_zero_point is {w_zp.dtype} but the weight is {w.dtype}: they must match")
        wz = _per_column(w_zp, 3 * hidden, "weight_zero_point").astype(F64)
    _require(mask_index is None or mask_index.dtype == I32,
             lambda: f"mask_index must be int32, got {getattr(mask_index, 'dtype', None)}")
    _require(past is None or past.dtype == dt,
             lambda: f"past must be {dt} as the bias, got {getattr(past, 'dtype', None)}")
    acc = _int_matmul(x, zx, w, wz)
    proj = acc.astype(F32) * (ws * F32.type(x_scale.reshape(())))  # MLAS: the scale, then the bias
    proj += bias.astype(F32)
    return attend(proj, hidden, hidden, dt, mask_index, past, None, out, num_heads=num_heads,
                  unidirectional=unidirectional, scale=scale, mask_filter_value=mask_filter_value)


@qattention.register_decomposition
def _qattention_decomposition(g, x, w, bias, x_scale, w_scale, mask_index=None, x_zp=None, w_zp=None, past=None, *,
                              num_heads, unidirectional, scale, mask_filter_value, do_rotary,
                              past_present_share_buffer):
    # The projection exactly as the kernel's (the same integer product and float32 steps),
    # then attention in standard ops: within float rounding of the kernel.
    from .microsoft import _attention_unsupported, attention_graph

    _attention_unsupported(do_rotary, past_present_share_buffer)
    types = g.input_types + [None] * (9 - len(g.input_types))
    shape = lambda i: types[i].shape if types[i] is not None else None  # noqa: E731
    head = None
    if shape(1) is not None and isinstance(shape(1)[1], int):
        head = shape(1)[1] // 3 // num_heads
    half = types[2] is not None and types[2].dtype == F16
    f32 = (lambda t: g.Cast(t, to=1) if half and t else t)  # noqa: E731
    proj = g.Mul(g.Cast(g.MatMulInteger(x, w, x_zp, w_zp), to=1), g.Mul(f32(w_scale), f32(x_scale)))
    proj = g.Add(proj, f32(bias))
    batch = shape(0)[0] if shape(0) is not None else None
    y, present = attention_graph(g, proj, batch, mask_index, shape(5) if mask_index else None, f32(past),
                                 num_heads=num_heads, head_size=head, unidirectional=unidirectional, scale=scale,
                                 mask_filter_value=mask_filter_value)
    return (g.Cast(y, to=10), g.Cast(present, to=10)) if half else (y, present)


@qattention.register_example
def _qattention_example(dt):
    rng = np.random.default_rng(0)
    lo, hi = _qrange(np.dtype(dt))
    b, s, d, heads, head = 2, 4, 5, 2, 3
    hidden = heads * head
    mask = np.ones((b, s), np.int32)
    mask[0, -1] = 0
    return ([rng.integers(lo, hi + 1, (b, s, d)).astype(dt), rng.integers(-64, 64, (d, 3 * hidden)).astype(I8),
             rng.standard_normal(3 * hidden).astype(F32), np.asarray(0.05, F32),
             rng.uniform(0.01, 0.03, 3 * hidden).astype(F32), mask, np.asarray(lo + 120, dt),
             rng.integers(-3, 3, 3 * hidden).astype(I8)], {"num_heads": heads, "unidirectional": 1})


# ====================================================================== DynamicQuantizeLSTM

_FLT_MAX = float(np.finfo(np.float32).max)

# The LSTM that quantize_dynamic writes for an LSTM: W and R quantized (and transposed to
# [D, input, 4H], [D, H, 4H]), X and H quantized per GEMM at run time.
dynamic_quantize_lstm = custom_op(
    f"{MS}::DynamicQuantizeLSTM(Tensor X, Tensor W, Tensor R, Tensor? B, Tensor? sequence_lens, Tensor? initial_h, "
    "Tensor? initial_c, Tensor? P, Tensor W_scale, Tensor W_zero_point, Tensor R_scale, Tensor R_zero_point, "
    "float[] activation_alpha=[], float[] activation_beta=[], str[] activations=[], "
    f"float clip={_FLT_MAX!r}, str direction='forward', int hidden_size, int input_forget=0) "
    "-> (Tensor Y, Tensor Y_h, Tensor Y_c)", dtypes=[F32])


def _expf(x):
    """expf as libm computes it (correctly rounded but for rare near-ties): in float64, rounded
    once. (NumPy's own float32 exp is a faster approximation, often an ulp off.)"""
    return np.exp(np.asarray(x, F64)).astype(F32)


def _logf(x):
    return np.log(np.asarray(x, F64)).astype(F32)


def _functor_sigmoid(x):
    """rnn_activation_functors.h's Sigmoid, in float32."""
    e = _expf(-np.abs(x))
    return np.where(x >= 0, F32.type(1) / (F32.type(1) + e), e / (F32.type(1) + e))


# onnxruntime's LSTM activations (rnn_helpers.cc): Sigmoid and Tanh are MLAS's, Relu a
# max; the others its scalar functors, in float32. name -> (f(x, alpha, beta), uses alpha,
# uses beta, default alpha, default beta): alpha and beta are taken in order from
# activation_alpha / activation_beta by the functions that use them, across directions.
_LSTM_ACTS = {
    "sigmoid": (lambda x, a, b: mlas_math.logistic(x), False, False, 0.0, 0.0),
    "tanh": (lambda x, a, b: mlas_math.tanh(x), False, False, 0.0, 0.0),
    "relu": (lambda x, a, b: np.maximum(x, F32.type(0)), False, False, 0.0, 0.0),
    "affine": (lambda x, a, b: a * x + b, True, True, 0.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), True, False, 0.01, 0.0),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, F32.type(0)), True, False, 0.0, 0.0),
    "scaledtanh": (lambda x, a, b: a * (F32.type(2) * _functor_sigmoid(F32.type(2) * (b * x)) - F32.type(1)), True,
                   True, 0.0, 0.0),
    "hardsigmoid": (lambda x, a, b: np.minimum(F32.type(1), np.maximum(F32.type(0), a * x + b)), True, True, 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * (_expf(x) - F32.type(1))), True, False, 1.0, 0.0),
    "softsign": (lambda x, a, b: x / (F32.type(1) + np.abs(x)), False, False, 0.0, 0.0),
    "softplus": (lambda x, a, b: _logf(F32.type(1) + _expf(x)), False, False, 0.0, 0.0),
}


def _lstm_directions(direction):
    d = direction.decode() if isinstance(direction, bytes) else str(direction)
    _require(d in ("forward", "reverse", "bidirectional"),
             lambda: f"direction must be forward, reverse or bidirectional, got {d!r}")
    return d, 2 if d == "bidirectional" else 1


def _lstm_activations(names, alphas, betas, num_dir):
    """[(f, g, h) per direction], each a function of x, as onnxruntime's ActivationFuncs
    parses the attributes (names in any case; 3 per direction, or none for the defaults)."""
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in (names or [])]
    names = [n.lower() for n in names] or ["sigmoid", "tanh", "tanh"] * num_dir
    _require(len(names) == 3 * num_dir, lambda: f"activations must list 3 functions per direction ({3 * num_dir}), "
                                                f"got {len(names)}")
    alphas, betas = [float(v) for v in alphas or []], [float(v) for v in betas or []]
    fns = []
    for n in names:
        _require(n in _LSTM_ACTS, lambda: f"unknown activation {n!r} (one of {', '.join(sorted(_LSTM_ACTS))})")
        fn, uses_a, uses_b, a, b = _LSTM_ACTS[n]
        if uses_a and alphas:
            a = alphas.pop(0)
        if uses_b and betas:
            b = betas.pop(0)
        fns.append(_bound_activation(fn, F32.type(a), F32.type(b), n))
    return [fns[3 * d:3 * d + 3] for d in range(num_dir)]


def _shape_of(shape):
    return None if shape is None else list(shape)


def _bound_activation(fn, a, b, kind=""):
    bound = lambda x: fn(x, a, b)  # noqa: E731
    bound.kind = kind  # (the LSTM's compiled step takes the default three by name)
    return bound


def _dims_agree(shape, want):
    """Whether a (possibly symbolic) shape can be `want` (None entries: any)."""
    return shape is None or (len(shape) == len(want) and all(
        w is None or not isinstance(s, int) or not isinstance(w, int) or s == w for s, w in zip(shape, want)))


def _lstm_shape_checks(x, w, r, b, lens, h0, c0, p, scales, num_dir, hidden):
    """The shape rules of onnxruntime's DynamicQuantizeLSTM (metas or arrays; unknown dims pass)."""
    sx = x.shape
    _require(sx is None or len(sx) == 3,
             lambda: f"X must be 3-D (seq_length, batch, input_size), got shape {_shape_of(sx)}")
    _, n, i = sx if sx is not None else (None, None, None)
    h4 = 4 * hidden
    _require(_dims_agree(w.shape, (num_dir, i, h4)),
             lambda: f"W must have shape [{num_dir}, {i}, {h4}] (directions, input_size, 4 x hidden_size), "
                     f"got {_shape_of(w.shape)}")
    _require(_dims_agree(r.shape, (num_dir, hidden, h4)),
             lambda: f"R must have shape [{num_dir}, {hidden}, {h4}] (directions, hidden_size, 4 x hidden_size), "
                     f"got {_shape_of(r.shape)}")
    for t_, want, what in ((b, (num_dir, 2 * h4), "B"), (lens, (n,), "sequence_lens"), (h0, (num_dir, n, hidden),
                           "initial_h"), (c0, (num_dir, n, hidden), "initial_c"), (p, (num_dir, 3 * hidden), "P")):
        if t_ is not None:
            _require(_dims_agree(t_.shape, want),
                     lambda: f"{what} must have shape {list(want)}, got {_shape_of(t_.shape)}")
    for t_, what in scales:
        _require(t_.shape is None or _dims_agree(t_.shape, (num_dir,)) or _dims_agree(t_.shape, (num_dir, h4)),
                 lambda: f"{what} must have shape [{num_dir}] (per tensor) or [{num_dir}, {h4}] (per channel), "
                         f"got {_shape_of(t_.shape)}")


def _lstm_param_names(w_scale, w_zp, r_scale, r_zp):
    return ((w_scale, "W_scale"), (w_zp, "W_zero_point"), (r_scale, "R_scale"), (r_zp, "R_zero_point"))


@dynamic_quantize_lstm.register_meta
def _dynamic_quantize_lstm_meta(x, w, r, b=None, lens=None, h0=None, c0=None, p=None, w_scale=None, w_zp=None,
                                r_scale=None, r_zp=None, *, activation_alpha, activation_beta, activations, clip,
                                direction, hidden_size, input_forget):
    _, num_dir = _lstm_directions(direction)
    _require(hidden_size > 0, lambda: f"hidden_size must be positive, got {hidden_size}")
    _require(clip > 0, lambda: f"clip must be positive, got {clip}")
    _lstm_activations(activations, activation_alpha, activation_beta, num_dir)
    _require(x.dtype == F32, lambda: f"X must be float32, got {x.dtype}")
    _require(w.dtype in (U8, I8) and r.dtype == w.dtype,
             lambda: f"W and R must both be uint8 or both int8, got {w.dtype}, "
                     f"{r.dtype}")
    for t_, what in ((b, "B"), (h0, "initial_h"), (c0, "initial_c"), (p, "P"), (w_scale, "W_scale"),
                     (r_scale, "R_scale")):
        _require(t_ is None or t_.dtype == F32,
                 lambda: f"{what} must be float32, got {t_.dtype if t_ is not None else None}")
    _require(lens is None or lens.dtype == I32,
             lambda: f"sequence_lens must be int32, got {getattr(lens, 'dtype', None)}")
    for z, what in ((w_zp, "W_zero_point"), (r_zp, "R_zero_point")):
        _require(z.dtype == w.dtype, lambda: f"{what} is {z.dtype} but the weights are {w.dtype}: they must match")
    _lstm_shape_checks(x, w, r, b, lens, h0, c0, p, _lstm_param_names(w_scale, w_zp, r_scale, r_zp), num_dir,
                       hidden_size)
    if x.shape is None:
        return Meta(F32, None), Meta(F32, None), Meta(F32, None)
    t, n = x.shape[:2]
    state = Meta(F32, (num_dir, n, hidden_size))
    return Meta(F32, (t, num_dir, n, hidden_size)), state, state


def _lstm_weight(q, scale, zp, d, signed, what):
    """Direction d's quantized weight as MLAS takes it: (Wq, its one zero point as float64,
    its float32 scale: one value or one per column). onnxruntime reads one zero point per
    direction: per channel, the zero points must all be one value (all zero for int8)."""
    _require(scale.dtype == F32, lambda: f"{what}_scale must be float32, got {scale.dtype}")
    _require(zp.dtype == q.dtype, lambda: f"{what}_zero_point is {zp.dtype} but {what} is {q.dtype}: they must match")
    if zp.ndim == 2:
        z = zp.reshape(-1)
        _require(not z.any() if signed else bool((z == z[0]).all()),
                 lambda: f"{what}_zero_point per channel must be "
                         f"{'all zero (int8)' if signed else 'one value (uint8)'}, got {np.unique(z).tolist()}")
    return q[d], F64.type(zp[d].reshape(-1)[0]), scale[d].reshape(-1 if scale.ndim == 2 else ()).astype(F32)


def _quantized_gemm(a, wq, wz, w_scale, accumulate=None):
    """onnxruntime's ComputeGemm for quantized weights (rnn_helpers.cc): A (M, K) float32
    quantized to uint8 with parameters from its own range (as DynamicQuantizeMatMul), the
    integer product exact, then float32(acc) · (a_scale · w_scale) — written, or added to
    `accumulate` (MLAS's output processor, unfused: one rounding for the product, one for the sum)."""
    aq, a_scale, za = _dynamic_quantize(a)
    y = _int_matmul(aq, za, wq, wz).astype(F32) * (a_scale * w_scale)
    if accumulate is not None:
        y += accumulate
    return y


def _processing_order(x, lens, reverse):
    """x (T, N, ...) in a direction's processing order: onnxruntime's ReverseSequence reads a
    reverse direction's steps back to front within each sequence; steps past a sequence's
    end stay where they are."""
    if not reverse:
        return x
    if lens is None:
        return x[::-1]
    t = np.arange(x.shape[0])[:, None]
    idx = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)
    return x[idx, np.arange(x.shape[1])[None, :]]


def _lstm_direction(x, lens, reverse, w, r, bias, peep, h0, c0, acts, clip, input_forget, want_y, r_bytes=None):
    """One direction of onnxruntime's UniDirectionalLstm<float> with quantized weights: X of
    the first max(sequence_lens) steps in one quantized GEMM; per step, H quantized on its
    own (the whole batch: onnxruntime with one intra-op thread — with more, it quantizes each
    thread's share of the batch apart) and its product added; the gates in its order of
    float32 operations. Returns Y (T, N, H) in time order (None unless wanted), the final h, c.

    r_bytes: R's bytes (H, 4H), for the compiled recurrence (every step in one call, the same
    numbers: kernels/cpu/lstm_cell.py) where the steps allow it (no sequence_lens, the
    default activations, no peepholes) and the compiled steps are taken: the result is then a
    function that runs them (without the GIL; None where h met a NaN or an infinity: the
    caller runs this again without r_bytes, whose steps report it), so that two directions
    can run side by side."""
    t_len, n = x.shape[:2]
    hidden = h0.shape[-1]
    steps = t_len if lens is None else int(lens.max())
    r_zero = r[1]
    if not isinstance(r[0], Prepared):
        r = (Centered(r[0], r[1]), None, *r[2:])  # read at every step: converted once
    xs = _processing_order(x, lens, reverse)
    xw = _quantized_gemm(xs[:steps].reshape(steps * n, -1), *w).reshape(steps, n, 4 * hidden)
    f_act, g_act, h_act = acts
    lo, hi = F32.type(-clip), F32.type(clip)

    def gate(v, b):  # clip_add_bias / clip_ignore_bias: (+ bias), then clamped to ±clip (a NaN to clip)
        if b is not None:
            v = v + b
        return np.fmax(np.fmin(v, hi), lo)

    bi, bo, bf, bc = (None,) * 4 if bias is None else bias
    # Without peepholes, i, o and f (the first three gates, side by side in the product) go
    # through their activation together: one call on 3H columns instead of three on H (the
    # same elementwise float32 steps, a third of the NumPy calls of a step).
    together = peep is None
    # the default activations in one compiled pass per step (kernels/cpu/lstm_cell.py: the same bits)
    from ..kernels.cpu import lstm_cell as cell  # (imported where an LSTM runs, not with the contrib ops)

    compiled = together and cell.available() and tuple(getattr(a, "kind", "") for a in acts) == (
        "sigmoid", "tanh", "tanh")
    b_iof = None if bias is None else np.concatenate([bi, bo, bf])
    h_state, c = h0.copy(), c0.copy()
    h_in = h0  # what the next step's GEMM reads: Y's row (0 past the end) when Y is an output, else h
    y = np.zeros((t_len, n, hidden), F32) if want_y else None
    if compiled and lens is None and r_bytes is not None:
        def recurrence():
            if cell.dq_recurrence(xw, r_bytes, int(r_zero), r[2], b_iof, bc, h_state, c, lo, hi, input_forget,
                                  y) != steps:
                return None
            return _processing_order(y, lens, True) if want_y and reverse else y, h_state, c
        return recurrence
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(steps):
            g = _quantized_gemm(h_in, *r, accumulate=xw[t])
            if compiled:
                c_new, h_new = cell.lstm_cell(g, b_iof, bc, c, lo, hi, input_forget)
            elif together:
                iof = f_act(gate(g[:, :3 * hidden], b_iof))
                i, o, f = (iof[:, k * hidden:(k + 1) * hidden] for k in range(3))
                if input_forget:
                    f = F32.type(1) - i
                cc = g_act(gate(g[:, 3 * hidden:], bc))
                c_new = c * f + i * cc
            else:
                i, o, f, cc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
                i = f_act(gate(i + c * peep[0], bi))
                f = F32.type(1) - i if input_forget else f_act(gate(f + c * peep[2], bf))
                cc = g_act(gate(cc, bc))
                c_new = c * f + i * cc
                o = f_act(gate(o + c_new * peep[1], bo))
            if not compiled:
                h_new = h_act(c_new) * o
            if lens is None:
                c, h_state = c_new, h_new
                h_out = h_new
            else:
                live = (t < lens)[:, None]
                c, h_state = np.where(live, c_new, c), np.where(live, h_new, h_state)
                h_out = np.where(live, h_new, F32.type(0))
            if want_y:
                y[t] = h_out
            h_in = h_out if want_y else h_state
    if lens is not None:
        empty = lens == 0
        h_state[empty], c[empty] = 0, 0
    if want_y and reverse:
        y = _processing_order(y, lens, True)  # the same gather puts the steps back in time order
    return y, h_state, c


def _run_directions(runs):
    """Each direction's result from _lstm_direction(..., r_bytes=): its steps' function run
    (a bidirectional node's two side by side, the second on a helper thread, where this run
    has two threads: they release the GIL and touch no thread pool), a result as it is, or
    None."""
    live = [k for k, run in enumerate(runs) if callable(run)]
    results = [None if callable(run) else run for run in runs]
    if len(live) == 2 and run_threads.count >= 2:
        other = run_threads.second_thread().submit(runs[live[1]])
        results[live[0]] = runs[live[0]]()
        results[live[1]] = other.result()
        return results
    for k in live:
        results[k] = runs[k]()
    return results


def _dynamic_quantize_lstm(ctx, prepare=None):
    """onnxruntime's DynamicQuantizeLSTM (its CPU kernel's numbers, see _lstm_direction).
    prepare(q, zp) -> int_gemm.Prepared: the constant W and R of each direction made ready
    once for another engine's products (the onednn provider's kernel), not per run."""
    a = ctx.attrs
    direction, num_dir = _lstm_directions(a.get("direction", "forward"))
    hidden = int(a["hidden_size"])
    clip = float(a.get("clip", _FLT_MAX))
    _require(hidden > 0 and clip > 0, lambda: f"hidden_size ({hidden}) and clip ({clip}) must be positive")
    acts = _lstm_activations(a.get("activations"), a.get("activation_alpha"), a.get("activation_beta"), num_dir)
    input_forget = bool(int(a.get("input_forget", 0) or 0))
    outs = list(ctx.node.outputs)
    want_y = not outs or bool(outs[0])  # called directly (glassrt check): every output

    ready = {}  # (input, direction) -> Prepared
    default_cell = all(tuple(getattr(f, "kind", "") for f in fns) == ("sigmoid", "tanh", "tanh") for fns in acts)

    def _prepared(weight, given, inputs, d):
        """A direction's (Wq, zp, scale) with Wq prepared once, where the node's weight and
        zero point are the plan's constants (the very arrays given)."""
        if prepare is None or any(ctx.const(i) is not v for i, v in zip(inputs, given)):
            return weight
        key = (inputs[0], d)
        if key not in ready:
            ready[key] = prepare(weight[0], weight[1])
        return (ready[key], *weight[1:])

    def step(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, w_scale=None, w_zp=None,
             r_scale=None, r_zp=None, *, out=(None, None, None)):
        _require(x.dtype == F32, lambda: f"X must be float32, got {x.dtype}")
        _q8(w, "W")
        _require(r.dtype == w.dtype, lambda: f"R is {r.dtype} but W is {w.dtype}: they must match")
        _lstm_shape_checks(x, w, r, b, sequence_lens, initial_h, initial_c, p,
                           _lstm_param_names(w_scale, w_zp, r_scale, r_zp), num_dir, hidden)
        for t_, what in ((b, "B"), (initial_h, "initial_h"), (initial_c, "initial_c"), (p, "P")):
            _require(t_ is None or t_.dtype == F32, lambda: f"{what} must be float32, got {getattr(t_, 'dtype', None)}")
        t_len, n = x.shape[:2]
        lens = None
        if sequence_lens is not None:
            _require(sequence_lens.dtype == I32, lambda: f"sequence_lens must be int32, got {sequence_lens.dtype}")
            lens = sequence_lens.astype(np.int64)
            _require(bool(((lens >= 0) & (lens <= t_len)).all()),
                     lambda: f"sequence_lens {lens.tolist()} must lie in [0, seq_length={t_len}]")
            if (lens == t_len).all():
                lens = None
        shape_y, shape_s = (t_len, num_dir, n, hidden), (num_dir, n, hidden)
        y = np.zeros(shape_y, F32) if want_y else None
        yh, yc = np.zeros(shape_s, F32), np.zeros(shape_s, F32)
        if lens is None or lens.max() > 0:  # all sequences empty: zeros, as onnxruntime returns early
            signed = w.dtype == I8
            _require(num_dir == 1 or (w_zp.shape == w_scale.shape and r_zp.shape == r_scale.shape),
                     lambda: "with two directions the zero points must have their scales' shapes "
                             f"(W: {list(w_zp.shape)} vs {list(w_scale.shape)}, "
                     f"R: {list(r_zp.shape)} vs {list(r_scale.shape)})")
            directions = []  # per direction: _lstm_direction's arguments, and its compiled recurrence or None
            for d in range(num_dir):
                wd = _prepared(_lstm_weight(w, w_scale, w_zp, d, signed, "W"), (w, w_zp), (1, 9), d)
                rd = _prepared(_lstm_weight(r, r_scale, r_zp, d, signed, "R"), (r, r_zp), (2, 11), d)
                bias = None
                if b is not None:  # Wb + Rb, per gate (i, o, f, c)
                    wb = b[d, :4 * hidden] + b[d, 4 * hidden:]
                    bias = [wb[k * hidden:(k + 1) * hidden] for k in range(4)]
                peep = None if p is None else [p[d, k * hidden:(k + 1) * hidden] for k in range(3)]
                h0 = np.zeros((n, hidden), F32) if initial_h is None else np.array(initial_h[d], F32)
                c0 = np.zeros((n, hidden), F32) if initial_c is None else np.array(initial_c[d], F32)
                reverse = direction == "reverse" or d == 1
                args = (x, lens, reverse, wd, rd, bias, peep, h0, c0, acts[d], clip, input_forget, want_y)
                whole = default_cell and peep is None and lens is None
                directions.append((args, _lstm_direction(*args, r_bytes=r[d]) if whole else None))
            for d, result in enumerate(_run_directions([run for _, run in directions])):
                if result is None:  # the NumPy steps (no compiled recurrence, or h met a NaN / an infinity)
                    result = _lstm_direction(*directions[d][0])
                yd, yh[d], yc[d] = result
                if want_y:
                    y[:, d] = yd
        bufs = (tuple(out) + (None,) * 3)[:3]
        return tuple(as_out(v, o) if v is not None else None for v, o in zip((y, yh, yc), bufs))

    return step


dynamic_quantize_lstm.register_kernel("cpu", _dynamic_quantize_lstm, bind=True, out=True)


def _onednn_lstm_reason(ctx):
    from ..kernels.onednn.int8 import lstm_reason  # (oneDNN loaded only where its provider runs)

    return lstm_reason(ctx)


@kernel("DynamicQuantizeLSTM", provider="onednn", domain=MS, dtypes=[F32], out=True, bind=True, multi=True,
        accepts=_onednn_lstm_reason, name="int8")
def _dynamic_quantize_lstm_onednn(ctx):
    """The cpu kernel's computation (its gates, X and H quantized as onnxruntime does), each
    product on oneDNN's exact u8 x s8 matmul, W and R reordered once a plan
    (kernels/onednn/int8.py)."""
    from ..kernels.onednn.int8 import Int8Weights

    return _dynamic_quantize_lstm(ctx, prepare=Int8Weights)


@dynamic_quantize_lstm.register_example
def _dynamic_quantize_lstm_example(dt):
    # X's first dim (the sequence, 5) is what `glassrt check` lengthens: no other input
    # starts with it.
    rng = np.random.default_rng(0)
    t, n, i, h, d = 5, 3, 4, 3, 2
    w = rng.integers(-64, 64, (d, i, 4 * h)).astype(I8)
    r = rng.integers(-64, 64, (d, h, 4 * h)).astype(I8)
    return ([rng.standard_normal((t, n, i)).astype(dt), w, r, rng.standard_normal((d, 8 * h)).astype(F32),
             np.array([5, 3, 4], np.int32), rng.standard_normal((d, n, h)).astype(F32),
             rng.standard_normal((d, n, h)).astype(F32), rng.standard_normal((d, 3 * h)).astype(F32),
             rng.uniform(0.01, 0.03, (d, 4 * h)).astype(F32), np.zeros((d, 4 * h), I8), np.full(d, 0.02, F32),
             np.zeros(d, I8)], {"hidden_size": h, "direction": "bidirectional"})
