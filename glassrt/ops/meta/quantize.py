"""Meta rules for the quantization ops: QuantizeLinear and DequantizeLinear (y has x's shape;
its type is what onnx's inference gives), DynamicQuantizeLinear, MatMulInteger and
QLinearMatMul. Symbolic dims kept, no schema lookup: an op without a rule here goes to
onnx's inference, which imports the onnx package (~35 ms of a session's creation, once)
and runs per node (a quantize_dynamic OCR model's 22 DynamicQuantizeLinear nodes, inferred
by every stage of its creation)."""
from __future__ import annotations

import numpy as np

from ... import dtypes
from ..registry import meta
from .nn import matmul_shape
from ...dtypes import EIGHT_BIT as _EIGHT_BIT



def _attr_dtype(ctx, name):
    v = int(ctx.attr(name, 0))
    if not v:
        return None
    try:
        return dtypes.np_dtype(v)
    except KeyError:
        ctx.fail(f"{name} {v} is not an ONNX element type")


@meta("QuantizeLinear")
def quantize_linear(ctx):
    # y's type: the zero point's, else output_dtype (opset 21+), else uint8
    out = _attr_dtype(ctx, "output_dtype")
    if ctx.has(2):
        zp = ctx.dtype(2)
        if out is not None and out != zp:
            ctx.fail(f"output_dtype {dtypes.name(out)} differs from y_zero_point's {dtypes.name(zp)}")
        out = zp
    return [ctx.tensor(out if out is not None else np.uint8, ctx.shape(0))]


@meta("DequantizeLinear")
def dequantize_linear(ctx):
    # y's type: float32 before opset 19, then the scale's (or output_dtype, opset 23+)
    if ctx.contract.since_version < 19:
        return [ctx.tensor(np.float32, ctx.shape(0))]
    out = _attr_dtype(ctx, "output_dtype")
    return [ctx.tensor(out if out is not None else ctx.dtype(1), ctx.shape(0))]


@meta("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx):
    """y: x's shape in uint8; y_scale (float32) and y_zero_point (uint8) scalars."""
    if ctx.dtype(0) is not None and ctx.dtype(0) != np.float32:
        ctx.fail(f"x must be float32, got {dtypes.name(ctx.dtype(0))}")
    return [ctx.tensor(np.uint8, ctx.shape(0)), ctx.tensor(np.float32, ()), ctx.tensor(np.uint8, ())]


def _eight_bit(ctx, *at):
    for i in at:
        if ctx.has(i) and ctx.dtype(i) is not None and ctx.dtype(i) not in _EIGHT_BIT:
            ctx.fail(f"input {i} must be uint8 or int8, got {dtypes.name(ctx.dtype(i))}")


@meta("MatMulInteger")
def matmul_integer(ctx):
    """A @ B (each uint8 or int8, as its zero point) as MatMul broadcasts them, in int32."""
    _eight_bit(ctx, 0, 1, 2, 3)
    return [ctx.tensor(np.int32, matmul_shape(ctx, ctx.shape(0), ctx.shape(1), same_dtype=False))]


@meta("QLinearMatMul")
def qlinear_matmul(ctx):
    """a @ b requantized: MatMul's shape of a (input 0) and b (input 3), y_zero_point's type."""
    _eight_bit(ctx, 0, 3)
    return [ctx.tensor(ctx.dtype(7), matmul_shape(ctx, ctx.shape(0), ctx.shape(3), same_dtype=False))]
