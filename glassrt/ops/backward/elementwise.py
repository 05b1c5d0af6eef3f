"""Backward of elementwise arithmetic and activations.

Conventions at kinks (where the derivative is not defined), chosen like PyTorch:
  * Relu, Abs, Softsign-like sign terms: the derivative at 0 is 0 (Abs) / taken from x > 0 (Relu);
  * Max/Min (variadic) and ReduceMax/Min: a tie splits the gradient evenly among the tied
    inputs (PyTorch's torch.maximum/amax do the same), so the sum of the pieces is gy;
  * Clip: the gradient passes where min <= x <= max (boundaries included).
Integer (and bool) tensors get no gradient: None.
"""
from __future__ import annotations

import math

import numpy as np

from . import backward, unbroadcast


def _is_float(x):
    return x is not None and x.dtype.kind in "fc"


def _ufloat(g, x):
    """`g` reduced to x's shape and cast to x's dtype, or None when x is not a float tensor."""
    if not _is_float(x):
        return None
    return unbroadcast(g, x.shape).astype(x.dtype, copy=False)


# ---------------------------------------------------------------- binary arithmetic


@backward("Add")
def add(ctx, gy):
    a, b = ctx.inputs
    return [_ufloat(gy, a), _ufloat(gy, b)]


@backward("Sub")
def sub(ctx, gy):
    a, b = ctx.inputs
    return [_ufloat(gy, a), _ufloat(-gy, b)]


@backward("Mul")
def mul(ctx, gy):
    a, b = ctx.inputs
    return [_ufloat(gy * b, a), _ufloat(gy * a, b)]


@backward("Div")
def div(ctx, gy):
    a, b = ctx.inputs
    if not _is_float(a):  # integer division truncates: piecewise constant
        return [None, None]
    ga = gy / b
    # d(a/b)/db = -a/b^2, written with the quotient so it costs one multiply.
    gb = -ga * (a / b)
    return [_ufloat(ga, a), _ufloat(gb, b)]


