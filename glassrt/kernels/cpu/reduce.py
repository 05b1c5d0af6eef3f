"""Reductions (axes from the attribute or the input, keepdims, noop_with_empty_axes).

Sum, Mean, Max, Min and Prod in the input's own type reduce straight into the planned
buffer; the others (a wider accumulator, a transform first) reduce aside, into an array
of the output's size, and copy it in."""
from __future__ import annotations

import numpy as np

from ...ops.meta.reduce import AXES_AS_INPUT
from ..registry import kernel
from ._util import FLOATS_BF16, NUMERIC, PerShape, as_out, int_tuple, norm_axis


def _reducer(op, compute, types=NUMERIC, into=None):
    """`into(x, ax, keep, out)`: the reduction written into out, or None where it cannot be."""

    def build(ctx):
        keep = bool(ctx.attrs.get("keepdims", 1))
        noop = bool(ctx.attrs.get("noop_with_empty_axes", 0))
        axes_as_input = ctx.since_version >= AXES_AS_INPUT[op]
        if axes_as_input:
            known, fixed = (True, None) if not ctx.has(1) else (ctx.const(1) is not None, int_tuple(ctx.const(1)))
        else:
            known, fixed = True, int_tuple(ctx.attrs.get("axes"))
        # per input shape and axes: the sorted axes (None: all; "noop") and the result's shape,
        # worked out once (a streaming model reduces the same shape every run)
        geometry = PerShape(lambda shape, axes_: _geometry(shape, axes_, keep, noop))

        def step(x, axes=None, *, out=None):
            ax, shape = geometry(x.shape, fixed if known else int_tuple(axes))
            if ax == "noop":
                return _put(x.copy() if out is None else x, out)
            if into is not None and x.size and (out is None or shape == out.shape):
                # (no buffer given: a graph output, allocated per run)
                r = into(x, ax, keep, np.empty(shape, x.dtype) if out is None else out)
                if r is not None:
                    return r
            r = compute(x, ax, keep)
            return _put(np.asarray(r, dtype=x.dtype) if np.asarray(r).dtype != x.dtype else np.asarray(r), out)
        return step

    kernel(op, dtypes=types, bind=True, out=True, name=op.lower(), any_shape=True, blas=False)(build)


def _geometry(shape, axes, keep, noop):
    """(the axes reduced, sorted and non-negative, None for all or "noop"; the result's shape)."""
    if not axes:
        if noop:
            return "noop", tuple(shape)
        ax = None
    else:
        ax = tuple(sorted(norm_axis(a, len(shape)) for a in axes))
    return ax, _reduced_shape(shape, ax, keep)


def _reduced_shape(shape, ax, keep):
    gone = range(len(shape)) if ax is None else ax
    return tuple(1 if i in gone else d for i, d in enumerate(shape) if keep or i not in gone)


def _same_type(reduce, typed=False):
    """An `into` for a NumPy reduction that accumulates in the input's own type (passed as
    dtype= when `typed`, as the reduction without out= is called)."""

    def into(x, ax, keep, out):
        if out.dtype != x.dtype or _acc.get(x.dtype, x.dtype) != x.dtype:
            return None
        return reduce(x, axis=ax, keepdims=keep, out=out, **(dict(dtype=x.dtype) if typed else {}))

    return into


def _put(v, out):
    if out is None:
        return v
    np.copyto(out, v.reshape(out.shape) if v.shape != out.shape else v, casting="unsafe")
    return out


def _empty_ok(fn, identity):
    def compute(x, ax, keep):
        if x.size == 0:
            shape = [1 if (ax is None or i in ax) else d for i, d in enumerate(x.shape)]
            r = np.full(shape, identity(x.dtype), dtype=x.dtype)
            return r if keep else r.reshape([d for i, d in enumerate(x.shape) if not (ax is None or i in ax)])
        return fn(x, ax, keep)
    return compute


def _low(dt):
    return -np.inf if dt.kind == "f" else False if dt.kind == "b" else np.iinfo(dt).min


def _high(dt):
    return np.inf if dt.kind == "f" else True if dt.kind == "b" else np.iinfo(dt).max


_acc = {np.dtype(np.float16): np.float32}


# (the ufuncs' reduce, not np.sum / np.max...: the same reduction without their Python
# wrapper, ~2 us a call of a small model's reductions, or of a Scan body's each iteration)
_add, _max, _min, _prod = np.add.reduce, np.maximum.reduce, np.minimum.reduce, np.multiply.reduce


