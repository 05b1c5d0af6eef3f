"""A model file's large raw_data tensors read straight into their arrays, not through protobuf.

Parsing a model with its weights inside copies them twice before glassrt has an array:
ParseFromString copies the file's bytes into the message, and `raw_data` copies them again
into a Python bytes object (BERT-base, 438 MB: 3.4 s parsing and 1.0 s in to_array out of a
5.2 s load, and three copies of the weights alive at the peak). Protobuf does not say where
in the file a field lies, so this module walks the protobuf wire format (tags, varints,
lengths: https://protobuf.dev/programming-guides/encoding/) of ModelProto.graph.initializer
and writes a copy of the file without the large raw_data fields, with their offsets noted.
That small copy is parsed as usual; each large tensor is then read from the file into its
own array (one copy, from the page cache; `readinto`, no intermediate bytes).

The arrays are not mapped: a model file is often rewritten in place (onnx.save truncates),
and a mapped page cut off from its file ends the process with SIGBUS. External data, which
optimizers write once, is mapped instead (weights.py).

Anything unexpected (a group wire type, a repeated graph field, a length past the end) makes
`strip` give up (None), and the file is parsed whole, as before, with protobuf's errors.
"""
from __future__ import annotations

import io
import os

MIN_BYTES = 1 << 16  # smaller tensors stay in the message: not worth a read each
# ModelProto.graph, GraphProto.initializer, TensorProto.name, TensorProto.raw_data
_GRAPH, _INITIALIZER, _NAME, _RAW_DATA = 7, 5, 8, 9


class _Unsupported(Exception):
    pass


class _Sized:
    """A buffered file that knows its size (lengths are checked against what is left)."""

    def __init__(self, f):
        self.f, self.size = f, os.fstat(f.fileno()).st_size
        self.read, self.tell, self.seek, self.peek = f.read, f.tell, f.seek, f.peek


def _varint(f) -> tuple[int, bytes]:
    raw, value, shift = bytearray(), 0, 0
    while True:
        b = f.read(1)
        if not b:
            raise _Unsupported("end of file inside a varint")
        raw += b
        value |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return value, bytes(raw)
        shift += 7
        if shift > 63:
            raise _Unsupported("varint too long")


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _left(f) -> int:
    return f.size - f.tell()


def _read(f, n: int) -> bytes:
    if n > _left(f):  # checked first: a hostile length must not become a huge allocation
        raise _Unsupported("a field runs past the end of the file")
    data = f.read(n)
    if len(data) != n:
        raise _Unsupported("a field runs past the end of the file")
    return data


def _fields(f, end: int | None):
    """(field number, wire type, tag bytes) until `end` (or the end of the file)."""
    while end is None or f.tell() < end:
        if end is None and not f.peek(1)[:1]:
            return
        tag, raw = _varint(f)
        yield tag >> 3, tag & 7, raw
    if end is not None and f.tell() != end:
        raise _Unsupported("a message's fields overrun its length")


def _copy_value(f, wire: int) -> bytes:
    if wire == 0:
        return _varint(f)[1]
    if wire == 1:
        return _read(f, 8)
    if wire == 5:
        return _read(f, 4)
    if wire == 2:
        n, raw = _varint(f)
        return raw + _read(f, n)
    raise _Unsupported(f"wire type {wire}")


def _tensor(f, end: int) -> tuple[bytes, str | None, tuple | None]:
    """A TensorProto's bytes without a large raw_data, its name, and (offset, length) of that raw_data."""
    out, found, name = bytearray(), None, None
    for field, wire, tag in _fields(f, end):
        if field == _NAME and wire == 2:
            value = _copy_value(f, wire)
            out += tag + value
            _, length_bytes = _varint(io.BytesIO(value))
            name = value[len(length_bytes):].decode("utf-8", errors="replace")
        elif field == _RAW_DATA and wire == 2:
            n, raw = _varint(f)
            if n >= MIN_BYTES and found is None:
                if n > _left(f):
                    raise _Unsupported("raw_data runs past the end of the file")
                found = (f.tell(), n)
                f.seek(n, io.SEEK_CUR)
                continue
            out += tag + raw + _read(f, n)
        else:
            out += tag + _copy_value(f, wire)
    return bytes(out), name, found


def _graph(f, end: int) -> tuple[bytes, dict]:
    out, raw = bytearray(), {}
    for field, wire, tag in _fields(f, end):
        if field == _INITIALIZER and wire == 2:
            n, _ = _varint(f)
            body, name, found = _tensor(f, f.tell() + n)
            if found:
                if name is None or name in raw:
                    raise _Unsupported("a large initializer without a name, or two of one name")
                raw[name] = found
            out += tag + _encode_varint(len(body)) + body
        else:
            out += tag + _copy_value(f, wire)
    return bytes(out), raw


def strip(path: str) -> tuple[bytes, dict] | None:
    """(the model's bytes without its large raw_data fields, {initializer name: (offset,
    length) in the file}), or None where the file is not read this way (see the module doc)."""
    try:
        with open(path, "rb", buffering=1 << 16) as f:
            f = _Sized(f)
            out, raw, graphs = bytearray(), {}, 0
            for field, wire, tag in _fields(f, None):
                if field == _GRAPH and wire == 2:
                    graphs += 1
                    n, _ = _varint(f)
                    body, raw = _graph(f, f.tell() + n)
                    out += tag + _encode_varint(len(body)) + body
                else:
                    out += tag + _copy_value(f, wire)
    except (_Unsupported, OSError, ValueError, OverflowError, MemoryError):
        return None
    if graphs != 1 or not raw:  # nothing large inside: the plain parse is as good
        return None
    return bytes(out), raw


def read_into(path: str, offset: int, arr) -> None:
    """Fill `arr` (contiguous, any fixed-size dtype) with the file's bytes at offset."""
    view = arr.reshape(-1).view("uint8")
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        got = f.readinto(view)
    if got != view.nbytes:
        raise OSError(f"short read: {got} of {view.nbytes} bytes at offset {offset}")
