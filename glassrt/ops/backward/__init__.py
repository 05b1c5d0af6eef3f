"""Backward formulas (vector-Jacobian products) of differentiable ops.

A formula is registered per op with `@backward("Op")` and called as
``fn(ctx, *grad_outputs) -> [grad per node input]``:
  * ctx.inputs / ctx.outputs — the forward values (NumPy arrays; None for absent ones),
  * ctx.attrs — attributes with schema defaults, ctx.node, ctx.version (schema since_version),
  * grad_outputs — one per node output, None where no gradient flows back,
  * the result — one entry per node input: an array of that input's shape, or None for
    inputs that are not differentiable (indices, shapes, axes).
Formulas use plain NumPy and must not modify their arguments.
"""
from __future__ import annotations

import numpy as np

from ..registry import backward  # noqa: F401  (re-exported for the formula modules)


class GradContext:
    __slots__ = ("node", "attrs", "inputs", "outputs", "version")

    def __init__(self, node, attrs, inputs, outputs, version):
        self.node, self.attrs, self.inputs, self.outputs, self.version = node, attrs, inputs, outputs, version

    def attr(self, name, default=None):
        v = self.attrs.get(name, default)
        return default if v is None else v


def unbroadcast(grad, shape):
    """Sum `grad` over the axes NumPy broadcasting added or stretched to reach its shape."""
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad.reshape(shape)


def zeros_like(x):
    return None if x is None else np.zeros_like(x)


def _load():
    from . import elementwise, nn, reduce, shape  # noqa: F401


_load()
