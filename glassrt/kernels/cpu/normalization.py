"""Normalizations with statistics: Layer/Group/RMS/Instance/Lp/MeanVariance normalization, LRN,
and BatchNormalization in training mode.

Statistics are computed in float32 for half-precision inputs (float64 for float64 inputs),
as the ops' `stash_type` / function bodies prescribe; the normalized values are cast back to
the input type before the affine step, the way the ONNX function bodies do it.
"""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from . import rows
from ._util import FLOATS_BF16, norm_axis


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


@kernel("LayerNormalization", dtypes=FLOATS_BF16, bind=True, multi=True, versions=(17, None))
def layer_normalization(ctx):
    """Y = (X - mean) / sqrt(var + eps) * Scale + B over dims [axis, rank); Mean and InvStdDev too."""
    axis_attr = int(ctx.attrs.get("axis", -1))
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    stat_dt = [_out_dtype(ctx, i, np.float32) for i in (1, 2)]

    def step(x, scale, bias=None):
        a = norm_axis(axis_attr, x.ndim)
        if not 0 <= a < max(x.ndim, 1):
            raise ValueError(f"axis {axis_attr} out of range for input of rank {x.ndim}")
        n = int(np.prod(x.shape[:a], dtype=np.int64))
        red = x.shape[:a] + (1,) * (x.ndim - a)
        if rows.usable(x) and n and _per_column(scale, x.shape[a:]) and (bias is None or _per_column(bias, x.shape[a:])):
            m = x.size // n
            y, mean, inv = rows.layer_norm_rows(x.reshape(n, m), scale.reshape(-1),
                                                np.zeros(m, np.float32) if bias is None else bias.reshape(-1), eps)
            return y.reshape(x.shape), mean.reshape(red).astype(stat_dt[0]), inv.reshape(red).astype(stat_dt[1])
        x2 = x.reshape(n, -1).astype(_work(x.dtype), copy=False)
        norm, mean, inv = _standardize(x2, (1,), eps)
        y = _affine(norm.reshape(x.shape), x.dtype, scale, bias, x.dtype)
        return y, mean.reshape(red).astype(stat_dt[0]), inv.reshape(red).astype(stat_dt[1])

    return step


# ---------------------------------------------------------------- GroupNormalization


def _group_stats(x, num_groups, eps):
    n, c = x.shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise ValueError(f"num_groups={num_groups} must divide the channel count {c}")
    x3 = x.reshape(n, num_groups, -1).astype(_work(x.dtype), copy=False)
    return _standardize(x3, (2,), eps)[0]


@kernel("GroupNormalization", dtypes=FLOATS_BF16, versions=(21, None))
def group_normalization(x, scale, bias, *, num_groups, epsilon=1e-5, stash_type=1):
    """Statistics per (instance, group of channels); scale and bias per channel."""
    norm = _group_stats(x, int(num_groups), epsilon).reshape(x.shape[0], x.shape[1], -1)
    shape = (1, -1, 1)
    y = _affine(norm, x.dtype, scale.reshape(shape), bias.reshape(shape), x.dtype)
    return y.reshape(x.shape)


@kernel("GroupNormalization", dtypes=FLOATS_BF16, versions=(18, 20), name="v18")
def group_normalization_18(x, scale, bias, *, num_groups, epsilon=1e-5):
    """Opset 18: scale and bias are per group."""
    norm = _group_stats(x, int(num_groups), epsilon)
    shape = (1, -1, 1)
    y = _affine(norm, x.dtype, scale.reshape(shape), bias.reshape(shape), x.dtype)
    return y.reshape(x.shape)


# ---------------------------------------------------------------- RMSNormalization


@kernel("RMSNormalization", dtypes=FLOATS_BF16, bind=True, versions=(23, None))
def rms_normalization(ctx):
    """Y = X / sqrt(mean(X^2 over [axis, rank)) + eps) * scale."""
    axis_attr = int(ctx.attrs.get("axis", -1))
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    out_dt = _out_dtype(ctx, 0, ctx.dtype(0) or np.float32)

    def step(x, scale):
        a = norm_axis(axis_attr, x.ndim)
        if not 0 <= a < max(x.ndim, 1):
            raise ValueError(f"axis {axis_attr} out of range for input of rank {x.ndim}")
        xw = x.astype(_work(x.dtype), copy=False)
        ms = np.mean(np.square(xw), axis=tuple(range(a, x.ndim)), keepdims=True)
        norm = xw / np.sqrt(ms + xw.dtype.type(eps))
        return _affine(norm, x.dtype, scale, None, out_dt)

    return step


