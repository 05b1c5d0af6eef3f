"""Meta rules keep symbolic dims; the reference provider refuses ops it gets wrong."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.kernels import registry
from tests.helpers import init, model, tensor


def _out_shape(m, dims=None):
    sess = glassrt.InferenceSession(m)
    return sess.get_outputs()[0].shape


def test_reshape_flatten_concat_keep_batch():
    x = tensor("x", ["batch", 2048, 1, 1])
    assert _out_shape(model([helper.make_node("Reshape", ["x", "s"], ["y"])], [x], [tensor("y", None)],
                            [init("s", np.array([-1, 2048], np.int64))])) == ["batch", 2048]
    assert _out_shape(model([helper.make_node("Reshape", ["x", "s"], ["y"])], [x], [tensor("y", None)],
                            [init("s", np.array([0, -1], np.int64))])) == ["batch", 2048]
    assert _out_shape(model([helper.make_node("Flatten", ["x"], ["y"], axis=1)], [x], [tensor("y", None)])) == \
        ["batch", 2048]
    assert _out_shape(model([helper.make_node("Concat", ["x", "x"], ["y"], axis=0)], [x], [tensor("y", None)])) == \
        ["2*batch", 2048, 1, 1]
    assert _out_shape(model([helper.make_node("Concat", ["x", "x"], ["y"], axis=1)], [x], [tensor("y", None)])) == \
        ["batch", 4096, 1, 1]


def test_shape_arithmetic_stays_symbolic():
    # Reshape(x, Concat(Shape(x)[0], [-1])) as exporters write it.
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "zero"], ["b1"]),
             helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    m = model(nodes, [tensor("x", ["batch", "seq", 8])], [tensor("y", None)],
              [init("zero", np.array(0, np.int64)), init("minus1", np.array([-1], np.int64))])
    assert _out_shape(m) == ["batch", "8*seq"]


def test_conv_and_pool_keep_symbols():
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
               helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
              [tensor("x", ["n", 3, "h", "w"])], [tensor("y", None)], [init("w", np.zeros((8, 3, 3, 3), np.float32))])
    shape = _out_shape(m)
    assert shape[:2] == ["n", 8] and "h" in shape[2] and "w" in shape[3]
    sess = glassrt.InferenceSession(m)
    y = sess.run(None, {"x": np.zeros((2, 3, 17, 12), np.float32)})[0]
    assert y.shape == (2, 8, 4, 3)


def test_conv_kernel_shape_contradicting_weights_is_an_error():
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[5, 5], name="c")],
              [tensor("x", [1, 3, 8, 8])], [tensor("y", None)], [init("w", np.zeros((2, 3, 3, 3), np.float32))])
    with pytest.raises(glassrt.ShapeInferenceError, match="kernel_shape"):
        glassrt.InferenceSession(m)


@pytest.fixture
def no_cpu(request):
    ops = request.param
    glassrt.runtime._load_cpu_kernels()  # else the kernels removed here are loaded later, in the session
    saved = {op: list(registry.kernels_for("cpu", "", op)) for op in ops}
    for op in ops:
        registry.unregister("cpu", "", op)
    yield
    for op, ks in saved.items():
        for k in ks:
            registry.register(k)


@pytest.mark.parametrize("no_cpu, node, inputs, opset, why", [
    (["BatchNormalization"], helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"]),
     [tensor("x", [2, 3, 4])], 9, "batch statistics"),
    (["GlobalMaxPool"], helper.make_node("GlobalMaxPool", ["x"], ["y"]), [tensor("x", [2, 3, 4])], 13, "3-D"),
    (["Softmax"], helper.make_node("Softmax", ["x"], ["y"]), [tensor("x", [2, 3, 4])], 11, "flatten"),
], indirect=["no_cpu"])
def test_reference_refuses_its_known_defects(no_cpu, node, inputs, opset, why):
    inits = [init(n, np.ones(3, np.float32)) for n in ("s", "b", "m", "v")] if node.op_type == "BatchNormalization" else []
    m = model([node], inputs, [tensor("y", None)], inits, opset=opset)
    with pytest.raises(glassrt.UnsupportedOperatorError, match=why):  # cpu's kernel removed: reference's turn
        glassrt.InferenceSession(m, providers=["cpu", "reference"])


def test_cpu_is_right_where_reference_is_wrong():
    # Softmax-11 flattens to 2-D at axis=1: the whole [3, 4] slice sums to one.
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [tensor("x", [2, 3, 4])], [tensor("y", None)], opset=11)
    y = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": np.random.rand(2, 3, 4).astype(np.float32)})[0]
    np.testing.assert_allclose(y.sum(axis=(1, 2)), [1, 1], rtol=1e-6)
    # BatchNormalization-9 uses the running statistics it is given.
    m = model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])], [tensor("x", [2, 3, 2])],
              [tensor("y", None)], [init("s", np.ones(3, np.float32)), init("b", np.zeros(3, np.float32)),
                                    init("m", np.full(3, 5, np.float32)), init("v", np.full(3, 4, np.float32))], opset=9)
    x = np.random.rand(2, 3, 2).astype(np.float32)
    y = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, (x - 5) / np.sqrt(4 + 1e-5), rtol=1e-5)


def test_sequence_and_optional_outputs():
    m = model([helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
               helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))],
              [tensor("x", [2])], [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2]),
                                   helper.make_value_info("o", helper.make_optional_type_proto(
                                       helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))])
    sess = glassrt.InferenceSession(m)
    s, o = sess.run(None, {"x": np.ones(2, np.float32)})
    assert isinstance(s, list) and len(s) == 2 and o is None
    assert sess.get_outputs()[0].type == "seq(tensor(float))"


def test_opsets_before_7_broadcast_from_axis():
    """Add-6 with broadcast=1, axis=1: B (C,) lines up with axis 1, not NumPy-style with the
    last axis; consumed_inputs (a memory hint of opsets 1-5) changes nothing."""
    rng = np.random.default_rng(0)
    b = rng.standard_normal(4).astype(np.float32)
    m = model([helper.make_node("Add", ["x", "b"], ["a"], broadcast=1, axis=1),
               helper.make_node("Mul", ["a", "two"], ["m"], broadcast=1),
               helper.make_node("Relu", ["m"], ["y"], consumed_inputs=[0])],
              [tensor("x", [2, 4, 3, 5])], [tensor("y", [2, 4, 3, 5])],
              [init("b", b), init("two", np.array([2.0], np.float32))], opset=6, ir_version=3)
    sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
    x = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum((x + b[None, :, None, None]) * 2, 0))
    bad = model([helper.make_node("Add", ["x", "b"], ["y"], name="add", broadcast=1, axis=3)],
                [tensor("x", [2, 4, 3, 5])], [tensor("y", None)], [init("b", b)], opset=6, ir_version=3)
    with pytest.raises(glassrt.ShapeInferenceError, match="add.*do not broadcast"):
        glassrt.InferenceSession(bad)


def test_old_opset_forms():
    """Concat-1 without axis (default 1), Gemm-6 with broadcast=1, Dropout-6 and
    BatchNormalization-6 with is_test: as old model-zoo exports write them."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    cases = [
        (model([helper.make_node("Concat", ["x", "x"], ["y"])], [tensor("x", [2, 3])], [tensor("y", None)],
               opset=1, ir_version=3), np.concatenate([x, x], 1)),
        (model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], broadcast=1, transB=1)], [tensor("x", [2, 3])],
               [tensor("y", None)], [init("w", np.ones((4, 3), np.float32)), init("c", np.arange(4, dtype=np.float32))],
               opset=6, ir_version=3), x @ np.ones((3, 4)) + np.arange(4)),
        (model([helper.make_node("Dropout", ["x"], ["y"], is_test=1, ratio=0.3)], [tensor("x", [2, 3])],
               [tensor("y", None)], opset=6, ir_version=3), x),
        (model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], is_test=1)],
               [tensor("x", [2, 3])], [tensor("y", None)], [init(n, np.ones(3, np.float32)) for n in "sbmv"],
               opset=6, ir_version=3), (x - 1) / np.sqrt(1 + 1e-5) + 1),
    ]
    for m, expected in cases:
        sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, rtol=1e-6, atol=1e-6)


