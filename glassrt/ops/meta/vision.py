"""Vision ops whose output shape follows input values: Resize.

onnx's own Resize inference loses symbolic dims that a scale of 1 keeps, and rejects an
empty `scales` fed as a graph input next to `sizes` (the common opset-11/13 pattern).
"""
from __future__ import annotations

import numpy as np

from ... import symbolic
from ..registry import meta


def resize_geometry(in_shape, scales, sizes, axes, policy):
    """Full-rank per-axis scale factors and output dims (float64 arithmetic, as the spec's reference).

    `in_shape` must be concrete; `scales` or `sizes` is the (non-empty) input that is given.
    """
    r = len(in_shape)
    axes = list(range(r)) if axes is None else [int(a) + r if int(a) < 0 else int(a) for a in axes]
    if any(not 0 <= a < r for a in axes) or len(set(axes)) != len(axes):
        raise ValueError(f"axes {axes} are not distinct axes of a rank-{r} input")
    if sizes is not None:
        sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
        if len(sizes) != len(axes):
            raise ValueError(f"sizes has {len(sizes)} entries but {len(axes)} axes are resized")
        if any(s < 0 for s in sizes):
            raise ValueError(f"sizes must not be negative, got {sizes}")
        sc = [s / in_shape[a] if in_shape[a] else 1.0 for s, a in zip(sizes, axes)]
        if policy in ("not_larger", "not_smaller"):
            s = min(sc) if policy == "not_larger" else max(sc)
            sc = [s] * len(axes)
            sizes = [int(s * in_shape[a] + 0.5) for a in axes]
        elif policy != "stretch":
            raise ValueError(f"unknown keep_aspect_ratio_policy {policy!r}")
    else:
        sc = [float(s) for s in np.asarray(scales).reshape(-1)]
        if len(sc) != len(axes):
            raise ValueError(f"scales has {len(sc)} entries but {len(axes)} axes are resized")
        if any(not s > 0 for s in sc):
            raise ValueError(f"scales must be positive, got {sc}")
        sizes = [int(s * in_shape[a]) for s, a in zip(sc, axes)]
    scale, out = [1.0] * r, list(in_shape)
    for a, s, o in zip(axes, sc, sizes):
        scale[a], out[a] = s, o
    return axes, scale, out


def _given(ctx, i):
    """Input i is present and not an empty placeholder (None when that is unknown)."""
    if not ctx.has(i):
        return False
    shp = ctx.shape(i)
    if shp is not None and len(shp) == 1 and isinstance(shp[0], int):
        return shp[0] > 0
    v = ctx.value(i)
    return None if v is None else v.size > 0


@meta(["Resize"])
def resize(ctx):
    x = ctx.shape(0)
    dt = ctx.dtype(0)
    if x is None:
        return [ctx.tensor(dt, None)]
    r = len(x)
    v10 = ctx.contract.since_version < 11
    scales_i, sizes_i = (1, None) if v10 else (2, 3)
    axes = ctx.attrs.get("axes")
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    try:
        ax = list(range(r)) if axes is None else [int(a) + r if int(a) < 0 else int(a) for a in axes]
    except (TypeError, ValueError):
        ctx.fail(f"bad axes {axes}")
    if any(not 0 <= a < r for a in ax):
        ctx.fail(f"axes {list(axes)} out of range for a rank-{r} input")
    use_sizes = sizes_i is not None and _given(ctx, sizes_i)
    use_scales = _given(ctx, scales_i)
    if use_sizes and use_scales:
        ctx.fail("only one of scales and sizes may be given")
    if use_sizes is False and use_scales is False:
        ctx.fail("one of scales and sizes must be given")
    out = list(x)
    if use_sizes:
        v = ctx.value(sizes_i)
        if v is not None and v.size != len(ax):
            ctx.fail(f"sizes has {v.size} entries but {len(ax)} axes are resized")
        if v is not None and policy == "stretch":
            for a, s in zip(ax, v.reshape(-1)):
                out[a] = s if not isinstance(s, (int, np.integer)) else int(s)
            return [ctx.tensor(dt, out)]
        c = ctx.const(sizes_i)
        if c is not None and all(isinstance(d, int) for d in x):
            try:
                return [ctx.tensor(dt, resize_geometry(list(x), None, c, ax, policy)[2])]
            except ValueError as e:
                ctx.fail(str(e))
    elif use_scales:
        c = ctx.const(scales_i)
        if c is not None:
            c = np.asarray(c).reshape(-1)
            if c.size != len(ax):
                ctx.fail(f"scales has {c.size} entries but {len(ax)} axes are resized")
            for a, s in zip(ax, c):
                s = float(s)
                if not s > 0:
                    ctx.fail(f"scales must be positive, got {c.tolist()}")
                if s == 1.0:
                    continue
                out[a] = int(s * x[a]) if isinstance(x[a], int) else symbolic.fresh("resize")
            return [ctx.tensor(dt, out)]
    for a in ax:
        out[a] = symbolic.fresh("resize")
    return [ctx.tensor(dt, out)]
