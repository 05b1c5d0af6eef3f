"""ConvTranspose: a GEMM to per-tap columns, then col2im (one strided add or copy per tap).
The geometry (output size, pads) is the op's meta's: ops/meta/nn.py."""
from __future__ import annotations

import itertools

import numpy as np

from ...ops.meta.nn import conv_transpose_geometry
from ..registry import kernel
from ._util import FLOATS


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
            k, strides, dil, begin, out = conv_transpose_geometry(x_shape, w_shape, attrs)
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
