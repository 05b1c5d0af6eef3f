"""If, Loop, Scan, SequenceMap: output types come from inferring the subgraph."""
from __future__ import annotations

import numpy as np

from ... import symbolic
from ...errors import ShapeInferenceError
from ...ir import SequenceType, TensorType
from ...ir import merge_types as merge
from ..registry import meta
from ._util import axis as norm_axis


def _subgraph_inputs(graph, types):
    """Declared subgraph input types, overridden by what the caller passes where known."""
    out = []
    for vi, t in zip(graph.inputs, types):
        out.append(t if t is not None else vi.type)
    return out


@meta("If")
def if_(ctx):
    """The taken branch's output types where the condition is known, else both merged.
    Exporters guard shape-dependent code with If (Silero VAD squeezes a dim only where it
    is 1): a branch that cannot run on these shapes is an error only if it is taken, as in
    onnxruntime, which never looks at the other. So a known condition types its branch
    alone, and with an unknown one a branch whose inference fails leaves the other's types
    (taken at run time, it fails there, naming its node); both failing is the error."""
    cond = ctx.const(0)
    n = len(ctx.node.outputs)
    if cond is not None and cond.size == 1:
        taken = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        out = ctx.infer_subgraph(ctx.attrs[taken], [])
        if len(out) != n:
            ctx.fail(f"{taken} has {len(out)} outputs, but the node has {n}")
        return out
    branches, errors = [], []
    for name in ("then_branch", "else_branch"):
        try:
            branches.append(ctx.infer_subgraph(ctx.attrs[name], []))
        except ShapeInferenceError as e:
            errors.append(e)
    if not branches:
        raise errors[0]
    if any(len(b) != n for b in branches):
        ctx.fail(f"the branches have {' and '.join(str(len(b)) for b in branches)} outputs, but the node has {n}")
    if len(branches) == 2:
        _same_element_types(ctx, branches[0], branches[1], "then_branch's output", "else_branch's")
        return [merge(a, b) for a, b in zip(*branches)]
    return branches[0]


def _same_element_types(ctx, first, second, what, other) -> None:
    """Two lists of types that must agree in kind and element type (If's branches, a Loop's
    carried values before and after its body): onnx's inference fails the node otherwise."""
    for k, (a, b) in enumerate(zip(first, second)):
        if a is None or b is None:
            continue
        if type(a) is not type(b) or (isinstance(a, TensorType) and a.dtype != b.dtype):
            ctx.fail(f"{what} {k} is {a}, {other} {b}: they must have one type")


@meta("Loop")
def loop(ctx):
    """The carried values' and the scans' types from the body's. A body that cannot run on
    these shapes is an error only if it runs (as the If's untaken branch): unless the trip
    count is a constant above 0, the body's declared output types stand, and a run with
    iterations fails in the body, naming its node; a loop of none returns its inputs."""
    body = ctx.attrs["body"]
    carried = [ctx.type(i) for i in range(2, ctx.n_inputs)]
    n_carried = len(carried)
    for i, name, dt in ((0, "trip count M", np.int64), (1, "cond", np.bool_)):
        t = ctx.type(i) if ctx.has(i) else None
        if isinstance(t, TensorType) and (t.dtype != np.dtype(dt) or (t.shape is not None and len(t.shape) > 1)
                                          or (t.shape and isinstance(t.shape[0], int) and t.shape[0] != 1)):
            ctx.fail(f"{name} must be a {np.dtype(dt)} scalar (or of shape [1]), got {t}")
    body_in = _subgraph_inputs(body, [TensorType(np.dtype(np.int64), ()), TensorType(np.dtype(np.bool_), ())] + carried)
    try:
        body_out = ctx.infer_subgraph(body, body_in)
    except ShapeInferenceError:
        trips = ctx.const(0) if ctx.has(0) else None
        if trips is not None and trips.size == 1 and int(trips.reshape(-1)[0]) > 0:
            raise
        body_out = [vi.type for vi in body.outputs]
    if len(body_out) < 1 + n_carried or len(body_out) - 1 != len(ctx.node.outputs):
        ctx.fail(f"body has {len(body_out)} outputs; expected cond, then one per node output "
                 f"({len(ctx.node.outputs)}: {n_carried} loop-carried values and the scan outputs)")
    cond = body_out[0]
    if isinstance(cond, TensorType) and cond.dtype != np.dtype(np.bool_):
        ctx.fail(f"the body's first output (the condition) is {cond}, not bool")
    _same_element_types(ctx, carried, body_out[1:1 + n_carried], "loop-carried value", "after the body")
    final = [merge(c, o) if c is not None else o for c, o in zip(carried, body_out[1:1 + n_carried])]
    iters = symbolic.fresh("loop")
    scans = []
    for t in body_out[1 + n_carried:]:
        if isinstance(t, TensorType) and t.shape is not None:
            scans.append(TensorType(t.dtype, (iters,) + tuple(t.shape)))
        elif isinstance(t, TensorType):
            scans.append(TensorType(t.dtype, None))
        else:
            scans.append(None)
    return (final + scans)[: len(ctx.node.outputs)]


