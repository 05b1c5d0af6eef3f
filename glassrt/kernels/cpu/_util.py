"""Helpers shared by cpu kernels."""
from __future__ import annotations

import numpy as np

from ... import dtypes
from ...ops.geometry import normalize_axis as norm_axis  # noqa: F401  (shared with meta, backward, contrib)
from ...ops.geometry import spatial_pads  # noqa: F401
from ..buffers import as_out, new_out, write_elementwise  # noqa: F401  (the kernels' out= helpers)
from ...ops.windows import pad_spatial, window_views, windows  # noqa: F401

FLOATS = dtypes.FLOATS
FLOATS_BF16 = dtypes.FLOATS_BF16
NUMERIC = dtypes.NUMERIC
INTS = dtypes.INTS
SIGNED = dtypes.SIGNED_INTS | dtypes.FLOATS_BF16
ALL = dtypes.ALL


def int_tuple(v) -> tuple | None:
    """A small integer input or attribute (pads, axes) as a tuple of ints, None for None."""
    return None if v is None else tuple(int(a) for a in np.asarray(v).reshape(-1))


class PerShape:
    """What a bound kernel works out from an input's shape and small integer inputs (a
    Pad's border copies, a reduction's axes), kept per key: a streaming model asks the same
    every run. At most LIMIT keys (a model whose shapes keep changing starts over)."""

    LIMIT = 64
    __slots__ = ("make", "kept")

    def __init__(self, make):
        self.make, self.kept = make, {}

    def __call__(self, *key):
        got = self.kept.get(key)
        if got is None:
            if len(self.kept) >= self.LIMIT:
                self.kept.clear()
            got = self.kept[key] = self.make(*key)
        return got


def contiguous(x: np.ndarray) -> np.ndarray:
    """C-contiguous x, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    return x if x.flags.c_contiguous else x.copy(order="C")


def interp_dtype(dt):
    """Interpolation arithmetic type: float64 where float32 would lose the input's precision."""
    dt = np.dtype(dt)
    if dt == np.float64 or (dt.kind in "iu" and dt.itemsize >= 4):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def cast_result(acc, dt):
    """Float result to the output dtype (integers round half to even and saturate, like the spec)."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.clip(np.rint(acc), info.min, info.max).astype(dt)
    return acc.astype(dt, copy=False)


def cubic_weights(r, a):
    """Keys cubic weights of taps -1, 0, 1, 2 around the source point at fraction r (Resize,
    GridSample)."""
    s, t = r + 1, 1 - r
    return np.stack([((a * s - 5 * a) * s + 8 * a) * s - 4 * a,
                     ((a + 2) * r - (a + 3)) * r * r + 1,
                     ((a + 2) * t - (a + 3)) * t * t + 1,
                     ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a], axis=1)


def hard_sigmoid_of(v, alpha, beta):
    """clamp(alpha·v + beta, 0, 1) in v's dtype: HardSigmoid, and HardSwish's gate."""
    return np.clip(v * v.dtype.type(alpha) + v.dtype.type(beta), 0, 1).astype(v.dtype, copy=False)


def swish_of(v):
    """v·sigmoid(v), as the Sigmoid and Mul it is fused from compute it: exp's overflow to inf
    (v below about -88 in float32) gives sigmoid's right 0, and v = -inf gives NaN as there."""
    with np.errstate(over="ignore", invalid="ignore"):
        return v * (1 / (1 + np.exp(-v)))


# Activations a fused node (glassrt::FusedConv, glassrt::FusedBatchNormalization) applies
# in place on its output; passes/fuse_conv.py makes those nodes.
ACTIVATIONS = {
    "Relu": lambda y, p: np.maximum(y, 0, out=y),
    "LeakyRelu": lambda y, p: np.multiply(y, y.dtype.type(p[0] if p else 0.01), out=y, where=y < 0),
    "Clip": lambda y, p: np.clip(y, p[0], p[1], out=y),
    "Sigmoid": lambda y, p: np.reciprocal(np.add(np.exp(np.negative(y, out=y), out=y), 1, out=y), out=y),
    # tile by tile (write_elementwise): a tile's temporaries, not the whole output's
    "HardSigmoid": lambda y, p: write_elementwise(y, lambda v: hard_sigmoid_of(v, p[0], p[1]), y),
    "HardSwish": lambda y, p: write_elementwise(y, lambda v: v * hard_sigmoid_of(v, p[0], p[1]), y),
    "Swish": lambda y, p: write_elementwise(y, swish_of, y),
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
