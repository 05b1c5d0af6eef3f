"""Backward of data movement: reshapes, transposes, concat/split, slice, gather, expand, tile, pad."""
from __future__ import annotations

import numpy as np

from ..meta.shape import clamped_slice
from . import backward, unbroadcast


def _norm_axis(a, rank):
    return int(a) + rank if int(a) < 0 else int(a)


def _is_float(x):
    return x is not None and x.dtype.kind in "fc"


@backward(["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"])
def reshape_like(ctx, gy):
    x = ctx.inputs[0]
    return [gy.reshape(x.shape)] + [None] * (len(ctx.inputs) - 1)


@backward("Transpose")
def transpose(ctx, gy):
    (x,) = ctx.inputs
    perm = ctx.attrs.get("perm")
    perm = list(range(x.ndim))[::-1] if perm is None else [int(p) for p in perm]
    return [np.transpose(gy, np.argsort(perm))]  # the inverse permutation


@backward("Concat")
def concat(ctx, gy):
    xs = ctx.inputs
    a = _norm_axis(ctx.attr("axis"), xs[0].ndim)
    cuts = np.cumsum([x.shape[a] for x in xs])[:-1]
    return [g if _is_float(x) else None for g, x in zip(np.split(gy, cuts, axis=a), xs)]


@backward("Split")
def split(ctx, *gys):
    x = ctx.inputs[0]
    a = _norm_axis(ctx.attr("axis", 0), x.ndim)
    # The outputs' own shapes give the pieces (sizes from attribute, input or num_outputs alike);
    # an output nobody differentiates contributes zeros.
    dt = next(g.dtype for g in gys if g is not None)
    parts = [g if g is not None else np.zeros(y.shape, dt) for g, y in zip(gys, ctx.outputs)]
    return [np.concatenate(parts, axis=a)] + [None] * (len(ctx.inputs) - 1)


def _slice_index(shape, starts, ends, axes, steps):
    idx = [slice(None)] * len(shape)
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _norm_axis(a, len(shape))
        idx[a] = clamped_slice(int(s), int(e), int(st), shape[a])
    return tuple(idx)


@backward("Slice")
def slice_(ctx, gy):
    x = ctx.inputs[0]
    if ctx.version < 10:
        idx = _slice_index(x.shape, ctx.attrs["starts"], ctx.attrs["ends"], ctx.attrs.get("axes"), None)
    else:
        ins = list(ctx.inputs) + [None] * (5 - len(ctx.inputs))
        idx = _slice_index(x.shape, ins[1], ins[2], ins[3], ins[4])
    gx = np.zeros(x.shape, gy.dtype)
    gx[idx] = gy  # a slice never repeats an element: plain assignment
    return [gx] + [None] * (len(ctx.inputs) - 1)


@backward("Gather")
def gather(ctx, gy):
    x, indices = ctx.inputs
    a = _norm_axis(ctx.attr("axis", 0), x.ndim)
    n = x.shape[a]
    idx = indices.astype(np.int64).reshape(-1)
    idx = np.where(idx < 0, idx + n, idx)
    gx = np.zeros(x.shape, gy.dtype)
    # gy is x.shape[:a] + indices.shape + x.shape[a+1:]: flatten the index dims and bring them
    # to the front, then scatter-add (np.add.at sums repeated indices).
    g = gy.reshape(x.shape[:a] + (idx.size,) + x.shape[a + 1:])
    np.add.at(np.moveaxis(gx, a, 0), idx, np.moveaxis(g, a, 0))
    return [gx, None]


def _element_index(indices, axis, n):
    """The full index tuple for GatherElements/ScatterElements: `indices` on `axis`, the
    position itself on every other dim."""
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + n, idx)
    grids = list(np.ogrid[tuple(slice(0, d) for d in idx.shape)]) if idx.ndim else []
    grids[axis] = idx
    return tuple(grids)


@backward("GatherElements")
def gather_elements(ctx, gy):
    x, indices = ctx.inputs
    a = _norm_axis(ctx.attr("axis", 0), x.ndim)
    gx = np.zeros(x.shape, gy.dtype)
    np.add.at(gx, _element_index(indices, a, x.shape[a]), gy)
    return [gx, None]


