"""The KServe / Triton v2 inference protocol over HTTP: tensors in and out, as JSON or with
the binary-tensor extension, and request validation whose errors name the culprit.

Spec: https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/ and
Triton's binary data extension (`Inference-Header-Content-Length`: the first N bytes of the
body are the JSON header, the tensors marked `binary_data_size` follow it in order).

Everything here is plain functions of bytes, dicts and arrays, with no web framework: the
app (app.py) reads the body and calls these. A bad request raises `ProtocolError` with its
HTTP status; the app answers it as `{"error": message}`.
"""
from __future__ import annotations

import json
import math
import struct
import zlib

import numpy as np

from ..errors import GlassrtError

HEADER_LENGTH = "Inference-Header-Content-Length"


class ProtocolError(GlassrtError):
    """A request the server refuses: `status` is its HTTP status (400, 404, 413...)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# v2 datatype <-> NumPy dtype. BYTES tensors are NumPy object arrays of bytes/str, as
# glassrt (and onnxruntime) hold ONNX string tensors.
_DATATYPES = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
try:  # bfloat16 is ml_dtypes' (a glassrt dependency)
    import ml_dtypes

    _DATATYPES["BF16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    pass
_BY_DTYPE = {dt: name for name, dt in _DATATYPES.items()}

# onnxruntime-style type strings (NodeArg.type) -> v2 datatype
_ORT_TYPES = {"tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
              "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
              "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
              "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
              "tensor(bfloat16)": "BF16", "tensor(string)": "BYTES"}


def datatype_of_type(ort_type: str) -> str | None:
    """The v2 datatype of a NodeArg type string, None where v2 has none (sequences, maps, float8...)."""
    return _ORT_TYPES.get(ort_type)


def dtype_of(datatype: str) -> np.dtype:
    return _DATATYPES[datatype]


def datatype_of(array: np.ndarray) -> str:
    if array.dtype.kind in "US":
        return "BYTES"
    name = _BY_DTYPE.get(array.dtype)
    if name is None:
        raise GlassrtError(f"the v2 protocol has no datatype for {array.dtype}")
    return name


# ---------------------------------------------------------------- the body


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The body as sent with Content-Encoding gzip or deflate (tritonclient's
    request_compression_algorithm), inflated to at most max_bytes: a small compressed body
    must not inflate past the limit the raw one has."""
    if not encoding or encoding == "identity":
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding.lower())
    if wbits is None:
        raise ProtocolError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate or none)", 415)
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as e:
        raise ProtocolError(f"the {encoding} body does not inflate: {e}") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise ProtocolError(f"the request body inflates to more than --max-body-bytes ({max_bytes} bytes)", 413)
    return out


def split_body(body: bytes, header_length: str | None) -> tuple[dict, memoryview]:
    """(the JSON request, the binary bytes after it)."""
    if header_length is None:
        n = len(body)
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise ProtocolError(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
        if n < 0 or n > len(body):
            raise ProtocolError(f"{HEADER_LENGTH} is {n}, but the body has {len(body)} bytes")
    try:
        request = json.loads(bytes(body[:n]))
    except UnicodeDecodeError as e:
        raise ProtocolError(f"the JSON header is not UTF-8 ({e.reason} at byte {e.start})"
                            + ("" if header_length else f"; a body with binary tensors needs {HEADER_LENGTH}")) \
            from None
    except json.JSONDecodeError as e:
        raise ProtocolError(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}"
                            + (f" (the header is the first {n} bytes, from {HEADER_LENGTH})" if header_length
                               else "")) from None
    if not isinstance(request, dict):
        raise ProtocolError(f"the request must be a JSON object, got {type(request).__name__}")
    return request, memoryview(body)[n:]


# ---------------------------------------------------------------- inputs


def _shape(where: str, shape) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                for d in shape):
        raise ProtocolError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    return tuple(shape)


def _parameters(where: str, tensor: dict) -> dict:
    params = tensor.get("parameters", {})
    if not isinstance(params, dict):
        raise ProtocolError(f"{where}: parameters must be an object, got {params!r}")
    for key in params:
        if key.startswith("shared_memory"):
            raise ProtocolError(f"{where}: parameter {key!r}: shared-memory tensors are not supported")
    return params


