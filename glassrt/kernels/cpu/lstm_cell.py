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


# ---------------------------------------------------------------- DynamicQuantizeLSTM's recurrence


@jit(error_model="numpy")
def _dq_recurrence(xw, rq, rz, r_scale, b_iof, b_c, has_bias, h, c, lo, hi, input_forget, y, want_y, acc, g, c_out,
                   h_out, codes):  # pragma: no cover - compiled
    """Every step of one direction of com.microsoft's DynamicQuantizeLSTM (no sequence_lens,
    default activations, no peepholes), as microsoft_quant._lstm_direction's steps compute
    them: h quantized to uint8 from its own range (onnxruntime's GetQuantizationParameter and
    MlasQuantizeLinear), the exact int32 product (h_q - h_zp) @ (R - rz) — R's bytes (H, 4H)
    as they are, a megabyte that stays in cache across the steps, its zero point applied to
    the row sum — then float32(acc) * (h_scale * r_scale) + xw[t], then the cell. h and c
    (N, H) are the state, updated in place. Returns the steps done: fewer than T where h
    held a NaN or an infinity (the caller runs the NumPy steps, which say so)."""
    steps, n, gates = xw.shape
    hidden = gates // 4
    f0, f255 = np.float32(0.0), np.float32(255.0)
    combined = np.empty(gates, np.float32)
    for t in range(steps):
        lo_q, hi_q = f0, f0
        for r in range(n):
            for j in range(hidden):
                v = h[r, j]
                if v != v:
                    return t
                lo_q = v if v < lo_q else lo_q
                hi_q = v if v > hi_q else hi_q
        scale = np.float32(1.0) if hi_q == lo_q else (hi_q - lo_q) / f255
        zp = f0 - lo_q / scale
        if zp != zp:  # an infinite h: the NumPy steps fail on it, and say so
            return t
        zp = f0 if zp < f0 else (f255 if zp > f255 else zp)
        zp = np.float32(np.rint(zp))
        lo_c, hi_c = f0 - zp, f255 - zp
        for k in range(gates):
            combined[k] = scale * r_scale[k]
        for r in range(n):
            for k in range(gates):
                acc[k] = 0
            total = 0
            for j in range(hidden):
                q = h[r, j] / scale
                q = lo_c if (q != q or q < lo_c) else q  # np.fmax: a NaN takes the bound
                q = hi_c if q > hi_c else q
                a = np.int32(np.rint(q))  # (the byte minus its zero point)
                total += a
                codes[j] = a
            # the product four rows of R at a time (int32 sums wrap alike in any order): a
            # quarter of the passes over acc, 58 -> 42 us a step of 512 x 2048 measured
            j = 0
            while j + 4 <= hidden:
                a0, a1, a2, a3 = codes[j], codes[j + 1], codes[j + 2], codes[j + 3]
                r0, r1, r2, r3 = rq[j], rq[j + 1], rq[j + 2], rq[j + 3]
                for k in range(gates):
                    acc[k] += (a0 * np.int32(r0[k]) + a1 * np.int32(r1[k]) + a2 * np.int32(r2[k])
                               + a3 * np.int32(r3[k]))
                j += 4
            while j < hidden:
                a0, r0 = codes[j], rq[j]
                for k in range(gates):
                    acc[k] += a0 * np.int32(r0[k])
                j += 1
            for k in range(gates):
                g[r, k] = np.float32(np.int32(acc[k] - rz * total)) * combined[k] + xw[t, r, k]  # (int32 wraps)
        _cell(g, b_iof, b_c, has_bias, c, lo, hi, input_forget, c_out, h_out)
        for r in range(n):
            for j in range(hidden):
                c[r, j] = c_out[r, j]
                h[r, j] = h_out[r, j]
                if want_y:
                    y[t, r, j] = h_out[r, j]
    return steps


def dq_recurrence(xw, rq, rz, r_scale, b_iof, b_c, h, c, lo, hi, input_forget, y):
    """Run _dq_recurrence over xw (T, N, 4H) with R's bytes rq (H, 4H) and zero point rz;
    h, c (N, H) updated in place, y (T, N, H) or None written. Returns the steps done (see
    _dq_recurrence). Releases the GIL while it runs (a bidirectional node runs its two
    directions on two threads)."""
    steps, n, gates = xw.shape
    hidden = gates // 4
    has_bias = b_iof is not None
    if not has_bias:
        b_iof, b_c = _zeros(3 * hidden), _zeros(hidden)
    r_scale = np.ascontiguousarray(np.broadcast_to(np.asarray(r_scale, _F32), (gates,)))
    want_y = y is not None
    return _dq_recurrence(np.ascontiguousarray(xw, _F32), np.ascontiguousarray(rq), np.int32(rz), r_scale,
                          np.ascontiguousarray(b_iof, _F32), np.ascontiguousarray(b_c, _F32), has_bias, h, c,
                          _F32(lo), _F32(hi), bool(input_forget), y if want_y else np.empty((1, 1, 1), _F32), want_y,
                          np.empty(gates, np.int32), np.empty((n, gates), _F32), np.empty((n, hidden), _F32),
                          np.empty((n, hidden), _F32), np.empty(hidden, np.int32))
