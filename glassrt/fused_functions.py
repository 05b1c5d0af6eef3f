"""glassrt's fused ops as model-local ONNX functions, so that an optimized model is standard ONNX.

A `glassrt::` node (FusedConv, FusedMatMul, FusedBatchNormalization, ChannelShuffle,
ScaledDotProductAttention) is written as it is — op type, domain "glassrt", every
attribute — and the model carries a FunctionProto for it whose body is the op's
decomposition (the contract's, ops/fused.py). onnx.checker accepts the file and a runtime
that inlines model-local functions (onnxruntime) runs the body; glassrt's loader recognises
its own domain and runs the fused kernel instead (onnx_io.from_proto).

Attributes. An attribute the decomposition hands unchanged to one inner op (a Conv's
kernel_shape/strides/pads/dilations/group/auto_pad, BatchNormalization's epsilon) is a
function attribute: the inner op refers to it (`ref_attr_name`), so one function serves
every conv geometry. The others decide the body's *structure* and cannot be references:
`activation` picks an op type, `activation_params` become an attribute of it or Clip's
constant inputs, `alpha` a Constant of the input's dtype, ChannelShuffle's `group` a
reshape target computed with the channel count; an absent optional input (no bias, no
residual) drops a node. Those are baked into the body, and each distinct body is one
*overload* of the function (ONNX IR 10: FunctionProto.overload, NodeProto.overload), so the
node keeps its op type `FusedConv` whatever its activation.

Opsets. A function must use the model's opset for the default domain (onnx.checker refuses
a function whose import differs). The decompositions are written at the opset where their
ops have today's form (Clip with bound inputs: 11+, Gelu: 20+); a body node that is not
valid at the model's opset is replaced by its own ONNX function body (Gelu in an opset-17
model becomes its Erf form). One that has none (Clip bounds as inputs below opset 11)
cannot be written: OptimizeError names it (write the model with a lower --level).
"""
from __future__ import annotations

from dataclasses import replace

import onnx
from onnx import helper

from .errors import GlassrtError
from .ir import Graph, TensorType, ValueInfo
from .onnx_io import node_to_proto
from .ops.registry import get_contract

DOMAIN = "glassrt"

