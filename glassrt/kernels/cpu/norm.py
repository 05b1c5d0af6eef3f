"""Normalizations and softmax-like ops."""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._util import FLOATS, FLOATS_BF16, norm_axis


@kernel("BatchNormalization", dtypes=FLOATS, out=True, bind=True, multi=True,
        accepts=lambda ctx: None if not int(ctx.attrs.get("training_mode", 0)) else "training_mode=1 not supported")
def batch_norm(ctx):
    """Inference BatchNormalization: y = x * scale' + bias', folded per channel once."""
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    consts = ctx.const_inputs
    folded = None
    if all(c is not None for c in consts[1:5]):
        folded = _fold(*consts[1:5], eps)

    def step(x, scale, bias, mean, var, *, out):
        s, b = folded if folded is not None else _fold(scale, bias, mean, var, eps)
        # Opsets 7-8 with spatial=0 give statistics per (C, D1, ...) element, not per channel.
        shape = (1,) + s.shape if s.ndim > 1 else (1, -1) + (1,) * (x.ndim - 2)
        y = out[0] if out[0] is not None else np.empty_like(x)
        np.multiply(x, s.reshape(shape).astype(x.dtype, copy=False), out=y)
        y += b.reshape(shape).astype(x.dtype, copy=False)
        return (y,) + (None,) * (len(out) - 1)

    return step


def _fold(scale, bias, mean, var, eps):
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    return s, bias.astype(np.float64) - mean.astype(np.float64) * s


def _softmax_axis(x, axis, opset):
    """Opset < 13 flattens to 2-D at `axis`; 13+ reduces along `axis` only."""
    a = norm_axis(axis, x.ndim)
    if opset < 13:
        return x.reshape(int(np.prod(x.shape[:a], dtype=np.int64)), -1), 1
    return x, a


@kernel("Softmax", dtypes=FLOATS_BF16, bind=True, out=True)
def softmax(ctx):
    default = 1 if ctx.since_version < 13 else -1
    axis, opset = int(ctx.attrs.get("axis", default)), ctx.since_version

    def step(x, *, out=None):
        x2, a = _softmax_axis(x, axis, opset)
        y = out.reshape(x2.shape) if out is not None else np.empty_like(x2)
        np.subtract(x2, x2.max(axis=a, keepdims=True), out=y)
        np.exp(y, out=y)
        y /= y.sum(axis=a, keepdims=True)
        return y.reshape(x.shape) if out is None else out

    return step


@kernel("LogSoftmax", dtypes=FLOATS_BF16, bind=True, out=True)
def log_softmax(ctx):
    default = 1 if ctx.since_version < 13 else -1
    axis, opset = int(ctx.attrs.get("axis", default)), ctx.since_version

    def step(x, *, out=None):
        x2, a = _softmax_axis(x, axis, opset)
        y = out.reshape(x2.shape) if out is not None else np.empty_like(x2)
        np.subtract(x2, x2.max(axis=a, keepdims=True), out=y)
        y -= np.log(np.exp(y).sum(axis=a, keepdims=True))
        return y.reshape(x.shape) if out is None else out

    return step


@kernel("Hardmax", dtypes=FLOATS_BF16, bind=True)
def hardmax(ctx):
    default = 1 if ctx.since_version < 13 else -1
    axis, opset = int(ctx.attrs.get("axis", default)), ctx.since_version

    def step(x):
        x2, a = _softmax_axis(x, axis, opset)
        y = np.zeros_like(x2)
        np.put_along_axis(y, np.expand_dims(np.argmax(x2, axis=a), a), 1, axis=a)
        return y.reshape(x.shape)

    return step
