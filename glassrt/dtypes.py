"""ONNX element types ⇄ NumPy dtypes, and the type strings onnxruntime prints.

onnx.helper already knows the mapping (including ml_dtypes' bfloat16, float8, int4...),
so this module only adds the names and groups the kernels declare coverage with.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

_NAME_BY_ELEM = {v: k.lower() for k, v in TensorProto.DataType.items()}
# onnxruntime spells a few differently from the enum.
_ORT_NAMES = {"float": "float", "double": "double", "float16": "float16", "bool": "bool", "string": "string"}


def np_dtype(elem_type: int) -> np.dtype:
    if elem_type == TensorProto.UNDEFINED or elem_type not in _NAME_BY_ELEM:
        raise KeyError(f"unknown ONNX element type {elem_type}")
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def elem_type(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(dtype)


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
            out.append(np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.DataType.Value(n.upper()))))
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
