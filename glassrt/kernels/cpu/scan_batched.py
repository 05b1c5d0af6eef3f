"""A Scan whose iterations do not depend on each other, run over all of them at once.

scikit-learn's nearest neighbours, as skl2onnx writes their distances (its cdist), scan the
training rows with the queries as a state that every iteration passes on unchanged:

    Scan(X, rows): next_out = Identity(next_in); d = Sub(next_in, row)
                   dist = ReduceSumSquare(d, axes=[1], keepdims=0)        (one row a step)

Run row by row, each iteration is a few tiny ops and the loop's own bookkeeping: ~14 us a
row here, 4.1 ms for 300 rows where onnxruntime's C++ loop takes 0.76. No iteration reads
another's result, so the body can run once over every row: the scan input with its rows on
a leading axis, each op broadcast as it would be per iteration.

Applies where every state the body passes on is its state input unchanged (an Identity, or
the same name) and every node is one of OPS, on float32 / float64: the ops whose result
NumPy gives bit for bit whether it computes one iteration or all of them (elementwise
arithmetic, square roots, and reductions, which reduce each iteration's slice alone in the
same order). Values are carried as (array, batched): a batched array has the iterations on
its leading axis. An elementwise op with a batched operand gets ones inserted after that
axis up to the other operand's rank, so that both broadcast as within one iteration; a
reduction shifts its axes past it. The cpu kernels' own NumPy calls make the results (the
tests check the bits against the iteration loop). A scan input is cut into chunks so that
no intermediate value exceeds CHUNK_BYTES, small enough to stay in a core's L2 (a
nearest-neighbours classifier over 2,000 training rows of 20 features, 64 queries: 12-15 ms a
run with 8 MiB chunks, 7.0 with 512 KiB, 9.8-10.1 with 128 KiB; onnxruntime 5.7); an empty
one gives empty outputs of the shapes its iterations would have had. Any other dtype at run time runs the iteration loop.
"""
from __future__ import annotations

import numpy as np

from ...ir import Graph
from . import reduce

CHUNK_BYTES = 512 << 10  # (intermediates that stay in L2: see the module's doc)

# the ufuncs the cpu kernels call (elementwise.py), and reduce.py's own reductions
ELEMENTWISE = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
               "Neg": np.negative, "Abs": np.abs, "Sqrt": np.sqrt}
REDUCTIONS = {"ReduceSum": reduce.sum_, "ReduceSumSquare": reduce.sum_square, "ReduceMax": reduce.max_or_low,
              "ReduceMin": reduce.min_or_high}
OPS = frozenset({"Identity", *ELEMENTWISE, *REDUCTIONS})
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def why_not(body: Graph, n_state: int) -> str | None:
    """None where the body's iterations are independent and it is made of OPS; else why not."""
    if not isinstance(body, Graph):
        return "no body graph"
    producer = {o: n for n in body.nodes for o in n.outputs if o}
    for j in range(n_state):
        name, src = body.outputs[j].name, body.inputs[j].name
        n = producer.get(name)
        if name != src and (n is None or n.op_type != "Identity" or n.inputs[:1] != [src]):
            return f"state {j} changes from one iteration to the next (each reads the one before)"
    for n in body.nodes:
        if n.domain or n.op_type not in OPS:
            return f"the body's {n.op_type} node '{n.name}' is not one of the ops run over all iterations at once"
        if next(n.subgraphs(), None) is not None:
            return f"the body's node '{n.name}' has a body of its own"
        if n.op_type in REDUCTIONS and len(n.inputs) > 1 and n.inputs[1] and n.inputs[1] not in body.initializers:
            return f"the axes of '{n.name}' are computed in the body"
    return None


