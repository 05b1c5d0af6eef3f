"""Backward of the Reduce* ops.

Axes come from the attribute before opset 13 (ReduceSum) / 18 (the others) and from the
second input after; no axes means all of them, unless noop_with_empty_axes makes the op the
identity. Every formula works on keepdims-shaped gy and y (the reduced axes kept as size 1)
so they broadcast against x. ReduceMax/Min split a tie evenly among the tied elements.
"""
from __future__ import annotations

import numpy as np

from . import backward
from ..meta.reduce import AXES_AS_INPUT


def _axes(ctx, x):
    """Sorted normalized axes, or None for the identity (empty axes with noop_with_empty_axes)."""
    op = ctx.node.op_type
    if ctx.version >= AXES_AS_INPUT[op]:
        a = ctx.inputs[1] if len(ctx.inputs) > 1 else None
        a = None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]
    else:
        a = ctx.attrs.get("axes")
    if not a:
        if int(ctx.attr("noop_with_empty_axes", 0)):
            return None
        return tuple(range(x.ndim))
    return tuple(sorted({v + x.ndim if v < 0 else v for v in (int(v) for v in a)}))


def _reducer(op):
    def register(deriv):
        def fn(ctx, gy):
            x = ctx.inputs[0]
            rest = [None] * (len(ctx.inputs) - 1)
            if x.dtype.kind not in "fc":
                return [None] + rest
            (y,) = ctx.outputs
            axes = _axes(ctx, x)
            if axes is None:  # the identity
                return [gy] + rest
            kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
            g, yk = gy.reshape(kept), y.reshape(kept)
            with np.errstate(divide="ignore", invalid="ignore"):
                gx = deriv(x, yk, g, axes)
            return [np.broadcast_to(gx, x.shape).astype(x.dtype)] + rest

        fn.__name__ = op.lower()
        backward(op)(fn)
        return fn

    return register


@_reducer("ReduceSum")
def _sum(x, y, g, axes):
    return g


@_reducer("ReduceMean")
def _mean(x, y, g, axes):
    return g / int(np.prod([x.shape[a] for a in axes]))


def _extreme(x, y, g, axes):
    hit = x == y
    return g * hit / hit.sum(axis=axes, keepdims=True)  # ties share the gradient evenly


_reducer("ReduceMax")(_extreme)
_reducer("ReduceMin")(_extreme)


@_reducer("ReduceProd")
def _prod(x, y, g, axes):
    # The product of all the *other* elements of each group, without dividing by x (zeros):
    # exclusive prefix products times exclusive suffix products along the flattened group.
    keep = [i for i in range(x.ndim) if i not in axes]
    xt = np.transpose(x, keep + list(axes))
    lead = xt.shape[:len(keep)]
    flat = xt.reshape(lead + (-1,))
    ones = np.ones(lead + (1,), x.dtype)
    before = np.cumprod(np.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
    after = np.cumprod(np.concatenate([ones, flat[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
    others = (before * after).reshape(xt.shape)
    others = np.transpose(others, np.argsort(keep + list(axes)))
    return g * others


@_reducer("ReduceL1")
def _l1(x, y, g, axes):
    return g * np.sign(x)  # subgradient 0 at 0


@_reducer("ReduceL2")
def _l2(x, y, g, axes):
    return np.where(y == 0, 0, g * x / y)  # 0 for an all-zero group (the subgradient at 0)


@_reducer("ReduceSumSquare")
def _sum_square(x, y, g, axes):
    return 2 * g * x


@_reducer("ReduceLogSumExp")
def _log_sum_exp(x, y, g, axes):
    return g * np.exp(x - y)  # the softmax of each group


@_reducer("ReduceLogSum")
def _log_sum(x, y, g, axes):
    return g / np.exp(y)  # 1 / sum


@backward("CumSum")
def cum_sum(ctx, gy):
    x, axis = ctx.inputs
    if x.dtype.kind not in "fc":
        return [None, None]
    a = int(np.asarray(axis).reshape(-1)[0])
    a = a + x.ndim if a < 0 else a
    exclusive, reverse = int(ctx.attr("exclusive", 0)), int(ctx.attr("reverse", 0))
    # y_i sums x_j over j <= i (j < i when exclusive); so x_j collects gy_i over i >= j (i > j):
    # the same cumulative sum run the other way.
    g = gy if reverse else np.flip(gy, a)
    c = np.cumsum(g, axis=a)
    if exclusive:
        c = c - g
    return [c if reverse else np.flip(c, a).copy(), None]
