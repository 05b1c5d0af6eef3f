"""Constant folding, once per session: nodes whose inputs are all constants run now.

Their results become initializers that every compiled plan shares (per-plan folding in
plan.py only handles values that follow the input shapes, like Shape → Gather chains).
Each folded node is logged so `explain` can say where a constant came from.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import TensorType
from ..kernels.registry import BindContext
from ..ops.registry import get_contract
from .plan import NONDETERMINISTIC, _run_once, _select


def fold_constants(placement, options, make_runner):
    """(new placement, [folded node names]) — the input placement is left untouched."""
    if not options.constant_folding:
        return placement, []
    graph = placement.graph
    consts = dict(graph.constants())
    keep_nodes, folded = [], []
    limit = options.memory_limit()
    for node in graph.nodes:
        inputs = [i for i in [*node.inputs, *node.implicit_inputs] if i]
        if (any(node.subgraphs()) or node.op_type in NONDETERMINISTIC or not all(i in consts for i in inputs)
                or not any(node.outputs)):
            keep_nodes.append(node)
            continue
        contract = get_contract(node.domain, node.op_type, node.opset)
        in_types = [TensorType(consts[i].dtype, consts[i].shape) if i else None for i in node.inputs]
        out_types = [placement.inference.types.get(o) if o else None for o in node.outputs]
        if any(isinstance(t, TensorType) and t.is_static and t.dtype != object
               and int(np.prod(t.shape, dtype=np.int64)) * t.dtype.itemsize > limit for t in out_types):
            keep_nodes.append(node)  # the plan will report it against the memory limit
            continue
        ctx = BindContext(node, contract.attrs_with_defaults(node), in_types, out_types,
                          [consts.get(i) if i else None for i in node.inputs], contract=contract)
        kern, _ = _select(placement.decisions[node.name], ctx, options, make_runner, placement)
        results = _run_once(kern, ctx, make_runner, placement)
        if not all(isinstance(r, np.ndarray) for o, r in zip(node.outputs, results) if o):
            keep_nodes.append(node)
            continue
        for o, r in zip(node.outputs, results):
            if o:
                consts[o] = r
        folded.append(node.name)
    if not folded:
        return placement, []
    new_inits = dict(graph.initializers)
    live = {i for n in keep_nodes for i in [*n.inputs, *n.implicit_inputs]} | set(graph.output_names())
    for name, v in consts.items():
        if name not in graph.initializers and name in live:
            new_inits[name] = v
    # Initializers only the folded nodes read are no longer needed (the 0.02 weights' shapes...).
    new_inits = {k: v for k, v in new_inits.items() if k in live or k in {x.name for x in graph.inputs}}
    new_graph = replace(graph, nodes=keep_nodes, initializers=new_inits)
    decisions = {n.name: placement.decisions[n.name] for n in keep_nodes}
    return replace(placement, graph=new_graph, decisions=decisions), folded
