"""Helpers shared by cpu kernels."""
from __future__ import annotations

import numpy as np

from ... import dtypes

FLOATS = dtypes.FLOATS
FLOATS_BF16 = dtypes.FLOATS_BF16
NUMERIC = dtypes.NUMERIC
INTS = dtypes.INTS
SIGNED = dtypes.SIGNED_INTS | dtypes.FLOATS_BF16
ALL = dtypes.ALL


def contiguous(x: np.ndarray) -> np.ndarray:
    """C-contiguous x, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    return x if x.flags.c_contiguous else x.copy(order="C")


def norm_axis(axis: int, rank: int) -> int:
    """axis in [-rank, rank-1] as a non-negative index; anything else is the model's error
    (NumPy would raise an AxisError without the op's context, or wrap around silently)."""
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for an input of rank {rank}")
    return axis + rank if axis < 0 else axis


def as_out(result, out):
    """Put `result` into `out` when a buffer was handed over; return what holds the value."""
    if out is None:
        return result if isinstance(result, np.ndarray) else np.asarray(result)
    np.copyto(out, result, casting="unsafe")
    return out


def spatial_pads(in_shape, kernel, strides, dilations, pads, auto_pad, ceil_mode=False):
    """Begin/end pads per spatial dim and the output spatial shape (ONNX conv/pool rules)."""
    n = len(kernel)
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    pads = list(pads or [0] * (2 * n))
    begin, end, out = [], [], []
    for i in range(n):
        size, k, s, d = in_shape[i], kernel[i], strides[i], dilations[i]
        eff = d * (k - 1) + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
            total = max(0, (o - 1) * s + eff - size)
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            e = total - b
        else:
            b, e = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + n])
            span = size + b + e - eff
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= size + b:
                    o -= 1
            else:
                o = span // s + 1
        begin.append(b)
        end.append(e)
        out.append(o)
    return begin, end, out, strides, dilations


def pad_spatial(x, begin, end, value, buf=None):
    """x padded on its spatial dims (2..) with `value`, written into `buf` when given."""
    if not any(begin) and not any(end):
        return x
    shape = x.shape[:2] + tuple(s + b + e for s, b, e in zip(x.shape[2:], begin, end))
    xp = np.empty(shape, x.dtype) if buf is None else buf[: int(np.prod(shape)) * x.dtype.itemsize].view(x.dtype).reshape(shape)
    xp.fill(value)
    inner = (slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(begin, x.shape[2:]))
    xp[inner] = x
    return xp


def windows(xp, kernel, strides, dilations, out_shape):
    """A strided view (N, C, *kernel, *out_spatial) of every window position."""
    n = len(kernel)
    st = xp.strides
    shape = xp.shape[:2] + tuple(kernel) + tuple(out_shape)
    strides_ = st[:2] + tuple(st[2 + i] * dilations[i] for i in range(n)) + tuple(st[2 + i] * strides[i] for i in range(n))
    return np.lib.stride_tricks.as_strided(xp, shape, strides_, writeable=False)


def window_views(xp, kernel, strides, dilations, out_shape):
    """For each kernel offset, the strided view of xp it reads at every output position."""
    import itertools

    n = len(kernel)
    for offs in itertools.product(*[range(k) for k in kernel]):
        idx = (slice(None), slice(None)) + tuple(
            slice(offs[i] * dilations[i], offs[i] * dilations[i] + (out_shape[i] - 1) * strides[i] + 1, strides[i])
            for i in range(n))
        yield offs, xp[idx]


# Activations a fused node (glassrt::FusedConv, glassrt::FusedBatchNormalization) applies
# in place on its output; passes/fusion.py makes those nodes.
ACTIVATIONS = {
    "Relu": lambda y, p: np.maximum(y, 0, out=y),
    "LeakyRelu": lambda y, p: np.multiply(y, y.dtype.type(p[0] if p else 0.01), out=y, where=y < 0),
    "Clip": lambda y, p: np.clip(y, p[0], p[1], out=y),
    "Sigmoid": lambda y, p: np.reciprocal(np.add(np.exp(np.negative(y, out=y), out=y), 1, out=y), out=y),
}


def clamp_bounds(attrs):
    """(lo, hi) when the fused activation is a clamp (Relu, Clip), else None."""
    act = attrs.get("activation")
    if act == "Relu":
        return 0.0, np.inf
    if act == "Clip":
        p = [float(v) for v in attrs.get("activation_params") or []]
        return p[0], p[1]
    if not act:
        return -np.inf, np.inf
    return None
