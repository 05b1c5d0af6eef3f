"""Elementwise ops: NumPy ufuncs that write into the planned output buffer.

Most of these are in-place capable: when an input dies at this node the planner gives
the output the input's own buffer.
"""
from __future__ import annotations

import math

import numpy as np
import onnx

from ... import dtypes
from ..registry import kernel
from ._util import ALL, FLOATS, FLOATS_BF16, INTS, NUMERIC, SIGNED, as_out
from .erf import erf  # noqa: F401  (also imported from here by backward/ and contrib/)
from .erf import gelu as _gelu32
from .erf import scratch_bytes as erf_scratch_bytes

BOOL = [np.bool_]


def _unary(op, fn, types=FLOATS_BF16):
    kernel(op, dtypes=types, out=True, inplace=True, name=op.lower())(fn)


_unary("Abs", lambda x, *, out=None: np.abs(x, out=out), NUMERIC)
_unary("Neg", lambda x, *, out=None: np.negative(x, out=out), SIGNED)
_unary("Relu", lambda x, *, out=None: np.maximum(x, x.dtype.type(0), out=out), SIGNED)
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


@kernel("Sigmoid", dtypes=FLOATS_BF16, out=True, inplace=True)
def sigmoid(x, *, out=None):
    # 1 / (1 + exp(-x)) written in place; exp overflow to inf gives the right 0.
    y = np.negative(x, out=out)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    y += 1
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
    return np.logaddexp(x, x.dtype.type(0), out=out)


@kernel("Softsign", dtypes=FLOATS_BF16)
def softsign(x):
    return x / (1 + np.abs(x))


@kernel("Elu", dtypes=FLOATS_BF16)
def elu(x, *, alpha=1.0):
    return np.where(x > 0, x, (np.exp(np.minimum(x, 0)) - 1) * x.dtype.type(alpha)).astype(x.dtype)


@kernel("Selu", dtypes=FLOATS_BF16)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return (np.where(x > 0, x, alpha * (np.exp(np.minimum(x, 0)) - 1)) * gamma).astype(x.dtype)


@kernel("Celu", dtypes=FLOATS_BF16)
def celu(x, *, alpha=1.0):
    return (np.maximum(x, 0) + np.minimum(0, alpha * (np.exp(x / alpha) - 1))).astype(x.dtype)


@kernel("LeakyRelu", dtypes=FLOATS_BF16, out=True, inplace=True)
def leaky_relu(x, *, out=None, alpha=0.01):
    y = np.multiply(x, x.dtype.type(alpha), out=None)
    return np.maximum(x, y, out=out) if alpha <= 1 else np.minimum(x, y, out=out)


@kernel("ThresholdedRelu", dtypes=FLOATS_BF16)
def thresholded_relu(x, *, alpha=1.0):
    return np.where(x > alpha, x, 0).astype(x.dtype)


@kernel("HardSigmoid", dtypes=FLOATS_BF16)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1).astype(x.dtype)


@kernel("HardSwish", dtypes=FLOATS_BF16)
def hard_swish(x):
    return (x * np.clip(x * x.dtype.type(1 / 6) + x.dtype.type(0.5), 0, 1)).astype(x.dtype)


@kernel("Mish", dtypes=FLOATS_BF16)
def mish(x):
    return (x * np.tanh(np.logaddexp(x, 0))).astype(x.dtype)


@kernel("Gelu", dtypes=FLOATS_BF16, out=True, inplace=True, bind=True, workspace=_float32_scratch)
def gelu(ctx):
    approximate = ctx.attrs.get("approximate", "none")
    ws = ctx.workspace

    def step(x, *, out=None):
        if approximate != "tanh" and x.dtype == np.float32:
            return _gelu32(x, out, ws)  # one compiled pass, rounded as onnxruntime's float32 Gelu
        xf = x.astype(np.float64) if x.dtype != np.float64 else x
        if approximate == "tanh":
            y = 0.5 * xf * (1 + np.tanh(np.sqrt(2 / np.pi) * (xf + 0.044715 * xf ** 3)))
        else:
            y = 0.5 * xf * (1 + erf(xf / np.sqrt(2)))
        return as_out(y.astype(x.dtype), out)

    return step


@kernel("Swish", dtypes=FLOATS_BF16)
def swish(x, *, alpha=1.0):
    return (x / (1 + np.exp(-x.dtype.type(alpha) * x))).astype(x.dtype)


@kernel("Shrink", dtypes=NUMERIC)
def shrink(x, *, bias=0.0, lambd=0.5):
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)).astype(x.dtype)


@kernel(["IsNaN"], dtypes=FLOATS_BF16 | dtypes.FLOAT8)
def isnan(x):
    return np.isnan(x.astype(np.float32) if x.dtype.kind == "V" or x.dtype.itemsize == 1 else x)


