"""If nodes whose condition a plan knows, replaced by the branch they take.

Exporters guard shape-dependent code with If (`if x.dim() == 3: x = x.squeeze(...)`,
`if state.size(1) != batch`): the condition follows from the input shapes, and a plan is
made for concrete shapes, so it knows which branch every one of its runs takes. Run as a
node, each such If cost a nested runner per run (a plan checked out, its feeds gathered,
its outputs handed back): Silero VAD v6 ran six of them, nested four deep, for every 32 ms
of audio. The plan instead runs the taken branch's nodes where the If was, with the
decisions placement made for them, and one Identity per output (a view, not a copy). What
was inlined is listed on the plan (`Plan.inlined`) and shown by `glassrt profile`.

A branch is inlined only when that is the same program: its condition a concrete value
(an initializer, or what inference proved from shapes and constants; never a value fed at
run time), and none of the branch's node or value names already used around it (ONNX
keeps names unique across scopes; a model that does not is left as it is).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node
from ..kernels.registry import kernels_for
from .infer import infer

ROUNDS = 8  # an inlined branch's own Ifs are looked at in the next round


def inline_known_branches(placement, input_types: dict, inf):
    """(placement, inference, [(If node, branch taken)]): the placement with each If whose
    condition `inf` knows replaced by its branch, typed again; as given when there is none."""
    inlined = []
    for _ in range(ROUNDS):
        new, done = _inline_round(placement, inf)
        if not done:
            break
        placement, inlined = new, inlined + done
        inf = infer(placement.graph, input_types, strict=True, reuse=inf)
    return placement, inf, inlined


def _known_condition(node, graph, inf):
    if node.op_type != "If" or node.domain or not node.inputs or not node.inputs[0]:
        return None
    v = graph.initializers.get(node.inputs[0])
    if v is None:
        v = inf.values.get(node.inputs[0])
    if not isinstance(v, np.ndarray) or v.dtype == object or v.size != 1:
        return None
    return bool(v.reshape(-1)[0])


def _inline_round(placement, inf):
    graph = placement.graph
    names = {n.name for n in graph.nodes} | set(placement.decisions)
    values = {v.name for v in graph.inputs} | set(graph.initializers) | {o for n in graph.nodes for o in n.outputs}
    nodes, decisions, subgraphs = [], dict(placement.decisions), dict(placement.subgraphs)
    layouts = dict(placement.layouts)
    inits, types, done = dict(graph.initializers), dict(graph.types), []
    for node in graph.nodes:
        cond = _known_condition(node, graph, inf)
        taken = None if cond is None else ("then_branch" if cond else "else_branch")
        branch = placement.subgraphs.get(node.name, {}).get(taken) if taken else None
        outputs = _identities(node, branch, placement.decisions[node.name].provider) if branch is not None else None
        if outputs is None or not _fits(branch, outputs, names, values):
            nodes.append(node)
            continue
        body = branch.graph
        nodes += [*body.nodes, *(n for n, _ in outputs)]
        del decisions[node.name]
        subgraphs.pop(node.name, None)
        decisions.update(branch.decisions)
        decisions.update({n.name: d for n, d in outputs})
        subgraphs.update(branch.subgraphs)
        layouts.update(branch.layouts)  # (a branch's outputs and outer reads are plain)
        inits.update(body.initializers)
        types.update(body.types)
        names |= {n.name for n in body.nodes} | {n.name for n, _ in outputs}
        values |= set(body.initializers) | {o for n in body.nodes for o in n.outputs}
        done.append((node.name, taken))
    if not done:
        return placement, []
    return replace(placement, graph=replace(graph, nodes=nodes, initializers=inits, types=types),
                   decisions=decisions, subgraphs=subgraphs, layouts=layouts), done


def _identities(node, branch, provider):
    """[(Identity node, its Decision)] giving the If's outputs the branch's, or None."""
    from .placement import Decision

    from . import _load_kernels

    _load_kernels(provider, "", "Identity")
    kernels = kernels_for(provider, "", "Identity")
    if not kernels or len(branch.graph.outputs) != len(node.outputs):
        return None
    out = []
    for i, (o, b) in enumerate(zip(node.outputs, branch.graph.outputs)):
        if o:
            ident = Node("Identity", "", [b.name], [o], {}, f"{node.name}/output {i}", max(node.opset, 1),
                         origin=f"output {i} of If '{node.name}', its branch known for this plan's shapes")
            out.append((ident, Decision(ident, provider, list(kernels), "an inlined If's output (a view)")))
    return out


def _fits(branch, outputs, names, values) -> bool:
    """None of the branch's node or value names is taken around the If."""
    body = branch.graph
    new_names = {n.name for n in body.nodes} | set(branch.decisions) | {n.name for n, _ in outputs}
    new_values = set(body.initializers) | {o for n in body.nodes for o in n.outputs if o}
    return not (new_names & names) and not (new_values & values)
