"""The windows of convolutions and pools as array views: the input padded on its spatial dims
(2..), and strided views of every window position or of every kernel tap. The forward
kernels (kernels/cpu), the backward formulas (ops/backward/nn.py) and the quantized pools
(glassrt/contrib) read the same windows through them; the window geometry itself (pads,
output sizes) is ops/geometry.py's. Index arithmetic only: no value is computed here.
"""
from __future__ import annotations

import itertools

import numpy as np


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
    n = len(kernel)
    for offs in itertools.product(*[range(k) for k in kernel]):
        idx = (slice(None), slice(None)) + tuple(
            slice(offs[i] * dilations[i], offs[i] * dilations[i] + (out_shape[i] - 1) * strides[i] + 1, strides[i])
            for i in range(n))
        yield offs, xp[idx]
