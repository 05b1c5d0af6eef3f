"""Resize and Upsample: separable resampling from per-axis index/weight maps.

Per resized axis a few source taps are gathered and summed with weights. The per-axis maps
depend only on the input shape and the small scales/sizes/roi inputs, so they are built
once (at bind time when those are known, else on first sight of new values) and a run is
gathers and multiply-adds, in compiled passes (Numba) straight into the output buffer.
"""
from __future__ import annotations

import math

import numpy as np

from ...ops.meta.vision import resize_geometry
from ..registry import kernel
from ._jit import jit, use_compiled
from ._util import NUMERIC, cast_result, cubic_weights, interp_dtype

BOOL = np.dtype(np.bool_)
RESIZE_DTYPES = NUMERIC | {BOOL}


# ---------------------------------------------------------------- maps


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
        offs, w = np.arange(-1, 3), cubic_weights(r, p["cubic_coeff_a"])
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
        self.cdt = interp_dtype(dtype)
        self.extrapolation_value = p["extrapolation_value"]
        tf = p["ctm"] == "tf_crop_and_resize"
        full_roi = [(0.0, 1.0)] * r
        if tf:
            if roi is None or np.asarray(roi).size == 0:
                raise ValueError("coordinate_transformation_mode tf_crop_and_resize needs roi")
            roi = [float(v) for v in np.asarray(roi).reshape(-1)]
            if len(roi) != 2 * len(axes):
                raise ValueError(f"roi has {len(roi)} entries, expected {2 * len(axes)}")
            if not all(math.isfinite(v) for v in roi):
                raise ValueError(f"roi {roi} holds NaN or infinity: no crop box")
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
        # the compiled passes once the process has Numba loaded (a second run starts it:
        # _jit); until then their NumPy twins, the same bits (a model run once, an OCR detector's first run,
        # no longer pays Numba's import there: ~0.45 s against onnxruntime's 7 ms)
        loops = _COMPILED if use_compiled("Resize") else _NUMPY
        gather_2d, interp_2d, gather_last, interp_last, gather_inner, interp_inner = loops
        for k, (src_shape, dst_shape, axes) in enumerate(self.passes):
            src = cur.reshape(src_shape)
            direct = k == last and (self.nearest or out.dtype == cdt) and out.flags.c_contiguous
            dst = out.view(cdt).reshape(dst_shape) if direct else np.empty(dst_shape, cdt)
            (idx, w, fill), *rest = axes
            if rest:  # the fused last two axes
                iw, ww, fill_w = rest[0]
                if w is None:
                    gather_2d(src, idx[0], iw[0], dst)
                else:
                    interp_2d(src, idx, w, iw, ww, dst)
                if fill_w is not None:
                    dst[:, :, fill_w] = fv
            elif src_shape[2] == 1:
                src2, dst2 = src.reshape(src_shape[:2]), dst.reshape(dst_shape[:2])
                gather_last(src2, idx[0], dst2) if w is None else interp_last(src2, idx, w, dst2)
            else:
                gather_inner(src, idx[0], dst) if w is None else interp_inner(src, idx, w, dst)
            if fill is not None:
                dst[:, fill, :] = fv
            cur = dst
        if not direct:
            res = cur.view(self.dtype) if self.nearest else cast_result(cur, self.dtype)
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




# ---------------------------------------------------------------- compiled 1-D resample passes

# Nearest-neighbour passes move raw bits: one compiled gather per item size, whatever the dtype.
_BITS = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}



@jit()
def _interp_inner(src, idx, w, dst):  # (P, I, Q) -> (P, O, Q); idx, w: (taps, O)
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

@jit()
def _interp_last(src, idx, w, dst):  # (P, I) -> (P, O)
    taps, n_out = idx.shape
    for p in range(src.shape[0]):
        s, d = src[p], dst[p]
        for o in range(n_out):
            d[o] = w[0, o] * s[idx[0, o]]
        for k in range(1, taps):
            for o in range(n_out):
                d[o] += w[k, o] * s[idx[k, o]]

@jit()
def _gather_inner(src, idx, dst):
    for p in range(src.shape[0]):
        for o in range(idx.shape[0]):
            dst[p, o, :] = src[p, idx[o], :]

@jit()
def _gather_last(src, idx, dst):
    for p in range(src.shape[0]):
        s, d = src[p], dst[p]
        for o in range(idx.shape[0]):
            d[o] = s[idx[o]]

@jit()
def _interp_2d(src, ih, wh, iw, ww, dst):  # (P, H, W) -> (P, OH, OW), one input-width row at a time
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

@jit()
def _gather_2d(src, ih, iw, dst):
    for p in range(src.shape[0]):
        for o in range(ih.shape[0]):
            d = dst[p, o]
            if o > 0 and ih[o] == ih[o - 1]:
                d[:] = dst[p, o - 1]  # a repeated source row: copy the row just made
            else:
                s = src[p, ih[o]]
                for q in range(iw.shape[0]):
                    d[q] = s[iw[q]]


# ---------------------------------------------------------------- their NumPy twins
#
# The same products and sums in the same order, element by element (the compiled loops are
# built without fastmath: no fused multiply-adds), so the same bits; tested against them.


def _np_interp_inner(src, idx, w, dst):
    np.multiply(w[0][None, :, None], src[:, idx[0], :], out=dst)
    for k in range(1, idx.shape[0]):
        dst += w[k][None, :, None] * src[:, idx[k], :]


def _np_interp_last(src, idx, w, dst):
    np.multiply(w[0][None, :], src[:, idx[0]], out=dst)
    for k in range(1, idx.shape[0]):
        dst += w[k][None, :] * src[:, idx[k]]


def _np_gather(src, idx, dst):  # (P, I[, Q]) -> (P, O[, Q]): _gather_inner's and _gather_last's twin
    np.take(src, idx, axis=1, out=dst)


def _np_interp_2d(src, ih, wh, iw, ww, dst):
    rows = wh[0][None, :, None] * src[:, ih[0], :]
    for k in range(1, ih.shape[0]):
        rows += wh[k][None, :, None] * src[:, ih[k], :]
    np.multiply(ww[0][None, None, :], rows[:, :, iw[0]], out=dst)
    for k in range(1, iw.shape[0]):
        dst += ww[k][None, None, :] * rows[:, :, iw[k]]


def _np_gather_2d(src, ih, iw, dst):
    np.take(np.take(src, ih, axis=1), iw, axis=2, out=dst)


_COMPILED = (_gather_2d, _interp_2d, _gather_last, _interp_last, _gather_inner, _interp_inner)
_NUMPY = (_np_gather_2d, _np_interp_2d, _np_gather, _np_interp_last, _np_gather, _np_interp_inner)


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
    return None  # (Numba optional: its NumPy twins run without it, the same bits)


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
