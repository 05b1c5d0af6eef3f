"""Pooling: Max/Average/Lp over strided windows, and the global variants."""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._util import FLOATS, pad_spatial, spatial_pads, window_views, windows

INT8 = [np.int8, np.uint8]


def _geometry(ctx):
    x = ctx.shape(0)
    k = list(ctx.attrs["kernel_shape"])
    begin, end, out, strides, dil = spatial_pads(list(x[2:]), k, ctx.attrs.get("strides"), ctx.attrs.get("dilations"),
                                                 ctx.attrs.get("pads"), ctx.attrs.get("auto_pad", "NOTSET"),
                                                 bool(ctx.attrs.get("ceil_mode", 0)))
    # Ceil mode may need windows that run past the end padding: pad further (never read
    # as a value: -inf for max, excluded from the average's count).
    extra = [max(0, (o - 1) * s + d * (kk - 1) + 1 - (sz + b + e))
             for o, s, d, kk, sz, b, e in zip(out, strides, dil, k, x[2:], begin, end)]
    return x, k, begin, end, extra, out, strides, dil


def _pad_workspace(ctx):
    x, k, begin, end, extra, out, strides, dil = _geometry(ctx)
    if not any(begin) and not any(end) and not any(extra):
        return 0
    full = [s + b + e + x_ for s, b, e, x_ in zip(x[2:], begin, end, extra)]
    return int(np.prod(x[:2])) * int(np.prod(full)) * np.dtype(ctx.dtype(0)).itemsize


def _padded(x, begin, end, extra, value, ws):
    return pad_spatial(x, begin, [e + x_ for e, x_ in zip(end, extra)], value, ws)


@kernel("MaxPool", dtypes=list(FLOATS) + INT8, out=True, bind=True, workspace=_pad_workspace, multi=True)
def max_pool(ctx):
    """Running maximum over one strided view per kernel tap."""
    x_shape, k, begin, end, extra, out_sp, strides, dil = _geometry(ctx)
    ws = ctx.workspace
    want_indices = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])
    storage_order = int(ctx.attrs.get("storage_order", 0))
    dt = np.dtype(ctx.dtype(0))
    low = -np.inf if dt.kind == "f" else np.iinfo(dt).min

    def step(x, *, out):
        y = out[0] if out[0] is not None else np.empty(tuple(x.shape[:2]) + tuple(out_sp), x.dtype)
        xp = _padded(x, begin, end, extra, low, ws)
        first = True
        for _, view in window_views(xp, k, strides, dil, out_sp):
            if first:
                np.copyto(y, view)
                first = False
            else:
                np.maximum(y, view, out=y)
        if not want_indices:
            return (y, None)
        return (y, _indices(x, xp, k, begin, strides, dil, out_sp, storage_order, out[1]))

    return step


def _indices(x, xp, k, begin, strides, dil, out_sp, storage_order, buf):
    """Flat index (into x) of each window's maximum, first occurrence on ties."""
    view = windows(xp, k, strides, dil, out_sp)  # (N, C, *k, *out)
    n, c = x.shape[:2]
    nd = len(k)
    flat = view.reshape(n, c, int(np.prod(k)), *out_sp)
    arg = np.argmax(flat, axis=2)  # offset within the window
    offs = np.unravel_index(arg, k)
    grids = np.meshgrid(*[np.arange(o) for o in out_sp], indexing="ij")
    coords = [grids[i] * strides[i] + offs[i] * dil[i] - begin[i] for i in range(nd)]
    spatial = x.shape[2:]
    if storage_order == 1:  # column-major
        lin = np.zeros_like(coords[0])
        mult = 1
        for i in range(nd):
            lin = lin + coords[i] * mult
            mult *= spatial[i]
    else:
        lin = np.ravel_multi_index(tuple(coords), spatial, mode="clip")
    base = (np.arange(n)[:, None] * c + np.arange(c)[None, :]) * int(np.prod(spatial))
    res = (lin + base.reshape((n, c) + (1,) * nd)).astype(np.int64)
    if buf is not None:
        np.copyto(buf, res)
        return buf
    return res


@kernel("AveragePool", dtypes=FLOATS, out=True, bind=True, workspace=_pad_workspace)
def average_pool(ctx):
    """Sum over one strided view per kernel tap, then divide by each window's count."""
    x_shape, k, begin, end, extra, out_sp, strides, dil = _geometry(ctx)
    include_pad = bool(ctx.attrs.get("count_include_pad", 0))
    ws = ctx.workspace
    dt = np.dtype(ctx.dtype(0))
    # The divisor per output position, computed once per plan by pooling a ones mask.
    mask = np.zeros([s + b + e + x_ for s, b, e, x_ in zip(x_shape[2:], begin, end, extra)], np.float64)
    inner = tuple(slice(b, b + s) for b, s in zip(begin, x_shape[2:]))
    if include_pad:  # padding counts, the ceil-mode overhang does not
        mask[tuple(slice(0, s + b + e) for s, b, e in zip(x_shape[2:], begin, end))] = 1
    else:
        mask[inner] = 1
    counts = np.zeros(out_sp, np.float64)
    for _, view in window_views(mask[None, None], k, strides, dil, out_sp):
        counts += view[0, 0]
    inv = (1.0 / np.maximum(counts, 1)).astype(dt)

    def step(x, *, out):
        xp = _padded(x, begin, end, extra, 0, ws)
        out.fill(0)
        for _, view in window_views(xp, k, strides, dil, out_sp):
            out += view
        out *= inv
        return out

    return step


@kernel("LpPool", dtypes=FLOATS, bind=True)
def lp_pool(ctx):
    x_shape, k, begin, end, extra, out_sp, strides, dil = _geometry(ctx)
    p = float(ctx.attrs.get("p", 2))

    def step(x):
        xp = _padded(np.abs(x).astype(np.float64), begin, end, extra, 0, None)
        acc = np.zeros(tuple(x.shape[:2]) + tuple(out_sp), np.float64)
        for _, view in window_views(xp, k, strides, dil, out_sp):
            acc += view ** p
        return (acc ** (1.0 / p)).astype(x.dtype)

    return step


@kernel("GlobalAveragePool", dtypes=FLOATS, out=True)
def global_average_pool(x, *, out=None):
    return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True, out=out)


@kernel("GlobalMaxPool", dtypes=FLOATS, out=True)
def global_max_pool(x, *, out=None):
    return np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True, out=out)


@kernel("GlobalLpPool", dtypes=FLOATS)
def global_lp_pool(x, *, p=2):
    return (np.sum(np.abs(x) ** p, axis=tuple(range(2, x.ndim)), keepdims=True) ** (1.0 / p)).astype(x.dtype)