def test_layer_normalization_before_opset_17_as_onnxruntime_writes_it():
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    m = model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
              [tensor("x", [2, 3, 8])], [tensor("y", [2, 3, 8])],
              [init("g", rng.standard_normal(8).astype(np.float32)), init("b", rng.standard_normal(8).astype(np.float32))],
              opset=13)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    expected = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = glassrt.InferenceSession(m, providers=["cpu"], fallback="error").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [["n", 4, 5], [2, 4, 5]])
def test_a_provider_refusing_the_input_shape_hands_the_node_to_the_next(shape):
    """providers=["reference", "cpu"]: onnx.reference's GlobalMaxPool is wrong on 3-D input
    and refuses it; the node runs on cpu, whether the shape is known at placement or only
    when a plan is made for it."""
    import warnings

    m = model([helper.make_node("GlobalMaxPool", ["x"], ["y"], name="gmp")], [tensor("x", shape)], [tensor("y", None)],
              opset=17)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = glassrt.InferenceSession(m, providers=["reference", "cpu"])
    x = np.random.default_rng(0).random((2, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.max(axis=2, keepdims=True))
    node = sess.explain({"n": 2})["nodes"][0]
    assert node["provider"] == "cpu" and "wrong on 3-D input" in node["reason"], node


def test_prelu_before_opset_7_has_one_slope_per_channel():
    """PRelu-6 (Caffe2's, as PyTorch's opset-6 exports write it): a 1-D slope [C] holds one
    value per channel, axis 1, not per last-axis element; its gradient sums back per channel."""
    from glassrt.tools.gradcheck import gradcheck

    D = TensorProto.DOUBLE
    rng = np.random.default_rng(0)
    x, s = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal(3)
    m = model([helper.make_node("PRelu", ["x", "s"], ["y"])], [tensor("x", [2, 3, 4, 5], D), tensor("s", [3], D)],
              [tensor("y", None, D)], opset=6, ir_version=3)
    sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
    np.testing.assert_array_equal(sess.run(None, {"x": x, "s": s})[0], np.where(x < 0, x * s[:, None, None], x))
    ok, _, msg = gradcheck(sess, {"x": x, "s": s}, "y", ["x", "s"], max_elems=24)
    assert ok, msg
    bad = model([helper.make_node("PRelu", ["x", "s"], ["y"], name="pr")], [tensor("x", [2, 3, 4, 5], D)],
                [tensor("y", None, D)], [init("s", np.ones(5))], opset=6, ir_version=3)
    with pytest.raises(glassrt.ShapeInferenceError, match=r"pr.*slope \[5\] holds one value per channel.*has 3 channels"):
        glassrt.InferenceSession(bad)
    # From opset 7 the same slope broadcasts as NumPy's, along the last axis.
    s5 = rng.standard_normal(5)
    m9 = model([helper.make_node("PRelu", ["x", "s"], ["y"])], [tensor("x", [2, 3, 4, 5], D), tensor("s", [5], D)],
               [tensor("y", None, D)], opset=9)
    y = glassrt.InferenceSession(m9, providers=["cpu"]).run(None, {"x": x, "s": s5})[0]
    np.testing.assert_array_equal(y, np.where(x < 0, x * s5, x))


_OWN_RULES = {"LayerNormalization", "Pad", "GatherElements", "ScatterElements", "Scatter", "ScatterND", "TensorScatter",
              "TopK", "QuantizeLinear", "DequantizeLinear", "DepthToSpace", "SpaceToDepth", "DynamicQuantizeLinear",
              "MatMulInteger", "QLinearMatMul", "GatherND", "OneHot"}


def test_own_meta_rules_give_the_node_cases_expected_types_and_agree_with_onnx():
    """Ops that had only onnx's generic inference: glassrt's rules on each node test case's
    input types give its expected outputs' shapes and dtypes, as onnx's inference does."""
    from onnx.backend.test.case.node import collect_testcases

    from glassrt import ir, onnx_io
    from glassrt.ops import registry as contracts
    from glassrt.ops.contract import MetaContext
    from glassrt.ops.onnx_meta import onnx_meta

    checked, seen = 0, set()
    for case in collect_testcases():
        m = case.model
        if len(m.graph.node) != 1 or m.graph.node[0].op_type not in _OWN_RULES:
            continue
        node = onnx_io.from_proto(m, None).nodes[0]
        c = contracts.get_contract(node.domain, node.op_type, node.opset)
        assert c.meta is not None and c.meta.__module__.startswith("glassrt.ops.meta"), node.op_type
        for inputs, outputs in case.data_sets or []:
            # (a 0-d value may come as a NumPy scalar: OneHot's depth, DynamicQuantizeLinear's scale)
            inputs, outputs = ([np.asarray(a) if isinstance(a, np.generic) else a for a in x] for x in (inputs, outputs))
            arrays = list(inputs) + list(outputs)
            if not all(isinstance(a, np.ndarray) and a.dtype != object for a in arrays):
                continue  # float8 / int4 data sets come as protos
            feeds = dict(zip([i.name for i in m.graph.input], inputs))
            types = [ir.type_of_value(feeds[n]) if n in feeds else None for n in node.inputs]
            # small inputs known, as a model's constants are (OneHot's depth is one, integer or float)
            values = [feeds[n] if n in feeds and feeds[n].dtype.kind in "iuf" and feeds[n].size <= 64 else None
                      for n in node.inputs]
            ours = c.meta(MetaContext(node, c, types, values))
            theirs = onnx_meta(MetaContext(node, c, types, values))
            for k, expected in enumerate(outputs):
                assert (ours[k].dtype, tuple(ours[k].shape)) == (expected.dtype, expected.shape), case.name
                assert ours[k].dtype == theirs[k].dtype and tuple(ours[k].shape) == tuple(theirs[k].shape), case.name
                checked += 1
                seen.add(node.op_type)
    assert checked >= 100
    assert seen == _OWN_RULES, _OWN_RULES - seen  # every rule met by a case


def test_own_meta_rules_keep_symbolic_dims_and_refuse_bad_attributes():
    vi = helper.make_tensor_value_info

    def outs(node, inputs, opset=17):
        m = helper.make_model(helper.make_graph([node], "g", inputs, [vi(o, 0, None) for o in node.output]),
                              opset_imports=[helper.make_opsetid("", opset)])
        return [(o.shape, o.type) for o in glassrt.InferenceSession(m).get_outputs()]

    assert outs(helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2), [vi("x", 1, ["n", 8, "h", 5])]) == \
        [(["n", 2, "2*h", 10], "tensor(float)")]
    assert outs(helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2), [vi("x", 1, ["n", 3, 4, 6])]) == \
        [(["n", 12, 2, 3], "tensor(float)")]
    topk = outs(helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1), [vi("x", 1, ["n", 10]), vi("k", 7, [1])])
    assert topk[0][0][0] == "n" and topk[0][0] == topk[1][0] and topk[1][1] == "tensor(int64)"
    assert outs(helper.make_node("QuantizeLinear", ["x", "s"], ["y"]), [vi("x", 1, ["n", 4]), vi("s", 1, [])]) == \
        [(["n", 4], "tensor(uint8)")]
    assert outs(helper.make_node("DequantizeLinear", ["x", "s"], ["y"]), [vi("x", 3, ["n", 4]), vi("s", 10, [])],
                opset=21) == [(["n", 4], "tensor(float16)")]
    assert outs(helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1),
                [vi("x", 1, ["n", 10]), vi("i", 7, ["n", 3])]) == [(["n", 3], "tensor(float)")]
    x = np.zeros((1, 6, 2, 2), np.float32)
    m = helper.make_model(helper.make_graph([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2)], "g",
                                            [vi("x", 1, [1, 6, 2, 2])], [vi("y", 0, None)]),
                          opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(glassrt.GlassrtError, match="channels 6 is not divisible by 4"):
        glassrt.InferenceSession(m).run(None, {"x": x})


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_recurrent_meta_is_onnxs_inference(op, layout, direction):
    """LSTM, GRU and RNN have a meta of their own (onnx's generic inference imports the onnx
    package at a session's creation): the shapes onnx infers, static and symbolic, every
    output count; hidden_size from the attribute, or from R where onnx leaves it unknown."""
    from onnx import shape_inference

    from glassrt import onnx_io
    from glassrt.ops.registry import _onnx_meta, get_contract
    from glassrt.runtime.infer import infer_symbolic

    assert get_contract("", op, 14).meta is not _onnx_meta  # (onnx's inference imports the onnx package)

    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    dirs, hidden = (2 if direction == "bidirectional" else 1), 3
    for x_shape, n_out, hidden_attr in (([5, 2, 4], 1, True), (["s", "b", 4], 2, False), ([7, 1, 4], 3, True)):
        if n_out > (3 if op == "LSTM" else 2):
            continue
        xs = x_shape if layout == 0 else [x_shape[1], x_shape[0], x_shape[2]]
        outs = ["Y", "Y_h", "Y_c"][:n_out]
        attrs = {"direction": direction, "layout": layout, **({"hidden_size": hidden} if hidden_attr else {})}
        m = helper.make_model(helper.make_graph(
            [helper.make_node(op, ["X", "W", "R"], outs, **attrs)], "g",
            [helper.make_tensor_value_info("X", 1, xs), helper.make_tensor_value_info("W", 1, [dirs, gates * hidden, 4]),
             helper.make_tensor_value_info("R", 1, [dirs, gates * hidden, hidden])],
            [helper.make_tensor_value_info(o, 1, None) for o in outs]), opset_imports=[helper.make_opsetid("", 14)])
        want = {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim]
                for o in shape_inference.infer_shapes(m, strict_mode=True).graph.output}
        types = infer_symbolic(onnx_io.load(m.SerializeToString())).types
        for o in outs:
            got = [d if isinstance(d, int) else str(d) for d in types[o].shape]
            # (where onnx leaves hidden_size unknown without the attribute, glassrt reads R's)
            want_o = [hidden if isinstance(w, str) and w.startswith("unk__") else w for w in want[o]]
            assert got == want_o, (o, got, want[o])


