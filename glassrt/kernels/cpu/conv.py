"""Conv: im2col + GEMM (general), plain GEMM for 1×1, shifted multiply-adds for depthwise."""
from __future__ import annotations

import numpy as np

from dataclasses import replace

from .. import gemm, registry
from ...ops.fused import fused_conv_quantizes
from ..registry import kernel
from . import pool
from ._jit import compiled, jit, numba_missing
from ._util import ACTIVATIONS, FLOATS, pad_spatial, spatial_pads, window_views, windows


def _geometry(ctx):
    x, w = ctx.shape(0), ctx.shape(1)
    kernel_shape = list(ctx.attrs.get("kernel_shape") or w[2:])
    begin, end, out, strides, dil = spatial_pads(list(x[2:]), kernel_shape, ctx.attrs.get("strides"),
                                                 ctx.attrs.get("dilations"), ctx.attrs.get("pads"),
                                                 ctx.attrs.get("auto_pad", "NOTSET"))
    return x, w, kernel_shape, begin, end, out, strides, dil


def _is_1x1(ctx):
    x, w, k, begin, end, out, strides, dil = _geometry(ctx)
    if not (all(d == 1 for d in k) and all(s == 1 for s in strides) and not any(begin) and not any(end)):
        return "not a 1x1, stride-1, unpadded conv"
    group = int(ctx.attrs.get("group", 1))
    if group > 1 and w[1] < 8:
        return f"{w[1]} channel(s) per group: too few for a GEMM per group"
    return None


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

    def f32(a):
        return None if a is None else a.astype(np.float32)

    def step16(x, w, b=None, z=None, *, out):
        y = step(f32(x), f32(w), f32(b), f32(z), out=np.empty(out.shape, np.float32))
        np.copyto(out, y, casting="unsafe")
        return out

    return step16


def _has_residual(ctx) -> bool:
    """A FusedConv with a fourth input Z: y = act(conv(x) + b + Z) (passes/fuse_conv.py)."""
    return len(ctx.node.inputs) > 3 and bool(ctx.node.inputs[3])


def _finish(ctx, step, half, residual_done=False):
    """Wrap a conv step(x, w, b, *, out) into step(x, w, b=None, z=None, q_scale=None,
    q_zero_point=None, *, out): the fused residual (FusedConv's Z) unless the kernel added it
    itself, then the fused activation, then the fused quantization (QuantizeDequantize's, in
    place), and float16 handling."""
    act = ctx.attrs.get("activation")
    apply = ACTIVATIONS[act] if act else None
    params = [float(v) for v in ctx.attrs.get("activation_params") or []]
    add_z = _has_residual(ctx) and not residual_done
    quantize = _quantize_range(ctx)
    if quantize is not None:  # (its scale and zero point read once here where they are constants)
        from .quantize import fake_quant_params, fake_quantize

        fixed = fake_quant_params(ctx.const(4), ctx.const(5)) if ctx.const(4) is not None and (
            not ctx.has(5) or ctx.const(5) is not None) else None
    conv = step

    def full(x, w, b=None, z=None, q_scale=None, q_zero_point=None, *, out):
        if add_z or residual_done:  # the residual is added element by element, never broadcast
            if z is None or z.shape != out.shape:
                raise ValueError(f"residual input Z has shape {None if z is None else list(z.shape)}, "
                                 f"the conv output {list(out.shape)}")
        y = conv(x, w, b, z, out=out) if residual_done else conv(x, w, b, out=out)
        if add_z:
            y += z
        y = apply(y, params) if apply is not None else y
        if quantize is not None:
            fake_quantize(y, *(fixed or fake_quant_params(q_scale, q_zero_point)), *quantize, y)
        return y

    return _in_float32(full) if half else full


def _quantize_range(ctx):
    """The 8-bit range (lo, hi) of a FusedConv's fused quantization (its q_scale, input 4),
    or None where it has none."""
    if not fused_conv_quantizes(ctx.node):
        return None
    from .quantize import _int_range

    return tuple(float(v) for v in _int_range(np.dtype(ctx.dtype(5) if ctx.has(5) else np.uint8)))


