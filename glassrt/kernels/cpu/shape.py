"""Ops that move data without arithmetic: reshape-likes (views), copies, gathers."""
from __future__ import annotations

import math

import numpy as np

from ... import dtypes
from ...ops.meta.shape import clamped_slice, constant_value, range_count, reshape_dims, uneven_split
from ..registry import kernel
from ._util import ALL, PerShape, as_out, contiguous, int_tuple, new_out, norm_axis

INT_MAX = 2**63 - 1


def _view_of(x, shape):
    return x.reshape(shape)


def _static_out(ctx):
    s = ctx.out_shape(0)
    return tuple(s) if s is not None and all(isinstance(d, int) for d in s) else None


class _Fail:
    """A stand-in MetaContext for reusing meta helpers at run time."""

    def fail(self, msg):
        raise ValueError(msg)


@kernel("Reshape", dtypes=ALL, alias=True, bind=True, any_shape=True)
def reshape(ctx):
    """A view of the input with the planned shape (no copy when the input is contiguous)."""
    static = _static_out(ctx)
    allowzero = int(ctx.attrs.get("allowzero", 0))
    if static is not None:
        return lambda x, shape=None: x.reshape(static)
    if ctx.opset < 5:
        target = list(ctx.attrs["shape"])
        return lambda x: x.reshape(reshape_dims(_Fail(), x.shape, target, allowzero))
    return lambda x, shape: x.reshape(reshape_dims(_Fail(), x.shape, [int(v) for v in shape], allowzero))


@kernel(["Flatten"], dtypes=ALL, alias=True)
def flatten(x, *, axis=1):
    # axis in [-r, r]: axis == r gives (prod(dims), 1) (norm_axis allows [-r, r) only)
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a <= x.ndim:
        raise ValueError(f"axis {axis} out of range for a rank-{x.ndim} input (allowed [{-x.ndim}, {x.ndim}])")
    # math.prod of Python ints: np.prod of a shape tuple costs more than the reshape itself
    return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))


@kernel("Squeeze", dtypes=ALL, alias=True, bind=True)
def squeeze(ctx):
    static = _static_out(ctx)
    if static is not None:
        return lambda x, axes=None: x.reshape(static)
    attr_axes = ctx.attrs.get("axes")

    def step(x, axes=None):
        ax = attr_axes if ctx.opset < 13 else (None if axes is None else [int(a) for a in axes])
        if ax is None:
            return np.squeeze(x)
        return np.squeeze(x, axis=tuple(norm_axis(a, x.ndim) for a in ax))

    return step


@kernel("Unsqueeze", dtypes=ALL, alias=True, bind=True)
def unsqueeze(ctx):
    static = _static_out(ctx)
    if static is not None:
        return lambda x, axes=None: x.reshape(static)
    attr_axes = ctx.attrs.get("axes")

    def step(x, axes=None):
        ax = attr_axes if ctx.opset < 13 else [int(a) for a in axes]
        r = x.ndim + len(ax)
        ax = sorted(norm_axis(int(a), r) for a in ax)
        shape = list(x.shape)
        for a in ax:
            shape.insert(a, 1)
        return x.reshape(shape)

    return step


@kernel("Identity", alias=True)
def identity(x):
    return x


@kernel("ChannelShuffle", domain="glassrt", dtypes=ALL, out=True)
def channel_shuffle(x, *, out=None, group=1):
    """glassrt::ChannelShuffle: channel c·g + k of the output is channel k·(C/g) + c of X."""
    n, c = x.shape[:2]
    y = new_out(out, x.shape, x.dtype)
    y.reshape(n, c // group, group, -1)[...] = x.reshape(n, group, c // group, -1).transpose(0, 2, 1, 3)
    return y


def _perm(perm, rank) -> list:
    """Transpose's perm as its meta reads it (absent: the axes reversed)."""
    return list(range(rank))[::-1] if perm is None else list(perm)


def _keeps_order(shape, perm) -> bool:
    """Whether transposing `shape` by `perm` leaves the elements in memory order: only
    dims of size 1 move (a decode step's heads split from one row, (1, 1, 12, 64) ->
    (1, 12, 1, 64))."""
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)


