"""Hostile model files: malformed fields a fuzzer of whole models (byte mutations and
hand-made structures, stop 45) got through to a raw Python error or to an answer that
depended on how the model was handed over. Each now loads as onnxruntime reads it or fails
with a glassrt error naming what is wrong. (Linear-time sorting of nodes written backwards:
tests/test_errors.py.)"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import glassrt

from .helpers import init, model, tensor

ort = pytest.importorskip("onnxruntime")


def _add_const(extra=None):
    m = model([helper.make_node("Add", ["x", "c"], ["y"])], [tensor("x", [1, 4])], [tensor("y", [1, 4])])
    if extra is not None:
        extra(m)
    return m


def test_a_dim_name_that_is_not_utf8_is_refused_naming_it():
    m = _add_const(lambda m: m.graph.initializer.append(init("c", np.ones((1, 4), np.float32))))
    dim = m.graph.input[0].type.tensor_type.shape.dim[0]
    dim.dim_param = "nn"
    data = m.SerializeToString().replace(b"\x12\x02nn", b"\x12\x02\xff\xfe", 1)  # (the same length, not UTF-8)
    with pytest.raises(glassrt.InvalidModelError, match="dim_param: not valid UTF-8"):
        glassrt.InferenceSession(data)


@pytest.mark.parametrize("values, indices", [([1, 2, 3], [0, 3]), ([1, 2, 3], [[0, 0], [0, 3]]),
                                             ([1, 2], [[0, 0, 0], [0, 3, 0]])],
                         ids=["linear", "coordinates", "coordinates-of-another-rank"])
def test_a_sparse_tensor_whose_parts_disagree_is_refused(values, indices):
    st = onnx.SparseTensorProto()
    st.values.CopyFrom(numpy_helper.from_array(np.asarray(values, np.float32), "c"))
    st.indices.CopyFrom(numpy_helper.from_array(np.asarray(indices, np.int64), "c_i"))
    st.dims.extend([1, 4])
    m = _add_const(lambda m: m.graph.sparse_initializer.append(st))
    with pytest.raises(glassrt.InvalidModelError, match="sparse initializer 'c': a sparse tensor needs values"):
        glassrt.InferenceSession(m.SerializeToString())
    with pytest.raises(Exception):  # (onnxruntime refuses them too)
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("location, says", [(b"w.bin\x00zz", "holds a NUL character"),
                                            (b"\xff\xfe../w.bin", "not valid UTF-8")])
def test_an_external_data_location_that_is_no_file_name_is_refused(tmp_path, location, says):
    (tmp_path / "w.bin").write_bytes(np.ones(4, np.float32).tobytes())
    c = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[1, 4])
    c.data_location = TensorProto.EXTERNAL
    c.external_data.add(key="location", value="@" * len(location))
    m = _add_const(lambda m: m.graph.initializer.append(c))
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString().replace(b"@" * len(location), location, 1))
    with pytest.raises(glassrt.InvalidModelError, match=says):
        glassrt.InferenceSession(str(path))


@pytest.mark.parametrize("order", ["raw-data-first", "raw-data-last"])
def test_an_initializer_named_twice_reads_the_same_by_path_and_from_bytes(tmp_path, order):
    """The last one wins (onnxruntime's stated rule), whichever holds its bytes in raw_data:
    read by path, the large raw_data is read from the file apart (model_file.strip), and was
    taken for every initializer of that name."""
    big = numpy_helper.from_array(np.ones((128, 256), np.float32), "W")  # (128 KiB of raw_data)
    small = helper.make_tensor("W", TensorProto.FLOAT, [128, 256], [2.0] * (128 * 256))  # (float_data)
    inits = [big, small] if order == "raw-data-first" else [small, big]
    m = model([helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("ReduceMax", ["m"], ["y"], keepdims=0)],
              [tensor("x", [1, 128])], [tensor("y", [])], inits)
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    x = {"x": np.ones((1, 128), np.float32)}
    by_path = glassrt.InferenceSession(str(path)).run(None, x)[0]
    from_bytes = glassrt.InferenceSession(path.read_bytes()).run(None, x)[0]
    assert by_path == from_bytes == (256.0 if order == "raw-data-first" else 128.0)


def test_bool_values_stored_as_int32_are_true_when_not_zero():
    c = TensorProto(name="c", data_type=TensorProto.BOOL, dims=[4])
    c.int32_data.extend([2, 0, 256, -1])
    m = model([helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT)], [], [tensor("y", [4])], [c])
    got = glassrt.InferenceSession(m.SerializeToString()).run(None, {})[0]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [1, 0, 1, 1])


@pytest.mark.parametrize("kind", ["int", "string", "undefined", "floats"])
def test_an_attribute_of_another_type_than_its_schema_says_is_refused(kind):
    m = model([helper.make_node("LeakyRelu", ["x"], ["y"])], [tensor("x", [1, 4])], [tensor("y", [1, 4])])
    a = m.graph.node[0].attribute.add(name="alpha")
    if kind == "int":
        a.type, a.i = AttributeProto.INT, 1
    elif kind == "string":
        a.type, a.s = AttributeProto.STRING, b"abc"
    elif kind == "floats":
        a.type = AttributeProto.FLOATS
        a.floats.extend([0.1, 0.2])
    with pytest.raises(glassrt.InvalidModelError, match="LeakyRelu node .* attribute 'alpha' is .* takes a float"):
        glassrt.InferenceSession(m.SerializeToString())
    with pytest.raises(Exception):  # (onnxruntime: "Mismatched attribute type")
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
