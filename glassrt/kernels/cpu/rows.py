"""Compiled float32 loops over the rows of a 2-D array: softmax and layer normalization
along the last axis, the shapes transformers run them on.

NumPy needs five to eight passes and temporaries for these (max, subtract, exp, sum,
divide; mean, subtract, square, mean, sqrt, scale, shift); here each row is read two or
three times while it is in cache. exp stays NumPy's (SIMD) between the two compiled
passes of softmax: Numba calls libm's scalar exp, which is slower than the passes saved.
Sums are reassociated (fastmath "reassoc") so that they vectorize, like NumPy's pairwise
sums they differ from a sequential sum in the last bits only.
"""
from __future__ import annotations

import numpy as np

from ..buffers import TILE_ELEMENTS
from ._jit import jit, numba_missing

_PLAIN = dict(error_model="numpy")
_SUMMING = dict(_PLAIN, fastmath={"reassoc", "nsz", "contract"})


@jit(**_PLAIN)
def _max_subtract(x, out):
    """out[i] = x[i] - max(x[i]); a NaN in a row makes the row NaN, as in NumPy."""
    n, m = x.shape
    for i in range(n):
        mx = x[i, 0]
        for j in range(1, m):
            v = x[i, j]
            if v > mx or v != v:
                mx = v
                if v != v:
                    break
        for j in range(m):
            out[i, j] = x[i, j] - mx


@jit(**_SUMMING)
def _normalize_sum(y):
    n, m = y.shape
    for i in range(n):
        s = np.float32(0.0)
        for j in range(m):
            s += y[i, j]
        inv = np.float32(1.0) / s
        for j in range(m):
            y[i, j] *= inv


@jit(**_SUMMING)
def _subtract_log_sum(y, e):
    """y[i] -= log(sum(e[i])): log-softmax from the shifted values and their exps."""
    n, m = y.shape
    for i in range(n):
        s = np.float32(0.0)
        for j in range(m):
            s += e[i, j]
        ls = np.float32(np.log(s))
        for j in range(m):
            y[i, j] -= ls


@jit(**_SUMMING)
def _layer_norm(x, scale, bias, eps, y, mean, inv_std):
    """Per row: mean, variance of (x - mean) (two passes, as the spec's function does),
    then y = (x - mean) * inv_std * scale + bias. scale/bias are per column."""
    n, m = x.shape
    for i in range(n):
        s = np.float32(0.0)
        for j in range(m):
            s += x[i, j]
        mu = s / np.float32(m)
        q = np.float32(0.0)
        for j in range(m):
            d = x[i, j] - mu
            q += d * d
        r = np.float32(1.0) / np.sqrt(q / np.float32(m) + eps)
        mean[i] = mu
        inv_std[i] = r
        for j in range(m):
            y[i, j] = (x[i, j] - mu) * r * scale[j] + bias[j]


MIN_ROWS = 8  # fewer rows (a classifier's head): NumPy's whole-array passes are as fast


def usable(x) -> bool:
    """float32 with at least MIN_ROWS rows: what these loops take and are worth it for (a
    process's first compiled call loads Numba, ~0.6 s of a CNN's first run here)."""
    return (x.dtype == np.float32 and x.ndim >= 1 and x.size > 0 and x.shape[-1] > 0
            and x.size // x.shape[-1] >= MIN_ROWS and numba_missing() is None)


def softmax_last(x, out):
    """Softmax over the last axis of float32 x into out (same shape, C-contiguous)."""
    x2, y = np.ascontiguousarray(x).reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
    _max_subtract(x2, y)
    np.exp(y, out=y)
    _normalize_sum(y)
    return out


def log_softmax_last(x, out):
    x2, y = np.ascontiguousarray(x).reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
    _max_subtract(x2, y)
    step = max(1, TILE_ELEMENTS // y.shape[1])  # exp of a block of rows at a time: no tensor-sized temporary
    for r in range(0, y.shape[0], step):
        _subtract_log_sum(y[r:r + step], np.exp(y[r:r + step]))
    return out


def layer_norm_rows(x2, scale, bias, eps, y):
    """Layer-normalized float32 rows x2 (n, m), per-column scale and bias (m,), written into
    y (n, m) when it is a C-contiguous float32 array (else computed aside and copied);
    returns each row's (mean, inv_std), (n,) float32."""
    n, m = x2.shape
    res = y if y.dtype == np.float32 and y.flags.c_contiguous else np.empty((n, m), np.float32)
    mean, inv = np.empty(n, np.float32), np.empty(n, np.float32)
    _layer_norm(np.ascontiguousarray(x2), np.ascontiguousarray(scale, np.float32),
                np.ascontiguousarray(bias, np.float32), np.float32(eps), res, mean, inv)
    if res is not y:
        np.copyto(y, res)
    return mean, inv
