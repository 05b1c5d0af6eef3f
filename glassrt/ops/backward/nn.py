"""Backward of MatMul, Gemm, Conv, pooling, softmax, normalizations and dropout.

Conv/ConvTranspose/pooling reuse the forward pass's geometry (ops/geometry.py, ops/meta/nn.py)
and window views (ops/windows.py) so the gradient sees exactly the windows the
forward pass read: for each kernel tap, the strided view of the (padded) input it touched;
the backward scatters into the same views of a zero-filled padded gradient and crops the
padding off at the end.
"""
from __future__ import annotations

import numpy as np

from . import backward, unbroadcast
from ..geometry import spatial_pads
from ..meta.nn import conv_transpose_geometry
from ..windows import pad_spatial, window_views, windows


def _norm_axis(a, rank):
    return a + rank if a < 0 else a


@backward("MatMul")
def matmul(ctx, gy):
    a, b = ctx.inputs
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    # Restore the unit dims the 1-D operands dropped from Y: b's trailing one first, so a
    # 1-D @ 1-D (a 0-d Y) becomes (1, 1).
    g = gy
    if b.ndim == 1:
        g = np.expand_dims(g, -1)
    if a.ndim == 1:
        g = np.expand_dims(g, -2)
    ga = np.matmul(g, np.swapaxes(b2, -1, -2))
    gb = np.matmul(np.swapaxes(a2, -1, -2), g)
    ga = unbroadcast(ga, a2.shape).reshape(a.shape)
    gb = unbroadcast(gb, b2.shape).reshape(b.shape)
    return [ga, gb]


@backward("Gemm")
def gemm(ctx, gy):
    a, b = ctx.inputs[:2]
    c = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    ta, tb = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))
    a_ = a.T if ta else a
    b_ = b.T if tb else b
    # Y = alpha * A' @ B' + beta * C with A' = op(A), B' = op(B): differentiate w.r.t. A', B',
    # then transpose back where the attribute transposed the input.
    ga_ = alpha * (gy @ b_.T)
    gb_ = alpha * (a_.T @ gy)
    out = [(ga_.T if ta else ga_).astype(a.dtype, copy=False), (gb_.T if tb else gb_).astype(b.dtype, copy=False)]
    if len(ctx.inputs) > 2:
        out.append(None if c is None else unbroadcast(beta * gy, c.shape).astype(c.dtype, copy=False))
    return out


# ---------------------------------------------------------------- Conv / ConvTranspose


def _crop(xp, begin, sizes):
    return xp[(slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(begin, sizes))]


@backward("Conv")
def conv(ctx, gy):
    x, w = ctx.inputs[:2]
    has_b = len(ctx.inputs) > 2 and ctx.inputs[2] is not None
    group = int(ctx.attr("group", 1))
    k = list(w.shape[2:])
    begin, end, out_sp, strides, dil = spatial_pads(list(x.shape[2:]), k, ctx.attrs.get("strides"),
                                                    ctx.attrs.get("dilations"), ctx.attrs.get("pads"),
                                                    ctx.attr("auto_pad", "NOTSET"))
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    mg = m // group
    nd = len(k)
    dt = np.result_type(x.dtype, w.dtype, gy.dtype)
    gyg = gy.reshape((n, group, mg) + tuple(out_sp))
    xp = pad_spatial(x, begin, end, 0)
    gxp = np.zeros(xp.shape, dt)
    gw = np.zeros(w.shape, dt)
    # Per kernel tap: Y[n, g*mg+m, o] += W[g*mg+m, c, tap] * Xp[n, g*cg+c, o*s + tap*d], so the
    # tap's view of Xp gets W_tap^T @ gY and W_tap gets gY @ view^T, group by group.
    xv_iter = window_views(xp, k, strides, dil, out_sp)
    for (offs, gview), (_, xview) in zip(window_views(gxp, k, strides, dil, out_sp), xv_iter):
        wt = w[(slice(None), slice(None)) + offs].reshape(group, mg, cg)
        gview += np.einsum("ngm...,gmc->ngc...", gyg, wt, optimize=True).reshape((n, c) + tuple(out_sp))
        xg = xview.reshape((n, group, cg) + tuple(out_sp))
        gw[(slice(None), slice(None)) + offs] = np.einsum("ngm...,ngc...->gmc", gyg, xg, optimize=True).reshape(m, cg)
    gx = _crop(gxp, begin, x.shape[2:])
    out = [gx.astype(x.dtype, copy=False), gw.astype(w.dtype, copy=False)]
    if len(ctx.inputs) > 2:
        out.append(gy.sum(axis=(0,) + tuple(range(2, 2 + nd))).astype(ctx.inputs[2].dtype, copy=False)
                   if has_b else None)
    return out


