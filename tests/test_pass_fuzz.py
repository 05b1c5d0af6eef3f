"""The pass pipeline on graphs nobody checked: a small model that gives every pass work
(BatchNormalization and per-channel Mul/Add to fold into convs, a residual, Relu and Clip
to fuse, GELU written out, a constant subgraph to fold), mutated at random — parameter
shapes, dtypes, attributes, wiring. Creating a session and running it must end in a
result or a GlassrtError that names a node; never a bare NumPy or Python exception."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt
from glassrt.errors import GlassrtError

from .helpers import init, model, tensor

C = 4


def _rich_model():
    rng = np.random.default_rng(0)
    w = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s1", "bb1", "m1", "v1"], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c2", "scale"], ["ms"], name="mul"),
        helper.make_node("Add", ["ms", "shift"], ["as"], name="add_shift"),
        helper.make_node("Add", ["as", "r1"], ["res"], name="residual"),
        helper.make_node("Clip", ["res", "lo", "hi"], ["cl"], name="clip"),
        helper.make_node("Shape", ["cl"], ["shp"], name="shape"),
        helper.make_node("ConstantOfShape", ["shp"], ["ones"], name="fill", value=helper.make_tensor("v", 1, [1], [0.5])),
        helper.make_node("Mul", ["cl", "ones"], ["half"], name="halve"),
        helper.make_node("Div", ["half", "sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["a1"], name="add_one"),
        helper.make_node("Mul", ["half", "a1"], ["g"], name="mul_x"),
        helper.make_node("Mul", ["g", "point5"], ["y"], name="mul_half"),
    ]
    inits = [init("w1", w(C, 3, 3, 3)), init("b1", w(C)), init("s1", np.abs(w(C)) + 0.5), init("bb1", w(C)),
             init("m1", w(C)), init("v1", np.abs(w(C)) + 0.5), init("w2", w(C, C, 3, 3)),
             init("scale", w(1, C, 1, 1)), init("shift", w(C, 1, 1)), init("lo", np.float32(-1)),
             init("hi", np.float32(6)), init("sqrt2", np.float32(np.sqrt(2))), init("one", np.float32(1)),
             init("point5", np.float32(0.5))]
    return model(nodes, [tensor("x", ["N", 3, 6, 6])], [tensor("y", None)], inits, opset=17)


def _mutate(m: onnx.ModelProto, rng) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    for _ in range(int(rng.integers(1, 3))):
        kind = rng.integers(0, 6)
        if kind == 0:  # an initializer of another shape
            t = g.initializer[int(rng.integers(len(g.initializer)))]
            a = numpy_helper.to_array(t)
            shape = list(a.shape) or [1]
            axis = int(rng.integers(len(shape)))
            shape[axis] = int(rng.choice([0, 1, 2, 3, 5, 16]))
            t.CopyFrom(numpy_helper.from_array(rng.standard_normal(shape).astype(a.dtype), t.name))
        elif kind == 1:  # another dtype
            t = g.initializer[int(rng.integers(len(g.initializer)))]
            a = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array(a.astype(rng.choice([np.float64, np.int64, np.float16])), t.name))
        elif kind == 2:  # an initializer of another rank
            t = g.initializer[int(rng.integers(len(g.initializer)))]
            a = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array(a.reshape(-1) if a.ndim > 1 else a.reshape(1, 1, -1), t.name))
        elif kind == 3:  # an attribute set to something odd
            n = g.node[int(rng.integers(len(g.node)))]
            name = str(rng.choice(["pads", "group", "epsilon", "kernel_shape", "strides", "dilations", "axis", "perm"]))
            value = {"pads": [int(v) for v in rng.integers(-1, 3, 4)], "group": int(rng.choice([0, 2, 3, 4])),
                     "perm": [int(v) for v in (rng.permutation(int(rng.choice([2, 3, 4]))) if rng.random() < 0.7
                                               else rng.integers(-1, 5, 4))],
                     "epsilon": float(rng.choice([-1.0, 0.0, 1e9])), "kernel_shape": [int(v) for v in rng.integers(0, 4, 2)],
                     "strides": [int(v) for v in rng.integers(0, 3, 2)], "dilations": [int(v) for v in rng.integers(0, 3, 2)],
                     "axis": int(rng.integers(-5, 5))}[name]
            del n.attribute[:]
            n.attribute.append(helper.make_attribute(name, value))
        elif kind == 4:  # rewired: an input replaced by another value of the graph
            n = g.node[int(rng.integers(len(g.node)))]
            names = [i.name for i in g.initializer] + [o for k in g.node for o in k.output] + ["x"]
            if n.input:
                n.input[int(rng.integers(len(n.input)))] = str(rng.choice(names))
        else:  # an optional input dropped or an extra one added
            n = g.node[int(rng.integers(len(g.node)))]
            if len(n.input) > 1 and rng.random() < 0.5:
                del n.input[-1]
            else:
                n.input.append(str(rng.choice([i.name for i in g.initializer])))
    return out


def test_the_unmutated_model_fires_every_pass_and_matches_no_optimization():
    m = _rich_model()
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)
    sess = glassrt.InferenceSession(m, providers=["cpu"])
    fired = {r.name for r in sess.passes if r.changes}
    assert {"fold_affine_into_conv", "fold_batchnorm_into_conv", "fuse_conv_residual", "fuse_conv_activation",
            "fuse_gelu"} <= fired, fired
    plain = glassrt.InferenceSession(m, providers=["cpu"],
                                     sess_options=glassrt.SessionOptions(graph_optimization_level="none"))
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], plain.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_affine_chains_fold_link_by_link_into_their_conv_in_one_pass():
    """Two Conv → Mul → Add chains and a BatchNormalization → Mul: every link folds; a Mul
    whose input has a second reader and a Mul by a non-per-channel constant do not."""
    rng = np.random.default_rng(3)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("w1", f(4, 3, 3, 3)), ("w2", f(4, 4, 1, 1)), ("m1", f(4, 1, 1)), ("a1", f(1, 4, 1, 1)), ("m2", f(4, 1, 1)),
        ("a2", f(4, 1, 1)), ("s", np.abs(f(4)) + 0.5), ("b", f(4)), ("mu", f(4)), ("var", np.abs(f(4)) + 0.5),
        ("m3", f(4, 1, 1)), ("full", f(4, 4, 4))]]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c1", "m1"], ["c1m"]), helper.make_node("Add", ["a1", "c1m"], ["c1a"]),
             helper.make_node("Conv", ["c1a", "w2"], ["c2"]), helper.make_node("Mul", ["c2", "m2"], ["c2m"]),
             helper.make_node("Add", ["c2m", "a2"], ["c2a"]),
             helper.make_node("BatchNormalization", ["c2a", "s", "b", "mu", "var"], ["bn"]),
             helper.make_node("Mul", ["bn", "m3"], ["bnm"]),
             helper.make_node("Mul", ["bnm", "full"], ["y0"]),  # not per channel: stays
             helper.make_node("Mul", ["c1a", "m1"], ["y1"])]  # c1a has two readers: stays
    g = helper.make_graph(nodes, "chains", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y0", "y1")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = glassrt.InferenceSession(m, providers=["cpu"])
    changes = [c for r in sess.passes if r.name == "fold_affine_into_conv" for c in r.changes]
    assert len(changes) == 5, changes
    x = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
    plain = glassrt.InferenceSession(m, providers=["cpu"],
                                     sess_options=glassrt.SessionOptions(graph_optimization_level="none"))
    for a, b in zip(sess.run(None, {"x": x}), plain.run(None, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", range(200))
def test_mutated_models_end_in_a_result_or_a_glassrt_error(seed):
    rng = np.random.default_rng(seed)
    m = _mutate(_rich_model(), rng)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sess = glassrt.InferenceSession(m.SerializeToString())
            sess.run(None, {"x": x})
        except GlassrtError as e:
            assert str(e), "an error must say what is wrong"


def _attention_model():
    """Multi-head attention as PyTorch's exporter writes it (heads split by Reshape and
    Transpose, K transposed for the scores, a mask added, the heads merged back): work for
    fuse_matmul and fold_transposes."""
    b, t, h, d = 2, 5, 3, 4
    nodes = []
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", "w" + name], [name], name=name + "_proj"),
                  helper.make_node("Reshape", [name, "heads"], [name + "4"], name=name + "_split"),
                  helper.make_node("Transpose", [name + "4"], [name + "t"], name=name + "_t", perm=perm)]
    nodes += [helper.make_node("MatMul", ["qt", "kt"], ["scores"], name="qk"),
              helper.make_node("Div", ["scores", "scale"], ["scaled"], name="scale_div"),
              helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask_add"),
              helper.make_node("Softmax", ["masked"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["ctx"], name="pv"),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="merge_t", perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merged"], ["y"], name="merge")]
    rng = np.random.default_rng(0)
    inits = [init("w" + n, rng.standard_normal((h * d, h * d)).astype(np.float32)) for n in "qkv"]
    inits += [init("heads", np.array([b, t, h, d], np.int64)), init("merged", np.array([b, t, h * d], np.int64)),
              init("scale", np.float32(2.0)), init("mask", (rng.random((b, 1, 1, t)) < 0.3).astype(np.float32) * -1e4)]
    return model(nodes, [tensor("x", [b, t, h * d])], [tensor("y", None)], inits, opset=17)


@pytest.mark.parametrize("seed", range(120))
def test_mutated_attention_ends_in_a_result_or_a_glassrt_error_and_fusion_keeps_the_result(seed):
    """Also on oneDNN (the default providers): a product read through strides that oneDNN
    cannot take must be refused, never handed to it (a crash would end the test process)."""
    rng = np.random.default_rng(1000 + seed)
    m = _mutate(_attention_model(), rng)
    x = rng.standard_normal((2, 5, 12)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = glassrt.InferenceSession(m.SerializeToString()).run(None, {"x": x})
        except GlassrtError as e:
            assert str(e), "an error must say what is wrong"
            return
        plain = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"],
                                         sess_options=glassrt.SessionOptions(graph_optimization_level="none"))
        for a, b in zip(got, plain.run(None, {"x": x})):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
