"""Common subexpressions: a node that computes what an earlier node computes is dropped, and
its readers read the earlier node's outputs.

Two nodes compute the same when they have the same op, opset, attributes and outputs
given, and inputs that are the same values or values shape inference knows to be equal;
or when inference knows their one output to be the same value (shape arithmetic): the
shape of every layer's KV cache is [batch, 12, past + seq, 64] however it was made.
Exporters repeat shape arithmetic per layer (a GPT-2 export slices its causal mask from
each layer's own cache shape: ten nodes a layer, the same numbers in all twelve), and in a
plan whose cache length is symbolic they all run at every step. onnxruntime's basic-level
CommonSubexpressionElimination merges nodes with identical inputs only.

Inference takes a Slice with symbolic bounds to lie within its data (x[:, past:past + seq]
is seq long), as onnxruntime's does; a run where it does not gets its real, shorter slice,
and the first node that meets both lengths fails loudly. A value whose shape follows from
such a slice is therefore not trusted as a key (two Shape nodes would be merged on the
assumption and the failure lost): a Slice's outputs, and whatever takes its shape from
them, are compared by name only. (The fused attention's keep and mask do not shape its
output, so GPT-2's sliced causal mask does not spread to the layers after it.)

Never merged: ops outside the ONNX domains (a custom op may keep state), nondeterministic
ops (each draws its own numbers), nodes with subgraphs, and a node whose output is a graph
output or is read inside a subgraph (names there are not rewritten).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import TensorType
from ..runtime.folding import NONDETERMINISTIC

_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
_MAX_KEYED_VALUE = 64  # elements of a known value compared by content (shape-like tensors)


def eliminate_common_subexpressions(graph, ctx):
    outputs = set(graph.output_names())
    read_inside = {i for n in graph.nodes for i in n.implicit_inputs}
    rename, first, keep, log = {}, {}, [], []
    assumed: set = set()  # values whose shapes rest on a slice's bounds lying within its data

    def trusted(name):
        """(the value's element type, its known content) for keys to rely on, or None."""
        v, t = (None, None) if name in assumed else (ctx.values.get(name), ctx.types.get(name))
        return (t.dtype, v) if v is not None and isinstance(t, TensorType) else None

    for node in graph.nodes:
        if rename and any(i in rename for i in node.inputs):
            node = replace(node, inputs=[rename.get(i, i) for i in node.inputs])
        if _assumes(node, ctx) or any(i in assumed for k, i in enumerate(node.inputs) if k not in _not_shaping(node)):
            assumed.update(o for o in node.outputs if o)
        keys = [k for k in (_key(node, trusted), _result_key(node, trusted)) if k is not None]
        earlier = next((e for e in (_earlier(first, k, node) for k in keys) if e is not None), None)
        if earlier is None or any(o in outputs or o in read_inside for o in node.outputs if o):
            for k in keys:
                first.setdefault(k, []).append(node)
            keep.append(node)
            continue
        for o, e in zip(node.outputs, earlier.outputs):
            if o:
                rename[o] = e
        log.append(f"{node.op_type} '{node.name}' computes what {earlier.op_type} '{earlier.name}' does: "
                   "its readers read that")
    if not log:
        return graph, []
    return replace(graph, nodes=keep), log


def _assumes(node, ctx) -> bool:
    """A Slice whose output shape inference could only take on trust: symbolic data dims
    or bounds that are not concrete numbers (a slice of static data by constant bounds,
    such as a shape vector's, is exact)."""
    if node.op_type != "Slice" or node.domain not in _DOMAINS:
        return False
    data = ctx.types.get(node.inputs[0]) if node.inputs else None
    if not (isinstance(data, TensorType) and data.is_static):
        return True
    bounds = [ctx.values.get(i) for i in node.inputs[1:] if i]
    return node.opset >= 10 and any(b is None or b.dtype == object for b in bounds)


def _not_shaping(node) -> tuple:
    """Inputs that do not shape the node's outputs."""
    return (3, 4) if (node.domain, node.op_type) == ("glassrt", "ScaledDotProductAttention") else ()


def _earlier(first: dict, key, node):
    """The first earlier node under `key` that computes what `node` does. An op's key leaves
    its attributes out (most nodes share their op and inputs with no other: keying every
    node's attributes, their arrays' bytes too, took most of the pass's ~1 ms on a quantized
    MobileNetV2); they are compared here, for the few that do."""
    found = first.get(key)
    if not found:
        return None
    if key[0] == "result":
        return found[0]
    mine = _attrs_key(node)
    return None if mine is None else next((e for e in found if _attrs_key(e) == mine), None)


def _key(node, value_of):
    """What the node computes apart from its attributes (_earlier compares those), hashable;
    None when it must not be merged. value_of(name): the value inference knows and the key
    may rely on, or None."""
    if node.domain not in _DOMAINS or node.op_type in NONDETERMINISTIC or not any(node.outputs) \
            or node.implicit_inputs:
        return None
    return ("op", node.domain, node.op_type, node.opset, tuple(bool(o) for o in node.outputs),
            tuple(_input_key(i, value_of) for i in node.inputs))


def _attrs_key(node):
    """The node's attributes, hashable; None when one has no plain value (a subgraph)."""
    attrs = []
    for k in sorted(node.attrs):
        v = _attr_key(node.attrs[k])
        if v is None:
            return None
        attrs.append((k, v))
    return tuple(attrs)


def _result_key(node, value_of):
    """A node whose one output inference knows (shape arithmetic: [batch, 12, past + 1, 64])
    computes what any earlier node with that same known output does, whatever its op."""
    if node.domain not in _DOMAINS or node.op_type in NONDETERMINISTIC or len(node.outputs) != 1 \
            or node.implicit_inputs:
        return None
    v = _content(value_of(node.outputs[0]))
    return ("result",) + v if v is not None else None


def _input_key(name, value_of):
    v = _content(value_of(name)) if name else None
    return ("value",) + v if v is not None else ("name", name)


def _content(known):
    """A small known value as a key: its element type (a symbolic value is an object array
    whatever its type), shape and content, symbolic dims compared as expressions, numbers
    by their bytes (0.0 and -0.0 differ); None for anything else."""
    if known is None:
        return None
    dtype, v = known
    if not isinstance(v, np.ndarray) or v.size > _MAX_KEYED_VALUE:
        return None
    return (np.dtype(dtype).str, v.shape, tuple(v.ravel().tolist()) if v.dtype == object else v.tobytes())


def _attr_key(v):
    if isinstance(v, float):
        return ("float", repr(v))  # -0.0 is not 0.0
    if isinstance(v, (bool, int, str, bytes)) or v is None:
        return (type(v).__name__, v)
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        items = [_attr_key(x) for x in v]
        return None if any(x is None for x in items) else ("list", tuple(items))
    return None  # a graph (subgraph) or anything without a plain value