@backward("ConvTranspose")
def conv_transpose(ctx, gy):
    x, w = ctx.inputs[:2]
    has_b = len(ctx.inputs) > 2 and ctx.inputs[2] is not None
    group = int(ctx.attr("group", 1))
    k, strides, dil, begin, out_sp = conv_transpose_geometry(x.shape, w.shape, ctx.attrs)
    n, c = x.shape[:2]
    mg = w.shape[1]
    cg = c // group
    in_sp = list(x.shape[2:])
    nd = len(k)
    # Input position i, tap t lands on output position i*s + t*d - begin. Put gY in a zero
    # buffer where index i*s + t*d is that output position (shifted by `begin`, clipped): then
    # the conv windows of that buffer (stride s, dilation d) read exactly what each (i, t) wrote.
    full = [(i - 1) * s + (kk - 1) * d + 1 for i, s, d, kk in zip(in_sp, strides, dil, k)]
    gp = np.zeros(gy.shape[:2] + tuple(full), gy.dtype)
    src, dst = [], []
    for b, o, f in zip(begin, out_sp, full):
        lo, hi = max(0, -b), min(o, f - b)  # output positions j with 0 <= j + b < f
        src.append(slice(lo, max(lo, hi)))
        dst.append(slice(lo + b, max(lo, hi) + b))
    gp[(slice(None), slice(None)) + tuple(dst)] = gy[(slice(None), slice(None)) + tuple(src)]
    win = windows(gp, k, strides, dil, in_sp)  # (N, M, *k, *in)
    kk = int(np.prod(k))
    win = win.reshape((n, group, mg, kk) + tuple(in_sp))
    wg = w.reshape(group, cg, mg, kk)
    xg = x.reshape((n, group, cg) + tuple(in_sp))
    gx = np.einsum("ngmk...,gcmk->ngc...", win, wg, optimize=True).reshape(x.shape)
    gw = np.einsum("ngc...,ngmk...->gcmk", xg, win, optimize=True).reshape(w.shape)
    out = [gx.astype(x.dtype, copy=False), gw.astype(w.dtype, copy=False)]
    if len(ctx.inputs) > 2:
        out.append(gy.sum(axis=(0,) + tuple(range(2, 2 + nd))).astype(ctx.inputs[2].dtype, copy=False)
                   if has_b else None)
    return out


# ---------------------------------------------------------------- pooling


def _pool_geometry(ctx, x):
    """The kernel's geometry (kernels/cpu/pool.py): pads, the ceil-mode overhang, output shape."""
    k = list(ctx.attrs["kernel_shape"])
    begin, end, out, strides, dil = spatial_pads(list(x.shape[2:]), k, ctx.attrs.get("strides"),
                                                 ctx.attrs.get("dilations"), ctx.attrs.get("pads"),
                                                 ctx.attr("auto_pad", "NOTSET"), bool(ctx.attr("ceil_mode", 0)))
    extra = [max(0, (o - 1) * s + d * (kk - 1) + 1 - (sz + b + e))
             for o, s, d, kk, sz, b, e in zip(out, strides, dil, k, x.shape[2:], begin, end)]
    return k, begin, [e + x_ for e, x_ in zip(end, extra)], out, strides, dil


