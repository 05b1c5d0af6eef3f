"""Common subexpression elimination (passes/cse.py): a node computing what an earlier one
computes — same op, attributes and inputs, or inputs that inference proved equal — is
dropped and its readers read the earlier one; same numbers; it leaves alone what must
not be merged."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

import glassrt

from .helpers import init, model, tensor

ort = pytest.importorskip("onnxruntime")


def _session(m, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(m.SerializeToString(), glassrt.SessionOptions(**options), providers=["cpu"])


def _cse_changes(sess):
    return next(p.changes for p in sess.passes if p.name == "eliminate_common_subexpressions")


def _same_as_onnxruntime(m, feeds, sess=None):
    sess = sess or _session(m)
    oracle = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(sess.run(None, feeds), oracle.run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    return sess


def test_identical_nodes_become_one():
    m = model([helper.make_node("Sigmoid", ["x"], ["a"], name="a"), helper.make_node("Sigmoid", ["x"], ["b"], name="b"),
               helper.make_node("Mul", ["a", "b"], ["y"], name="mul")],
              [tensor("x", ["n", 4])], [tensor("y", ["n", 4])])
    sess = _same_as_onnxruntime(m, {"x": np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)})
    assert [n["op"] for n in sess.explain()["nodes"]] == ["Sigmoid", "Mul"]
    assert len(_cse_changes(sess)) == 1


def test_shape_arithmetic_of_equal_shapes_is_done_once():
    """Two layers each reshape from their own input's shape: inference knows both shapes
    are [n, 6], so the second chain (Shape, Gather, Unsqueeze, Concat) is the first's."""
    nodes, inits = [], [init("zero", np.array(0, np.int64)), init("ax", np.array([0], np.int64)),
                        init("three", np.array([3, 2], np.int64))]
    for k, src in ((1, "x"), (2, "h1")):
        nodes += [helper.make_node("Relu", [src], [f"r{k}"]), helper.make_node("Shape", [f"r{k}"], [f"s{k}"]),
                  helper.make_node("Gather", [f"s{k}", "zero"], [f"n{k}"]),
                  helper.make_node("Unsqueeze", [f"n{k}", "ax"], [f"n{k}v"]),
                  helper.make_node("Concat", [f"n{k}v", "three"], [f"shape{k}"], axis=0),
                  helper.make_node("Reshape", [f"r{k}", f"shape{k}"], [f"t{k}"]),
                  helper.make_node("Reshape", [f"t{k}", f"s{k}"], [f"h{k}"])]
    m = model(nodes, [tensor("x", ["n", 6])], [tensor("h2", ["n", 6])], inits)
    sess = _session(m)
    assert len(_cse_changes(sess)) == 4  # the second Shape, Gather, Unsqueeze, Concat
    for n in (1, 2, 5):
        _same_as_onnxruntime(m, {"x": np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)}, sess)


@pytest.mark.parametrize("case", ["random", "graph-output", "other-attribute", "signed-zero"])
def test_what_must_not_be_merged_is_not(case):
    x = [tensor("x", [2, 3])]
    if case == "random":  # each draws its own numbers
        nodes = [helper.make_node("RandomUniformLike", ["x"], ["a"], seed=1.0),
                 helper.make_node("RandomUniformLike", ["x"], ["b"], seed=1.0),
                 helper.make_node("Sub", ["a", "b"], ["y"])]
        m = model(nodes, x, [tensor("y", [2, 3])])
    elif case == "graph-output":
        m = model([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])], x,
                  [tensor("a", [2, 3]), tensor("b", [2, 3])])
    elif case == "other-attribute":
        m = model([helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1), helper.make_node("LeakyRelu", ["x"], ["b"], alpha=0.2),
                   helper.make_node("Add", ["a", "b"], ["y"])], x, [tensor("y", [2, 3])])
    else:  # x / 0.0 and x / -0.0 are +inf and -inf
        m = model([helper.make_node("Div", ["x", "pz"], ["a"]), helper.make_node("Div", ["x", "nz"], ["b"]),
                   helper.make_node("Concat", ["a", "b"], ["y"], axis=0)], x, [tensor("y", [4, 3])],
                  [init("pz", np.array([0.0], np.float32)), init("nz", np.array([-0.0], np.float32))])
    sess = _session(m)
    assert not _cse_changes(sess)
    if case == "signed-zero":
        with np.errstate(divide="ignore"):
            y = sess.run(None, {"x": np.ones((2, 3), np.float32)})[0]
        assert np.isposinf(y[:2]).all() and np.isneginf(y[2:]).all()


