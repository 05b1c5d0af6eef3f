"""Symbolic dimensions.

A dim is an ``int`` or a SymPy expression over named symbols (``batch``, ``seq``).
Meta functions use plain arithmetic (``+ * //``) on dims, so one rule serves both a
concrete plan (all ints) and a symbolic ``explain`` (``batch*2048``). SymPy is what
onnxruntime's own symbolic shape inference uses for the same job.
"""
from __future__ import annotations

import itertools
from functools import lru_cache

import sympy

Dim = "int | sympy.Expr"
_fresh = itertools.count()


@lru_cache(maxsize=None)
def symbol(name: str) -> sympy.Symbol:
    # positive=True lets SymPy simplify floor(batch*k/k) and friends.
    return sympy.Symbol(name, integer=True, positive=True)


def fresh(prefix: str = "unk") -> sympy.Symbol:
    """A new symbol for a dim nothing names (unknown, or decided by data at run time)."""
    return symbol(f"{prefix}__{next(_fresh)}")


def normalize(d):
    """SymPy integers become Python ints; everything else stays as it is."""
    if isinstance(d, int) and not isinstance(d, bool):
        return d
    if isinstance(d, sympy.Basic):
        # SymPy already keeps products and sums canonical (768*batch/768 is batch); a full
        # simplify() would cost milliseconds per dim on big models for nothing.
        if d.is_Integer:
            return int(d)
        return d
    import numpy as np

    if isinstance(d, np.integer):
        return int(d)
    raise TypeError(f"not a dimension: {d!r}")


def is_static(d) -> bool:
    return isinstance(d, int)


def all_static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def to_str(d) -> str:
    return str(d)


def shape_str(shape) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join(to_str(d) for d in shape) + "]"


def evaluate(d, bindings: dict):
    """Substitute {symbol name: int}; returns an int when every symbol is bound."""
    if isinstance(d, int):
        return d
    subs = {symbol(k): v for k, v in bindings.items()}
    return normalize(d.subs(subs))


def free_names(d) -> set[str]:
    if isinstance(d, int):
        return set()
    return {s.name for s in d.free_symbols}


def prod(dims):
    out = 1
    for d in dims:
        out = out * d
    return normalize(out) if not isinstance(out, int) else out