@backward("MaxPool")
def max_pool(ctx, gy, *_):
    x = ctx.inputs[0]
    if gy is None or x.dtype.kind != "f":
        return [None]
    k, begin, end, out_sp, strides, dil = _pool_geometry(ctx, x)
    xp = pad_spatial(x, begin, end, -np.inf)
    # The winning tap of each window: argmax takes the first maximum, the same tie rule as
    # the kernel's Indices output, so each window routes its gradient to exactly one element.
    view = windows(xp, k, strides, dil, out_sp)
    arg = np.argmax(view.reshape(x.shape[:2] + (-1,) + tuple(out_sp)), axis=2)
    gxp = np.zeros(xp.shape, gy.dtype)
    zero = np.zeros((), gy.dtype)
    for t, (_, gview) in enumerate(window_views(gxp, k, strides, dil, out_sp)):
        gview += np.where(arg == t, gy, zero)  # overlapping windows accumulate
    return [_crop(gxp, begin, x.shape[2:]).astype(x.dtype, copy=False)]


@backward("AveragePool")
def average_pool(ctx, gy):
    (x,) = ctx.inputs
    k, begin, end, out_sp, strides, dil = _pool_geometry(ctx, x)
    full = [s + b + e for s, b, e in zip(x.shape[2:], begin, end)]  # end includes the ceil overhang
    # The divisor per window, built as the kernel does: count_include_pad counts the explicit
    # padding, never the ceil-mode overhang.
    mask = np.zeros(full, np.float64)
    if int(ctx.attr("count_include_pad", 0)):
        _, real_end, _, _, _ = spatial_pads(list(x.shape[2:]), k, ctx.attrs.get("strides"), ctx.attrs.get("dilations"),
                                            ctx.attrs.get("pads"), ctx.attr("auto_pad", "NOTSET"),
                                            bool(ctx.attr("ceil_mode", 0)))
        mask[tuple(slice(0, s + b + e) for s, b, e in zip(x.shape[2:], begin, real_end))] = 1
    else:
        mask[tuple(slice(b, b + s) for b, s in zip(begin, x.shape[2:]))] = 1
    counts = np.zeros(out_sp, np.float64)
    for _, view in window_views(mask[None, None], k, strides, dil, out_sp):
        counts += view[0, 0]
    g = gy * (1.0 / np.maximum(counts, 1)).astype(gy.dtype)
    gxp = np.zeros(x.shape[:2] + tuple(full), gy.dtype)
    for _, gview in window_views(gxp, k, strides, dil, out_sp):
        gview += g
    return [_crop(gxp, begin, x.shape[2:]).astype(x.dtype, copy=False)]


@backward("GlobalAveragePool")
def global_average_pool(ctx, gy):
    (x,) = ctx.inputs
    size = int(np.prod(x.shape[2:]))
    return [np.broadcast_to(gy / size, x.shape).astype(x.dtype)]


@backward("GlobalMaxPool")
def global_max_pool(ctx, gy):
    (x,) = ctx.inputs
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    arg = np.argmax(flat, axis=2)  # first maximum, like MaxPool
    g = np.zeros(flat.shape, gy.dtype)
    np.put_along_axis(g, arg[..., None], gy.reshape(n, c, 1), axis=2)
    return [g.reshape(x.shape).astype(x.dtype, copy=False)]


# ---------------------------------------------------------------- softmax


def _softmax_2d(ctx, arrays):
    """Arrays viewed the way the op reduces: opset < 13 flattens to 2-D at `axis`."""
    x = arrays[0]
    a = _norm_axis(int(ctx.attr("axis", 1 if ctx.version < 13 else -1)), x.ndim)
    if ctx.version < 13:
        rows = int(np.prod(x.shape[:a], dtype=np.int64))
        return [v.reshape(rows, -1) for v in arrays], 1
    return list(arrays), a


@backward("Softmax")
def softmax(ctx, gy):
    (y,) = ctx.outputs
    (y2, g2), a = _softmax_2d(ctx, [y, gy])
    gx = y2 * (g2 - np.sum(g2 * y2, axis=a, keepdims=True))
    return [gx.reshape(y.shape)]


@backward("LogSoftmax")
def log_softmax(ctx, gy):
    (y,) = ctx.outputs
    (y2, g2), a = _softmax_2d(ctx, [y, gy])
    gx = g2 - np.exp(y2) * np.sum(g2, axis=a, keepdims=True)
    return [gx.reshape(y.shape)]


# ---------------------------------------------------------------- normalizations


