"""Meta rules for gathers, scatters and TopK: the output shapes onnx's inference gives, with
symbolic dims kept (onnx's generic inference drops them, and asking it builds onnx's whole
schema registry)."""
from __future__ import annotations

import numpy as np

from ... import symbolic
from ..registry import meta
from ._util import axis as norm_axis


@meta("GatherElements")
def gather_elements(ctx):
    data, idx = ctx.shape(0), ctx.shape(1)
    if data is not None and idx is not None and len(data) != len(idx):
        ctx.fail(f"data (rank {len(data)}) and indices (rank {len(idx)}) must have the same rank")
    if data is not None:
        norm_axis(ctx, int(ctx.attr("axis", 0)), len(data))
    return [ctx.tensor(ctx.dtype(0), idx)]


@meta(["ScatterElements", "Scatter", "ScatterND", "TensorScatter"])
def scatter(ctx):
    # an updated copy of the data (TensorScatter: of the past cache); the element-wise
    # scatters also need data, indices and updates of one rank
    data = ctx.shape(0)
    if ctx.node.op_type in ("ScatterElements", "Scatter"):
        idx, upd = ctx.shape(1), ctx.shape(2)
        if data is not None and idx is not None and len(data) != len(idx):
            ctx.fail(f"data (rank {len(data)}) and indices (rank {len(idx)}) must have the same rank")
        if idx is not None and upd is not None and len(idx) != len(upd):
            ctx.fail(f"indices (rank {len(idx)}) and updates (rank {len(upd)}) must have the same rank")
        if data is not None:
            norm_axis(ctx, int(ctx.attr("axis", 0)), len(data))
    return [ctx.tensor(ctx.dtype(0), data)]


@meta("TopK")
def topk(ctx):
    x = ctx.shape(0)
    if ctx.opset < 10:
        k = int(ctx.attr("k"))
    else:
        kv = ctx.const(1)
        if kv is not None and kv.size != 1:
            ctx.fail(f"K must hold one value, got shape {list(kv.shape)}")
        k = None if kv is None else int(kv.reshape(-1)[0])
    if k is not None and k < 0:
        ctx.fail(f"K must not be negative, got {k}")
    out = None
    if x is not None:
        a = norm_axis(ctx, int(ctx.attr("axis", -1)), len(x))
        if k is not None and isinstance(x[a], int) and k > x[a]:
            ctx.fail(f"K = {k} is larger than axis {a}'s {x[a]} elements")
        out = tuple(x[:a]) + (k if k is not None else symbolic.fresh("topk"),) + tuple(x[a + 1:])
    return [ctx.tensor(ctx.dtype(0), out), ctx.tensor(np.int64, out)][:max(1, len(ctx.node.outputs))]
