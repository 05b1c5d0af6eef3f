"""Constant folding: nodes whose inputs are all initializers run once, now.

Their results become initializers that every compiled plan shares; each folded node is
named in `ctx.folded` so `explain` can say where a constant came from. So do nodes whose
outputs shape inference has already proved, whatever the inputs: `Shape → Slice[-1:]` of
a `[batch, 12, seq, 64]` tensor is `[64]` for every input the model accepts (static dims
of inputs are checked at run time), and the Cast, Sqrt or Pow that an exporter hangs on it
(attention's scale) then fold too; a GPT-2 export's decode step ran 12 such chains per
token before.

The evaluation itself (which kernel, the size limit, what may not be folded) is the
runtime's one constant folder (runtime/folding.py), which plans use for values that
follow from the input shapes.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ops.registry import get_contract
from ..ir import TensorType
from ..ops.meta.shape import constant_value
from ..runtime.folding import fold_limit, fold_with_providers, may_fold


def fold_constants(graph, ctx):
    consts = dict(graph.constants())
    keep, folded = [], []
    for node in graph.nodes:
        contract = get_contract(node.domain, node.op_type, node.opset)
        results = _proved(node, ctx) if may_fold(node) else None
        if results is None and contract is not None and node.op_type == "Constant" and not node.domain:
            results = _constant(node, ctx.options)
        if results is None and contract is not None:
            results = fold_with_providers(node, contract, ctx.types, consts, ctx.providers, ctx.options)
        if results is None:
            keep.append(node)
            continue
        for o, r in zip(node.outputs, results):
            if o:
                consts[o] = r
        folded.append(node)
    if not folded:
        return graph, []
    ctx.folded += [n.name for n in folded]
    read = {i for n in keep for i in [*n.inputs, *n.implicit_inputs]} | set(graph.output_names())
    declared = {v.name for v in graph.inputs}
    inits = {k: v for k, v in graph.initializers.items() if k in read or k in declared}
    inits.update({k: v for k, v in consts.items() if k not in graph.initializers and k in read})
    return replace(graph, nodes=keep, initializers=inits), [f"fold {n.op_type} '{n.name}' into a constant"
                                                           for n in folded]


def _constant(node, options) -> list | None:
    """A Constant's value as its kernel gives it (constant_value: any of its forms), under
    the folder's size limit, without a provider's verdict and a kernel bound for it: ~30 us
    a node through the folder, and a Paddle export carries hundreds (rapidocr-det 342: 6-8
    ms of its creation). None where the folder should see it (no value: it reports that;
    over the limit: the folder keeps it a node too)."""
    value = constant_value(node.attrs)
    if not isinstance(value, np.ndarray) or (value.dtype != object and value.nbytes > fold_limit(options)):
        return None
    return [value]


def _proved(node, ctx) -> list | None:
    """The node's outputs when inference knows every one as a concrete array of its
    static type (shape arithmetic), else None."""
    out = []
    for o in node.outputs:
        if not o:
            out.append(None)
            continue
        v, t = ctx.values.get(o), ctx.types.get(o)
        if not (isinstance(v, np.ndarray) and isinstance(t, TensorType) and t.is_static and t.dtype.kind in "iu"
                and tuple(v.shape) == tuple(t.shape)):
            return None
        if v.dtype == object:  # shape values: Python ints, or symbolic dims (not proved)
            if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v.flat):
                return None
            v = np.array(v.tolist(), dtype=t.dtype).reshape(v.shape)
        elif v.dtype != t.dtype:
            return None
        out.append(v)
    return out
