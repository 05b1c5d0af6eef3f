"""Small helpers the meta rules share."""
from __future__ import annotations

import sympy

from ... import symbolic


def broadcast(ctx, *shapes):
    """Multidirectional (NumPy) broadcasting of shapes whose dims may be symbolic.
    ctx: the MetaContext whose node an error names, or None (then a ValueError)."""
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
        elif len(not_one) == 1:
            out.append(not_one[0])
        else:
            out.append(sympy.Max(*not_one))
    return tuple(out)


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
    from ... import symbolic

    got = ctx.shape(i) if ctx.has(i) else None
    if got is None or want is None:
        return
    if len(got) != len(want) or any(isinstance(g, int) and isinstance(w, int) and g != w for g, w in zip(got, want)):
        ctx.fail(f"input {i} '{ctx.node.inputs[i]}' ({what}) must have shape {symbolic.shape_str(tuple(want))}, "
                 f"got {symbolic.shape_str(got)}")
