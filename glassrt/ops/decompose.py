"""Composite ops: expansion into primitives through their ONNX function bodies.

Many ONNX ops (LayerNormalization, Celu, SoftmaxCrossEntropyLoss...) ship a function
body in their schema. When no provider has a kernel for such an op, glassrt inlines the
body so that every provider can run it — the onnx package states the decomposition once
and glassrt does not retype it.
"""
from __future__ import annotations

import onnx
from onnx import defs

from ..onnx_io import node_to_proto, nodes_from_protos, to_type_proto
from .contract import schema_defaults


def _pick(versions, opset):
    ok = [v for v in versions if v <= opset]
    return max(ok) if ok else None


def onnx_function(node, input_types) -> onnx.FunctionProto | None:
    """The FunctionProto that defines `node`'s op at its opset, or None."""
    try:
        schema = defs.get_schema(node.op_type, node.opset, node.domain)
    except defs.SchemaError:
        return None
    if schema.has_function:
        v = _pick(schema.function_opset_versions, node.opset)
        raw = schema.get_function_with_opset_version(v) if v else None
        if raw:
            return onnx.FunctionProto.FromString(raw)
        return schema.function_body if schema.function_body.node else None
    if schema.has_context_dependent_function:
        v = _pick(schema.context_dependent_function_opset_versions, node.opset)
        if v is None:
            return None
        protos = []
        for t in input_types:
            tp = to_type_proto(t)
            protos.append(tp.SerializeToString() if tp is not None else b"")
        # An input type the function builder needs but we don't know makes it fail:
        if any(not p for p, name in zip(protos, node.inputs) if name):
            return None
        try:
            raw = schema.get_context_dependent_function_with_opset_version(
                v, node_to_proto(node).SerializeToString(), protos)
        except Exception:
            return None
        return onnx.FunctionProto.FromString(raw) if raw else None
    return None


def onnx_decomposition(node, input_types, visible: set[str]):
    fn = onnx_function(node, input_types)
    if fn is None:
        return None
    defaults = dict(schema_defaults(defs.get_schema(node.op_type, node.opset, node.domain)))
    for a in fn.attribute_proto:
        defaults.setdefault(a.name, onnx.helper.get_attribute_value(a))
    return inline_function(fn, node, defaults, visible)


def inline_function(fn: onnx.FunctionProto, node, attr_defaults: dict, visible: set[str]):
    """The function's nodes, renamed into the caller's scope, as glassrt Nodes."""
    rename = {}
    for formal, actual in zip(fn.input, node.inputs):
        rename[formal] = actual
    for formal in fn.input[len(node.inputs):]:
        rename[formal] = ""
    for formal, actual in zip(fn.output, node.outputs):
        rename[formal] = actual or f"{node.name}/{formal}"
    prefix = f"{node.name}/"

    def mapped(name):
        if not name:
            return ""
        if name not in rename:
            rename[name] = prefix + name
        return rename[name]

    caller_attrs = {k: v for k, v in node.attrs.items()}

    def resolve_attrs(proto_node, out_node):
        for a in proto_node.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in caller_attrs:
                    value = caller_attrs[a.ref_attr_name]
                elif a.ref_attr_name in attr_defaults:
                    value = attr_defaults[a.ref_attr_name]
                else:
                    continue  # unset optional attribute: the inner op uses its own default
                from ..onnx_io import attribute_to_proto

                out_node.attribute.append(attribute_to_proto(a.name, value))
            elif a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                new = onnx.AttributeProto()
                new.CopyFrom(a)
                for g in ([new.g] if a.type == onnx.AttributeProto.GRAPH else new.graphs):
                    _rename_outer_refs(g, rename)
                out_node.attribute.append(new)
            else:
                out_node.attribute.append(a)

    protos = []
    for i, n in enumerate(fn.node):
        new = onnx.NodeProto()
        new.op_type, new.domain = n.op_type, n.domain
        new.name = f"{prefix}{n.name or n.op_type + '_' + str(i)}"
        new.input.extend(mapped(x) for x in n.input)
        new.output.extend(mapped(x) for x in n.output)
        resolve_attrs(n, new)
        protos.append(new)

    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in fn.opset_import}
    opsets.setdefault(node.domain, node.opset)
    return nodes_from_protos(protos, opsets, visible, f"expanded from {node.op_type} '{node.name}'")


def _rename_outer_refs(g: onnx.GraphProto, rename: dict):
    own = {i.name for i in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    for n in g.node:
        for k, x in enumerate(n.input):
            if x and x not in own and x in rename:
                n.input[k] = rename[x]
        for a in n.attribute:
            for sg in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs):
                _rename_outer_refs(sg, rename)
    for o in g.output:
        if o.name not in own and o.name in rename:
            o.name = rename[o.name]
