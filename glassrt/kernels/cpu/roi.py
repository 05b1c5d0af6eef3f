"""RoiAlign: the average (or max) of bilinear samples on a grid inside each bin of each roi."""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._util import FLOATS_BF16, new_out


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
               half_pixel, out=None):
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape != (rois.shape[0],):
        raise ValueError(f"expected X (N, C, H, W), rois (R, 4) and batch_indices (R,), got {list(x.shape)}, "
                         f"{list(rois.shape)}, {list(batch_indices.shape)}")
    if mode not in ("avg", "max"):
        raise ValueError(f"unknown RoiAlign mode {mode!r}")
    if int(sampling_ratio) < 0:
        raise ValueError(f"sampling_ratio {sampling_ratio} is negative (0: adaptive)")
    n, c, height, width = x.shape
    oh, ow = int(output_height), int(output_width)
    y = new_out(out, (rois.shape[0], c, oh, ow), x.dtype)
    y.fill(0)
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


@kernel("RoiAlign", dtypes=FLOATS_BF16, versions=(16, None), out=True)
def roi_align(x, rois, batch_indices, *, out=None, coordinate_transformation_mode="half_pixel", mode="avg",
              output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    """Average (or max) of bilinear samples on a regular grid inside each bin of each roi."""
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"unknown coordinate_transformation_mode {coordinate_transformation_mode!r}")
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      coordinate_transformation_mode == "half_pixel", out)


@kernel("RoiAlign", dtypes=FLOATS_BF16, versions=(10, 15), out=True, name="v10")
def roi_align_10(x, rois, batch_indices, *, out=None, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
                 spatial_scale=1.0):
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      False, out)
