"""Loading and running a model without importing the onnx package (glassrt/proto.py), and
the tables glassrt keeps instead of onnx's helpers (element types, attribute values)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from glassrt import dtypes
from glassrt.errors import InvalidModelError


def test_element_types_match_onnx_helper():
    for name, elem in TensorProto.DataType.items():
        if elem == TensorProto.UNDEFINED:
            with pytest.raises(KeyError):
                dtypes.np_dtype(elem)
            continue
        theirs = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
        assert dtypes.np_dtype(elem) == theirs, name
        if elem != TensorProto.STRING:
            assert dtypes.elem_type(theirs) == helper.np_dtype_to_tensor_dtype(theirs), name
    assert dtypes.elem_type(np.dtype(object)) == TensorProto.STRING
    with pytest.raises(ValueError, match="float128|longdouble"):
        dtypes.elem_type(np.longdouble)


def test_dtype_sets_answer_for_numpy_types_without_ml_dtypes_and_hold_its_types():
    """The kernels' dtype sets (DTypeSet) name ml_dtypes' types rather than hold them, so a
    float32 model never imports ml_dtypes; asked for them, they hold exactly onnx's types."""
    bf16 = np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16))
    e4m3 = np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT8E4M3FN))
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    assert f32 in dtypes.FLOATS_BF16 and np.float32 in dtypes.NUMERIC and i64 not in dtypes.FLOATS_BF16
    assert bf16 in dtypes.FLOATS_BF16 and bf16 in dtypes.NUMERIC and e4m3 in dtypes.FLOAT8 and e4m3 not in dtypes.NUMERIC
    assert "not a dtype" not in dtypes.ALL and dtypes.STRING in dtypes.ALL
    assert set(dtypes.FLOATS_BF16) == {np.dtype(np.float16), f32, np.dtype(np.float64), bf16}
    mixed = (dtypes.FLOATS_BF16 | dtypes.FLOAT8) - {f32, bf16}
    assert f32 not in mixed and bf16 not in mixed and e4m3 in mixed and np.float16 in mixed
    assert (dtypes.NUMERIC & {bf16, i64, np.dtype(np.bool_)}) == {bf16, i64}
    assert dtypes.FLOATS_BF16 == dtypes.DTypeSet([np.float16, np.float32, np.float64], ["BFLOAT16"])
    every = {np.dtype(helper.tensor_dtype_to_np_dtype(e)) for n, e in TensorProto.DataType.items()
             if e not in (TensorProto.UNDEFINED, TensorProto.STRING)} | {dtypes.STRING}
    assert set(dtypes.ALL) == every


def _model_with(*attributes):
    node = helper.make_node("Identity", ["x"], ["y"])
    node.attribute.extend(attributes)
    return helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", 1, [2])], [helper.make_tensor_value_info("y", 1, [2])]),
        opset_imports=[helper.make_opsetid("", 17)])


def test_plain_attributes_read_as_onnx_helper_reads_them():
    from glassrt.onnx_io import from_proto

    attrs = [helper.make_attribute("f", 0.5), helper.make_attribute("i", -3), helper.make_attribute("s", "abc"),
             helper.make_attribute("fs", [1.0, 2.5]), helper.make_attribute("is", [1, 2, 3]),
             helper.make_attribute("ss", ["a", "b"]), helper.make_attribute("t", numpy_helper.from_array(np.eye(2)))]
    node = from_proto(_model_with(*attrs), None).nodes[0]
    for a in attrs:
        theirs = helper.get_attribute_value(a)
        if a.type == AttributeProto.TENSOR:
            np.testing.assert_array_equal(node.attrs[a.name], numpy_helper.to_array(theirs))
        elif a.type in (AttributeProto.STRING, AttributeProto.STRINGS):
            assert node.attrs[a.name] == (theirs.decode() if isinstance(theirs, bytes) else [v.decode() for v in theirs])
        else:
            assert node.attrs[a.name] == theirs and type(node.attrs[a.name]) is type(theirs)


def test_an_attribute_of_a_type_this_onnx_does_not_know_reads_as_onnx_helper_reads_it():
    """type 99 on the wire: protobuf keeps it as an unknown field and the type reads UNDEFINED,
    which onnx.helper gives as None; so does glassrt (no crash, no guess)."""
    from glassrt.onnx_io import from_proto

    wire = AttributeProto(name="odd", i=1).SerializeToString() + bytes([0xA0, 0x01, 99])  # field 20 (type) = 99
    a = AttributeProto.FromString(wire)
    assert a.type == AttributeProto.UNDEFINED and helper.get_attribute_value(a) is None
    assert from_proto(_model_with(a), None).nodes[0].attrs["odd"] is None


