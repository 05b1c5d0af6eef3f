"""Conv, pooling, MatMul, Gemm and normalization: shapes with symbolic batch kept."""
from __future__ import annotations

import numpy as np

from ... import symbolic
from ..registry import meta
from ._util import broadcast, expect_shape


def _ceil_div(a, b):
    return -((-a) // b)


def conv_out_dim(ctx, size, k, stride, dilation, pad_begin, pad_end, auto_pad, ceil_mode=False, pool=False):
    eff_k = dilation * (k - 1) + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return symbolic.normalize(_ceil_div(size, stride)) if not isinstance(size, int) else _ceil_div(size, stride)
    if auto_pad == "VALID":
        pad_begin = pad_end = 0
    span = size + pad_begin + pad_end - eff_k
    if isinstance(span, int) and span < 0:
        # A pool's window that overruns the padded input by less than a stride still gives
        # one output: onnx's shape inference and onnxruntime divide with C's truncation
        # ((1 - 2) // 2 + 1 = 1), and onnxruntime's kernels pool what lies inside (rapidocr's
        # recognizer fed a short text line). Anything else overrunning is refused.
        if not pool or -span >= stride:
            ctx.fail(f"kernel {k} (dilation {dilation}) is larger than the padded input dim "
                     f"{size + pad_begin + pad_end}")
        return 1
    if ceil_mode:
        out = _ceil_div(span, stride) + 1
        # The last window must start inside the input or its begin padding (PyTorch's rule,
        # which onnx's shape inference and onnxruntime follow).
        if isinstance(out, int) and (out - 1) * stride >= size + pad_begin:
            out -= 1
    else:
        out = span // stride + 1
    return out if isinstance(out, int) else symbolic.normalize(out)


def spatial_params(ctx, rank_spatial, kernel_shape):
    strides = list(ctx.attrs.get("strides") or [1] * rank_spatial)
    dilations = list(ctx.attrs.get("dilations") or [1] * rank_spatial)
    pads = list(ctx.attrs.get("pads") or [0] * (2 * rank_spatial))
    if len(strides) != rank_spatial or len(dilations) != rank_spatial or len(pads) != 2 * rank_spatial:
        ctx.fail(f"strides {strides}, dilations {dilations} and pads {pads} must match the "
                 f"{rank_spatial} spatial dims of kernel {list(kernel_shape)}")
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dilations):
        ctx.fail(f"strides {strides} and dilations {dilations} must be positive")
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    return strides, dilations, pads, auto_pad


@meta("Conv")
def conv(ctx):
    return [ctx.tensor(ctx.dtype(0), conv_shape(ctx, 0, 1, 2))]


@meta("ConvInteger")
def conv_integer(ctx):
    return [ctx.tensor(np.dtype(np.int32), conv_shape(ctx, 0, 1, None))]


@meta("QLinearConv")
def qlinear_conv(ctx):
    """y's type is y_zero_point's (x's without one, as the kernels write it), its shape
    Conv's; the bias one per output channel. (Here rather than onnx's per-node inference,
    ~0.35 ms a node of a quantized CNN's creation.)"""
    y_dt = ctx.dtype(7) if ctx.has(7) and ctx.dtype(7) is not None else ctx.dtype(0)
    return [ctx.tensor(y_dt, conv_shape(ctx, 0, 3, 8))]


def conv_shape(ctx, x_at, w_at, bias_at):
    """A convolution's output shape (None where x or w has no known shape): x's batch, w's
    filters, each spatial dim by the attributes; what does not fit fails the node."""
    x, w = ctx.shape(x_at), ctx.shape(w_at)
    if x is None or w is None:
        return None
    if len(x) < 3 or len(w) != len(x):
        ctx.fail(f"input {symbolic.shape_str(x)} and weight {symbolic.shape_str(w)} must have the same rank (>= 3)")
    group = int(ctx.attr("group", 1))
    kernel = list(ctx.attrs.get("kernel_shape") or w[2:])
    if len(kernel) != len(w) - 2 or any(isinstance(a, int) and isinstance(b, int) and a != b
                                        for a, b in zip(kernel, w[2:])):
        ctx.fail(f"kernel_shape {kernel} contradicts the weight's shape {symbolic.shape_str(w)}")
    if isinstance(x[1], int) and isinstance(w[1], int) and x[1] != w[1] * group:
        ctx.fail(f"input has {x[1]} channels but weight {symbolic.shape_str(w)} with group={group} "
                 f"expects {w[1] * group}")
    if bias_at is not None:
        expect_shape(ctx, bias_at, (w[0],), "bias, one per output channel")
    strides, dilations, pads, auto_pad = spatial_params(ctx, len(x) - 2, kernel)
    n = len(kernel)
    out = [x[0], w[0]] + [conv_out_dim(ctx, x[2 + i], kernel[i], strides[i], dilations[i], pads[i], pads[i + n], auto_pad)
                          for i in range(n)]
    return tuple(out)