def _add_bias(out, b):
    if b is not None:
        out += b.reshape((1, -1) + (1,) * (out.ndim - 2))


@kernel("Conv", dtypes=FLOATS, out=True, bind=True, accepts=_is_1x1, priority=20, name="gemm_1x1")
def conv_1x1(ctx):
    """1x1 conv as one GEMM per group over all pixels (no im2col), then one pass (compiled)
    for the bias and a fused Relu/Clip."""
    m = ctx.shape(1)[0]
    group = int(ctx.attrs.get("group", 1))
    mg = m // group
    residual = _has_residual(ctx) and numba_missing() is None
    if numba_missing() is None:
        ctx, lo, hi = _epilogue(ctx, allow_residual=True)
        clamp = np.array([lo, hi], _compute_dtype(ctx))
        clamps = not (lo == -np.inf and hi == np.inf)
        zeros = np.zeros(m, _compute_dtype(ctx))
        bias_act, bias_res_act = compiled(_bias_act), compiled(_bias_res_act)
    else:
        bias_act = None

    def step(x, w, b=None, z=None, *, out):
        n = x.shape[0]
        if group == 1:
            gemm.matmul(w.reshape(m, -1), x.reshape(n, x.shape[1], -1), out.reshape(n, m, -1))
        else:  # ShuffleNet-style grouped pointwise convs: one GEMM per group, no copies
            x3, o3, w2 = x.reshape(n, x.shape[1], -1), out.reshape(n, m, -1), w.reshape(m, -1)
            cg = x.shape[1] // group
            for g in range(group):
                gemm.matmul(w2[g * mg:(g + 1) * mg], x3[:, g * cg:(g + 1) * cg], o3[:, g * mg:(g + 1) * mg])
        if bias_act is None:
            _add_bias(out, b)
        elif residual:  # ResNet's conv + bias + skip connection + Relu: one pass over the output
            y = out.reshape(n * m, -1)
            bias_res_act(0, n * m, y, 0, y.shape[1], zeros if b is None else b, z.reshape(n * m, -1), clamp)
        elif b is not None or clamps:
            y = out.reshape(n * m, -1)
            bias_act(0, n * m, y, 0, y.shape[1], zeros if b is None else b, clamp)
        return out

    return _finish(ctx, step, ctx.dtype(0) == np.float16, residual_done=residual)


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


# ---------------------------------------------------------------- depthwise 2-D (compiled)
def _depthwise_2d_reason(ctx):
    return _is_depthwise(ctx) or pool.not_2d(ctx)


@kernel("Conv", dtypes=FLOATS, out=True, bind=True, accepts=_depthwise_2d_reason, priority=15,
        name="depthwise_2d_nb")
def conv_depthwise_2d(ctx):
    """2-D depthwise conv compiled with Numba: per channel, the bias, then a multiply-add
    pass per three kernel taps over a phase-split copy of the plane (pool.py's plane kernels)."""
    x_shape, w_shape, k, begin, end, out_sp, strides, dil = _geometry(ctx)
    dt = _compute_dtype(ctx)  # float16 runs in float32 (_finish converts)
    lay = pool.PlaneLayout(x_shape, k, begin, out_sp, strides, dil)
    run = compiled(pool._depthwise_planes)
    no_bias = np.zeros(w_shape[0], dt)

    def step(x, w, b=None, *, out):
        out = out if out is not None else np.empty(tuple(x.shape[:2]) + tuple(out_sp), dt)
        taps = np.ascontiguousarray(w.reshape(w.shape[0], -1), dtype=dt)  # (C, kh*kw)
        bias = no_bias if b is None else np.ascontiguousarray(b, dtype=dt)
        return pool.run_planes(run, x, out, dt, *lay.args(), taps, bias)

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
                gemm.matmul(wm[g * mg:(g + 1) * mg], cols.reshape(n, kk, (r1 - r0) * row_pix),
                            out3[:, g * mg:(g + 1) * mg, r0 * row_pix:r1 * row_pix])
        _add_bias(out, b)
        return out

    return _finish(ctx, step, half)