# ---------------------------------------------------------------- InstanceNormalization


@kernel("InstanceNormalization", dtypes=FLOATS_BF16)
def instance_normalization(x, scale, bias, *, epsilon=1e-5, consumed_inputs=None):
    """Statistics per (instance, channel) over the spatial dims."""
    if x.ndim < 3:
        raise ValueError(f"input must have rank >= 3 (N, C, D1, ...), got shape {x.shape}")
    n, c = x.shape[:2]
    x3 = x.reshape(n, c, -1).astype(_work(x.dtype), copy=False)
    norm = _standardize(x3, (2,), epsilon)[0]
    shape = (1, -1, 1)
    y = _affine(norm, _work(x.dtype), scale.reshape(shape), bias.reshape(shape), x.dtype)
    return y.reshape(x.shape)


# ---------------------------------------------------------------- LpNormalization


@kernel("LpNormalization", dtypes=FLOATS_BF16)
def lp_normalization(x, *, axis=-1, p=2):
    """x / ||x||_p along `axis`; a zero norm gives 0 (not NaN)."""
    if p not in (1, 2):
        raise ValueError(f"p must be 1 or 2, got {p}")
    a = norm_axis(axis, x.ndim)
    xw = x.astype(_work(x.dtype), copy=False)
    if p == 1:
        norm = np.abs(xw).sum(axis=a, keepdims=True)
    else:
        norm = np.sqrt(np.square(xw).sum(axis=a, keepdims=True))
    safe = np.where(norm == 0, 1, norm)
    return np.where(norm == 0, 0, xw / safe).astype(x.dtype)


# ---------------------------------------------------------------- MeanVarianceNormalization


@kernel("MeanVarianceNormalization", dtypes=FLOATS_BF16)
def mean_variance_normalization(x, *, axes=(0, 2, 3)):
    """(x - E[x]) / (sqrt(Var[x]) + 1e-9) over `axes` (the function body's epsilon)."""
    ax = tuple(sorted({norm_axis(int(a), x.ndim) for a in axes}))
    if any(not 0 <= a < x.ndim for a in ax):
        raise ValueError(f"axes {list(axes)} out of range for input of rank {x.ndim}")
    xw = x.astype(_work(x.dtype), copy=False)
    mean = xw.mean(axis=ax, keepdims=True)
    d = xw - mean
    std = np.sqrt(np.mean(np.square(d), axis=ax, keepdims=True))
    return (d / (std + xw.dtype.type(1e-9))).astype(x.dtype)


# ---------------------------------------------------------------- LRN


@kernel("LRN", dtypes=FLOATS_BF16)
def lrn(x, *, size, alpha=0.0001, beta=0.75, bias=1.0):
    """y = x / (bias + alpha / size * sum of x^2 over a window of `size` channels) ** beta."""
    if x.ndim < 3:
        raise ValueError(f"input must have rank >= 3 (N, C, D1, ...), got shape {x.shape}")
    size = int(size)
    c = x.shape[1]
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)  # channels before / after the centre
    xw = x.astype(_work(x.dtype), copy=False)
    sq = np.square(xw)
    ss = np.zeros_like(sq)
    # One shifted add per window tap (size is small): ss[c] = sum sq[c + o], o in [-lo, hi].
    for o in range(-lo, hi + 1):
        if o >= 0 and o < c:
            ss[:, :c - o] += sq[:, o:]
        elif o < 0 and -o < c:
            ss[:, -o:] += sq[:, :c + o]
    den = np.power(xw.dtype.type(bias) + xw.dtype.type(alpha / size) * ss, xw.dtype.type(beta))
    return (xw / den).astype(x.dtype)


# ---------------------------------------------------------------- BatchNormalization (training)


@kernel("BatchNormalization", dtypes=FLOATS_BF16, multi=True, versions=(14, None), name="training",
        accepts=lambda ctx: None if int(ctx.attrs.get("training_mode", 0)) else "only training_mode=1")
def batch_norm_training(x, scale, bias, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0):
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
    return y.astype(x.dtype), run_mean.astype(input_mean.dtype), run_var.astype(input_var.dtype)
