"""Ops that move data around without arithmetic: their shapes, and the value
propagation that lets shape arithmetic (Shape → Gather → Concat → Reshape) stay symbolic.
"""
from __future__ import annotations

import numpy as np

from ... import dtypes, symbolic
from ..registry import meta, values
from ._util import axes as norm_axes
from ._util import axis as norm_axis
from ._util import ints

INT_MAX = 2**62


def dims_array(dims):
    """A 1-D value of dims: int64 when concrete, object when any dim is symbolic."""
    dims = [symbolic.normalize(d) if not isinstance(d, int) else d for d in dims]
    if all(isinstance(d, int) for d in dims):
        return np.array(dims, dtype=np.int64)
    return np.array(dims, dtype=object)


def _tidy(v):
    """Turn an object array whose entries are all ints back into int64."""
    if v.dtype == object:
        flat = [symbolic.normalize(x) if isinstance(x, symbolic.Dim) else x for x in v.flat]
        if all(isinstance(x, (int, np.integer)) for x in flat):
            return np.array(flat, dtype=np.int64).reshape(v.shape)
        return np.array(flat, dtype=object).reshape(v.shape)
    return v


def _entries(v):
    return [x if isinstance(x, symbolic.Dim) else int(x) for x in v.reshape(-1)]


# ---------------------------------------------------------------- Shape, Size, Constant


def _shape_range(ctx, rank):
    start, end = int(ctx.attr("start", 0)), ctx.attrs.get("end")
    end = rank if end is None else int(end)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return start, max(start, end)


@meta("Shape")
def shape_(ctx):
    r = ctx.rank(0)
    if r is None:
        return [ctx.tensor(np.int64, (symbolic.fresh("rank"),))]
    s, e = _shape_range(ctx, r)
    return [ctx.tensor(np.int64, (e - s,))]


@values("Shape")
def shape_values(ctx):
    shp = ctx.shape(0)
    if shp is None:
        return [None]
    s, e = _shape_range(ctx, len(shp))
    return [dims_array(shp[s:e])]


@meta("Size")
def size_(ctx):
    return [ctx.tensor(np.int64, ())]


@values("Size")
def size_values(ctx):
    shp = ctx.shape(0)
    return [None if shp is None else _tidy(np.array(symbolic.prod(shp), dtype=object))]


