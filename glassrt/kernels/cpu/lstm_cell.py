"""One LSTM step's gates in one compiled pass, with MLAS's float32 logistic and tanh (the
default activations), bit for bit what the NumPy steps give (kernels/mlas_math.py): the
same float32 operations in the same order, the Horner steps fused multiply-adds formed in
float64 as mlas_math.fma32 forms them, NaN carried the same way (a clamp keeps it, fmin /
fmax at the gates' clip replace it).

com.microsoft's DynamicQuantizeLSTM spends its time here once its products are integer
ones: ddddocr's bidirectional LSTM (hidden 512) ran ~80 NumPy calls per step on rows of
512-2048 values, ~200 us a step, more than the product itself.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import mlas_math
from ._jit import jit, use_compiled

_F32 = np.float32
_TANH_BOUND, _TANH_P, _TANH_Q = (_F32(mlas_math._TANH[0]), np.array(mlas_math._TANH[1], _F32),
                                 np.array(mlas_math._TANH[2], _F32))
_LOG_BOUND, _LOG_P, _LOG_Q = (_F32(mlas_math._LOGISTIC[0]), np.array(mlas_math._LOGISTIC[1], _F32),
                              np.array(mlas_math._LOGISTIC[2], _F32))


def available() -> bool:
    """Whether to take the compiled step for this LSTM run: Numba loaded already, or LSTMs
    have run often enough here to pay its import (_jit.use_compiled)."""
    return use_compiled("lstm_cell")


@jit(error_model="numpy")
def _fma32(a, b, c):  # pragma: no cover - compiled
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@jit(error_model="numpy")
def _rational(x, bound, p, q):  # pragma: no cover - compiled
    v = x
    if v > bound:  # np.clip: NaN stays NaN
        v = bound
    if v < -bound:
        v = -bound
    v2 = v * v
    num = _fma32(v2, p[0], p[1])
    for k in range(2, p.size):
        num = _fma32(num, v2, p[k])
    den = _fma32(v2, q[0], q[1])
    for k in range(2, q.size):
        den = _fma32(den, v2, q[k])
    return (num * v) / den


@jit(error_model="numpy")
def _logistic(x):  # pragma: no cover - compiled
    r = _rational(x, _LOG_BOUND, _LOG_P, _LOG_Q) + np.float32(0.5)
    if r < np.float32(0.0):
        r = np.float32(0.0)
    if r > np.float32(1.0):
        r = np.float32(1.0)
    return r


@jit(error_model="numpy")
def _gate(v, b, has_bias, lo, hi):  # pragma: no cover - compiled
    """(v + b), then np.fmax(np.fmin(v, hi), lo): a NaN becomes hi."""
    if has_bias:
        v = v + b
    m = hi if (v != v or v > hi) else v
    return lo if m < lo else m


@jit(error_model="numpy")
def _cell(g, b_iof, b_c, has_bias, c, lo, hi, input_forget, c_out, h_out):  # pragma: no cover - compiled
    n, hidden = c.shape
    for r in range(n):
        for j in range(hidden):
            i = _logistic(_gate(g[r, j], b_iof[j], has_bias, lo, hi))
            o = _logistic(_gate(g[r, hidden + j], b_iof[hidden + j], has_bias, lo, hi))
            if input_forget:
                f = np.float32(1.0) - i
            else:
                f = _logistic(_gate(g[r, 2 * hidden + j], b_iof[2 * hidden + j], has_bias, lo, hi))
            cc = _rational(_gate(g[r, 3 * hidden + j], b_c[j], has_bias, lo, hi), _TANH_BOUND, _TANH_P, _TANH_Q)
            c_new = c[r, j] * f + i * cc
            c_out[r, j] = c_new
            h_out[r, j] = _rational(c_new, _TANH_BOUND, _TANH_P, _TANH_Q) * o


@functools.lru_cache(maxsize=16)
def _zeros(n):
    """Read-only zeros, made once per size rather than at every step."""
    z = np.zeros(n, _F32)
    z.flags.writeable = False
    return z


def lstm_cell(g, b_iof, b_c, c, lo, hi, input_forget):
    """(c', h') of one step without peepholes, sigmoid / tanh / tanh: g (N, 4H) the gates'
    pre-activations (i, o, f, c), b_iof (3H) and b_c (H) their biases or None, c (N, H)."""
    n, hidden = c.shape
    has_bias = b_iof is not None
    if not has_bias:  # (read, not added: the loop indexes them for every unit)
        b_iof, b_c = _zeros(3 * hidden), _zeros(hidden)
    c_out, h_out = np.empty((n, hidden), _F32), np.empty((n, hidden), _F32)
    _cell(np.ascontiguousarray(g, _F32), np.ascontiguousarray(b_iof, _F32), np.ascontiguousarray(b_c, _F32),
          has_bias, np.ascontiguousarray(c, _F32), _F32(lo), _F32(hi), bool(input_forget), c_out, h_out)
    return c_out, h_out
