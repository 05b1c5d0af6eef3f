"""Small helpers the meta rules share."""
from __future__ import annotations

from ..geometry import broadcast_shapes


def broadcast(ctx, *shapes):
    """Multidirectional (NumPy) broadcasting of shapes whose dims may be symbolic; an error
    names ctx's node (ctx None: a ValueError). See ops/geometry.py."""
    return broadcast_shapes(*shapes, ctx=ctx)


def axis(ctx, a, rank, name="axis"):
    if rank is None:
        return a
    if not -rank <= a < rank:
        ctx.fail(f"{name} {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def axes(ctx, values, rank, name="axes"):
    out = [axis(ctx, int(a), rank, name) for a in values]
    if len(set(out)) != len(out):
        ctx.fail(f"{name} {list(values)} repeats an axis")
    return out


def ints(v):
    return [int(x) for x in v.reshape(-1)] if v is not None else None


def expect_shape(ctx, i, want, what):
    """Fail unless input i (when given, and its shape known) has exactly the dims `want`
    (ints or symbols; only int-vs-int disagreements can be told at this point)."""
    got = ctx.shape(i) if ctx.has(i) else None
    if got is None or want is None:
        return
    if len(got) != len(want) or any(isinstance(g, int) and isinstance(w, int) and g != w for g, w in zip(got, want)):
        from ... import symbolic  # (here, not above: asked of every conv and norm while inferring)

        ctx.fail(f"input {i} '{ctx.node.inputs[i]}' ({what}) must have shape {symbolic.shape_str(tuple(want))}, "
                 f"got {symbolic.shape_str(got)}")
