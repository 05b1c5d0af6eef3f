"""Pooling: Max/Average/Lp over strided windows, and the global variants."""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._jit import compiled, jit, numba_missing
from ._util import FLOATS, as_out, pad_spatial, spatial_pads, window_views, windows

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


@kernel("LpPool", dtypes=FLOATS, out=True, bind=True)
def lp_pool(ctx):
    """Accumulates in float64 (an output-sized temporary), rounded once into the output."""
    x_shape, k, begin, end, extra, out_sp, strides, dil = _geometry(ctx)
    p = float(ctx.attrs.get("p", 2))

    def step(x, *, out=None):
        xp = _padded(np.abs(x).astype(np.float64), begin, end, extra, 0, None)
        acc = np.zeros(tuple(x.shape[:2]) + tuple(out_sp), np.float64)
        for _, view in window_views(xp, k, strides, dil, out_sp):
            acc += view ** p
        return as_out((acc ** (1.0 / p)).astype(x.dtype), out)

    return step


@kernel("GlobalAveragePool", dtypes=FLOATS, out=True)
def global_average_pool(x, *, out=None):
    return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True, out=out)


@kernel("GlobalMaxPool", dtypes=FLOATS, out=True)
def global_max_pool(x, *, out=None):
    return np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True, out=out)


@kernel("GlobalLpPool", dtypes=FLOATS, out=True)
def global_lp_pool(x, *, out=None, p=2):
    total = np.sum(np.abs(x) ** p, axis=tuple(range(2, x.ndim)), keepdims=True)
    return as_out((total ** (1.0 / p)).astype(x.dtype), out)


# ------------------------------------------------------------------ compiled 2-D kernels
#
# Numba kernels for 2-D (NCHW) MaxPool and AveragePool here, and depthwise Conv (conv.py).
# Each input plane is first copied into a scratch buffer split by stride phase (a padded
# space-to-depth): phase (rh, rw) holds padded pixel (a*sh + rh, b*sw + rw) at (a, b), in
# rows of wq. Tap (i, j) of output (oh, ow) then lies in phase ((i*dh) % sh, (j*dw) % sw) at
# (oh + (i*dh) // sh, ow + (j*dw) // sw), so for each tap the outputs of a whole plane read
# one contiguous run of the buffer (rows of wq: the wq - OW extra columns are computed and
# never stored). Every tap is thus one long vectorizable loop, whatever the pads, strides,
# dilations or ceil mode; pad cells hold `fill` (lowest value for max, 0 for sums).