# ---------------------------------------------------------------- compiled loops
# The 2-D kernels below (Winograd, compiled im2col) do their data movement in Numba loops,
# compiled on first use (_jit.py) and the multiplies in NumPy's BLAS. Each loop takes
# a range [lo, hi) of independent work items (channels, filters, rows), which a caller
# could hand to different threads; they run on the calling thread, though: the threads
# (intra_op_num_threads) are BLAS's, in the GEMMs. Tried and
# dropped (resnet50 and vgg19 at 2 threads): parallel=True (Numba's OpenMP workers spin
# after each parallel region and starve OpenBLAS's threads: resnet50 288 ms against 58 ms),
# and running Winograd's chunks on two Python threads with BLAS held at one thread (1.5-2x
# faster alone, but slower inside a network, where OpenBLAS's idle workers, spinning for
# a while after each threaded GEMM, take the second core: vgg19 167 ms against 150 ms).

_numba = jit(error_model="numpy")
_u64 = np.uint64  # unsigned index arithmetic inside the compiled loops


@_numba
def _wino_in(lo, hi, x, U, pt, pl, th, tw, r0, r1, K):
    """Winograd F(4x4, 3x3) input transform of channels lo..hi: U[36, C, (r1-r0)*(tw+1)] =
    B^T d B for every tile of tile rows r0..r1 (tile row r is row r % th of image r // th;
    x's padding reads as zeros, so x is never copied).

    Per channel: the vertical pass over whole input rows (contiguous), a 4-way
    de-interleave of its 6 result rows, then the horizontal pass over all the chunk's tiles
    as one flat loop; so each tile row carries one extra tile (tw+1), computed and unused."""
    two, four, five = K[0], K[1], K[2]
    H, W = x.shape[2], x.shape[3]
    tw1 = tw + 1
    wp = 4 * tw1
    nr = r1 - r0
    t1 = nr * tw1
    w1 = min(W, wp - pl)
    V = np.zeros((6, nr * wp + 4), x.dtype)  # the pad columns stay zero
    zero = np.zeros(W, x.dtype)
    q = np.empty((4, t1 + 1), x.dtype)
    q0, q1, q2, q3 = q[0], q[1], q[2], q[3]
    for c in range(lo, hi):
        for r in range(r0, r1):
            n = r // th
            y0 = 4 * (r - n * th) - pt
            xc = x[n, c]
            a0 = xc[y0, :w1] if 0 <= y0 < H else zero[:w1]
            a1 = xc[y0 + 1, :w1] if 0 <= y0 + 1 < H else zero[:w1]
            a2 = xc[y0 + 2, :w1] if 0 <= y0 + 2 < H else zero[:w1]
            a3 = xc[y0 + 3, :w1] if 0 <= y0 + 3 < H else zero[:w1]
            a4 = xc[y0 + 4, :w1] if 0 <= y0 + 4 < H else zero[:w1]
            a5 = xc[y0 + 5, :w1] if 0 <= y0 + 5 < H else zero[:w1]
            o = (r - r0) * wp + pl
            v0, v1, v2 = V[0, o:o + w1], V[1, o:o + w1], V[2, o:o + w1]
            v3, v4, v5 = V[3, o:o + w1], V[4, o:o + w1], V[5, o:o + w1]
            for i in range(w1):
                d0, d1, d2, d3, d4, d5 = a0[i], a1[i], a2[i], a3[i], a4[i], a5[i]
                v0[i] = four * d0 - five * d2 + d4
                v1[i] = d3 + d4 - four * (d1 + d2)
                v2[i] = four * (d1 - d2) - d3 + d4
                v3[i] = two * (d3 - d1) - d2 + d4
                v4[i] = two * (d1 - d3) - d2 + d4
                v5[i] = four * d1 - five * d3 + d5
        for k in range(6):
            vk = V[k]
            for j in range(t1 + 1):
                q0[j] = vk[4 * j]
                q1[j] = vk[4 * j + 1]
                q2[j] = vk[4 * j + 2]
                q3[j] = vk[4 * j + 3]
            u0, u1, u2 = U[6 * k, c], U[6 * k + 1, c], U[6 * k + 2, c]
            u3, u4, u5 = U[6 * k + 3, c], U[6 * k + 4, c], U[6 * k + 5, c]
            for j in range(t1):
                d0, d1, d2, d3, d4, d5 = q0[j], q1[j], q2[j], q3[j], q0[j + 1], q1[j + 1]
                u0[j] = four * d0 - five * d2 + d4
                u1[j] = d3 + d4 - four * (d1 + d2)
                u2[j] = four * (d1 - d2) - d3 + d4
                u3[j] = two * (d3 - d1) - d2 + d4
                u4[j] = two * (d1 - d3) - d2 + d4
                u5[j] = four * d1 - five * d3 + d5


