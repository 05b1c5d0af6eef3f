"""Geometry that follows from attributes and shapes alone: axes, broadcasting, the windows
of convolutions and pools. Pure functions of ints (and, where said, symbolic dims); the
meta rules, the kernels, the backward formulas and custom ops (glassrt/contrib) share them
(ops/windows.py turns the window geometry into array views).
"""
from __future__ import annotations

from .. import symbolic


def normalize_axis(axis: int, rank: int) -> int:
    """axis in [-rank, rank-1] as a non-negative index; anything else is the model's error
    (NumPy would raise an AxisError without the op's context, or wrap around silently)."""
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for an input of rank {rank}")
    return axis + rank if axis < 0 else axis


def broadcast_shapes(*shapes, ctx=None):
    """Multidirectional (NumPy) broadcasting of shapes whose dims may be symbolic; None when a
    shape is unknown. Shapes that cannot broadcast are an error: ctx.fail when a MetaContext
    is given (it names the node), else a ValueError."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        not_one = []
        for d in dims:
            if not (isinstance(d, int) and d == 1) and not any(d == e for e in not_one):
                not_one.append(d)
        if not not_one:
            out.append(1)
            continue
        ints = [d for d in not_one if isinstance(d, int)]
        if len(ints) > 1:
            msg = (f"shapes {', '.join(symbolic.shape_str(s) for s in shapes)} do not broadcast "
                   f"(dims {ints[0]} and {ints[1]})")
            if ctx is None:
                raise ValueError(msg)
            ctx.fail(msg)
        if ints:
            out.append(ints[0])  # a symbol that meets a concrete dim must equal it (or be 1)
        else:
            out.append(_max_of_dims(not_one))
    return tuple(out)


def _max_of_dims(dims):
    """The broadcast of symbolic dims that differ: their Max, kept small (symbolic.maximum:
    nested Maxes flattened, Min(x, n) next to x absorbed, as x[:n] broadcast with x is x,
    and an argument another provably bounds dropped)."""
    return symbolic.maximum(*dims)


def matmul_shape(a, b):
    """np.matmul's output shape for (possibly symbolic) operand shapes; a ValueError when the
    operands cannot multiply."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError("matmul operands must have rank 1 or more")
    a1, b1 = len(a) == 1, len(b) == 1
    a = (1,) + tuple(a) if a1 else tuple(a)
    b = tuple(b) + (1,) if b1 else tuple(b)
    if isinstance(a[-1], int) and isinstance(b[-2], int) and a[-1] != b[-2]:
        raise ValueError(f"inner dimensions differ: {a[-1]} vs {b[-2]}")
    out = list(broadcast_shapes(a[:-2], b[:-2])) + [a[-2], b[-1]]
    if b1:
        out.pop(-1)
    if a1:
        out.pop(-2 if not b1 else -1)
    return tuple(out)


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
                o = span // s + 1 if span >= 0 else 1  # (a pool's window overrunning by less than a stride: ops/meta/nn.py)
        begin.append(b)
        end.append(e)
        out.append(o)
    return begin, end, out, strides, dilations


def per_channel_size(shape, m) -> int | None:
    """1 or m where a tensor of `shape` broadcasts against a convolution's (N, m, H, W) output
    one value per output channel or one in all (shape (), (1,), (m, 1, 1), (1, m, 1, 1), ...),
    else None (a scale or bias laid along another axis, or one that would widen the output)."""
    if shape is None or len(shape) > 4 or not all(isinstance(d, int) for d in shape):
        return None
    full = (1,) * (4 - len(shape)) + tuple(shape)
    if full[0] != 1 or full[2:] != (1, 1) or full[1] not in (1, m):
        return None
    return full[1]