@kernel("IsInf", dtypes=FLOATS_BF16 | dtypes.FLOAT8)
def isinf(x, *, detect_negative=1, detect_positive=1):
    xf = x.astype(np.float32) if x.dtype.itemsize == 1 else x
    return (np.isposinf(xf) & bool(detect_positive)) | (np.isneginf(xf) & bool(detect_negative))


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


@kernel("Clip", dtypes=FLOATS, versions=(1, 10), name="clip_attrs")
def clip_v6(x, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):
    return np.clip(x, min, max).astype(x.dtype)


# ---------------------------------------------------------------- binary


def _binary(op, fn, types=NUMERIC, inplace=True):
    kernel(op, dtypes=types, out=True, inplace=inplace, name=op.lower())(fn)


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


@kernel("Equal", dtypes=[object], name="equal_strings")
def equal_strings(a, b):
    return np.asarray(a == b, dtype=bool)


@kernel("Div", dtypes=NUMERIC, out=True, inplace=True)
def div(a, b, *, out=None):
    if a.dtype.kind in "iu":
        # ONNX integer division truncates toward zero (C semantics), NumPy's floors.
        q = np.floor_divide(a, b, out=out)
        if a.dtype.kind == "i":
            fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
            q += fix.astype(q.dtype)
        return q
    return np.divide(a, b, out=out)


@kernel("Mod", dtypes=NUMERIC)
def mod(a, b, *, fmod=0):
    # fmod=0: the result takes the divisor's sign (Python %); fmod=1: the dividend's (C fmod).
    return np.fmod(a, b) if fmod else np.mod(a, b)


@kernel("Pow", dtypes=NUMERIC)
def pow_(a, b):
    if a.dtype.kind in "iu":
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    return np.power(a, b.astype(a.dtype) if b.dtype != a.dtype else b)


@kernel("BitShift", dtypes=INTS)
def bit_shift(a, b, *, direction):
    return np.left_shift(a, b) if direction == "LEFT" else np.right_shift(a, b)


@kernel("PRelu", dtypes=NUMERIC, out=True)
def prelu(x, slope, *, out=None):
    return np.where(x < 0, x * slope, x, out=None) if out is None else _copy(np.where(x < 0, x * slope, x), out)


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
    kernel(op, dtypes=types, out=True, name=op.lower())(fn)


_variadic("Sum", np.add)
_variadic("Max", np.maximum)
_variadic("Min", np.minimum)


@kernel("Mean", dtypes=FLOATS_BF16)
def mean(*xs):
    y = xs[0].astype(np.float64) if len(xs) == 1 else xs[0] + xs[1]
    for x in xs[2:]:
        y = y + x
    return (y / len(xs)).astype(xs[0].dtype)


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
    T = onnx.TensorProto
    if et in (T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ) and saturate:
        return onnx.numpy_helper.saturate_cast(x, to)
    if et == getattr(T, "FLOAT8E8M0", -1):
        return onnx.numpy_helper.to_float8e8m0(x, saturate, round_mode).astype(to)
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(to)


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


@kernel("Cast", dtypes=ALL)
def cast(x, *, to, saturate=1, round_mode="up"):
    return cast_array(x, dtypes.np_dtype(to), saturate, round_mode)


@kernel("CastLike", dtypes=ALL)
def cast_like(x, like, *, saturate=1, round_mode="up"):
    return cast_array(x, like.dtype, saturate, round_mode)


# ---------------------------------------------------------------- opsets 1-6


def _legacy(op, fn, types):
    """Opsets 1-6 broadcast B against A from `axis` when broadcast=1 (ONNX's old rule)."""

    def build(ctx):
        from ...ops.meta.elementwise import legacy_b_shape

        on, axis = int(ctx.attrs.get("broadcast", 0)), ctx.attrs.get("axis")

        def step(a, b):
            return fn(a, b.reshape(legacy_b_shape(a.ndim, b.shape, axis)) if on else b)

        return step

    kernel(op, dtypes=types, versions=(1, 6), bind=True, priority=10, name="legacy_broadcast")(build)


for _op, _fn, _types in [("Add", np.add, NUMERIC), ("Sub", np.subtract, NUMERIC), ("Mul", np.multiply, NUMERIC),
                         ("Div", lambda a, b: div(a, b), NUMERIC), ("Pow", lambda a, b: pow_(a, b), NUMERIC),
                         ("And", np.logical_and, BOOL), ("Or", np.logical_or, BOOL), ("Xor", np.logical_xor, BOOL),
                         ("Equal", np.equal, NUMERIC | set(BOOL)), ("Greater", np.greater, NUMERIC),
                         ("Less", np.less, NUMERIC)]:
    _legacy(_op, _fn, _types)