@_numba
def _wino_out(lo, hi, Y, out, b, th, tw, r0, r1, K):
    """Winograd F(4x4, 3x3) output transform for filters lo..hi: out's rows of tile rows
    r0..r1 = A^T Y A + b[m], clamped to [K[4], K[5]] (a fused Relu or Clip; -inf..inf for
    none; NaN stays NaN) as they are written."""
    two, four, eight, vmin, vmax = K[0], K[1], K[3], K[4], K[5]
    OH, OW = out.shape[2], out.shape[3]
    tw1 = tw + 1
    wp = 4 * tw1
    nr = r1 - r0
    t1 = nr * tw1
    R = np.empty((6, nr * wp), Y.dtype)
    z = np.empty((4, t1), Y.dtype)
    z0, z1, z2, z3 = z[0], z[1], z[2], z[3]
    for m in range(lo, hi):
        bias = b[m]
        for k in range(6):  # the horizontal pass, then re-interleave into full rows
            y0, y1, y2 = Y[6 * k, m], Y[6 * k + 1, m], Y[6 * k + 2, m]
            y3, y4, y5 = Y[6 * k + 3, m], Y[6 * k + 4, m], Y[6 * k + 5, m]
            for j in range(t1):
                a = y1[j] + y2[j]
                s = y1[j] - y2[j]
                e = y3[j] + y4[j]
                f = y3[j] - y4[j]
                z0[j] = y0[j] + a + e
                z1[j] = s + two * f
                z2[j] = a + four * e
                z3[j] = s + eight * f + y5[j]
            rk = R[k]
            for j in range(t1):
                rk[4 * j] = z0[j]
                rk[4 * j + 1] = z1[j]
                rk[4 * j + 2] = z2[j]
                rk[4 * j + 3] = z3[j]
        for r in range(r0, r1):  # the vertical pass, straight into the output rows
            n = r // th
            y = 4 * (r - n * th)
            o = (r - r0) * wp
            g0, g1, g2 = R[0, o:o + OW], R[1, o:o + OW], R[2, o:o + OW]
            g3, g4, g5 = R[3, o:o + OW], R[4, o:o + OW], R[5, o:o + OW]
            rows = min(4, OH - y)
            if rows == 4:
                o0, o1, o2, o3 = out[n, m, y], out[n, m, y + 1], out[n, m, y + 2], out[n, m, y + 3]
                for i in range(OW):
                    a = g1[i] + g2[i]
                    s = g1[i] - g2[i]
                    e = g3[i] + g4[i]
                    f = g3[i] - g4[i]
                    v0 = g0[i] + a + e + bias
                    v1 = s + two * f + bias
                    v2 = a + four * e + bias
                    v3 = s + eight * f + g5[i] + bias
                    if v0 < vmin:
                        v0 = vmin
                    if v0 > vmax:
                        v0 = vmax
                    if v1 < vmin:
                        v1 = vmin
                    if v1 > vmax:
                        v1 = vmax
                    if v2 < vmin:
                        v2 = vmin
                    if v2 > vmax:
                        v2 = vmax
                    if v3 < vmin:
                        v3 = vmin
                    if v3 > vmax:
                        v3 = vmax
                    o0[i] = v0
                    o1[i] = v1
                    o2[i] = v2
                    o3[i] = v3
            else:  # the last tile row of an image whose height is not a multiple of 4
                for u in range(rows):
                    ou = out[n, m, y + u]
                    for i in range(OW):
                        a = g1[i] + g2[i]
                        e = g3[i] + g4[i]
                        if u == 0:
                            v = g0[i] + a + e + bias
                        elif u == 1:
                            v = g1[i] - g2[i] + two * (g3[i] - g4[i]) + bias
                        else:
                            v = a + four * e + bias
                        if v < vmin:
                            v = vmin
                        if v > vmax:
                            v = vmax
                        ou[i] = v


