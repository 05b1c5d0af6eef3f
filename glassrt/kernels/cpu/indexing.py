"""Index-driven ops: gathers and scatters, sorting and selection (TopK, Unique, NonZero...),
cumulative ops, block rearrangements (DepthToSpace, Col2Im, MaxUnpool) and a few odd ones
(Einsum, Det, BitCast).

Ops whose output shape follows from the input shapes (or small constant inputs) write into
their planned buffer: scatters copy the data in and update it there, block rearrangements
copy through a view of the buffer; gathers through fancy indexing compute aside and copy.
NonZero, Unique and Compress have shapes that depend on the data, so they allocate."""
from __future__ import annotations

import itertools

import numpy as np

from ... import dtypes
from ..registry import kernel
from ._util import ALL, FLOATS_BF16, NUMERIC, as_out, new_out, norm_axis

# The schema types of most ops here (no float8 / sub-byte types): what np.unique, np.nonzero... handle.
STANDARD = NUMERIC | dtypes.BOOL | dtypes.COMPLEX | {dtypes.STRING}


def _wide(dt):
    """The float dtype arithmetic in `dt` is done in (float32 for float16/bfloat16)."""
    dt = np.dtype(dt)
    return np.dtype(np.float32) if dt == np.float16 or dtypes.name(dt) == "bfloat16" else dt


def _fix_indices(idx, n, what="index"):
    """int64 indices with negatives counted from the end; raises on anything out of [-n, n)."""
    idx = np.asarray(idx).astype(np.int64, copy=False)
    if idx.size:
        lo, hi = idx.min(), idx.max()
        if lo < -n or hi >= n:
            bad = idx[(idx < -n) | (idx >= n)].reshape(-1)[0]
            raise IndexError(f"{what} {bad} is out of range for a dim of size {n}")
        if lo < 0:
            idx = np.where(idx < 0, idx + n, idx)
    return idx


