"""Sequence and optional ops.

A sequence value is a Python list of arrays; an empty optional is None (and so is a
missing optional input). Tensors entering a sequence are copied: the input may be a
view of the plan's arena, whose bytes are reused once the tensor's last reader ran.
Kernels never mutate an input list; they build a new one.
"""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._util import norm_axis
from ..buffers import computed_aside


def _own(x):
    return np.array(x, copy=True)


def _position(pos, n, *, insert):
    """A Python index from a position tensor, checked against the ONNX bounds."""
    p = int(np.asarray(pos).reshape(-1)[0]) if np.asarray(pos).size == 1 else None
    if p is None:
        raise ValueError(f"position must be a scalar, got shape {np.asarray(pos).shape}")
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise IndexError(f"position {p} is out of range for a sequence of length {n} "
                         f"(valid: {-n}..{hi})")
    return p + n if p < 0 else p


@kernel("SequenceConstruct")
def sequence_construct(*xs):
    return [_own(x) for x in xs]


@kernel("SequenceEmpty")
def sequence_empty(*, dtype=None):
    return []


@kernel("SequenceLength", out=True)
@computed_aside
def sequence_length(seq):
    return np.array(len(seq), dtype=np.int64)


@kernel("SequenceAt", alias=True)
def sequence_at(seq, position):
    # The element itself (alias: the planner copies it if it becomes a graph output).
    return seq[_position(position, len(seq), insert=False)]


@kernel("SequenceInsert")
def sequence_insert(seq, tensor, position=None):
    out = list(seq)
    p = len(out) if position is None else _position(position, len(out), insert=True)
    out.insert(p, _own(tensor))
    return out


@kernel("SequenceErase")
def sequence_erase(seq, position=None):
    out = list(seq)
    if not out:
        raise IndexError("cannot erase from an empty sequence")
    del out[len(out) - 1 if position is None else _position(position, len(out), insert=False)]
    return out


@kernel("ConcatFromSequence")
def concat_from_sequence(seq, *, axis, new_axis=0):
    if not seq:
        raise ValueError("ConcatFromSequence needs a non-empty sequence")
    r = seq[0].ndim
    if new_axis:
        if not -r - 1 <= axis <= r:
            raise ValueError(f"axis {axis} is out of range for stacking tensors of rank {r}")
        return np.stack(seq, axis=axis + r + 1 if axis < 0 else axis)
    if not -r <= axis < r:
        raise ValueError(f"axis {axis} is out of range for tensors of rank {r}")
    return np.concatenate(seq, axis=norm_axis(axis, r))


@kernel("SplitToSequence")
def split_to_sequence(x, split=None, *, axis=0, keepdims=1):
    a = norm_axis(axis, x.ndim)
    if not 0 <= a < x.ndim:
        raise ValueError(f"axis {axis} is out of range for a tensor of rank {x.ndim}")
    dim = x.shape[a]
    if split is None:
        # Chunks of 1; keepdims=0 drops the split axis (np.take copies either way).
        return [np.take(x, [i] if keepdims else i, axis=a) for i in range(dim)]
    split = np.asarray(split)
    if split.ndim == 0:
        size = int(split)
        if size <= 0:
            raise ValueError(f"split must be positive, got {size}")
        sizes = [size] * (dim // size) + ([dim % size] if dim % size else [])
    else:
        sizes = [int(s) for s in split.reshape(-1)]
        if any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise ValueError(f"split sizes {sizes} do not add up to axis {a} of size {dim}")
    bounds = np.cumsum(sizes)[:-1]
    return [p.copy() for p in np.split(x, bounds, axis=a)]


@kernel("Optional", alias=True)
def optional(x=None, *, type=None):
    return x


@kernel("OptionalHasElement", out=True)
@computed_aside
def optional_has_element(x=None):
    return np.array(x is not None)


@kernel("OptionalGetElement", alias=True)
def optional_get_element(x):
    if x is None:
        raise ValueError("the optional input has no value")
    return x
