"""Output shapes of a node as formulas of its input shapes, from a symbolic plan.

A plan compiled with symbolic dims (a KV cache's `past`) knows a node's output shapes as
expressions (`past + 1`). When every symbol in them appears bare in some input dim, the
real input shapes bind the symbols and the formulas give the output shapes in a few
microseconds, instead of re-running the op's meta rule (tens of microseconds) for every
new shape. An input dim `past + 1` binds `past` too. The input dims are checked against the plan as they are bound; any mismatch
(or a symbol the inputs cannot bind) hands the node back to the meta rule.
"""
from __future__ import annotations

from functools import lru_cache

from .. import symbolic
from ..ir import TensorType


@lru_cache(maxsize=4096)
def _compiled(symbols: tuple, exprs: tuple):
    return symbolic.compile_dims(symbols, exprs)


def _shifted_symbol(d):
    """(symbol name, shift) when the dim is symbol + an integer (past, past + 1), else None."""
    return symbolic.shifted_symbol(d)


class ShapeFormula:
    def __init__(self, symbols, inputs, checks, outputs):
        self.symbols = symbols  # the symbols' names, in the order the compiled functions take them
        self.inputs = inputs  # per input: None (not a tensor) or (rank, ((axis, int | -1-symbol index, shift), ...))
        self.checks = checks  # (compiled fn of the symbols, ((input, axis), ...)) for expression dims
        self.outputs = outputs  # (compiled fn, [rank per output])

    @classmethod
    def build(cls, input_types, output_types):
        """None when some output dim is not a formula of symbols the input dims give
        (bare, or shifted by an integer)."""
        if not output_types or not all(isinstance(t, TensorType) and t.shape is not None for t in output_types):
            return None
        bare = []  # the symbols the input dims give, in first-seen order
        for t in input_types:
            for d in (t.shape if isinstance(t, TensorType) and t.shape is not None else ()):
                found = _shifted_symbol(d)
                if found is not None and found[0] not in bare:
                    bare.append(found[0])
        out_dims = [d for t in output_types for d in t.shape]
        needed = set().union(*[symbolic.free_names(d) for d in out_dims])
        if not needed <= set(bare):
            return None
        index = {s: k for k, s in enumerate(bare)}
        inputs, check_exprs, check_at = [], [], []
        for i, t in enumerate(input_types):
            if not isinstance(t, TensorType) or t.shape is None:
                inputs.append(None)
                continue
            spec = []
            for axis, d in enumerate(t.shape):
                if isinstance(d, int):
                    spec.append((axis, d, 0))
                elif _shifted_symbol(d) is not None:
                    sym, shift = _shifted_symbol(d)
                    spec.append((axis, -1 - index[sym], shift))  # negative: the symbol's index, encoded
                elif symbolic.free_names(d) <= set(bare):
                    check_exprs.append(d)
                    check_at.append((i, axis))
                else:
                    return None
            inputs.append((len(t.shape), tuple(spec)))
        symbols = tuple(bare)
        checks = (_compiled(symbols, tuple(check_exprs)), tuple(check_at)) if check_exprs else None
        return cls(symbols, inputs, checks, (_compiled(symbols, tuple(out_dims)), [len(t.shape) for t in output_types]))

    def evaluate(self, args):
        """Output shapes for these input arrays, or None when they do not fit the plan."""
        values = [None] * len(self.symbols)
        for spec, a in zip(self.inputs, args):
            if spec is None:
                continue
            rank, dims = spec
            shape = getattr(a, "shape", None)
            if shape is None or len(shape) != rank:
                return None
            for axis, want, shift in dims:
                got = shape[axis]
                if want >= 0:
                    if got != want:
                        return None
                else:
                    k, v = -1 - want, got - shift
                    if values[k] is None:
                        values[k] = v
                    elif values[k] != v:
                        return None
        if any(v is None or v <= 0 for v in values):  # unbound, or 0 where the plan assumed a positive dim
            return None
        if self.checks is not None:
            fn, where = self.checks
            for (i, axis), want in zip(where, fn(*values)):
                if args[i].shape[axis] != want:
                    return None
        fn, ranks = self.outputs
        flat = [int(v) for v in fn(*values)]
        if any(v < 0 for v in flat):
            return None
        shapes, k = [], 0
        for r in ranks:
            shapes.append(tuple(flat[k:k + r]))
            k += r
        return shapes
