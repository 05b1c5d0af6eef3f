"""Loading: external data stays inside the model's folder; protos, bytes and paths load alike."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import glassrt
from tests.helpers import add_model, model, tensor


def _external_model(location: str, data_bytes: bytes = None, length=None):
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3])
    t.data_location = TensorProto.EXTERNAL
    for k, v in {"location": location, "offset": "0", "length": str(length if length is not None else 12)}.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    return model([helper.make_node("Add", ["x", "w"], ["y"])], [tensor("x", [3])], [tensor("y", [3])], [t])


def test_external_data_inside_folder(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.array([1, 2, 3], np.float32).tobytes())
    p = tmp_path / "m.onnx"
    onnx.save(_external_model("weights.bin"), p)
    y = glassrt.InferenceSession(p).run(None, {"x": np.zeros(3, np.float32)})[0]
    np.testing.assert_array_equal(y, [1, 2, 3])


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin", "/etc/passwd"])
def test_external_data_escaping_the_folder_is_refused(tmp_path, location):
    inner = tmp_path / "model"
    inner.mkdir()
    (inner / "sub").mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 12)
    p = inner / "m.onnx"
    onnx.save(_external_model(location), p)
    with pytest.raises(glassrt.UnsafeModelError, match="initializer 'w'.*outside|initializer 'w'.*absolute|initializer 'w'.*climbs"):
        glassrt.InferenceSession(p)


def test_external_data_through_symlink_out_is_refused(tmp_path):
    inner = tmp_path / "model"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 12)
    os.symlink(tmp_path / "secret.bin", inner / "link.bin")
    p = inner / "m.onnx"
    onnx.save(_external_model("link.bin"), p)
    with pytest.raises(glassrt.UnsafeModelError, match="outside the model's folder"):
        glassrt.InferenceSession(p)


def test_external_data_without_a_folder_is_refused():
    with pytest.raises(glassrt.UnsafeModelError, match="not loaded from a path"):
        glassrt.InferenceSession(_external_model("weights.bin").SerializeToString())


def test_external_data_range_outside_file(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\x00" * 8)
    p = tmp_path / "m.onnx"
    onnx.save(_external_model("weights.bin"), p)
    with pytest.raises(glassrt.InvalidModelError, match="outside 'weights.bin'"):
        glassrt.InferenceSession(p)


def test_path_bytes_and_proto_load_alike(tmp_path):
    m = add_model()
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    outs = [glassrt.InferenceSession(src).run(None, {"x": x})[0] for src in (m, m.SerializeToString(), p, str(p))]
    for o in outs:
        np.testing.assert_array_equal(o, x + 1)


def test_symbolic_dims_in_get_inputs_and_outputs():
    sess = glassrt.InferenceSession(add_model())
    (i,) = sess.get_inputs()
    (o,) = sess.get_outputs()
    assert (i.name, i.shape, i.type) == ("x", ["batch", 3], "tensor(float)")
    assert (o.name, o.shape, o.type) == ("y", ["batch", 3], "tensor(float)")


def test_model_local_functions_are_inlined():
    fn = helper.make_function("local", "AddTwice", ["a"], ["b"],
                              [helper.make_node("Add", ["a", "a"], ["t"]), helper.make_node("Add", ["t", "a"], ["b"])],
                              [helper.make_opsetid("", 18)])
    m = model([helper.make_node("AddTwice", ["x"], ["y"], domain="local")], [tensor("x", [2])], [tensor("y", [2])],
              domains={"local": 1})
    m.functions.append(fn)
    y = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": np.array([1, 2], np.float32)})[0]
    np.testing.assert_array_equal(y, [3, 6])


def test_onnxruntime_argument_order_and_provider_names():
    opts = glassrt.SessionOptions(plan_cache_size=2)
    sess = glassrt.InferenceSession(add_model(), opts)  # onnxruntime passes sess_options second
    assert sess.options is opts
    sess = glassrt.InferenceSession(add_model(), providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["cpu"]
    with pytest.warns(UserWarning, match="CUDAExecutionProvider is onnxruntime's"), \
            pytest.raises(glassrt.GlassrtError, match=r"no provider left to run on from \['CUDAExecutionProvider'\]"):
        glassrt.InferenceSession(add_model(), providers=["CUDAExecutionProvider"])
    with pytest.raises(glassrt.GlassrtError, match="list of provider names"):
        glassrt.InferenceSession(add_model(), "cpu")


def test_placeholder_dim_names_are_each_their_own_unknown_dim():
    """paddle2onnx writes '?' for every dynamic dim; onnxruntime does not hold them equal."""
    import numpy as np
    from onnx import TensorProto, helper

    import glassrt

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    s = glassrt.InferenceSession(m)
    assert s.run(None, {"x": np.ones((1, 3, 48, 192), np.float32)})[0].shape == (1, 3, 48, 192)
    named = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "side", "side"])
    m2 = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [named], [y]),
                           opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(glassrt.InputShapeError):  # a real name still binds: both dims are 'side'
        glassrt.InferenceSession(m2).run(None, {"x": np.ones((1, 2, 3), np.float32)})


@pytest.mark.parametrize("op, inputs, outputs, says", [
    ("MatMul", ["a", "b", "c"], ["y"], "has 3 inputs; MatMul takes 2"),  # one kernel ignored the third
    ("Relu", ["a", "b"], ["y"], "has 2 inputs; Relu takes 1"),
    ("Add", ["a"], ["y"], "has 1 inputs; Add takes 2"),
    ("Clip", ["a", "", "", "b"], ["y"], "has 4 inputs; Clip takes 1 to 3"),
    ("Relu", ["a"], ["y", "z"], "has 2 outputs; Relu takes 1"),
    ("Concat", [], ["y"], "has 0 inputs; Concat takes at least 1"),  # a variadic op
    ("MatMul", ["a", "b"], ["y"], "attribute.s. strides, which MatMul-13 does not take .it takes: none."),
])
def test_a_node_its_schema_refuses_is_an_invalid_model(op, inputs, outputs, says):
    """More or fewer inputs or outputs than the op takes, an attribute it does not take: as
    onnxruntime and the ONNX checker say at load, on every provider (one kernel had ignored
    a third MatMul input, or the attribute, another failed with a TypeError)."""
    names = [n for n in dict.fromkeys(inputs) if n]
    attrs = {"strides": [1, 0]} if "strides" in says else {}
    m = model([helper.make_node(op, inputs, outputs, name="n", **attrs)], [tensor(n, [2, 2]) for n in names],
              [tensor(o, None) for o in outputs], opset=17)
    for providers in (["cpu"], None):
        with pytest.raises(glassrt.InvalidModelError, match=f"node 'n'.*{says}"):
            glassrt.InferenceSession(m, providers=providers)


@pytest.mark.parametrize("where", ["input", "output", "attribute"])
def test_names_that_are_not_utf8_are_refused_naming_the_node(where):
    """ONNX is proto2: a string field holding invalid UTF-8 parses (as bytes); a node's input,
    output or attribute name like that is refused, naming the node, not carried on."""
    node = helper.make_node("Relu" if where != "attribute" else "LeakyRelu", ["x"], ["y"])
    if where == "attribute":
        node.attribute.append(helper.make_attribute("QQQQ", 0.1))
    m = model([node], [tensor("x", [2])], [tensor("y", [2])])
    name = {"input": b"x", "output": b"y", "attribute": b"QQQQ"}[where]
    raw = m.SerializeToString()
    # the name's one occurrence in the node (tag, length, bytes), replaced by as many invalid bytes
    tag = {"input": b"\n", "output": b"\x12", "attribute": b"\n"}[where] + bytes([len(name)]) + name
    assert tag in raw
    bad = raw.replace(tag, tag[:2] + b"\xff" * len(name), 1)
    with pytest.raises(glassrt.InvalidModelError, match="node 0.*not valid UTF-8"):
        glassrt.InferenceSession(bad)