@meta("Scan", versions=(9, None))
def scan(ctx):
    body = ctx.attrs["body"]
    n_scan = int(ctx.attr("num_scan_inputs"))
    n_state = ctx.n_inputs - n_scan
    in_axes = list(ctx.attrs.get("scan_input_axes") or [0] * n_scan)
    for name in ("scan_input_directions", "scan_output_directions"):
        bad = [d for d in ctx.attrs.get(name) or [] if d not in (0, 1)]
        if bad:
            ctx.fail(f"{name} holds {bad[0]}: 0 (forward) or 1 (reverse)")
    states = [ctx.type(i) for i in range(n_state)]
    slices, seq_len = [], None
    for j in range(n_scan):
        t = ctx.type(n_state + j)
        if not isinstance(t, TensorType) or t.shape is None:
            slices.append(None)
            continue
        if len(in_axes) != n_scan:
            ctx.fail(f"scan_input_axes has {len(in_axes)} entries for {n_scan} scan inputs")
        a = norm_axis(ctx, in_axes[j], len(t.shape), "scan input axis")
        seq_len = t.shape[a] if seq_len is None else seq_len
        slices.append(TensorType(t.dtype, tuple(d for k, d in enumerate(t.shape) if k != a)))
    body_out = ctx.infer_subgraph(body, _subgraph_inputs(body, states + slices))
    n_out_scan = len(body_out) - n_state
    out_axes = list(ctx.attrs.get("scan_output_axes") or [0] * n_out_scan)
    res = [merge(s, o) if s is not None else o for s, o in zip(states, body_out[:n_state])]
    seq_len = seq_len if seq_len is not None else symbolic.fresh("scan")
    for j, t in enumerate(body_out[n_state:]):
        if not isinstance(t, TensorType) or t.shape is None:
            res.append(t)
            continue
        r = len(t.shape) + 1
        a = out_axes[j] + r if out_axes[j] < 0 else out_axes[j]
        shp = list(t.shape)
        shp.insert(a, seq_len)
        res.append(TensorType(t.dtype, tuple(shp)))
    return res


@meta("SequenceMap")
def sequence_map(ctx):
    body = ctx.attrs["body"]
    if len(body.inputs) != ctx.n_inputs or len(body.outputs) != len(ctx.node.outputs):
        ctx.fail(f"body takes {len(body.inputs)} inputs and gives {len(body.outputs)} outputs; the node has "
                 f"{ctx.n_inputs} inputs and {len(ctx.node.outputs)} outputs")
    ins = []
    for i in range(ctx.n_inputs):
        t = ctx.type(i)
        ins.append(t.elem if isinstance(t, SequenceType) else t)
    outs = ctx.infer_subgraph(body, _subgraph_inputs(body, ins))
    return [SequenceType(t) for t in outs]
