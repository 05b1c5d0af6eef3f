"""The `onednn` provider's row-wise ops for transformers: LayerNormalization, Softmax and
LogSoftmax, float32, on oneDNN's primitives (vectorized and run on the session's OpenMP
threads; glassrt's cpu kernels for these run on one thread).

Values are plain C-order arrays here (these ops read no NHWC layouts). Results differ from
the cpu kernels by rounding only (oneDNN's own exp; its sums in another order). A
LayerNormalization of a few rows in a plan that keeps running moves to the cpu kernels'
compiled row loop (see SMALL_ROWS).
"""
from __future__ import annotations

import math
import sys
from collections import Counter

import numpy as np

from ...ops.geometry import normalize_axis
from ..cpu._jit import compiled
from ..registry import kernel
from . import dnnl
from .dnnl import ARG_DST, ARG_SCALE, ARG_SHIFT, ARG_SRC, MemoryDesc
from .kernels import (F32, SMALL_ELEMENTS, ContiguousViews, NodeMemo, _PerThreads, _unavailable, run_alone,
                      run_and_let_go, shared_pd, thread_step)


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
    eps32 = np.float32(eps)  # the row loop's: float32 arithmetic throughout
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
    view = ContiguousViews()  # views of the arguments (the same object each run: no re-pointing, no new view)
    # a few rows (a decode step's one), in a plan that keeps running: the compiled row loop
    # (runs: counted up to AFTER_RUNS, then None; loop: the loop's arguments but x and y)
    runs, loop = [0 if rows <= SMALL_ROWS else None], [None]

    def step(x, scale, bias=None, *, out=(None,)):
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        y = outs[0] if outs[0] is not None else np.empty(x.shape, np.float32)
        if loop[0] is not None and y.flags.c_contiguous:
            fn, zeros, mean, inv_std = loop[0]
            fn(view("x", x, (rows, width)), view("scale", scale), zeros if bias is None else view("bias", bias), eps32,
               view("y", y, (rows, width)), mean, inv_std)
            return (y,) + (None,) * (len(outs) - 1)
        if runs[0] is not None:
            runs[0] += 1
            from .row_panels import AFTER_RUNS

            if runs[0] >= AFTER_RUNS:
                runs[0], loop[0] = None, _row_loop(rows, width)
                stats["row loop" if loop[0] is not None else "kept: Numba is not loaded"] += 1
        buffers = {ARG_SRC: x if x.flags.c_contiguous else np.ascontiguousarray(x), ARG_DST: y,
                   ARG_SCALE: view("scale", scale)}
        if shift:
            buffers[ARG_SHIFT] = view("bias", bias)
        run_alone(prims.get(), buffers, alone)
        return (y,) + (None,) * (len(outs) - 1)

    return step


# Rows up to which LayerNormalization runs on the compiled row loop of the cpu kernels once
# its plan keeps running (a decode step's one row). oneDNN's primitive is as fast on data
# in cache (3-4 us a row of 768) but reaches far more memory per call (the stream, its
# arguments, the JIT kernel, OpenMP's thread count set and reset): after a one-row product
# has streamed megabytes of weights through the caches, GPT-2's 768-wide rows took 29 us a
# call there against 8-9 us on the loop (medians of 300 calls, the 2-core Xeon).
SMALL_ROWS = 8
stats: Counter = Counter()  # "row loop": the LayerNormalizations that moved there; other keys: why not


def _row_loop(rows, width):
    """(compiled loop, zeros for a missing B, mean and inv_std scratch) for rows × width, or
    None where Numba is not loaded already (importing it costs more than the loop gains)."""
    if "numba" not in sys.modules:
        return None
    from ..cpu import rows as cpu_rows

    return (compiled(cpu_rows._layer_norm), np.zeros(width, np.float32), np.empty(rows, np.float32),
            np.empty(rows, np.float32))


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
    shape, axis = _softmax_geometry(ctx)
    if math.prod(shape[axis + 1:]) != 1:
        # oneDNN 3.2 has jit softmax kernels for the innermost axis only: any other is its
        # ref:any, 14.8 ms for YOLOv8's DFL softmax over axis 1 of (1, 16, 4, 2100)
        return (f"the softmax axis {axis} of {list(shape)} is not the innermost: oneDNN has only its reference "
                "implementation for that")
    return None