@_numba
def _im2col(lo, hi, xf, xbase, H, W, cf, kh, kw, sh, sw, dh, dw, pt, pl, r0, r1, OW):
    """Rows lo..hi of the column matrix of output rows r0..r1, into the flat cf:
    cols[(c*kh + ky)*kw + kx, (oy - r0)*OW + ox] = x[c, oy*sh - pt + ky*dh, ox*sw - pl + kx*dw],
    zero where that falls in the padding; xf is x flat, with channel 0 (of this image and
    group) at xbase. Flat indices are uint64: no negative-index checks (Numba's
    wraparound), so the copies vectorize and a short row costs a few ns."""
    taps = kh * kw
    nr = r1 - r0
    P = nr * OW
    HW = H * W
    for row in range(lo, hi):
        c = row // taps
        t = row % taps
        ky, kx = t // kw, t % kw
        off = kx * dw - pl
        a = 0 if off >= 0 else min(OW, (sw - 1 - off) // sw)  # [a, e): the ox that read inside x
        e = max(a, min(OW, (W - 1 - off) // sw + 1)) if W - 1 - off >= 0 else a
        for oy in range(nr):
            iy = (oy + r0) * sh - pt + ky * dh
            d = _u64(row * P + oy * OW)
            if iy < 0 or iy >= H:
                for i in range(_u64(OW)):
                    cf[d + i] = 0
                continue
            for i in range(_u64(a)):
                cf[d + i] = 0
            src = _u64(xbase + c * HW + iy * W + a * sw + off)
            dst = d + _u64(a)
            if sw == 1:
                for i in range(_u64(e - a)):
                    cf[dst + i] = xf[src + i]
            elif sw == 2:  # a constant stride vectorizes
                for i in range(_u64(e - a)):
                    cf[dst + i] = xf[src + _u64(2) * i]
            else:
                for i in range(_u64(e - a)):
                    cf[dst + i] = xf[src + _u64(sw) * i]
            dst = d + _u64(e)
            for i in range(_u64(OW - e)):
                cf[dst + i] = 0


@_numba
def _bias_act(lo, hi, y, p0, p1, b, K):
    """Rows lo..hi of y (N*M, P): y[r, p0:p1] = clamp(y + b[r % M], K[0], K[1]), the bias and
    a fused Relu/Clip in one pass (NaN stays NaN)."""
    vmin, vmax = K[0], K[1]
    M = b.shape[0]
    for r in range(lo, hi):
        bm = b[r % M]
        row = y[r, p0:p1]
        for i in range(p1 - p0):
            v = row[i] + bm
            if v < vmin:
                v = vmin
            if v > vmax:
                v = vmax
            row[i] = v


@_numba
def _bias_res_act(lo, hi, y, p0, p1, b, z, K):
    """_bias_act with a residual: y[r, p] = clamp(y + b[r % M] + z[r, p], K[0], K[1])."""
    vmin, vmax = K[0], K[1]
    M = b.shape[0]
    for r in range(lo, hi):
        bm = b[r % M]
        row = y[r, p0:p1]
        zr = z[r, p0:p1]
        for i in range(p1 - p0):
            v = row[i] + bm + zr[i]
            if v < vmin:
                v = vmin
            if v > vmax:
                v = vmax
            row[i] = v


# Activations the 2-D kernels apply themselves, as a clamp to [lo, hi] in the pass that
# writes the output (the others are left to _finish).
_CLAMPS = {"Relu": lambda p: (0.0, np.inf), "Clip": lambda p: (p[0], p[1])}


def _epilogue(ctx, allow_residual=False):
    """(ctx for _finish, lo, hi): a fused Relu/Clip is taken out of the attributes _finish
    sees and returned as clamp bounds for the kernel's own output pass. With a fused
    residual the activation comes after it, so it stays with _finish — unless the kernel
    adds the residual itself (allow_residual)."""
    act = ctx.attrs.get("activation")
    if _has_residual(ctx) and not allow_residual:
        return ctx, -np.inf, np.inf
    if act in _CLAMPS:
        lo, hi = _CLAMPS[act]([float(v) for v in ctx.attrs.get("activation_params") or []])
        attrs = {k: v for k, v in ctx.attrs.items() if k not in ("activation", "activation_params")}
        return replace(ctx, attrs=attrs), lo, hi
    return ctx, -np.inf, np.inf


def _align(nbytes):
    return (int(nbytes) + 63) // 64 * 64


def _conv2d_reason(ctx):
    x, w, k, begin, end, out, strides, dil = _geometry(ctx)
    if len(k) != 2:
        return f"not a 2-D conv ({len(k)} spatial dims)"
    if any(int(p) < 0 for p in list(begin) + list(end)):
        return "negative pads"
    if any(int(o) < 1 for o in out):
        return "empty output"
    return numba_missing()


# ---------------------------------------------------------------- Winograd F(4x4, 3x3)
# Each 4x4 block of outputs (a tile) comes from a 6x6 block of inputs: Y = A^T [(G g G^T) ⊙
# (B^T d B)] A (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"). The
# transformed weights (36, M, C) are made once at bind time (in float64); per run, a chunk of
# tile rows is transformed into U (36, C, T), 36 GEMMs Wt[a] @ U[a] (M×C @ C×T) make
# Y (36, M, T), and the output transform adds the bias and a fused Relu/Clip as it writes
# the output rows. 36 multiplies per 16 outputs instead of 144, at a rounding error a few
# times the direct conv's (see tests/test_conv_kernels.py for the bounds). As with any
# fast conv algorithm, a NaN or inf in the input spreads to the whole 4x4 tiles around it
# (the transforms mix 6x6 inputs), not just to the outputs whose windows contain it.
WINO_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                   [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
# U and Y of one chunk stay about this size (so they stay in cache between the transform,
# the GEMMs and the output transform), but a chunk is at least as large as the transformed
# weights, so that the GEMMs still amortize their passes over the weights.
WINO_CHUNK_BYTES = 4 << 20
WINO_MAX_CHUNK_BYTES = 32 << 20
# Winograd's transformed weights are 4x the plain ones, and its GEMMs are only as wide as
# there are tiles. Measured on the shapes of resnet50, vgg19 and squeezenet, it beats
# im2col when the batch has at least WINO_WIDE_TILES 4x4 tiles (28x28 and up, at any
# width), or fewer but with at most WINO_CHANNELS_PER_TILE channels (max(C, M)) per tile
# (14x14: up to 128 channels; 13x13 48>192 and 14x14 256>256 lose by 1.2-1.4x), and when C
# is at least WINO_MIN_CHANNELS (with 3 input channels, the transforms cost more than the
# multiplies they save).
WINO_WIDE_TILES = 32
WINO_CHANNELS_PER_TILE = 8
WINO_MIN_CHANNELS = 8


def _wino_weights(w, dt):
    """(M, C, 3, 3) weights → G w G^T as (36, M, C), computed in float64."""
    u = np.einsum("ai,mcij,bj->abmc", WINO_G, np.asarray(w, np.float64), WINO_G)
    return np.ascontiguousarray(u.reshape(36, w.shape[0], w.shape[1]), dtype=dt)


def _wino_plan(ctx):
    """(tile rows per image th, tiles per tile row tw, tile rows per chunk, bytes of U, of Y)."""
    x, w, k, begin, end, out, strides, dil = _geometry(ctx)
    item = _compute_dtype(ctx).itemsize
    n, c, m = int(x[0]), int(x[1]), int(w[0])
    th, tw = -(-int(out[0]) // 4), -(-int(out[1]) // 4)
    per_row = 36 * (c + m) * (tw + 1) * item
    rows = max(1, WINO_CHUNK_BYTES // per_row, -(-36 * m * c * item // per_row))
    rows = min(rows, n * th, max(1, WINO_MAX_CHUNK_BYTES // per_row))
    t = rows * (tw + 1)
    return th, tw, rows, _align(36 * c * t * item), _align(36 * m * t * item)


def _winograd_reason(ctx):
    x, w, k, begin, end, out, strides, dil = _geometry(ctx)
    if len(k) != 2 or [int(v) for v in k] != [3, 3] or any(int(s) != 1 for s in strides) \
            or any(int(d) != 1 for d in dil) or int(ctx.attrs.get("group", 1)) != 1:
        return "not a 3x3, stride-1, dilation-1, ungrouped 2-D conv"
    n, c, m = int(x[0]), int(x[1]), int(w[0])
    tiles = n * -(-int(out[0]) // 4) * -(-int(out[1]) // 4)
    if c < WINO_MIN_CHANNELS:
        return f"{c} input channels, fewer than {WINO_MIN_CHANNELS} (im2col is faster)"
    if tiles < WINO_WIDE_TILES and max(c, m) > WINO_CHANNELS_PER_TILE * tiles:
        return f"{tiles} 4x4 tiles for {max(c, m)} channels: too few to pay for the transformed weights"
    return _conv2d_reason(ctx)


def _winograd_workspace(ctx):
    th, tw, rows, u_bytes, y_bytes = _wino_plan(ctx)
    return u_bytes + y_bytes


@kernel("Conv", dtypes=FLOATS, out=True, bind=True, accepts=_winograd_reason, priority=15, name="winograd",
        workspace=_winograd_workspace,
        drops_nan="its transforms add and subtract neighbouring inputs: one Inf makes NaN of its output tile")
def conv_winograd(ctx):
    """3x3 stride-1 conv by Winograd F(4x4, 3x3): weights transformed once; per chunk of
    tile rows, an input transform, 36 GEMMs and an output transform that adds the bias and
    a fused Relu/Clip."""
    x_shape, w_shape, k, begin, end, out_sp, strides, dil = _geometry(ctx)
    half = ctx.dtype(0) == np.float16
    dt = _compute_dtype(ctx)
    n, c, m = int(x_shape[0]), int(x_shape[1]), int(w_shape[0])
    th, tw, rows, u_bytes, y_bytes = _wino_plan(ctx)
    tw1 = tw + 1
    pt, pl = int(begin[0]), int(begin[1])
    ctx, lo, hi = _epilogue(ctx)
    consts = np.array([2, 4, 5, 8, lo, hi], dt)
    zeros = np.zeros(m, dt)
    w_const = ctx.const(1)
    wt_const = _wino_weights(w_const, dt) if w_const is not None else None
    ws = ctx.workspace
    wino_in, wino_out = compiled(_wino_in), compiled(_wino_out)

    def step(x, w, b=None, *, out):
        if ws is not None:
            ub, yb = ws[:u_bytes].view(dt), ws[u_bytes:u_bytes + y_bytes].view(dt)
        else:
            ub, yb = np.empty(u_bytes // dt.itemsize, dt), np.empty(y_bytes // dt.itemsize, dt)
        wt = wt_const if wt_const is not None else _wino_weights(w, dt)  # weights known only now
        bias = zeros if b is None else b
        x = np.ascontiguousarray(x, dtype=dt)
        for r0 in range(0, n * th, rows):
            r1 = min(n * th, r0 + rows)
            t = (r1 - r0) * tw1
            u = ub[:36 * c * t].reshape(36, c, t)
            y = yb[:36 * m * t].reshape(36, m, t)
            wino_in(0, c, x, u, pt, pl, th, tw, r0, r1, consts)
            gemm.matmul(wt, u, y)
            wino_out(0, m, y, out, bias, th, tw, r0, r1, consts)
        return out

    return _finish(ctx, step, half)


# ---------------------------------------------------------------- 2-D im2col (compiled)
def _im2col2d_plan(ctx):
    """(output rows per tile, bytes of the column buffer) for the 2-D im2col kernel."""
    x, w, k, begin, end, out, strides, dil = _geometry(ctx)
    item = _compute_dtype(ctx).itemsize
    per_row = int(w[1]) * int(np.prod(k)) * int(out[1]) * item
    rows = max(1, min(int(out[0]), IM2COL_TILE_BYTES // max(per_row, 1)))
    return rows, _align(rows * per_row)


def _im2col2d_workspace(ctx):
    return _im2col2d_plan(ctx)[1]


@kernel("Conv", dtypes=FLOATS, out=True, bind=True, accepts=_conv2d_reason, priority=5, name="im2col2d",
        workspace=_im2col2d_workspace)
def conv_im2col2d(ctx):
    """2-D conv (any kernel, stride, dilation, pads, groups): compiled im2col of a tile of
    output rows straight from the input (no padded copy), a GEMM per group into the output,
    then one pass for the bias and a fused Relu/Clip while the tile is in cache."""
    x_shape, w_shape, k, begin, end, out_sp, strides, dil = _geometry(ctx)
    half = ctx.dtype(0) == np.float16
    dt = _compute_dtype(ctx)
    group = int(ctx.attrs.get("group", 1))
    n, cg = int(x_shape[0]), int(w_shape[1])
    m = int(w_shape[0])
    mg = m // group
    kh, kw = int(k[0]), int(k[1])
    kk = cg * kh * kw
    h, w_in = int(x_shape[2]), int(x_shape[3])
    chw = int(x_shape[1]) * h * w_in
    oh, ow = int(out_sp[0]), int(out_sp[1])
    sh, sw = int(strides[0]), int(strides[1])
    dh, dw = int(dil[0]), int(dil[1])
    pt, pl = int(begin[0]), int(begin[1])
    rows, cols_bytes = _im2col2d_plan(ctx)
    ctx, lo, hi = _epilogue(ctx)
    clamp = np.array([lo, hi], dt)
    clamps = not (lo == -np.inf and hi == np.inf)
    zeros = np.zeros(m, dt)
    ws = ctx.workspace
    im2col, bias_act = compiled(_im2col), compiled(_bias_act)

    def step(x, w, b=None, *, out):
        cols_buf = ws[:cols_bytes].view(dt) if ws is not None else np.empty(cols_bytes // dt.itemsize, dt)
        xf = np.ascontiguousarray(x, dtype=dt).reshape(-1)
        out3 = out.reshape(n, m, oh * ow)
        out2 = out.reshape(n * m, oh * ow)
        wm = w.reshape(m, kk)
        bias = zeros if b is None else b
        for i in range(n):
            for r0 in range(0, oh, rows):
                r1 = min(oh, r0 + rows)
                p = (r1 - r0) * ow
                cf = cols_buf[:kk * p]
                for g in range(group):
                    im2col(0, kk, xf, i * chw + g * cg * h * w_in, h, w_in, cf, kh, kw, sh, sw, dh, dw,
                           pt, pl, r0, r1, ow)
                    gemm.matmul(wm[g * mg:(g + 1) * mg], cf.reshape(kk, p),
                                out3[i, g * mg:(g + 1) * mg, r0 * ow:r1 * ow])
                if b is not None or clamps:
                    bias_act(0, m, out2[i * m:(i + 1) * m], r0 * ow, r1 * ow, bias, clamp)
        return out

    return _finish(ctx, step, half)


# The same kernels run glassrt::FusedConv (a conv with its activation applied in place).
for _k in [k for k in list(registry.kernels_for("cpu", "", "Conv"))]:
    registry.register(replace(_k, name=_k.name.replace("cpu.Conv", "cpu.FusedConv"), domain="glassrt",
                              op_type="FusedConv"))