def test_a_node_is_merged_with_the_earlier_one_of_its_attributes():
    """Nodes of one op and inputs are keyed without their attributes, which are compared
    among those: the third LeakyRelu is the first's, not the second's."""
    m = model([helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1, name="a"),
               helper.make_node("LeakyRelu", ["x"], ["b"], alpha=0.2, name="b"),
               helper.make_node("LeakyRelu", ["x"], ["c"], alpha=0.1, name="c"),
               helper.make_node("Sum", ["a", "b", "c"], ["y"])], [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    sess = _same_as_onnxruntime(m, {"x": np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)})
    assert _cse_changes(sess) == ["LeakyRelu 'c' computes what LeakyRelu 'a' does: its readers read that"]


def test_a_slice_past_its_data_still_fails_loudly_not_silently():
    """d = data[:n] is taken to be n long (the bounds within the data). Its Shape is not
    merged with x's on that assumption: with n past the data the real, shorter d meets x
    in the Add and fails there, with the node named. On the shared plan, which computes
    Shape(d) from x's shape for the Expand (runtime/plan.py: _values_from_shapes), the Shape
    still runs and fails on its real output, named."""
    nodes = [helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Slice", ["data", "zero", "sx"], ["d"]),
             helper.make_node("Shape", ["d"], ["sd"]), helper.make_node("Expand", ["one", "sd"], ["e"]),
             helper.make_node("Add", ["e", "x"], ["y"], name="add")]
    m = model(nodes, [tensor("x", ["n"])], [tensor("y", ["n"])],
              [init("data", np.arange(6, dtype=np.float32)), init("zero", np.array([0], np.int64)),
               init("one", np.array([1.0], np.float32))])
    sess = _session(m)
    assert not any("Shape" in c for c in _cse_changes(sess))
    for n in (2, 3, 4, 5):
        _same_as_onnxruntime(m, {"x": np.ones(n, np.float32)}, sess)
    with pytest.raises(glassrt.GlassrtError, match=r"'Shape_2'.*its input's shape is \[6\] at run time.*\[8\]"):
        sess.run(None, {"x": np.ones(8, np.float32)})
    fresh = _session(m)  # (a plan of that shape's own: no value computed from the shapes)
    with pytest.raises(glassrt.GlassrtError, match="'add'"):
        fresh.run(None, {"x": np.ones(8, np.float32)})


def test_equal_values_of_other_element_types_are_not_merged():
    """Shape(x) and Cast(Shape(x), int32) are both [n, 3]: one value, two types."""
    from onnx import TensorProto

    m = model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
               helper.make_node("Concat", ["s32", "seven"], ["y"], axis=0),
               helper.make_node("Concat", ["s", "eight"], ["z"], axis=0)],
              [tensor("x", ["n", 3])], [tensor("y", [3], TensorProto.INT32), tensor("z", [3], TensorProto.INT64)],
              [init("seven", np.array([7], np.int32)), init("eight", np.array([8], np.int64))])
    sess = _same_as_onnxruntime(m, {"x": np.ones((4, 3), np.float32)})
    assert not _cse_changes(sess)


def test_custom_ops_and_nodes_with_subgraphs_are_never_keys():
    """A custom op may keep state between calls; a subgraph's names are not rewritten."""
    from glassrt.ir import Node
    from glassrt.passes.cse import _key

    assert _key(Node("Swish", "my.ops", ["x"], ["a"], {}, "a", 1, []), lambda n: None) is None
    assert _key(Node("If", "", ["c"], ["a"], {}, "if", 17, ["outer"]), lambda n: None) is None
    assert _key(Node("Relu", "", ["x"], ["a"], {}, "r", 14, []), lambda n: None) is not None


def test_a_small_gpt2_decodes_with_each_layers_mask_computed_once():
    from glassrt.tools import bench_models as bm

    m = bm.gpt2(layers=3, hidden=32, heads=4, vocab=50, max_positions=64)
    sess = _session(m)
    merged = _cse_changes(sess)
    assert any("h.2/attn/Slice" in c for c in merged)  # the third layer's mask slices are the first's
    oracle = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for past in range(0, 12):  # one plan per shape first, then one shared with the cache length symbolic
        feeds = bm.gpt2_feeds(1, past, layers=3, heads=4, head_dim=8, vocab=50, sequence=1 if past else 5)
        for got, want in zip(sess.run(None, feeds), oracle.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
