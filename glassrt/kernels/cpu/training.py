"""ai.onnx.preview.training optimizers: Adagrad, Adam, Momentum.

Inputs are R (learning rate, scalar), T (update count, scalar int64), then the tensors
grouped by role: X1..Xn, G1..Gn, and the optimizer states (H..., or V..., H...).
Outputs are the new X1..Xn followed by the new states in the same grouping. Each
update is computed in float64 and stored in the tensor's own dtype.
"""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._util import as_out

DOMAIN = "ai.onnx.preview.training"


def _groups(tensors, k, op):
    if len(tensors) % k:
        raise ValueError(f"{op} takes R, T and {k} tensors per optimized tensor; got {len(tensors)} tensors")
    n = len(tensors) // k
    return [tensors[j * n:(j + 1) * n] for j in range(k)]


def _scalar(a):
    a = np.asarray(a)
    if a.size != 1:
        raise ValueError(f"R and T must be scalars, got shape {list(a.shape)}")
    return float(a.reshape(-1)[0])


def _f64(a):
    return np.asarray(a, dtype=np.float64)


def _into(values, out):
    """The updated tensors, each copied into its planned buffer."""
    bufs = (tuple(out) + (None,) * len(values))[:len(values)]
    return tuple(as_out(v, b) for v, b in zip(values, bufs))


@kernel("Adagrad", domain=DOMAIN, out=True, multi=True)
def adagrad(r, t, *tensors, out=(None,), decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    xs, gs, hs = _groups(tensors, 3, "Adagrad")
    rate = _scalar(r) / (1 + _scalar(t) * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g_reg = norm_coefficient * _f64(x) + g  # gradient of the L2 term added
        h2 = h + g_reg * g_reg
        new_x.append((x - rate * g_reg / (np.sqrt(h2) + epsilon)).astype(x.dtype))
        new_h.append(h2.astype(h.dtype))
    return _into(new_x + new_h, out)


@kernel("Adam", domain=DOMAIN, out=True, multi=True)
def adam(r, t, *tensors, out=(None,), alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
         norm_coefficient_post=0.0):
    xs, gs, vs, hs = _groups(tensors, 4, "Adam")
    step = _scalar(t)
    # Bias correction of both moments folded into the rate (none before the first update).
    rate = _scalar(r) * np.sqrt(1 - beta ** step) / (1 - alpha ** step) if step > 0 else _scalar(r)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g_reg = norm_coefficient * _f64(x) + g
        v2 = alpha * _f64(v) + (1 - alpha) * g_reg
        h2 = beta * _f64(h) + (1 - beta) * g_reg * g_reg
        x2 = (x - rate * v2 / (np.sqrt(h2) + epsilon)) * (1 - norm_coefficient_post)
        new_x.append(x2.astype(x.dtype))
        new_v.append(v2.astype(v.dtype))
        new_h.append(h2.astype(h.dtype))
    return _into(new_x + new_v + new_h, out)


@kernel("Momentum", domain=DOMAIN, out=True, multi=True)
def momentum(r, t, *tensors, out=(None,), alpha, beta, mode, norm_coefficient):
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum mode must be 'standard' or 'nesterov', got {mode!r}")
    xs, gs, vs = _groups(tensors, 3, "Momentum")
    b = beta if _scalar(t) > 0 else 1.0  # the gradient's coefficient is 1 at the first update
    rate = _scalar(r)
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g_reg = norm_coefficient * _f64(x) + g
        v2 = alpha * _f64(v) + b * g_reg
        x2 = x - rate * (v2 if mode == "standard" else g_reg + alpha * v2)
        new_x.append(x2.astype(x.dtype))
        new_v.append(v2.astype(v.dtype))
    return _into(new_x + new_v, out)
