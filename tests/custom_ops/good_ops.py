"""Custom ops written right: every check passes."""
import numpy as np

import glassrt

F = [np.float32, np.float64]


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


swish = glassrt.custom_op("good::swish(Tensor x, float beta=1.0) -> Tensor", dtypes=F)
swish.register_meta(lambda x, beta: x)
swish.register_kernel("cpu", lambda x, beta: x * _sigmoid(beta * x))
swish.register_decomposition(lambda g, x, beta: g.Mul(x, g.Sigmoid(g.Mul(x, g.CastLike(g.constant(beta), x)))))


@swish.register_backward
def _swish_grad(ctx, gy):
    x, beta = ctx.inputs[0], ctx.attrs["beta"]
    s = _sigmoid(beta * x)
    return [gy * (s + beta * x * s * (1 - s))]


# Two outputs, an optional input, a list attribute: y = x * scale + shift (per last axis), and sum over axes.
affine_sum = glassrt.custom_op(
    "good::affine_sum(Tensor x, Tensor? shift, float scale=2.0, int[] axes=[1]) -> (Tensor y, Tensor total)",
    dtypes=F)


@affine_sum.register_meta
def _affine_meta(x, shift, scale, axes):
    keep = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return x, glassrt.TensorMeta(x.dtype, keep)


@affine_sum.register_kernel("cpu")
def _affine_kernel(x, shift=None, scale=2.0, axes=(1,)):
    y = x * x.dtype.type(scale) + (0 if shift is None else shift)
    return y, y.sum(axis=tuple(axes))


@affine_sum.register_backward
def _affine_grad(ctx, gy, gt):
    x = ctx.inputs[0]
    g = np.zeros_like(x) if gy is None else gy.copy()
    if gt is not None:
        g = g + np.expand_dims(gt, tuple(ctx.attrs["axes"]))
    return [g * ctx.attrs["scale"], None]
