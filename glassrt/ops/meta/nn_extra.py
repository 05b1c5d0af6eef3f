"""Meta rules for normalization / attention ops whose onnx inference is missing or refuses."""
from __future__ import annotations

from ... import dtypes
from ..registry import meta
from ._util import axis, expect_shape


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


@meta("LayerNormalization")
def layer_normalization(ctx):
    # onnx's rule, with symbolic dims kept: Y has X's type; Mean and InvStdDev are of
    # stash_type's dtype, X's dims before `axis` and 1 from it on.
    x, dt = ctx.shape(0), ctx.dtype(0)
    for i, what in ((1, "Scale"), (2, "B")):
        if ctx.has(i) and ctx.dtype(i) != dt:
            ctx.fail(f"{what} is {dtypes.name(ctx.dtype(i))}, X is {dtypes.name(dt)}: they must match")
    a = axis(ctx, int(ctx.attr("axis", -1)), None if x is None else len(x))
    stats = None if x is None else tuple(x[:a]) + (1,) * (len(x) - a)
    try:
        stash = dtypes.np_dtype(int(ctx.attr("stash_type", 1)))
    except KeyError:
        ctx.fail(f"stash_type {ctx.attr('stash_type')} is not an ONNX element type")
    return [ctx.tensor(dt, x)] + [ctx.tensor(stash, stats) for _ in ctx.node.outputs[1:3]]