class PlaneLayout:
    """Bind-time geometry of the phase-split scratch plane of one 2-D window op."""

    def __init__(self, x_shape, k, begin, out_sp, strides, dil):
        (h, w), (kh, kw), (pt, pl), (oh, ow), (sh, sw), (dh, dw) = x_shape[2:], k, begin, out_sp, strides, dil
        self.sw = sw
        self.wq = wq = ow + (kw - 1) * dw // sw
        hq = oh + (kh - 1) * dh // sh + 1  # a spare row: the last row's extra columns read into it
        self.n = -(-oh * wq // 8) * 8  # outputs computed per tap, rounded up to whole vectors
        self.size = sh * sw * hq * wq + 8
        # One block copy per phase: (first cell, first source element in the flat plane,
        # columns, rows); rows step by wq in the buffer, sh * W in x; columns by sw in x.
        runs = []
        for rh in range(sh):
            a0, a1 = max(0, -(-(pt - rh) // sh)), min(hq, (h - 1 + pt - rh) // sh + 1)
            for rw in range(sw):
                lo, hi = max(0, -(-(pl - rw) // sw)), min(wq, (w - 1 + pl - rw) // sw + 1)
                if a1 > a0 and hi > lo:
                    runs.append(((rh * sw + rw) * hq * wq + a0 * wq + lo, (a0 * sh + rh - pt) * w + lo * sw + rw - pl,
                                 hi - lo, a1 - a0))
        self.runs = np.array(runs, np.int64).reshape(-1, 4)
        self.row_step = sh * w
        # Where each tap (row-major over the kernel) starts reading.
        self.taps = np.array([((i * dh % sh) * sw + j * dw % sw) * hq * wq + (i * dh // sh) * wq + j * dw // sw
                              for i in range(kh) for j in range(kw)], np.int64)

    def args(self):
        return self.runs, self.row_step, self.sw, self.taps, self.wq, self.n, self.size


def run_planes(fn, x, y, dtype, *args):
    """fn(x planes, y planes, *args) on (N*C, H, W) views in `dtype` (float16 runs in
    float32); writes y, allocated when None, and returns it."""
    xc = np.ascontiguousarray(x, dtype=dtype)
    yc = y if y.dtype == dtype and y.flags.c_contiguous else np.empty(y.shape, dtype)
    fn(xc.reshape((-1,) + xc.shape[2:]), yc.reshape((-1,) + yc.shape[2:]), *args)
    if yc is not y:
        np.copyto(y, yc, casting="unsafe")
    return y


def not_2d(ctx):
    """Why the compiled 2-D kernels cannot run this node, or None."""
    x = ctx.shape(0)
    if x is None or len(x) != 4:
        return f"not 2-D (input rank {None if x is None else len(x)}, the compiled kernels take NCHW)"
    if any(int(p) < 0 for p in ctx.attrs.get("pads") or []):
        return "negative pads"
    return numba_missing()


# The compiled functions are compiled on first use (_jit.py). Single-threaded on purpose:
# parallel=True (prange over planes) halved the times on an idle 2-core machine but made
# them 10-100x slower while another process held a core, since each call then waits for a
# descheduled worker thread.
# Helpers are inlined: a call that takes array views costs about 50 ns, too much per plane.
# Arrays travel flat with offsets, and loops index slices from 0 (no negative-index checks).

@jit(inline="always", fastmath=False)
def _load_plane(xf, base, runs, row_step, sw, wq, buf):
    """Copy the plane at xf[base:] into the phase-split buffer (pad cells keep their fill)."""
    for r in range(runs.shape[0]):
        d, s, cols = runs[r, 0], base + runs[r, 1], runs[r, 2]
        for _ in range(runs[r, 3]):
            dst, src = buf[d:], xf[s:]
            if sw == 1:
                for t in range(cols):
                    dst[t] = src[t]
            else:
                for t in range(cols):
                    dst[t] = src[t * sw]
            d += wq
            s += row_step


@jit(inline="always", fastmath=False)
def _store(acc, wq, yf, base, oh, ow):
    """yf[base:] as (oh, ow) = the first ow columns of each wq-wide row of acc."""
    for i in range(oh):
        a, yr = acc[i * wq:], yf[base + i * ow:]
        for j in range(ow):
            yr[j] = a[j]


@jit(inline="always", fastmath=False)
def _weighted_sum(buf, taps, w, acc, n):
    """acc += sum over taps t of w[t] * (the run of buf that tap reads), three taps a pass."""
    t = 0
    while t + 3 <= taps.shape[0]:
        a, b, c = buf[taps[t]:], buf[taps[t + 1]:], buf[taps[t + 2]:]
        wa, wb, wc = w[t], w[t + 1], w[t + 2]
        for q in range(n):
            acc[q] += wa * a[q] + wb * b[q] + wc * c[q]
        t += 3
    for t in range(t, taps.shape[0]):
        a, wa = buf[taps[t]:], w[t]
        for q in range(n):
            acc[q] += wa * a[q]


@jit(fastmath=False)
def _max_planes(x, y, runs, row_step, sw, taps, wq, n, size, low):
    (planes, h, w), (_, oh, ow) = x.shape, y.shape
    xf, yf = x.ravel(), y.ravel()
    buf, acc = np.full(size, low, x.dtype), np.empty(n, x.dtype)
    last = taps.shape[0] - 1
    for p in range(planes):
        _load_plane(xf, p * h * w, runs, row_step, sw, wq, buf)
        acc[:] = low
        for t in range(0, last + 1, 3):  # three taps a pass (repeating the last: max is idempotent)
            a, b, c = buf[taps[t]:], buf[taps[min(t + 1, last)]:], buf[taps[min(t + 2, last)]:]
            for q in range(n):
                m = acc[q]
                m = a[q] if a[q] > m else m
                m = b[q] if b[q] > m else m
                acc[q] = c[q] if c[q] > m else m
        _store(acc, wq, yf, p * oh * ow, oh, ow)


@jit(fastmath=False)
def _avg_planes(x, y, runs, row_step, sw, taps, wq, n, size, inv):
    (planes, h, w), (_, oh, ow) = x.shape, y.shape
    xf, yf = x.ravel(), y.ravel()
    buf, acc, ones = np.zeros(size, x.dtype), np.empty(n, x.dtype), np.ones(taps.shape[0], x.dtype)
    for p in range(planes):
        _load_plane(xf, p * h * w, runs, row_step, sw, wq, buf)
        acc[:] = 0
        _weighted_sum(buf, taps, ones, acc, n)
        for i in range(oh):
            a, s, yr = acc[i * wq:], inv[i], yf[(p * oh + i) * ow:]
            for j in range(ow):
                yr[j] = a[j] * s[j]


@jit(fastmath=False)
def _depthwise_planes(x, y, runs, row_step, sw, taps, wq, n, size, w, b):
    """Plane p is channel p % C: w (C, taps), b (C,)."""
    (planes, h, ww), (_, oh, ow) = x.shape, y.shape
    xf, yf = x.ravel(), y.ravel()
    buf, acc = np.zeros(size, x.dtype), np.empty(n, x.dtype)
    for p in range(planes):
        c = p % w.shape[0]
        _load_plane(xf, p * h * ww, runs, row_step, sw, wq, buf)
        acc[:] = b[c]
        _weighted_sum(buf, taps, w[c], acc, n)
        _store(acc, wq, yf, p * oh * ow, oh, ow)


@jit(fastmath=False)
def _max_indices(x, y, idx, low, kh, kw, sh, sw, dh, dw, pt, pl, col_major):
    """Direct MaxPool with the flat index of each maximum (first in row-major window order)."""
    planes, h, w = x.shape
    for p in range(planes):
        for oh in range(y.shape[1]):
            for ow in range(y.shape[2]):
                best, m = -1, low
                for i in range(kh):
                    r = oh * sh - pt + i * dh
                    if 0 <= r < h:
                        for j in range(kw):
                            s = ow * sw - pl + j * dw
                            if 0 <= s < w and (best < 0 or x[p, r, s] > m):
                                best, m = (s * h + r if col_major else r * w + s), x[p, r, s]
                y[p, oh, ow] = m
                idx[p, oh, ow] = p * h * w + best


def _compute_dtype(dt):
    return np.dtype(np.float32) if dt == np.float16 else np.dtype(dt)


# int8/uint8 stay with the NumPy kernel: compiled, they measured no faster than np.maximum.
@kernel("MaxPool", dtypes=FLOATS, out=True, bind=True, multi=True, accepts=not_2d, priority=10,
        name="max_pool_2d_nb")
def max_pool_2d(ctx):
    """2-D MaxPool compiled with Numba: a pass per three kernel taps over a phase-split
    copy of each plane; with Indices, a direct loop over each window."""
    x_shape, k, begin, end, extra, out_sp, strides, dil = _geometry(ctx)
    dt = _compute_dtype(ctx.dtype(0))
    low = dt.type(-np.inf)
    lay = PlaneLayout(x_shape, k, begin, out_sp, strides, dil)
    want_indices = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])
    geo = (*k, *strides, *dil, *begin, int(ctx.attrs.get("storage_order", 0)) == 1)
    max_planes, max_indices = compiled(_max_planes), compiled(_max_indices)

    def step(x, *, out):
        shape = tuple(x.shape[:2]) + tuple(out_sp)
        y = out[0] if out[0] is not None else np.empty(shape, x.dtype)
        if not want_indices:
            return run_planes(max_planes, x, y, dt, *lay.args(), low), None
        idx = out[1] if out[1] is not None else np.empty(shape, np.int64)
        return run_planes(lambda xp, yp: max_indices(xp, yp, idx.reshape(yp.shape), low, *geo), x, y, dt), idx

    return step


def _window_counts(size, k, begin, end, n_out, stride, dil, include_pad):
    """Cells of each window along one axis that the average divides by."""
    pos = np.arange(n_out)[:, None] * stride - begin + np.arange(k)[None, :] * dil
    lo, hi = (-begin, size + end) if include_pad else (0, size)  # the ceil-mode overhang never counts
    return ((pos >= lo) & (pos < hi)).sum(1)


@kernel("AveragePool", dtypes=FLOATS, out=True, bind=True, accepts=not_2d, priority=10, name="average_pool_2d_nb")
def average_pool_2d(ctx):
    """2-D AveragePool compiled with Numba: a sum over a phase-split copy of each plane,
    three kernel taps a pass, times each window's precomputed 1 / count."""
    x_shape, k, begin, end, extra, out_sp, strides, dil = _geometry(ctx)
    dt = _compute_dtype(ctx.dtype(0))
    include_pad = bool(ctx.attrs.get("count_include_pad", 0))
    counts = [_window_counts(*a, include_pad) for a in zip(x_shape[2:], k, begin, end, out_sp, strides, dil)]
    inv = (1.0 / np.maximum(np.outer(*counts), 1)).astype(dt)
    lay = PlaneLayout(x_shape, k, begin, out_sp, strides, dil)
    avg_planes = compiled(_avg_planes)

    def step(x, *, out):
        y = out if out is not None else np.empty(tuple(x.shape[:2]) + tuple(out_sp), x.dtype)
        return run_planes(avg_planes, x, y, dt, *lay.args(), inv)

    return step
