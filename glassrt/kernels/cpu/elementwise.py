"""Elementwise ops: NumPy ufuncs that write into the planned output buffer.

Most of these are in-place capable: when an input dies at this node the planner gives
the output the input's own buffer. Ops that are a composition of several ufuncs run
their expression tile by tile into the buffer (`write_elementwise`): the temporaries are a
tile in size and every element gets the same operations, so the same bits.
"""
from __future__ import annotations

import math

import numpy as np

from ... import dtypes
from ...proto import TensorProto
from ..buffers import NHWC
from ..registry import kernel
from ._util import ALL, FLOATS, FLOATS_BF16, INTS, NUMERIC, SIGNED, as_out, hard_sigmoid_of, write_elementwise
from .erf import erf  # noqa: F401  (also imported from here by backward/ and contrib/)
from .erf import gelu as _gelu32
from .erf import scratch_bytes as erf_scratch_bytes

BOOL = [np.bool_]


_SCALARS: dict = {}


def _scalar(dt: np.dtype, v: int) -> np.ndarray:
    """v as a 0-d array of dtype dt, made once: a ufunc converts a Python or NumPy scalar
    operand on every call (np.maximum(x, x.dtype.type(0)) 1.55 us on 128 floats, against
    0.69 with a 0-d array: a small model's Relu)."""
    a = _SCALARS.get((dt, v))
    if a is None:
        a = _SCALARS[(dt, v)] = np.full((), v, dt)
    return a


# NumPy's ufuncs read and write channels-last views as they do plain arrays: these kernels
# follow the layout of the region they are in (runtime/layout.py)
FOLLOWS = {"layouts": (NHWC,), "follows_layout": True}


def _unary(op, fn, types=FLOATS_BF16):
    kernel(op, dtypes=types, out=True, inplace=True, name=op.lower(), **FOLLOWS)(fn)


_unary("Abs", lambda x, *, out=None: np.abs(x, out=out), NUMERIC)
_unary("Neg", lambda x, *, out=None: np.negative(x, out=out), SIGNED)
_unary("Relu", lambda x, *, out=None: np.maximum(x, _scalar(x.dtype, 0), out=out), SIGNED)
_unary("Tanh", lambda x, *, out=None: np.tanh(x, out=out))
_unary("Exp", lambda x, *, out=None: np.exp(x, out=out))
_unary("Log", lambda x, *, out=None: np.log(x, out=out))
_unary("Sqrt", lambda x, *, out=None: np.sqrt(x, out=out))
_unary("Reciprocal", lambda x, *, out=None: np.reciprocal(x, out=out))
_unary("Floor", lambda x, *, out=None: np.floor(x, out=out))
_unary("Ceil", lambda x, *, out=None: np.ceil(x, out=out))
_unary("Round", lambda x, *, out=None: np.round(x, out=out))  # half to even, as ONNX says
_unary("Sign", lambda x, *, out=None: np.sign(x, out=out), NUMERIC)
for _name, _fn in [("Sin", np.sin), ("Cos", np.cos), ("Tan", np.tan), ("Asin", np.arcsin), ("Acos", np.arccos),
                   ("Atan", np.arctan), ("Sinh", np.sinh), ("Cosh", np.cosh), ("Asinh", np.arcsinh),
                   ("Acosh", np.arccosh), ("Atanh", np.arctanh)]:
    _unary(_name, (lambda f: lambda x, *, out=None: f(x, out=out))(_fn))
_unary("Not", lambda x, *, out=None: np.logical_not(x, out=out), BOOL)
_unary("BitwiseNot", lambda x, *, out=None: np.invert(x, out=out), INTS)


@kernel("Sigmoid", dtypes=FLOATS_BF16, out=True, inplace=True, **FOLLOWS)
def sigmoid(x, *, out=None):
    # 1 / (1 + exp(-x)) written in place; exp overflow to inf gives the right 0.
    y = np.negative(x, out=out)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    np.add(y, _scalar(y.dtype, 1), out=y)
    return np.reciprocal(y, out=y)


def _float32_scratch(ctx):
    """The float32 erf/GELU passes keep exp's argument in scratch the size of the input."""
    shape = ctx.shape(0)
    return erf_scratch_bytes(shape) if ctx.dtype(0) == np.float32 and shape is not None else 0


@kernel("Erf", dtypes=FLOATS_BF16, out=True, inplace=True, bind=True, workspace=_float32_scratch)
def erf_kernel(ctx):
    ws = ctx.workspace

    def step(x, *, out=None):
        return erf(x, out, ws)

    return step


