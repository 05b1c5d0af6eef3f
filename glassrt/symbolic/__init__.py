"""Symbolic dimensions.

A dim is an ``int`` or a `Dim`: an expression over named symbols (``batch``, ``seq``),
each a positive integer. Meta functions use plain arithmetic (``+ - * // %``, ``max``,
comparisons) on dims, so one rule serves both a concrete plan (all ints) and a symbolic
``explain`` (``batch*2048``).

glassrt has its own small dim algebra rather than SymPy (which onnxruntime's symbolic
shape inference uses for the same job): importing SymPy cost 34 MiB of resident memory
and 0.6 s, more than a third of ``import glassrt``, for the few forms shape rules meet.
A `Dim` is a polynomial with integer coefficients, kept expanded and so canonical, over
symbols and opaque terms (``floor(n/d)``, ``Mod(n, d)``, ``Max``, ``Min``): expr.py has
the type and its simplifications, poly.py the polynomial arithmetic, bounds.py what
comparisons can decide, printing.py its text (SymPy's, for the same expression).
"""
from __future__ import annotations

import itertools
from functools import lru_cache

from .expr import Atom, Dim, atom_dim, exact_div, floordiv, maximum, minimum, mod, norm, single_atom

__all__ = ["Dim", "symbol", "fresh", "normalize", "is_static", "all_static", "is_symbol", "symbol_name", "shifted_symbol",
           "to_str", "shape_str", "evaluate", "free_names", "prod", "exact_div", "floordiv", "mod", "maximum",
           "minimum", "compile_dims"]

_fresh = itertools.count()


@lru_cache(maxsize=None)
def symbol(name: str) -> Dim:
    """The dim named `name`: a positive integer."""
    return atom_dim(Atom("sym", (str(name),)))


def fresh(prefix: str = "unk") -> Dim:
    """A new symbol for a dim nothing names (unknown, or decided by data at run time)."""
    return symbol(f"{prefix}__{next(_fresh)}")


def normalize(d):
    """numpy integers become Python ints; ints and Dims stay as they are."""
    return norm(d)


def is_static(d) -> bool:
    return isinstance(d, int)


def all_static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def is_symbol(d) -> bool:
    """d is one bare symbol (batch, not 2*batch or batch + 1)."""
    return symbol_name(d) is not None


def symbol_name(d) -> str | None:
    """The name when d is one bare symbol, else None."""
    a = single_atom(d)
    return a.args[0] if a is not None and a.kind == "sym" else None


def shifted_symbol(d):
    """(name, shift) when d is a symbol plus an integer (past: 0, past + 1: 1), else None."""
    if not isinstance(d, Dim) or len(d._p) > 2:
        return None
    shift, sym = 0, None
    for m, c in d._p.items():
        if not m:
            shift = c
            continue
        (a, e), = m if len(m) == 1 else ((None, 0),)
        if sym is not None or c != 1 or e != 1 or a.kind != "sym":
            return None
        sym = a.args[0]
    return None if sym is None else (sym, shift)


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
    from .expr import substitute

    return substitute(norm(d), bindings)


def free_names(d) -> set[str]:
    if isinstance(d, int):
        return set()
    from .expr import names

    return set(names(d))


def prod(dims):
    out = 1
    for d in dims:
        out = out * d
    return norm(out)


def compile_dims(names: tuple, dims: tuple):
    """A function of the symbols' values (positionally, in the order of `names`) returning
    the list of the dims' values, as Python code generated from the expressions: the
    symbols become parameters _0, _1, ..., constants int literals; no name or text from the
    model reaches the code. Raises KeyError when a dim has a symbol not in `names`."""
    from .expr import code

    index = {n: k for k, n in enumerate(names)}
    params = ", ".join(f"_{k}" for k in range(len(names)))
    body = ", ".join(code(norm(d), index) for d in dims)
    return eval(f"lambda {params}: [{body}]", {"__builtins__": {}, "max": max, "min": min})  # noqa: S307