def _view_reason(ctx):
    shape = ctx.shape(0)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return "the input's shape is not known"
    if not _keeps_order(shape, _perm(ctx.attrs.get("perm"), len(shape))):
        return f"it reorders dims larger than 1 of {list(shape)} (a copy)"
    return None


# static_only: each plan judges its own shapes (symbolic dims judged as 1 at placement,
# one_row, so that a decode graph's heads transposes are candidates; a plan whose shapes
# reorder, or stay symbolic, takes the copying kernel)
@kernel("Transpose", dtypes=ALL, alias=True, bind=True, accepts=_view_reason, priority=10, name="view",
        static_only=True, one_row=True)
def transpose_view(ctx):
    """A view of the input where only dims of size 1 move: the same elements in the same
    order, reshaped (x.reshape keeps the logical order: right whatever x's strides, a view
    where it can be)."""
    static = tuple(int(d) for d in ctx.out_shape(0))
    return lambda x: x.reshape(static)


@kernel("Transpose", dtypes=ALL, out=True)
def transpose(x, *, out=None, perm=None):
    t = np.transpose(x, perm)
    if out is None:
        return contiguous(t)
    np.copyto(out, t)
    return out


@kernel("Concat", dtypes=ALL, out=True)
def concat(*xs, out=None, axis=1):  # Concat-1..3 made axis optional, defaulting to 1
    return np.concatenate(xs, axis=norm_axis(axis, xs[0].ndim), out=out)


def _split_view_reason(ctx):
    shape = ctx.shape(0)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return "the input's shape is not known"
    a = norm_axis(int(ctx.attrs.get("axis", 0)), len(shape))
    if math.prod(shape[:a]) != 1:
        return f"the dims before axis {a} of {list(shape)} are not all 1: each piece is strided (a copy)"
    if ctx.opset >= 13 and ctx.has(1) and ctx.const(1) is None:
        return "the split sizes are computed at run time"
    return None


# A Split whose dims before its axis are all 1 (a decode step's one row of fused Q, K and V,
# (1, 1, 2304) into three (1, 1, 768)) cuts its input into contiguous pieces: views, not
# copies. Measured in GPT-2's decode step: a copying Split 20 us a call in the step (its
# three fresh buffers cold after each product's weight stream), 3.4 us hot.
@kernel("Split", dtypes=ALL, alias=True, multi=True, bind=True, accepts=_split_view_reason, priority=10,
        name="view", static_only=True, one_row=True)
def split_view(ctx):
    """Contiguous pieces of the input (each a view; copies of an input that is not C-contiguous)."""
    copying = split(ctx)
    n = len(ctx.node.outputs)

    def step(x, sizes=None):
        if not x.flags.c_contiguous:
            return copying(x, sizes)
        return copying(x, sizes, out=(_VIEW,) * n)

    return step


_VIEW = object()  # split's `out` entry asking for the piece itself (a view of the input)


@kernel("Split", dtypes=ALL, out=True, multi=True, bind=True)
def split(ctx):
    n = len(ctx.node.outputs)
    axis = int(ctx.attrs.get("axis", 0))
    num_outputs = ctx.attrs.get("num_outputs")
    attr_split = ctx.attrs.get("split") if ctx.opset < 13 else None
    # Bound once when the split axis has a static size and the sizes are constants, whatever
    # the other dims (a decode step's growing sequence): a run then only indexes.
    fixed, shape = None, ctx.shape(0)
    given = attr_split if ctx.opset < 13 else ctx.const(1)
    sizes_known = ctx.opset < 13 or not ctx.has(1) or given is not None
    if shape is not None and sizes_known:
        a = norm_axis(axis, len(shape))
        if isinstance(shape[a], int):
            try:
                fixed = len(shape), a, shape[a], _split_index(a, shape[a], n, given, num_outputs)
            except ValueError:
                pass  # the step raises it for the inputs that meet it

    def step(x, sizes=None, *, out=(None,) * n):
        if fixed is not None and x.ndim == fixed[0] and x.shape[fixed[1]] == fixed[2]:
            index = fixed[3]
        else:
            a = norm_axis(axis, x.ndim)
            index = _split_index(a, x.shape[a], n, attr_split if ctx.opset < 13 else sizes, num_outputs)
        # a new array where no buffer is given: a view would alias the input
        return tuple(x[i] if o is _VIEW else x[i].copy() if o is None else _put(x[i], o) for i, o in zip(index, out))

    return step


