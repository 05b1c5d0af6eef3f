"""Reductions: axes from the attribute or (newer opsets) the second input."""
from __future__ import annotations

import numpy as np

from ... import symbolic
from ..registry import meta
from ._util import axes as norm_axes
from ._util import axis as norm_axis
from ._util import ints

REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
# The opset from which `axes` is an input instead of an attribute.
AXES_AS_INPUT = {op: 18 for op in REDUCE} | {"ReduceSum": 13}


def reduce_axes(ctx):
    """The normalized axes, [] for 'all', or None when they are an unknown input."""
    rank = ctx.rank(0)
    if ctx.opset >= AXES_AS_INPUT[ctx.node.op_type]:
        if not ctx.has(1):
            return []
        v = ctx.const(1)
        if v is None:
            return None
        return norm_axes(ctx, ints(v), rank) if rank is not None else ints(v)
    a = ctx.attrs.get("axes")
    return [] if a is None else (norm_axes(ctx, list(a), rank) if rank is not None else list(a))


@meta(REDUCE)
def reduce(ctx):
    shp = ctx.shape(0)
    keep = bool(ctx.attr("keepdims", 1))
    ax = reduce_axes(ctx)
    if shp is None or ax is None:
        if ax is None and keep and shp is not None:
            return [ctx.tensor(ctx.dtype(0), tuple(symbolic.fresh() for _ in shp))]
        return [ctx.tensor(ctx.dtype(0), None)]
    if not ax:
        if int(ctx.attr("noop_with_empty_axes", 0)):
            return [ctx.tensor(ctx.dtype(0), shp)]
        ax = list(range(len(shp)))
    out = []
    for i, d in enumerate(shp):
        if i in ax:
            if keep:
                out.append(1)
        else:
            out.append(d)
    return [ctx.tensor(ctx.dtype(0), tuple(out))]


@meta(["ArgMax", "ArgMin"])
def arg_reduce(ctx):
    shp = ctx.shape(0)
    if shp is None:
        return [ctx.tensor(np.int64, None)]
    a = norm_axis(ctx, int(ctx.attr("axis", 0)), len(shp))
    keep = bool(ctx.attr("keepdims", 1))
    out = [1 if i == a else d for i, d in enumerate(shp) if keep or i != a]
    return [ctx.tensor(np.int64, tuple(out))]