def _standardized(x, red, eps):
    """float64 x_hat = (x - mean) * r and r = 1/sqrt(var + eps) over `red` (keepdims)."""
    xf = x.astype(np.float64)
    mean = xf.mean(axis=red, keepdims=True)
    d = xf - mean
    r = 1.0 / np.sqrt((d * d).mean(axis=red, keepdims=True) + eps)
    return d * r, r


def _through_standardize(g_xhat, xhat, r, red):
    """d/dx of x_hat = (x - mean(x)) / sqrt(var(x) + eps), applied to g_xhat (the usual
    r * (g - mean(g) - x_hat * mean(g * x_hat)) over the reduced axes)."""
    return r * (g_xhat - g_xhat.mean(axis=red, keepdims=True)
                - xhat * (g_xhat * xhat).mean(axis=red, keepdims=True))


@backward("LayerNormalization")
def layer_normalization(ctx, gy, g_mean=None, g_inv=None):
    x, scale = ctx.inputs[:2]
    bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    a = _norm_axis(int(ctx.attr("axis", -1)), x.ndim)
    red = tuple(range(a, x.ndim))
    count = int(np.prod(x.shape[a:], dtype=np.int64))
    xhat, r = _standardized(x, red, float(ctx.attr("epsilon", 1e-5)))
    gx = np.zeros(x.shape, np.float64)
    g_scale = g_bias = None
    if gy is not None:
        gx += _through_standardize(gy * scale, xhat, r, red)
        g_scale = unbroadcast(gy * xhat, scale.shape).astype(scale.dtype)
        g_bias = None if bias is None else unbroadcast(gy, bias.shape).astype(bias.dtype)
    # The Mean and InvStdDev outputs: d mean/dx = 1/D, d r/dx = -r^3 (x - mean)/D = -r^2 x_hat/D.
    if g_mean is not None:
        gx += g_mean.reshape(r.shape) / count
    if g_inv is not None:
        gx -= g_inv.reshape(r.shape) * r * r * xhat / count
    out = [gx.astype(x.dtype), g_scale if g_scale is not None else np.zeros_like(scale)]
    if len(ctx.inputs) > 2:
        out.append(None if bias is None else (g_bias if g_bias is not None else np.zeros_like(bias)))
    return out


def _channel_params(x, p):
    """A per-channel parameter (C,) shaped to broadcast over x (N, C, ...) and the axes it is
    shared over; a (C, D1, ...) parameter (BatchNormalization spatial=0) is shared over N only."""
    if p.ndim == 1:
        return (1, -1) + (1,) * (x.ndim - 2), (0,) + tuple(range(2, x.ndim))
    return (1,) + p.shape, (0,)


@backward("BatchNormalization")
def batch_normalization(ctx, gy, g_run_mean=None, g_run_var=None, *_):
    x, scale, bias, mean, var = ctx.inputs[:5]
    eps = float(ctx.attr("epsilon", 1e-5))
    shape, axes = _channel_params(x, scale)
    sf = scale.astype(np.float64).reshape(shape)
    xf = x.astype(np.float64)
    if ctx.version >= 14 and int(ctx.attr("training_mode", 0)):
        return _batch_norm_training(ctx, xf, sf, shape, axes, eps, gy, g_run_mean, g_run_var)
    # Inference: y = (x - mean) * scale / sqrt(var + eps) + B, with the given statistics.
    r = 1.0 / np.sqrt(var.astype(np.float64).reshape(shape) + eps)
    xc = xf - mean.astype(np.float64).reshape(shape)
    if gy is None:
        return [None] * len(ctx.inputs)
    g_sum = gy.sum(axis=axes)
    g_xc = (gy * xc).sum(axis=axes)
    r_ = r.reshape(scale.shape)
    s_ = sf.reshape(scale.shape)
    return [(gy * (sf * r)).astype(x.dtype),
            (g_xc * r_).astype(scale.dtype),
            g_sum.astype(bias.dtype),
            (-g_sum * s_ * r_).astype(mean.dtype),
            (-0.5 * g_xc * s_ * r_ ** 3).astype(var.dtype)]


