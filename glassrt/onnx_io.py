"""ModelProto → Graph: parsing, external data, and the safety checks.

Loading runs no code from the model and reads no file outside the model's folder:
external data locations that are absolute, climb out with ``..`` or resolve through a
symlink to somewhere else are refused.
"""
from __future__ import annotations

import functools
import heapq
import math
import os
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from . import dtypes, symbolic
from .proto import AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, SparseTensorProto, TensorProto, \
    TypeProto
from .errors import InvalidModelError, ModelLoadError, UnsafeModelError
from .ir import Graph, MapType, Node, OptionalType, SequenceType, TensorType, ValueInfo

DEFAULT_DOMAINS = ("", "ai.onnx")


def read_model(model) -> tuple[ModelProto, str | None]:
    """A path, bytes or ModelProto → (ModelProto, folder external data may be read from)."""
    if isinstance(model, ModelProto):
        return model, None
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _parse_bytes(bytes(model), "<bytes>"), None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise ModelLoadError(f"model file not found: '{path}'")
        if not path.is_file():
            raise ModelLoadError(f"model path is not a file: '{path}'")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ModelLoadError(f"cannot read model file '{path}': {e}") from e
        return _parse_bytes(data, str(path)), str(path.resolve().parent)
    raise ModelLoadError(f"expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def _parse_bytes(data: bytes, where: str) -> ModelProto:
    if not data:
        raise ModelLoadError(f"{where}: empty file, not an ONNX model")
    proto = ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{where}: not a valid ONNX model (protobuf parse failed: {e}); "
                             "the file may be truncated or not an ONNX file") from e
    # Protobuf is lenient: arbitrary bytes sometimes parse into an empty message.
    if not proto.HasField("graph") or (not proto.opset_import and not proto.graph.node):
        raise ModelLoadError(f"{where}: not an ONNX model (no graph or opset_import found; "
                             "the file may be truncated or not an ONNX file)")
    return proto


def load(model, base_dir: str | None = None) -> Graph:
    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        # Large raw_data tensors are read from the file into their arrays (model_file.py).
        from . import model_file

        stripped = model_file.strip(os.fspath(model))
        if stripped is not None:
            proto = _parse_bytes(stripped[0], os.fspath(model))
            # A file `glassrt optimize` wrote (weights aligned, written once for deployment) has
            # its large weights mapped where they lie; any other file's are read (model_file.py).
            mapped = any(p.key == "glassrt.version" for p in proto.metadata_props)
            raw = (os.fspath(model), stripped[1], mapped)
            return from_proto(proto, base_dir or str(Path(model).resolve().parent), raw=raw)
    proto, folder = read_model(model)
    return from_proto(proto, base_dir or folder)


def from_proto(proto: ModelProto, base_dir: str | None, raw: tuple | None = None) -> Graph:
    """raw: (model path, {initializer name: (offset, length)} of the raw_data model_file.strip
    took out, whether to map those that are aligned rather than read them)."""
    opsets = {}
    for imp in proto.opset_import:
        domain = "" if imp.domain in DEFAULT_DOMAINS else imp.domain
        opsets[domain] = int(imp.version)
    if "" not in opsets and any(n.domain in DEFAULT_DOMAINS for n in proto.graph.node):
        raise InvalidModelError("model has no opset_import for the default ONNX domain")
    if proto.functions:
        # glassrt's own fused ops, written as functions by `glassrt optimize` (export.py), stay
        # nodes that run their fused kernels; every other model-local function is inlined.
        own = sorted({(f.domain, f.name) for f in proto.functions if _own_function(f, opsets)})
        if len(own) < len({(f.domain, f.name) for f in proto.functions}):
            import onnx.inliner

            try:
                proto = onnx.inliner.inline_selected_functions(proto, own, exclude=True)
            except Exception as e:  # the inliner reports malformed functions
                raise InvalidModelError(f"cannot inline the model's local functions: {e}") from e
    parser = _Parser(opsets, base_dir, raw)
    graph = parser.graph(proto.graph, outer=frozenset())
    graph.doc = proto.doc_string
    graph.ir_version = int(proto.ir_version)
    graph.meta = {"producer_name": _text(proto.producer_name, "producer_name"),
                  "graph_name": _text(proto.graph.name, "graph name"),
                  "domain": _text(proto.domain, "domain"),
                  "description": _text(proto.doc_string, "doc_string"),
                  "graph_description": _text(proto.graph.doc_string, "graph doc_string"),
                  "version": int(proto.model_version),
                  "custom_metadata_map": {_text(p.key, "metadata key"): _text(p.value, "metadata value")
                                          for p in proto.metadata_props}}
    return graph


