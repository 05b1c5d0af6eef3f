"""Normalizations and softmax-like ops."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import registry
from . import rows
from ..registry import kernel
from ._util import ACTIVATIONS, FLOATS, FLOATS_BF16, clamp_bounds, norm_axis
from ..buffers import TILE_ELEMENTS
from ._jit import compiled, jit, numba_missing


def _inference_only(ctx):
    return None if not int(ctx.attrs.get("training_mode", 0)) else "training_mode=1 not supported"


@kernel("BatchNormalization", dtypes=FLOATS, out=True, bind=True, multi=True, accepts=_inference_only)
def batch_norm(ctx):
    """Inference BatchNormalization: y = x * scale' + bias', folded per channel once."""
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    consts = ctx.const_inputs
    folded = None
    if all(c is not None for c in consts[1:5]):
        folded = _fold(*consts[1:5], eps)
    act = ctx.attrs.get("activation")  # glassrt::FusedBatchNormalization
    params = [float(v) for v in ctx.attrs.get("activation_params") or []]

    def step(x, scale, bias, mean, var, *, out):
        s, b = folded if folded is not None else _fold(scale, bias, mean, var, eps)
        # Opsets 7-8 with spatial=0 give statistics per (C, D1, ...) element, not per channel.
        shape = (1,) + s.shape if s.ndim > 1 else (1, -1) + (1,) * (x.ndim - 2)
        y = out[0] if out[0] is not None else np.empty_like(x)
        np.multiply(x, s.reshape(shape).astype(x.dtype, copy=False), out=y)
        y += b.reshape(shape).astype(x.dtype, copy=False)
        if act:
            ACTIVATIONS[act](y, params)
        return (y,) + (None,) * (len(out) - 1)

    return step


def _affine_reason(ctx):
    why = _inference_only(ctx)
    if why:
        return why
    x = ctx.shape(0)
    if x is None or len(x) < 2 or ctx.dtype(0) not in (np.float32, np.float64):
        return "needs float32/float64 input of rank >= 2"
    if clamp_bounds(ctx.attrs) is None:
        return f"activation {ctx.attrs.get('activation')} is not a clamp"
    if numba_missing():
        return numba_missing()
    if any(c is not None and c.ndim != 1 for c in ctx.const_inputs[1:5]):
        return "statistics are not per channel"
    return None


@jit()
def _channel_affine(x, s, b, lo, hi, out):
    """y = clamp(x * s[c] + b[c], lo, hi): one pass instead of three (mul, add, activation)."""
    n, c, p = x.shape
    for i in range(n):
        for k in range(c):
            sk, bk = s[k], b[k]
            for j in range(p):
                v = x[i, k, j] * sk + bk
                out[i, k, j] = min(max(v, lo), hi)


@kernel("BatchNormalization", dtypes=FLOATS, out=True, bind=True, multi=True, accepts=_affine_reason, priority=10,
        name="affine_nb")
def batch_norm_affine(ctx):
    """Inference BatchNormalization (and a fused Relu/Clip) as one compiled pass per channel."""
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    dt = np.dtype(ctx.dtype(0))
    lo, hi = clamp_bounds(ctx.attrs)
    consts = ctx.const_inputs
    folded = tuple(v.astype(dt) for v in _fold(*consts[1:5], eps)) if all(c is not None for c in consts[1:5]) else None
    loop = compiled(_channel_affine)

    def step(x, scale, bias, mean, var, *, out):
        s, b = folded if folded is not None else (v.astype(dt) for v in _fold(scale, bias, mean, var, eps))
        y = out[0] if out[0] is not None else np.empty_like(x)
        n, c = x.shape[:2]
        loop(x.reshape(n, c, -1), s, b, dt.type(lo), dt.type(hi), y.reshape(n, c, -1))
        return (y,) + (None,) * (len(out) - 1)

    return step


# glassrt::FusedBatchNormalization (passes/fuse_conv.py) runs on the same kernels.
for _k in list(registry.kernels_for("cpu", "", "BatchNormalization")):
    if _k.fn in (batch_norm, batch_norm_affine):
        registry.register(replace(_k, name=_k.name.replace("cpu.BatchNormalization", "cpu.FusedBatchNormalization"),
                                  domain="glassrt", op_type="FusedBatchNormalization"))


def _fold(scale, bias, mean, var, eps):
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    return s, bias.astype(np.float64) - mean.astype(np.float64) * s


def _softmax_axis(x, axis, opset):
    """Opset < 13 flattens to 2-D at `axis`; 13+ reduces along `axis` only."""
    a = norm_axis(axis, x.ndim)
    if opset < 13:
        return x.reshape(int(np.prod(x.shape[:a], dtype=np.int64)), -1), 1
    return x, a


@kernel("Softmax", dtypes=FLOATS_BF16, bind=True, out=True, name="Softmax", any_shape=True)
def softmax_kernel(ctx):
    default = 1 if ctx.since_version < 13 else -1
    axis, opset = int(ctx.attrs.get("axis", default)), ctx.since_version

    def step(x, *, out=None):
        x2, a = _softmax_axis(x, axis, opset)
        if a == x2.ndim - 1 and rows.usable(x2):  # over the last axis: compiled row passes
            return rows.softmax_last(x2, np.empty_like(x2) if out is None else out.reshape(x2.shape)).reshape(x.shape)
        y = softmax(x2, a, out.reshape(x2.shape) if out is not None else None)
        return y.reshape(x.shape) if out is None else out

    return step


def softmax(x, axis=-1, out=None):
    """Softmax along `axis` in NumPy passes (the max subtracted, exp, divided by the sum),
    written into out (x itself for in place; a new array when None). An all -inf slice gives
    NaN, silently, as onnxruntime's does. The Softmax kernel's general path, and custom ops'
    (glassrt/contrib)."""
    y = np.empty_like(x) if out is None else out
    with np.errstate(invalid="ignore"):
        np.subtract(x, x.max(axis=axis, keepdims=True), out=y)
        np.exp(y, out=y)
        y /= y.sum(axis=axis, keepdims=True)
    return y


@kernel("LogSoftmax", dtypes=FLOATS_BF16, bind=True, out=True)
def log_softmax(ctx):
    default = 1 if ctx.since_version < 13 else -1
    axis, opset = int(ctx.attrs.get("axis", default)), ctx.since_version

    def step(x, *, out=None):
        x2, a = _softmax_axis(x, axis, opset)
        if a == x2.ndim - 1 and rows.usable(x2):
            y = np.empty_like(x2) if out is None else out.reshape(x2.shape)
            return rows.log_softmax_last(x2, y).reshape(x.shape)
        y = out.reshape(x2.shape) if out is not None else np.empty_like(x2)
        with np.errstate(invalid="ignore"):
            np.subtract(x2, x2.max(axis=a, keepdims=True), out=y)
            for block in _outer_blocks(y, a):  # exp(y) a block at a time, not a tensor-sized temporary
                yb = y[block]
                yb -= np.log(np.exp(yb).sum(axis=a, keepdims=True))
        return y.reshape(x.shape) if out is None else out

    return step


def _outer_blocks(y, a):
    """Slices of y along axis 0 of about a tile each, when the reduction axis `a` is another
    one (each slice then reduces exactly as the whole array does); else the whole array."""
    if y.ndim == 0 or a == 0:
        return [...]
    row = int(np.prod(y.shape[1:], dtype=np.int64))
    step = max(1, TILE_ELEMENTS // max(row, 1))
    return [slice(r, r + step) for r in range(0, y.shape[0], step)]


@kernel("Hardmax", dtypes=FLOATS_BF16, out=True, bind=True)
def hardmax(ctx):
    default = 1 if ctx.since_version < 13 else -1
    axis, opset = int(ctx.attrs.get("axis", default)), ctx.since_version

    def step(x, *, out=None):
        x2, a = _softmax_axis(x, axis, opset)
        y = np.zeros_like(x2) if out is None else out.reshape(x2.shape)
        y.fill(0)
        np.put_along_axis(y, np.expand_dims(np.argmax(x2, axis=a), a), 1, axis=a)
        return y.reshape(x.shape) if out is None else out

    return step
