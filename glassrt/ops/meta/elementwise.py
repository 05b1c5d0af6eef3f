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
    "Softmax", "LogSoftmax", "Hardmax", "LRN", "LpNormalization", "MeanVarianceNormalization",
    "InstanceNormalization", "Clip", "CumSum", "CumProd", "Trilu", "Swish",
]
BINARY_SAME = ["Add", "Sub", "Mul", "Div", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr",
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


@meta("Identity")
def identity(ctx):
    return [ctx.type(0)]  # tensors, sequences and optionals alike (opset 14+)


@meta(["IsNaN", "IsInf"])
def unary_bool(ctx):
    return [ctx.tensor(np.bool_, ctx.shape(0))]


@meta(BINARY_SAME)
def binary_same(ctx):
    _check_same_dtype(ctx, range(ctx.n_inputs))
    shapes = [ctx.shape(i) for i in range(ctx.n_inputs) if ctx.has(i)]
    return [ctx.tensor(ctx.dtype(0), broadcast(ctx, *shapes))]


@meta("Pow")
def pow_(ctx):
    return [ctx.tensor(ctx.dtype(0), broadcast(ctx, ctx.shape(0), ctx.shape(1)))]


@meta(BINARY_BOOL)
def binary_bool(ctx):
    _check_same_dtype(ctx, [0, 1])
    return [ctx.tensor(np.bool_, broadcast(ctx, ctx.shape(0), ctx.shape(1)))]


@meta("Where")
def where(ctx):
    _check_same_dtype(ctx, [1, 2])
    return [ctx.tensor(ctx.dtype(1), broadcast(ctx, ctx.shape(0), ctx.shape(1), ctx.shape(2)))]


@meta("PRelu")
def prelu(ctx):
    return [ctx.tensor(ctx.dtype(0), broadcast(ctx, ctx.shape(0), ctx.shape(1)))]


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