def _own_function(f: FunctionProto, opsets: dict) -> bool:
    """A function for one of glassrt's fused ops (domain "glassrt", a contract with a decomposition)."""
    if f.domain != "glassrt" or "glassrt" not in opsets:
        return False
    from .ops.registry import get_contract

    contract = get_contract("glassrt", f.name, opsets["glassrt"])
    return contract is not None and contract.decomposition is not None


# ---------------------------------------------------------------- parsing

_SCALAR_FIELDS = {AttributeProto.FLOAT: "f", AttributeProto.INT: "i", AttributeProto.STRING: "s"}
_LIST_FIELDS = {AttributeProto.FLOATS: "floats", AttributeProto.INTS: "ints", AttributeProto.STRINGS: "strings"}


def _text(value, where: str) -> str:
    """A string field of the protobuf. ONNX uses proto2, so invalid UTF-8 parses and comes
    back as bytes: such a model is refused rather than carried around half-decoded."""
    if isinstance(value, str):
        return value
    raise InvalidModelError(f"{where}: not valid UTF-8 text ({bytes(value)[:40]!r})")


_DATA_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _stripped(t: TensorProto) -> bool:
    """Whether `t` is the initializer whose raw_data model_file.strip took out (no data of
    any kind left in the message), not another of the same name that holds its own."""
    return not t.HasField("raw_data") and t.data_location != TensorProto.EXTERNAL and \
        not any(len(getattr(t, f)) for f in _DATA_FIELDS)


def _texts(values, where: str) -> list[str]:
    values = list(values)
    try:
        "".join(values)  # (the common case, all str, checked in one call: bytes raise TypeError)
        return values
    except TypeError:
        return [_text(v, where) for v in values]


