"""GridSample (sampling at grid points, with nearest, linear or cubic taps) and AffineGrid."""
from __future__ import annotations

import itertools

import numpy as np

from ..registry import kernel
from ._util import FLOATS_BF16, NUMERIC, as_out, cast_result, cubic_weights


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
    # A NaN coordinate (and an infinite one under reflection, which has no reflected place)
    # samples nothing: the point is NaN (onnxruntime's float-to-int conversion reads
    # whatever index it makes of it); it is sampled at lo meanwhile, so every index is valid.
    undefined = np.zeros(g.shape[:2], bool)
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
        finite = np.isfinite(s)
        if not finite.all():
            bad = ~finite if padding_mode == "reflection" else np.isnan(s)
            undefined |= bad
            # (an infinite one elsewhere is as far outside as any: a few cells past the border)
            s = np.where(bad, lo, np.where(finite, s, np.sign(s) * (length + 4)))
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
                offs, ws = [-1, 0, 1, 2], list(cubic_weights(t.reshape(-1), -0.75).T.reshape(4, *t.shape))
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
    if undefined.any():
        y[np.broadcast_to(undefined[:, None, :], y.shape)] = np.nan if x.dtype.kind in "fV" else 0
    return cast_result(y.reshape((n, c) + tuple(out_sp)), x.dtype)


@kernel("GridSample", dtypes=NUMERIC, versions=(20, None), out=True)
def grid_sample(x, grid, *, out=None, align_corners=0, mode="linear", padding_mode="zeros"):
    """Sample x at grid points: per output point, a weighted sum of the 1/2^D/4^D neighbour taps."""
    return as_out(_grid_sample(x, grid, mode, padding_mode, bool(align_corners)), out)


@kernel("GridSample", dtypes=NUMERIC, versions=(16, 19), out=True, name="v16")
def grid_sample_16(x, grid, *, out=None, align_corners=0, mode="bilinear", padding_mode="zeros"):
    return as_out(_grid_sample(x, grid, mode, padding_mode, bool(align_corners)), out)


@kernel("AffineGrid", dtypes=FLOATS_BF16, versions=(20, None), out=True)
def affine_grid(theta, size, *, out=None, align_corners=0):
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
    return as_out(grid.reshape([size[0]] + size[2:] + [nd]).astype(theta.dtype), out)