def _split_index(a, dim, n, sizes, num_outputs) -> list:
    """The index tuple of each of Split's n outputs along axis a (of size dim)."""
    sizes = None if sizes is None else [int(s) for s in np.asarray(sizes).reshape(-1)]
    if sizes is None:
        if num_outputs is not None:
            sizes = uneven_split(dim, int(num_outputs))
        elif dim % n:
            raise ValueError(f"axis {a} of size {dim} does not split evenly into {n} outputs")
        else:
            sizes = [dim // n] * n
    if sum(sizes) != dim or len(sizes) != n or min(sizes, default=0) < 0:
        raise ValueError(f"split sizes {sizes} do not match axis {a} of size {dim} and {n} outputs")
    bounds = np.cumsum([0] + sizes).tolist()
    return [(slice(None),) * a + (slice(bounds[i], bounds[i + 1]),) for i in range(n)]


def _slice_index(shape, starts, ends, axes, steps):
    idx = [slice(None)] * len(shape)
    if axes is None:
        axes = range(len(starts))
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"starts, ends, axes and steps must have one length, got {len(starts)}, {len(ends)}, "
                         f"{len(axes)}, {len(steps)}")
    if len({norm_axis(int(a), len(shape)) for a in axes}) != len(axes):
        raise ValueError(f"axes {[int(a) for a in axes]} repeat an axis")
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(int(a), len(shape))
        s, e, st = int(s), int(e), int(st)
        if st == 0:
            raise ValueError("slice step cannot be 0")
        idx[a] = clamped_slice(s, e, st, shape[a])
    return tuple(idx)


@kernel("Slice", dtypes=ALL, out=True, bind=True, any_shape=True)
def slice_(ctx):
    if ctx.opset < 10:
        starts, ends, axes = ctx.attrs["starts"], ctx.attrs["ends"], ctx.attrs.get("axes")

        def step_v1(x, *, out=None):
            return _put(x[_slice_index(x.shape, starts, ends, axes, None)], out)

        return step_v1
    fixed = None
    consts = [ctx.const(i) for i in range(1, 5)]
    if ctx.shape(0) is not None and all(isinstance(d, int) for d in ctx.shape(0)) and \
            all(c is not None or not ctx.has(i + 1) for i, c in enumerate(consts)):
        fixed = _slice_index(ctx.shape(0), *consts)

    def step(x, starts, ends, axes=None, steps=None, *, out=None):
        idx = fixed if fixed is not None else _slice_index(x.shape, starts, ends, axes, steps)
        return _put(x[idx], out)

    return step


def _put(v, out):
    if out is None:
        return contiguous(v)
    np.copyto(out, v)
    return out


@kernel("Gather", dtypes=ALL, out=True, bind=True, any_shape=True, blas=False)
def gather(ctx):
    axis = int(ctx.attrs.get("axis", 0))
    fixed = ctx.const(1)
    # Constant indices (most models' Gathers: a row of a table, one dim of a shape) are
    # converted and their range found once: the per-run min() and max() were most of a
    # small Gather's ~5-9 us (Silero VAD's state rows)
    if fixed is not None:
        fixed = fixed.astype(np.int64, copy=False)
        lo, hi = (int(fixed.min()), int(fixed.max())) if fixed.size else (0, -1)

    def step(x, indices, *, out=None):
        a = norm_axis(axis, x.ndim)
        n = x.shape[a]
        if fixed is not None:
            idx = fixed
            if fixed.size and (lo < -n or hi >= n):
                _out_of_range(idx, a, n)
        else:
            idx = indices.astype(np.int64, copy=False)
            if idx.size and (idx.min() < -n or idx.max() >= n):
                _out_of_range(idx, a, n)
        # The indices are checked: "wrap" reads a negative one from the end as "raise" would, and
        # writes straight into out ("raise" gathers into a temporary first).
        return np.take(x, idx, axis=a, out=out, mode="wrap" if idx.size else "raise")

    return step