class _Parser:
    def __init__(self, opsets: dict[str, int], base_dir: str | None, raw: tuple | None = None):
        self.opsets = opsets
        self.base_dir = base_dir
        self.raw_path, self.raw, self.map_raw = raw if raw else (None, {}, False)

    def graph(self, g: GraphProto, outer: frozenset[str]) -> Graph:
        _texts([vi.name for vi in [*g.input, *g.output, *g.value_info]], f"graph '{g.name}' value name")
        initializers = list(g.initializer)  # (each pass over a repeated field makes its wrappers again)
        names = _texts([t.name for t in initializers], f"graph '{g.name}' initializer name")
        inits = {}
        stripped = self.raw if not outer else {}  # (model_file.strip walks the top graph only)
        for name, t in zip(names, initializers):  # (a name given twice: the last one, as onnxruntime says)
            if name in stripped and _stripped(t):
                inits[name] = self._read_raw(t, f"initializer '{name}'")
            else:
                inits[name] = self.tensor(t, f"initializer '{name}'")
        for st in g.sparse_initializer:
            inits[st.values.name] = self.sparse_tensor(st, f"sparse initializer '{st.values.name}'")
        types = {vi.name: parse_type(vi.type, vi.name) for vi in g.value_info}
        inputs = [ValueInfo(vi.name, parse_type(vi.type, vi.name)) for vi in g.input]
        outputs = [ValueInfo(vi.name, parse_type(vi.type, vi.name)) for vi in g.output]
        for vi in [*inputs, *outputs]:
            if vi.type is not None:
                types[vi.name] = vi.type
        for name, arr in inits.items():
            types.setdefault(name, _type_of_array(arr))

        node_protos = list(g.node)
        nodes = []
        used_names: set[str] = set()
        scope = []

        def visible() -> frozenset:
            """What subgraphs may read from here (worked out for the first subgraph only)."""
            if not scope:
                scope.append(frozenset(set(outer) | {v.name for v in inputs} | set(inits)
                                       | {o for m in node_protos for o in m.output}))
            return scope[0]

        for i, n in enumerate(node_protos):
            nodes.append(self.node(n, i, used_names, visible))
        graph = Graph(name=g.name, nodes=nodes, inputs=inputs, outputs=outputs,
                      initializers=inits, types=types, opsets=dict(self.opsets))
        _check_and_sort(graph, outer)
        return graph

    def node(self, n: NodeProto, index: int, used_names: set[str], visible) -> Node:
        where = f"node {index}"
        op_type, raw_domain, raw_name = _text(n.op_type, where), _text(n.domain, where), _text(n.name, where)
        inputs, outputs = _texts(n.input, where), _texts(n.output, where)
        attributes = list(n.attribute)  # (each pass over a repeated field makes its wrappers again)
        _texts([a.name for a in attributes], where)
        if not op_type:
            raise InvalidModelError(f"node {index} ('{raw_name}') has no op_type")
        domain = "" if raw_domain in DEFAULT_DOMAINS else raw_domain
        name = raw_name or f"{op_type}_{index}"
        while name in used_names:  # ORT also tolerates duplicate node names; we keep them apart
            name = f"{name}_{index}"
        used_names.add(name)
        if domain not in self.opsets:
            raise InvalidModelError(
                f"{op_type} node '{name}' uses domain '{domain}', which the model does not "
                f"import (opset_import has: {sorted(self.opsets) or 'nothing'})")
        attrs, implicit = {}, []
        for a in attributes:
            where = f"{op_type} node '{name}' attribute '{a.name}'"
            if a.ref_attr_name:
                raise InvalidModelError(f"{where} refers to a function attribute outside a function")
            if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                subs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
                parsed = [self.graph(sg, visible()) for sg in subs]
                for sg in parsed:
                    implicit += [x for x in sg.outer_names if x not in implicit]
                attrs[a.name] = parsed[0] if a.type == AttributeProto.GRAPH else parsed
            else:
                attrs[a.name] = self.attribute(a, where)
        return Node(op_type=op_type, domain=domain, inputs=inputs, outputs=outputs,
                    attrs=attrs, name=name, opset=self.opsets[domain], implicit_inputs=implicit)

    def attribute(self, a: AttributeProto, where: str):
        A = AttributeProto
        if a.type == A.TENSOR:
            return self.tensor(a.t, where)
        if a.type == A.TENSORS:
            return [self.tensor(t, where) for t in a.tensors]
        if a.type == A.SPARSE_TENSOR:
            return self.sparse_tensor(a.sparse_tensor, where)
        if a.type == A.SPARSE_TENSORS:
            return [self.sparse_tensor(t, where) for t in a.sparse_tensors]
        if a.type == A.TYPE_PROTO:
            return parse_type(a.tp, where)
        if a.type == A.TYPE_PROTOS:
            return [parse_type(t, where) for t in a.type_protos]
        # the plain types, as onnx.helper.get_attribute_value gives them (read here: loading
        # a model does not import the onnx package, glassrt/proto.py)
        if a.type in _SCALAR_FIELDS:
            value = getattr(a, _SCALAR_FIELDS[a.type])
        elif a.type in _LIST_FIELDS:
            value = list(getattr(a, _LIST_FIELDS[a.type]))
        elif a.type == A.UNDEFINED:
            value = None
        else:
            raise InvalidModelError(f"{where}: unreadable attribute (unknown attribute type {a.type})")
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        if isinstance(value, list) and value and isinstance(value[0], bytes):
            return [v.decode("utf-8", errors="replace") for v in value]
        return value

    # -------------------------------------------------------- tensors

    def tensor(self, t: TensorProto, where: str) -> np.ndarray:
        if t.data_location == TensorProto.EXTERNAL:
            mapped = self._mapped(t, where)
            if mapped is not None:
                return mapped
            t = self._with_external_data(t, where)
        data_type, shape = t.data_type, tuple(t.dims)
        if data_type == TensorProto.UNDEFINED or data_type not in _ELEMENT_TYPES:
            raise InvalidModelError(f"{where}: unknown element type {data_type}")
        if shape and min(shape) < 0:
            raise InvalidModelError(f"{where}: negative dimension in {list(shape)}")
        dtype = _mappable_dtype(data_type)
        if dtype is not None and t.HasField("raw_data"):
            # The bytes are the array's (as for a mapped or read weight): a read-only view of
            # them, not numpy_helper's copy (a dense model has hundreds of small initializers).
            raw = t.raw_data
            nbytes = math.prod(shape) * dtype.itemsize  # (Python ints: no wrap-around on hostile dims)
            if len(raw) != nbytes:
                raise InvalidModelError(f"{where}: tensor data does not match its declared type "
                                        f"{TensorProto.DataType.Name(t.data_type)} and shape {list(shape)} "
                                        f"({len(raw)} bytes of raw data, {nbytes} needed)")
            return np.frombuffer(raw, dtype).reshape(shape)
        try:
            arr = _typed_field_array(t, dtype, shape)
            if arr is None:  # packed, 8-bit float, bfloat16, complex, string: onnx decodes them
                from onnx import numpy_helper

                arr = numpy_helper.to_array(t)
        except Exception as e:
            raise InvalidModelError(
                f"{where}: tensor data does not match its declared type "
                f"{TensorProto.DataType.Name(t.data_type)} and shape {list(t.dims)} ({e})") from e
        return arr

    def sparse_tensor(self, st: SparseTensorProto, where: str) -> np.ndarray:
        values = self.tensor(st.values, where)
        indices = self.tensor(st.indices, where)
        dims = [int(d) for d in st.dims]
        if any(d < 0 for d in dims):
            raise InvalidModelError(f"{where}: negative dimension in {dims}")
        # (the spec's layout: values [NNZ], indices [NNZ] into the flattened tensor or [NNZ, rank])
        nnz = values.shape[0] if values.ndim == 1 else -1
        if nnz < 0 or indices.dtype.kind not in "iu" or indices.shape not in ((nnz,), (nnz, len(dims))):
            raise InvalidModelError(
                f"{where}: a sparse tensor needs values of shape [NNZ] and integer indices of shape [NNZ] or "
                f"[NNZ, {len(dims)}] (its dims {dims}); got values {values.dtype}{list(values.shape)}, indices "
                f"{indices.dtype}{list(indices.shape)}")
        indices = indices.astype(np.int64)
        nbytes = int(np.prod(dims, dtype=np.float64)) * values.dtype.itemsize
        if nbytes > _physical_memory():
            raise InvalidModelError(f"{where}: a sparse tensor of shape {dims} would take {nbytes:,} bytes dense, "
                                    "more than this machine's memory")
        try:
            dense = np.zeros(dims, dtype=values.dtype)
        except MemoryError:  # (within the machine's memory, beyond what this process may map)
            raise InvalidModelError(f"{where}: a sparse tensor of shape {dims} would take {nbytes:,} bytes dense, "
                                    "more than this process can allocate") from None
        if values.size:
            if indices.ndim == 1:  # linearized indices
                if indices.min() < 0 or indices.max() >= dense.size:
                    raise InvalidModelError(f"{where}: sparse index out of range")
                dense.reshape(-1)[indices] = values
            else:
                if (indices < 0).any() or (indices >= np.array(dims)).any():
                    raise InvalidModelError(f"{where}: sparse index out of range")
                dense[tuple(indices.T)] = values
        return dense

    def _external_range(self, t: TensorProto, where: str) -> tuple[str, int, int]:
        """(real path, offset, length) of a tensor's external data, after the path checks."""
        info = {_text(e.key, f"{where}: external_data key"): e.value for e in t.external_data}
        location = info.get("location", "")
        if self.base_dir is None:
            raise UnsafeModelError(
                f"{where}: stored in external file '{location}', but the model was not loaded "
                "from a path, so there is no model folder to read it from")
        path = resolve_external_path(self.base_dir, location, where)
        size = os.path.getsize(path)
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else size - offset
        except ValueError as e:
            raise InvalidModelError(f"{where}: bad external data offset/length ({e})") from e
        if offset < 0 or length < 0 or offset + length > size:
            raise InvalidModelError(
                f"{where}: external data range [{offset}, {offset + length}) lies outside "
                f"'{location}' ({size} bytes)")
        return path, offset, length

    def _mapped(self, t: TensorProto, where: str) -> np.ndarray | None:
        """The tensor as a read-only view of its external file, mapped (weights.py), or None
        where its bytes are not the array's (packed 4-bit types, strings, a big-endian host,
        an offset the dtype cannot be read at: read and copied as before)."""
        from .weights import map_file

        dtype = _mappable_dtype(t.data_type)
        if dtype is None or any(d < 0 for d in t.dims):
            return None  # tensor() reports what is wrong
        path, offset, length = self._external_range(t, where)
        shape = tuple(int(d) for d in t.dims)
        nbytes = math.prod(shape) * dtype.itemsize  # (Python ints: no wrap-around on hostile dims)
        if length != nbytes:
            raise InvalidModelError(f"{where}: external data holds {length} bytes, but its type "
                                    f"{TensorProto.DataType.Name(t.data_type)} and shape {list(shape)} need {nbytes}")
        if offset % dtype.alignment:
            return None
        if nbytes == 0:
            return np.zeros(shape, dtype)
        return map_file(path)[offset:offset + nbytes].view(dtype).reshape(shape)

    def _read_raw(self, t: TensorProto, where: str) -> np.ndarray:
        """A tensor whose raw_data model_file.strip left in the file: mapped where glassrt
        wrote the file (aligned: model_file.align_raw_data), else read into its array."""
        from . import model_file
        from .model_file import read_into

        offset, length = self.raw[t.name]
        dtype = _mappable_dtype(t.data_type)
        if dtype is None or any(d < 0 for d in t.dims):  # packed 4-bit, strings...: as protobuf would
            with open(self.raw_path, "rb") as f:
                f.seek(offset)
                t.raw_data = f.read(length)
            return self.tensor(t, where)
        shape = tuple(int(d) for d in t.dims)
        nbytes = math.prod(shape) * dtype.itemsize  # (Python ints: no wrap-around on hostile dims)
        if length != nbytes:
            raise InvalidModelError(f"{where}: tensor data does not match its declared type "
                                    f"{TensorProto.DataType.Name(t.data_type)} and shape {list(shape)} "
                                    f"({length} bytes of raw data, {nbytes} needed)")
        if self.map_raw and offset % model_file.ALIGN == 0:
            from .weights import map_file

            try:
                return map_file(self.raw_path)[offset:offset + nbytes].view(dtype).reshape(shape)
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"{where}: cannot map its data from '{self.raw_path}': {e}") from e
        arr = _weight_array(shape, dtype, nbytes)
        try:
            read_into(self.raw_path, offset, arr)
        except OSError as e:
            raise ModelLoadError(f"{where}: cannot read its data from '{self.raw_path}': {e}") from e
        arr.flags.writeable = False  # as mapped weights are: a kernel writing into a weight fails loudly
        return arr

    def _with_external_data(self, t: TensorProto, where: str) -> TensorProto:
        path, offset, length = self._external_range(t, where)
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(length)
        inline = TensorProto()
        inline.CopyFrom(t)
        del inline.external_data[:]
        inline.data_location = TensorProto.DEFAULT
        inline.raw_data = raw
        return inline