def decode_inputs(request: dict, binary: memoryview, model_inputs: dict) -> dict[str, np.ndarray]:
    """{name: array} from a request's `inputs`. model_inputs: {name: (datatype, shape with
    ints, strings or None for dynamic dims)}. Checks name, datatype, rank, fixed dims,
    element count against `data` or `binary_data_size`, and that the binary part holds
    exactly the tensors that claim it."""
    tensors = request.get("inputs")
    if not isinstance(tensors, list):
        raise ProtocolError("the request needs 'inputs', a list of tensors")
    out, offset = {}, 0
    for i, tensor in enumerate(tensors):
        if not isinstance(tensor, dict):
            raise ProtocolError(f"inputs[{i}] must be an object, got {type(tensor).__name__}")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise ProtocolError(f"inputs[{i}] needs a 'name' (a string)")
        where = f"input '{name}'"
        if name not in model_inputs:
            raise ProtocolError(f"unknown {where}; the model's inputs are {list(model_inputs)}")
        if name in out:
            raise ProtocolError(f"{where} is given twice")
        want_type, want_shape = model_inputs[name]
        datatype = tensor.get("datatype")
        if datatype not in _DATATYPES:
            raise ProtocolError(f"{where}: unknown datatype {datatype!r} (one of {', '.join(_DATATYPES)})")
        if datatype != want_type:
            raise ProtocolError(f"{where}: datatype {datatype}, the model takes {want_type}")
        shape = _shape(where, tensor.get("shape"))
        _check_shape(where, shape, want_shape)
        params = _parameters(where, tensor)
        count = math.prod(shape)
        if "binary_data_size" in params:
            size = params["binary_data_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ProtocolError(f"{where}: binary_data_size must be a non-negative integer, got {size!r}")
            if "data" in tensor:
                raise ProtocolError(f"{where} has both 'data' and binary_data_size")
            if offset + size > len(binary):
                raise ProtocolError(f"{where}: binary_data_size {size} at offset {offset}, but the binary part of "
                                    f"the body has {len(binary)} bytes")
            out[name] = _from_binary(where, binary[offset:offset + size], datatype, shape, count)
            offset += size
        elif "data" in tensor:
            out[name] = _from_json(where, tensor["data"], datatype, shape, count)
        else:
            raise ProtocolError(f"{where} has neither 'data' nor a binary_data_size parameter")
    if offset != len(binary):
        raise ProtocolError(f"the body has {len(binary) - offset} bytes after the tensors it declares "
                            f"(binary_data_size adds up to {offset}; is {HEADER_LENGTH} right?)")
    missing = [n for n in model_inputs if n not in out]
    if missing:
        raise ProtocolError(f"missing input(s) {missing}; the model's inputs are {list(model_inputs)}")
    return out


def _check_shape(where, shape, want):
    if want is None:
        return
    if len(shape) != len(want):
        raise ProtocolError(f"{where}: shape {list(shape)} has rank {len(shape)}, the model takes rank {len(want)} "
                            f"{_shape_str(want)}")
    for axis, (got, dim) in enumerate(zip(shape, want)):
        if isinstance(dim, int) and dim >= 0 and got != dim:
            raise ProtocolError(f"{where}: dim {axis} is {got}, the model takes {_shape_str(want)}")


def _shape_str(shape) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, (int, str)) else "-1" for d in shape) + "]"


