"""Meta rules for normalization / attention ops whose onnx inference is missing or refuses."""
from __future__ import annotations

from ..registry import meta
from ._util import expect_shape


@meta("GroupNormalization")
def group_normalization(ctx):
    # onnx refuses to infer the (deprecated) opset-18 schema at all; Y is X's type either way.
    x = ctx.shape(0)
    if x is not None and len(x) >= 2:
        # opset 18 scales per group, opset 21 per channel
        n = (int(ctx.attr("num_groups", 0)), "one per group") if ctx.opset < 21 else (x[1], "one per channel")
        expect_shape(ctx, 1, (n[0],), "scale, " + n[1])
        expect_shape(ctx, 2, (n[0],), "bias, " + n[1])
    return [ctx.tensor(ctx.dtype(0), x)]


@meta("InstanceNormalization")
def instance_normalization(ctx):
    x = ctx.shape(0)
    if x is not None:
        if len(x) < 3:
            ctx.fail(f"input must be (N, C, D1, ...), got rank {len(x)}")
        expect_shape(ctx, 1, (x[1],), "scale, one per channel")
        expect_shape(ctx, 2, (x[1],), "B, one per channel")
    return [ctx.tensor(ctx.dtype(0), x)]