def _batch_norm_training(ctx, xf, sf, shape, axes, eps, gy, g_run_mean, g_run_var):
    x, scale, bias, mean, var = ctx.inputs[:5]
    m = float(ctx.attr("momentum", 0.9))
    count = xf.size // sf.size
    xhat, r = _standardized(xf, axes, eps)
    gx = np.zeros(x.shape, np.float64)
    g_scale, g_bias = np.zeros(scale.shape), np.zeros(bias.shape)
    if gy is not None:
        gx += _through_standardize(gy * sf, xhat, r, axes)
        g_scale = (gy * xhat).sum(axis=axes)
        g_bias = gy.sum(axis=axes)
    # running = input * momentum + batch statistic * (1 - momentum); the batch variance is the
    # population one, d var/dx = 2 (x - mean)/count = 2 x_hat/(r count).
    g_mean = g_var = None
    if g_run_mean is not None:
        gx += (1 - m) * g_run_mean.reshape(shape) / count
        g_mean = g_run_mean * m
    if g_run_var is not None:
        gx += (1 - m) * g_run_var.reshape(shape) * 2 * xhat / (r * count)
        g_var = g_run_var * m
    return [gx.astype(x.dtype), g_scale.reshape(scale.shape).astype(scale.dtype),
            g_bias.reshape(bias.shape).astype(bias.dtype),
            np.zeros_like(mean) if g_mean is None else g_mean.astype(mean.dtype),
            np.zeros_like(var) if g_var is None else g_var.astype(var.dtype)]


@backward("InstanceNormalization")
def instance_normalization(ctx, gy):
    x, scale, bias = ctx.inputs
    red = tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xhat, r = _standardized(x, red, float(ctx.attr("epsilon", 1e-5)))
    gx = _through_standardize(gy * scale.reshape(shape), xhat, r, red)
    axes = (0,) + red
    return [gx.astype(x.dtype), (gy * xhat).sum(axis=axes).astype(scale.dtype), gy.sum(axis=axes).astype(bias.dtype)]


@backward("GroupNormalization")
def group_normalization(ctx, gy):
    x, scale, bias = ctx.inputs
    n, c = x.shape[:2]
    groups = int(ctx.attr("num_groups"))
    xhat, r = _standardized(x.reshape(n, groups, -1), (2,), float(ctx.attr("epsilon", 1e-5)))
    if ctx.version < 21:  # opset 18: scale and bias per group
        g3 = gy.reshape(n, groups, -1)
        gx = _through_standardize(g3 * scale.reshape(1, -1, 1), xhat, r, (2,))
        return [gx.reshape(x.shape).astype(x.dtype), (g3 * xhat).sum(axis=(0, 2)).astype(scale.dtype),
                g3.sum(axis=(0, 2)).astype(bias.dtype)]
    # opset 21: statistics per group, scale and bias per channel.
    g3 = gy.reshape(n, c, -1)
    g_xhat = (g3 * scale.reshape(1, -1, 1)).reshape(n, groups, -1)
    gx = _through_standardize(g_xhat, xhat, r, (2,))
    xh3 = xhat.reshape(n, c, -1)
    return [gx.reshape(x.shape).astype(x.dtype), (g3 * xh3).sum(axis=(0, 2)).astype(scale.dtype),
            g3.sum(axis=(0, 2)).astype(bias.dtype)]


@backward("RMSNormalization")
def rms_normalization(ctx, gy):
    x, scale = ctx.inputs
    a = _norm_axis(int(ctx.attr("axis", -1)), x.ndim)
    red = tuple(range(a, x.ndim))
    xf = x.astype(np.float64)
    r = 1.0 / np.sqrt((xf * xf).mean(axis=red, keepdims=True) + float(ctx.attr("epsilon", 1e-5)))
    xhat = xf * r
    g_xhat = gy * scale
    # d(x r)/dx with r = (mean(x^2) + eps)^-1/2: r * (g - x_hat * mean(g * x_hat)).
    gx = r * (g_xhat - xhat * (g_xhat * xhat).mean(axis=red, keepdims=True))
    return [gx.astype(x.dtype), unbroadcast(gy * xhat, scale.shape).astype(scale.dtype)]


# ---------------------------------------------------------------- dropout


