"""Conv: im2col + GEMM (general), plain GEMM for 1×1, shifted multiply-adds for depthwise."""
from __future__ import annotations

import numpy as np

from dataclasses import replace

from .. import registry
from ..registry import kernel
from . import pool
from ._util import FLOATS, pad_spatial, spatial_pads, window_views, windows


def _geometry(ctx):
    x, w = ctx.shape(0), ctx.shape(1)
    kernel_shape = list(ctx.attrs.get("kernel_shape") or w[2:])
    begin, end, out, strides, dil = spatial_pads(list(x[2:]), kernel_shape, ctx.attrs.get("strides"),
                                                 ctx.attrs.get("dilations"), ctx.attrs.get("pads"),
                                                 ctx.attrs.get("auto_pad", "NOTSET"))
    return x, w, kernel_shape, begin, end, out, strides, dil


def _is_1x1(ctx):
    x, w, k, begin, end, out, strides, dil = _geometry(ctx)
    if all(d == 1 for d in k) and all(s == 1 for s in strides) and not any(begin) and not any(end) \
            and int(ctx.attrs.get("group", 1)) == 1:
        return None
    return "not a 1x1, stride-1, unpadded, ungrouped conv"


def _is_depthwise(ctx):
    x, w = ctx.shape(0), ctx.shape(1)
    g = int(ctx.attrs.get("group", 1))
    if g > 1 and g == x[1] and w[0] == g and w[1] == 1:
        return None
    return "not depthwise (group == channels, one filter per channel)"


def _compute_dtype(ctx):
    return np.dtype(np.float32) if ctx.dtype(0) == np.float16 else np.dtype(ctx.dtype(0))


def _in_float32(step):
    """float16 convs accumulate in float32 (as onnxruntime and the reference do), then round."""

    def step16(x, w, b=None, *, out):
        y = step(x.astype(np.float32), w.astype(np.float32), None if b is None else b.astype(np.float32),
                 out=np.empty(out.shape, np.float32))
        np.copyto(out, y, casting="unsafe")
        return out

    return step16


# Activations a fused conv applies in place on its output (passes/fusion.py makes them).
ACTIVATIONS = {
    "Relu": lambda y, p: np.maximum(y, 0, out=y),
    "LeakyRelu": lambda y, p: np.maximum(y, y * (p[0] if p else 0.01), out=y),
    "Clip": lambda y, p: np.clip(y, p[0], p[1], out=y),
    "Sigmoid": lambda y, p: np.reciprocal(np.add(np.exp(np.negative(y, out=y), out=y), 1, out=y), out=y),
}


def _finish(ctx, step, half):
    """Wrap a conv step with its fused activation (FusedConv) and float16 handling."""
    act = ctx.attrs.get("activation")
    if act:
        apply, params = ACTIVATIONS[act], [float(v) for v in ctx.attrs.get("activation_params") or []]
        conv = step

        def step(x, w, b=None, *, out):
            return apply(conv(x, w, b, out=out), params)

    return _in_float32(step) if half else step


def _add_bias(out, b):
    if b is not None:
        out += b.reshape((1, -1) + (1,) * (out.ndim - 2))


@kernel("Conv", dtypes=FLOATS, out=True, bind=True, accepts=_is_1x1, priority=20, name="gemm_1x1")
def conv_1x1(ctx):
    """1x1 conv as one GEMM over all pixels (no im2col)."""
    m = ctx.shape(1)[0]

    def step(x, w, b=None, *, out):
        n = x.shape[0]
        np.matmul(w.reshape(m, -1), x.reshape(n, x.shape[1], -1), out=out.reshape(n, m, -1))
        _add_bias(out, b)
        return out

    return _finish(ctx, step, ctx.dtype(0) == np.float16)


def _padded_bytes(x, begin, end, itemsize):
    if not any(begin) and not any(end):
        return 0
    n = int(np.prod(x[:2])) * int(np.prod([s + b + e for s, b, e in zip(x[2:], begin, end)])) * itemsize
    return (n + 63) // 64 * 64


def _depthwise_workspace(ctx):
    x, w, k, begin, end, out, strides, dil = _geometry(ctx)
    item = _compute_dtype(ctx).itemsize
    return _padded_bytes(x, begin, end, item) + int(x[0]) * int(w[0]) * int(np.prod(out)) * item


@kernel("Conv", dtypes=FLOATS, out=True, bind=True, accepts=_is_depthwise, priority=10, name="depthwise",
        workspace=_depthwise_workspace)
def conv_depthwise(ctx):
    """Depthwise conv: one shifted multiply-add per kernel tap over the whole tensor."""
    x, w, k, begin, end, out_sp, strides, dil = _geometry(ctx)
    half = ctx.dtype(0) == np.float16
    dt = _compute_dtype(ctx)
    pad_bytes = _padded_bytes(x, begin, end, dt.itemsize)
    ws = ctx.workspace

    def step(x, w, b=None, *, out):
        if ws is not None:
            xp = pad_spatial(x, begin, end, 0, ws[:pad_bytes] if pad_bytes else None)
            tmp = ws[pad_bytes:pad_bytes + out.nbytes].view(dt).reshape(out.shape)
        else:
            xp, tmp = pad_spatial(x, begin, end, 0), np.empty_like(out)
        out.fill(0)
        wt = w.reshape(w.shape[0], *w.shape[2:])
        for offs, view in window_views(xp, k, strides, dil, out_sp):
            coef = wt[(slice(None),) + offs].reshape((1, -1) + (1,) * len(k))
            np.multiply(view, coef, out=tmp)
            out += tmp
        _add_bias(out, b)
        return out

    return _finish(ctx, step, half)