def conv_transpose_geometry(x_shape, w_shape, attrs):
    """ConvTranspose's kernel, strides, dilations, begin pads and output spatial shape, from
    the input and weight shapes and the attributes (the spec's rules). The spatial dims may
    be symbolic (then so are the output's); a ValueError says what does not fit."""
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
    if min(strides) <= 0 or min(dil) <= 0 or min(k) <= 0:
        raise ValueError(f"kernel_shape {k}, strides {strides} and dilations {dil} must be positive")
    if min(pads, default=0) < 0:
        raise ValueError(f"pads {pads} must not be negative")
    if any(not 0 <= op < max(s, d) for op, s, d in zip(out_pad, strides, dil)):
        raise ValueError(f"output_padding {out_pad} must be at least 0 and smaller than the stride {strides} "
                         f"or the dilation {dil}")
    in_sp = [int(v) if isinstance(v, (int, np.integer)) else v for v in x_shape[2:]]
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
    out = [o if isinstance(o, int) else symbolic.normalize(o) for o in out]
    return k, strides, dil, begin, out


@meta("ConvTranspose")
def conv_transpose(ctx):
    x, w = ctx.shape(0), ctx.shape(1)
    if x is None or w is None:
        return [ctx.tensor(ctx.dtype(0), None)]
    if len(x) < 3 or len(w) != len(x):
        ctx.fail(f"input {symbolic.shape_str(x)} and weight {symbolic.shape_str(w)} must have the same rank (>= 3)")
    if ctx.dtype(1) is not None and ctx.dtype(0) != ctx.dtype(1):
        ctx.fail(f"X is {ctx.dtype(0)} but W is {ctx.dtype(1)}: they must have one type")
    group = int(ctx.attr("group", 1))
    if isinstance(x[1], int) and isinstance(w[0], int) and (x[1] != w[0] or w[0] % group):
        ctx.fail(f"input has {x[1]} channels but weight {symbolic.shape_str(w)} with group={group} expects {w[0]}")
    try:
        k, _, _, _, out = conv_transpose_geometry(x, w, ctx.attrs)
    except ValueError as e:
        ctx.fail(str(e))
    if any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(k, w[2:])):
        ctx.fail(f"kernel_shape {k} contradicts the weight's shape {symbolic.shape_str(w)}")
    if any(isinstance(o, int) and o < 0 for o in out):
        ctx.fail(f"the output's spatial dims {out} would be negative")
    expect_shape(ctx, 2, (w[1] * group,), "bias, one per output channel")
    return [ctx.tensor(ctx.dtype(0), (x[0], w[1] * group, *out))]


@meta(["MaxPool", "AveragePool", "LpPool"])
def pool(ctx):
    x = ctx.shape(0)
    if x is None:
        return [ctx.tensor(ctx.dtype(0), None)] * len(ctx.node.outputs)
    kernel = list(ctx.attr("kernel_shape"))
    if len(kernel) != len(x) - 2:
        ctx.fail(f"kernel_shape {kernel} does not match input {symbolic.shape_str(x)}")
    strides, dilations, pads, auto_pad = spatial_params(ctx, len(kernel), kernel)
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    n = len(kernel)
    # (onnxruntime's pool attributes: a window is never all padding)
    if any(k <= 0 for k in kernel):
        ctx.fail(f"kernel_shape {kernel} must be positive")
    if any(p < 0 or p >= kernel[i % n] for i, p in enumerate(pads)):
        ctx.fail(f"pads {pads} must be at least 0 and smaller than the kernel {kernel}")
    out = tuple(x[:2]) + tuple(conv_out_dim(ctx, x[2 + i], kernel[i], strides[i], dilations[i], pads[i], pads[i + n],
                                            auto_pad, ceil_mode, pool=True) for i in range(n))
    res = [ctx.tensor(ctx.dtype(0), out)]
    if len(ctx.node.outputs) > 1:
        res.append(ctx.tensor(np.int64, out))
    return res


