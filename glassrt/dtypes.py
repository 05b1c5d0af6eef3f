"""ONNX element types ⇄ NumPy dtypes, and the type strings onnxruntime prints.

The table is onnx.helper's (tensor_dtype_to_np_dtype; a test checks every type against it),
kept here so that loading a model does not import the onnx package (glassrt/proto.py):
NumPy's own types, and ml_dtypes' for bfloat16, the float8/6/4 formats and int4/2.

ml_dtypes is imported only when a model, a kernel or a caller first needs one of its types
(2.3 MiB resident once imported, measured: a float32 model never needs it), so the sets of
types kernels declare (FLOATS_BF16, ALL...) are DTypeSets, which answer "is this float32 in
it" without it.
"""
from __future__ import annotations

import numpy as np

from .proto import TensorProto

_NAME_BY_ELEM = {v: k.lower() for k, v in TensorProto.DataType.items()}
# onnxruntime spells a few differently from the enum.
_ORT_NAMES = {"float": "float", "double": "double", "float16": "float16", "bool": "bool", "string": "string"}
# TensorProto.DataType name -> NumPy or ml_dtypes type name, where they differ
_NUMPY_NAMES = {"FLOAT": "float32", "DOUBLE": "float64", "STRING": "object_", "BOOL": "bool_",
                "FLOAT8E4M3FN": "float8_e4m3fn", "FLOAT8E4M3FNUZ": "float8_e4m3fnuz", "FLOAT8E5M2": "float8_e5m2",
                "FLOAT8E5M2FNUZ": "float8_e5m2fnuz", "FLOAT4E2M1": "float4_e2m1fn", "FLOAT8E8M0": "float8_e8m0fnu",
                "FLOAT6E2M3": "float6_e2m3fn", "FLOAT6E3M2": "float6_e3m2fn"}

_DTYPE_BY_ELEM: dict = {}  # NumPy's types now; ml_dtypes' once _load_ml_dtypes has run
_ELEM_BY_DTYPE: dict = {}
_ML_ELEMS: list = []  # the element types left to ml_dtypes: (name, value)
for _k, _v in TensorProto.DataType.items():
    if _k == "UNDEFINED":
        continue
    _t = getattr(np, _NUMPY_NAMES.get(_k, _k.lower()), None)
    if _t is None:
        _ML_ELEMS.append((_k, _v))
    else:
        _DTYPE_BY_ELEM[_v] = np.dtype(_t)
        _ELEM_BY_DTYPE[np.dtype(_t)] = _v
_ml_loaded = False


def _load_ml_dtypes() -> None:
    """Add ml_dtypes' types (bfloat16, float8s, int4...) to the tables, importing it."""
    global _ml_loaded
    if _ml_loaded:
        return
    import ml_dtypes

    for k, v in _ML_ELEMS:
        t = getattr(ml_dtypes, _NUMPY_NAMES.get(k, k.lower()), None)
        if t is not None:  # (a type this ml_dtypes does not know is left out)
            _DTYPE_BY_ELEM[v] = np.dtype(t)
            _ELEM_BY_DTYPE[np.dtype(t)] = v
    _ml_loaded = True


def _is_ml(dt: np.dtype) -> bool:
    return type(dt.type).__module__.startswith("ml_dtypes") or dt.type.__module__.startswith("ml_dtypes")


def np_dtype(elem_type: int) -> np.dtype:
    if elem_type not in _DTYPE_BY_ELEM:
        _load_ml_dtypes()
        if elem_type not in _DTYPE_BY_ELEM:
            raise KeyError(f"unknown ONNX element type {elem_type}")
    return _DTYPE_BY_ELEM[elem_type]