_ELEMENT_TYPES = frozenset(TensorProto.DataType.values())


def _weight_array(shape, dtype, nbytes: int) -> np.ndarray:
    """An array for weights read from the model file. A large one is mapped on small pages
    (pages.os_buffer; promote leaves it unless a kernel reads it where it lies), not by
    NumPy, which asks huge pages for 4 MiB and more: most weights are packed on a plan's
    first run and never read again, and where the host takes back freed guest memory a huge
    page costs more to touch first (pages.py; GPT-2's 616 MB loaded in 2.8-4.7 s on huge
    pages, 0.5-0.7 s on small, alternating processes)."""
    from .pages import HUGE_PAGE, os_buffer

    if nbytes < HUGE_PAGE:
        return np.empty(shape, dtype)
    return os_buffer(nbytes, promoted=False).view(dtype).reshape(shape)


# Element types whose typed field NumPy decodes alone, as onnx.numpy_helper.to_array does:
# {type: (field, the field's values as, then how they become the element type)}. Scales and
# zero points (quantization tools write them so) and small constants are stored this way;
# importing onnx to decode them cost ~30 ms of a session's creation (numpy_helper imports
# the package). The rest (bfloat16, 8- and 4-bit floats, packed ints, complex, strings) go
# to numpy_helper.
def _typed_fields() -> dict:
    T = TensorProto
    via_u16 = lambda dt: lambda a: a.view(np.uint32).astype(np.uint16).view(dt)  # noqa: E731
    return {T.FLOAT: ("float_data", np.float32, None), T.DOUBLE: ("double_data", np.float64, None),
            T.INT64: ("int64_data", np.int64, None), T.INT32: ("int32_data", np.int32, None),
            T.INT8: ("int32_data", np.int32, lambda a: a.astype(np.int8)),
            T.UINT8: ("int32_data", np.int32, lambda a: a.astype(np.uint8)),
            T.INT16: ("int32_data", np.int32, via_u16(np.int16)),
            T.UINT16: ("int32_data", np.int32, via_u16(np.uint16)),
            T.FLOAT16: ("int32_data", np.int32, via_u16(np.float16)),
            T.BOOL: ("int32_data", np.int32, lambda a: a != 0),  # (any value but 0 is true, as onnxruntime reads it)
            T.UINT32: ("uint64_data", np.uint64, lambda a: a.astype(np.uint32)),
            T.UINT64: ("uint64_data", np.uint64, None)}