@kernel("Softplus", dtypes=FLOATS_BF16, out=True, inplace=True)
def softplus(x, *, out=None):
    return np.logaddexp(x, _scalar(x.dtype, 0), out=out)


# Tile-wise expressions (`write_elementwise`): in place is safe, since a tile of the
# output depends only on the same tile of the input.


@kernel("Softsign", dtypes=FLOATS_BF16, out=True, inplace=True)
def softsign(x, *, out=None):
    return write_elementwise(out, lambda v: v / (1 + np.abs(v)), x)


@kernel("Elu", dtypes=FLOATS_BF16, out=True, inplace=True)
def elu(x, *, out=None, alpha=1.0):
    a = x.dtype.type(alpha)
    return write_elementwise(out, lambda v: np.where(v > 0, v, (np.exp(np.minimum(v, 0)) - 1) * a).astype(v.dtype), x)


@kernel("Selu", dtypes=FLOATS_BF16, out=True, inplace=True)
def selu(x, *, out=None, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return write_elementwise(
        out, lambda v: (np.where(v > 0, v, alpha * (np.exp(np.minimum(v, 0)) - 1)) * gamma).astype(v.dtype), x)


@kernel("Celu", dtypes=FLOATS_BF16, out=True, inplace=True)
def celu(x, *, out=None, alpha=1.0):
    return write_elementwise(
        out, lambda v: (np.maximum(v, 0) + np.minimum(0, alpha * (np.exp(v / alpha) - 1))).astype(v.dtype), x)


@kernel("LeakyRelu", dtypes=FLOATS_BF16, out=True, inplace=True)
def leaky_relu(x, *, out=None, alpha=0.01):
    a = x.dtype.type(alpha)
    pick = np.maximum if alpha <= 1 else np.minimum
    return write_elementwise(out, lambda v: pick(v, np.multiply(v, a)), x)


@kernel("ThresholdedRelu", dtypes=FLOATS_BF16, out=True, inplace=True)
def thresholded_relu(x, *, out=None, alpha=1.0):
    return write_elementwise(out, lambda v: np.where(v > alpha, v, 0).astype(v.dtype), x)


@kernel("HardSigmoid", dtypes=FLOATS_BF16, out=True, inplace=True)
def hard_sigmoid(x, *, out=None, alpha=0.2, beta=0.5):
    return write_elementwise(out, lambda v: hard_sigmoid_of(v, alpha, beta), x)


@kernel("HardSwish", dtypes=FLOATS_BF16, out=True, inplace=True)
def hard_swish(x, *, out=None):
    return write_elementwise(out, lambda v: v * hard_sigmoid_of(v, 1 / 6, 0.5), x)


@kernel("Mish", dtypes=FLOATS_BF16, out=True, inplace=True)
def mish(x, *, out=None):
    return write_elementwise(out, lambda v: (v * np.tanh(np.logaddexp(v, 0))).astype(v.dtype), x)


@kernel("Gelu", dtypes=FLOATS_BF16, out=True, inplace=True, bind=True, workspace=_float32_scratch)
def gelu(ctx):
    approximate = ctx.attrs.get("approximate", "none")
    ws = ctx.workspace

    def step(x, *, out=None):
        if approximate != "tanh" and x.dtype == np.float32:
            return _gelu32(x, out, ws)  # one compiled pass, rounded as onnxruntime's float32 Gelu
        return write_elementwise(out, _gelu_tanh if approximate == "tanh" else _gelu_float64, x)

    return step


def _gelu_tanh(x):
    xf = x.astype(np.float64) if x.dtype != np.float64 else x
    return (0.5 * xf * (1 + np.tanh(np.sqrt(2 / np.pi) * (xf + 0.044715 * xf ** 3)))).astype(x.dtype)


def _gelu_float64(x):
    """Exact GELU computed in float64 (the types without a compiled float32 pass)."""
    xf = x.astype(np.float64) if x.dtype != np.float64 else x
    return (0.5 * xf * (1 + erf(xf / np.sqrt(2)))).astype(x.dtype)


@kernel("Swish", dtypes=FLOATS_BF16, out=True, inplace=True)
def swish(x, *, out=None, alpha=1.0):
    a = x.dtype.type(alpha)
    return write_elementwise(out, lambda v: (v / (1 + np.exp(-a * v))).astype(v.dtype), x)


@kernel("Shrink", dtypes=NUMERIC, out=True, inplace=True)
def shrink(x, *, out=None, bias=0.0, lambd=0.5):
    return write_elementwise(
        out, lambda v: np.where(v < -lambd, v + bias, np.where(v > lambd, v - bias, 0)).astype(v.dtype), x)


def _isnan(x):
    return np.isnan(x.astype(np.float32) if x.dtype.kind == "V" or x.dtype.itemsize == 1 else x)


@kernel(["IsNaN"], dtypes=FLOATS_BF16 | dtypes.FLOAT8, out=True)
def isnan(x, *, out=None):
    return write_elementwise(out, _isnan, x)


@kernel("IsInf", dtypes=FLOATS_BF16 | dtypes.FLOAT8, out=True)
def isinf(x, *, out=None, detect_negative=1, detect_positive=1):
    def fn(v):
        vf = v.astype(np.float32) if v.dtype.itemsize == 1 else v
        return (np.isposinf(vf) & bool(detect_positive)) | (np.isneginf(vf) & bool(detect_negative))

    return write_elementwise(out, fn, x)


@kernel("Clip", dtypes=NUMERIC, out=True, inplace=True, versions=(11, None))
def clip(x, lo=None, hi=None, *, out=None):
    if lo is None and hi is None:
        if out is None:
            return x.copy()
        np.copyto(out, x)
        return out
    lo = None if lo is None else lo.reshape(()).item() if lo.size == 1 else lo
    hi = None if hi is None else hi.reshape(()).item() if hi.size == 1 else hi
    y = np.maximum(x, x.dtype.type(lo), out=out) if lo is not None else (x.copy() if out is None else _copy(x, out))
    if hi is not None:
        np.minimum(y, x.dtype.type(hi), out=y)
    return y


def _copy(x, out):
    np.copyto(out, x)
    return out


@kernel("Clip", dtypes=FLOATS, versions=(1, 10), out=True, inplace=True, name="clip_attrs")
def clip_v6(x, *, out=None, min=-3.4028234663852886e38, max=3.4028234663852886e38):
    return write_elementwise(out, lambda v: np.clip(v, min, max).astype(v.dtype), x)


# ---------------------------------------------------------------- binary


def _binary(op, fn, types=NUMERIC, inplace=True):
    kernel(op, dtypes=types, out=True, inplace=inplace, name=op.lower(), **FOLLOWS)(fn)


_binary("Add", lambda a, b, *, out=None: np.add(a, b, out=out))
_binary("Sub", lambda a, b, *, out=None: np.subtract(a, b, out=out))
_binary("Mul", lambda a, b, *, out=None: np.multiply(a, b, out=out))
_binary("And", lambda a, b, *, out=None: np.logical_and(a, b, out=out), BOOL)
_binary("Or", lambda a, b, *, out=None: np.logical_or(a, b, out=out), BOOL)
_binary("Xor", lambda a, b, *, out=None: np.logical_xor(a, b, out=out), BOOL)
_binary("BitwiseAnd", lambda a, b, *, out=None: np.bitwise_and(a, b, out=out), INTS)
_binary("BitwiseOr", lambda a, b, *, out=None: np.bitwise_or(a, b, out=out), INTS)
_binary("BitwiseXor", lambda a, b, *, out=None: np.bitwise_xor(a, b, out=out), INTS)
for _name, _fn in [("Equal", np.equal), ("Less", np.less), ("Greater", np.greater),
                   ("LessOrEqual", np.less_equal), ("GreaterOrEqual", np.greater_equal)]:
    _binary(_name, (lambda f: lambda a, b, *, out=None: f(a, b, out=out))(_fn), NUMERIC | set(BOOL), inplace=False)


@kernel("Equal", dtypes=[object], out=True, name="equal_strings")
def equal_strings(a, b, *, out=None):
    return write_elementwise(out, lambda u, v: np.asarray(u == v, dtype=bool), a, b)


@kernel("Div", dtypes=NUMERIC, out=True, inplace=True, **FOLLOWS)
def div(a, b, *, out=None):
    if a.dtype.kind in "iu":
        _no_zero_divisor(b, "division")
        # Tile by tile: the remainder reads `a` after the quotient is formed, and in place
        # the quotient's buffer is a's.
        return write_elementwise(out, _int_div, a, b)
    return np.divide(a, b, out=out)


def _no_zero_divisor(b, what: str) -> None:
    """Integer division by zero has no value (NumPy gives 0 and a warning; onnxruntime fails)."""
    if not np.all(b):
        raise ValueError(f"integer {what} by zero: B holds {np.size(b) - np.count_nonzero(b)} zero(s)")


def _int_div(a, b):
    """ONNX integer division truncates toward zero (C semantics), NumPy's floors."""
    q = np.floor_divide(a, b)
    if a.dtype.kind == "i":
        fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        q += fix.astype(q.dtype)
    return q


@kernel("Mod", dtypes=NUMERIC, out=True, inplace=True)
def mod(a, b, *, out=None, fmod=0):
    # fmod=0: the result takes the divisor's sign (Python %); fmod=1: the dividend's (C fmod).
    if a.dtype.kind in "iu":
        _no_zero_divisor(b, "modulo")
    return write_elementwise(out, np.fmod if fmod else np.mod, a, b)


def _pow(a, b):
    if a.dtype.kind in "iu":
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    return np.power(a, b.astype(a.dtype) if b.dtype != a.dtype else b)


@kernel("Pow", dtypes=NUMERIC, out=True, inplace=True)
def pow_(a, b, *, out=None):
    if out is not None and a.dtype.kind == "f" and b.size == 1 and out.shape == a.shape and out.dtype == a.dtype:
        # x**2 and x**3 (GELU's tanh form) as products, as onnxruntime computes them: a tenth
        # of np.power's time.
        e = float(b.reshape(-1)[0])
        if e == 2.0:
            return np.multiply(a, a, out=out)
        if e == 3.0 and out is not a:
            np.multiply(a, a, out=out)
            return np.multiply(out, a, out=out)
    return write_elementwise(out, _pow, a, b)


@kernel("BitShift", dtypes=INTS, out=True, inplace=True)
def bit_shift(a, b, *, out=None, direction):
    return write_elementwise(out, np.left_shift if direction == "LEFT" else np.right_shift, a, b)


@kernel("PRelu", dtypes=NUMERIC, out=True, inplace=True)
def prelu(x, slope, *, out=None):
    # A slope of a wider type computes wide and rounds to x's type, as NumPy casts into out.
    return write_elementwise(out, lambda v, s: np.where(v < 0, v * s, v).astype(v.dtype, copy=False), x, slope)


@kernel("PRelu", dtypes=NUMERIC, out=True, inplace=True, versions=(1, 6), priority=10, name="prelu_per_channel")
def prelu_per_channel(x, slope, *, out=None):
    """Opsets 1-6: a 1-D slope [C] is one value per channel (axis 1)."""
    from ...ops.meta.elementwise import legacy_slope_shape

    return prelu(x, slope.reshape(legacy_slope_shape(x.ndim, slope.shape)), out=out)


@kernel("Where", dtypes=[np.bool_], out=True)
def where(c, x, y, *, out=None):
    if out is None:
        return np.where(c, x, y)
    np.copyto(out, y)
    np.copyto(out, x, where=np.broadcast_to(c, out.shape))
    return out


def _variadic(op, ufunc, types=NUMERIC):
    def fn(*xs, out=None):
        if len(xs) == 1:
            return _copy(xs[0], out) if out is not None else xs[0].copy()
        y = ufunc(xs[0], xs[1], out=out)
        for x in xs[2:]:
            y = ufunc(y, x, out=None if y.shape != np.broadcast_shapes(y.shape, x.shape) else y)
        return y
    kernel(op, dtypes=types, out=True, name=op.lower(), **FOLLOWS)(fn)


_variadic("Sum", np.add)
_variadic("Max", np.maximum)
_variadic("Min", np.minimum)


def _mean(*xs):
    y = xs[0].astype(np.float64) if len(xs) == 1 else xs[0] + xs[1]
    for x in xs[2:]:
        y = y + x
    return (y / len(xs)).astype(xs[0].dtype)


@kernel("Mean", dtypes=FLOATS_BF16, out=True)
def mean(*xs, out=None):
    return write_elementwise(out, _mean, *xs)


# ---------------------------------------------------------------- casts


def cast_array(x, to_dtype, saturate=1, round_mode="up"):
    to = np.dtype(to_dtype)
    if to == object:
        if x.dtype == object:
            return x.copy()
        if x.dtype.kind == "f":
            return np.array([_float_str(v) for v in x.reshape(-1)], dtype=object).reshape(x.shape)
        return x.astype(np.str_).astype(object)
    if x.dtype == object:
        return np.array([_parse_str(v, to) for v in x.reshape(-1)], dtype=to).reshape(x.shape)
    et = dtypes.elem_type(to)
    T = TensorProto
    if et in (T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ) and saturate:
        from onnx import numpy_helper

        return numpy_helper.saturate_cast(x, to)
    if et == getattr(T, "FLOAT8E8M0", -1):
        from onnx import numpy_helper

        return numpy_helper.to_float8e8m0(x, saturate, round_mode).astype(to)
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(to)


def _numpy_cast(x_dtype, to, saturate) -> bool:
    """The cast is NumPy's own conversion (what cast_array's last line does)."""
    if x_dtype == object or to == object:
        return False
    T = TensorProto
    et = dtypes.elem_type(to)
    saturating = et in (T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ) and saturate
    return not saturating and et != getattr(T, "FLOAT8E8M0", -1)


def cast_into(x, to_dtype, saturate, round_mode, out):
    """cast_array(x, ...) written into `out`: NumPy's conversion straight into the buffer,
    the float8 rules tile by tile; strings (never planned) as computed."""
    to = np.dtype(to_dtype)
    if out is None or x.dtype == object or to == object:
        return as_out(cast_array(x, to, saturate, round_mode), out)
    if _numpy_cast(x.dtype, to, saturate):
        with np.errstate(invalid="ignore", over="ignore"):
            np.copyto(out, x, casting="unsafe")
        return out
    return write_elementwise(out, lambda v: cast_array(v, to, saturate, round_mode), x)


def _float_str(v):
    f = float(v)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "INF" if f > 0 else "-INF"
    return str(np.float32(f)) if isinstance(v, np.float32) else repr(f) if isinstance(v, float) else str(v)


def _parse_str(s, to):
    s = s.decode() if isinstance(s, bytes) else str(s)
    if to.kind == "b":
        return s.strip().lower() not in ("", "0", "false")
    return float(s) if to.kind == "f" or to.kind == "V" else int(float(s)) if "." in s or "e" in s.lower() else int(s)


def _cannot_warn(src: np.dtype, to: np.dtype) -> bool:
    """Whether NumPy's conversion src -> to never warns (no NaN to an integer, no overflow to
    a narrower float), so that it needs no errstate (~1 us, a fifth of a small Cast)."""
    if src == to or to.kind == "b" or src.kind == "b":
        return True
    if src.kind in "iu":
        return to.kind in "iu" or (to.kind == "f" and to.itemsize >= 4)
    return src.kind == "f" and to.kind == "f" and to.itemsize >= src.itemsize


def _cast_step(src, to, saturate, round_mode):
    """A Cast from dtype src (None: not known at binding) to `to`: NumPy's conversion straight
    into the buffer where it cannot warn, else cast_into's whole rule."""
    quiet = src is not None and _numpy_cast(src, to, saturate) and _cannot_warn(src, to)

    def step(x, *_, out=None):
        if quiet and out is not None and x.dtype == src:
            np.copyto(out, x, casting="unsafe")
            return out
        return cast_into(x, to, saturate, round_mode, out)

    return step


@kernel("Cast", dtypes=ALL, out=True, bind=True, any_shape=True, blas=False)
def cast(ctx):
    return _cast_step(ctx.dtype(0), np.dtype(dtypes.np_dtype(ctx.attrs["to"])), ctx.attrs.get("saturate", 1),
                      ctx.attrs.get("round_mode", "up"))


@kernel("CastLike", dtypes=ALL, out=True, bind=True, any_shape=True, blas=False)
def cast_like(ctx):
    to = ctx.dtype(1)
    saturate, round_mode = ctx.attrs.get("saturate", 1), ctx.attrs.get("round_mode", "up")
    if to is None:  # (the target's type unknown at binding: read from the input each run)
        return lambda x, like, *, out=None: cast_into(x, like.dtype, saturate, round_mode, out)
    return _cast_step(ctx.dtype(0), np.dtype(to), saturate, round_mode)


# ---------------------------------------------------------------- opsets 1-6


def _legacy(op, fn, types):
    """Opsets 1-6 broadcast B against A from `axis` when broadcast=1 (ONNX's old rule)."""

    def build(ctx):
        from ...ops.meta.elementwise import legacy_b_shape

        on, axis = int(ctx.attrs.get("broadcast", 0)), ctx.attrs.get("axis")

        def step(a, b, *, out=None):
            return write_elementwise(out, fn, a, b.reshape(legacy_b_shape(a.ndim, b.shape, axis)) if on else b)

        return step

    kernel(op, dtypes=types, versions=(1, 6), bind=True, out=True, priority=10, name="legacy_broadcast")(build)


for _op, _fn, _types in [("Add", np.add, NUMERIC), ("Sub", np.subtract, NUMERIC), ("Mul", np.multiply, NUMERIC),
                         ("Div", lambda a, b: div(a, b), NUMERIC), ("Pow", lambda a, b: pow_(a, b), NUMERIC),
                         ("And", np.logical_and, BOOL), ("Or", np.logical_or, BOOL), ("Xor", np.logical_xor, BOOL),
                         ("Equal", np.equal, NUMERIC | set(BOOL)), ("Greater", np.greater, NUMERIC),
                         ("Less", np.less, NUMERIC)]:
    _legacy(_op, _fn, _types)