def elem_type(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return TensorProto.STRING
    if dtype not in _ELEM_BY_DTYPE:
        if _is_ml(dtype):
            _load_ml_dtypes()
        if dtype not in _ELEM_BY_DTYPE:
            raise ValueError(f"Unable to convert type {dtype!r} into TensorProto element type.")
    return _ELEM_BY_DTYPE[dtype]


def name(dtype) -> str:
    """'float', 'int64', 'bfloat16' — the ONNX name of a NumPy dtype."""
    return _NAME_BY_ELEM[elem_type(dtype)]


def ort_type_string(dtype) -> str:
    """'tensor(float)', as onnxruntime's NodeArg.type prints it."""
    n = name(dtype)
    return f"tensor({_ORT_NAMES.get(n, n)})"


def itemsize(dtype) -> int:
    """Bytes per element as stored in a NumPy array (int4 etc. take a whole byte)."""
    return np.dtype(dtype).itemsize


class DTypeSet:
    """A frozen set of dtypes whose ml_dtypes members are named (TensorProto names) and
    looked up, importing ml_dtypes, only when asked for: a NumPy dtype's membership is
    answered without it (an ml_dtypes dtype exists only once ml_dtypes is imported).
    Supports what kernels do with their sets: `in`, iteration, |, - and &."""

    __slots__ = ("_numpy", "_ml", "_all")

    def __init__(self, numpy_types=(), ml_names=()):
        self._numpy = frozenset(np.dtype(t) for t in numpy_types)
        self._ml = frozenset(ml_names)
        self._all = None

    def resolved(self) -> frozenset:
        if self._all is None:
            _load_ml_dtypes()
            names = TensorProto.DataType.keys()
            self._all = self._numpy | frozenset(
                _DTYPE_BY_ELEM[v] for n in self._ml if n in names and (v := TensorProto.DataType.Value(n)) in _DTYPE_BY_ELEM)
        return self._all

    def __contains__(self, dt) -> bool:
        try:
            dt = np.dtype(dt)
        except TypeError:
            return False
        return dt in self._numpy or (bool(self._ml) and _is_ml(dt) and dt in self.resolved())

    def __iter__(self):
        return iter(self.resolved())

    def __len__(self) -> int:
        return len(self.resolved())

    @staticmethod
    def _parts(other) -> tuple[frozenset, frozenset]:
        if isinstance(other, DTypeSet):
            return other._numpy, other._ml
        numpy_types, ml = set(), set()
        for d in other:
            d = np.dtype(d)
            if _is_ml(d):
                ml.add(_NAME_BY_ELEM[elem_type(d)].upper())
            else:
                numpy_types.add(d)
        return frozenset(numpy_types), frozenset(ml)

    def __or__(self, other) -> DTypeSet:
        n, m = self._parts(other)
        return DTypeSet(self._numpy | n, self._ml | m)

    __ror__ = __or__

    def __sub__(self, other) -> DTypeSet:
        n, m = self._parts(other)
        return DTypeSet(self._numpy - n, self._ml - m)

    def __and__(self, other) -> DTypeSet:
        n, m = self._parts(other)
        return DTypeSet(self._numpy & n, self._ml & m)

    __rand__ = __and__

    def __eq__(self, other) -> bool:
        if isinstance(other, DTypeSet):
            return self._numpy == other._numpy and self._ml == other._ml
        try:
            return self.resolved() == frozenset(np.dtype(d) for d in other)
        except TypeError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash((self._numpy, self._ml))

    def __repr__(self) -> str:
        return f"DTypeSet({', '.join(sorted(map(str, self._numpy)) + sorted(n.lower() for n in self._ml))})"


def _all(*names) -> DTypeSet:
    return DTypeSet((), [n.upper() for n in names])


STRING = np.dtype(object)
BOOL = frozenset([np.dtype(np.bool_)])
FLOATS = frozenset(map(np.dtype, [np.float16, np.float32, np.float64]))
FLOATS_BF16 = DTypeSet(FLOATS, ["BFLOAT16"])
SIGNED_INTS = frozenset(map(np.dtype, [np.int8, np.int16, np.int32, np.int64]))
UNSIGNED_INTS = frozenset(map(np.dtype, [np.uint8, np.uint16, np.uint32, np.uint64]))
EIGHT_BIT = frozenset(map(np.dtype, [np.uint8, np.int8]))  # the 8-bit quantized types
INTS = SIGNED_INTS | UNSIGNED_INTS
NUMERIC = FLOATS_BF16 | INTS
COMPLEX = frozenset(map(np.dtype, [np.complex64, np.complex128]))
FLOAT8 = _all("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float8e8m0")
SMALL_INTS = _all("int4", "uint4", "int2", "uint2")
FLOAT4 = _all("float4e2m1", "float6e2m3", "float6e3m2")
ALL = NUMERIC | BOOL | COMPLEX | FLOAT8 | SMALL_INTS | FLOAT4 | {STRING}
