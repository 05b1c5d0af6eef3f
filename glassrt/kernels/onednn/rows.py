"""The `onednn` provider's row-wise ops for transformers: LayerNormalization, Softmax and
LogSoftmax, float32, on oneDNN's primitives (vectorized and run on the session's OpenMP
threads; glassrt's cpu kernels for these run on one thread).

Values are plain C-order arrays here (these ops read no NHWC layouts). Results differ from
the cpu kernels by rounding only (oneDNN's own exp; its sums in another order).
"""
from __future__ import annotations

import math

import numpy as np

from ...ops.geometry import normalize_axis
from ..registry import kernel
from . import dnnl
from .dnnl import ARG_DST, ARG_SCALE, ARG_SHIFT, ARG_SRC, MemoryDesc
from .kernels import F32, SMALL_ELEMENTS, _PerThreads, _unavailable, run_alone


def _static(ctx, i=0):
    s = ctx.shape(i)
    return None if s is None else [int(d) for d in s]


# ---------------------------------------------------------------- LayerNormalization


def _ln_geometry(ctx):
    """(rows, width): the dims before `axis` flattened, and those from it on."""
    x = _static(ctx)
    a = normalize_axis(int(ctx.attrs.get("axis", -1)), len(x))
    return math.prod(x[:a]), math.prod(x[a:])


def _basic_reason(ctx):
    """Why not, for any of these ops: no oneDNN, or an input of no known rank."""
    x = _static(ctx)
    return _unavailable(ctx) or (None if x is not None and len(x) >= 1 else "X has no known rank")


def _ln_reason(ctx):
    why = _basic_reason(ctx)
    if why:
        return why
    x = _static(ctx)
    if any(o for o in ctx.node.outputs[1:]):
        return "Mean and InvStdDev outputs are not computed here"
    rows, width = _ln_geometry(ctx)
    if rows == 0 or width == 0:
        return "an empty input"
    for i, what in ((1, "Scale"), (2, "B")):
        s = _static(ctx, i) if ctx.has(i) else []
        if ctx.has(i) and (s is None or math.prod(s) != width or len(s) > len(x)
                           or s != x[len(x) - len(s):]):
            return f"{what} does not cover the normalized dims exactly (no broadcasting here)"
    return None


@kernel("LayerNormalization", provider="onednn", dtypes=F32, out=True, bind=True, multi=True, versions=(17, None),
        accepts=_ln_reason, static_only=True, name="layer_norm")
def layer_norm(ctx):
    """oneDNN layer normalization over the rows of X (the dims from `axis` on)."""
    rows, width = _ln_geometry(ctx)
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    shift = ctx.has(2)
    md = MemoryDesc.create((rows, width), np.float32, "ab")

    def build():
        pd = dnnl.layer_norm(md, md, eps, scale=True, shift=shift)
        args = {ARG_SRC: None, ARG_DST: None, ARG_SCALE: None}
        if shift:
            args[ARG_SHIFT] = None
        return pd.primitive().bind(args)

    prims = _PerThreads(build)
    alone = rows * width <= SMALL_ELEMENTS  # see kernels.SMALL_ELEMENTS
    flat = {}  # the last array of each argument and its 1-D view (same object: no re-pointing)

    def view(slot, a):
        if flat.get(slot, (None,))[0] is not a:
            flat[slot] = a, (a if a.flags.c_contiguous else np.ascontiguousarray(a)).reshape(-1)
        return flat[slot][1]

    def step(x, scale, bias=None, *, out=(None,)):
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        y = outs[0] if outs[0] is not None else np.empty(x.shape, np.float32)
        buffers = {ARG_SRC: x if x.flags.c_contiguous else np.ascontiguousarray(x), ARG_DST: y,
                   ARG_SCALE: view("scale", scale)}
        if shift:
            buffers[ARG_SHIFT] = view("bias", bias)
        run_alone(prims.get(), buffers, alone)
        return (y,) + (None,) * (len(outs) - 1)

    return step


# ---------------------------------------------------------------- Softmax, LogSoftmax


def _softmax_geometry(ctx):
    """(shape, axis) as oneDNN sees X: opset 13's axis as is; before 13, the dims from
    `axis` on are one row."""
    x = _static(ctx)
    default = -1 if ctx.node.opset >= 13 else 1
    a = normalize_axis(int(ctx.attrs.get("axis", default)), len(x))
    if ctx.node.opset >= 13:
        return x, a
    return [math.prod(x[:a]), math.prod(x[a:])], 1


def _softmax_reason(ctx):
    why = _basic_reason(ctx)
    if why:
        return why
    if 0 in _static(ctx):
        return "an empty input"
    return None


@kernel(["Softmax", "LogSoftmax"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_softmax_reason,
        static_only=True, name="softmax")
def softmax(ctx):
    """oneDNN softmax (accurate: the row max subtracted first) along the node's axis."""
    shape, axis = _softmax_geometry(ctx)
    md = MemoryDesc.create(shape, np.float32, dnnl.plain_tag(len(shape)))
    log = ctx.node.op_type == "LogSoftmax"
    prims = _PerThreads(lambda: dnnl.softmax(md, md, axis, log=log).primitive().bind({ARG_SRC: None, ARG_DST: None}))

    alone = math.prod(shape) <= SMALL_ELEMENTS  # see kernels.SMALL_ELEMENTS

    def step(x, *, out):
        run_alone(prims.get(), {ARG_SRC: x if x.flags.c_contiguous else np.ascontiguousarray(x), ARG_DST: out}, alone)
        return out

    return step
