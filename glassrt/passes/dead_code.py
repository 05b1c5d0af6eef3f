"""Remove nodes whose outputs nothing reads, and initializers nothing reads (onnxruntime
does the same at load)."""
from __future__ import annotations

from dataclasses import replace


def remove_dead_code(graph, ctx=None):
    needed = set(graph.output_names())
    keep = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs if o):
            keep.append(node)
            needed.update(i for i in [*node.inputs, *node.implicit_inputs] if i)
    keep.reverse()
    declared = {v.name for v in graph.inputs}  # a caller may still feed these
    unread = [k for k in graph.initializers if k not in needed and k not in declared]
    changes = []
    if len(keep) < len(graph.nodes):
        changes.append(f"removed {len(graph.nodes) - len(keep)} node(s) whose outputs are never used")
    if unread:
        changes.append(f"dropped {len(unread)} initializer(s) nothing reads")
    if not changes:
        return graph, []
    inits = {k: v for k, v in graph.initializers.items() if k in needed or k in declared}
    return replace(graph, nodes=keep, initializers=inits), changes