def constant_value(attrs):
    for key in ("value", "sparse_value"):
        if key in attrs:
            return np.asarray(attrs[key])
    if "value_float" in attrs:
        return np.array(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.array(attrs["value_floats"], dtype=np.float32)
    if "value_int" in attrs:
        return np.array(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.array(attrs["value_ints"], dtype=np.int64)
    if "value_string" in attrs:
        return np.array(attrs["value_string"], dtype=object)
    if "value_strings" in attrs:
        return np.array(attrs["value_strings"], dtype=object)
    return None


@meta("Constant")
def constant(ctx):
    v = constant_value(ctx.node.attrs)
    if v is None:
        ctx.fail("Constant has no value attribute")
    return [ctx.tensor(v.dtype, v.shape)]


@values("Constant")
def constant_values(ctx):
    return [constant_value(ctx.node.attrs)]


# ---------------------------------------------------------------- Reshape family


def reshape_dims(ctx, in_shape, target, allowzero):
    out, infer_at = [], None
    for i, d in enumerate(target):
        if isinstance(d, int) and d == -1:
            if infer_at is not None:
                ctx.fail(f"shape {list(target)} has more than one -1")
            infer_at = i
            out.append(None)
        elif isinstance(d, int) and d == 0 and not allowzero:
            if in_shape is None or i >= len(in_shape):
                if in_shape is None:
                    out.append(symbolic.fresh())
                    continue
                ctx.fail(f"shape {list(target)} copies dim {i} (0) but the input has rank {len(in_shape)}")
            out.append(in_shape[i])
        elif isinstance(d, int) and d < -1:
            ctx.fail(f"shape {list(target)} has a negative dim {d}")
        else:
            out.append(d)
    if infer_at is not None:
        if in_shape is None:
            out[infer_at] = symbolic.fresh()
        else:
            total, known = symbolic.prod(in_shape), symbolic.prod([d for d in out if d is not None])
            if isinstance(total, int) and isinstance(known, int):
                if known == 0 or total % known:
                    ctx.fail(f"cannot reshape {symbolic.shape_str(in_shape)} ({total} elements) into "
                             f"{list(target)}")
                out[infer_at] = total // known
            else:
                q = symbolic.exact_div(total, known)  # batch*seq*768 / (12*batch) is 64*seq
                out[infer_at] = q if q is not None else symbolic.fresh()
    elif in_shape is not None:
        total, new = symbolic.prod(in_shape), symbolic.prod(out)
        if isinstance(total, int) and isinstance(new, int) and total != new:
            ctx.fail(f"cannot reshape {symbolic.shape_str(in_shape)} ({total} elements) into "
                     f"{list(target)} ({new} elements)")
    return tuple(out)


@meta("Reshape")
def reshape(ctx):
    if ctx.opset < 5:
        target = list(ctx.attr("shape"))
    else:
        v = ctx.value(1)
        if v is None:
            n = ctx.shape(1)
            if n is None or not isinstance(n[0], int):
                return [ctx.tensor(ctx.dtype(0), None)]
            return [ctx.tensor(ctx.dtype(0), tuple(symbolic.fresh() for _ in range(n[0])))]
        target = _entries(v)
    return [ctx.tensor(ctx.dtype(0), reshape_dims(ctx, ctx.shape(0), target, int(ctx.attr("allowzero", 0))))]


@values(["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"])
def reshape_values(ctx, out_types=None):
    """The data's value, which inference reshapes to the meta's (static) shape; unknown where
    the shape or axes come at run time (a constant reshaped by a fed shape is not the
    constant: a plan that took it for one returned the data as it was, whatever the shape)."""
    v = ctx.value(0)
    if v is None or (ctx.has(1) and ctx.value(1) is None):
        return [None]
    return [v]


@meta("Flatten")
def flatten(ctx):
    shp = ctx.shape(0)
    if shp is None:
        return [ctx.tensor(ctx.dtype(0), (symbolic.fresh(), symbolic.fresh()))]
    a = int(ctx.attr("axis", 1))
    a = a + len(shp) if a < 0 else a
    if not 0 <= a <= len(shp):
        ctx.fail(f"axis {ctx.attr('axis')} is out of range for rank {len(shp)}")
    return [ctx.tensor(ctx.dtype(0), (symbolic.prod(shp[:a]), symbolic.prod(shp[a:])))]


def _axes_input(ctx, attr_before):
    """Axes from the attribute (old opsets) or the second input (value may be unknown)."""
    if ctx.opset < attr_before:
        a = ctx.attrs.get("axes")
        return None if a is None else list(a), True
    if not ctx.has(1):
        return None, True
    v = ctx.const(1)
    return (None, False) if v is None else (ints(v), True)


@meta("Squeeze")
def squeeze(ctx):
    shp = ctx.shape(0)
    ax, known = _axes_input(ctx, 13)
    if shp is None or not known:
        return [ctx.tensor(ctx.dtype(0), None)]
    if ax is None:
        if not all(isinstance(d, int) for d in shp):
            return [ctx.tensor(ctx.dtype(0), None)]
        return [ctx.tensor(ctx.dtype(0), tuple(d for d in shp if d != 1))]
    ax = norm_axes(ctx, ax, len(shp))
    for a in ax:
        if isinstance(shp[a], int) and shp[a] != 1:
            ctx.fail(f"cannot squeeze axis {a} of size {shp[a]} (input {symbolic.shape_str(shp)})")
    return [ctx.tensor(ctx.dtype(0), tuple(d for i, d in enumerate(shp) if i not in ax))]


@meta("Unsqueeze")
def unsqueeze(ctx):
    shp = ctx.shape(0)
    ax, known = _axes_input(ctx, 13)
    if shp is None or not known or ax is None:
        if ax is None and known:
            ctx.fail("Unsqueeze needs axes")
        return [ctx.tensor(ctx.dtype(0), None)]
    rank = len(shp) + len(ax)
    ax = set(norm_axes(ctx, ax, rank))
    it = iter(shp)
    return [ctx.tensor(ctx.dtype(0), tuple(1 if i in ax else next(it) for i in range(rank)))]


@meta("Transpose")
def transpose(ctx):
    shp = ctx.shape(0)
    if shp is None:
        return [ctx.tensor(ctx.dtype(0), None)]
    perm = ctx.attrs.get("perm")
    perm = list(range(len(shp)))[::-1] if perm is None else list(perm)
    if sorted(perm) != list(range(len(shp))):
        ctx.fail(f"perm {perm} is not a permutation of the {len(shp)} axes of input {symbolic.shape_str(shp)}")
    return [ctx.tensor(ctx.dtype(0), tuple(shp[p] for p in perm))]


@values("Transpose")
def transpose_values(ctx):
    v = ctx.value(0)
    return [None if v is None else np.transpose(v, ctx.attrs.get("perm"))]


# ---------------------------------------------------------------- Concat, Split, Slice


@meta("Concat")
def concat(ctx):
    shapes = [ctx.shape(i) for i in range(ctx.n_inputs) if ctx.has(i)]
    dts = {ctx.dtype(i) for i in range(ctx.n_inputs) if ctx.has(i)}
    if len(dts) > 1:
        ctx.fail(f"inputs must share one element type, got {sorted(map(str, dts))}")
    known = [s for s in shapes if s is not None]
    if not known:
        return [ctx.tensor(ctx.dtype(0), None)]
    rank = len(known[0])
    if any(len(s) != rank for s in known):
        ctx.fail("inputs have different ranks: " + ", ".join(symbolic.shape_str(s) for s in known))
    if len(known) < len(shapes):
        return [ctx.tensor(ctx.dtype(0), tuple(symbolic.fresh() for _ in range(rank)))]
    a = norm_axis(ctx, int(ctx.attr("axis", 1)), rank)  # Concat-1..3: axis optional, default 1
    out = list(known[0])
    for s in known[1:]:
        for k in range(rank):
            if k != a and isinstance(out[k], int) and isinstance(s[k], int) and out[k] != s[k]:
                ctx.fail(f"inputs differ outside axis {a}: " + ", ".join(symbolic.shape_str(x) for x in known))
            if k != a and not isinstance(out[k], int) and isinstance(s[k], int):
                out[k] = s[k]
    out[a] = symbolic.normalize(sum((s[a] for s in known), 0)) if not all(isinstance(s[a], int) for s in known) \
        else sum(s[a] for s in known)
    return [ctx.tensor(ctx.dtype(0), tuple(out))]


@values("Concat")
def concat_values(ctx):
    vs = [ctx.value(i) for i in range(ctx.n_inputs) if ctx.has(i)]
    if any(v is None for v in vs):
        return [None]
    if any(v.dtype == object for v in vs):
        vs = [v.astype(object) for v in vs]
    return [_tidy(np.concatenate(vs, axis=int(ctx.attr("axis", 1))))]


@meta("Split")
def split(ctx):
    shp = ctx.shape(0)
    n = len(ctx.node.outputs)
    if shp is None:
        return [ctx.tensor(ctx.dtype(0), None)] * n
    a = norm_axis(ctx, int(ctx.attr("axis", 0)), len(shp))
    if ctx.opset < 13:
        sizes = ctx.attrs.get("split")
        sizes = None if sizes is None else list(sizes)
    elif ctx.has(1):
        v = ctx.const(1)
        if v is None:
            return [ctx.tensor(ctx.dtype(0), tuple(symbolic.fresh() if k == a else d for k, d in enumerate(shp)))
                    for _ in range(n)]
        sizes = ints(v)
    else:
        sizes = None
    dim = shp[a]
    if sizes is None:
        parts = int(ctx.attr("num_outputs", n)) if ctx.opset >= 18 else n
        if isinstance(dim, int):
            if ctx.opset >= 18 and "num_outputs" in ctx.attrs:
                sizes = uneven_split(dim, parts)
            else:
                if dim % parts:
                    ctx.fail(f"dim {dim} of axis {a} does not split evenly into {parts} outputs")
                sizes = [dim // parts] * parts
        else:
            q = symbolic.exact_div(dim, parts)
            sizes = [q if q is not None else symbolic.fresh() for _ in range(parts)]
    if len(sizes) != n:
        ctx.fail(f"split sizes {sizes} do not match the {n} outputs")
    if any(isinstance(s, int) and s < 0 for s in sizes):
        ctx.fail(f"split sizes {sizes} must not be negative")
    if isinstance(dim, int) and all(isinstance(s, int) for s in sizes) and sum(sizes) != dim:
        ctx.fail(f"split sizes {sizes} do not add up to dim {dim} of axis {a}")
    return [ctx.tensor(ctx.dtype(0), tuple(s if k == a else d for k, d in enumerate(shp))) for s in sizes]


def clamped_slice(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice bounds for one axis as a Python slice on a dim of this size, clamped as the
    spec says: a negative bound counts from the end, then start and end are clamped to
    [0, dim] for a positive step, to [0, dim - 1] and [-1, dim - 1] for a negative one.
    (Python's slice.indices clamps a negative step's start below -dim to "before the first",
    an empty slice, where ONNX and onnxruntime start at index 0.) An end of -1 then means
    "past index 0": None, as -1 would wrap to the end."""
    if step == 0:
        raise ValueError("slice step cannot be zero")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


def uneven_split(dim: int, parts: int) -> list[int]:
    """num_outputs that do not divide the dim: chunks of ceil(dim/parts), the last ones
    shorter (possibly empty), as onnx.reference slices them."""
    chunk = -(-dim // parts)
    return [max(0, min(dim, (i + 1) * chunk) - min(dim, i * chunk)) for i in range(parts)]


def _slice_params(ctx, rank):
    if ctx.opset < 10:
        starts, ends = ctx.attrs.get("starts"), ctx.attrs.get("ends")
        ax = ctx.attrs.get("axes")
        steps = None
    else:
        # starts and ends may be symbolic (x[:, :Shape(y)[1]]); axes and steps must be known.
        vals = [(ctx.value if i <= 2 else ctx.const)(i) if ctx.has(i) else None for i in range(1, 5)]
        if vals[0] is None or vals[1] is None or (ctx.has(3) and vals[2] is None) or (ctx.has(4) and vals[3] is None):
            return None
        starts, ends = _dims(vals[0]), _dims(vals[1])
        ax = ints(vals[2]) if vals[2] is not None else None
        steps = ints(vals[3]) if vals[3] is not None else None
    starts, ends = list(starts), list(ends)
    ax = list(range(len(starts))) if ax is None else norm_axes(ctx, ax, rank)
    steps = [1] * len(starts) if steps is None else list(steps)
    if not (len(starts) == len(ends) == len(ax) == len(steps)):
        ctx.fail(f"starts/ends/axes/steps have different lengths: {starts}, {ends}, {ax}, {steps}")
    if any(s == 0 for s in steps):
        ctx.fail("slice step cannot be 0")
    return list(zip(ax, starts, ends, steps))


def _dims(v):
    """A known 1-D value as ints, symbolic entries kept as dims."""
    return [symbolic.normalize(x) if not isinstance(x, (int, np.integer)) else int(x) for x in v.reshape(-1)]


def _nonnegative(v) -> bool:
    """v >= 0 for every value of its symbols (False when that depends on them)."""
    try:
        return v >= 0
    except TypeError:
        return False


def slice_len(dim, start, end, step):
    if not isinstance(start, int) or not isinstance(end, int):
        # A symbolic bound (x[:, past:past + seq], position_ids[:, :seq]): as onnxruntime's
        # symbolic shape inference does, the bounds are taken to lie within the dim, so the
        # length is end - start. Taking the clamp into account instead (Min(end, dim)) keeps
        # every shape downstream symbolic and every node after it bound per run. A run whose
        # bounds do fall outside gets its real slice, and the first node whose input then
        # disagrees with the plan fails with the node named, never silently.
        if step == 1 and _nonnegative(start) and (end >= INT_MAX // 4 if isinstance(end, int) else _nonnegative(end)):
            length = symbolic.normalize((dim if isinstance(end, int) else end) - start)
            if not isinstance(length, int) or length >= 0:
                return length
        return symbolic.fresh("slice")
    if isinstance(dim, int):
        return len(range(dim)[clamped_slice(start, end, step, dim)])
    if step == 1 and start >= 0 and end >= INT_MAX // 4:
        return symbolic.normalize(dim - start) if start else dim
    if step == 1 and start >= 0 and end < 0:
        return symbolic.normalize(dim + end - start)
    if step == 1 and start < 0 and end >= INT_MAX // 4:
        return -start  # valid once dim >= -start
    return symbolic.fresh("slice")


@meta("Slice")
def slice_(ctx):
    shp = ctx.shape(0)
    if shp is None:
        return [ctx.tensor(ctx.dtype(0), None)]
    params = _slice_params(ctx, len(shp))
    if params is None:
        return [ctx.tensor(ctx.dtype(0), tuple(symbolic.fresh("slice") for _ in shp))]
    out = list(shp)
    for a, s, e, st in params:
        out[a] = slice_len(shp[a], s, e, st)
    return [ctx.tensor(ctx.dtype(0), tuple(out))]


@values("Slice")
def slice_values(ctx):
    v = ctx.value(0)
    if v is None:
        return [None]
    params = _slice_params(ctx, v.ndim)
    if params is None:
        return [None]
    index = [slice(None)] * v.ndim
    for a, s, e, st in params:
        index[a] = clamped_slice(s, e, st, v.shape[a])
    return [v[tuple(index)]]


# ---------------------------------------------------------------- Gather, Expand, Tile...


@meta("Gather")
def gather(ctx):
    shp, ishp = ctx.shape(0), ctx.shape(1)
    if shp is None or ishp is None:
        return [ctx.tensor(ctx.dtype(0), None)]
    a = norm_axis(ctx, int(ctx.attr("axis", 0)), len(shp))
    return [ctx.tensor(ctx.dtype(0), tuple(shp[:a]) + tuple(ishp) + tuple(shp[a + 1:]))]


@values("Gather")
def gather_values(ctx):
    v, idx = ctx.value(0), ctx.const(1)
    if v is None or idx is None:
        return [None]
    a = int(ctx.attr("axis", 0))
    n = v.shape[a]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        return [None]  # the kernel reports the bad index with the node's name
    return [np.asarray(np.take(v, idx.astype(np.int64), axis=a), dtype=v.dtype)]  # a scalar index gives 0-d


@meta("Expand")
def expand(ctx):
    from ._util import broadcast

    shp = ctx.shape(0)
    v = ctx.value(1)
    if v is None:
        n = ctx.shape(1)
        if n is None or not isinstance(n[0], int) or shp is None:
            return [ctx.tensor(ctx.dtype(0), None)]
        rank = max(n[0], len(shp))
        return [ctx.tensor(ctx.dtype(0), tuple(symbolic.fresh() for _ in range(rank)))]
    return [ctx.tensor(ctx.dtype(0), broadcast(ctx, shp, tuple(_entries(v))))]


@meta("Tile")
def tile(ctx):
    shp, r = ctx.shape(0), ctx.const(1)
    if shp is None:
        return [ctx.tensor(ctx.dtype(0), None)]
    if r is None:
        return [ctx.tensor(ctx.dtype(0), tuple(symbolic.fresh() for _ in shp))]
    r = ints(r)
    if len(r) != len(shp):
        ctx.fail(f"repeats {r} must have one entry per input dim ({len(shp)})")
    return [ctx.tensor(ctx.dtype(0), tuple(symbolic.normalize(d * k) if not isinstance(d, int) else d * k
                                           for d, k in zip(shp, r)))]


@meta("ConstantOfShape")
def constant_of_shape(ctx):
    value = ctx.attrs.get("value")
    dt = np.float32 if value is None else np.asarray(value).dtype
    v = ctx.value(0)
    if v is None:
        n = ctx.shape(0)
        if n is None or not isinstance(n[0], int):
            return [ctx.tensor(dt, None)]
        return [ctx.tensor(dt, tuple(symbolic.fresh() for _ in range(n[0])))]
    dims = _entries(v)
    if any(isinstance(d, int) and d < 0 for d in dims):
        ctx.fail(f"shape {dims} has a negative dim")
    return [ctx.tensor(dt, tuple(dims))]


def range_count(start, limit, delta) -> int:
    """How many values Range gives: ceil((limit - start) / delta), at least 0; exact for
    integers (a float division rounds int64 bounds: INT64_MIN to INT64_MAX by INT64_MAX is 3
    values, not 2)."""
    if delta == 0:
        raise ValueError("delta must not be 0")
    if isinstance(start, int) and isinstance(limit, int) and isinstance(delta, int):
        return max(-((start - limit) // delta), 0)
    count = np.ceil((limit - start) / delta)
    if not np.isfinite(count):
        raise ValueError(f"start {start}, limit {limit} and delta {delta} give no finite number of values")
    return max(int(count), 0)


@meta("Range")
def range_(ctx):
    vals = [ctx.const(i) for i in range(3)]
    if any(v is None for v in vals):
        # Symbolic bounds a fixed distance apart (positions past..past+t of a KV cache: the
        # length is t, whatever past is) still give a known length.
        sym = [ctx.value(i) for i in range(3)]
        if all(v is not None and v.size == 1 for v in sym) and ctx.dtype(0).kind in "iu":
            start, limit, delta = (v.reshape(-1)[0] for v in sym)
            span = symbolic.normalize(limit - start)
            if isinstance(span, int) and isinstance(symbolic.normalize(delta), int) and delta != 0:
                return [ctx.tensor(ctx.dtype(0), (range_count(0, span, int(delta)),))]
        return [ctx.tensor(ctx.dtype(0), (symbolic.fresh("range"),))]
    start, limit, delta = (v.reshape(-1)[0].item() for v in vals)
    if delta == 0:
        ctx.fail("delta must not be 0")
    return [ctx.tensor(ctx.dtype(0), (range_count(start, limit, delta),))]


@meta("NonZero")
def nonzero(ctx):
    r = ctx.rank(0)
    return [ctx.tensor(np.int64, (r if r is not None else symbolic.fresh("rank"), symbolic.fresh("nonzero")))]


# ---------------------------------------------------------------- value arithmetic on shapes


def _binary_values(fn):
    def rule(ctx):
        a, b = ctx.value(0), ctx.value(1)
        if a is None or b is None or ctx.dtype(0).kind not in "iu":
            return [None]
        if a.size > 64 or b.size > 64:
            return [None]  # only shape-sized values are worth propagating
        try:
            if a.dtype != object and b.dtype != object:
                return [fn(a, b).astype(ctx.dtype(0))]
            r = fn(a.astype(object), b.astype(object))
            # 0-d object operands give a bare Dim, not an array
            return [_tidy(r if isinstance(r, np.ndarray) else np.array(r, dtype=object))]
        except Exception:
            return [None]
    return rule


def _int_div(a, b):
    """ONNX's integer Div truncates toward zero (NumPy's // floors); symbolic dims are
    never negative."""
    if a.dtype == object or b.dtype == object:
        return a // b
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


values("Add")(_binary_values(lambda a, b: a + b))
values("Sub")(_binary_values(lambda a, b: a - b))
values("Mul")(_binary_values(lambda a, b: a * b))
values("Div")(_binary_values(_int_div))


def _logic_values(fn):
    """Comparisons and logic of known concrete values (a rank or a dim tested against a
    constant, as exporters guard shape-dependent code with If: the condition is then known
    where the shapes are, and only the branch taken is typed)."""
    def rule(ctx):
        vals = [ctx.value(i) for i in range(ctx.n_inputs)]
        if any(v is None or v.dtype == object or v.size > 64 for v in vals):
            return [None]
        return [np.asarray(fn(*vals), dtype=np.bool_)]
    return rule


for _op, _fn in (("Equal", np.equal), ("Less", np.less), ("Greater", np.greater), ("LessOrEqual", np.less_equal),
                 ("GreaterOrEqual", np.greater_equal), ("Not", np.logical_not), ("And", np.logical_and),
                 ("Or", np.logical_or), ("Xor", np.logical_xor)):
    values(_op)(_logic_values(_fn))


@values("Cast")
def cast_values(ctx):
    v = ctx.value(0)
    to = dtypes.np_dtype(int(ctx.attr("to")))
    if v is None or v.size > 64:
        return [None]
    if v.dtype != object:
        return [v.astype(to)] if to.kind in "iufb" and v.dtype.kind in "iufb" else [None]
    return [v] if to.kind in "iu" else [None]


# ---------------------------------------------------------------- depth <-> space


def _blocks(ctx):
    b = int(ctx.attr("blocksize", 0))
    if b <= 0:
        ctx.fail(f"blocksize must be positive, got {b}")
    x = ctx.shape(0)
    if x is not None and len(x) != 4:
        ctx.fail(f"input must be 4-D (N, C, H, W), got rank {len(x)}")
    return b, x


def _divided(ctx, d, by, what):
    if isinstance(d, int):
        if d % by:
            ctx.fail(f"{what} {d} is not divisible by {by}")
        return d // by
    return d // by


@meta("DepthToSpace")
def depth_to_space(ctx):
    b, x = _blocks(ctx)
    out = None if x is None else (x[0], _divided(ctx, x[1], b * b, "channels"), x[2] * b, x[3] * b)
    return [ctx.tensor(ctx.dtype(0), out)]


@meta("SpaceToDepth")
def space_to_depth(ctx):
    b, x = _blocks(ctx)
    out = None if x is None else (x[0], x[1] * b * b, _divided(ctx, x[2], b, "height"),
                                  _divided(ctx, x[3], b, "width"))
    return [ctx.tensor(ctx.dtype(0), out)]


# ---------------------------------------------------------------- Pad


@meta("Pad")
def pad(ctx):
    # each padded axis grows by its begin + end pads (negative pads crop); the pads come from
    # an attribute before opset 11 and from an input since, whose values may be symbolic
    x, since = ctx.shape(0), ctx.contract.since_version
    axes_known = True
    if since < 11:
        pads = list(ctx.attr("paddings" if since < 2 else "pads", []))
        axes = None
    else:
        v = ctx.value(1)
        pads = None if v is None else [int(p) if isinstance(p, (int, np.integer)) else p for p in v.reshape(-1)]
        axes = ctx.const(3) if ctx.has(3) else None
        axes_known = axes is not None or not ctx.has(3)
    if x is None:
        return [ctx.tensor(ctx.dtype(0), None)]
    axes = list(range(len(x))) if axes is None else norm_axes(ctx, ints(axes), len(x))
    out = list(x)
    if pads is None or not axes_known:
        for a in (axes if axes_known else range(len(x))):
            out[a] = symbolic.fresh("pad")
        return [ctx.tensor(ctx.dtype(0), tuple(out))]
    if len(pads) != 2 * len(axes):
        ctx.fail(f"pads has {len(pads)} values; {2 * len(axes)} needed (begin and end for {len(axes)} axes)")
    for k, a in enumerate(axes):
        out[a] = x[a] + pads[k] + pads[k + len(axes)]
        if isinstance(out[a], int) and out[a] < 0:
            ctx.fail(f"pads {pads} leave axis {a} ({x[a]}) with {out[a]} elements")
    return [ctx.tensor(ctx.dtype(0), tuple(out))]
