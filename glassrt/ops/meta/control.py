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
    return [merge(a, b) for a, b in zip(*branches)] if len(branches) == 2 else branches[0]


@meta("Loop")
def loop(ctx):
    """The carried values' and the scans' types from the body's. A body that cannot run on
    these shapes is an error only if it runs (as the If's untaken branch): unless the trip
    count is a constant above 0, the body's declared output types stand, and a run with
    iterations fails in the body, naming its node; a loop of none returns its inputs."""
    body = ctx.attrs["body"]
    carried = [ctx.type(i) for i in range(2, ctx.n_inputs)]
    n_carried = len(carried)
    body_in = _subgraph_inputs(body, [TensorType(np.dtype(np.int64), ()), TensorType(np.dtype(np.bool_), ())] + carried)
    try:
        body_out = ctx.infer_subgraph(body, body_in)
    except ShapeInferenceError:
        trips = ctx.const(0) if ctx.has(0) else None
        if trips is not None and trips.size == 1 and int(trips.reshape(-1)[0]) > 0:
            raise
        body_out = [vi.type for vi in body.outputs]
    if len(body_out) < 1 + n_carried:
        ctx.fail(f"body has {len(body_out)} outputs; expected cond + {n_carried} loop-carried values")
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
    ins = []
    for i in range(ctx.n_inputs):
        t = ctx.type(i)
        ins.append(t.elem if isinstance(t, SequenceType) else t)
    outs = ctx.infer_subgraph(body, _subgraph_inputs(body, ins))
    return [SequenceType(t) for t in outs]
