"""Normalizations with statistics: Layer/Group/RMS/Instance/Lp/MeanVariance normalization, LRN,
and BatchNormalization in training mode.

Statistics are computed in float32 for half-precision inputs (float64 for float64 inputs),
as the ops' `stash_type` / function bodies prescribe; the normalized values are cast back to
the input type before the affine step, the way the ONNX function bodies do it.

The kernels write into their planned outputs. Those whose statistics are per row of a
flattened view (Layer, Group, Instance, RMS normalization) run a block of rows at a time
and LRN a block of pixels at a time, so that their temporaries are a block in size; every
row is reduced by the same NumPy calls as the whole array would be, so the numbers are the same.
"""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from . import rows
from ._util import FLOATS_BF16, as_out, new_out, norm_axis, write_elementwise
from ..buffers import TILE_ELEMENTS


def _work(dt):
    """The dtype statistics are computed in: float64 stays, everything narrower runs in float32."""
    return np.dtype(np.float64) if np.dtype(dt) == np.float64 else np.dtype(np.float32)


def _out_dtype(ctx, i, default):
    t = ctx.output_types[i] if i < len(ctx.output_types) else None
    return np.dtype(t.dtype) if t is not None and getattr(t, "dtype", None) is not None else np.dtype(default)


def _standardize(x2, axis, eps):
    """(x - mean) / sqrt(var + eps) along `axis` (a tuple), with mean and 1/std (keepdims)."""
    mean = x2.mean(axis=axis, keepdims=True)
    d = x2 - mean
    var = np.mean(np.square(d), axis=axis, keepdims=True)
    inv = 1.0 / np.sqrt(var + x2.dtype.type(eps))
    d *= inv
    return d, mean, inv


def _outputs(out, n):
    """The op's n output buffers (None where the node has fewer outputs or none was planned)."""
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return (out + (None,) * n)[:n]


