"""Constant folding: nodes whose inputs are all initializers run once, now.

Their results become initializers that every compiled plan shares; each folded node is
named in `ctx.folded` so `explain` can say where a constant came from. The evaluation
itself (which kernel, the size limit, what may not be folded) is the runtime's one
constant folder (runtime/folding.py), which plans use for values that follow from the
input shapes.
"""
from __future__ import annotations

from dataclasses import replace

from ..ops.registry import get_contract
from ..runtime.folding import fold_with_providers


def fold_constants(graph, ctx):
    consts = dict(graph.constants())
    keep, folded = [], []
    for node in graph.nodes:
        contract = get_contract(node.domain, node.op_type, node.opset)
        results = None if contract is None else fold_with_providers(node, contract, ctx.types, consts,
                                                                   ctx.providers, ctx.options)
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
