"""Expand composite ops the providers cannot run whole into their decompositions.

A composite op (an ONNX function such as LayerNormalization below opset 17, a glassrt
fused op, a custom op with `register_decomposition`) that the first provider has no
kernel for is replaced by the nodes of its decomposition, so that it runs natively op by
op instead of falling back whole to the reference provider; a real kernel on another
provider (not the reference one) is still preferred. The new nodes may be composites
themselves: they are expanded in turn. Subgraphs (If/Loop/Scan bodies) are expanded too.

A decomposition that fails is not hidden: its error is kept (`ctx.expansion_failures`)
and placement shows it beside "no kernel" for that node.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Graph
from ..ops.registry import get_contract
from ..runtime.infer import infer, infer_body, scoped
from ..runtime.placement import node_context
from ..runtime.select import provider_verdict


def expand_composites(graph, ctx):
    changes = []
    graph = _expand(graph, ctx, ctx.types, ctx.values, changes)
    return graph, changes


def _expand(graph, ctx, types, values, changes) -> Graph:
    providers = ctx.providers
    visible = None  # the names in use, for a decomposition's new ones: gathered when one is made
    nodes, out, changed = list(graph.nodes), [], False
    i = 0
    while i < len(nodes):
        node = nodes[i]
        i += 1
        contract = get_contract(node.domain, node.op_type, node.opset)
        if contract is not None and contract.decomposition is not None and providers:
            bctx = node_context(node, contract, types, values)
            ks, why = provider_verdict(providers[0], node, contract, bctx)
            if not ks and not any(q.name != "reference" and provider_verdict(q, node, contract, bctx)[0]
                                  for q in providers[1:]):
                if visible is None:
                    visible = set(types) | set(graph.initializers) | {v.name for v in graph.inputs}
                body, error = _decompose(node, contract, bctx.input_types, visible)
                if body:
                    ctx.expansions.append((node.name, node.op_type, len(body), why))
                    changes.append(f"expand {node.op_type} '{node.name}' into {len(body)} node(s): {why}")
                    # Type the new nodes against everything known so far, then look at them in turn.
                    res = infer(Graph(graph.name, body, [], [], {}), {}, outer_types=types, outer_values=values,
                                strict=False)
                    types.update(res.types)
                    values.update(res.values)
                    visible |= set(res.types)
                    nodes[i:i] = body
                    changed = True
                    continue
                if error:
                    ctx.expansion_failures[node.name] = error
        new_node = _expand_subgraphs(node, ctx, types, values, changes)
        changed |= new_node is not node
        out.append(new_node)
    return replace(graph, nodes=out, types={**graph.types, **types}) if changed else graph


def _expand_subgraphs(node, ctx, types, values, changes):
    new_attrs = {}
    for attr, v in node.attrs.items():
        graphs = v if isinstance(v, list) else [v]
        if not graphs or not all(isinstance(g, Graph) for g in graphs):
            continue
        expanded = []
        for g in graphs:
            res = infer_body(g, {}, types, values)
            # (the body's own over the enclosing scope's, not a copy of them: a copy per body
            # was quadratic in a model of many Ifs)
            expanded.append(_expand(g, ctx, scoped(dict(res.types), types), scoped(dict(res.values), values), changes))
        if any(e is not g for e, g in zip(expanded, graphs)):
            new_attrs[attr] = expanded if isinstance(v, list) else expanded[0]
    return replace(node, attrs={**node.attrs, **new_attrs}) if new_attrs else node


def _decompose(node, contract, in_types, visible):
    """(nodes, None), or (None, why not) when the decomposition failed or declined."""
    try:
        body = contract.decomposition(node, in_types, visible)
    except Exception as e:
        return None, f"its decomposition failed: {type(e).__name__}: {e}"
    if not body:
        return None, None
    return body, None