@meta("MaxUnpool", versions=(9, None))
def max_unpool(ctx):
    """output_shape's value where it is given, else the pooling's geometry undone. A fed
    output_shape is known when a run binds the node, so the memory limit is checked against
    it before anything is allocated (a fed [1, 1, 1e5, 1e5] asked NumPy for 37 GiB). That the
    shape holds the unpooled tensor is the kernel's check (it needs the indices)."""
    x, dt = ctx.shape(0), ctx.dtype(0)
    if ctx.has(2):
        v = ctx.const(2)
        if v is None:
            n = ctx.shape(2)
            rank = n[0] if n is not None and len(n) == 1 and isinstance(n[0], int) else None
            return [ctx.tensor(dt, None if rank is None else tuple(symbolic.fresh() for _ in range(rank)))]
        dims = [int(d) for d in v.reshape(-1)]
        if any(d < 0 for d in dims) or (x is not None and len(dims) != len(x)):
            ctx.fail(f"output_shape {dims} must have the input's {len(x) if x is not None else ''} dims, none negative")
        return [ctx.tensor(dt, tuple(dims))]
    if x is None:
        return [ctx.tensor(dt, None)]
    kernel = list(ctx.attr("kernel_shape"))
    n = len(kernel)
    strides, pads = list(ctx.attrs.get("strides") or [1] * n), list(ctx.attrs.get("pads") or [0] * (2 * n))
    if len(x) != n + 2 or len(strides) != n or len(pads) != 2 * n:
        ctx.fail(f"kernel_shape {kernel}, strides {strides} and pads {pads} do not match input {symbolic.shape_str(x)}")
    out = [(x[2 + i] - 1) * strides[i] - pads[i] - pads[i + n] + kernel[i] for i in range(n)]
    return [ctx.tensor(dt, (*x[:2], *(d if isinstance(d, int) else symbolic.normalize(d) for d in out)))]


@meta(["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def global_pool(ctx):
    x = ctx.shape(0)
    if x is None:
        return [ctx.tensor(ctx.dtype(0), None)]
    if 0 in x[2:]:
        ctx.fail(f"input {symbolic.shape_str(x)} has an empty spatial dim: nothing to pool")
    return [ctx.tensor(ctx.dtype(0), tuple(x[:2]) + (1,) * (len(x) - 2))]


@meta("MatMul")
def matmul(ctx):
    return [ctx.tensor(ctx.dtype(0), matmul_shape(ctx, ctx.shape(0), ctx.shape(1)))]


def matmul_shape(ctx, a, b, same_dtype: bool = True):
    """MatMul's output shape for operands of shapes a and b (None where one is unknown);
    same_dtype: inputs 0 and 1 must share an element type (MatMul's, not the integer ones')."""
    if same_dtype and ctx.dtype(0) != ctx.dtype(1):
        ctx.fail(f"inputs must share one element type, got {ctx.dtype(0)} and {ctx.dtype(1)}")
    if a is None or b is None:
        return None
    if len(a) == 0 or len(b) == 0:
        ctx.fail("MatMul inputs must have rank >= 1")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    k1, k2 = a2[-1], b2[-2]
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        ctx.fail(f"inner dims differ: {symbolic.shape_str(a)} @ {symbolic.shape_str(b)}")
    batch = broadcast(ctx, a2[:-2], b2[:-2])
    out = list(batch) + [a2[-2], b2[-1]]
    if len(a) == 1:
        out.pop(-2)
    if len(b) == 1:
        out.pop(-1)
    return tuple(out)


@meta("Gemm")
def gemm(ctx):
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None:
        return [ctx.tensor(ctx.dtype(0), None)]
    if len(a) != 2 or len(b) != 2:
        ctx.fail(f"A {symbolic.shape_str(a)} and B {symbolic.shape_str(b)} must be 2-D")
    ta, tb = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))
    m, k1 = (a[1], a[0]) if ta else (a[0], a[1])
    k2, n = (b[1], b[0]) if tb else (b[0], b[1])
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        ctx.fail(f"inner dims differ: A {symbolic.shape_str(a)} (transA={ta}) and B {symbolic.shape_str(b)} (transB={tb})")
    if ctx.has(2) and ctx.shape(2) is not None:
        c = ctx.shape(2)
        # C broadcasts unidirectionally to (M, N).
        for cd, od in zip(reversed(c), (n, m)):
            if isinstance(cd, int) and isinstance(od, int) and cd not in (1, od):
                ctx.fail(f"C {symbolic.shape_str(c)} does not broadcast to ({m}, {n})")
    return [ctx.tensor(ctx.dtype(0), (m, n))]


@meta("BatchNormalization")
def batch_norm(ctx):
    out = [ctx.tensor(ctx.dtype(0), ctx.shape(0))]
    x = ctx.shape(0)
    c = (x[1],) if x is not None and len(x) > 1 else None
    if int(ctx.attr("spatial", 1)):  # BatchNormalization-7's spatial=0 takes per-activation parameters
        for i, what in ((1, "scale"), (2, "B"), (3, "mean"), (4, "var")):
            expect_shape(ctx, i, c, f"{what}, one per channel")
    for i in range(1, len(ctx.node.outputs)):
        stat_dtype = ctx.dtype(3) if ctx.n_inputs > 3 else ctx.dtype(0)
        out.append(ctx.tensor(stat_dtype, c))
    return out