def test_a_session_runs_without_importing_onnx_and_onnx_imports_after(tmp_path):
    """A fresh process loads, creates and runs a model file with onnx's message classes only
    (not the package: 11.7 MiB and ~100 ms); importing onnx afterwards gives the same classes
    and a working package."""
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Softmax", ["a"], ["y"], axis=-1)], "g",
        [helper.make_tensor_value_info("x", 1, ["n", 3])], [helper.make_tensor_value_info("y", 1, ["n", 3])],
        # w in raw_data, b in float_data (as quantization tools write scales): neither needs onnx
        [numpy_helper.from_array(np.array([1, 2, 3], np.float32), "w"),
         helper.make_tensor("b", TensorProto.FLOAT, [3], [0.5, 0.0, -1.0])]), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    code = f"""
import sys, numpy as np, glassrt
s = glassrt.InferenceSession({str(path)!r})
y = s.run(None, {{"x": np.ones((2, 3), np.float32)}})[0]
assert np.allclose(y.sum(-1), 1)
print("onnx imported:", sorted(m for m in sys.modules if m == "onnx" or m.startswith("onnx.")))
print("ml_dtypes imported:", "ml_dtypes" in sys.modules)
import onnx, onnx.onnx_data_pb2
from glassrt import proto
assert onnx.ModelProto is proto.ModelProto and onnx.onnx_ml_pb2 is sys.modules["onnx.onnx_ml_pb2"]
model = onnx.load({str(path)!r})
onnx.checker.check_model(model, full_check=True)
assert isinstance(model, proto.ModelProto)
print(glassrt.InferenceSession(model).run(None, {{"x": np.ones((1, 3), np.float32)}})[0].shape)
"""
    env = {**os.environ, "GLASSRT_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            for _ in range(2)]  # the first writes the schema table (that reads onnx's registry)
    assert runs[1].returncode == 0, runs[1].stderr
    assert "onnx imported: ['onnx.onnx_ml_pb2']" in runs[1].stdout
    assert "ml_dtypes imported: False" in runs[1].stdout  # a float32 model needs none of its types
    assert "(1, 3)" in runs[1].stdout


def test_typed_fields_decode_as_numpy_helper_does():
    """The element types NumPy decodes from their typed fields without onnx give
    numpy_helper's arrays, byte for byte, values out of their type's range included (BOOL
    apart: any value but 0 is true, as onnxruntime reads it, where numpy_helper keeps the
    low byte: 256 false, 2 a bool byte of 2); a count that does not fit the shape is a load
    error."""
    from glassrt import onnx_io

    ints = [0, 1, -1, 127, 128, 255, 256, 300, -129, 65535, 65536, -32768, 2**31 - 1, -2**31]
    cases = [(dt, "int32_data", ints) for dt in (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16,
                                                  TensorProto.UINT16, TensorProto.FLOAT16, TensorProto.INT32)]
    cases += [(TensorProto.FLOAT, "float_data", [1.5, -0.0, float("nan"), float("inf"), 1e-45, 3.4e38]),
              (TensorProto.DOUBLE, "double_data", [1.5, -2.0, 1e300]),
              (TensorProto.INT64, "int64_data", [1, -2**63, 2**63 - 1]),
              (TensorProto.UINT64, "uint64_data", [0, 2**64 - 1]),
              (TensorProto.UINT32, "uint64_data", [0, 2**32 - 1, 2**32 + 5])]
    for dt, field, values in cases:
        for dims in ([len(values)], [1, len(values)]):
            t = TensorProto(data_type=dt, dims=dims)
            getattr(t, field).extend(values)
            want = numpy_helper.to_array(t)
            got = onnx_io.from_proto(_model_with_initializer(t), None).initializers["t"]
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), dt
    flags = TensorProto(data_type=TensorProto.BOOL, dims=[len(ints)], int32_data=ints)
    got = onnx_io.from_proto(_model_with_initializer(flags), None).initializers["t"]
    assert got.dtype == np.bool_ and got.tolist() == [v != 0 for v in ints]
    scalar = TensorProto(data_type=TensorProto.FLOAT, float_data=[2.5])
    assert onnx_io.from_proto(_model_with_initializer(scalar), None).initializers["t"].shape == ()
    short = TensorProto(data_type=TensorProto.FLOAT, dims=[4], float_data=[1.0])
    with pytest.raises(InvalidModelError, match="does not match its declared type"):
        onnx_io.from_proto(_model_with_initializer(short), None)


def _model_with_initializer(t):
    t.name = "t"
    return helper.make_model(helper.make_graph([helper.make_node("Identity", ["t"], ["y"])], "g", [],
                                               [helper.make_tensor_value_info("y", t.data_type, None)], [t]),
                             opset_imports=[helper.make_opsetid("", 17)])