def _contig(a):
    """A C-contiguous array, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    return np.asarray(a, order="C")


def _zero(dt):
    """The fill value for 'zero' elements: "" for strings."""
    return np.array("" if dt == object else 0).astype(dt)


def _axis_index(indices, axis):
    """The full index tuple for element-wise ops along `axis`: `indices` on that axis, the
    position itself on every other (open grids broadcasting to indices.shape)."""
    grids = np.ogrid[tuple(slice(0, d) for d in indices.shape)] if indices.ndim else []
    grids = list(grids)
    grids[axis] = indices
    return tuple(grids)


# ---------------------------------------------------------------- gathers


@kernel("GatherElements", dtypes=ALL, versions=(11, None), out=True)
def gather_elements(data, indices, *, out=None, axis=0):
    a = norm_axis(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise ValueError(f"indices rank {indices.ndim} differs from data rank {data.ndim}")
    idx = _fix_indices(indices, data.shape[a])
    if any(i > d for k, (i, d) in enumerate(zip(idx.shape, data.shape)) if k != a):
        raise ValueError(f"indices shape {idx.shape} exceeds data shape {data.shape} off axis {a}")
    if all(i == d for k, (i, d) in enumerate(zip(idx.shape, data.shape)) if k != a):
        return as_out(np.take_along_axis(data, idx, axis=a), out)
    # indices may be smaller than data on the other axes too: index those explicitly.
    return as_out(data[_axis_index(idx, a)], out)


@kernel("GatherND", dtypes=ALL, versions=(11, None), out=True)
def gather_nd(data, indices, *, out=None, batch_dims=0):
    b = int(batch_dims)
    k = indices.shape[-1]
    if indices.shape[:b] != data.shape[:b]:
        raise ValueError(f"batch dims of indices {indices.shape[:b]} and data {data.shape[:b]} differ")
    if k > data.ndim - b:
        raise ValueError(f"index tuples of length {k} are too long for data of rank {data.ndim} with {b} batch dims")
    nb = int(np.prod(data.shape[:b], dtype=np.int64))
    d = data.reshape((nb,) + data.shape[b:])
    m = int(np.prod(indices.shape[b:-1], dtype=np.int64))
    idx = indices.reshape(nb, m, k)
    tup = [np.arange(nb).reshape(nb, 1)]
    tup += [_fix_indices(idx[..., j], data.shape[b + j]) for j in range(k)]
    # (nb, m, *data.shape[b+k:]); empty index tuples select whole slices.
    got = d[tuple(tup)] if k else np.broadcast_to(d[:, None], (nb, m) + d.shape[1:])
    got = got.reshape(indices.shape[:-1] + data.shape[b + k:])
    return _contig(got) if out is None else as_out(got, out)


# ---------------------------------------------------------------- scatters

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_at(out, index, updates, reduction):
    if reduction in ("none", None, ""):
        # Duplicate indices: numpy keeps the last write, like a sequential loop.
        out[index] = updates
    elif reduction in _REDUCE:
        if out.dtype == bool and reduction in ("add", "mul"):
            (np.logical_or if reduction == "add" else np.logical_and).at(out, index, updates)
        else:
            _REDUCE[reduction].at(out, index, updates)
    else:
        raise ValueError(f"unknown reduction {reduction!r}")
    return out


def _copy_of(data, out):
    """data copied into out (a new array without one): what a scatter updates."""
    if out is None:
        return data.copy()
    if out.shape != data.shape:
        raise ValueError(f"data has shape {list(data.shape)}, the planned output {list(out.shape)}")
    np.copyto(out, data)
    return out


def _scatter_elements(data, indices, updates, axis, reduction, out):
    a = norm_axis(axis, data.ndim)
    if indices.shape != updates.shape:
        raise ValueError(f"indices shape {indices.shape} differs from updates shape {updates.shape}")
    if indices.ndim != data.ndim:
        raise ValueError(f"indices rank {indices.ndim} differs from data rank {data.ndim}")
    idx = _fix_indices(indices, data.shape[a])
    return _scatter_at(_copy_of(data, out), _axis_index(idx, a), updates, reduction)


@kernel("ScatterElements", dtypes=ALL, versions=(11, None), out=True)
def scatter_elements(data, indices, updates, *, out=None, axis=0, reduction="none"):
    return _scatter_elements(data, indices, updates, axis, reduction, out)


@kernel("Scatter", dtypes=ALL, versions=(9, 11), out=True)
def scatter(data, indices, updates, *, out=None, axis=0):
    return _scatter_elements(data, indices, updates, axis, "none", out)


@kernel("ScatterND", dtypes=ALL, versions=(11, None), out=True)
def scatter_nd(data, indices, updates, *, out=None, reduction="none"):
    k = indices.shape[-1]
    if k > data.ndim:
        raise ValueError(f"index tuples of length {k} are too long for data of rank {data.ndim}")
    want = indices.shape[:-1] + data.shape[k:]
    if updates.shape != want:
        raise ValueError(f"updates shape {updates.shape} should be {want}")
    index = tuple(_fix_indices(indices[..., j], data.shape[j]) for j in range(k))
    return _scatter_at(_copy_of(data, out), index, updates, reduction)


@kernel("TensorScatter", dtypes=ALL, versions=(24, None), out=True)
def tensor_scatter(past_cache, update, write_indices=None, *, out=None, mode="linear", axis=-2):
    a = norm_axis(axis, past_cache.ndim)
    if a == 0:
        raise ValueError("TensorScatter: the sequence axis cannot be the batch axis 0")
    if mode not in ("linear", "circular"):
        raise ValueError(f"unknown mode {mode!r}")
    shp, ushp = past_cache.shape, update.shape
    if len(shp) != len(ushp) or any(s != u for i, (s, u) in enumerate(zip(shp, ushp)) if i != a) or ushp[a] > shp[a]:
        raise ValueError(f"update shape {ushp} does not fit cache shape {shp} on axis {a}")
    nb, max_len, seq = shp[0], shp[a], ushp[a]
    w = np.zeros(nb, np.int64) if write_indices is None else write_indices.astype(np.int64).reshape(-1)
    pos = w[:, None] + np.arange(seq)  # (batch, seq) cache positions
    if mode == "circular":
        pos %= max_len
    elif pos.size and (pos.min() < 0 or pos.max() >= max_len):
        raise IndexError(f"write positions {int(pos.min())}..{int(pos.max())} run past the cache length {max_len}")
    cache = _copy_of(past_cache, out)
    # Batch and sequence axes first, so that the two index arrays address (batch, seq) pairs.
    np.moveaxis(cache, a, 1)[np.arange(nb)[:, None], pos] = np.moveaxis(update, a, 1)
    return cache


# ---------------------------------------------------------------- triangles, eye


@kernel("Trilu", dtypes=ALL, versions=(14, None), out=True)
def trilu(x, k=None, *, out=None, upper=1):
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    n, m = x.shape[-2:]
    j = np.arange(m) - np.arange(n)[:, None]  # column - row
    keep = j >= kk if upper else j <= kk
    if out is None:
        return np.where(keep, x, _zero(x.dtype))
    out[...] = _zero(x.dtype)
    np.copyto(out, x, where=keep)
    return out


@kernel("EyeLike", dtypes=NUMERIC | dtypes.BOOL, versions=(9, None), out=True)
def eye_like(x, *, out=None, dtype=None, k=0):
    if x.ndim != 2:
        raise ValueError(f"EyeLike takes a 2-D input, not rank {x.ndim}")
    dt = x.dtype if dtype is None else dtypes.np_dtype(int(dtype))
    y = new_out(out, x.shape, dt)
    y.fill(0)
    n, m = x.shape
    r = np.arange(max(0, -k), min(n, m - k)) if -n < k < m else np.arange(0)
    y[r, r + k] = np.ones((), dt)
    return y


# ---------------------------------------------------------------- cumulative


def _cumulative(x, axis, exclusive, reverse, fn, identity, out):
    a = norm_axis(int(np.asarray(axis).reshape(-1)[0]), max(x.ndim, 1))
    if x.ndim == 0:
        return as_out(x.copy(), out)
    wide = _wide(x.dtype)
    if out is not None and not exclusive and not reverse and wide == x.dtype:
        return fn(x, axis=a, dtype=wide, out=out)  # the running sum / product straight into the buffer
    return as_out(_cumulative_aside(x, a, exclusive, reverse, fn, identity, wide), out)


def _cumulative_aside(x, a, exclusive, reverse, fn, identity, wide):
    if reverse:
        x = np.flip(x, a)
    y = fn(x, axis=a, dtype=wide)
    if exclusive:
        # Shift by one along the axis; the first position gets the identity.
        y = np.concatenate([np.full(x.shape[:a] + (1,) + x.shape[a + 1:], identity, wide),
                            np.take(y, np.arange(x.shape[a] - 1), axis=a)], axis=a)
    if reverse:
        y = np.flip(y, a)
    return _contig(y.astype(x.dtype, copy=False))


@kernel("CumSum", dtypes=NUMERIC, versions=(11, None), out=True)
def cumsum(x, axis, *, out=None, exclusive=0, reverse=0):
    return _cumulative(x, axis, exclusive, reverse, np.cumsum, 0, out)


@kernel("CumProd", dtypes=NUMERIC, versions=(26, None), out=True)
def cumprod(x, axis, *, out=None, exclusive=0, reverse=0):
    return _cumulative(x, axis, exclusive, reverse, np.cumprod, 1, out)


# ---------------------------------------------------------------- one-hot, selection


@kernel("OneHot", dtypes=NUMERIC, versions=(9, None), out=True)
def one_hot(indices, depth, values, *, out=None, axis=-1):
    d = int(np.asarray(depth).reshape(-1)[0])
    if d < 1:
        raise ValueError(f"OneHot depth must be positive, not {d}")
    values = np.asarray(values).reshape(-1)
    if values.size != 2:
        raise ValueError(f"OneHot values must hold [off, on], not {values.size} entries")
    a = norm_axis(axis, indices.ndim + 1)
    idx = indices.astype(np.int64) if indices.dtype.kind != "f" else np.trunc(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)  # out of [-d, d): matches no position below
    ar = np.arange(d).reshape((d,) + (1,) * (indices.ndim - a))
    hot = np.expand_dims(idx, a) == ar
    return as_out(values[hot.astype(np.intp)], out)  # off at 0, on at 1


def _topk_order(x, axis, largest):
    """Stable sort order along `axis`: ascending, or descending with ties kept in index order."""
    if not largest:
        return np.argsort(x, axis=axis, kind="stable")
    # Sorting the reversed axis stably and reading the result backwards gives descending
    # values with equal values in increasing index order (no negation, so unsigned is fine).
    n = x.shape[axis]
    rev = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return (n - 1) - np.flip(rev, axis)


def _topk(x, k, axis, largest):
    a = norm_axis(axis, x.ndim)
    k = int(np.asarray(k).reshape(-1)[0])
    n = x.shape[a]
    if k < 0 or k > n:
        raise ValueError(f"k={k} is out of range for axis {a} of size {n}")
    # (the partition's dozen array calls cost more than sorting a short axis whole: measured
    # on one row, k=5, 300 values 37 vs 11 us, 1,000 43 vs 20, 4,096 71 vs 81, 16,384 173 vs 1,194;
    # but a sort costs per row and the calls once: many rows partition from shorter axes,
    # k=5, rows x values: 8 x 1,000 342 vs 184 us, 64 x 300 790 vs 332, 64 x 2,000 7,542 vs
    # 1,840 (a nearest-neighbours classifier's batch), 16 x 300 83 vs 143, 4 x 1,000 98 vs 131)
    long_axis = n > _PARTIAL_FROM or (n >= 256 and x.size >= _PARTIAL_VALUES)
    if 0 < k and k * 8 <= n and long_axis and x.dtype.kind in "iuf" \
            and not (x.dtype.kind == "f" and np.isnan(x).any()):
        idx = _topk_partial(x, k, a, largest)
    else:
        order = _topk_order(x, a, largest)
        idx = _contig(np.take(order, np.arange(k), axis=a)).astype(np.int64, copy=False)
    return np.take_along_axis(x, idx, axis=a), idx


_PARTIAL_FROM = 3000  # values along the axis from which _topk_partial beats a whole sort
_PARTIAL_VALUES = 6000  # values in all from which it does, for axes of 256 or more


def _topk_partial(x, k, a, largest):
    """TopK indices for k much smaller than the axis: partition, then sort only k candidates."""
    n = x.shape[a]
    rows = np.moveaxis(x, a, -1)
    lead = rows.shape[:-1]
    rows = rows.reshape(-1, n)
    p = n - k if largest else k - 1
    part = np.argpartition(rows, p, axis=-1)
    cand = np.sort(part[:, p:] if largest else part[:, :k], axis=-1)  # index order: ties stay stable
    vals = np.take_along_axis(rows, cand, -1)
    idx = np.take_along_axis(cand, _topk_order(vals, 1, largest), -1)
    # The k-th value may have ties that the partition split arbitrarily: such rows take the full sort.
    kth = np.take_along_axis(rows, part[:, p:p + 1], -1)
    bad = np.nonzero((rows == kth).sum(-1) != (vals == kth).sum(-1))[0]
    if bad.size:
        idx[bad] = _topk_order(rows[bad], 1, largest)[:, :k]
    return _contig(np.moveaxis(idx.astype(np.int64, copy=False).reshape(lead + (k,)), -1, a))


_TOPK_TYPES = NUMERIC


def _topk_into(result, out):
    values, indices = result
    out = (tuple(out) + (None, None))[:2]
    return as_out(values, out[0]), as_out(indices, out[1])


@kernel("TopK", dtypes=_TOPK_TYPES, versions=(1, 9), multi=True, out=True)
def top_k_1(x, *, out=(None, None), k, axis=-1):
    return _topk_into(_topk(x, k, axis, True), out)


@kernel("TopK", dtypes=_TOPK_TYPES, versions=(10, 10), multi=True, out=True, name="top_k_10")
def top_k_10(x, k, *, out=(None, None), axis=-1):
    return _topk_into(_topk(x, k, axis, True), out)


@kernel("TopK", dtypes=_TOPK_TYPES, versions=(11, None), multi=True, out=True, name="top_k_11")
def top_k_11(x, k, *, out=(None, None), axis=-1, largest=1, sorted=1):  # noqa: A002 — the ONNX attribute's name
    # sorted=0 leaves the order unspecified: the sorted order is a valid one.
    return _topk_into(_topk(x, k, axis, bool(largest)), out)


@kernel("Unique", dtypes=STANDARD, versions=(11, None), multi=True)
def unique(x, *, axis=None, sorted=1):  # noqa: A002 — the ONNX attribute's name
    if axis is None:
        src, a = x.reshape(-1), 0
        y, first, inverse, counts = np.unique(src, return_index=True, return_inverse=True, return_counts=True)
    else:
        a = norm_axis(axis, x.ndim)
        src = x
        y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=a)
    inverse = inverse.reshape(-1)
    if not sorted:
        # First-occurrence order: renumber the sorted uniques by where they first appear.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse]
        y = np.take(src, first, axis=a)
    i64 = np.int64
    return (_contig(y), first.astype(i64), inverse.astype(i64), counts.astype(i64))


@kernel("NonZero", dtypes=STANDARD, versions=(9, None))
def non_zero(x):
    if x.ndim == 0:
        return np.zeros((0, int(bool(x))), np.int64)
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@kernel("Compress", dtypes=ALL, versions=(9, None))
def compress(x, condition, *, axis=None):
    cond = condition.reshape(-1).astype(bool, copy=False)
    if axis is None:
        flat = x.reshape(-1)
        if cond.size > flat.size:
            raise ValueError(f"condition of length {cond.size} is longer than the input's {flat.size} elements")
        return flat[:cond.size][cond]
    a = norm_axis(axis, x.ndim)
    if cond.size > x.shape[a]:
        raise ValueError(f"condition of length {cond.size} is longer than axis {a} of size {x.shape[a]}")
    return np.compress(cond, x, axis=a)


@kernel("ReverseSequence", dtypes=ALL, versions=(10, None), out=True)
def reverse_sequence(x, sequence_lens, *, out=None, batch_axis=1, time_axis=0):
    b, t = norm_axis(batch_axis, x.ndim), norm_axis(time_axis, x.ndim)
    if {b, t} != {0, 1}:
        raise ValueError(f"batch_axis and time_axis must be 0 and 1, not {batch_axis} and {time_axis}")
    n, steps = x.shape[b], x.shape[t]
    lens = sequence_lens.astype(np.int64).reshape(-1)
    if lens.size != n:
        raise ValueError(f"sequence_lens has {lens.size} entries for a batch of {n}")
    if lens.size and (lens.min() < 0 or lens.max() > steps):
        raise ValueError(f"sequence_lens {lens.tolist()} out of range [0, {steps}]")
    ti = np.arange(steps)
    src = np.where(ti < lens[:, None], lens[:, None] - 1 - ti, ti)  # (batch, time) source step
    if b == 1:
        src = src.T
    src = src.reshape(src.shape + (1,) * (x.ndim - 2))
    return as_out(np.take_along_axis(x, np.broadcast_to(src, src.shape[:2] + x.shape[2:]), axis=t), out)


# ---------------------------------------------------------------- bits, linear algebra


_SUBBYTE = {"int4": 4, "uint4": 4, "float4e2m1": 4, "int2": 2, "uint2": 2}


def _bits(dt):
    return _SUBBYTE.get(dtypes.name(dt), np.dtype(dt).itemsize * 8)


@kernel("BitCast", dtypes=ALL - {dtypes.STRING}, versions=(26, None), out=True)
def bit_cast(x, *, out=None, to):
    dt = dtypes.np_dtype(int(to))
    if _bits(x.dtype) != _bits(dt):
        raise ValueError(f"BitCast between {dtypes.name(x.dtype)} and {dtypes.name(dt)}: bit widths differ")
    if dtypes.name(x.dtype) in _SUBBYTE:
        # Sub-byte types each sit in a byte of their own: carry the low bits over, then
        # read them as the target type through a byte view.
        # (ml_dtypes reads only the low bits of each byte, signed types included).
        nbits = _SUBBYTE[dtypes.name(x.dtype)]
        return as_out(_contig(x.view(np.uint8) & np.uint8((1 << nbits) - 1)).view(dt), out)
    if out is not None and out.shape == x.shape:
        out.view(x.dtype)[...] = x  # the same bytes, moved in x's own type
        return out
    return as_out(_contig(x).view(dt).copy(), out)


@kernel("Det", dtypes=FLOATS_BF16, versions=(11, None), out=True)
def det(x, *, out=None):
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Det takes square matrices [..., M, M], not {list(x.shape)}")
    return as_out(np.asarray(np.linalg.det(x.astype(_wide(x.dtype), copy=False))).astype(x.dtype, copy=False), out)


def _check_einsum_sizes(eq: str, shapes) -> None:
    """NumPy's (and onnxruntime's) rule, checked first so that a mismatch is told in the
    equation's own terms: a letter has one size in all inputs, or 1 (broadcast), and once
    within one input (a diagonal); the dims '...' stands for broadcast as NumPy's do. (NumPy's
    own error, with optimize, names the letters it renames '...' to, and counts inputs its way.)"""
    terms = eq.partition("->")[0].split(",")
    sizes, extra = {}, []
    for k, (term, shape) in enumerate(zip(terms, shapes)):
        head, dots, tail = term.partition("...")
        if len(head) + len(tail) > len(shape) or (not dots and len(term) != len(shape)):
            raise ValueError(f"Einsum {eq!r}: input {k}'s term {term!r} does not fit its {len(shape)} dim(s) {list(shape)}")
        dims = {}
        for letter, d in [*zip(head, shape), *zip(tail, shape[len(shape) - len(tail):])]:
            if dims.setdefault(letter, d) != d:
                raise ValueError(f"Einsum {eq!r}: label '{letter}' is both {dims[letter]} and {d} in input {k} "
                                 f"{list(shape)}")
        for letter, d in dims.items():
            seen, where = sizes.get(letter, (1, None))
            if d != 1 and seen != 1 and d != seen:
                raise ValueError(f"Einsum {eq!r}: label '{letter}' is {seen} in input {where} and {d} in input {k} "
                                 "(equal sizes or 1 needed)")
            if d != 1 or where is None:
                sizes[letter] = (d, k)
        if dots:
            extra.append((k, tuple(shape[len(head):len(shape) - len(tail)])))
    try:
        np.broadcast_shapes(*[e for _, e in extra])
    except ValueError:
        raise ValueError(f"Einsum {eq!r}: the dims '...' stands for do not broadcast: "
                         + ", ".join(f"input {k} {list(e)}" for k, e in extra)) from None


@kernel("Einsum", dtypes=NUMERIC, versions=(12, None), out=True)
def einsum(*xs, out=None, equation):
    eq = equation.replace(" ", "")
    _check_einsum_sizes(eq, [x.shape for x in xs])
    dt = xs[0].dtype
    wide = _wide(dt)
    ops = [x.astype(wide, copy=False) for x in xs]
    # optimize: contraction order for 3+ operands, BLAS (tensordot) for pairs.
    r = np.einsum(eq, *ops, optimize=len(ops) > 1)
    return _contig(np.asarray(r).astype(dt, copy=False)) if out is None else as_out(r, out, cast=True)


# ---------------------------------------------------------------- block rearrangements


def _rearranged(t, out, shape):
    """The transposed view t copied into out (seen with t's shape), or into a new array."""
    if out is None:
        return _contig(t).reshape(shape)
    np.copyto(out.reshape(t.shape), t)
    return out


@kernel("DepthToSpace", dtypes=ALL, versions=(1, None), out=True)
def depth_to_space(x, *, out=None, blocksize, mode="DCR"):
    bs = int(blocksize)
    n, c, h, w = x.shape
    if c % (bs * bs):
        raise ValueError(f"channels {c} are not divisible by blocksize² = {bs * bs}")
    oc = c // (bs * bs)
    if mode == "DCR":
        t = x.reshape(n, bs, bs, oc, h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        t = x.reshape(n, oc, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return _rearranged(t, out, (n, oc, h * bs, w * bs))


@kernel("SpaceToDepth", dtypes=ALL, versions=(1, None), out=True)
def space_to_depth(x, *, out=None, blocksize, mode="DCR"):
    bs = int(blocksize)
    n, c, h, w = x.shape
    if h % bs or w % bs:
        raise ValueError(f"spatial dims {h}x{w} are not divisible by blocksize {bs}")
    t = x.reshape(n, c, h // bs, bs, w // bs, bs)
    if mode == "DCR":
        t = t.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        t = t.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return _rearranged(t, out, (n, c * bs * bs, h // bs, w // bs))


@kernel("CenterCropPad", dtypes=ALL, versions=(18, None), out=True)
def center_crop_pad(x, shape, *, out=None, axes=None):
    r = x.ndim
    ax = list(range(r)) if axes is None else [norm_axis(int(a), r) for a in axes]
    shape = [int(s) for s in np.asarray(shape).reshape(-1)]
    if len(shape) != len(ax):
        raise ValueError(f"shape {shape} has {len(shape)} entries for {len(ax)} axes")
    src = [slice(None)] * r
    dst = [slice(None)] * r
    out_shape = list(x.shape)
    for a, s in zip(ax, shape):
        dim = x.shape[a]
        out_shape[a] = s
        if s < dim:  # crop: the extra element goes to the end
            b = (dim - s) // 2
            src[a] = slice(b, b + s)
        elif s > dim:  # pad: likewise
            b = (s - dim) // 2
            dst[a] = slice(b, b + dim)
    y = new_out(out, tuple(out_shape), x.dtype)
    if y.shape != tuple(out_shape):
        raise ValueError(f"the result has shape {out_shape}, the planned output {list(y.shape)}")
    y[...] = _zero(x.dtype)
    y[tuple(dst)] = x[tuple(src)]
    return y


def _col2im_geometry(image, block, dilations, pads, strides):
    n = len(image)
    dil = list(dilations or [1] * n)
    st = list(strides or [1] * n)
    pd = list(pads or [0] * (2 * n))
    blocks = [(image[i] + pd[i] + pd[i + n] - dil[i] * (block[i] - 1) - 1) // st[i] + 1 for i in range(n)]
    return dil, st, pd, blocks


@kernel("Col2Im", dtypes=NUMERIC, versions=(18, None), out=True)
def col2im(x, image_shape, block_shape, *, out=None, dilations=None, pads=None, strides=None):
    image = [int(v) for v in image_shape.reshape(-1)]
    block = [int(v) for v in block_shape.reshape(-1)]
    nd = len(image)
    dil, st, pd, blocks = _col2im_geometry(image, block, dilations, pads, strides)
    taps = int(np.prod(block))
    n, ck, length = x.shape
    if ck % taps or length != int(np.prod(blocks)) or min(blocks) < 1:
        raise ValueError(f"input {list(x.shape)} does not match image {image}, block {block} "
                         f"({blocks} block positions)")
    c = ck // taps
    cols = x.reshape((n, c, taps) + tuple(blocks))
    wide = _wide(x.dtype)
    padded = np.zeros((n, c) + tuple(image[i] + pd[i] + pd[i + nd] for i in range(nd)), wide)
    # One strided accumulation per kernel tap (taps in row-major order over the block).
    for t, offs in enumerate(itertools.product(*[range(b) for b in block])):
        sl = tuple(slice(offs[i] * dil[i], offs[i] * dil[i] + (blocks[i] - 1) * st[i] + 1, st[i]) for i in range(nd))
        padded[(slice(None), slice(None)) + sl] += cols[:, :, t]
    crop = tuple(slice(pd[i], pd[i] + image[i]) for i in range(nd))
    img = padded[(slice(None), slice(None)) + crop]
    return _contig(img).astype(x.dtype, copy=False) if out is None else as_out(img, out, cast=True)


@kernel("MaxUnpool", dtypes=FLOATS_BF16, versions=(9, None), out=True)
def max_unpool(x, indices, output_shape=None, *, out=None, kernel_shape, pads=None, strides=None):
    nd = len(kernel_shape)
    st = list(strides or [1] * nd)
    pd = list(pads or [0] * (2 * nd))
    inferred = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * st[i] - pd[i] - pd[i + nd] + kernel_shape[i]
                                    for i in range(nd)]
    shape = inferred if output_shape is None else [int(v) for v in output_shape.reshape(-1)]
    if len(shape) != x.ndim:
        raise ValueError(f"output_shape {shape} must have rank {x.ndim}")
    if indices.shape != x.shape:
        raise ValueError(f"indices shape {indices.shape} differs from X shape {x.shape}")
    if shape[:2] != inferred[:2] or any(a < b for a, b in zip(shape[2:], inferred[2:])):
        raise ValueError(f"output_shape {shape} is smaller than the {inferred} the unpooling needs "
                         f"(or its batch and channels are not X's)")
    # Indices are flat positions in the tensor of the inferred shape (as MaxPool numbers
    # them). An explicit output_shape then places that tensor at its origin, as onnx's
    # reference and the node tests do (onnxruntime instead reads them in output_shape).
    total = int(np.prod(inferred, dtype=np.int64))
    idx = np.asarray(indices).reshape(-1).astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= total):  # (MaxPool's indices: none negative)
        bad = idx[(idx < 0) | (idx >= total)][0]
        raise IndexError(f"index {bad} is out of range: indices are positions in the {total} elements "
                         f"of the unpooled {inferred}")
    if out is not None and list(out.shape) == inferred:  # scattered straight into the buffer
        out.fill(0)
        out.reshape(-1)[idx] = x.reshape(-1)
        return out
    y = np.zeros(total, x.dtype)
    y[idx] = x.reshape(-1)
    y = y.reshape(inferred)
    if output_shape is None:
        return as_out(y, out)
    placed = np.zeros(shape, x.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(shape, inferred))
    placed[common] = y[common]
    return as_out(placed, out)