def sum_(x, ax, keep):
    return _add(x, axis=ax, keepdims=keep, dtype=_acc.get(x.dtype, x.dtype))


_reducer("ReduceSum", sum_, into=_same_type(_add, typed=True))
def _mean_into(x, ax, keep, out):
    """np.mean's own two steps (its sum, then a division by the count) straight into out:
    np.mean's Python wrapper cost ~10 us of a small ReduceMean (Silero VAD's)."""
    if x.dtype.kind != "f" or out.dtype != x.dtype or _acc.get(x.dtype, x.dtype) != x.dtype:
        return None
    np.add.reduce(x, axis=ax, keepdims=keep, out=out)
    return np.true_divide(out, x.size // out.size, out=out)


_reducer("ReduceMean", lambda x, ax, keep: np.mean(x, axis=ax, keepdims=keep, dtype=_acc.get(x.dtype, None)),
         into=_mean_into)
# (named: scan_batched.py makes a body's reductions with these over all its iterations at once)
max_or_low = _empty_ok(lambda x, ax, keep: _max(x, axis=ax, keepdims=keep), _low)
min_or_high = _empty_ok(lambda x, ax, keep: _min(x, axis=ax, keepdims=keep), _high)
_reducer("ReduceMax", max_or_low, NUMERIC | {np.dtype(bool)}, into=_same_type(_max))
_reducer("ReduceMin", min_or_high, NUMERIC | {np.dtype(bool)}, into=_same_type(_min))
_reducer("ReduceProd", lambda x, ax, keep: _prod(x, axis=ax, keepdims=keep, dtype=x.dtype),
         into=_same_type(_prod, typed=True))
_reducer("ReduceL1", lambda x, ax, keep: _add(np.abs(x), axis=ax, keepdims=keep, dtype=x.dtype))
_reducer("ReduceL2", lambda x, ax, keep: np.sqrt(_add(np.square(x.astype(np.float64)), axis=ax, keepdims=keep)))
def sum_square(x, ax, keep):
    return _add(np.square(x), axis=ax, keepdims=keep, dtype=x.dtype)


_reducer("ReduceSumSquare", sum_square,
         into=lambda x, ax, keep, out: _add(np.square(x), axis=ax, keepdims=keep, dtype=x.dtype, out=out)
         if out.dtype == x.dtype else None)
_reducer("ReduceLogSum", lambda x, ax, keep: np.log(_add(x, axis=ax, keepdims=keep, dtype=np.float64)), FLOATS_BF16)


def _logsumexp(x, ax, keep):
    xf = x.astype(np.float64)
    if x.size == 0:
        return np.log(_add(np.exp(xf), axis=ax, keepdims=keep))
    m = _max(xf, axis=ax, keepdims=True)
    if not np.isfinite(m).all():
        m[~np.isfinite(m)] = 0
    np.subtract(xf, m, out=xf)
    np.exp(xf, out=xf)
    r = np.log(_add(xf, axis=ax, keepdims=True))
    r += m
    return r if keep else np.squeeze(r, axis=ax)


_reducer("ReduceLogSumExp", _logsumexp, FLOATS_BF16)


def _arg(op, pick):
    @kernel(op, dtypes=NUMERIC, out=True, bind=True, name=op.lower())
    def k(ctx):
        # (the attributes read once, the ndarray's own method: ~1 us a call less than
        # np.argmax's wrapper, np.expand_dims another 1-2: a classifier's head runs one on
        # a few scores per run)
        axis, keep = int(ctx.attrs.get("axis", 0)), bool(ctx.attrs.get("keepdims", 1))
        last = bool(ctx.attrs.get("select_last_index", 0))

        def step(x, *, out=None):
            a = norm_axis(axis, x.ndim)
            if last:
                r = x.shape[a] - 1 - pick(np.flip(x, axis=a), axis=a)
            else:
                r = pick(x, axis=a)
            if keep:
                r = r.reshape(x.shape[:a] + (1,) + x.shape[a + 1:])
            return as_out(r if r.dtype == np.int64 else r.astype(np.int64), out)
        return step
    return k


_arg("ArgMax", np.ndarray.argmax)
_arg("ArgMin", np.ndarray.argmin)