_TYPED_FIELDS = _typed_fields()


def _typed_field_array(t: TensorProto, dtype, shape) -> np.ndarray | None:
    """The tensor from its typed field (float_data, int32_data...), or None where
    numpy_helper must decode it. A count that does not fit the shape raises ValueError."""
    how = _TYPED_FIELDS.get(t.data_type) if dtype is not None else None
    if how is None:
        return None
    field, stored, convert = how
    values = getattr(t, field)
    n = len(values)
    # (a few values, a quantized model's scales and zero points, one by one: np.asarray over
    # protobuf's container took 2-4 us a tensor, fromiter 0.4)
    a = np.fromiter(values, stored, n) if n <= 64 else np.asarray(values, stored)
    return (a if convert is None else convert(a)).reshape(shape)


@functools.lru_cache(maxsize=None)
def _mappable_dtype(data_type: int) -> np.dtype | None:
    """The NumPy dtype whose bytes are ONNX's raw data of this element type, or None."""
    import sys

    packed = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(TensorProto, n)}
    if sys.byteorder != "little" or data_type in packed or data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        return dtypes.np_dtype(data_type)
    except (KeyError, TypeError, ValueError):
        return None


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def resolve_external_path(base_dir: str, location: str, where: str) -> str:
    """The real path of an external data file, refused unless it lies inside base_dir."""
    if not location:
        raise InvalidModelError(f"{where}: external data without a location")
    location = _text(location, f"{where}: external data location")
    if "\0" in location:  # (C strings end there: no file name holds one)
        raise InvalidModelError(f"{where}: external data location {location!r} holds a NUL character")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
        raise UnsafeModelError(f"{where}: external data location '{location}' is absolute; "
                               "only files inside the model's folder may be read")
    parts = Path(location.replace("\\", "/")).parts
    if ".." in parts:
        raise UnsafeModelError(f"{where}: external data location '{location}' climbs out of "
                               "the model's folder with '..'")
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root:
        raise UnsafeModelError(f"{where}: external data location '{location}' resolves to "
                               f"'{path}', outside the model's folder (a symlink?)")
    if not os.path.isfile(path):
        raise InvalidModelError(f"{where}: external data file '{location}' not found in the model's folder")
    return path


