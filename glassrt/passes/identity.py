"""Remove nodes that pass their input through unchanged: Identity, Dropout at inference
(its mask unread, training_mode absent or false), and a Cast of a graph input or an
initializer to the type it already has (skl2onnx casts a float input to float first) — as
onnxruntime does at load. Their readers
read the input instead; besides the node's own copy, this keeps layout regions whole (a
Dropout between two oneDNN nodes put two reorders around a cpu copy in squeezenet).

Kept: a node whose output is a graph output (its name is the caller's), and one whose output
a subgraph reads from the outer scope (renaming inside bodies is not worth the risk).
"""
from __future__ import annotations

from dataclasses import replace

from .. import dtypes
from ..ir import TensorType


def _passthrough(node, consts, read, declared) -> bool:
    if node.domain or len(node.inputs) < 1 or not node.inputs[0]:
        return False
    if node.op_type == "Identity":
        return True
    if node.op_type == "Cast":
        return node.inputs[0] in declared and node.attrs.get("to") == declared[node.inputs[0]]
    if node.op_type != "Dropout" or any(o and o in read for o in node.outputs[1:]):  # the mask is used
        return False
    if node.opset >= 12 and len(node.inputs) > 2 and node.inputs[2]:
        mode = consts.get(node.inputs[2])
        return mode is not None and mode.size == 1 and not bool(mode.reshape(-1)[0])
    return True


def remove_identities(graph, ctx=None):
    outputs = set(graph.output_names())
    consts = graph.constants()
    outer_reads = {i for n in graph.nodes for i in n.implicit_inputs}
    read = {i for n in graph.nodes for i in [*n.inputs, *n.implicit_inputs]} | outputs
    rename, dropped, changes = {}, set(), []
    # (a body's inputs are fed by its node, unchecked against their declared types: only the
    # top graph's count, whose runs are fed them or refused)
    declared = _declared_types(graph, inputs=not (ctx is not None and getattr(ctx, "body", False)))
    for n in graph.nodes:
        if not _passthrough(n, consts, read, declared) or n.outputs[0] in outputs or n.outputs[0] in outer_reads:
            continue
        src = n.inputs[0]
        rename[n.outputs[0]] = rename.get(src, src)
        dropped.add(n.name)
        changes.append(f"remove {n.op_type} '{n.name}' (passes its input through)")
    if not changes:
        return graph, []
    nodes = [replace(n, inputs=[rename.get(i, i) for i in n.inputs]) for n in graph.nodes if n.name not in dropped]
    return replace(graph, nodes=nodes), changes


def _declared_types(graph, inputs: bool = True) -> dict:
    """{name: ONNX element type} of the graph's inputs (with `inputs`: their declared types,
    which a session's run is fed or refused) and initializers."""
    out = {}
    for v in graph.inputs if inputs else ():
        if isinstance(v.type, TensorType) and v.type.dtype is not None:
            try:
                out[v.name] = dtypes.elem_type(v.type.dtype)
            except (ValueError, TypeError):
                pass
    for name, a in graph.initializers.items():
        try:
            out[name] = dtypes.elem_type(a.dtype)
        except (ValueError, TypeError, AttributeError):
            pass
    return out