def _depthwise_2d(ctx):
    why = _is_depthwise(ctx)
    return why or pool.not_2d(ctx)


@kernel("Conv", dtypes=FLOATS, out=True, bind=True, accepts=_depthwise_2d, priority=15, name="depthwise_2d_nb")
def conv_depthwise_2d(ctx):
    """2-D depthwise conv compiled with Numba: per channel, a multiply-add pass per three
    kernel taps over a phase-split copy of the plane (see pool.py), bias first."""
    x, w, k, begin, end, out_sp, strides, dil = _geometry(ctx)
    dt = _compute_dtype(ctx)
    lay = pool.PlaneLayout(x, k, begin, out_sp, strides, dil)
    run = pool._jit()["depthwise_planes"]
    zeros = np.zeros(w[0], dt)

    def step(x, w, b=None, *, out):
        out = out if out is not None else np.empty(tuple(x.shape[:2]) + tuple(out_sp), dt)
        wt = np.ascontiguousarray(w.reshape(w.shape[0], -1), dtype=dt)
        bias = zeros if b is None else np.ascontiguousarray(b, dtype=dt)
        return pool.run_planes(run, x, out, dt, *lay.args(), wt, bias)

    return _finish(ctx, step, ctx.dtype(0) == np.float16)


# im2col works on tiles of output rows so its buffer stays about this size: the tile is
# reused while it is hot in cache, and the arena does not need one huge buffer per conv.
IM2COL_TILE_BYTES = 4 << 20


def _im2col_tiling(x, w, k, out_sp, itemsize):
    """(rows of the first output spatial dim per tile, bytes of the column buffer)."""
    per_row = int(x[0]) * int(w[1]) * int(np.prod(k)) * int(np.prod(out_sp[1:])) * itemsize
    rows = max(1, min(int(out_sp[0]), IM2COL_TILE_BYTES // max(per_row, 1)))
    return rows, rows * per_row


def _im2col_workspace(ctx):
    x, w, k, begin, end, out, strides, dil = _geometry(ctx)
    item = _compute_dtype(ctx).itemsize
    return _padded_bytes(x, begin, end, item) + _im2col_tiling(x, w, k, out, item)[1]


@kernel("Conv", dtypes=FLOATS, out=True, bind=True, workspace=_im2col_workspace, name="im2col_gemm")
def conv_im2col(ctx):
    """General N-d conv: im2col of a tile of output rows into the planned workspace, then
    one GEMM per group and tile, written straight into the output (BLAS takes its stride)."""
    x_shape, w_shape, k, begin, end, out_sp, strides, dil = _geometry(ctx)
    group = int(ctx.attrs.get("group", 1))
    half = ctx.dtype(0) == np.float16
    dt = _compute_dtype(ctx)
    n, cg = x_shape[0], w_shape[1]
    m, mg = w_shape[0], w_shape[0] // group
    kk = cg * int(np.prod(k))
    pix = int(np.prod(out_sp))
    row_pix = int(np.prod(out_sp[1:]))
    rows, cols_bytes = _im2col_tiling(x_shape, w_shape, k, out_sp, dt.itemsize)
    ws = ctx.workspace
    pad_bytes = _padded_bytes(x_shape, begin, end, dt.itemsize)
    nd = len(k)

    def step(x, w, b=None, *, out):
        if ws is not None:
            pad_buf, cols_buf = (ws[:pad_bytes] if pad_bytes else None), ws[pad_bytes:pad_bytes + cols_bytes].view(dt)
        else:
            pad_buf, cols_buf = None, np.empty(cols_bytes // dt.itemsize, dt)
        xp = pad_spatial(x, begin, end, 0, pad_buf)
        view = windows(xp, k, strides, dil, out_sp)  # (N, C, *k, *out)
        out3 = out.reshape(n, m, pix)
        wm = w.reshape(m, kk)
        for r0 in range(0, out_sp[0], rows):
            r1 = min(out_sp[0], r0 + rows)
            tile = (slice(None),) * (2 + nd) + (slice(r0, r1),)
            cols = cols_buf[: n * kk * (r1 - r0) * row_pix].reshape((n, cg) + tuple(k) + (r1 - r0,) + tuple(out_sp[1:]))
            for g in range(group):
                np.copyto(cols, view[(slice(None), slice(g * cg, (g + 1) * cg)) + tile[2:]])
                np.matmul(wm[g * mg:(g + 1) * mg], cols.reshape(n, kk, (r1 - r0) * row_pix),
                          out=out3[:, g * mg:(g + 1) * mg, r0 * row_pix:r1 * row_pix])
        _add_bias(out, b)
        return out

    return _finish(ctx, step, half)


# The same kernels run glassrt::FusedConv (a conv with its activation applied in place).
for _k in [k for k in list(registry.kernels_for("cpu", "", "Conv"))]:
    registry.register(replace(_k, name=_k.name.replace("cpu.Conv", "cpu.FusedConv"), domain="glassrt",
                              op_type="FusedConv"))
