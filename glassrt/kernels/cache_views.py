"""The presents CacheConcat hands out (kernels/cpu/cache.py): read-only views of the leading
rows of a buffer with room behind them, each extendable until a run claims the rows behind
it. Kept apart from the kernel module so that fused attention and the session's check of
feeds can ask about a value without importing a kernel family (kernels/families.py)."""
from __future__ import annotations

import weakref

import numpy as np

# id(view) -> weakref to the view: the presents handed out whose buffer's rows behind them
# are unclaimed (a view's entry goes when it is claimed or dies)
_HANDED: dict = {}


def hand_out(base, lead: tuple, rows: int) -> np.ndarray:
    """A read-only view of `base`'s first `rows` along the axis after `lead`, extendable."""
    view = base[lead + (slice(0, rows),)]
    view.flags.writeable = False
    key = id(view)
    _HANDED[key] = weakref.ref(view, lambda ref: _HANDED.get(key) is ref and _HANDED.pop(key, None))
    return view


def _leading(a, base, axis: int) -> bool:
    """Whether `a` (a view handed out from `base`) still has base's dims and strides but along `axis`."""
    return a.strides == base.strides and a.shape[:axis] == base.shape[:axis] \
        and a.shape[axis + 1:] == base.shape[axis + 1:]


def claim(past, axis: int, rows: int) -> np.ndarray | None:
    """The buffer behind `past` when `past` is an extendable present with room for `rows`
    more behind it: claimed (`past` is extendable no more); else None."""
    ref = _HANDED.pop(id(past), None)  # (one pop: of two runs fed one past at once, one gets it)
    if ref is None or ref() is not past:
        return None
    base = past.base
    if base.shape[axis] < past.shape[axis] + rows or not _leading(past, base, axis):
        return None
    return base


def buffer_behind(a) -> np.ndarray | None:
    """The C-contiguous buffer whose leading rows along axis -2 are `a`, where `a` is a present
    handed out here and not yet extended (fused attention reads its K and V there in place)."""
    ref = _HANDED.get(id(a))
    if ref is None or ref() is not a or a.ndim < 2:
        return None
    base = a.base
    return base if _leading(a, base, a.ndim - 2) and base.flags.c_contiguous else None
