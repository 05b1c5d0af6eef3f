"""Graph → a standard ONNX model file: what `glassrt optimize` and
SessionOptions.optimized_model_filepath write.

The graph is written after glassrt's passes: folded constants and folded Conv weights are
plain initializers, glassrt's fused ops are calls of model-local functions whose bodies are
their decompositions (fused_functions.py). Nothing provider-specific is written: oneDNN's
weight layouts and NHWC regions are chosen when a plan is compiled, not in the graph, so
the file runs anywhere. Which composites `expand_composites` expanded depends on the
providers the passes ran with, but both forms compute the same thing.

The model's metadata_props keep the model's own entries and gain `glassrt.version`,
`glassrt.level` and `glassrt.passes` (JSON: each pass, its level, how many rewrites, nodes
before and after).

External data (`external_data=True`): initializers of at least `size_threshold` bytes go
to one side file, `<model file name>.data`, each at an offset that is a multiple of the
allocation granularity (4 KiB here), so that a loader can map it straight from the page
cache (glassrt does; onnxruntime maps aligned external data too). Tensors are written from
their arrays without an intermediate protobuf copy.
"""
from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from . import __version__, dtypes, model_file
from .fused_functions import DOMAIN, FusedFunctions, Legalizer, OptimizeError
from .ir import Graph
from .onnx_io import attribute_to_proto, to_type_proto
from .weights import mapped_paths

ALIGN = mmap.ALLOCATIONGRANULARITY
MIN_IR_VERSION = 10  # FunctionProto.overload / NodeProto.overload
_PROTOBUF_LIMIT = 2 << 30
# Element types whose ONNX raw bytes are not the array's bytes (packed 2 or 4 per byte): embedded.
_PACKED = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(TensorProto, n)}


@dataclass
class Written:
    path: str
    data_path: str | None = None
    functions: dict = field(default_factory=dict)  # op type -> overloads written
    calls: dict = field(default_factory=dict)  # op type -> nodes written as function calls
    embedded_bytes: int = 0
    external_bytes: int = 0
    external_tensors: int = 0


class _Tensors:
    """Initializers as TensorProtos, large ones appended to the side file at aligned offsets."""

    def __init__(self, data_file=None, location: str | None = None, threshold: int = 1024):
        self.file, self.location, self.threshold = data_file, location, threshold
        self.embedded = self.external = self.count = 0

    def proto(self, name: str, arr: np.ndarray) -> TensorProto:
        elem = dtypes.elem_type(arr.dtype) if arr.dtype != object else TensorProto.STRING
        if self.file is None or arr.nbytes < self.threshold or elem in _PACKED or elem == TensorProto.STRING:
            t = numpy_helper.from_array(np.asarray(arr), name)
            self.embedded += arr.nbytes
            return t
        pos = self.file.tell()
        offset = -(-pos // ALIGN) * ALIGN
        self.file.write(b"\0" * (offset - pos))
        # The array's own bytes (ONNX raw data is little-endian, as x86 and ARM hosts are).
        self.file.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
        t = TensorProto(name=name, data_type=elem, dims=list(arr.shape))
        t.raw_data = b""  # set_external_data wants the field present; it holds nothing
        set_external_data(t, self.location, offset=offset, length=arr.nbytes)
        t.ClearField("raw_data")
        self.external += arr.nbytes
        self.count += 1
        return t


def _type_proto(t):
    """to_type_proto, with dims nobody named (unk__N) written as unknown rather than by that name."""
    tp = to_type_proto(t)
    if tp is not None and tp.HasField("tensor_type"):
        for d in tp.tensor_type.shape.dim:
            if d.HasField("dim_param") and (d.dim_param.startswith("unk__") or not d.dim_param.isidentifier()):
                d.ClearField("dim_param")
    return tp


def _value_info(name, t) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto(name=name)
    tp = _type_proto(t)
    if tp is not None:
        vi.type.CopyFrom(tp)
    return vi


class _Writer:
    def __init__(self, graph: Graph, tensors: _Tensors):
        from .runtime.infer import infer

        self.opsets = {d: v for d, v in graph.opsets.items()}
        self.ir_version = max(int(graph.ir_version or 0), MIN_IR_VERSION)
        self.tensors = tensors
        self.legalizer = Legalizer(self.opsets, self.ir_version, self._plain_proto)
        self.fused = FusedFunctions(self.legalizer)
        self.old_ir = 0 < int(graph.ir_version or 0) < 4
        self.infer = infer
        self.scopes = [{}]  # the types a subgraph being written may read (innermost last)

    def _plain_proto(self, node) -> onnx.NodeProto:
        proto = helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name, domain=node.domain)
        for k, v in node.attrs.items():
            if isinstance(v, Graph):
                proto.attribute.append(helper.make_attribute(k, self.graph_proto(v, self.scopes[-1])))
            elif isinstance(v, list) and v and isinstance(v[0], Graph):
                proto.attribute.append(helper.make_attribute(k, [self.graph_proto(g, self.scopes[-1]) for g in v]))
            else:
                proto.attribute.append(attribute_to_proto(k, v))
        return proto

    def graph_proto(self, graph: Graph, outer_types: dict) -> onnx.GraphProto:
        top = not outer_types
        inputs = {vi.name: vi.type for vi in graph.inputs}
        types = {**outer_types, **self.infer(graph, inputs, outer_types=outer_types, strict=False).types}
        self.scopes.append(types)
        nodes = []
        for n in graph.nodes:
            if self.fused.handles(n):
                nodes.append(self.fused.call(n, [types.get(i) if i else None for i in n.inputs]))
            else:
                nodes += self.legalizer.protos([n], dict(types), f"{n.op_type} node '{n.name}'")
        self.scopes.pop()
        drop = set(graph.initializers) if (top and self.old_ir) else set()
        # Initializers nothing reads any more (a fusion's constants) are not written.
        read = {i for n in graph.nodes for i in [*n.inputs, *n.implicit_inputs]} | \
            {vi.name for vi in [*graph.inputs, *graph.outputs] if vi.name not in drop}
        g = helper.make_graph(
            nodes, graph.name or "main",
            [_value_info(vi.name, vi.type) for vi in graph.inputs if vi.name not in drop],
            [_value_info(vi.name, vi.type if vi.type is not None else types.get(vi.name)) for vi in graph.outputs],
            [self.tensors.proto(k, v) for k, v in graph.initializers.items() if k in read])
        return g