# ---------------------------------------------------------------- types


def _placeholder(name: str) -> bool:
    """A dim name that says "unknown" rather than naming a dim: paddle2onnx writes '?' for
    every dynamic dim (rapidocr's classifier: [-1, 3, '?', '?'], fed 48x192), others 'None'.
    Such dims get a fresh symbol each, as onnxruntime does not hold them equal."""
    return name.strip().lower() in ("none", "null", "unknown", "dynamic") or not any(c.isalnum() for c in name)


def parse_type(tp: TypeProto, where: str = ""):
    kind = tp.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(tp, kind)
        if tt.elem_type == TensorProto.UNDEFINED:
            return None
        try:
            dt = dtypes.np_dtype(tt.elem_type)
        except KeyError:
            raise InvalidModelError(f"'{where}': unknown element type {tt.elem_type}") from None
        if not tt.HasField("shape"):
            return TensorType(dt, None)
        dims = []
        for d in tt.shape.dim:
            which = d.WhichOneof("value")
            if which == "dim_value" and d.dim_value < 0:
                # Paddle's exporter writes -1 for a dynamic dim; onnxruntime reads it as
                # unknown, and so does glassrt (the dim gets a fresh symbol).
                dims.append(symbolic.fresh())
            elif which == "dim_value":
                dims.append(int(d.dim_value))
            elif which == "dim_param" and d.dim_param and not _placeholder(_text(d.dim_param, f"'{where}' dim_param")):
                dims.append(symbolic.symbol(d.dim_param))
            else:
                dims.append(symbolic.fresh())
        return TensorType(dt, tuple(dims))
    if kind == "sequence_type":
        return SequenceType(parse_type(tp.sequence_type.elem_type, where) if tp.sequence_type.HasField("elem_type") else None)
    if kind == "optional_type":
        return OptionalType(parse_type(tp.optional_type.elem_type, where) if tp.optional_type.HasField("elem_type") else None)
    if kind == "map_type":
        mt = tp.map_type
        try:
            key = dtypes.np_dtype(mt.key_type)
        except KeyError:
            raise InvalidModelError(f"'{where}': unknown map key type {mt.key_type}") from None
        if key.kind not in "iuO":  # the spec's keys: integers and strings
            raise InvalidModelError(f"'{where}': a map key must be an integer or a string, got {dtypes.name(key)}")
        return MapType(key, parse_type(mt.value_type, where) if mt.HasField("value_type") else None)
    return None  # unset types: unknown


