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
and a mapped page cut off from its file ends the process with SIGBUS. What an optimizer
writes once is mapped instead (weights.py): external data, and the weights inside a file
`glassrt optimize` wrote, which `align_raw_data` places at 64-byte offsets (and which that
command replaces by renaming, never rewrites).

Anything unexpected (a group wire type, a repeated graph field, a length past the end) makes
`strip` give up (None), and the file is parsed whole, as before, with protobuf's errors.
"""
from __future__ import annotations

import mmap

MIN_BYTES = 1 << 16  # smaller tensors stay in the message: not worth a read each
# ModelProto.graph, GraphProto.initializer, TensorProto.name, TensorProto.raw_data
_GRAPH, _INITIALIZER, _NAME, _RAW_DATA = 7, 5, 8, 9


class _Unsupported(Exception):
    pass


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at `pos`."""
    value = shift = 0
    while True:
        if pos >= end:
            raise _Unsupported("a varint runs past its message")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
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


def _length(buf, pos: int, end: int) -> tuple[int, int]:
    """(length, position of the bytes) of a length-delimited value, checked against `end`
    first: a hostile length must not become a huge allocation."""
    n, pos = _varint(buf, pos, end)
    if n > end - pos:
        raise _Unsupported("a field runs past the end of its message")
    return n, pos


def _skip(buf, pos: int, wire: int, end: int) -> int:
    """The position after a value of this wire type."""
    if wire == 0:
        return _varint(buf, pos, end)[1]
    if wire == 2:
        n, pos = _length(buf, pos, end)
        return pos + n
    size = {1: 8, 5: 4}.get(wire)
    if size is None:
        raise _Unsupported(f"wire type {wire}")
    if size > end - pos:
        raise _Unsupported("a field runs past the end of its message")
    return pos + size


def _rewrite(buf, pos: int, end: int, field: int, rewrite) -> list:
    """The message at buf[pos:end] as a list of byte chunks (joined once by the caller: each
    copy of a model's message costs its pages' first touch), with each length-delimited
    `field` replaced by the chunks rewrite(tag, body start, body end, bytes before it) returns
    (its tag, length and new body), or kept as it is where that returns None; the fields
    between copied as they are, a run of them one chunk."""
    out, size, kept = [], 0, pos  # kept: where the run of fields copied as they are starts
    while pos < end:
        start = pos
        tag, pos = _varint(buf, pos, end)
        if tag >> 3 == field and tag & 7 == 2:
            n, at = _length(buf, pos, end)
            pos = at + n
            chunks = rewrite(tag, at, pos, size + start - kept)
            if chunks is None:
                continue
            if start > kept:
                out.append(buf[kept:start])
                size += start - kept
            out += chunks
            size += sum(map(len, chunks))
            kept = pos
        else:
            pos = _skip(buf, pos, tag & 7, end)
    if end > kept:
        out.append(buf[kept:end])
    return out


def _field(tag: int, body: list) -> list:
    """A length-delimited field's chunks: its tag, its length, the body's chunks."""
    return [_encode_varint(tag) + _encode_varint(sum(map(len, body))), *body]


def _tensor(buf, pos: int, end: int) -> tuple[bytes, str | None, tuple | None]:
    """A TensorProto's bytes without a large raw_data, its name, and (offset, length) of that raw_data."""
    out, found, name = bytearray(), None, None
    while pos < end:
        start = pos
        tag, pos = _varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == _RAW_DATA and wire == 2:
            n, at = _length(buf, pos, end)
            pos = at + n
            if n >= MIN_BYTES and found is None:
                found = (at, n)
                continue
        elif field == _NAME and wire == 2:
            n, at = _length(buf, pos, end)
            pos = at + n
            name = bytes(buf[at:pos]).decode("utf-8", errors="replace")
        else:
            pos = _skip(buf, pos, wire, end)
        out += buf[start:pos]
    return bytes(out), name, found


def _graph(buf, pos: int, end: int) -> tuple[list, dict]:
    """The graph message's chunks without large raw_data, and where those lie in the file."""
    raw = {}

    def initializer(tag, at, end_, written):
        if end_ - at < MIN_BYTES:  # too short to hold a raw_data read apart: kept whole, unwalked
            return None
        body, name, found = _tensor(buf, at, end_)
        if not found:
            return None
        if name is None or name in raw:
            raise _Unsupported("a large initializer without a name, or two of one name")
        raw[name] = found
        return _field(tag, [body])

    return _rewrite(buf, pos, end, _INITIALIZER, initializer), raw


