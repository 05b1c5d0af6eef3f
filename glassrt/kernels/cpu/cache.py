"""glassrt::CacheConcat: a KV cache's Concat that appends in place (passes/cache_concat.py).

A decode loop feeds each step's `present` back as the next step's `past`. Here `present` is
a view of the leading rows of a buffer with spare room behind them along the axis. When the
past fed in is such a view, handed out by this node, and no other present has claimed the
rows behind it yet, the step writes only the new rows there and hands out a view one step
longer: no copy of the cache. Otherwise (the first step, a past the caller made, a past fed
a second time to branch off a generation, a buffer full) the cache is copied into a new
buffer with room for half as many rows again, as a Concat would copy it.

What keeps this safe:
  * rows are claimed once: a present handed out is extendable until a run claims the rows
    behind it (kernels/cache_views.py forgets it then, atomically), so a past fed twice, to
    branch off a generation, is copied the second time and no present handed out changes;
  * the views handed out are read-only, so a caller cannot write through one into rows
    another present shares (`np.array(present)` is a writable copy);
  * a buffer is the caller's to drop: it lives as long as any present viewing it, and only
    weak references to the views are kept (kernels/cache_views.py).

Measured in GPT-2's decode step: a call's claim, write and hand-out ~11 us hot; claiming and
handing out ~20 us in the step (the products' weight streams empty the caches), against a
Concat's copy of 30 us at 48 rows, 180-300 us at 512.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import MemoryLimitError, describe_node
from ..cache_views import claim, hand_out
from ..registry import kernel
from ._util import ALL

SPARE_MIN = 16  # rows of room a new buffer gets at least behind its rows (half as many again, where more)


@kernel("CacheConcat", domain="glassrt", dtypes=ALL, bind=True, any_shape=True, blas=False)
def cache_concat(ctx):
    """Concat(past, new) written as new rows behind a past this node handed out, where their
    buffer has room and the rows are unclaimed; else a copy into a buffer with room to grow."""
    axis_attr = int(ctx.attrs.get("axis", 0))
    limit = ctx.memory_limit

    def step(past, new):
        ps, ns = past.shape, new.shape
        axis = axis_attr + len(ps) if axis_attr < 0 else axis_attr
        if len(ns) != len(ps) or new.dtype != past.dtype or not 0 <= axis < len(ps) \
                or ps[:axis] != ns[:axis] or ps[axis + 1:] != ns[axis + 1:]:
            raise ValueError(f"past {past.dtype}{list(ps)} and new {new.dtype}{list(ns)} must have one dtype and "
                             f"rank, and the same dims outside axis {axis_attr}")
        t, n = ps[axis], ns[axis]
        lead = (slice(None),) * axis
        base = claim(past, axis, n)
        if base is None:
            room = t + n + max(SPARE_MIN, (t + n) // 2)
            if limit is not None:
                row = math.prod(ps[:axis] + ps[axis + 1:]) * past.dtype.itemsize
                if (t + n) * row > limit:
                    raise MemoryLimitError(f"{describe_node(ctx.node)} would allocate {(t + n) * row:,} bytes for "
                                           f"inputs {[list(ps), list(ns)]}, over the session's memory limit of "
                                           f"{limit:,} bytes")
                room = min(room, max(t + n, limit // max(row, 1)))  # (no room past the limit)
            base = np.empty(ps[:axis] + (room,) + ps[axis + 1:], past.dtype)
            base[lead + (slice(0, t),)] = past
        base[lead + (slice(t, t + n),)] = new
        return hand_out(base, lead, t + n)

    return step