def to_type_proto(t) -> TypeProto | None:
    """glassrt type → TypeProto (symbolic dims become dim_params named by their text)."""
    from onnx import helper

    if t is None:
        return None
    if isinstance(t, TensorType):
        if t.shape is None:
            return helper.make_tensor_type_proto(dtypes.elem_type(t.dtype), None)
        dims = [d if isinstance(d, int) else str(d) for d in t.shape]
        tp = helper.make_tensor_type_proto(dtypes.elem_type(t.dtype), dims)
        tp.tensor_type.shape.SetInParent()  # rank 0 must read as a scalar, not as unknown rank
        return tp
    if isinstance(t, SequenceType):
        inner = to_type_proto(t.elem)
        if inner is None:
            return None
        return helper.make_sequence_type_proto(inner)
    if isinstance(t, OptionalType):
        inner = to_type_proto(t.elem)
        if inner is None:
            return None
        return helper.make_optional_type_proto(inner)
    if isinstance(t, MapType):
        inner = to_type_proto(t.value)
        if inner is None:
            return None
        return helper.make_map_type_proto(dtypes.elem_type(t.key), inner)
    return None


def _type_of_array(arr: np.ndarray) -> TensorType:
    return TensorType(arr.dtype if arr.dtype.kind not in "US" else np.dtype(object), arr.shape)


# ---------------------------------------------------------------- structure


