"""DeformConv: bilinear im2col at the learned offsets, then one GEMM per group."""
from __future__ import annotations

import itertools

import numpy as np

from ..registry import kernel
from ._util import FLOATS, as_out


@kernel("DeformConv", dtypes=FLOATS, versions=(19, None), out=True)
def deform_conv(x, w, offset, b=None, mask=None, *, out=None, dilations=None, group=1, kernel_shape=None,
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
    wg = w.reshape(group, m // group, -1)
    direct = out is not None and out.shape == (n, m, *out_sp) and wg.dtype == x.dtype
    if direct:  # the GEMM writes the output
        y = out
        np.matmul(wg, cols, out=y.reshape(n, group, m // group, pix))
    else:
        y = np.matmul(wg, cols).reshape(n, m, *out_sp)
    if b is not None:
        y += b.reshape((1, -1) + (1,) * nd)
    return y if direct else as_out(y.astype(x.dtype, copy=False), out)