@backward("Pow")
def pow_(ctx, gy):
    a, b = ctx.inputs
    (y,) = ctx.outputs
    if not _is_float(a):
        return [None, None]
    bf = b.astype(a.dtype, copy=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        # b * a^(b-1); where b == 0 the power is constant 1 (PyTorch's mask), avoiding 0 * inf at a = 0.
        da = np.where(bf == 0, 0, bf * np.power(a, bf - 1))
        ga = gy * da
        gb = None
        if _is_float(b):
            # y * log(a): 0 at a == 0 (the limit for b > 0, as PyTorch does); NaN for a < 0,
            # where a^b is real only at integer b and not differentiable in b.
            db = np.where(a == 0, 0, y * np.log(np.where(a == 0, 1, a)))
            gb = _ufloat(gy * db, b)
    return [_ufloat(ga, a), gb]


# ---------------------------------------------------------------- unary arithmetic


@backward("Neg")
def neg(ctx, gy):
    (x,) = ctx.inputs
    return [-gy if _is_float(x) else None]


@backward("Abs")
def abs_(ctx, gy):
    (x,) = ctx.inputs
    return [gy * np.sign(x) if _is_float(x) else None]  # sign(0) = 0: the subgradient PyTorch picks


@backward("Sqrt")
def sqrt(ctx, gy):
    (y,) = ctx.outputs
    with np.errstate(divide="ignore"):
        return [gy / (2 * y)]


@backward("Exp")
def exp(ctx, gy):
    (y,) = ctx.outputs
    return [gy * y]


@backward("Log")
def log(ctx, gy):
    (x,) = ctx.inputs
    with np.errstate(divide="ignore"):
        return [gy / x]


@backward("Reciprocal")
def reciprocal(ctx, gy):
    (y,) = ctx.outputs
    return [-gy * y * y]  # d(1/x)/dx = -1/x^2 = -y^2


# ---------------------------------------------------------------- variadic


@backward("Sum")
def sum_(ctx, gy):
    return [_ufloat(gy, x) for x in ctx.inputs]


@backward("Mean")
def mean(ctx, gy):
    g = gy / len(ctx.inputs)
    return [_ufloat(g, x) for x in ctx.inputs]


@backward(["Max", "Min"])
def max_min(ctx, gy):
    (y,) = ctx.outputs
    if not _is_float(y):
        return [None] * len(ctx.inputs)
    # Every input equal to the result shares the gradient evenly (ties split, PyTorch-style).
    masks = [np.broadcast_to(x == y, y.shape) for x in ctx.inputs]
    count = np.sum(masks, axis=0)
    g = gy / np.maximum(count, 1)
    return [_ufloat(g * m, x) for m, x in zip(masks, ctx.inputs)]


@backward("Where")
def where(ctx, gy):
    c, x, y = ctx.inputs
    zero = np.zeros((), gy.dtype)
    return [None, _ufloat(np.where(c, gy, zero), x), _ufloat(np.where(c, zero, gy), y)]


@backward(["Cast", "CastLike"])
def cast(ctx, gy):
    x = ctx.inputs[0]
    # Only float -> float casts carry a gradient (rounding is treated as the identity).
    if not (_is_float(x) and gy.dtype.kind in "fc"):
        return [None] * len(ctx.inputs)
    return [gy.astype(x.dtype)] + [None] * (len(ctx.inputs) - 1)


@backward("Clip")
def clip(ctx, gy):
    x = ctx.inputs[0]
    if not _is_float(x):
        return [None] * len(ctx.inputs)
    if ctx.version < 11:
        lo, hi = ctx.attr("min", -np.inf), ctx.attr("max", np.inf)
        lo_in = hi_in = None
    else:
        lo_in = ctx.inputs[1] if len(ctx.inputs) > 1 else None
        hi_in = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        lo = -np.inf if lo_in is None else lo_in.reshape(())
        hi = np.inf if hi_in is None else hi_in.reshape(())
    # The kernel computes min(max(x, lo), hi): follow that order so lo > hi (all outputs = hi) works.
    t = np.maximum(x, lo)
    pass_hi = t <= hi
    zero = np.zeros((), gy.dtype)
    gx = np.where((x >= lo) & pass_hi, gy, zero)
    out = [gx]
    if ctx.version >= 11:
        # min and max are marked non-differentiable in the schema, but they are float scalars
        # the output depends on: give them their gradient (sum where they are the result).
        out.append(None if lo_in is None else np.sum(np.where((x < lo) & pass_hi, gy, zero)).reshape(lo_in.shape)
                   .astype(lo_in.dtype))
        out.append(None if hi_in is None else np.sum(np.where(pass_hi, zero, gy)).reshape(hi_in.shape)
                   .astype(hi_in.dtype))
        out = out[:len(ctx.inputs)]
    return out


# ---------------------------------------------------------------- activations


@backward("Relu")
def relu(ctx, gy):
    (x,) = ctx.inputs
    return [gy * (x > 0)]


@backward("Sigmoid")
def sigmoid(ctx, gy):
    (y,) = ctx.outputs
    return [gy * y * (1 - y)]


@backward("Tanh")
def tanh(ctx, gy):
    (y,) = ctx.outputs
    return [gy * (1 - y * y)]


@backward("LeakyRelu")
def leaky_relu(ctx, gy):
    (x,) = ctx.inputs
    alpha = ctx.attr("alpha", 0.01)
    return [gy * np.where(x < 0, x.dtype.type(alpha), x.dtype.type(1))]


@backward("Elu")
def elu(ctx, gy):
    (x,) = ctx.inputs
    alpha = ctx.attr("alpha", 1.0)
    # alpha * exp(x) on the negative side; exp of min(x, 0) keeps the unused branch finite.
    return [gy * np.where(x > 0, 1, alpha * np.exp(np.minimum(x, 0)))]


@backward("Selu")
def selu(ctx, gy):
    (x,) = ctx.inputs
    alpha, gamma = ctx.attr("alpha", 1.67326319217681884765625), ctx.attr("gamma", 1.05070102214813232421875)
    return [gy * (gamma * np.where(x > 0, 1, alpha * np.exp(np.minimum(x, 0))))]


@backward("Celu")
def celu(ctx, gy):
    (x,) = ctx.inputs
    alpha = ctx.attr("alpha", 1.0)
    return [gy * np.where(x > 0, 1, np.exp(np.minimum(x, 0) / alpha))]


@backward("Softplus")
def softplus(ctx, gy):
    (x,) = ctx.inputs
    # sigmoid(x) = exp(x - softplus(x)): stable for large |x| in both directions.
    return [gy * np.exp(x - np.logaddexp(x, 0))]


@backward("Softsign")
def softsign(ctx, gy):
    (x,) = ctx.inputs
    d = 1 + np.abs(x)
    return [gy / (d * d)]


# libm's erf, the float64 Erf kernel's too (NumPy has none; a gradient need not be fast).
_erf = np.vectorize(math.erf, otypes=[np.float64])


@backward("Gelu")
def gelu(ctx, gy):
    (x,) = ctx.inputs
    xf = x.astype(np.float64)
    if ctx.attr("approximate", "none") == "tanh":
        c = np.sqrt(2 / np.pi)
        t = np.tanh(c * (xf + 0.044715 * xf ** 3))
        d = 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * c * (1 + 3 * 0.044715 * xf * xf)
    else:
        # Phi(x) + x * phi(x): the normal CDF and density.
        d = 0.5 * (1 + _erf(xf / np.sqrt(2))) + xf * np.exp(-0.5 * xf * xf) / np.sqrt(2 * np.pi)
    return [(gy * d).astype(x.dtype, copy=False)]


@backward("Erf")
def erf(ctx, gy):
    (x,) = ctx.inputs
    return [gy * (2 / np.sqrt(np.pi)) * np.exp(-x * x)]


@backward("HardSigmoid")
def hard_sigmoid(ctx, gy):
    (x,) = ctx.inputs
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    v = alpha * x + beta
    return [gy * np.where((v > 0) & (v < 1), x.dtype.type(alpha), x.dtype.type(0))]


@backward("HardSwish")
def hard_swish(ctx, gy):
    (x,) = ctx.inputs
    # x * clip(x/6 + 1/2, 0, 1): 0 below -3, 1 above 3, x/3 + 1/2 between.
    return [gy * np.where(x < -3, 0, np.where(x > 3, 1, x / 3 + 0.5))]


@backward("PRelu")
def prelu(ctx, gy):
    x, slope = ctx.inputs
    if not _is_float(x):
        return [None, None]
    neg = x < 0
    gx = gy * np.where(neg, slope, 1)
    gs = np.where(neg, gy * x, 0)
    # slope broadcasts (unidirectionally) to x: sum its gradient back.
    return [gx.astype(x.dtype, copy=False), _ufloat(gs, slope)]


@backward("PRelu", versions=(1, 6))
def prelu_per_channel(ctx, gy):
    """Opsets 1-6: a 1-D slope [C] is one value per channel (axis 1)."""
    from ..meta.elementwise import legacy_slope_shape

    x, slope = ctx.inputs
    if not _is_float(x):
        return [None, None]
    shaped = slope.reshape(legacy_slope_shape(x.ndim, slope.shape))
    neg = x < 0
    gx = gy * np.where(neg, shaped, 1)
    gs = _ufloat(np.where(neg, gy * x, 0), shaped)
    return [gx.astype(x.dtype, copy=False), gs.reshape(slope.shape)]


@backward("Mish")
def mish(ctx, gy):
    (x,) = ctx.inputs
    sp = np.logaddexp(x, 0)
    t = np.tanh(sp)
    sig = np.exp(x - sp)  # sigmoid(x) = d softplus / dx
    return [gy * (t + x * (1 - t * t) * sig)]


@backward("ThresholdedRelu")
def thresholded_relu(ctx, gy):
    (x,) = ctx.inputs
    return [gy * (x > ctx.attr("alpha", 1.0))]


@backward("Swish")
def swish(ctx, gy):
    (x,) = ctx.inputs
    alpha = ctx.attr("alpha", 1.0)
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-alpha * x))
    return [gy * (s + alpha * x * s * (1 - s))]