def to_model(graph: Graph, tensors: _Tensors | None = None, *, passes=(), level: str = "all") -> tuple:
    """(ModelProto, FusedFunctions) for `graph` (tensors embedded unless `tensors` says otherwise)."""
    w = _Writer(graph, tensors or _Tensors())
    g = w.graph_proto(graph, {})
    meta = graph.meta or {}
    g.doc_string = meta.get("graph_description", "")
    opsets = dict(w.opsets)
    if w.fused.functions:
        opsets[DOMAIN] = 1
    model = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
                              functions=list(w.fused.functions.values()), ir_version=w.ir_version,
                              producer_name=meta.get("producer_name", ""), doc_string=meta.get("description", ""),
                              domain=meta.get("domain", ""), model_version=int(meta.get("version", 0)))
    props = dict(meta.get("custom_metadata_map", {}))
    props.update({"glassrt.version": __version__, "glassrt.level": str(level),
                  "glassrt.passes": json.dumps([{"name": r.name, "level": r.level, "changes": len(r.changes),
                                                 "nodes_before": r.nodes_before, "nodes_after": r.nodes_after}
                                                for r in passes])})
    helper.set_model_props(model, props)
    return model, w.fused


def _mapped_files(graph: Graph) -> set[str]:
    """Real paths of the files the graph's arrays are mapped from (they must not be overwritten)."""
    out = set()
    for g in [graph, *(s for n in graph.walk() for s in n.subgraphs())]:
        for arr in g.initializers.values():
            name = getattr(arr, "filename", None)
            if name:
                out.add(os.path.realpath(name))
    return out


def write_model(graph: Graph, path, *, passes=(), level: str = "all", external_data: bool = False,
                size_threshold: int = 1024, source: str | None = None) -> Written:
    """Write `graph` to `path` (and `<path name>.data` beside it with external_data=True).
    Refuses to overwrite `source` (the model it was loaded from) or a file its weights are
    mapped from."""
    path = os.fspath(path)
    real = os.path.realpath(path)
    taken = _mapped_files(graph) | mapped_paths() | ({os.path.realpath(source)} if source else set())
    data_path = path + ".data" if external_data else None
    for p, what in ((path, "the output"), (data_path, "the external data file")):
        if p and os.path.realpath(p) in taken:
            raise OptimizeError(f"{what} '{p}' is the model being optimized (or holds its weights); "
                                "write the optimized model to another path")
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        raise OptimizeError(f"cannot write '{path}': folder '{folder}' does not exist")
    data_file = open(data_path, "wb") if data_path else None
    try:
        tensors = _Tensors(data_file, os.path.basename(data_path) if data_path else None, size_threshold)
        model, fused = to_model(graph, tensors, passes=passes, level=level)
    finally:
        if data_file:
            data_file.close()
    if model.ByteSize() >= _PROTOBUF_LIMIT:
        raise OptimizeError(f"the optimized model is {model.ByteSize() / 2**30:.1f} GiB with its weights inside, "
                            "over protobuf's 2 GiB; write it with external data (--external-data)")
    # Large weights inside the file start at 64-byte offsets: glassrt maps them when it loads
    # the file (onnx_io) instead of reading them.
    data = model_file.align_raw_data(model.SerializeToString())
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        # A new file under the name, not the old one rewritten: a process that maps the
        # previous version's weights keeps reading those (a truncated mapping is SIGBUS).
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OptimizeError(f"cannot write '{path}': {e}") from e
    functions = {}
    for fn in fused.functions.values():
        functions[fn.name] = functions.get(fn.name, 0) + 1
    return Written(path, data_path, functions, dict(fused.calls), tensors.embedded, tensors.external, tensors.count)
