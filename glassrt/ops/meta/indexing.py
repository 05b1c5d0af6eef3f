"""Meta rules for gathers, scatters, TopK, OneHot and NonMaxSuppression: the output shapes
onnx's inference gives, with symbolic dims kept (onnx's generic inference drops them, and
asking it imports the onnx package, ~35 ms of a session's creation, and builds its whole
schema registry)."""
from __future__ import annotations

import re

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


@meta("GatherND")
def gather_nd(ctx):
    """indices' shape without its last dim k, then data's dims after batch_dims + k."""
    data, idx = ctx.shape(0), ctx.shape(1)
    b = int(ctx.attr("batch_dims", 0))
    if data is None or idx is None:
        return [ctx.tensor(ctx.dtype(0), None)]
    if len(data) < 1 or len(idx) < 1:
        ctx.fail(f"data {symbolic.shape_str(data)} and indices {symbolic.shape_str(idx)} must have rank >= 1")
    if b < 0 or b >= min(len(data), len(idx)):
        ctx.fail(f"batch_dims {b} must be below both ranks ({len(data)}, {len(idx)})")
    k = idx[-1]
    if not isinstance(k, int):
        return [ctx.tensor(ctx.dtype(0), None)]  # (the rank depends on a dim not known here)
    if k < 1 or b + k > len(data):
        ctx.fail(f"indices' last dim {k} with batch_dims {b} must be 1..{len(data) - b} for data of rank {len(data)}")
    return [ctx.tensor(ctx.dtype(0), tuple(idx[:-1]) + tuple(data[b + k:]))]


@meta("OneHot")
def one_hot(ctx):
    """indices' shape with depth inserted at axis, in values' type (depth unknown: a symbol)."""
    idx, dv = ctx.shape(0), ctx.const(1)
    if dv is not None and dv.size != 1:
        ctx.fail(f"depth must hold one value, got shape {list(dv.shape)}")
    if ctx.shape(2) is not None and len(ctx.shape(2)) != 1:
        ctx.fail(f"values must be 1-D ([off, on]), got shape {symbolic.shape_str(ctx.shape(2))}")
    depth = None if dv is None else int(dv.reshape(-1)[0])
    if depth is not None and depth < 1:
        ctx.fail(f"depth must be positive, got {depth}")
    if idx is None:
        return [ctx.tensor(ctx.dtype(2), None)]
    a = norm_axis(ctx, int(ctx.attr("axis", -1)), len(idx) + 1)
    d = depth if depth is not None else symbolic.fresh("depth")
    return [ctx.tensor(ctx.dtype(2), tuple(idx[:a]) + (d,) + tuple(idx[a:]))]


@meta("NonMaxSuppression")
def non_max_suppression(ctx):
    """[selected, 3] int64 (batch, class, box index of each box kept): how many is the data's."""
    boxes, scores = ctx.shape(0), ctx.shape(1)
    if boxes is not None and (len(boxes) != 3 or (isinstance(boxes[2], int) and boxes[2] != 4)):
        ctx.fail(f"boxes must be [batches, boxes, 4], got {symbolic.shape_str(boxes)}")
    if scores is not None and len(scores) != 3:
        ctx.fail(f"scores must be [batches, classes, boxes], got {symbolic.shape_str(scores)}")
    if boxes is not None and scores is not None:
        for a, b, what in ((boxes[0], scores[0], "batches"), (boxes[1], scores[2], "boxes")):
            if isinstance(a, int) and isinstance(b, int) and a != b:
                ctx.fail(f"boxes {symbolic.shape_str(boxes)} and scores {symbolic.shape_str(scores)} "
                         f"disagree on the {what}")
    return [ctx.tensor(np.int64, (symbolic.fresh("selected"), 3))]


_EINSUM_TERM = re.compile(r"[A-Za-z]*(?:\.\.\.)?[A-Za-z]*")


@meta("Einsum")
def einsum(ctx):
    """onnx's rule, once the equation is one: terms of letters with at most one ellipsis each,
    one per input, and an output of distinct letters the inputs name (onnx's own inference
    loops forever on "i1->i" or "......i->i")."""
    eq = str(ctx.attr("equation", "")).replace(" ", "")
    inputs, arrow, output = eq.partition("->")
    terms = inputs.split(",")
    if not all(_EINSUM_TERM.fullmatch(t) for t in terms) or (arrow and not _EINSUM_TERM.fullmatch(output)):
        ctx.fail(f"equation {eq!r} is not einsum notation: terms of letters, each with at most one '...'")
    if len(terms) != ctx.n_inputs:
        ctx.fail(f"equation {eq!r} has {len(terms)} input term(s) for {ctx.n_inputs} input(s)")
    letters = set("".join(terms).replace(".", ""))
    out_letters = output.replace(".", "")
    if arrow and (len(set(out_letters)) != len(out_letters) or not set(out_letters) <= letters):
        ctx.fail(f"equation {eq!r}: the output names each letter once, and only letters of the inputs")
    from ..onnx_meta import onnx_meta

    return onnx_meta(ctx)
