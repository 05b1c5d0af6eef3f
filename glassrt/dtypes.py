"""ONNX element types ⇄ NumPy dtypes, and the type strings onnxruntime prints.

The table is onnx.helper's (tensor_dtype_to_np_dtype; a test checks every type against it),
kept here so that loading a model does not import the onnx package (glassrt/proto.py):
NumPy's own types, and ml_dtypes' for bfloat16, the float8/6/4 formats and int4/2.
"""
from __future__ import annotations

import ml_dtypes
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


def _numpy_type(name: str) -> np.dtype | None:
    n = _NUMPY_NAMES.get(name, name.lower())
    for module in (np, ml_dtypes):  # bfloat16, the float8s and int4 are ml_dtypes' only
        t = getattr(module, n, None)
        if t is not None:
            return np.dtype(t)
    return None  # a type this ml_dtypes does not know


_DTYPE_BY_ELEM = {v: dt for k, v in TensorProto.DataType.items()
                  if k != "UNDEFINED" and (dt := _numpy_type(k)) is not None}
_ELEM_BY_DTYPE = {dt: v for v, dt in _DTYPE_BY_ELEM.items()}


def np_dtype(elem_type: int) -> np.dtype:
    if elem_type not in _DTYPE_BY_ELEM:
        raise KeyError(f"unknown ONNX element type {elem_type}")
    return _DTYPE_BY_ELEM[elem_type]


def elem_type(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return TensorProto.STRING
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


def _all(*names):
    out = []
    for n in names:
        try:
            out.append(np_dtype(TensorProto.DataType.Value(n.upper())))
        except Exception:  # a type this onnx build doesn't know
            pass
    return frozenset(out)


STRING = np.dtype(object)
BOOL = frozenset([np.dtype(np.bool_)])
FLOATS = frozenset(map(np.dtype, [np.float16, np.float32, np.float64]))
FLOATS_BF16 = FLOATS | _all("bfloat16")
SIGNED_INTS = frozenset(map(np.dtype, [np.int8, np.int16, np.int32, np.int64]))
UNSIGNED_INTS = frozenset(map(np.dtype, [np.uint8, np.uint16, np.uint32, np.uint64]))
INTS = SIGNED_INTS | UNSIGNED_INTS
NUMERIC = FLOATS_BF16 | INTS
COMPLEX = frozenset(map(np.dtype, [np.complex64, np.complex128]))
FLOAT8 = _all("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float8e8m0")
SMALL_INTS = _all("int4", "uint4", "int2", "uint2")
FLOAT4 = _all("float4e2m1", "float6e2m3", "float6e3m2")
ALL = NUMERIC | BOOL | COMPLEX | FLOAT8 | SMALL_INTS | FLOAT4 | {STRING}