def strip(path: str) -> tuple[bytes, dict] | None:
    """(the model's bytes without its large raw_data fields, {initializer name: (offset,
    length) in the file}), or None where the file is not read this way (see the module doc).
    The walk reads the file through a read-only map: only the pages around the fields it
    looks at are touched, none of the weights'."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            graphs = []

            def graph(tag, at, end_, written):
                body, raw = _graph(buf, at, end_)
                graphs.append(raw)
                return _field(tag, body)

            out = b"".join(_rewrite(buf, 0, len(buf), _GRAPH, graph))
    except (_Unsupported, OSError, ValueError, OverflowError, MemoryError):
        return None
    if len(graphs) != 1 or not graphs[0]:  # nothing large inside: the plain parse is as good
        return None
    return out, graphs[0]


def read_into(path: str, offset: int, arr) -> None:
    """Fill `arr` (contiguous, any fixed-size dtype) with the file's bytes at offset."""
    view = arr.reshape(-1).view("uint8")
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        got = f.readinto(view)
    if got != view.nbytes:
        raise OSError(f"short read: {got} of {view.nbytes} bytes at offset {offset}")


# ---------------------------------------------------------------- writing aligned weights

ALIGN = 64
_DOC_STRING = 12  # TensorProto.doc_string


def align_raw_data(model_bytes: bytes, align: int = ALIGN) -> bytes:
    """The same model with each large raw_data of its graph's initializers starting at a
    multiple of `align` in the file, so that a reader can map the weights where they lie
    (onnx_io maps them in files glassrt wrote). The padding is a doc_string of spaces
    written just before raw_data (a parser takes fields in any order), in tensors that
    have no doc_string of their own; the enclosing messages' lengths are rewritten. The
    input is returned unchanged where its structure is not what `strip` walks."""
    buf = memoryview(model_bytes)

    def graph(tag, at, end, written):
        size = len(_encode_varint(end - at))
        for _ in range(4):  # the body's file offset depends on its length's varint size
            base = written + len(_encode_varint(tag)) + size  # where the graph's body will start

            def initializer(t, a, e, before, base=base):
                head = _encode_varint(t)
                return [head + _aligned_tensor(buf, a, e, base + before + len(head), align)]

            body = _rewrite(buf, at, end, _INITIALIZER, initializer)
            length = sum(map(len, body))
            if len(_encode_varint(length)) == size:
                return _field(tag, body)
            size = len(_encode_varint(length))
        raise _Unsupported("the graph's length does not settle")

    try:
        return b"".join(_rewrite(buf, 0, len(buf), _GRAPH, graph))
    except (_Unsupported, ValueError, OverflowError):
        return bytes(model_bytes)


def _aligned_tensor(buf, pos: int, end: int, base: int, align: int) -> bytes:
    """A TensorProto field's length and body (starting at file offset `base`), padded so
    that a large raw_data payload lands on `align`; as it was when there is nothing to do."""
    start, fields, raw = pos, bytearray(), None
    while pos < end:
        field_start = pos
        tag, pos = _varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == _DOC_STRING:
            raw = None
            break  # the tensor has a doc_string of its own: left as it is
        if field == _RAW_DATA and wire == 2 and raw is None:
            n, at = _length(buf, pos, end)
            pos = at + n
            if n >= MIN_BYTES:  # what strip takes out of the message (and onnx_io maps)
                raw = bytes(buf[field_start:pos])
                continue
        else:
            pos = _skip(buf, pos, wire, end)
        fields += buf[field_start:pos]
    if raw is None:
        return _encode_varint(end - start) + bytes(buf[start:end])
    head = _varint(raw, 1, len(raw))[1]  # raw_data's tag (1 byte) and length, before its payload
    pads = [b""] + [_encode_varint((_DOC_STRING << 3) | 2) + _encode_varint(k) + b" " * k for k in range(2 * align)]
    for doc in pads:  # no doc_string, or one of 0, 1, 2... spaces: every offset is reached
        body_len = len(fields) + len(doc) + len(raw)
        if (base + len(_encode_varint(body_len)) + len(fields) + len(doc) + head) % align == 0:
            return _encode_varint(body_len) + bytes(fields) + doc + raw
    raise _Unsupported("no padding aligns this tensor")