# op type -> (inner op the attributes go to unchanged, those attributes)
PASS_THROUGH = {
    "FusedConv": ("Conv", ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")),
    "FusedBatchNormalization": ("BatchNormalization", ("epsilon",)),
    "CenteredQLinearConv": ("QLinearConv", ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")),
}


class OptimizeError(GlassrtError):
    """The optimized graph cannot be written as a standard ONNX model (names the node)."""


def checker_context(opsets: dict, ir_version: int):
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = ir_version
    ctx.opset_imports = dict(opsets)
    return ctx


class Legalizer:
    """glassrt Nodes → NodeProtos valid at the model's opsets (see the module doc)."""

    def __init__(self, opsets: dict, ir_version: int, to_proto):
        self.opsets = opsets
        self.ctx = checker_context(opsets, ir_version)
        self.to_proto = to_proto  # Node -> NodeProto (the exporter's: subgraphs, fused calls)

    def valid(self, proto) -> str | None:
        """None if `proto` is valid at the model's opsets, else why not."""
        try:
            onnx.checker.check_node(proto, self.ctx, onnx.checker.C.LexicalScopeContext())
        except Exception as e:  # the checker's ValidationError
            return str(e).splitlines()[0]
        return None

    def protos(self, nodes, types: dict, where: str) -> list:
        from .ops.decompose import onnx_decomposition
        from .runtime.infer import infer

        out = []
        for n in nodes:
            proto = self.to_proto(n)
            # Nodes as the model wrote them, and other domains, are left as they are.
            if n.domain or n.opset == self.opsets.get("") or any(True for _ in n.subgraphs()):
                out.append(proto)
                continue
            why = self.valid(proto)
            if why is None:
                out.append(proto)
                continue
            body = onnx_decomposition(n, [types.get(i) if i else None for i in n.inputs], set(types))
            if not body:
                raise OptimizeError(f"{where}: its {n.op_type} node '{n.name}' (written for opset {n.opset}) is not "
                                    f"valid at the model's opset {self.opsets.get('')} ({why}) and has no ONNX "
                                    "function to write it with; write the model with a lower --level")
            res = infer(Graph("body", body, [], [], {}), {}, outer_types=types, strict=False)
            out += self.protos(body, {**types, **res.types}, where)
        return out


class FusedFunctions:
    """One FunctionProto per distinct body of each glassrt op used (an overload each)."""

    def __init__(self, legalizer: Legalizer):
        self.legalizer = legalizer
        self.functions: dict[tuple, onnx.FunctionProto] = {}
        self.calls: dict[str, int] = {}  # op type -> nodes written as calls

    @staticmethod
    def handles(node) -> bool:
        contract = get_contract(node.domain, node.op_type, node.opset)
        return node.domain == DOMAIN and contract is not None and contract.decomposition is not None

    def call(self, node, input_types: list) -> onnx.NodeProto:
        """The NodeProto calling the function for `node` (the function made on first need)."""
        # An empty list is the schema's default and has no ONNX attribute type: left unset.
        node = replace(node, attrs={k: v for k, v in node.attrs.items() if not (isinstance(v, list) and not v)})
        fn = self._function(node, input_types)
        proto = node_to_proto(node)
        proto.overload = fn.overload
        self.calls[node.op_type] = self.calls.get(node.op_type, 0) + 1
        return proto

    def _function(self, node, input_types) -> onnx.FunctionProto:
        from .runtime.infer import infer

        contract = get_contract(node.domain, node.op_type, node.opset)
        schema = contract.schema
        formal_in = [name if actual else "" for (name, _), actual in zip(schema.inputs, node.inputs)]
        formal_out = [name if actual else "" for name, actual in zip(schema.outputs, node.outputs)]
        inner_op, through = PASS_THROUGH.get(node.op_type, (None, ()))
        refs = sorted(k for k in node.attrs if k in through)
        template = replace(node, inputs=formal_in, outputs=formal_out, name=node.op_type, implicit_inputs=[],
                           attrs={k: v for k, v in node.attrs.items() if k not in refs})
        where = f"glassrt::{node.op_type} node '{node.name}'"
        try:
            body = contract.decomposition(template, input_types, {x for x in formal_in if x})
        except Exception as e:
            raise OptimizeError(f"{where}: its decomposition failed ({type(e).__name__}: {e}), so it cannot be "
                                "written as an ONNX function; write the model with a lower --level") from e
        if not body:
            raise OptimizeError(f"{where}: it has no decomposition to write as an ONNX function")
        # The body's types serve only to lower its nodes (a Gelu's function needs the dtype);
        # shapes are left out, as the body holds no conv geometry (its attributes are references).
        types = {f: TensorType(t.dtype, None) if isinstance(t, TensorType) else t
                 for f, t in zip(formal_in, input_types) if f}
        res = infer(Graph("body", body, [ValueInfo(f, t) for f, t in types.items()], [], {}), types, strict=False)
        protos = self.legalizer.protos(body, {**types, **res.types}, where)
        targets = [p for p in protos if p.op_type == inner_op and not p.domain]
        if refs and len(targets) != 1:
            raise OptimizeError(f"{where}: expected one {inner_op} in its decomposition to pass "
                                f"{', '.join(refs)} to, found {len(targets)}")
        for k in refs:
            targets[0].attribute.append(helper.make_attribute_ref(k, helper.make_attribute(k, node.attrs[k]).type))
        # Formals are positional: an absent optional input (no bias, but a residual) keeps its
        # place, the call passes "" for it and the body does not read it.
        ins = [name for (name, _), _x in zip(schema.inputs, node.inputs)]
        outs = [name for name, _x in zip(schema.outputs, node.outputs)]
        key = (node.op_type, tuple(formal_in), tuple(formal_out), tuple(refs),
               tuple(p.SerializeToString(deterministic=True) for p in protos))
        fn = self.functions.get(key)
        if fn is None:
            overload = str(sum(1 for k in self.functions if k[0] == node.op_type))
            baked = {k: v for k, v in node.attrs.items() if k not in refs}
            opsets = [helper.make_opsetid(d, v) for d, v in self.legalizer.opsets.items() if d != DOMAIN]
            fn = helper.make_function(DOMAIN, node.op_type, ins, outs, protos, opsets, attributes=refs,
                                      doc_string=f"glassrt::{node.op_type} with {baked} and inputs {ins}: its "
                                                 "decomposition (glassrt/ops/fused.py); glassrt runs its fused "
                                                 "kernel instead")
            fn.overload = overload
            self.functions[key] = fn
        return fn
