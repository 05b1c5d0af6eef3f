"""Vision ops: Resize/Upsample, GridSample/AffineGrid, ConvTranspose, DeformConv, RoiAlign, NMS.

Resize is separable: per resized axis it gathers a few source taps and sums them with
weights. The per-axis index/weight maps depend only on the input shape and the small
scales/sizes/roi inputs, so they are built once (at bind time when those are known,
else on first sight of new values) and a run is gathers and multiply-adds.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ...ops.meta.vision import resize_geometry
from ..registry import kernel
from ._util import FLOATS, FLOATS_BF16, NUMERIC

BOOL = np.dtype(np.bool_)
RESIZE_DTYPES = NUMERIC | {BOOL}


def _compute_dtype(dt):
    """Interpolation arithmetic type: float64 where float32 would lose the input's precision."""
    dt = np.dtype(dt)
    if dt == np.float64 or (dt.kind in "iu" and dt.itemsize >= 4):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _cast_result(acc, dt):
    """Float result to the output dtype (integers round half to even and saturate, like the spec)."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.clip(np.rint(acc), info.min, info.max).astype(dt)
    return acc.astype(dt, copy=False)


# ---------------------------------------------------------------- Resize / Upsample: maps


def _source_coords(ctm, out_len, in_len, scale, roi):
    """Source coordinate of every output index along one axis (and the extrapolated ones)."""
    y = np.arange(out_len, dtype=np.float64)
    out_w = scale * in_len  # the spec's length_resized: not rounded when scales are given
    extrap = None
    if ctm == "align_corners":
        x = np.zeros(out_len) if out_w == 1 else y * (in_len - 1) / (out_w - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        lo, hi = roi
        if out_w == 1:
            x = np.full(out_len, (hi - lo) * (in_len - 1) / 2)
        else:
            x = y * (hi - lo) * (in_len - 1) / (out_w - 1)
        x = x + lo * (in_len - 1)
        extrap = (x < 0) | (x > in_len - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_w)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")
    return x, extrap


def _cubic(r, a):
    """Keys cubic weights of taps -1, 0, 1, 2 around the source point at fraction r."""
    s, t = r + 1, 1 - r
    return np.stack([((a * s - 5 * a) * s + 8 * a) * s - 4 * a,
                     ((a + 2) * r - (a + 3)) * r * r + 1,
                     ((a + 2) * t - (a + 3)) * t * t + 1,
                     ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a], axis=1)


def _keys(x, a):
    x = np.abs(x)
    x2, x3 = x * x, x * x * x
    return np.where(x <= 1, (a + 2) * x3 - (a + 3) * x2 + 1,
                    np.where(x < 2, a * x3 - 5 * a * x2 + 8 * a * x - 4 * a, 0.0))


def _axis_map(p, in_len, out_len, scale, roi):
    """(indices (out, taps), weights (out, taps) or None for nearest, extrapolated mask or None)."""
    x, extrap = _source_coords(p["ctm"], out_len, in_len, scale, roi)
    mode = p["mode"]
    if mode == "nearest":
        nm = p["nearest_mode"]
        if nm == "simple":  # Upsample / Resize-10, as onnxruntime does: floor up, ceil down
            nm = "ceil" if scale < 1 else "floor"
        i = {"round_prefer_floor": lambda: np.ceil(x - 0.5), "round_prefer_ceil": lambda: np.floor(x + 0.5),
             "floor": lambda: np.floor(x), "ceil": lambda: np.ceil(x)}.get(nm)
        if i is None:
            raise ValueError(f"unknown nearest_mode {nm!r}")
        return np.clip(i(), 0, in_len - 1).astype(np.intp)[:, None], None, extrap
    # The left tap i0 is taken strictly below x (an integral x gets ratio 1), as the reference does.
    i0 = np.ceil(x) - 1
    r = x - i0
    if p["antialias"]:
        s = min(scale, 1.0)  # a widened, normalized filter only when downsampling
        if mode == "linear":
            start = int(np.floor(-1 / s) + 1)
            offs = np.arange(start, 2 - start)
            w = np.clip(1 - np.abs((offs[None, :] - r[:, None]) * s), 0, 1)
        else:
            start = int(np.floor(-2 / s) + 1)
            offs = np.arange(start, 2 - start)
            w = _keys(s * (offs[None, :] - r[:, None]), p["cubic_coeff_a"])
        w = w / w.sum(axis=1, keepdims=True)
    elif mode == "linear":
        offs, w = np.arange(2), np.stack([1 - r, r], axis=1)
    elif mode == "cubic":
        offs, w = np.arange(-1, 3), _cubic(r, p["cubic_coeff_a"])
    else:
        raise ValueError(f"unknown Resize mode {mode!r}")
    idx = i0.astype(np.int64)[:, None] + offs[None, :]
    if p["exclude_outside"]:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1).astype(np.intp), w, extrap


class _ResizePlan:
    """Everything a run needs for one input shape and one set of scales/sizes/roi."""

    def __init__(self, p, in_shape, dtype, roi, scales, sizes):
        r = len(in_shape)
        if scales is not None and np.asarray(scales).size == 0:
            scales = None
        if sizes is not None and np.asarray(sizes).size == 0:
            sizes = None
        if (scales is None) == (sizes is None):
            raise ValueError("exactly one of scales and sizes must be given")
        axes, scale, out = resize_geometry(in_shape, scales, sizes, p["axes"], p["policy"])
        self.out_shape = tuple(out)
        self.dtype = np.dtype(dtype)
        self.cdt = _compute_dtype(dtype)
        self.extrapolation_value = p["extrapolation_value"]
        tf = p["ctm"] == "tf_crop_and_resize"
        full_roi = [(0.0, 1.0)] * r
        if tf:
            if roi is None or np.asarray(roi).size == 0:
                raise ValueError("coordinate_transformation_mode tf_crop_and_resize needs roi")
            roi = [float(v) for v in np.asarray(roi).reshape(-1)]
            if len(roi) != 2 * len(axes):
                raise ValueError(f"roi has {len(roi)} entries, expected {2 * len(axes)}")
            for k, a in enumerate(axes):
                full_roi[a] = (roi[k], roi[len(axes) + k])
        maps = []
        for a in range(r):
            if (math.isclose(scale[a], 1.0) and out[a] == in_shape[a]
                    and (not tf or (math.isclose(full_roi[a][0], 0.0) and math.isclose(full_roi[a][1], 1.0)))):
                continue  # identity along this axis
            if out[a] == 0:
                maps = []  # an empty result
                break
            if in_shape[a] == 0:
                raise ValueError(f"cannot resize axis {a} of length 0 to length {out[a]}")
            maps.append((a, *_axis_map(p, in_shape[a], out[a], scale[a], full_roi[a])))
        self.empty = int(np.prod(out)) == 0
        self.identity = not maps and not self.empty
        self.nearest = p["mode"] == "nearest"
        # Shrinking axes first: later passes then touch fewer elements. When both of the last
        # two axes change (images), they go last, fused: one pass, no intermediate tensor.
        fused = len(maps) >= 2 and maps[-1][0] == r - 1 and maps[-2][0] == r - 2
        tail = maps[-2:] if fused else []
        maps = sorted(maps[:-2] if fused else maps, key=lambda m: len(m[1]) / in_shape[m[0]])
        shape = list(in_shape)
        self.passes = []
        for a, idx, w, ex in maps:
            lead = int(np.prod(shape[:a], dtype=np.int64))
            trail = int(np.prod(shape[a + 1:], dtype=np.int64))
            self.passes.append(((lead, shape[a], trail), (lead, len(idx), trail), [self._axis(idx, w, ex)]))
            shape[a] = len(idx)
        if fused:
            (_, ih, wh, exh), (_, iw, ww, exw) = tail
            lead = int(np.prod(shape[:-2], dtype=np.int64))
            self.passes.append(((lead, shape[-2], shape[-1]), (lead, len(ih), len(iw)),
                                [self._axis(ih, wh, exh), self._axis(iw, ww, exw)]))

    def _axis(self, idx, w, ex):
        idx_t = np.ascontiguousarray(idx.T)  # (taps, out): one contiguous row per tap
        w_t = None if self.nearest else np.ascontiguousarray(w.T, dtype=self.cdt)
        fill = np.flatnonzero(ex) if ex is not None and ex.any() else None
        return idx_t, w_t, fill

    def run(self, x, out):
        if out is None:
            out = np.empty(self.out_shape, self.dtype)
        if self.empty:
            return out
        if self.identity:
            np.copyto(out, x)
            return out
        nb = _jit()
        fv = self.extrapolation_value
        if self.nearest:
            # A pure gather: move the raw bits, so every dtype takes the same compiled path.
            bits = _BITS.get(self.dtype.itemsize)
            if bits is None or self.dtype.hasobject:
                np.copyto(out, self._nearest_numpy(x))
                return out
            cur = np.ascontiguousarray(x).view(bits)
            cdt = bits
            fv = np.asarray(fv).astype(self.dtype).view(bits)
        else:
            cur, cdt = (x if x.dtype == self.cdt else x.astype(self.cdt)), self.cdt
        last = len(self.passes) - 1
        direct = False
        for k, (src_shape, dst_shape, axes) in enumerate(self.passes):
            src = cur.reshape(src_shape)
            direct = k == last and (self.nearest or out.dtype == cdt) and out.flags.c_contiguous
            dst = out.view(cdt).reshape(dst_shape) if direct else np.empty(dst_shape, cdt)
            (idx, w, fill), *rest = axes
            if rest:  # the fused last two axes
                iw, ww, fill_w = rest[0]
                if w is None:
                    nb["gather_2d"](src, idx[0], iw[0], dst)
                else:
                    nb["interp_2d"](src, idx, w, iw, ww, dst)
                if fill_w is not None:
                    dst[:, :, fill_w] = fv
            elif src_shape[2] == 1:
                src2, dst2 = src.reshape(src_shape[:2]), dst.reshape(dst_shape[:2])
                nb["gather_last"](src2, idx[0], dst2) if w is None else nb["interp_last"](src2, idx, w, dst2)
            else:
                nb["gather_inner"](src, idx[0], dst) if w is None else nb["interp_inner"](src, idx, w, dst)
            if fill is not None:
                dst[:, fill, :] = fv
            cur = dst
        if not direct:
            res = cur.view(self.dtype) if self.nearest else _cast_result(cur, self.dtype)
            np.copyto(out, res.reshape(self.out_shape))
        return out

    def _nearest_numpy(self, x):
        cur = x
        for src_shape, _, axes in self.passes:
            cur = cur.reshape(src_shape)
            for ax, (idx, _, fill) in zip((1, 2), axes):
                cur = np.take(cur, idx[0], axis=ax)
                if fill is not None:
                    cur[(slice(None),) * ax + (fill,)] = self.extrapolation_value
        return cur.reshape(self.out_shape)


_BITS = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
_NB = {}


def _jit():
    """The compiled 1-D resample passes (Numba, built on first use, cached on disk)."""
    if _NB:
        return _NB
    import numba
    
    opts = dict(cache=True, nogil=True)

    @numba.njit(**opts)
    def interp_inner(src, idx, w, dst):  # (P, I, Q) -> (P, O, Q); idx, w: (taps, O)
        taps, n_out = idx.shape
        q_len = src.shape[2]
        for p in range(src.shape[0]):
            for o in range(n_out):
                i, a = idx[0, o], w[0, o]
                for q in range(q_len):
                    dst[p, o, q] = a * src[p, i, q]
                for k in range(1, taps):
                    i, a = idx[k, o], w[k, o]
                    for q in range(q_len):
                        dst[p, o, q] += a * src[p, i, q]

    @numba.njit(**opts)
    def interp_last(src, idx, w, dst):  # (P, I) -> (P, O)
        taps, n_out = idx.shape
        for p in range(src.shape[0]):
            s, d = src[p], dst[p]
            for o in range(n_out):
                d[o] = w[0, o] * s[idx[0, o]]
            for k in range(1, taps):
                for o in range(n_out):
                    d[o] += w[k, o] * s[idx[k, o]]

    @numba.njit(**opts)
    def gather_inner(src, idx, dst):
        for p in range(src.shape[0]):
            for o in range(idx.shape[0]):
                dst[p, o, :] = src[p, idx[o], :]

    @numba.njit(**opts)
    def gather_last(src, idx, dst):
        for p in range(src.shape[0]):
            s, d = src[p], dst[p]
            for o in range(idx.shape[0]):
                d[o] = s[idx[o]]

    @numba.njit(**opts)
    def interp_2d(src, ih, wh, iw, ww, dst):  # (P, H, W) -> (P, OH, OW), one input-width row at a time
        th, n_oh = ih.shape
        tw, n_ow = iw.shape
        width = src.shape[2]
        row = np.empty(width, dst.dtype)
        for p in range(src.shape[0]):
            for o in range(n_oh):
                i, a = ih[0, o], wh[0, o]
                for q in range(width):
                    row[q] = a * src[p, i, q]
                for k in range(1, th):
                    i, a = ih[k, o], wh[k, o]
                    for q in range(width):
                        row[q] += a * src[p, i, q]
                d = dst[p, o]
                for q in range(n_ow):
                    d[q] = ww[0, q] * row[iw[0, q]]
                for k in range(1, tw):
                    for q in range(n_ow):
                        d[q] += ww[k, q] * row[iw[k, q]]

    @numba.njit(**opts)
    def gather_2d(src, ih, iw, dst):
        for p in range(src.shape[0]):
            for o in range(ih.shape[0]):
                d = dst[p, o]
                if o > 0 and ih[o] == ih[o - 1]:
                    d[:] = dst[p, o - 1]  # a repeated source row: copy the row just made
                else:
                    s = src[p, ih[o]]
                    for q in range(iw.shape[0]):
                        d[q] = s[iw[q]]

    _NB.update(interp_inner=interp_inner, interp_last=interp_last, gather_inner=gather_inner,
               gather_last=gather_last, interp_2d=interp_2d, gather_2d=gather_2d)
    return _NB


def _resize_step(params, in_type_shape, dtype, consts, unpack):
    """A step that looks up (or builds) the plan for each distinct input shape and scales/sizes/roi."""
    cache = {}

    def plan_for(x_shape, x_dtype, roi, scales, sizes):
        key = (x_shape, x_dtype, _key(roi), _key(scales), _key(sizes))
        plan = cache.get(key)
        if plan is None:
            if len(cache) > 16:
                cache.clear()
            plan = cache[key] = _ResizePlan(params, x_shape, x_dtype, roi, scales, sizes)
        return plan

    if in_type_shape is not None and all(isinstance(d, int) for d in in_type_shape) and consts is not None:
        try:  # everything known now: build the maps once, at bind time
            plan_for(tuple(in_type_shape), np.dtype(dtype), *consts)
        except ValueError:
            pass

    def step(x, *rest, out=None):
        roi, scales, sizes = unpack(rest)
        if params["mode"] != "nearest" and x.dtype == BOOL:
            raise ValueError(f"mode {params['mode']!r} cannot interpolate bool tensors")
        return plan_for(x.shape, x.dtype, roi, scales, sizes).run(x, out)

    return step


def _key(a):
    return None if a is None else (a.dtype.str, a.shape, a.tobytes())


def _resize_accepts(ctx):
    if ctx.attrs.get("mode", "nearest") != "nearest" and ctx.dtype(0) == BOOL:
        return "bool input needs mode=nearest"
    return None


@kernel("Resize", dtypes=RESIZE_DTYPES, versions=(10, None), out=True, bind=True, accepts=_resize_accepts)
def resize(ctx):
    """Separable resize from per-axis index/weight maps built once per shape and scales/sizes."""
    a = ctx.attrs
    v10 = ctx.since_version < 11
    params = dict(
        mode=a.get("mode", "nearest"),
        # Resize-10 is Upsample's rule: asymmetric coordinates, nearest floors up and ceils down.
        ctm="asymmetric" if v10 else a.get("coordinate_transformation_mode", "half_pixel"),
        nearest_mode="simple" if v10 else a.get("nearest_mode", "round_prefer_floor"),
        cubic_coeff_a=float(a.get("cubic_coeff_a", -0.75)),
        exclude_outside=bool(a.get("exclude_outside", 0)),
        extrapolation_value=float(a.get("extrapolation_value", 0.0)),
        antialias=bool(a.get("antialias", 0)),
        axes=a.get("axes"),
        policy=a.get("keep_aspect_ratio_policy", "stretch"),
    )
    if v10:
        def unpack(rest):
            return None, rest[0], None
        consts = [None, ctx.const(1), None] if ctx.const(1) is not None else None
    else:
        def unpack(rest):
            rest = list(rest) + [None] * (3 - len(rest))
            return rest[0], rest[1], rest[2]
        vals = [ctx.const(i) for i in (1, 2, 3)]
        known = all(v is not None or not ctx.has(i) for v, i in zip(vals, (1, 2, 3)))
        consts = vals if known else None
    return _resize_step(params, ctx.shape(0), ctx.dtype(0), consts, unpack)


@kernel("Upsample", dtypes=RESIZE_DTYPES, versions=(7, 9), out=True, bind=True, accepts=_resize_accepts)
def upsample(ctx):
    """Upsample-7/9: Resize with asymmetric coordinates (scales as attribute in 7, input in 9)."""
    mode = ctx.attrs.get("mode", "nearest")
    params = dict(mode="linear" if mode == "bilinear" else mode, ctm="asymmetric", nearest_mode="simple",
                  cubic_coeff_a=-0.75, exclude_outside=False, extrapolation_value=0.0, antialias=False,
                  axes=None, policy="stretch")
    if ctx.since_version < 9:
        scales = np.asarray(ctx.attrs["scales"], np.float32)
        return _resize_step(params, ctx.shape(0), ctx.dtype(0), [None, scales, None],
                            lambda rest: (None, scales, None))
    consts = [None, ctx.const(1), None] if ctx.const(1) is not None else None
    return _resize_step(params, ctx.shape(0), ctx.dtype(0), consts, lambda rest: (None, rest[0], None))


# ---------------------------------------------------------------- GridSample, AffineGrid


def _reflect(x, lo, hi):
    """Reflect coordinates into [lo, hi] by the near border, repeatedly (the spec's rule)."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    d = np.where(below, lo - x, np.where(above, x - hi, 0))
    n = np.floor(d / rng)
    r = d - n * rng
    even = n % 2 == 0
    y = np.where(below, np.where(even, lo + r, hi - r), np.where(even, hi - r, lo + r))
    return np.where(below | above, y, x).astype(x.dtype, copy=False)


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    if x.ndim < 3 or grid.ndim != x.ndim or grid.shape[-1] != x.ndim - 2 or grid.shape[0] != x.shape[0]:
        raise ValueError(f"grid {list(grid.shape)} does not fit input {list(x.shape)}: expected "
                         f"(N, *out_spatial, {x.ndim - 2})")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"unknown GridSample mode {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"unknown padding_mode {padding_mode!r}")
    n, c = x.shape[:2]
    dims = x.shape[2:]
    nd = len(dims)
    out_sp = grid.shape[1:-1]
    cdt = np.float64 if np.float64 in (x.dtype, grid.dtype) else np.float32
    g = grid.reshape(n, -1, nd).astype(cdt, copy=False)
    y = np.zeros((n, c, g.shape[1]), cdt)
    if y.size == 0:
        return y.reshape((n, c) + tuple(out_sp)).astype(x.dtype)
    # Per spatial dim: the source coordinate of every output point (grid's last axis is x, y[, z]).
    taps_per_dim = []
    for d in range(nd):
        length = dims[d]
        u = g[:, :, nd - 1 - d]
        if align_corners:
            lo, hi = 0.0, length - 1.0
            s = (u + 1) / 2 * (length - 1)
        else:
            lo, hi = -0.5, length - 0.5
            s = ((u + 1) * length - 1) / 2
        if mode == "nearest":
            s = np.rint(s)  # half to even, like PyTorch
        if padding_mode == "border":  # only points outside the border box move
            s = np.where((s < lo) | (s > hi), np.clip(s, 0, length - 1), s)
        elif padding_mode == "reflection":
            s = _reflect(s, lo, hi)
        if mode == "nearest":
            offs, ws, base = [0], [np.ones_like(s)], s
        else:
            base = np.floor(s)
            t = s - base
            if mode == "linear":
                offs, ws = [0, 1], [1 - t, t]
            else:
                offs, ws = [-1, 0, 1, 2], list(_cubic(t.reshape(-1), -0.75).T.reshape(4, *t.shape))
        taps = []
        for o, w in zip(offs, ws):
            i = base + o
            if padding_mode == "zeros":
                valid = (i >= 0) & (i <= length - 1)
                w = np.where(valid, w, 0)
                i = np.where(valid, i, 0)
            elif padding_mode == "border":
                i = np.clip(i, 0, length - 1)
            else:
                i = np.clip(_reflect(i, lo, hi), 0, length - 1)
            taps.append((i.astype(np.intp), w.astype(cdt, copy=False)))
        taps_per_dim.append(taps)
    strides = [int(np.prod(dims[d + 1:], dtype=np.int64)) for d in range(nd)]
    xr = x.reshape(n, c, -1)
    for combo in itertools.product(*taps_per_dim):
        flat = sum(i * st for (i, _), st in zip(combo, strides))
        w = combo[0][1]
        for _, wd in combo[1:]:
            w = w * wd
        y += np.take_along_axis(xr, flat[:, None, :], axis=2) * w[:, None, :]
    return _cast_result(y.reshape((n, c) + tuple(out_sp)), x.dtype)


@kernel("GridSample", dtypes=NUMERIC, versions=(20, None))
def grid_sample(x, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    """Sample x at grid points: per output point, a weighted sum of the 1/2^D/4^D neighbour taps."""
    return _grid_sample(x, grid, mode, padding_mode, bool(align_corners))


@kernel("GridSample", dtypes=NUMERIC, versions=(16, 19), name="v16")
def grid_sample_16(x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    return _grid_sample(x, grid, mode, padding_mode, bool(align_corners))


@kernel("AffineGrid", dtypes=FLOATS_BF16, versions=(20, None))
def affine_grid(theta, size, *, align_corners=0):
    """theta (N, D, D+1) applied to the normalized [-1, 1] coordinates of every output point."""
    size = [int(s) for s in np.asarray(size).reshape(-1)]
    nd = len(size) - 2
    if nd not in (2, 3) or theta.shape[1:] != (nd, nd + 1) or theta.shape[0] != size[0]:
        raise ValueError(f"theta {list(theta.shape)} does not fit size {size}: expected (N, {nd}, {nd + 1})")
    axes = []
    for length in size[2:]:
        if align_corners:
            axes.append(np.array([-1.0]) if length == 1 else -1.0 + np.arange(length) * (2.0 / (length - 1)))
        else:
            step = 2.0 / length
            axes.append(-1.0 + step / 2 + np.arange(length) * step)
    mesh = np.meshgrid(*axes, indexing="ij")  # (D,) H, W order
    base = np.stack([m.reshape(-1) for m in mesh[::-1]] + [np.ones(mesh[0].size)], axis=1)  # x, y[, z], 1
    grid = np.matmul(base[None], theta.astype(np.float64).transpose(0, 2, 1))  # (N, points, D)
    return grid.reshape([size[0]] + size[2:] + [nd]).astype(theta.dtype)


# ---------------------------------------------------------------- ConvTranspose


def _conv_transpose_geometry(x_shape, w_shape, attrs):
    """Kernel, strides, dilations, begin pads and output spatial shape (the spec's rules)."""
    nd = len(x_shape) - 2
    k = [int(v) for v in (attrs.get("kernel_shape") or w_shape[2:])]
    strides = [int(v) for v in (attrs.get("strides") or [1] * nd)]
    dil = [int(v) for v in (attrs.get("dilations") or [1] * nd)]
    out_pad = [int(v) for v in (attrs.get("output_padding") or [0] * nd)]
    pads = [int(v) for v in (attrs.get("pads") or [0] * (2 * nd))]
    auto_pad = attrs.get("auto_pad", "NOTSET") or "NOTSET"
    output_shape = attrs.get("output_shape")
    if len(k) != nd or len(strides) != nd or len(dil) != nd or len(out_pad) != nd or len(pads) != 2 * nd:
        raise ValueError(f"kernel_shape {k}, strides {strides}, dilations {dil}, output_padding {out_pad} and "
                         f"pads {pads} must match the {nd} spatial dims")
    in_sp = [int(v) for v in x_shape[2:]]
    full = [s * (i - 1) + op + d * (kk - 1) + 1 for i, s, op, d, kk in zip(in_sp, strides, out_pad, dil, k)]
    if output_shape:
        out = [int(v) for v in output_shape][-nd:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [i * s for i, s in zip(in_sp, strides)]
    else:
        out = None
    if out is not None:
        begin = []
        for f, o in zip(full, out):
            total = f - o
            begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    elif auto_pad == "VALID":
        begin, out = [0] * nd, full
    else:
        begin = pads[:nd]
        out = [f - b - e for f, b, e in zip(full, pads[:nd], pads[nd:])]
    return k, strides, dil, begin, out


def _scatter_plan(in_sp, k, strides, dil, begin, out):
    """Per kernel tap: the input slice it reads and the strided output slice it adds into."""
    plan = []
    for tap in itertools.product(*[range(kk) for kk in k]):
        src, dst = [], []
        for t, i_len, s, d, b, o in zip(tap, in_sp, strides, dil, begin, out):
            shift = t * d - b  # output position of input index i is i*s + shift
            lo = max(0, -(shift // s))  # first i with i*s + shift >= 0
            hi = min(i_len - 1, (o - 1 - shift) // s)
            if hi < lo:
                break
            src.append(slice(lo, hi + 1))
            dst.append(slice(lo * s + shift, hi * s + shift + 1, s))
        else:
            plan.append((tap, tuple(src), tuple(dst)))
    return plan


def _covers_once(in_sp, k, strides, dil, begin, out):
    """Every output position receives exactly one tap: the scatter can copy instead of add."""
    for i_len, kk, s, d, b, o in zip(in_sp, k, strides, dil, begin, out):
        count = np.zeros(o, np.int64)
        pos = (np.arange(kk)[:, None] * d + np.arange(i_len)[None, :] * s - b).reshape(-1)
        pos = pos[(pos >= 0) & (pos < o)]
        np.add.at(count, pos, 1)
        if not (count == 1).all():
            return False
    return True


def _ct_workspace(ctx):
    x, w = ctx.shape(0), ctx.shape(1)
    k = ctx.attrs.get("kernel_shape") or w[2:]
    cols = int(x[0]) * int(w[1]) * int(ctx.attrs.get("group", 1)) * int(np.prod(k)) * int(np.prod(x[2:]))
    return cols * np.dtype(ctx.dtype(0)).itemsize


@kernel("ConvTranspose", dtypes=FLOATS, out=True, bind=True, workspace=_ct_workspace)
def conv_transpose(ctx):
    """GEMM to per-tap columns, then col2im: one strided add (or copy) per kernel tap."""
    attrs = ctx.attrs
    group = int(attrs.get("group", 1))
    cache = {}

    def prepare(x_shape, w_shape):
        key = (x_shape, w_shape)
        if key not in cache:
            k, strides, dil, begin, out = _conv_transpose_geometry(x_shape, w_shape, attrs)
            if list(w_shape[2:]) != k:
                raise ValueError(f"weight {list(w_shape)} does not match kernel_shape {k}")
            if x_shape[1] != w_shape[0] or w_shape[0] % group:
                raise ValueError(f"input {list(x_shape)} and weight {list(w_shape)} disagree on channels "
                                 f"(group={group})")
            in_sp = list(x_shape[2:])
            cache[key] = (out, _scatter_plan(in_sp, k, strides, dil, begin, out),
                          _covers_once(in_sp, k, strides, dil, begin, out))
        return cache[key]

    def pack(w):
        # W (C, M/g, *k) -> (g, K*M/g, C/g): row (tap, out channel), so a tap's rows are contiguous.
        c, mg = w.shape[:2]
        kk = int(np.prod(w.shape[2:]))
        return np.ascontiguousarray(w.reshape(group, c // group, mg, kk).transpose(0, 3, 2, 1)
                                    .reshape(group, kk * mg, c // group))

    w_const = ctx.const(1)
    w_packed = pack(w_const) if w_const is not None else None
    ws = ctx.workspace
    if ctx.shape(0) is not None and ctx.shape(1) is not None and all(
            isinstance(d, int) for d in [*ctx.shape(0), *ctx.shape(1)]):
        prepare(tuple(ctx.shape(0)), tuple(ctx.shape(1)))

    def step(x, w, b=None, *, out=None):
        out_sp, plan, once = prepare(x.shape, w.shape)
        n, c = x.shape[:2]
        mg = w.shape[1]
        m = mg * group
        kk = int(np.prod(w.shape[2:]))
        pix = int(np.prod(x.shape[2:]))
        y_shape = (n, m, *out_sp)
        if out is None:
            out = np.empty(y_shape, x.dtype)
        wp = w_packed if w_packed is not None and w is w_const else pack(w)
        size = n * group * kk * mg * pix
        if ws is not None and ws.nbytes >= size * x.dtype.itemsize:
            cols = ws[:size * x.dtype.itemsize].view(x.dtype).reshape(n, group, kk * mg, pix)
        else:
            cols = np.empty((n, group, kk * mg, pix), x.dtype)
        xg = x.reshape(n, group, c // group, pix)
        if c == group:  # one input channel per group (depthwise): an outer product, not a GEMM
            np.multiply(wp, xg, out=cols)
        else:
            np.matmul(wp, xg, out=cols)
        cols = cols.reshape((n, group, kk, mg) + tuple(x.shape[2:]))
        y = out.reshape((n, group, mg) + tuple(out_sp))
        if not once:
            out.fill(0)
        for tap, src, dst in plan:
            t = int(np.ravel_multi_index(tap, w.shape[2:]))
            view = y[(slice(None),) * 3 + dst]
            piece = cols[(slice(None), slice(None), t, slice(None)) + src]
            if once:
                np.copyto(view, piece)
            else:
                view += piece
        if b is not None:
            out += b.reshape((1, -1) + (1,) * len(out_sp))
        return out

    return step


# ---------------------------------------------------------------- DeformConv


@kernel("DeformConv", dtypes=FLOATS, versions=(19, None))
def deform_conv(x, w, offset, b=None, mask=None, *, dilations=None, group=1, kernel_shape=None,
                offset_group=1, pads=None, strides=None):
    """Bilinear im2col at the offset sampling points (zero outside the input), then one GEMM per group."""
    n, c = x.shape[:2]
    in_sp = x.shape[2:]
    nd = len(in_sp)
    m = w.shape[0]
    k = [int(v) for v in (kernel_shape or w.shape[2:])]
    strides = [int(v) for v in (strides or [1] * nd)]
    dil = [int(v) for v in (dilations or [1] * nd)]
    pads = [int(v) for v in (pads or [0] * (2 * nd))]
    kk = int(np.prod(k))
    out_sp = [(i + pb + pe - (d * (kd - 1) + 1)) // s + 1
              for i, pb, pe, d, kd, s in zip(in_sp, pads[:nd], pads[nd:], dil, k, strides)]
    if c != w.shape[1] * group or m % group or c % offset_group:
        raise ValueError(f"input {list(x.shape)}, weight {list(w.shape)}, group={group} and "
                         f"offset_group={offset_group} disagree on channels")
    if tuple(offset.shape) != (n, offset_group * kk * nd, *out_sp):
        raise ValueError(f"offset {list(offset.shape)} should be {[n, offset_group * kk * nd, *out_sp]}")
    pix = int(np.prod(out_sp))
    cdt = x.dtype
    off = offset.reshape(n, offset_group, kk, nd, pix)
    msk = None if mask is None else mask.reshape(n, offset_group, kk, pix)
    # Where each kernel tap of each output point samples, before the learned offsets.
    grids = np.meshgrid(*[np.arange(o) * s - p for o, s, p in zip(out_sp, strides, pads[:nd])], indexing="ij")
    taps = list(itertools.product(*[range(kd) for kd in k]))
    strides_in = [int(np.prod(in_sp[d + 1:], dtype=np.int64)) for d in range(nd)]
    cog = c // offset_group
    xr = x.reshape(n, offset_group, cog, -1)
    cols = np.zeros((n, offset_group, cog, kk, pix), cdt)
    for t, tap in enumerate(taps):
        pos = [(grids[d].reshape(-1) + tap[d] * dil[d])[None, None, :] + off[:, :, t, d].astype(np.float64)
               for d in range(nd)]  # (N, offset groups, pix)
        lo = [np.floor(p) for p in pos]
        frac = [p - f for p, f in zip(pos, lo)]
        for corner in itertools.product((0, 1), repeat=nd):
            wgt = np.ones_like(pos[0]) if msk is None else msk[:, :, t].astype(np.float64)
            flat = np.zeros(pos[0].shape, np.intp)
            for d, cbit in enumerate(corner):
                i = lo[d] + cbit
                valid = (i >= 0) & (i <= in_sp[d] - 1)
                wgt = wgt * np.where(valid, frac[d] if cbit else 1 - frac[d], 0)
                flat += np.where(valid, i, 0).astype(np.intp) * strides_in[d]
            vals = np.take_along_axis(xr, flat[:, :, None, :], axis=3)  # (N, og, cog, pix)
            cols[:, :, :, t] += vals * wgt[:, :, None, :].astype(cdt)
    # (N, C, K, pix) -> per group (N, g, Cg*K, pix), then W (g, Mg, Cg*K) @ cols.
    cols = cols.reshape(n, group, (c // group) * kk, pix)
    y = np.matmul(w.reshape(group, m // group, -1), cols).reshape(n, m, *out_sp)
    if b is not None:
        y += b.reshape((1, -1) + (1,) * nd)
    return y.astype(x.dtype, copy=False)


# ---------------------------------------------------------------- RoiAlign


def _roi_axis(start, bin_size, pooled, grid, size):
    """Sample coordinates along one axis of one roi: low/high indices and their bilinear weights."""
    v = start + np.arange(pooled)[:, None] * bin_size + (np.arange(grid)[None, :] + 0.5) * bin_size / grid
    v = v.reshape(-1)
    valid = (v >= -1.0) & (v <= size)  # samples further outside contribute nothing
    v = np.maximum(v, 0.0)
    low = v.astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    v = np.where(edge, low, v)
    lw = v - low
    return low, high, np.where(valid, 1 - lw, 0.0), np.where(valid, lw, 0.0)


def _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
               half_pixel):
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape != (rois.shape[0],):
        raise ValueError(f"expected X (N, C, H, W), rois (R, 4) and batch_indices (R,), got {list(x.shape)}, "
                         f"{list(rois.shape)}, {list(batch_indices.shape)}")
    if mode not in ("avg", "max"):
        raise ValueError(f"unknown RoiAlign mode {mode!r}")
    n, c, height, width = x.shape
    oh, ow = int(output_height), int(output_width)
    y = np.zeros((rois.shape[0], c, oh, ow), x.dtype)
    offset = 0.5 if half_pixel else 0.0
    boxes = rois.astype(np.float64) * spatial_scale - offset
    for r, (x0, y0, x1, y1) in enumerate(boxes):
        b = int(batch_indices[r])
        if not 0 <= b < n:
            raise IndexError(f"batch index {b} out of range for {n} images")
        rw, rh = x1 - x0, y1 - y0
        if not half_pixel:  # malformed rois are forced to 1x1
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = int(sampling_ratio) if sampling_ratio > 0 else int(np.ceil(rh / oh))
        gw = int(sampling_ratio) if sampling_ratio > 0 else int(np.ceil(rw / ow))
        if gh <= 0 or gw <= 0:
            continue
        yl, yh, wyl, wyh = _roi_axis(y0, bh, oh, gh, height)
        xl, xh, wxl, wxh = _roi_axis(x0, bw, ow, gw, width)
        img = x[b]
        if mode == "avg":
            # Bilinear sampling is separable: interpolate the rows, then the columns of the crop.
            c0, c1 = int(min(xl.min(), xh.min())), int(max(xl.max(), xh.max())) + 1
            rows = img[:, yl, c0:c1] * wyl[:, None] + img[:, yh, c0:c1] * wyh[:, None]  # (C, Sy, crop)
            vals = rows[:, :, xl - c0] * wxl + rows[:, :, xh - c0] * wxh  # (C, Sy, Sx)
            y[r] = vals.reshape(c, oh, gh, ow, gw).sum(axis=(2, 4)) / max(gh * gw, 1)
        else:
            # Max over samples of the largest weighted corner (the reference's definition).
            v = None
            for yi, wy in ((yl, wyl), (yh, wyh)):
                for xi, wx in ((xl, wxl), (xh, wxh)):
                    t = img[:, yi[:, None], xi[None, :]] * (wy[:, None] * wx[None, :])
                    v = t if v is None else np.maximum(v, t)
            y[r] = v.reshape(c, oh, gh, ow, gw).max(axis=(2, 4))
    return y


@kernel("RoiAlign", dtypes=FLOATS_BF16, versions=(16, None))
def roi_align(x, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg",
              output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    """Average (or max) of bilinear samples on a regular grid inside each bin of each roi."""
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"unknown coordinate_transformation_mode {coordinate_transformation_mode!r}")
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      coordinate_transformation_mode == "half_pixel")


@kernel("RoiAlign", dtypes=FLOATS_BF16, versions=(10, 15), name="v10")
def roi_align_10(x, rois, batch_indices, *, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
                 spatial_scale=1.0):
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      False)


# ---------------------------------------------------------------- NonMaxSuppression


@kernel("NonMaxSuppression", dtypes=FLOATS, versions=(10, None))
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None,
                        *, center_point_box=0):
    """Greedy NMS per (batch, class): keep the best box, drop the rest that overlap it too much, repeat."""
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
            or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"expected boxes (N, B, 4) and scores (N, C, B), got {list(boxes.shape)} and "
                         f"{list(scores.shape)}")
    limit = 0 if max_output_boxes_per_class is None or max_output_boxes_per_class.size == 0 \
        else max(int(max_output_boxes_per_class.reshape(-1)[0]), 0)
    iou_thr = 0.0 if iou_threshold is None or iou_threshold.size == 0 else iou_threshold.reshape(-1)[0]
    score_thr = None if score_threshold is None or score_threshold.size == 0 else score_threshold.reshape(-1)[0]
    selected = []
    if limit == 0:
        return np.zeros((0, 3), np.int64)
    for bi in range(boxes.shape[0]):
        bx = boxes[bi]
        if center_point_box:
            half_w, half_h = bx[:, 2] / 2, bx[:, 3] / 2
            x_min, x_max = bx[:, 0] - half_w, bx[:, 0] + half_w
            y_min, y_max = bx[:, 1] - half_h, bx[:, 1] + half_h
        else:  # corners in either order
            y_min, y_max = np.minimum(bx[:, 0], bx[:, 2]), np.maximum(bx[:, 0], bx[:, 2])
            x_min, x_max = np.minimum(bx[:, 1], bx[:, 3]), np.maximum(bx[:, 1], bx[:, 3])
        area = (x_max - x_min) * (y_max - y_min)
        for ci in range(scores.shape[1]):
            sc = scores[bi, ci]
            cand = np.arange(sc.shape[0]) if score_thr is None else np.flatnonzero(sc > score_thr)
            order = cand[np.argsort(-sc[cand], kind="stable")]  # best first, lower index on ties
            kept = 0
            while order.size and kept < limit:
                i, rest = order[0], order[1:]
                selected.append((bi, ci, i))
                kept += 1
                iw = np.minimum(x_max[i], x_max[rest]) - np.maximum(x_min[i], x_min[rest])
                ih = np.minimum(y_max[i], y_max[rest]) - np.maximum(y_min[i], y_min[rest])
                inter = iw * ih
                union = area[i] + area[rest] - inter
                with np.errstate(divide="ignore", invalid="ignore"):
                    suppress = (iw > 0) & (ih > 0) & (inter > 0) & (area[i] > 0) & (area[rest] > 0) & (union > 0) \
                        & (inter / union > iou_thr)
                order = rest[~suppress]
    return np.array(selected, np.int64).reshape(-1, 3)