def _row_blocks(n_rows, row_len):
    """Slices over n_rows rows of row_len elements, about a tile of elements each."""
    step = max(1, TILE_ELEMENTS // max(row_len, 1))
    for r0 in range(0, n_rows, step):
        yield slice(r0, min(r0 + step, n_rows))


def _affine(norm, x_dtype, scale, bias, out_dtype):
    """Cast the normalized values to x's type (as the function bodies do), then scale and shift.
    Half types do the affine step in float32 and round once."""
    y = norm.astype(x_dtype, copy=False)
    if y.dtype != np.float64 and y.dtype != np.float32:
        y = y.astype(np.float32)
        scale = scale.astype(np.float32)
        bias = bias.astype(np.float32) if bias is not None else None
    y = y * scale
    if bias is not None:
        y += bias
    return y.astype(out_dtype, copy=False)


# ---------------------------------------------------------------- LayerNormalization


def _per_column(p, normalized_shape) -> bool:
    """p is float32 and holds one value per element of the normalized shape (so it lines
    up with a flattened row), not a smaller tensor that broadcasts."""
    return p.dtype == np.float32 and p.size == int(np.prod(normalized_shape, dtype=np.int64)) and \
        p.ndim <= len(normalized_shape) and tuple(p.shape) == tuple(normalized_shape[len(normalized_shape) - p.ndim:])


@kernel("LayerNormalization", dtypes=FLOATS_BF16, out=True, bind=True, multi=True, any_shape=True,
        versions=(17, None))
def layer_normalization(ctx):
    """Y = (X - mean) / sqrt(var + eps) * Scale + B over dims [axis, rank); Mean and InvStdDev too."""
    axis_attr = int(ctx.attrs.get("axis", -1))
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    stat_dt = [_out_dtype(ctx, i, np.float32) for i in (1, 2)]

    def step(x, scale, bias=None, *, out=(None,)):
        y_out, mean_out, inv_out = _outputs(out, 3)
        a = norm_axis(axis_attr, x.ndim)
        if not 0 <= a < max(x.ndim, 1):
            raise ValueError(f"axis {axis_attr} out of range for input of rank {x.ndim}")
        n = int(np.prod(x.shape[:a], dtype=np.int64))
        red = x.shape[:a] + (1,) * (x.ndim - a)
        y = new_out(y_out, x.shape, x.dtype)
        if rows.usable(x) and n and _per_column(scale, x.shape[a:]) and (bias is None or _per_column(bias, x.shape[a:])):
            m = x.size // n
            mean, inv = rows.layer_norm_rows(x.reshape(n, m), scale.reshape(-1),
                                             np.zeros(m, np.float32) if bias is None else bias.reshape(-1), eps,
                                             y.reshape(n, m))
        else:
            mean, inv = _layer_norm_blocks(x, a, n, scale, bias, eps, y)
        return (y, as_out(mean.reshape(red).astype(stat_dt[0]), mean_out),
                as_out(inv.reshape(red).astype(stat_dt[1]), inv_out))

    return step


def _layer_norm_blocks(x, a, n, scale, bias, eps, y):
    """LayerNormalization of the rows of x (n rows: the dims from `a` on, flattened) into y,
    a block of rows at a time; returns each row's mean and 1/std, (n, 1) in the work dtype."""
    inner = tuple(x.shape[a:])
    m = int(np.prod(inner, dtype=np.int64))
    x2, y2 = x.reshape(n, m), y.reshape(n, m)
    mean, inv = np.empty((n, 1), _work(x.dtype)), np.empty((n, 1), _work(x.dtype))
    # Parameters with more dims than the normalized shape broadcast against the whole of x,
    # as the op's formula says: one block, in x's own shape.
    whole = scale.ndim > len(inner) or (bias is not None and bias.ndim > len(inner))
    for block in [slice(0, n)] if whole else _row_blocks(n, m):
        count = block.stop - block.start
        xb = x2[block].astype(_work(x.dtype), copy=False)
        norm, mean[block], inv[block] = _standardize(xb, (1,), eps)
        shape = x.shape if whole else (count,) + inner
        yb = _affine(norm.reshape(shape), x.dtype, scale, bias, x.dtype)
        if yb.shape != shape:
            raise ValueError(f"Scale {list(scale.shape)} and B {None if bias is None else list(bias.shape)} "
                             f"broadcast the output to {list(yb.shape)}, not to X's shape {list(x.shape)}")
        y2[block] = yb.reshape(count, m)
    return mean, inv


# ---------------------------------------------------------------- GroupNormalization


def _normalize_rows(x, n_rows, eps, y, affine):
    """x standardized per row of its (n_rows, m) view, written into y's (n_rows, m) view a
    block of rows at a time: affine(standardized block (rows, m), rows slice) is the block's output."""
    m = x.size // n_rows if n_rows else 0
    x2, y2 = x.reshape(n_rows, m), y.reshape(n_rows, m)
    for block in _row_blocks(n_rows, m):
        norm = _standardize(x2[block].astype(_work(x.dtype), copy=False), (1,), eps)[0]
        y2[block] = affine(norm, block).reshape(block.stop - block.start, m)
    return y


def _per_row(p, channels, rows_per_instance):
    """A per-channel (or per-group) parameter as one row per (instance, channel) row of the
    standardized view: p_rows(block) -> (rows, 1); a one-value p broadcasts as before."""
    table = np.broadcast_to(p.reshape(1, -1, 1), (1, channels, 1)).reshape(channels, 1)
    return lambda block: table[np.arange(block.start, block.stop) % rows_per_instance]


def _check_groups(x, num_groups):
    n, c = x.shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise ValueError(f"num_groups={num_groups} must divide the channel count {c}")


@kernel("GroupNormalization", dtypes=FLOATS_BF16, out=True, versions=(21, None))
def group_normalization(x, scale, bias, *, out=None, num_groups, epsilon=1e-5, stash_type=1):
    """Statistics per (instance, group of channels); scale and bias per channel."""
    g = int(num_groups)
    _check_groups(x, g)
    n, c = x.shape[:2]
    cg = c // g
    # A row of the standardized view is one (instance, group): its channels' parameters.
    scales, biases = (np.broadcast_to(p.reshape(1, -1, 1), (1, c, 1)).reshape(g, cg, 1) for p in (scale, bias))

    def affine(norm, block):
        grp = np.arange(block.start, block.stop) % g
        return _affine(norm.reshape(len(grp), cg, -1), x.dtype, scales[grp], biases[grp], x.dtype)

    return _normalize_rows(x, n * g, epsilon, new_out(out, x.shape, x.dtype), affine)


@kernel("GroupNormalization", dtypes=FLOATS_BF16, out=True, versions=(18, 20), name="v18")
def group_normalization_18(x, scale, bias, *, out=None, num_groups, epsilon=1e-5):
    """Opset 18: scale and bias are per group."""
    g = int(num_groups)
    _check_groups(x, g)
    scales, biases = _per_row(scale, g, g), _per_row(bias, g, g)
    return _normalize_rows(x, x.shape[0] * g, epsilon, new_out(out, x.shape, x.dtype),
                           lambda norm, block: _affine(norm, x.dtype, scales(block), biases(block), x.dtype))


# ---------------------------------------------------------------- RMSNormalization


@kernel("RMSNormalization", dtypes=FLOATS_BF16, out=True, bind=True, versions=(23, None))
def rms_normalization(ctx):
    """Y = X / sqrt(mean(X^2 over [axis, rank)) + eps) * scale."""
    axis_attr = int(ctx.attrs.get("axis", -1))
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    out_dt = _out_dtype(ctx, 0, ctx.dtype(0) or np.float32)

    def rms(x, axes, scale):
        xw = x.astype(_work(x.dtype), copy=False)
        ms = np.mean(np.square(xw), axis=axes, keepdims=True)
        norm = xw / np.sqrt(ms + xw.dtype.type(eps))
        return _affine(norm, x.dtype, scale, None, out_dt)

    def step(x, scale, *, out=None):
        a = norm_axis(axis_attr, x.ndim)
        if not 0 <= a < max(x.ndim, 1):
            raise ValueError(f"axis {axis_attr} out of range for input of rank {x.ndim}")
        inner = tuple(x.shape[a:])
        if out is None or scale.ndim > len(inner):  # a scale that broadcasts over the leading dims too
            return as_out(rms(x, tuple(range(a, x.ndim)), scale), out)
        # Rows: the leading dims flattened, the reduced dims kept, as the whole array reduces them.
        n, m = int(np.prod(x.shape[:a], dtype=np.int64)), int(np.prod(inner, dtype=np.int64))
        xr, yr = x.reshape((n,) + inner), out.reshape((n,) + inner)
        for block in _row_blocks(n, m):
            yr[block] = rms(xr[block], tuple(range(1, 1 + len(inner))), scale)
        return out

    return step


# ---------------------------------------------------------------- InstanceNormalization


@kernel("InstanceNormalization", dtypes=FLOATS_BF16, out=True)
def instance_normalization(x, scale, bias, *, out=None, epsilon=1e-5, consumed_inputs=None):
    """Statistics per (instance, channel) over the spatial dims."""
    if x.ndim < 3:
        raise ValueError(f"input must have rank >= 3 (N, C, D1, ...), got shape {x.shape}")
    n, c = x.shape[:2]
    scales, biases = _per_row(scale, c, c), _per_row(bias, c, c)
    # The normalized values stay in the work dtype through the affine step, rounded once.
    return _normalize_rows(x, n * c, epsilon, new_out(out, x.shape, x.dtype),
                           lambda norm, block: _affine(norm, _work(x.dtype), scales(block), biases(block), x.dtype))


# ---------------------------------------------------------------- LpNormalization


@kernel("LpNormalization", dtypes=FLOATS_BF16, out=True)
def lp_normalization(x, *, out=None, axis=-1, p=2):
    """x / ||x||_p along `axis`; a zero norm gives 0 (not NaN)."""
    if p not in (1, 2):
        raise ValueError(f"p must be 1 or 2, got {p}")
    a = norm_axis(axis, x.ndim)
    wd = _work(x.dtype)
    xw = x.astype(wd, copy=False)
    if p == 1:
        norm = np.abs(xw).sum(axis=a, keepdims=True)
    else:
        norm = np.sqrt(np.square(xw).sum(axis=a, keepdims=True))

    def divide(v, nv):
        vw = v.astype(wd, copy=False)
        return np.where(nv == 0, 0, vw / np.where(nv == 0, 1, nv)).astype(x.dtype)

    return write_elementwise(out, divide, x, norm)


# ---------------------------------------------------------------- MeanVarianceNormalization


@kernel("MeanVarianceNormalization", dtypes=FLOATS_BF16, out=True)
def mean_variance_normalization(x, *, out=None, axes=(0, 2, 3)):
    """(x - E[x]) / (sqrt(Var[x]) + 1e-9) over `axes` (the function body's epsilon)."""
    ax = tuple(sorted({norm_axis(int(a), x.ndim) for a in axes}))
    if any(not 0 <= a < x.ndim for a in ax):
        raise ValueError(f"axes {list(axes)} out of range for input of rank {x.ndim}")
    xw = x.astype(_work(x.dtype), copy=False)
    mean = xw.mean(axis=ax, keepdims=True)
    d = xw - mean
    std = np.sqrt(np.mean(np.square(d), axis=ax, keepdims=True))
    eps = xw.dtype.type(1e-9)
    return write_elementwise(out, lambda dv, sv: (dv / (sv + eps)).astype(x.dtype), d, std)


# ---------------------------------------------------------------- LRN


@kernel("LRN", dtypes=FLOATS_BF16, out=True)
def lrn(x, *, out=None, size, alpha=0.0001, beta=0.75, bias=1.0):
    """y = x / (bias + alpha / size * sum of x^2 over a window of `size` channels) ** beta.
    The window runs across channels only: a block of pixels at a time, all channels."""
    if x.ndim < 3:
        raise ValueError(f"input must have rank >= 3 (N, C, D1, ...), got shape {x.shape}")
    y = new_out(out, x.shape, x.dtype)
    n, c = x.shape[:2]
    x3, y3 = x.reshape(n, c, -1), y.reshape(n, c, -1)
    pixels = max(1, TILE_ELEMENTS // max(c, 1))
    for i in range(n):
        for p0 in range(0, x3.shape[2], pixels):
            block = (slice(i, i + 1), slice(None), slice(p0, p0 + pixels))
            y3[block] = _lrn_block(x3[block], int(size), alpha, beta, bias)
    return y


def _lrn_block(x, size, alpha, beta, bias):
    """LRN of x (1, C, pixels), computed in the work dtype, returned in x's."""
    c = x.shape[1]
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)  # channels before / after the centre
    xw = x.astype(_work(x.dtype), copy=False)
    t = xw.dtype.type
    sq = np.square(xw)
    ss = np.zeros_like(sq)
    # One shifted add per window tap (size is small): ss[c] = sum sq[c + o], o in [-lo, hi].
    for o in range(-lo, hi + 1):
        if o >= 0 and o < c:
            ss[:, :c - o] += sq[:, o:]
        elif o < 0 and -o < c:
            ss[:, -o:] += sq[:, :c + o]
    del sq
    # (bias + alpha / size * ss) ** beta, then x / that: in place in ss.
    np.multiply(t(alpha / size), ss, out=ss)
    np.add(t(bias), ss, out=ss)
    np.power(ss, t(beta), out=ss)
    np.divide(xw, ss, out=ss)
    return ss.astype(x.dtype, copy=False)


# ---------------------------------------------------------------- BatchNormalization (training)


@kernel("BatchNormalization", dtypes=FLOATS_BF16, out=True, multi=True, versions=(14, None), name="training",
        accepts=lambda ctx: None if int(ctx.attrs.get("training_mode", 0)) else "only training_mode=1")
def batch_norm_training(x, scale, bias, input_mean, input_var, *, out=(None,), epsilon=1e-5, momentum=0.9,
                        training_mode=0):
    """Training BatchNormalization: normalize with the batch statistics, update the running ones."""
    if x.ndim < 2:
        raise ValueError(f"input must have rank >= 2 (N, C, ...), got shape {x.shape}")
    axes = (0,) + tuple(range(2, x.ndim))
    xw = x.astype(_work(x.dtype), copy=False)
    mean = xw.mean(axis=axes)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    var = np.mean(np.square(xw - mean.reshape(shape)), axis=axes)  # population variance
    inv = 1.0 / np.sqrt(var + xw.dtype.type(epsilon))
    y = (xw - mean.reshape(shape)) * (inv * scale.astype(xw.dtype)).reshape(shape)
    y += bias.astype(xw.dtype).reshape(shape)
    m = float(momentum)
    run_mean = input_mean.astype(xw.dtype) * m + mean * (1 - m)
    run_var = input_var.astype(xw.dtype) * m + var * (1 - m)
    results = (y.astype(x.dtype), run_mean.astype(input_mean.dtype), run_var.astype(input_var.dtype))
    return tuple(as_out(r, o) for r, o in zip(results, _outputs(out, 3)))
