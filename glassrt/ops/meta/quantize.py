"""Meta rules for QuantizeLinear and DequantizeLinear: y has x's shape; its type is what
onnx's inference gives (symbolic dims kept, no schema lookup)."""
from __future__ import annotations

import numpy as np

from ... import dtypes
from ..registry import meta


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