def test_gather_nd_one_hot_and_nms_have_rules_of_their_own():
    """GatherND, OneHot and NonMaxSuppression are inferred without onnx's generic inference
    (which imports the onnx package at a session's creation): symbolic dims kept, a depth
    known or not, NMS's data-dependent count a symbol, bad shapes refused by name."""
    from glassrt.ops.registry import _onnx_meta, get_contract
    from glassrt.runtime.infer import infer_symbolic
    from glassrt import onnx_io

    for op, v in (("GatherND", 13), ("OneHot", 11), ("NonMaxSuppression", 11)):
        assert get_contract("", op, v).meta is not _onnx_meta, op

    def typed(nodes, inputs, inits=()):
        m = model(nodes, inputs, [tensor("y", None, TensorProto.INT64 if nodes[-1].op_type == "NonMaxSuppression"
                                         else TensorProto.FLOAT)], list(inits), opset=13)
        g = onnx_io.from_proto(m, None)
        return infer_symbolic(g).types["y"]

    y = typed([helper.make_node("GatherND", ["d", "i"], ["y"], batch_dims=1)],
              [tensor("d", ["b", 5, 6, 7]), tensor("i", ["b", 3, 2], TensorProto.INT64)])
    assert [str(d) for d in y.shape] == ["b", "3", "7"], y
    y = typed([helper.make_node("OneHot", ["i", "depth", "vals"], ["y"], axis=1)],
              [tensor("i", ["n", 4], TensorProto.INT64), tensor("vals", [2])],
              [init("depth", np.array(10, np.int64))])
    assert [str(d) for d in y.shape] == ["n", "10", "4"], y
    y = typed([helper.make_node("OneHot", ["i", "depth", "vals"], ["y"])],
              [tensor("i", ["n"], TensorProto.INT64), tensor("depth", [], TensorProto.INT64), tensor("vals", [2])])
    assert len(y.shape) == 2 and str(y.shape[0]) == "n" and not isinstance(y.shape[1], int), y
    y = typed([helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["y"])],
              [tensor("boxes", [1, "k", 4]), tensor("scores", [1, 3, "k"])])
    assert y.dtype == np.int64 and y.shape[1] == 3 and not isinstance(y.shape[0], int), y
    with pytest.raises(glassrt.ShapeInferenceError, match="batch_dims"):
        glassrt.InferenceSession(model([helper.make_node("GatherND", ["d", "i"], ["y"], batch_dims=2)],
                                       [tensor("d", [2, 3]), tensor("i", [2, 1], TensorProto.INT64)],
                                       [tensor("y", None)], opset=13))