@backward("Expand")
def expand(ctx, gy):
    x = ctx.inputs[0]
    return [unbroadcast(gy, x.shape), None]


@backward("Tile")
def tile(ctx, gy):
    x = ctx.inputs[0]
    if x.size == 0:
        return [np.zeros(x.shape, gy.dtype)] + [None] * (len(ctx.inputs) - 1)
    reps = [gy.shape[i] // x.shape[i] for i in range(x.ndim)]
    # The output is the input repeated block-wise: view each axis as (repeat, size), sum repeats.
    interleaved = [v for r, d in zip(reps, x.shape) for v in (r, d)]
    gx = gy.reshape(interleaved).sum(axis=tuple(range(0, 2 * x.ndim, 2)))
    return [gx] + [None] * (len(ctx.inputs) - 1)


@backward("Pad")
def pad(ctx, gy):
    x = ctx.inputs[0]
    n_in = len(ctx.inputs)
    mode = ctx.attr("mode", "constant")
    if ctx.version < 11:
        pads = [int(p) for p in (ctx.attrs.get("pads") or ctx.attrs.get("paddings"))]
        axes = None
    else:
        pads = [int(p) for p in ctx.inputs[1]]
        axes = ctx.inputs[3] if n_in > 3 else None
    r = x.ndim
    ax = list(range(r)) if axes is None else [_norm_axis(a, r) for a in axes]
    width = [[0, 0] for _ in range(r)]
    for i, a in enumerate(ax):
        width[a] = [pads[i], pads[i + len(ax)]]
    # Negative pads crop first, positive ones pad (the kernel's order).
    crop = tuple(slice(max(0, -b), x.shape[k] - max(0, -e)) for k, (b, e) in enumerate(width))
    shape_c = tuple(s.stop - s.start for s in crop)
    # Pad an array of flat source positions the same way: every output element then names the
    # element it copies (-1 for the constant), and the gradient is the scatter-add of gy by it.
    # One rule covers constant, reflect, edge and wrap.
    src = np.arange(int(np.prod(shape_c)), dtype=np.int64).reshape(shape_c)
    widths = [(max(0, b), max(0, e)) for b, e in width]
    if mode == "constant":
        pos = np.pad(src, widths, mode="constant", constant_values=-1)
    else:
        pos = np.pad(src, widths, mode=mode)
    valid = pos >= 0
    gc = np.bincount(pos[valid], weights=gy[valid].astype(np.float64), minlength=src.size)
    gx = np.zeros(x.shape, gy.dtype)
    gx[crop] = gc.reshape(shape_c)
    out = [gx] + [None] * (n_in - 1)
    if ctx.version >= 11 and n_in > 2 and ctx.inputs[2] is not None and mode == "constant" \
            and _is_float(ctx.inputs[2]):
        # constant_value is marked non-differentiable, but it is a float the output is made
        # of where nothing is copied: its gradient is the sum of gy there.
        v = ctx.inputs[2]
        out[2] = np.asarray(gy[~valid].sum(), dtype=v.dtype).reshape(v.shape)
    return out


@backward("GatherND")
def gather_nd(ctx, gy):
    x, indices = ctx.inputs
    b = int(ctx.attr("batch_dims", 0))
    k = indices.shape[-1]
    nb = int(np.prod(x.shape[:b], dtype=np.int64))
    m = int(np.prod(indices.shape[b:-1], dtype=np.int64))
    idx = indices.astype(np.int64).reshape(nb, m, k)
    # The kernel's index tuple: the flattened batch, then one index array per indexed dim.
    tup = [np.arange(nb).reshape(nb, 1)]
    for j in range(k):
        n = x.shape[b + j]
        tup.append(np.where(idx[..., j] < 0, idx[..., j] + n, idx[..., j]))
    gx = np.zeros((nb,) + x.shape[b:], gy.dtype)
    g = gy.reshape((nb, m) + x.shape[b + k:])
    if k:
        np.add.at(gx, tuple(tup), g)  # repeated tuples sum
    else:
        gx += g.sum(axis=1)  # empty tuples select whole slices
    return [gx.reshape(x.shape), None]


def _scatter_backward(gy, data, updates, index, reduction):
    """(grad data, grad updates) of data[index] = updates (reduction 'none') or += ('add')."""
    if reduction in ("add",):
        return gy, gy[index]
    if reduction not in ("none", "", None):
        from ...errors import GlassrtError

        raise GlassrtError(f"no backward for scatter reduction '{reduction}' (only 'none' and 'add')")
    # 'none': overwritten elements of data get no gradient; of duplicate indices only the
    # update that was written last (the kernel's NumPy assignment order) reaches the output.
    gd = gy.copy()
    gd[index] = 0
    writer = np.full(data.shape, -1, np.int64)
    ids = np.arange(updates.size, dtype=np.int64).reshape(updates.shape)
    writer[index] = ids
    gu = np.where(writer[index] == ids, gy[index], 0)
    return gd, gu


@backward(["ScatterElements", "Scatter"])
def scatter_elements(ctx, gy):
    data, indices, updates = ctx.inputs
    a = _norm_axis(ctx.attr("axis", 0), data.ndim)
    index = _element_index(indices, a, data.shape[a])
    gd, gu = _scatter_backward(gy, data, updates, index, ctx.attr("reduction", "none"))
    return [gd, None, gu.astype(updates.dtype, copy=False)]


@backward("ScatterND")
def scatter_nd(ctx, gy):
    data, indices, updates = ctx.inputs
    k = indices.shape[-1]
    idx = indices.astype(np.int64)
    index = tuple(np.where(idx[..., j] < 0, idx[..., j] + data.shape[j], idx[..., j]) for j in range(k))
    gd, gu = _scatter_backward(gy, data, updates, index, ctx.attr("reduction", "none"))
    return [gd, None, gu.astype(updates.dtype, copy=False)]


@backward("TopK")
def top_k(ctx, gy, *_):
    x = ctx.inputs[0]
    rest = [None] * (len(ctx.inputs) - 1)
    if gy is None:
        return [None] + rest
    a = _norm_axis(ctx.attr("axis", -1), x.ndim)
    # Values are x gathered at the Indices output (distinct along the axis): put gy back there.
    gx = np.zeros(x.shape, gy.dtype)
    np.put_along_axis(gx, ctx.outputs[1], gy, axis=a)
    return [gx] + rest


@backward("Trilu")
def trilu(ctx, gy):
    x = ctx.inputs[0]
    k = ctx.inputs[1] if len(ctx.inputs) > 1 else None
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    n, m = x.shape[-2:]
    j = np.arange(m) - np.arange(n)[:, None]  # column - row
    keep = j >= kk if int(ctx.attr("upper", 1)) else j <= kk
    return [np.where(keep, gy, np.zeros((), gy.dtype))] + [None] * (len(ctx.inputs) - 1)


def _block_perm(mode, space_to_depth):
    """The kernels' 6-d transposes (kernels/cpu/indexing.py)."""
    if space_to_depth:
        return (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return (0, 3, 4, 1, 5, 2) if mode == "DCR" else (0, 1, 4, 2, 5, 3)


@backward("DepthToSpace")
def depth_to_space(ctx, gy):
    (x,) = ctx.inputs
    bs, mode = int(ctx.attr("blocksize")), ctx.attr("mode", "DCR")
    n, c, h, w = x.shape
    oc = c // (bs * bs)
    perm = _block_perm(mode, False)
    # Forward: reshape to 6-d, transpose by perm, reshape to the output. Backward: undo each.
    six = (n, bs, bs, oc, h, w) if mode == "DCR" else (n, oc, bs, bs, h, w)
    moved = tuple(six[p] for p in perm)
    return [np.transpose(gy.reshape(moved), np.argsort(perm)).reshape(x.shape)]


@backward("SpaceToDepth")
def space_to_depth(ctx, gy):
    (x,) = ctx.inputs
    bs, mode = int(ctx.attr("blocksize")), ctx.attr("mode", "DCR")
    n, c, h, w = x.shape
    perm = _block_perm(mode, True)
    six = (n, c, h // bs, bs, w // bs, bs)
    moved = tuple(six[p] for p in perm)
    return [np.transpose(gy.reshape(moved), np.argsort(perm)).reshape(x.shape)]