@backward("Dropout")
def dropout(ctx, gy, *_):
    x = ctx.inputs[0]
    rest = [None] * (len(ctx.inputs) - 1)
    if gy is None:
        return [None] + rest
    if ctx.version >= 12:
        tm = ctx.inputs[2] if len(ctx.inputs) > 2 else None
        training = tm is not None and bool(np.asarray(tm).reshape(-1)[0])
        ratio = 0.5 if len(ctx.inputs) < 2 or ctx.inputs[1] is None else float(np.asarray(ctx.inputs[1]).reshape(-1)[0])
    else:
        training = ctx.version < 7 and not int(ctx.attr("is_test", 0))
        ratio = float(ctx.attr("ratio", 0.5))
    if not training or ratio == 0:
        return [gy] + rest  # inference: the identity
    # Training: y = x * keep / (1 - ratio). The mask output, when the node has one, says what
    # was kept; without it y != 0 does (wrong only where x is exactly 0, a measure-zero set).
    mask = ctx.outputs[1] if len(ctx.outputs) > 1 and ctx.outputs[1] is not None else (ctx.outputs[0] != 0)
    return [(gy * mask.astype(bool) / (1 - ratio)).astype(x.dtype)] + rest


# ---------------------------------------------------------------- Einsum


def _einsum_subscripts(equation, shapes):
    """Explicit per-operand and output subscripts (ellipses replaced by letters, right-aligned
    the way NumPy broadcasts them; an implicit output spelled out)."""
    eq = equation.replace(" ", "")
    lhs, rhs = eq.split("->") if "->" in eq else (eq, None)
    terms = lhs.split(",")
    used = set(c for c in eq if c.isalpha())
    spare = [c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used]
    ell_rank = max([len(s) - (len(t) - 3) for t, s in zip(terms, shapes) if "..." in t], default=0)
    ell = spare[:ell_rank]
    subs = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            r = len(s) - (len(t) - 3)
            t = t.replace("...", "".join(ell[ell_rank - r:]))
        subs.append(t)
    if rhs is None:  # implicit: the ellipsis, then the letters seen exactly once, sorted
        letters = "".join(subs)
        rhs = "".join(ell) + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
    else:
        rhs = rhs.replace("...", "".join(ell))
    return subs, rhs


@backward("Einsum")
def einsum(ctx, gy):
    xs = ctx.inputs
    subs, out = _einsum_subscripts(ctx.attr("equation"), [x.shape for x in xs])
    sizes = {}
    for s, x in zip(subs + [out], list(xs) + [gy]):
        for c, d in zip(s, x.shape):
            sizes[c] = max(sizes.get(c, 1), d)
    grads = []
    for i, (s, x) in enumerate(zip(subs, xs)):
        if x.dtype.kind not in "fc":
            grads.append(None)
            continue
        others = [(subs[j], xs[j]) for j in range(len(xs)) if j != i]
        seen = set(out).union(*[set(t) for t, _ in others]) if others else set(out)
        uniq = "".join(dict.fromkeys(s))  # x's letters, a repeated one (a diagonal) once
        # d/dx of sum(gy * Y) is gy contracted with the other operands onto x's letters; a letter
        # that only x has was summed out of Y, so the gradient is constant (broadcast) along it.
        kept = "".join(c for c in uniq if c in seen)
        g = np.einsum(",".join([out] + [t for t, _ in others]) + "->" + kept, gy, *[v for _, v in others],
                      optimize=len(others) > 1)
        g = np.expand_dims(g, tuple(k for k, c in enumerate(uniq) if c not in seen))
        g = np.broadcast_to(g, tuple(sizes[c] for c in uniq))
        # x's own size-1 dims that broadcast against larger ones: sum the gradient back.
        xsz = {c: d for c, d in zip(s, x.shape)}
        g = g.sum(axis=tuple(k for k, c in enumerate(uniq) if xsz[c] == 1 and sizes[c] > 1), keepdims=True)
        if uniq == s:
            gx = np.array(g)  # own memory (g may be a broadcast view)
        else:
            gx = np.zeros(x.shape, g.dtype)
            np.einsum(s + "->" + uniq, gx)[...] = g  # a writeable view of the diagonal
        grads.append(gx.astype(x.dtype, copy=False))
    return grads
