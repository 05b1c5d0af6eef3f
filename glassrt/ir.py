"""glassrt's own small IR: a Graph of Nodes over named values with types.

The `onnx` package parses the protobuf (onnx_io.py); everything after loading works on
these plain objects, which `explain` can print. Values are referred to by name; a
missing optional input is the empty string, as in ONNX.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from . import dtypes, symbolic

# ---------------------------------------------------------------- types


@dataclass(frozen=True)
class TensorType:
    dtype: np.dtype
    shape: tuple | None  # None: rank unknown; dims are int or symbolic.Dim

    @property
    def rank(self):
        return None if self.shape is None else len(self.shape)

    @cached_property  # (asked thousands of times while a model is placed and planned)
    def is_static(self) -> bool:
        return symbolic.all_static(self.shape)

    def nbytes(self):
        """Bytes as a dim (an int once the shape is concrete)."""
        return symbolic.prod(self.shape) * dtypes.itemsize(self.dtype)

    def __str__(self):
        return f"{dtypes.name(self.dtype)}{symbolic.shape_str(self.shape)}"


@dataclass(frozen=True)
class SequenceType:
    elem: Any  # a type, or None when unknown

    def __str__(self):
        return f"seq({self.elem or '?'})"


@dataclass(frozen=True)
class OptionalType:
    elem: Any

    def __str__(self):
        return f"optional({self.elem or '?'})"


@dataclass(frozen=True)
class MapType:
    """map(key, value): ai.onnx.ml's maps (ZipMap's outputs, DictVectorizer's inputs). At
    run time a Python dict, keys int (int64) or str (string), as onnxruntime returns them."""
    key: np.dtype  # int64 or object (string)
    value: Any  # a type, or None when unknown

    def __str__(self):
        return f"map({dtypes.name(self.key)},{self.value or '?'})"


def type_str(t) -> str:
    return "?" if t is None else str(t)


def merge_types(a, b):
    """The most precise type both a and b are instances of (dims that differ become fresh
    symbols; None when they share nothing)."""
    if a is None or b is None:
        return None
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        if a.dtype != b.dtype:
            return None
        if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
            return TensorType(a.dtype, None)
        return TensorType(a.dtype, tuple(x if x == y else symbolic.fresh() for x, y in zip(a.shape, b.shape)))
    if type(a) is type(b) and isinstance(a, (SequenceType, OptionalType)):
        return type(a)(merge_types(a.elem, b.elem))
    if isinstance(a, MapType) and isinstance(b, MapType) and a.key == b.key:
        return MapType(a.key, merge_types(a.value, b.value))
    return None


def alike_arrays(v: list):
    """The first element of a sequence whose elements are all arrays of one shape and dtype
    (a Loop's accumulated outputs), else None: its type, and its part of a plan's signature,
    then need no pass that merges them one by one."""
    x0 = v[0] if v else None
    if type(x0) is np.ndarray and all(type(x) is np.ndarray and x.shape == x0.shape and x.dtype == x0.dtype for x in v):
        return x0
    return None


def type_of_value(v):
    """The type of a run-time value: an array's dtype and shape, a list's element type."""
    if isinstance(v, np.ndarray):
        return TensorType(v.dtype, tuple(v.shape))
    if isinstance(v, list):
        x0 = alike_arrays(v)
        if x0 is not None:
            return SequenceType(TensorType(x0.dtype, tuple(x0.shape)))  # (no merging one by one)
        elem = type_of_value(v[0]) if v else None
        for x in v[1:]:
            elem = merge_types(elem, type_of_value(x))
        return SequenceType(elem)
    if isinstance(v, dict):
        # Keys are Python ints or strs; values Python floats, whose ONNX type (float or
        # double) the dict does not say.
        key = next(iter(v), None)
        return MapType(np.dtype(object) if isinstance(key, str) else np.dtype(np.int64), None)
    return None


# ---------------------------------------------------------------- graph


@dataclass
class Node:
    op_type: str
    domain: str  # "" for the default ONNX domain
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]  # Python values; subgraphs are Graph objects
    name: str
    opset: int  # the version of `domain` this node was written against
    # Outer-scope values a subgraph attribute reads; filled in by onnx_io so that
    # lifetimes and the memory plan see them as inputs of this node.
    implicit_inputs: list[str] = field(default_factory=list)
    # Where the node came from when a pass created it (e.g. "expanded from LayerNormalization 'ln'").
    origin: str = ""

    @property
    def key(self):
        return (self.domain, self.op_type)

    def subgraphs(self):
        """An iterator over the node's subgraph attributes (If's branches, a loop's body).
        (Not a generator: asked of every node by inference, folding and the passes, most
        with no attribute that holds one.)"""
        found = []
        for v in self.attrs.values():
            if isinstance(v, Graph):
                found.append(v)
            elif isinstance(v, list) and v and isinstance(v[0], Graph):  # (a GRAPHS attribute holds graphs only)
                found += [g for g in v if isinstance(g, Graph)]
        return iter(found)

    def __repr__(self):
        return f"Node({self.op_type} '{self.name}': {self.inputs} -> {self.outputs})"


@dataclass
class ValueInfo:
    name: str
    type: Any  # TensorType | SequenceType | OptionalType | MapType | None


@dataclass
class Graph:
    name: str
    nodes: list[Node]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    initializers: dict[str, np.ndarray]
    # Types known for any value (declared value_info, then whatever inference adds).
    types: dict[str, Any] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=dict)
    # Names this graph reads from an enclosing graph (subgraphs only).
    outer_names: list[str] = field(default_factory=list)
    doc: str = ""
    ir_version: int = 0
    meta: dict = field(default_factory=dict)  # the model's producer, version, metadata_props (ModelMeta)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in [*n.inputs, *n.implicit_inputs]:
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def input_names(self) -> list[str]:
        """Inputs a caller must feed: declared inputs that are not also initializers."""
        return [v.name for v in self.inputs if v.name not in self.initializers]

    def overridable(self) -> set[str]:
        """Initializers a caller may replace by feeding them: those also listed as graph
        inputs, from IR version 4 on (before it every initializer had to be listed as an
        input, and all are constants — onnxruntime reads them the same way)."""
        if self.ir_version and self.ir_version < 4:
            return set()
        return {v.name for v in self.inputs} & set(self.initializers)

    def constants(self) -> dict:
        over = self.overridable()
        return {k: v for k, v in self.initializers.items() if k not in over}

    def output_names(self) -> list[str]:
        return [v.name for v in self.outputs]

    def reads_from_outside(self) -> list[str]:
        """The names this (sub)graph reads from its enclosing scopes, its nested bodies' reads
        included (their nodes' implicit inputs), in first-read order: its `outer_names`
        (onnx_io records them at load; passes/bodies.py again after a body's passes)."""
        own = {v.name for v in self.inputs} | set(self.initializers) | {o for n in self.nodes for o in n.outputs if o}
        # (a dict, not a list: a list's membership test is quadratic in the reads)
        reads = {i: None for n in self.nodes for i in [*n.inputs, *n.implicit_inputs] if i and i not in own}
        reads.update((v.name, None) for v in self.outputs if v.name not in own)
        return list(reads)

    def walk(self):
        """Every node of this graph and of its subgraphs, depth first."""
        for n in self.nodes:
            yield n
            for g in n.subgraphs():
                yield from g.walk()