def run(body: Graph, n_state: int, states, xs, in_axes, in_dirs, out_axes, out_dirs, outer: dict):
    """The Scan's outputs (states, then scan outputs), or None where it must iterate (a
    value that is not a float32 / float64 array)."""
    if not xs or any(type(v) is not np.ndarray or v.dtype not in _FLOATS for v in [*states, *xs]):
        return None
    rows = [np.moveaxis(x, a, 0) for x, a in zip(xs, in_axes)]
    rows = [r[::-1] if d else r for r, d in zip(rows, in_dirs)]
    total = rows[0].shape[0]
    if any(r.shape[0] != total for r in rows):
        return None
    invariant = {**outer, **body.initializers}
    invariant.update((v.name, s) for v, s in zip(body.inputs[:n_state], states))
    names = [v.name for v in body.inputs[n_state:]]
    first, largest = _evaluate(body, invariant, dict(zip(names, (r[:1] for r in rows))), n_state)
    if first is None:
        return None
    step = max(1, CHUNK_BYTES // max(largest, 1))  # (an empty scan: its one empty chunk gives its outputs' shapes)
    parts = [first]
    for lo in range(1, total, step):
        part, _ = _evaluate(body, invariant, dict(zip(names, (r[lo:lo + step] for r in rows))), n_state)
        if part is None:
            return None
        parts.append(part)
    outs = []
    for j in range(len(body.outputs) - n_state):
        y = parts[0][j] if len(parts) == 1 else np.concatenate([p[j] for p in parts])
        y = y[::-1] if out_dirs[j] else y
        a = out_axes[j] + y.ndim if out_axes[j] < 0 else out_axes[j]
        outs.append(np.ascontiguousarray(np.moveaxis(y, 0, a)))
    return tuple(list(states) + outs)


def _evaluate(body: Graph, invariant: dict, scanned: dict, n_state: int):
    """(the scan outputs over these rows, each with the rows on axis 0; the largest value's
    bytes per row), or (None, 0) where a value a node reads or makes is not a float array."""
    values = {k: (v, False) for k, v in invariant.items()}
    values.update((k, (v, True)) for k, v in scanned.items())
    count = next(iter(scanned.values())).shape[0]  # (0 for an empty scan)
    largest = 0
    for n in body.nodes:
        ins = [values[i] for i in n.inputs[:1 if n.op_type in REDUCTIONS else None] if i]
        if any(type(a) is not np.ndarray or a.dtype not in _FLOATS for a, _ in ins):
            return None, 0
        if n.op_type == "Identity":
            out = ins[0]
        elif n.op_type in REDUCTIONS:
            out = _reduce(n, ins, body)
        else:
            out = _elementwise(ELEMENTWISE[n.op_type], ins)
        values[n.outputs[0]] = out
        largest = max(largest, out[0].nbytes // (max(count, 1) if out[1] else 1))
    results = []
    for v in body.outputs[n_state:]:
        arr, batched = values[v.name]
        results.append(arr if batched else np.broadcast_to(arr, (count,) + arr.shape).copy())
    return results, largest


def _elementwise(fn, ins):
    """fn over the operands, each batched one with ones after its leading axis up to the
    others' rank, so that they broadcast as one iteration's would."""
    rank = max(a.ndim - 1 if batched else a.ndim for a, batched in ins)
    args = [a.reshape((a.shape[0],) + (1,) * (rank - (a.ndim - 1)) + a.shape[1:]) if batched else a
            for a, batched in ins]
    return fn(*args), any(batched for _, batched in ins)


def _reduce(node, ins, body: Graph):
    (x, batched) = ins[0]
    rank = x.ndim - 1 if batched else x.ndim
    keep = bool(node.attrs.get("keepdims", 1))
    if len(node.inputs) > 1 and node.inputs[1]:
        axes = [int(a) for a in np.asarray(body.initializers[node.inputs[1]]).reshape(-1)]
    else:
        axes = [int(a) for a in node.attrs.get("axes") or []]
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return x, batched
        axes = list(range(rank))
    axes = [a + rank if a < 0 else a for a in axes]
    if any(not 0 <= a < rank for a in axes):
        raise ValueError(f"{node.op_type} '{node.name}': axes {axes} out of range for rank {rank}")
    ax = tuple(sorted(a + 1 if batched else a for a in axes))
    return REDUCTIONS[node.op_type](x, ax, keep), batched