def _check_and_sort(graph: Graph, outer: frozenset[str]) -> None:
    """Every input defined once, no cycles; nodes put in a valid order (ORT sorts too)."""
    defined_by: dict = {}  # value -> "graph input", "initializer" or its node
    for v in graph.inputs:
        if v.name in defined_by:
            raise InvalidModelError(f"graph input '{v.name}' is declared twice")
        defined_by[v.name] = "graph input"
        init = graph.initializers.get(v.name)
        t = v.type
        # (an initializer that is also an input, as IR < 4 writes every one: its default value,
        # which must be of the type the input declares)
        if isinstance(init, np.ndarray) and isinstance(t, TensorType) and (
                init.dtype != t.dtype or (t.shape is not None and (len(t.shape) != init.ndim or any(
                    isinstance(d, int) and d != n for d, n in zip(t.shape, init.shape))))):
            raise InvalidModelError(f"graph input '{v.name}' is declared {t} but its initializer is "
                                    f"{init.dtype}{list(init.shape)}")
    for name in graph.initializers:
        defined_by.setdefault(name, "initializer")
    for n in graph.nodes:
        for o in n.outputs:
            if not o:
                continue
            if o in defined_by:
                first = defined_by[o]
                first = first if isinstance(first, str) else f"{first.op_type} node '{first.name}'"
                raise InvalidModelError(f"{n.op_type} node '{n.name}' output '{o}' is already defined by {first}")
            defined_by[o] = n
    available = set(outer) | {v.name for v in graph.inputs} | set(graph.initializers)
    for n in graph.nodes:
        for idx, i in enumerate(n.inputs):
            if i and i not in available and i not in defined_by:
                raise InvalidModelError(
                    f"{n.op_type} node '{n.name}' input {idx} '{i}' is not produced by any node, "
                    "initializer or graph input")
    for v in graph.outputs:
        if v.name not in available and v.name not in defined_by:
            raise InvalidModelError(f"graph output '{v.name}' is not produced by any node, "
                                    "initializer or graph input")

    graph.nodes = [graph.nodes[i] for i in _topological_order(graph.nodes)]

    # Names the subgraph reads from outside: recorded for the enclosing node's implicit inputs
    graph.outer_names = graph.reads_from_outside()


def _topological_order(nodes) -> list[int]:
    """The nodes' indices in an order where each comes after the nodes it reads: Kahn's
    algorithm taking the first ready node in file order, so that a valid order is kept as it
    is. Linear in nodes and edges: a pass over the pending nodes per node placed was
    quadratic (a chain written backwards: 1.8 s to load for 10,000 nodes, 15.5 s for 30,000).
    """
    produced_by = {o: i for i, n in enumerate(nodes) for o in n.outputs if o}
    waiting = [0] * len(nodes)  # producers not placed yet, per node
    readers: list[list[int]] = [[] for _ in nodes]
    for k, n in enumerate(nodes):
        for p in {produced_by[i] for i in [*n.inputs, *n.implicit_inputs] if i in produced_by}:
            waiting[k] += 1
            readers[p].append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for r in readers[k]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) < len(nodes):
        placed = set(order)
        stuck = [k for k in range(len(nodes)) if k not in placed][:5]
        names = ", ".join(f"'{nodes[k].name}'" for k in stuck)
        raise InvalidModelError(f"the graph has a cycle through nodes {names}")
    return order


def nodes_from_protos(protos, opsets: dict, visible, origin: str = "") -> list:
    """NodeProtos a pass or a decomposition built → glassrt Nodes (subgraphs parsed too)."""
    parser = _Parser(opsets, None)
    scope = frozenset(set(visible) | {o for p in protos for o in p.output})
    used: set[str] = set()
    out = []
    for i, p in enumerate(protos):
        node = parser.node(p, i, used, lambda: scope)
        node.origin = origin
        out.append(node)
    return out


# ---------------------------------------------------------------- Graph → protos


def attribute_to_proto(name: str, value) -> AttributeProto:
    from onnx import helper, numpy_helper

    from .ir import Graph as _Graph

    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, (TensorType, SequenceType, OptionalType, MapType)):
        return helper.make_attribute(name, to_type_proto(value))
    if isinstance(value, _Graph) or (isinstance(value, list) and value and isinstance(value[0], _Graph)):
        raise NotImplementedError("subgraph attributes are not converted back to protos")
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
    return helper.make_attribute(name, value)


def node_to_proto(node) -> NodeProto:
    """A NodeProto for onnx APIs (per-node shape inference, reference ops, functions)."""
    from onnx import helper

    proto = helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name, domain=node.domain)
    for k, v in node.attrs.items():
        proto.attribute.append(attribute_to_proto(k, v))
    return proto
