"""Hostile and malformed models: always a GlassrtError (or a correct run), never a crash,
a bare NumPy/protobuf exception, or a hang."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import glassrt
from tests.helpers import init, model, tensor


def _small_cnn():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc"], ["g"], name="fc"),
             helper.make_node("Softmax", ["g"], ["y"], axis=1, name="softmax")]
    inits = [init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
             init("b", np.zeros(4, np.float32)), init("fc", rng.standard_normal((4 * 4 * 4, 5)).astype(np.float32))]
    return model(nodes, [tensor("x", ["n", 3, 8, 8])], [tensor("y", ["n", 5])], inits, opset=13)


def _try(model_bytes_or_proto):
    """Create and run; anything but success or a GlassrtError fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sess = glassrt.InferenceSession(model_bytes_or_proto)
        except glassrt.GlassrtError:
            return "refused"
        feeds = {}
        for arg, vi in zip(sess.get_inputs(), sess._inputs):
            t = vi.type
            if t is None or getattr(t, "shape", None) is None:
                return "created"
            shape = [d if isinstance(d, int) else 2 for d in t.shape]
            if int(np.prod(shape)) > 1 << 20:
                return "created"
            feeds[arg.name] = np.ones(shape, dtype=t.dtype) if t.dtype != object else np.full(shape, "a", object)
        try:
            sess.run(None, feeds)
        except glassrt.GlassrtError:
            return "failed cleanly"
        return "ran"


def test_byte_mutations_never_crash():
    data = bytearray(_small_cnn().SerializeToString())
    rng = np.random.default_rng(0)
    outcomes = {}
    for _ in range(300):
        d = bytearray(data)
        for _ in range(int(rng.integers(1, 6))):
            i = int(rng.integers(0, len(d)))
            d[i] = int(rng.integers(0, 256))
        outcome = _try(bytes(d))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert sum(outcomes.values()) == 300


def test_truncations_never_crash():
    data = _small_cnn().SerializeToString()
    for cut in range(0, len(data), max(1, len(data) // 97)):
        _try(data[:cut])


def _mutate_attr(m, node_name, name, value):
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    node = next(n for n in m2.graph.node if n.name == node_name)
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))
    return m2


@pytest.mark.parametrize("node, attr, value", [
    ("conv", "pads", [-5, -5, -5, -5]), ("conv", "pads", [1, 1]), ("conv", "strides", [0, 0]),
    ("conv", "strides", [10**12, 1]), ("conv", "dilations", [-1, 1]), ("conv", "group", 0), ("conv", "group", 7),
    ("conv", "kernel_shape", [100, 100]), ("conv", "auto_pad", "NONSENSE"), ("conv", "pads", "abc"),
    ("pool", "kernel_shape", [0, 0]), ("pool", "kernel_shape", [50, 50]), ("pool", "strides", [-1, -1]),
    ("pool", "ceil_mode", 7), ("flat", "axis", 99), ("softmax", "axis", -99), ("fc", "transB", 5),
    ("fc", "alpha", "x"),
])
def test_bad_attributes_are_refused_clearly(node, attr, value):
    outcome = _try(_mutate_attr(_small_cnn(), node, attr, value))
    assert outcome in ("refused", "failed cleanly", "ran")


@pytest.mark.parametrize("dims", [[-1, 3, 8, 8], [2**40, 3, 8, 8], [1, 3, 2**31, 2**31], []])
def test_bad_declared_input_shapes(dims):
    m = _small_cnn()
    shape = m.graph.input[0].type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = d
    _try(m)


def test_bad_tensors_and_types():
    cases = []
    t = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.zeros(108, np.float32))
    t.dims[0] = 2**40  # claims far more data than it holds
    cases.append(model([helper.make_node("Identity", ["w"], ["y"])], [], [tensor("y", None)], [t]))
    bad_elem = helper.make_tensor_value_info("x", 999, [2])
    cases.append(model([helper.make_node("Relu", ["x"], ["y"])], [bad_elem], [tensor("y", None)]))
    cases.append(model([helper.make_node("", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", None)]))
    cases.append(model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["y"])],
                       [tensor("x", [2])], [tensor("y", None)]))
    then_g = helper.make_graph([helper.make_node("Relu", ["ghost"], ["o"])], "then", [], [tensor("o", None)])
    cases.append(model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=then_g)],
                       [tensor("c", [], TensorProto.BOOL)], [tensor("y", None)]))
    cases.append(model([helper.make_node("Reshape", ["x", "s"], ["y"])], [tensor("x", [2, 3])], [tensor("y", None)],
                       [init("s", np.array([7, 7], np.int64))]))
    cases.append(model([helper.make_node("Expand", ["x", "s"], ["y"])], [tensor("x", [1])], [tensor("y", None)],
                       [init("s", np.array([2**31, 2**31], np.int64))]))
    cases.append(model([helper.make_node("Tile", ["x", "r"], ["y"])], [tensor("x", [2])], [tensor("y", None)],
                       [init("r", np.array([2**40], np.int64))]))
    cases.append(model([helper.make_node("Range", ["a", "b", "c"], ["y"])], [], [tensor("y", None)],
                       [init("a", np.array(0, np.int64)), init("b", np.array(2**40, np.int64)),
                        init("c", np.array(1, np.int64))]))
    cases.append(model([helper.make_node("Gather", ["x", "i"], ["y"])], [tensor("x", [3])], [tensor("y", None)],
                       [init("i", np.array([5], np.int64))]))
    for m in cases:
        _try(m)


def test_deeply_nested_subgraphs():
    leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "leaf", [], [tensor("o", None)])
    body = leaf
    for depth in range(20):  # nested through then_branch only (protobuf itself caps the depth)
        body = helper.make_graph([helper.make_node("If", ["c"], [f"o{depth}"], then_branch=body, else_branch=leaf)],
                                 f"g{depth}", [], [tensor(f"o{depth}", None)])
    m = model(list(body.node), [tensor("c", [], TensorProto.BOOL), tensor("x", [2])], [tensor(body.output[0].name, None)])
    _try(m)


def test_sparse_constant_claiming_a_huge_dense_shape():
    values = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    indices = helper.make_tensor("i", TensorProto.INT64, [1], [0])
    sparse = helper.make_sparse_tensor(values, indices, [10**7, 10**7])
    m = model([helper.make_node("Constant", [], ["y"], sparse_value=sparse, name="bomb")], [], [tensor("y", None)])
    with pytest.raises(glassrt.InvalidModelError, match="sparse tensor.*more than this machine's memory"):
        glassrt.InferenceSession(m)