def _from_binary(where, raw: memoryview, datatype, shape, count) -> np.ndarray:
    if datatype == "BYTES":
        items, pos = [], 0
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise ProtocolError(f"{where}: BYTES element {len(items)} has a cut length prefix")
            (n,) = struct.unpack_from("<I", raw, pos)
            if pos + 4 + n > len(raw):
                raise ProtocolError(f"{where}: BYTES element {len(items)} claims {n} bytes, {len(raw) - pos - 4} left")
            items.append(_utf8(where, len(items), bytes(raw[pos + 4:pos + 4 + n])))
            pos += 4 + n
        if len(items) != count:
            raise ProtocolError(f"{where}: shape {list(shape)} holds {count} elements, "
                                f"the binary data has {len(items)}")
        return np.array(items, dtype=object).reshape(shape)
    dtype = _DATATYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise ProtocolError(f"{where}: shape {list(shape)} of {datatype} is {count * dtype.itemsize} bytes, "
                            f"binary_data_size is {len(raw)}")
    # a copy: the request body goes away, and the kernels may want an aligned, writable array
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _utf8(where, index, raw: bytes) -> str:
    """ONNX strings are UTF-8 text (onnx.proto), held as Python str as onnxruntime holds them."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"{where}: BYTES element {index} is not UTF-8 ({e.reason} at byte {e.start}); "
                            f"ONNX string tensors hold UTF-8 text") from None


def _from_json(where, data, datatype, shape, count) -> np.ndarray:
    if not isinstance(data, list):
        data = [data]
    if datatype == "BYTES":
        flat = _flatten(where, data)
        if not all(isinstance(x, str) for x in flat):
            raise ProtocolError(f"{where}: BYTES data must be strings")
        arr = np.array(flat, dtype=object)
    else:
        try:
            arr = np.asarray(data)
        except ValueError:  # ragged nesting
            raise ProtocolError(f"{where}: data is not a regular nested list (rows of different lengths)") from None
        kind = arr.dtype.kind
        want = _DATATYPES[datatype]
        if kind == "O" and all(isinstance(x, int) and not isinstance(x, bool) for x in arr.ravel()):
            # Python ints NumPy cannot hold (beyond 64 bits)
            raise ProtocolError(f"{where}: value {max(arr.ravel(), key=abs)} does not fit in {datatype}")
        if arr.size and kind not in "biuf":
            raise ProtocolError(f"{where}: data must hold {datatype} numbers, got {_describe_kind(data)}")
        if arr.size and datatype == "BOOL" and kind != "b":
            raise ProtocolError(f"{where}: BOOL data must be true/false")
        if arr.size and want.kind in "iu" and kind not in "iub":
            raise ProtocolError(f"{where}: {datatype} data must be integers, got {arr.dtype.name} values")
        if arr.size and want.kind in "iu" and kind in "iu":
            info = np.iinfo(want)
            if arr.min() < info.min or arr.max() > info.max:  # astype would wrap it: a silent wrong answer
                raise ProtocolError(f"{where}: value {arr.min() if arr.min() < info.min else arr.max()} "
                                    f"does not fit in {datatype}")
        arr = arr.astype(want)
    if arr.size != count:
        raise ProtocolError(f"{where}: shape {list(shape)} holds {count} elements, data has {arr.size}")
    return arr.reshape(shape)


def _flatten(where, data) -> list:
    out, stack = [], [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def _describe_kind(data) -> str:
    first = next((x for x in np.ravel(np.asarray(data, dtype=object)) if not isinstance(x, (int, float, bool))), None)
    return f"{type(first).__name__} {first!r}" if first is not None else "non-numbers"


def requested_outputs(request: dict, model_outputs: list[str]) -> list[tuple[str, bool]]:
    """[(output name, as binary)] that the response carries, in request order (all when none named)."""
    params = request.get("parameters", {})
    if not isinstance(params, dict):
        raise ProtocolError(f"the request's parameters must be an object, got {params!r}")
    for key in ("classification",):
        if key in params:
            raise ProtocolError(f"parameter {key!r} is not supported")
    all_binary = params.get("binary_data_output", False)
    if not isinstance(all_binary, bool):
        raise ProtocolError(f"binary_data_output must be true or false, got {all_binary!r}")
    wanted = request.get("outputs")
    if wanted is None:
        return [(name, all_binary) for name in model_outputs]
    if not isinstance(wanted, list):
        raise ProtocolError("'outputs' must be a list of {\"name\": ...} objects")
    out = []
    for i, o in enumerate(wanted):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise ProtocolError(f"outputs[{i}] must be an object with a 'name'")
        name = o["name"]
        if name not in model_outputs:
            raise ProtocolError(f"unknown output '{name}'; the model's outputs are {model_outputs}")
        oparams = _parameters(f"output '{name}'", o)
        if "classification" in oparams:
            raise ProtocolError(f"output '{name}': the classification extension is not supported")
        binary = oparams.get("binary_data", all_binary)
        if not isinstance(binary, bool):
            raise ProtocolError(f"output '{name}': binary_data must be true or false, got {binary!r}")
        out.append((name, binary))
    return out


# ---------------------------------------------------------------- the response


def encode_response(header: dict, outputs: list[tuple[str, np.ndarray, bool]]) -> tuple[bytes, int | None]:
    """(the body, the JSON header's length or None when the body is JSON alone)."""
    tensors, blobs = [], []
    for name, array, binary in outputs:
        array = np.asarray(array)
        t = {"name": name, "datatype": datatype_of(array), "shape": list(array.shape)}
        if binary:
            blob = _to_binary(array)
            t["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            t["data"] = _to_json(array)
        tensors.append(t)
    head = json.dumps({**header, "outputs": tensors}).encode()
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)


def _to_binary(array: np.ndarray) -> bytes:
    if array.dtype == object or array.dtype.kind in "US":
        parts = []
        for x in array.ravel():
            b = x if isinstance(x, bytes) else str(x).encode()
            parts += [struct.pack("<I", len(b)), b]
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _to_json(array: np.ndarray) -> list:
    flat = array.ravel()
    if array.dtype == object or array.dtype.kind in "US":
        return [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in flat]
    if array.dtype.kind == "f" and array.dtype.itemsize < 4 or array.dtype.name == "bfloat16":
        flat = flat.astype(np.float32)
    return flat.tolist()


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