def _out_of_range(idx, axis, n):
    bad = idx[(idx < -n) | (idx >= n)].reshape(-1)[0]
    raise IndexError(f"index {bad} is out of range for axis {axis} of size {n}")


@kernel("Expand", dtypes=ALL, out=True)
def expand(x, shape, *, out=None):
    if out is not None:
        np.copyto(out, x)
        return out
    target = np.broadcast_shapes(x.shape, tuple(int(s) for s in shape))
    return np.broadcast_to(x, target).copy()


@kernel("Tile", dtypes=ALL, out=True)
def tile(x, repeats, *, out=None):
    reps = [int(r) for r in repeats]
    if out is None or len(reps) != x.ndim:
        return as_out(np.tile(x, reps), out)
    # out as (r0, s0, r1, s1, ...): x broadcast along every repeat axis, as np.tile lays it out.
    np.copyto(out.reshape([d for r, s in zip(reps, x.shape) for d in (r, s)]),
              x.reshape([d for s in x.shape for d in (1, s)]))
    return out


@kernel("Shape", dtypes=ALL, out=True)
def shape_(x, *, out=None, start=0, end=None):
    r = x.ndim
    s = max(0, min(r, start + r if start < 0 else start))
    e = r if end is None else max(0, min(r, end + r if end < 0 else end))
    return as_out(np.array(x.shape[s:e], dtype=np.int64), out)


@kernel("Size", dtypes=ALL, out=True)
def size_(x, *, out=None):
    return as_out(np.array(x.size, dtype=np.int64), out)


@kernel("Constant", bind=True)
def constant(ctx):
    value = constant_value(ctx.node.attrs)
    return lambda: value


@kernel("ConstantOfShape", dtypes=[np.int64], out=True)
def constant_of_shape(shape, *, out=None, value=None):
    v = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    if out is None:
        return np.full(tuple(int(s) for s in shape), v[0], dtype=v.dtype)
    out.fill(v[0])
    return out


@kernel("Range", dtypes=dtypes.DTypeSet([np.float16, np.float32, np.float64, np.int16, np.int32, np.int64], ["BFLOAT16"]),
        out=True)
def range_(start, limit, delta, *, out=None):
    s, l, d = (float(v.reshape(-1)[0].astype(np.float64)) if v.dtype.kind in "fV" else int(v.reshape(-1)[0])
               for v in (start, limit, delta))
    n = range_count(s, l, d)
    if start.dtype.kind in "iu":
        return as_out((s + np.arange(n, dtype=np.int64) * d).astype(start.dtype), out)
    # The ONNX function body accumulates in the input type: prev + delta, step after step;
    # add.accumulate adds in that order, each sum rounded to the type (float16 and bfloat16
    # too: the same bits as the loop of single additions, 300 times faster at 10**6 values)
    y = new_out(out, (n,), start.dtype)
    if y.shape != (n,):
        raise ValueError(f"the range holds {n} values, the planned output {list(y.shape)}")
    if n:
        y[:] = delta.reshape(-1)[0]
        y[0] = start.reshape(-1)[0]
        np.add.accumulate(y, dtype=start.dtype, out=y)
    return y


