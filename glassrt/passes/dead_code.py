"""Remove nodes whose outputs nothing reads (onnxruntime does the same at load)."""
from __future__ import annotations

from dataclasses import replace


def remove_dead_code(graph):
    needed = set(graph.output_names())
    keep = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs if o):
            keep.append(node)
            needed.update(i for i in [*node.inputs, *node.implicit_inputs] if i)
    keep.reverse()
    removed = len(graph.nodes) - len(keep)
    if not removed:
        return graph, ""
    return replace(graph, nodes=keep), f"removed {removed} node(s) whose outputs are never used"
