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

import numpy as np

from .. import symbolic
from ..ir import TensorType


def _shifted_symbol(d):
    """(symbol name, shift) when the dim is symbol + an integer (past, past + 1), else None."""
    return symbolic.shifted_symbol(d)


class ShapeFormula:
    def __init__(self, symbols, inputs, checks, outputs):
        self.symbols = symbols  # the symbols' names, in the order the compiled functions take them
        self.inputs = inputs  # per input: None (not a tensor) or (rank, ((axis, int | -1-symbol index, shift), ...))
        self.checks = checks  # ((expression, (input, axis)), ...) for input dims that are expressions
        self.outputs = outputs  # (the output dims, flat, [rank per output])
        # evaluate() is one function generated from all of the above: a dynamic step calls
        # it every run, and a decode step runs ~100 of them per token, each right after a
        # matmul has streamed megabytes of weights through the caches (where an interpreted
        # loop over the dims cost ~15 us, this costs ~1-2)
        self.evaluate = _generate(symbols, tuple(inputs), checks, (outputs[0], tuple(outputs[1])))

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
        inputs, checks = [], []
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
                    checks.append((d, (i, axis)))
                else:
                    return None
            inputs.append((len(t.shape), tuple(spec)))
        return cls(tuple(bare), inputs, tuple(checks), (tuple(out_dims), tuple(len(t.shape) for t in output_types)))


@lru_cache(maxsize=4096)  # the layers of a model share their formulas: compiled once
def _generate(symbols, inputs, checks, outputs):
    """`evaluate(args)`: the output shapes for these input arrays, or None when they do not
    fit the plan (a fixed dim differs, a symbol takes two values or one <= 0, an expression
    dim disagrees, an output dim comes out negative). Generated Python source: only
    identifiers of its own (args, s<i>, _<k>, d<j>), int literals and operators; no name or
    text from the model reaches it."""
    from ..symbolic.expr import code

    index = {s: k for k, s in enumerate(symbols)}
    lines, bound = ["def evaluate(args):"], set()
    for i, spec in enumerate(inputs):
        if spec is None:
            continue
        rank, dims = spec
        lines.append(f"    s{i} = getattr(args[{i}], 'shape', None)")
        lines.append(f"    if s{i} is None or len(s{i}) != {int(rank)}: return None")
        for axis, want, shift in dims:
            axis, want, shift = int(axis), int(want), int(shift)
            if want >= 0:
                lines.append(f"    if s{i}[{axis}] != {want}: return None")
            elif -1 - want in bound:
                lines.append(f"    if s{i}[{axis}] - ({shift}) != _{-1 - want}: return None")
            else:
                bound.add(-1 - want)
                lines.append(f"    _{-1 - want} = s{i}[{axis}] - ({shift})")
    if len(bound) < len(symbols):  # a symbol no tensor input binds (never so from build)
        lines.append("    return None")
    for k in sorted(bound):
        lines.append(f"    if _{k} <= 0: return None")
    for expr, (i, axis) in checks:
        lines.append(f"    if s{int(i)}[{int(axis)}] != {code(symbolic.normalize(expr), index)}: return None")
    dims, ranks = outputs
    names = []
    for j, d in enumerate(dims):
        if isinstance(d, int):
            names.append(repr(int(d)))
        else:
            lines.append(f"    d{j} = {code(symbolic.normalize(d), index)}")
            lines.append(f"    if d{j} < 0: return None")
            names.append(f"d{j}")
    shapes, k = [], 0
    for r in ranks:
        shapes.append("(" + "".join(f"{n}, " for n in names[k:k + r]) + ")")
        k += r
    lines.append(f"    return [{', '.join(shapes)}]")
    scope = {"__builtins__": {}, "getattr": getattr, "len": len, "max": max, "min": min}
    exec(compile("\n".join(lines), "<glassrt shape formula>", "exec"), scope)  # noqa: S102
    return scope["evaluate"]


class ValuesFromShapes:
    """Small integer values that a plan with symbolic dims knows as expressions of its input
    dims (inference's symbolic values): a Shape, and the Gather / Unsqueeze / Concat of it an
    exporter writes before every Reshape (`[1, sequence, 12, 64]`). They are computed from the
    input arrays' shapes as a run starts, one generated function for all of them, and the
    nodes that made them are not run (runtime/plan.py; a Shape of a computed value still runs,
    checked). BERT-base's shared plan ran 290 such steps a run, ~8 us each, for the two values
    its 48 Reshapes read; 48 Shapes run now.

    `build` takes a value only where every element is an int or an expression of symbols
    the input dims give bare (or shifted), never negative for positive symbols (the
    evaluation refuses a negative dim), of an integer dtype, and small."""

    MAX_ELEMENTS = 64

    def __init__(self, names, formula, kinds):
        self.names = names  # the values' names, in the order __call__ gives them
        self.formula = formula  # a ShapeFormula whose "output shapes" are the values' elements
        self.kinds = kinds  # ([(dtype, shape) per distinct value], [the distinct value of each name])

    @classmethod
    def build(cls, input_types, values: dict, types: dict):
        """(ValuesFromShapes or None, the names taken) for `values` ({name: object ndarray})."""
        bare = {found[0] for t in input_types if isinstance(t, TensorType) and t.shape is not None
                for d in t.shape if (found := _shifted_symbol(d)) is not None}
        taken = {}
        for name, v in values.items():
            t = types.get(name)
            if not isinstance(t, TensorType) or t.dtype.kind not in "iu" or tuple(v.shape) != tuple(t.shape) \
                    or v.size > cls.MAX_ELEMENTS or not all(_fits(d, bare) for d in v.flat):
                continue
            taken[name] = (t.dtype, tuple(v.shape), tuple(symbolic.normalize(d) for d in v.flat))
        if not taken:
            return None, ()
        distinct = list(dict.fromkeys(taken.values()))
        formula = ShapeFormula.build(input_types, [TensorType(np.dtype(np.int64), elems) for _, _, elems in distinct])
        if formula is None:
            return None, ()
        which = {key: k for k, key in enumerate(distinct)}
        names = tuple(taken)
        return cls(names, formula, ([(dt, shape) for dt, shape, _ in distinct], [which[taken[n]] for n in names])), names

    def __call__(self, args) -> list:
        """The values for these input arrays, in `names` order (equal ones one array)."""
        elements = self.formula.evaluate(args)
        if elements is None:
            raise ValueError("the input shapes do not fit this plan's symbolic dims")
        kinds, which = self.kinds
        arrays = [np.array(e, dt).reshape(shape) for e, (dt, shape) in zip(elements, kinds)]
        return [arrays[k] for k in which]


def _fits(d, bare) -> bool:
    """An element a value evaluation can give: an int, or an expression of `bare` symbols
    that is never negative while they are positive."""
    if isinstance(d, (int, np.integer)):
        return True
    if not isinstance(d, symbolic.Dim) or not symbolic.free_names(d) <= bare:
        return False
    try:
        return bool(d >= 0)
    except TypeError:  # (undecided)
        return False
