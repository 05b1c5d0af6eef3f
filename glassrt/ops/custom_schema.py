"""The contract side of custom operators: the schema string a user writes
("my_ops::swish(Tensor x, float beta=1.0) -> Tensor"), parsed into a CustomSchema, and the
GraphBuilder a decomposition writes its nodes with. The op object users hold
(`glassrt.custom_op`, which also registers kernels) is kernels/custom.py's CustomOp.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import numpy as np

from ..errors import GlassrtError

_ATTR_TYPES = {"int": int, "float": float, "str": str, "int[]": list, "float[]": list, "str[]": list}
REQUIRED = object()


class SchemaError(GlassrtError, ValueError):
    pass


@dataclass
class CustomSchema:
    """A parsed schema string: what `onnx.defs.OpSchema` is for built-in ops."""

    domain: str
    name: str
    inputs: list  # [(name, optional)]
    attributes: dict  # name -> (type string, default or REQUIRED)
    outputs: list  # names
    text: str = ""
    since_version: int = 1
    variadic: bool = False  # the last input repeats: one or more tensors (`Tensor... name`)

    @property
    def defaults(self) -> dict:
        return {k: d for k, (_, d) in self.attributes.items() if d is not REQUIRED}

    def __str__(self):
        return self.text


_HEAD = re.compile(r"^\s*([A-Za-z_][\w.]*)::([A-Za-z_]\w*)\s*\((.*)\)\s*->\s*(.+?)\s*$", re.S)


def parse_schema(text: str) -> CustomSchema:
    """'domain::name(Tensor x, Tensor? bias, float beta=1.0, int[] axes=[0]) -> (Tensor y, Tensor)'.
    `Tensor... xs` as the last tensor input takes one or more tensors (Concat-like ops)."""
    m = _HEAD.match(text)
    if not m:
        raise SchemaError(f"cannot parse op schema {text!r}: expected 'domain::name(args) -> outputs'")
    domain, name, args, rets = m.groups()
    if domain == "ai.onnx":  # the default ONNX domain, spelled as models may spell it
        domain = ""
    inputs, attrs, variadic = [], {}, False
    for i, arg in enumerate(_split_commas(args)):
        parts = arg.split("=", 1)
        decl = parts[0].split()
        if len(decl) != 2:
            raise SchemaError(f"{text!r}: argument {i} {arg!r} must be 'Type name' or 'Type name=default'")
        typ, arg_name = decl
        if typ in ("Tensor", "Tensor?", "Tensor..."):
            if len(parts) > 1:
                raise SchemaError(f"{text!r}: tensor input '{arg_name}' cannot have a default")
            if attrs:
                raise SchemaError(f"{text!r}: tensor input '{arg_name}' must come before the attributes")
            if variadic:
                raise SchemaError(f"{text!r}: the variadic input '{inputs[-1][0]}' must be the last tensor input")
            variadic = typ == "Tensor..."
            inputs.append((arg_name, typ == "Tensor?"))
        elif typ in _ATTR_TYPES:
            default = REQUIRED
            if len(parts) > 1:
                try:
                    default = ast.literal_eval(parts[1].strip())
                except (ValueError, SyntaxError):
                    raise SchemaError(f"{text!r}: default of '{arg_name}' is not a literal: {parts[1].strip()!r}") from None
                default = coerce_attr(typ, default, f"{text!r}: default of '{arg_name}'")
            attrs[arg_name] = (typ, default)
        else:
            raise SchemaError(f"{text!r}: unknown type {typ!r} for '{arg_name}' "
                              f"(use Tensor, Tensor?, Tensor..., {', '.join(_ATTR_TYPES)})")
    rets = rets.strip()
    if rets.startswith("(") and rets.endswith(")"):
        rets = rets[1:-1]
    outputs = []
    for k, r in enumerate(_split_commas(rets)):
        decl = r.split()
        if not decl or decl[0] != "Tensor" or len(decl) > 2:
            raise SchemaError(f"{text!r}: output {k} {r!r} must be 'Tensor' or 'Tensor name'")
        outputs.append(decl[1] if len(decl) == 2 else f"output{k}")
    if not outputs:
        raise SchemaError(f"{text!r}: an op needs at least one output")
    return CustomSchema(domain, name, inputs, attrs, outputs, text.strip(), variadic=variadic)


def _split_commas(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "[(" and 1 or (-1 if ch in "])" else 0)
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def coerce_attr(typ, value, where):
    try:
        if typ == "int":
            if isinstance(value, bool) or int(value) != value:
                raise TypeError
            return int(value)
        if typ == "float":
            return float(value)
        if typ == "str":
            if not isinstance(value, str):
                raise TypeError
            return value
        if not isinstance(value, (list, tuple)):
            raise TypeError
        inner = typ[:-2]
        return [coerce_attr(inner, v, where) for v in value]
    except (TypeError, ValueError):
        raise SchemaError(f"{where} must be {typ}, got {value!r}") from None


class GraphBuilder:
    """Builds a decomposition out of existing ops: g.Mul(a, g.Sigmoid(b)) returns names.
    g.input_types holds the node's input types (glassrt.TensorMeta: .dtype, .shape), for
    decompositions that depend on them."""

    def __init__(self, node, visible, input_types=()):
        self.node, self.visible = node, visible
        self.input_types = list(input_types)
        self.protos = []
        self.counter = 0

    def _fresh(self, hint):
        self.counter += 1
        return f"{self.node.name}/{hint}_{self.counter}"

    def op(self, op_type, *inputs, domain="", outputs=1, **attrs):
        from onnx import helper

        outs = [self._fresh(op_type) for _ in range(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.protos.append(helper.make_node(op_type, [i or "" for i in inputs], outs, domain=domain,
                                            name=self._fresh(op_type + "_node"), **attrs))
        return outs[0] if outputs == 1 else tuple(outs)

    def __getattr__(self, op_type):
        if op_type[:1].isupper():
            return lambda *inputs, **attrs: self.op(op_type, *inputs, **attrs)
        raise AttributeError(op_type)

    def constant(self, value, dtype=np.float32):
        from onnx import numpy_helper

        return self.op("Constant", value=numpy_helper.from_array(np.asarray(value, dtype=dtype)))

    def finish(self, outs):
        from onnx import helper

        from ..onnx_io import nodes_from_protos

        # Route the decomposition's results into the node's own output names.
        for res, name in zip(outs, self.node.outputs):
            if name:
                self.protos.append(helper.make_node("Identity", [res], [name], name=self._fresh("out")))
        opsets = {"": 21, self.node.domain: self.node.opset}
        return nodes_from_protos(self.protos, opsets, self.visible,
                                 f"expanded from {self.node.op_type} '{self.node.name}'")
