"""Operators as contracts: schema, meta, category, backward — kept apart from kernels.

For ONNX ops the schema is the one the `onnx` package ships (`onnx.defs`; what session
creation needs of it comes from ops/schema_index.py, the full schema when asked); glassrt adds
the meta function (shape/dtype inference without data, symbolic dims kept), the
category, the decomposition of composites and, where one exists, the backward formula.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from ..errors import ShapeInferenceError, describe_node
from ..ir import Node, TensorType
from .custom_schema import CustomSchema
from .schema_index import attribute_defaults

PRIMITIVE, COMPOSITE, CUSTOM = "primitive", "composite", "custom"


@dataclass
class OpContract:
    domain: str
    op_type: str
    since_version: int
    custom_schema: Any  # a CustomSchema for glassrt's and users' ops; None for ONNX ops (see `schema`)
    meta: Callable  # (MetaContext) -> list of output types
    category: str
    values: Callable | None = None  # (MetaContext) -> list of output values, or None
    decomposition: Callable | None = None  # (node, input_types) -> list[Node]
    backward: Callable | None = None
    differentiable: bool = False
    # Output shapes that depend on input *values*, not only shapes (NonZero, Unique...).
    data_dependent: bool = False
    notes: list[str] = field(default_factory=list)
    defaults: dict | None = None  # attribute defaults; None: read from the schema when first asked
    # (min inputs, max inputs, min outputs, max outputs) and the attributes an ONNX op takes
    # (name -> AttributeProto type), from the schema table (None: not checked; custom ops'
    # schemas are looser)
    arity: tuple | None = None
    attributes: dict | None = None
    _onnx_schema: Any = field(default=None, repr=False, compare=False)  # fetched on first use

    @property
    def name(self) -> str:
        return f"{self.domain + '::' if self.domain else ''}{self.op_type}-{self.since_version}"

    @property
    def schema(self):
        """The custom schema, or onnx's OpSchema (fetched on first use: it builds onnx's registry)."""
        if self.custom_schema is not None:
            return self.custom_schema
        if self._onnx_schema is None:
            from onnx import defs

            self._onnx_schema = defs.get_schema(self.op_type, self.since_version, self.domain)
        return self._onnx_schema

    @property
    def attr_defaults(self) -> dict:
        if self.defaults is None:
            self.defaults = schema_defaults(self.schema)
        return self.defaults

    def attrs_with_defaults(self, node: Node) -> dict:
        return {**self.attr_defaults, **node.attrs}


def schema_defaults(schema) -> dict:
    if isinstance(schema, CustomSchema):
        return dict(schema.defaults)
    return _onnx_defaults(schema.domain, schema.name, schema.since_version)  # onnx's OpSchema


@lru_cache(maxsize=None)
def _onnx_defaults(domain, name, version) -> dict:
    from onnx import defs

    return attribute_defaults(defs.get_schema(name, version, domain))


class MetaContext:
    """What a meta function sees: attributes, input types and any known input values.

    A known value is a NumPy array: concrete (an initializer, a folded constant) or, for
    small integer tensors such as a Shape output, an object array whose entries may be
    symbolic dims. That is how Reshape(x, Shape(y)) keeps `batch` symbolic.
    """

    __slots__ = ("node", "contract", "attrs", "input_types", "input_values", "opset", "infer_subgraph")

    def __init__(self, node, contract, input_types, input_values, infer_subgraph=None):
        self.node = node
        self.contract = contract
        self.attrs = contract.attrs_with_defaults(node)
        self.input_types = input_types
        self.input_values = input_values
        self.opset = node.opset
        # (graph, input_types, outer_types) -> output types; for If/Loop/Scan.
        self.infer_subgraph = infer_subgraph

    @property
    def n_inputs(self):
        return len(self.input_types)

    def has(self, i) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def type(self, i):
        return self.input_types[i] if i < len(self.input_types) else None

    def shape(self, i):
        t = self.type(i)
        return t.shape if isinstance(t, TensorType) else None

    def dtype(self, i):
        t = self.type(i)
        if not isinstance(t, TensorType):
            self.fail(f"input {i} '{self.node.inputs[i] if i < len(self.node.inputs) else ''}' must be a tensor, got {t}")
        return t.dtype

    def rank(self, i):
        s = self.shape(i)
        return None if s is None else len(s)

    def value(self, i):
        """The known value of input i (concrete or symbolic), or None."""
        return self.input_values[i] if i < len(self.input_values) else None

    def const(self, i):
        """The input's value as a concrete array, or None (unknown or symbolic)."""
        v = self.value(i)
        if v is None:
            return None
        if v.dtype == object and v.size and not all(isinstance(x, (int, np.integer)) for x in v.flat):
            if self.dtype(i) != np.dtype(object):
                return None
        if v.dtype == object and self.dtype(i) != np.dtype(object):
            return v.astype(self.dtype(i))
        return v

    def attr(self, name, default=None):
        v = self.attrs.get(name, default)
        return default if v is None else v

    def fail(self, message: str):
        raise ShapeInferenceError(f"{describe_node(self.node)}: {message}")

    def tensor(self, dtype, shape):
        return TensorType(np.dtype(dtype), None if shape is None else tuple(shape))
