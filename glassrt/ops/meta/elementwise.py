"""Elementwise ops: same shape (unary) or broadcast shape (binary, variadic)."""
from __future__ import annotations

import numpy as np

from ..registry import meta
from ._util import broadcast

UNARY_SAME = [
    "Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil",
    "Round", "Sign", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh",
    "Atanh", "Erf", "Softplus", "Softsign", "Elu", "Selu", "LeakyRelu", "ThresholdedRelu",
    "HardSigmoid", "HardSwish", "Mish", "Gelu", "Celu", "Shrink", "Not", "BitwiseNot",
    "MeanVarianceNormalization", "Clip", "Trilu", "Swish",
]
BINARY_SAME = ["Add", "Sub", "Mul", "Div", "Mod", "BitwiseAnd", "BitwiseOr",
               "BitwiseXor", "Max", "Min", "Sum", "Mean"]
BINARY_BOOL = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"]


def _check_same_dtype(ctx, indices):
    present = [i for i in indices if ctx.has(i)]
    dts = {ctx.dtype(i) for i in present}
    if len(dts) > 1:
        ctx.fail("inputs must share one element type, got " +
                 ", ".join(f"'{ctx.node.inputs[i]}': {ctx.dtype(i)}" for i in present))


@meta(UNARY_SAME)
def unary_same(ctx):
    return [ctx.tensor(ctx.dtype(0), ctx.shape(0))]


@meta(["Softmax", "LogSoftmax", "Hardmax", "LpNormalization", "CumSum", "CumProd"])
def same_along_axis(ctx):
    """Same shape as x, computed along one axis: x needs one (onnxruntime refuses scalars
    and axes out of [-r, r-1] too)."""
    shp = ctx.shape(0)
    if shp is not None:
        if len(shp) == 0:
            ctx.fail("input must have rank >= 1, got a scalar")
        if ctx.node.op_type.startswith("Cum"):
            a = ctx.const(1)
            if ctx.rank(1) not in (None, 0, 1):
                ctx.fail(f"axis must be a scalar or a 1-element tensor, got rank {ctx.rank(1)}")
            a = None if a is None or a.size != 1 else int(a.reshape(-1)[0])
        else:
            old_softmax = ctx.node.op_type != "LpNormalization" and ctx.opset < 13
            a = int(ctx.attr("axis", 1 if old_softmax else -1))
        if a is not None and not -len(shp) <= a < len(shp):
            ctx.fail(f"axis {a} is out of range for rank {len(shp)}")
    return [ctx.tensor(ctx.dtype(0), shp)]


@meta("Identity")
def identity(ctx):
    return [ctx.type(0)]  # tensors, sequences and optionals alike (opset 14+)


@meta(["IsNaN", "IsInf"])
def unary_bool(ctx):
    return [ctx.tensor(np.bool_, ctx.shape(0))]


def legacy_b_shape(a_rank, b_shape, axis):
    """Opsets 1-6 with broadcast=1: B's dims line up with A's starting at `axis` (default:
    at the end), not NumPy-style from the right. The shape B takes to broadcast that way."""
    if axis is None:
        axis = a_rank - len(b_shape)
    axis = axis + a_rank if axis < 0 else axis
    if axis < 0 or axis + len(b_shape) > a_rank:
        raise ValueError(f"B {list(b_shape)} does not fit into rank {a_rank} at axis {axis}")
    return (1,) * axis + tuple(b_shape) + (1,) * (a_rank - axis - len(b_shape))


def _binary_shape(ctx):
    """The output shape of a two-input elementwise op, legacy broadcasting included."""
    a, b = ctx.shape(0), ctx.shape(1)
    if ctx.contract.since_version < 7 and ctx.node.op_type in LEGACY_BROADCAST:
        if a is None or b is None:
            return None
        if not int(ctx.attr("broadcast", 0)):
            if len(a) != len(b) or any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a, b)):
                ctx.fail(f"shapes {list(a)} and {list(b)} differ and broadcast=0")
            return tuple(a)
        try:
            b = legacy_b_shape(len(a), b, ctx.attrs.get("axis"))
        except ValueError as e:
            ctx.fail(str(e))
    return broadcast(ctx, a, b)


LEGACY_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"}


@meta(BINARY_SAME)
def binary_same(ctx):
    _check_same_dtype(ctx, range(ctx.n_inputs))
    if ctx.n_inputs == 2 and ctx.has(1):
        return [ctx.tensor(ctx.dtype(0), _binary_shape(ctx))]
    shapes = [ctx.shape(i) for i in range(ctx.n_inputs) if ctx.has(i)]
    return [ctx.tensor(ctx.dtype(0), broadcast(ctx, *shapes))]


@meta("BitShift")
def bit_shift(ctx):
    direction = ctx.attr("direction", None)
    if direction not in ("LEFT", "RIGHT"):
        ctx.fail(f"direction must be \"LEFT\" or \"RIGHT\", got {direction!r}")
    return binary_same(ctx)


@meta("LRN")
def lrn(ctx):
    size = int(ctx.attr("size", 0))
    if size <= 0:
        ctx.fail(f"size (the channels summed over) must be positive, got {size}")
    return [ctx.tensor(ctx.dtype(0), ctx.shape(0))]


@meta("Pow")
def pow_(ctx):
    return [ctx.tensor(ctx.dtype(0), _binary_shape(ctx))]


@meta(BINARY_BOOL)
def binary_bool(ctx):
    _check_same_dtype(ctx, [0, 1])
    return [ctx.tensor(np.bool_, _binary_shape(ctx))]


@meta("Where")
def where(ctx):
    _check_same_dtype(ctx, [1, 2])
    return [ctx.tensor(ctx.dtype(1), broadcast(ctx, ctx.shape(0), ctx.shape(1), ctx.shape(2)))]


def legacy_slope_shape(x_rank, slope_shape):
    """PRelu before opset 7 (Caffe2's, which PyTorch's opset-6 exports follow): a 1-D slope
    of more than one value holds one per channel (axis 1); any other slope broadcasts as
    NumPy's. The shape the slope takes to broadcast that way."""
    if x_rank is not None and x_rank >= 2 and slope_shape is not None and len(slope_shape) == 1 \
            and slope_shape[0] != 1:
        return tuple(slope_shape) + (1,) * (x_rank - 2)
    return slope_shape


@meta("PRelu")
def prelu(ctx):
    slope = ctx.shape(1)
    if ctx.contract.since_version < 7:
        legacy = legacy_slope_shape(ctx.rank(0), slope)
        if legacy != slope:
            c, x = slope[0], ctx.shape(0)
            if isinstance(c, int) and isinstance(x[1], int) and c != x[1]:
                ctx.fail(f"slope {list(slope)} holds one value per channel (opset {ctx.opset} < 7), but input 0 "
                         f"'{ctx.node.inputs[0]}' {list(x)} has {x[1]} channels")
            slope = legacy
    return [ctx.tensor(ctx.dtype(0), broadcast(ctx, ctx.shape(0), slope))]


@meta("Dropout")
def dropout(ctx):
    out = [ctx.tensor(ctx.dtype(0), ctx.shape(0))]
    if len(ctx.node.outputs) > 1:
        out.append(ctx.tensor(np.bool_, ctx.shape(0)))
    return out


@meta("Cast")
def cast(ctx):
    from ... import dtypes

    return [ctx.tensor(dtypes.np_dtype(int(ctx.attr("to"))), ctx.shape(0))]


@meta("CastLike")
def cast_like(ctx):
    return [ctx.tensor(ctx.dtype(1), ctx.shape(0))]