@kernel("Pad", dtypes=ALL, out=True, bind=True, blas=False)
def pad(ctx):
    mode = ctx.attrs.get("mode", "constant")
    np_mode = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    if ctx.opset < 11:
        # Pad-1 called the attribute "paddings"; Pad-2 renamed it "pads".
        fixed_pads = tuple(int(p) for p in (ctx.attrs["pads"] if "pads" in ctx.attrs else ctx.attrs["paddings"]))
        fixed_axes, fixed_value = None, float(ctx.attrs.get("value", 0.0))
    else:
        fixed_pads = int_tuple(ctx.const(1))
        fixed_axes = int_tuple(ctx.const(3)) if ctx.has(3) else None
        if not ctx.has(2):
            fixed_value = 0
        else:
            value = ctx.const(2)
            fixed_value = None if value is None else value.reshape(-1)[0] if value.size else 0
    axes_known = ctx.opset < 11 or not ctx.has(3) or fixed_axes is not None
    # The geometry (crop, pads, the slices the borders copy) per input shape, pads and axes:
    # a streaming model pads the same frame every run (Silero VAD's reflect pad took 16 us a
    # run working it out each time)
    geometry = PerShape(lambda shape, pads_, axes_: _pad_geometry(shape, pads_, axes_, np_mode))

    def step(x, pads=None, value=None, axes=None, *, out=None):
        crop, width, shape, inner, borders = geometry(
            x.shape, fixed_pads if fixed_pads is not None else int_tuple(pads),
            fixed_axes if axes_known else int_tuple(axes))
        if crop is not None:
            x = x[crop]
        if fixed_value is not None:
            cval = fixed_value
        else:
            cval = value.reshape(-1)[0] if value is not None and value.size else 0
        if borders is None or (np_mode == "constant" and out is None):
            kw = dict(constant_values=cval) if np_mode == "constant" else {}
            return as_out(np.pad(x, width, mode=np_mode, **kw), out)
        if out is None:
            out = np.empty(shape, x.dtype)
        elif out.shape != shape:
            raise ValueError(f"input {list(x.shape)} padded by {width} does not fit the planned output "
                             f"{list(out.shape)}")
        if np_mode == "constant":  # the value everywhere (assigned as np.pad assigns it), then the input
            out[...] = np.asarray(cval).ravel()[0]
        out[inner] = x
        for dst, src in borders:
            out[dst] = out[src]
        return out

    return step


def _pad_geometry(in_shape, pads, axes, mode):
    """(crop or None, pads per axis after cropping, the padded shape, the input's place in
    it, the border copies [(to, from)] in order, or None where np.pad must fill them)."""
    r = len(in_shape)
    ax = list(range(r)) if axes is None else [norm_axis(int(a), r) for a in axes]
    n = len(ax)
    if len(pads) != 2 * n:
        raise ValueError(f"pads {list(pads)} must have 2 entries per padded axis ({n})")
    width = [[0, 0] for _ in range(r)]
    for i, a in enumerate(ax):
        width[a] = [pads[i], pads[i + n]]
    # Negative pads crop.
    crop = tuple(slice(max(0, -b), in_shape[k] - max(0, -e)) for k, (b, e) in enumerate(width))
    shape = tuple(len(range(*s.indices(d))) for s, d in zip(crop, in_shape))
    width = [(max(0, b), max(0, e)) for b, e in width]
    padded = tuple(d + b + e for d, (b, e) in zip(shape, width))
    inner = tuple(slice(b, b + d) for d, (b, _) in zip(shape, width))
    borders = _pad_borders(shape, width, mode) if _pads_within(mode, shape, width) else None
    return crop if shape != tuple(in_shape) else None, width, padded, inner, borders


def _pads_within(mode, shape, width) -> bool:
    """Whether _pad_borders can fill the pads: each reflected (wrapped) once at most."""
    if mode == "reflect":
        return all(b < d and e < d for d, (b, e) in zip(shape, width) if b or e)
    if mode == "wrap":
        return all(b <= d and e <= d for d, (b, e) in zip(shape, width) if b or e)
    return mode == "constant" or all(d > 0 for d, (b, e) in zip(shape, width) if b or e)


def _pad_borders(shape, width, mode) -> list:
    """The copies [(to, from)] that fill the pads around the input once it is written in the
    middle of the output, axis after axis (as np.pad does: a later axis copies the earlier
    ones' pads into its corners), by slicing: np.pad itself costs ~40 us of Python on a
    512-sample frame (Silero VAD's reflect pad). None for "constant" (written beforehand)."""
    if mode == "constant":
        return []
    full = [slice(None)] * len(shape)

    def at(axis, s):
        idx = list(full)
        idx[axis] = s
        return tuple(idx)

    copies = []
    for axis, (d, (b, e)) in enumerate(zip(shape, width)):
        end = b + d  # one past the input along this axis
        if b:
            src = {"reflect": slice(2 * b, b, -1), "edge": slice(b, b + 1), "wrap": slice(end - b, end)}[mode]
            copies.append((at(axis, slice(0, b)), at(axis, src)))
        if e:
            src = {"reflect": slice(end - 2, end - 2 - e if end - 2 - e >= 0 else None, -1),
                   "edge": slice(end - 1, end), "wrap": slice(b, b + e)}[mode]
            copies.append((at(axis, slice(end, end + e)), at(axis, src)))
    return copies