@kernel(["Softmax", "LogSoftmax"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_softmax_reason,
        static_only=True, name="softmax",
        drops_nan="oneDNN takes each row's maximum with max instructions: a NaN in the row is lost")
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


# ---------------------------------------------------------------- over shapes known at run time
# In a plan shared by several input shapes (runner.py's ShapePattern: BERT served at any
# sequence length), the kernels above, bound to concrete shapes, cannot go: the rows (and a
# softmax's width: attention's scores are L x L) decide the primitive per call. One
# descriptor per (rows, width), shared by every node that asks for it, with one bound step
# per thread (kernels.thread_step) whose memories each call points at its own arrays, as
# matmul_rows.py's products. Measured on BERT-base's shared plan, 2 threads, lengths 80-91:
# its 25 LayerNormalizations 2.94 ms a run on cpu's kernel against 0.97 on a plan of each
# length's own, its 12 softmaxes 1.70 against 1.16.


def _ln_any_reason(ctx):
    why = _unavailable(ctx)
    x = ctx.shape(0)
    if why or x is None or len(x) < 1:
        return why or "X has no known rank"
    if any(o for o in ctx.node.outputs[1:]):
        return "Mean and InvStdDev outputs are not computed here"
    a = normalize_axis(int(ctx.attrs.get("axis", -1)), len(x))
    if not all(isinstance(d, int) for d in x[a:]):
        return f"the dims from axis {a} on ({list(x[a:])}) are symbolic"
    width = math.prod(x[a:])
    if width == 0:
        return "an empty row"
    for i, what in ((1, "Scale"), (2, "B")):
        s = ctx.shape(i) if ctx.has(i) else []
        if ctx.has(i) and (s is None or len(s) > len(x) - a or list(s) != list(x[len(x) - len(s):])
                           or math.prod(s) != width):
            return f"{what} does not cover the normalized dims exactly (no broadcasting here)"
    return None


def _run_rows(memo, make, rows, width, buffers, y):
    """make(rows, width)'s step (memo: the node's NodeMemo) run over `buffers` (y: the output,
    written through a dense copy where it is not C-contiguous)."""
    dense = y if y.flags.c_contiguous else np.empty(y.shape, y.dtype)
    buffers[ARG_DST] = dense
    step = memo.get((rows, width), lambda: make(rows, width))
    run_and_let_go(step, buffers, rows * width <= SMALL_ELEMENTS)
    if dense is not y:
        np.copyto(y, dense)


@kernel("LayerNormalization", provider="onednn", dtypes=F32, out=True, bind=True, multi=True, versions=(17, None),
        accepts=_ln_any_reason, any_shape=True, priority=-1, name="layer_norm_any_rows")
def layer_norm_any_rows(ctx):
    """oneDNN layer normalization over X's rows, however many a run brings (a plan with
    symbolic dims before `axis`): a primitive per row count."""
    x = ctx.shape(0)
    width = math.prod(x[normalize_axis(int(ctx.attrs.get("axis", -1)), len(x)):])
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    shift = ctx.has(2)

    def make(rows, width):
        key = ("layer norm", rows, width, eps, shift)

        def bind():
            md = MemoryDesc.create((rows, width), np.float32, "ab")
            pd = shared_pd(key, lambda: dnnl.layer_norm(md, md, eps, scale=True, shift=shift))
            return pd.primitive().bind({ARG_SRC: None, ARG_DST: None, ARG_SCALE: None, **({ARG_SHIFT: None} if shift
                                                                                            else {})})
        return thread_step(key, bind)

    memo = NodeMemo()

    def step(x, scale, bias=None, *, out=(None,)):
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        y = outs[0] if outs[0] is not None else np.empty(x.shape, np.float32)
        if x.size:
            buffers = {ARG_SRC: np.ascontiguousarray(x), ARG_SCALE: np.ascontiguousarray(scale)}
            if shift:
                buffers[ARG_SHIFT] = np.ascontiguousarray(bias)
            _run_rows(memo, make, x.size // width, width, buffers, y)
        return (y,) + (None,) * (len(outs) - 1)

    return step


def _softmax_any_reason(ctx):
    why = _unavailable(ctx)
    x = ctx.shape(0)
    if why or x is None or len(x) < 1:
        return why or "X has no known rank"
    if ctx.node.opset < 13:  # (the dims from axis on are one row, its width taken per call)
        return None
    a = normalize_axis(int(ctx.attrs.get("axis", -1)), len(x))
    if any(d != 1 for d in x[a + 1:]):
        return f"the softmax axis {a} of {list(x)} is not the innermost: oneDNN has only its reference implementation"
    return None


@kernel(["Softmax", "LogSoftmax"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_softmax_any_reason,
        any_shape=True, priority=-1, name="softmax_any_shape",
        drops_nan="oneDNN takes each row's maximum with max instructions: a NaN in the row is lost")
def softmax_any_shape(ctx):
    """oneDNN softmax along the innermost axis (opset 13) or over the dims from `axis` on (before
    13) of X as a run brings it: a primitive per (rows, width), X seen as that matrix."""
    log = ctx.node.op_type == "LogSoftmax"
    axis = int(ctx.attrs.get("axis", -1 if ctx.node.opset >= 13 else 1))

    def make(rows, width):
        key = ("softmax", rows, width, log)

        def bind():
            md = MemoryDesc.create((rows, width), np.float32, "ab")
            return shared_pd(key, lambda: dnnl.softmax(md, md, 1, log=log)).primitive().bind({ARG_SRC: None,
                                                                                                ARG_DST: None})
        return thread_step(key, bind)

    memo = NodeMemo()

    def step(x, *, out=None):
        out = np.empty(x.shape, np.float32) if out is None else out
        if x.size:
            width = math.prod(x.shape[normalize_axis(axis, x.ndim):])
            _run_rows(memo, make, x.size // width, width, {ARG_SRC: np.ascontiguousarray(x)}, out)
        return out

    return step
