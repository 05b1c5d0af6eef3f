"""A KV cache's Concat — Concat(past, new) where `past` is a graph input and the result a
graph output (`present`), which the caller feeds back as `past` next step — becomes
glassrt::CacheConcat, whose kernel (kernels/cpu/cache.py) appends `new` into spare room
behind the past's rows when the past is a present it handed out itself.

Why: a decode step copies every layer's whole cache into a fresh array, and that copy
grows with the context. Measured in GPT-2's decode loop (24 caches of 12 heads x 64): a
Concat 30-33 us a call at ~40 rows, 180-300 us at ~530 (the step's caches cold after the
products' weight streams), against CacheConcat's 36-47 us at either; the token after a
512-token prompt 38.0-41.5 -> 30.4-32.6 ms (onnxruntime 28.6-29.2), no change measurable
after 16 tokens.

Fires on the top graph only (a body's inputs and outputs are a Loop's, not the caller's),
where the Concat has two inputs, its output is a graph output, and the past is a graph
input (not an initializer) that nothing but this Concat and shape readers (Shape, Size)
reads: such an input may arrive as a strided view of a cache buffer (session.py lets it
through uncopied), which only these readers are known to take as it is.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Node
from ._rewrite import origin

SHAPE_READERS = frozenset({"Shape", "Size"})


def cache_inputs(graph) -> frozenset:
    """The graph inputs only CacheConcats (as their past) and shape readers read: a run may
    take them as they come, strided views of a cache buffer included (session.py)."""
    readers = graph.consumers()
    return frozenset(name for name in graph.input_names() if readers.get(name) and any(
        r.op_type == "CacheConcat" for r in readers[name]) and all(_reads_as_cache(r, name) for r in readers[name]))


def _reads_as_cache(node, name) -> bool:
    if node.domain == "glassrt" and node.op_type == "CacheConcat":
        return node.inputs[0] == name and node.inputs[1] != name
    return not node.domain and node.op_type in SHAPE_READERS


def mark_cache_concats(graph, ctx):
    if ctx.body:
        return graph, []
    fed = set(graph.input_names())
    outputs = set(graph.output_names())
    readers = graph.consumers()
    changes, nodes = [], []
    for n in graph.nodes:
        past = n.inputs[0] if n.inputs else ""
        if (n.op_type == "Concat" and not n.domain and len(n.inputs) == 2 and all(n.inputs)
                and past in fed and n.outputs[0] in outputs and past != n.inputs[1]
                and all(r is n or _reads_as_cache(r, past) for r in readers.get(past, ()))):
            n = Node("CacheConcat", "glassrt", list(n.inputs), list(n.outputs), {"axis": int(n.attrs.get("axis", 1))},
                     n.name, 1, [], origin=origin(n, "a KV cache's Concat (graph input + new rows -> graph output)"))
            changes.append(f"Concat '{n.name}': '{past}' -> '{n.outputs[0]}' appends in place (CacheConcat)")
        nodes.append(n)
    return (replace(graph, nodes=nodes), changes) if changes else (graph, [])