@backward("Shrink")
def shrink(ctx, gy):
    (x,) = ctx.inputs
    lambd = ctx.attr("lambd", 0.5)
    if not _is_float(x):
        return [None]
    return [gy * ((x < -lambd) | (x > lambd))]


@backward(["Floor", "Ceil", "Round", "Sign"])
def piecewise_constant(ctx, gy):
    # Zero almost everywhere (and undefined at the jumps).
    (x,) = ctx.inputs
    return [np.zeros_like(gy) if _is_float(x) else None]


# ---------------------------------------------------------------- trigonometric / hyperbolic


def _unary(op, deriv):
    """Register gy * deriv(x, y) for a float unary op."""

    def fn(ctx, gy):
        (x,) = ctx.inputs
        (y,) = ctx.outputs
        with np.errstate(divide="ignore", invalid="ignore"):
            return [gy * deriv(x, y)]

    fn.__name__ = op.lower()
    backward(op)(fn)


_unary("Sin", lambda x, y: np.cos(x))
_unary("Cos", lambda x, y: -np.sin(x))
_unary("Tan", lambda x, y: 1 + y * y)
_unary("Asin", lambda x, y: 1 / np.sqrt(1 - x * x))
_unary("Acos", lambda x, y: -1 / np.sqrt(1 - x * x))
_unary("Atan", lambda x, y: 1 / (1 + x * x))
_unary("Sinh", lambda x, y: np.cosh(x))
_unary("Cosh", lambda x, y: np.sinh(x))
_unary("Asinh", lambda x, y: 1 / np.sqrt(x * x + 1))
_unary("Acosh", lambda x, y: 1 / np.sqrt(x * x - 1))
_unary("Atanh", lambda x, y: 1 / (1 - x * x))
