"""Out-of-range values and attributes that glassrt once answered silently (found by a fuzz
of one-node models against onnxruntime, stop 44): each now fails naming the node, as
onnxruntime refuses them, or gives onnxruntime's answer, on both provider lists."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt
from glassrt.errors import GlassrtError

PROVIDERS = [None, ["cpu"]]
F32 = np.float32


def _model(op, feeds, consts=None, attrs=None, outs=("y",), opset=18, domain="", order=None):
    """One node 'n0' reading the feeds (graph inputs) and consts (initializers), in `order`
    (default: feeds then consts)."""
    consts = consts or {}
    names = order or [*feeds, *consts]
    elem = lambda a: helper.np_dtype_to_tensor_dtype(a.dtype)  # noqa: E731
    g = helper.make_graph([helper.make_node(op, names, list(outs), name="n0", domain=domain, **(attrs or {}))], "g",
                          [helper.make_tensor_value_info(k, elem(v), v.shape) for k, v in feeds.items()],
                          [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 3)] if domain else [])
    m = helper.make_model(g, opset_imports=imports)
    m.ir_version = 8
    return m.SerializeToString()


def _refused(model, feeds, *phrases):
    for providers in PROVIDERS:
        with pytest.raises(GlassrtError) as e:
            glassrt.InferenceSession(model, providers=providers).run(None, feeds)
        msg = str(e.value)
        assert "'n0'" in msg and all(p in msg for p in phrases), msg


def _runs(model, feeds):
    return [glassrt.InferenceSession(model, providers=p).run(None, feeds) for p in PROVIDERS]


@pytest.mark.parametrize("op, x, axes_or_shape, want", [
    ("Reshape", np.arange(12, dtype=F32).reshape(3, 4), [4, 3], (4, 3)),
    ("Reshape", np.arange(12, dtype=F32).reshape(3, 4), [-1, 2], (6, 2)),
    ("Unsqueeze", np.arange(12, dtype=F32).reshape(3, 4), [0], (1, 3, 4)),
    ("Squeeze", np.arange(12, dtype=F32).reshape(1, 12), [0], (12,))])
def test_a_constant_reshaped_by_a_fed_shape_takes_that_shape(op, x, axes_or_shape, want):
    """The data is a constant and the shape a graph input: a plan used to take the output for
    the constant itself (a value inference knew) and return x as it was."""
    s = np.array(axes_or_shape, np.int64)
    m = _model(op, {"s": s}, {"x": x}, order=["x", "s"])
    for (y,) in _runs(m, {"s": s}):
        assert y.shape == want
        np.testing.assert_array_equal(y.reshape(-1), x.reshape(-1))


@pytest.mark.parametrize("shape, phrase", [([5, 5], "cannot reshape"), ([-1, -1], "more than one -1"),
                                           ([-2, 6], "negative dim")])
def test_a_constant_reshaped_by_a_fed_shape_it_cannot_take_fails(shape, phrase):
    s = np.array(shape, np.int64)
    _refused(_model("Reshape", {"s": s}, {"x": np.arange(12, dtype=F32).reshape(3, 4)}, order=["x", "s"]),
             {"s": s}, phrase)


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int32, np.int64])
@pytest.mark.parametrize("op, attrs", [("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})])
def test_integer_division_by_zero_fails(op, attrs, dt):
    a, b = np.array([7, 0, 5, 3], dt), np.array([1, 0, 2, 1], dt)
    _refused(_model(op, {"a": a, "b": b}, attrs=attrs), {"a": a, "b": b}, "by zero")
    ok = np.array([1, 3, 2, 2], dt)
    for (y,) in _runs(_model(op, {"a": a, "b": ok}, attrs=attrs), {"a": a, "b": ok}):
        assert y.dtype == dt


def test_max_unpool_indices_and_output_shape_are_checked():
    x = np.array([[[[1, 2], [3, 4]]]], F32)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    for bad in (-1, 16):
        i = np.array([[[[0, 1], [2, bad]]]], np.int64)
        _refused(_model("MaxUnpool", {"x": x, "i": i}, attrs=attrs), {"x": x, "i": i}, "out of range")
    i = np.array([[[[0, 1], [2, 15]]]], np.int64)
    small = np.array([1, 1, 2, 2], np.int64)
    _refused(_model("MaxUnpool", {"x": x, "i": i, "s": small}, attrs=attrs), {"x": x, "i": i, "s": small}, "smaller")
    for (y,) in _runs(_model("MaxUnpool", {"x": x, "i": i}, attrs=attrs), {"x": x, "i": i}):
        assert y.reshape(-1)[[0, 1, 2, 15]].tolist() == [1, 2, 3, 4]


def test_range_counts_int64_bounds_exactly():
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    feeds = {"a": np.array(lo, np.int64), "b": np.array(hi, np.int64), "d": np.array(hi, np.int64)}
    want = [lo, -1, hi - 1]
    for (y,) in _runs(_model("Range", feeds), feeds):
        assert y.tolist() == want
    for (y,) in _runs(_model("Range", {}, feeds), {}):  # (bounds constant: counted by inference too)
        assert y.tolist() == want


X = np.arange(32, dtype=F32).reshape(1, 2, 4, 4)


@pytest.mark.parametrize("op, attrs, x, phrase", [
    ("MaxPool", dict(kernel_shape=[0, 0]), X, "must be positive"),
    ("AveragePool", dict(kernel_shape=[0, 0]), X, "must be positive"),
    ("LpPool", dict(kernel_shape=[0, 0]), X, "must be positive"),
    ("MaxPool", dict(kernel_shape=[2, 2], pads=[3, 3, 3, 3]), X, "smaller than the kernel"),
    ("AveragePool", dict(kernel_shape=[2, 2], pads=[2, 0, 0, 0]), X, "smaller than the kernel"),
    ("MaxPool", dict(kernel_shape=[2, 2], pads=[-1, 0, 0, 0]), X, "at least 0"),
    ("GlobalMaxPool", {}, np.zeros((1, 2, 0, 4), F32), "empty spatial dim"),
    ("GlobalAveragePool", {}, np.zeros((1, 2, 0, 4), F32), "empty spatial dim"),
    ("LRN", dict(size=0), X, "must be positive"),
    ("LRN", dict(size=-3), X, "must be positive")])
def test_pool_and_lrn_attributes_out_of_range_fail(op, attrs, x, phrase):
    _refused(_model(op, {"x": x}, attrs=attrs), {"x": x}, phrase)


@pytest.mark.parametrize("attrs, phrase", [
    (dict(strides=[2, 2], output_padding=[5, 5]), "output_padding"),
    (dict(strides=[2, 2], output_padding=[2, 2]), "output_padding"),
    (dict(pads=[-2, -2, -2, -2]), "must not be negative")])
def test_conv_transpose_attributes_out_of_range_fail(attrs, phrase):
    x, w = np.ones((1, 2, 3, 3), F32), np.ones((2, 3, 3, 3), F32)
    _refused(_model("ConvTranspose", {"x": x}, {"w": w}, attrs=attrs), {"x": x}, phrase)


def test_bit_shift_direction_is_checked():
    a = np.array([1], np.uint8)
    _refused(_model("BitShift", {"a": a, "b": a}, attrs=dict(direction="UP")), {"a": a, "b": a}, "LEFT")


def test_linear_classifier_with_coefficients_short_of_whole_rows_fails():
    x = np.arange(6, dtype=F32).reshape(2, 3)
    m = _model("LinearClassifier", {"x": x}, attrs=dict(coefficients=[1.0, 2.0, 3.0, 4.0], classlabels_ints=[0, 1]),
               outs=("label", "prob"), domain="ai.onnx.ml")
    _refused(m, {"x": x}, "whole rows")


@pytest.mark.parametrize("op, x, consts, attrs", [
    ("Tile", np.ones((3, 4), F32), {"r": np.array([-1, 2], np.int64)}, {}),
    ("Resize", np.ones((1, 1, 4, 4), F32), {"roi": np.zeros(0, F32), "sc": np.zeros(0, F32),
                                             "sz": np.array([1, 1, -4, 4], np.int64)}, dict(mode="linear")),
    ("Multinomial", np.ones((1, 3), F32), {}, dict(sample_size=-1))])
def test_a_negative_output_dim_fails_naming_the_node(op, x, consts, attrs):
    _refused(_model(op, {"x": x}, consts, attrs=attrs), {"x": x}, "negative dim")


@pytest.mark.parametrize("equation", ["i1->i", "......i->i", "ij->jj", "ij->k", "i,j->ij"])
def test_einsum_equations_that_are_not_einsum_fail_at_once(equation):
    """onnx's own inference loops forever on the first two (onnxruntime hangs on them)."""
    x = np.ones(3, F32)
    _refused(_model("Einsum", {"x": x}, attrs=dict(equation=equation)), {"x": x}, "equation")


def test_resize_crop_box_of_nan_fails_saying_so():
    x = np.arange(16, dtype=F32).reshape(1, 1, 4, 4)
    feeds = {"x": x, "roi": np.array([0, 0, np.nan, 0, 1, 1, 1, 1], F32), "sc": np.array([1, 1, 2, 2], F32)}
    _refused(_model("Resize", feeds, attrs=dict(mode="nearest", coordinate_transformation_mode="tf_crop_and_resize")),
             feeds, "NaN")


# ---------------------------------------------------------------- ai.onnx.ml attributes (fuzz, round 2)

TREE = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
            nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0],
            nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0])
REGRESSOR = dict(TREE, n_targets=1, target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
                 target_weights=[1.0, 2.0])
CLASSIFIER = dict(TREE, classlabels_int64s=[0, 1, 2], class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 2],
                  class_weights=[1.0, 1.0])
XML = np.array([[0.0], [1.0], [2.0]], F32)


def _ml(op, attrs, outs=("y",)):
    return _model(op, {"x": XML}, attrs=attrs, outs=outs, domain="ai.onnx.ml")


def test_a_valid_tree_still_runs():
    for (y,) in _runs(_ml("TreeEnsembleRegressor", REGRESSOR), {"x": XML}):
        assert y.reshape(-1).tolist() == [1.0, 2.0, 2.0]


@pytest.mark.parametrize("op, change, outs, phrase", [
    ("TreeEnsembleRegressor", dict(target_weights=[1.0]), ("y",), "one each per weight"),
    ("TreeEnsembleRegressor", dict(target_ids=[0]), ("y",), "one each per weight"),
    ("TreeEnsembleRegressor", dict(nodes_values=[0.5]), ("y",), "node values"),
    ("TreeEnsembleRegressor", dict(nodes_nodeids=[0, 1, 1]), ("y",), "same tree and node id"),
    ("TreeEnsembleRegressor", dict(n_targets=0), ("y",), "n_targets is 0"),
    ("TreeEnsembleClassifier", dict(class_weights=[1.0]), ("label", "prob"), "one each per weight"),
    ("TreeEnsembleClassifier", dict(base_values=[0.5]), ("label", "prob"), "base_values for 3 classes"),
])
def test_tree_attribute_lists_that_do_not_line_up_fail(op, change, outs, phrase):
    """One weight for two leaves was broadcast, a short id list cut the others short (zip),
    one base value was added to every class: onnxruntime refuses such a model."""
    base = REGRESSOR if op == "TreeEnsembleRegressor" else CLASSIFIER
    _refused(_ml(op, {**base, **change}, outs), {"x": XML}, phrase)


def test_linear_models_with_too_few_rows_or_intercepts_fail():
    _refused(_ml("LinearClassifier", dict(coefficients=[1.0], classlabels_ints=[7, 8, 9]), ("label", "prob")),
             {"x": XML}, "one row of coefficients")
    _refused(_ml("LinearRegressor", dict(coefficients=[1.0, 2.0], intercepts=[0.5], targets=2)), {"x": XML},
             "intercepts for 2 targets")
    _refused(_ml("LinearRegressor", dict(coefficients=[1.0], targets=0)), {"x": XML}, "targets is 0")


# ---------------------------------------------------------------- control flow and declared types

def _graph_model(nodes, inputs, outputs, opset=17):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _const_body(name, value, out_elem):
    """A body graph of no inputs giving `value` as `name`."""
    return helper.make_graph([helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))],
                             f"{name}_g", [], [_vi(name, out_elem, list(value.shape))])


def test_if_branches_of_two_element_types_fail():
    then_ = _const_body("t", np.array([1.0], F32), TensorProto.FLOAT)
    else_ = _const_body("e", np.array([1], np.int64), TensorProto.INT64)
    m = _graph_model([helper.make_node("If", ["c"], ["y"], name="n0", then_branch=then_, else_branch=else_)],
                     [_vi("c", TensorProto.BOOL, [])], [_vi("y", TensorProto.FLOAT, None)])
    _refused(m, {"c": np.array(False)}, "one type")


def _loop(body_nodes, body_inputs, body_outputs, trips=np.array(2, np.int64), outs=("y",)):
    body = helper.make_graph(body_nodes, "body", body_inputs, body_outputs)
    return _graph_model([helper.make_node("Loop", ["m", "c", "v"], list(outs), name="n0", body=body)],
                        [_vi("m", helper.np_dtype_to_tensor_dtype(trips.dtype), list(trips.shape)),
                         _vi("c", TensorProto.BOOL, []), _vi("v", TensorProto.FLOAT, [1])],
                        [_vi(o, TensorProto.FLOAT, None) for o in outs])


BODY_IN = [_vi("i", TensorProto.INT64, []), _vi("ci", TensorProto.BOOL, []), _vi("vi", TensorProto.FLOAT, [1])]


@pytest.mark.parametrize("case, phrase", [
    ("extra outputs", "expected cond"), ("float cond", "not bool"), ("carried type changes", "one type"),
    ("float trip count", "trip count M"), ("trip count of two", "trip count M")])
def test_loops_that_do_not_fit_their_body_fail(case, phrase):
    feeds = {"m": np.array(2, np.int64), "c": np.array(True), "v": np.zeros(1, F32)}
    ident = [helper.make_node("Identity", ["ci"], ["co"]), helper.make_node("Identity", ["vi"], ["vo"])]
    outs = [_vi("co", TensorProto.BOOL, []), _vi("vo", TensorProto.FLOAT, [1])]
    if case == "extra outputs":
        m = _loop(ident + [helper.make_node("Identity", ["vi"], ["s1"]), helper.make_node("Identity", ["vi"], ["s2"])],
                  BODY_IN, outs + [_vi("s1", TensorProto.FLOAT, [1]), _vi("s2", TensorProto.FLOAT, [1])])
    elif case == "float cond":
        m = _loop([helper.make_node("Cast", ["ci"], ["co"], to=TensorProto.FLOAT), ident[1]], BODY_IN,
                  [_vi("co", TensorProto.FLOAT, []), outs[1]])
    elif case == "carried type changes":
        m = _loop([ident[0], helper.make_node("Cast", ["vi"], ["vo"], to=TensorProto.INT64)], BODY_IN,
                  [outs[0], _vi("vo", TensorProto.INT64, [1])])
    else:
        trips = np.array(2.5, F32) if case == "float trip count" else np.array([2, 5], np.int64)
        feeds["m"] = trips
        m = _loop(ident, BODY_IN, outs, trips=trips)
    _refused(m, feeds, phrase)


def test_scan_directions_other_than_0_or_1_fail():
    body = helper.make_graph([helper.make_node("Identity", ["s"], ["o"])], "body", [_vi("s", TensorProto.FLOAT, [])],
                             [_vi("o", TensorProto.FLOAT, [])])
    m = _graph_model([helper.make_node("Scan", ["x"], ["y"], name="n0", body=body, num_scan_inputs=1,
                                       scan_input_directions=[7])],
                     [_vi("x", TensorProto.FLOAT, [3])], [_vi("y", TensorProto.FLOAT, None)])
    _refused(m, {"x": np.zeros(3, F32)}, "0 (forward) or 1 (reverse)")


def test_a_graph_output_computed_as_another_type_than_declared_fails():
    """onnxruntime's type inference refuses it; glassrt returned int64 for an output declared float."""
    m = _graph_model([helper.make_node("Shape", ["x"], ["s"], name="n0")], [_vi("x", TensorProto.FLOAT, [2, 3])],
                     [_vi("s", TensorProto.FLOAT, None)])
    _refused(m, {"x": np.zeros((2, 3), F32)}, "declared")


# ---------------------------------------------------------------- com.microsoft parameter shapes

MS = "com.microsoft"
RNG = np.random.default_rng(44)


def _r(*shape):
    return RNG.standard_normal(shape).astype(F32)


def _ms(op, ins, feeds, outs=("Y",), attrs=None, inits=None):
    elem = lambda a: helper.np_dtype_to_tensor_dtype(a.dtype)  # noqa: E731
    g = helper.make_graph([helper.make_node(op, ins, list(outs), name="n0", domain=MS, **(attrs or {}))], "g",
                          [helper.make_tensor_value_info(k, elem(v), list(v.shape)) for k, v in feeds.items()],
                          [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
                          [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString(), feeds


X3 = _r(2, 3, 4)


@pytest.mark.parametrize("case, phrase", [
    ("skip layer norm gamma [1]", "gamma [1] must be 1-D"),
    ("skip layer norm skip [2, 1, 4]", "skip [2, 1, 4] must be"),
    ("fast gelu bias [2, 4]", "bias [2, 4] must be 1-D"),
    ("bias gelu B [1]", "B [1] must be 1-D"),
    ("attention mask_index -5", "positions are not negative"),
    ("attention float mask_index", "mask_index must be int32"),
    ("rotary num_heads 3 of 8", "not a multiple of num_heads 3"),
    ("embed layer norm mask [1, 2]", "must have input_ids' shape"),
    ("matmul nbits g_idx -1", "g_idx must give each"),
])
def test_contrib_parameters_of_other_shapes_fail(case, phrase):
    """NumPy broadcast them (a gamma of [1] scaled every feature alike), read a negative block
    from the end, or made lengths of a negative mask; onnxruntime refuses each."""
    if case.startswith("skip"):
        skip = _r(2, 1, 4) if "skip [" in case else _r(2, 3, 4)
        gamma = _r(1) if "gamma" in case else _r(4)
        m = _ms("SkipLayerNormalization", ["X", "S", "G"], {"X": X3, "S": skip, "G": gamma})
    elif case.startswith("fast gelu"):
        m = _ms("FastGelu", ["X", "B"], {"X": X3, "B": _r(2, 4)})
    elif case.startswith("bias gelu"):
        m = _ms("BiasGelu", ["X", "B"], {"X": X3, "B": _r(1)})
    elif case.startswith("attention"):
        mask = np.array([-5, 2], np.int32) if "-5" in case else np.ones((2, 3), F32)
        m = _ms("Attention", ["X", "W", "B", "M"], {"X": X3, "W": _r(4, 12), "B": _r(12), "M": mask},
                attrs=dict(num_heads=2))
    elif case.startswith("rotary"):
        m = _ms("RotaryEmbedding", ["X", "P", "C", "S"], {"X": _r(1, 2, 8), "P": np.array(0, np.int64), "C": _r(8, 4),
                                                          "S": _r(8, 4)}, attrs=dict(num_heads=3))
    elif case.startswith("embed"):
        inits = {"we": _r(10, 4), "pe": _r(6, 4), "g": np.ones(4, F32), "b": np.zeros(4, F32)}
        m = _ms("EmbedLayerNormalization", ["ids", "", "we", "pe", "", "g", "b", "mask"],
                {"ids": np.array([[1, 2, 3]], np.int32), "mask": np.array([[1, 1]], np.int32)}, ("Y", "MI"),
                inits=inits)
    else:
        inits = {"B": RNG.integers(0, 255, (2, 1, 8)).astype(np.uint8), "sc": np.ones(2, F32),
                 "gi": np.array([0, 0, 0, 0, 0, 0, 0, -1], np.int32)}
        m = _ms("MatMulNBits", ["A", "B", "sc", "", "gi"], {"A": _r(2, 8)}, attrs=dict(K=8, N=2, bits=4, block_size=16),
                inits=inits)
    _refused(*m, phrase)


@pytest.mark.parametrize("case", ["declared twice", "initializer of another shape", "initializer of another type"])
def test_graph_inputs_declared_twice_or_against_their_initializer_fail(case):
    x = _vi("X", TensorProto.FLOAT, [2, 3])
    inputs = [x, x] if case == "declared twice" else [x]
    inits = [] if case == "declared twice" else [numpy_helper.from_array(
        np.ones(5, F32) if "shape" in case else np.ones((2, 3), np.int64), "X")]
    g = helper.make_graph([helper.make_node("Neg", ["X"], ["Y"], name="n0")], "g", inputs,
                          [_vi("Y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 3  # (every initializer also an input)
    with pytest.raises(GlassrtError, match="graph input 'X' is declared"):
        glassrt.InferenceSession(m.SerializeToString())


def test_ml_and_optional_nodes_missing_what_they_need_fail():
    _refused(_ml("Scaler", dict(scale=[2.0])), {"x": XML}, "both offset and scale")
    s = np.array(["a", "b"], dtype=object)
    _refused(_model("CategoryMapper", {"x": s}, attrs=dict(), domain="ai.onnx.ml"), {"x": s}, "at least one")
    m = _graph_model([helper.make_node("Optional", [], ["y"], name="n0")], [], [helper.make_value_info(
        "y", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None)))], opset=18)
    _refused(m, {}, "type attribute")


# ---------------------------------------------------------------- fuzz, round 3 (quantization, detection)

@pytest.mark.parametrize("scale", [-0.1, 0.1])
def test_max_pool_between_dequantize_and_quantize_keeps_the_max_of_the_values(scale):
    """The QDQ fusion ran the MaxPool on the 8-bit codes: the max of the values only where the
    scale is positive (a negative one turns the largest code into the smallest value)."""
    inits = [numpy_helper.from_array(np.array(scale, F32), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             helper.make_node("MaxPool", ["xf"], ["o"], kernel_shape=[2, 2]),
             helper.make_node("QuantizeLinear", ["o", "s", "z"], ["y"]),
             helper.make_node("DequantizeLinear", ["y", "s", "z"], ["out"])]
    g = helper.make_graph(nodes, "g", [_vi("x", TensorProto.UINT8, [1, 1, 2, 2])], [_vi("out", TensorProto.FLOAT, None)],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    x = np.array([[[[100, 150], [120, 200]]]], np.uint8)
    want = ((x.astype(F32) - 128) * F32(scale)).max()
    for (y,) in _runs(m.SerializeToString(), {"x": x}):
        np.testing.assert_allclose(y.reshape(-1), [want], rtol=1e-6)


@pytest.mark.parametrize("iou, center, phrase", [(1.5, 0, "outside [0, 1]"), (-0.5, 0, "outside [0, 1]"),
                                                 (float("nan"), 0, "outside [0, 1]"), (0.5, 2, "center_point_box")])
def test_non_max_suppression_parameters_outside_the_spec_fail(iou, center, phrase):
    feeds = {"b": _r(1, 4, 4), "s": _r(1, 1, 4), "m": np.array([2], np.int64), "i": np.array([iou], F32)}
    m = _model("NonMaxSuppression", feeds, attrs=dict(center_point_box=center), opset=11)
    _refused(m, feeds, phrase)


def test_roi_align_negative_sampling_ratio_fails():
    feeds = {"x": np.arange(16, dtype=F32).reshape(1, 1, 4, 4), "r": np.array([[0, 0, 2, 2]], F32),
             "i": np.array([0], np.int64)}
    _refused(_model("RoiAlign", feeds, attrs=dict(output_height=2, output_width=2, sampling_ratio=-3), opset=16),
             feeds, "sampling_ratio")


# ---------------------------------------------------------------- stop 45's second fuzz round


@pytest.mark.parametrize("fed", [True, False], ids=["fed", "constant"])
@pytest.mark.parametrize("start, end, want", [(-11, -11, [0.0]), (-2**63, -2**63, [0.0]), (20, -11, [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]),
                                              (-11, 5, [])])
def test_a_negative_step_slice_clamps_its_bounds_as_the_spec_says(fed, start, end, want):
    """A start below -dim with a negative step is clamped to index 0 (onnxruntime: [0.0] for
    x[-11:-11:-1] of 10): Python's slice.indices made it "before the first element" (empty,
    from constants) or wrapped the stop to the end (the whole axis reversed, fed)."""
    x = np.arange(10, dtype=F32)
    b = {k: np.array([v], np.int64) for k, v in (("s", start), ("e", end), ("a", 0), ("p", -1))}
    m = _model("Slice", {"x": x, **b} if fed else {"x": x}, None if fed else b, order=["x", "s", "e", "a", "p"])
    for (y,) in _runs(m, {"x": x, **b} if fed else {"x": x}):
        np.testing.assert_array_equal(y, np.array(want, F32))


def test_a_float_range_is_fast_bounded_by_the_memory_limit_and_refuses_infinite_bounds():
    feeds = {k: np.array(v, F32) for k, v in (("a", 0.0), ("b", 1e6), ("d", 1.0))}
    m = _model("Range", feeds)
    y = glassrt.InferenceSession(m).run(None, feeds)[0]  # (a loop of single additions took ~1 s)
    assert y.shape == (10**6,) and y[-1] == 999_999.0
    small = glassrt.SessionOptions(memory_limit_bytes=1 << 20)
    with pytest.raises(glassrt.MemoryLimitError, match="Range node 'n0'"):
        glassrt.InferenceSession(m, small).run(None, feeds)
    _refused(m, {**feeds, "b": np.array(np.inf, F32)}, "no finite number of values")


def test_resize_by_fed_scales_is_bounded_by_the_memory_limit():
    x, scales = np.ones((1, 1, 2, 2), F32), np.array([1, 1, 1000, 1000], F32)
    m = _model("Resize", {"x": x, "scales": scales}, {"roi": np.zeros(0, F32)}, order=["x", "roi", "scales"])
    with pytest.raises(glassrt.MemoryLimitError, match="Resize node 'n0'"):
        glassrt.InferenceSession(m, glassrt.SessionOptions(memory_limit_bytes=1 << 20)).run(
            None, {"x": x, "scales": scales})


def test_max_unpool_by_a_fed_output_shape_is_bounded_by_the_memory_limit():
    """A fed output_shape is known when the run binds the node: a shape of 37 GiB is refused
    before anything is allocated (NumPy was asked for it), one that fits runs."""
    x = np.array([[[[1, 2], [3, 4]]]], F32)
    i = np.array([[[[0, 3], [8, 15]]]], np.int64)
    m = _model("MaxUnpool", {"x": x, "i": i, "s": np.array([1, 1, 4, 4], np.int64)},
               attrs=dict(kernel_shape=[2, 2], strides=[2, 2]), opset=11)
    small = glassrt.SessionOptions(memory_limit_bytes=1 << 20)
    for providers in PROVIDERS:
        s = glassrt.InferenceSession(m, small, providers=providers)
        with pytest.raises(glassrt.MemoryLimitError, match="MaxUnpool node 'n0'"):
            s.run(None, {"x": x, "i": i, "s": np.array([1, 1, 100_000, 100_000], np.int64)})
        y = s.run(None, {"x": x, "i": i, "s": np.array([1, 1, 5, 6], np.int64)})[0]
        assert y.shape == (1, 1, 5, 6) and y[0, 0, :4, :4].reshape(-1)[[0, 3, 8, 15]].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("equation,shapes,phrase", [
    ("ij,jk->ik", [(2, 3), (4, 5)], "label 'j' is 3 in input 0 and 4 in input 1"),
    ("...ij,...jk->...ik", [(2, 2, 3), (3, 3, 4)], "'...' stands for do not broadcast: input 0 [2], input 1 [3]"),
    ("ii->i", [(2, 3)], "label 'i' is both 2 and 3 in input 0"),
    ("ijk->i", [(2, 3)], "Rank of input 0 (2) does not match")])
def test_einsum_sizes_that_do_not_match_are_told_in_the_equations_terms(equation, shapes, phrase):
    """(NumPy's error named the letter it renames '...' to, and counted inputs its own way.)"""
    feeds = {f"x{k}": np.ones(s, F32) for k, s in enumerate(shapes)}
    _refused(_model("Einsum", feeds, attrs=dict(equation=equation)), feeds, phrase)


def test_einsum_sizes_of_1_broadcast_as_in_numpy_and_onnxruntime():
    feeds = {"a": np.arange(2, dtype=F32).reshape(2, 1), "b": np.arange(12, dtype=F32).reshape(3, 4)}
    for (y,) in _runs(_model("Einsum", feeds, attrs=dict(equation="ij,jk->ik")), feeds):
        np.testing.assert_array_equal(y, np.einsum("ij,jk->ik", *feeds.values()))


def test_einsum_size_check_agrees_with_numpy_on_random_equations():
    """The size check refuses exactly what np.einsum (with and without optimize) refuses."""
    import random

    from glassrt.kernels.cpu.indexing import _check_einsum_sizes

    rng = random.Random(0)
    for _ in range(3000):
        terms, shapes = [], []
        for _ in range(rng.choice([1, 2, 2, 3])):
            letters = "".join(rng.choice("ijk") for _ in range(rng.randint(0, 3)))
            dots = rng.random() < 0.3
            cut = rng.randint(0, len(letters))
            terms.append(letters[:cut] + "..." + letters[cut:] if dots else letters)
            nd = len(letters) + (rng.randint(0, 2) if dots else 0) + (rng.random() < 0.05)
            shapes.append(tuple(rng.choice([1, 2, 3]) for _ in range(nd)))
        eq = ",".join(terms)
        try:
            _check_einsum_sizes(eq, shapes)
            ours = True
        except ValueError:
            ours = False
        for optimize in (False, True):
            try:
                np.einsum(eq, *[np.ones(s) for s in shapes], optimize=optimize)
                theirs = True
            except (ValueError, IndexError):
                theirs = False
            assert ours == theirs, (eq, shapes, optimize)


def test_a_string_input_fed_other_objects_gets_their_str_as_onnxruntime_does():
    m = _model("Identity", {"x": np.array(["a", "b", "c", "d"], object)})
    feed = np.array(["abc", b"\xff", 3, None], object)
    y = glassrt.InferenceSession(m).run(None, {"x": feed})[0]
    assert y.tolist() == ["abc", "b'\\xff'", "3", "None"]


def test_a_loop_appending_to_a_sequence_compiles_its_body_once_per_element_type():
    """A plan depends on a sequence's element type, not its length: a Loop appending to a
    carried sequence compiled a body plan per iteration, each keyed by every element
    (2,000 iterations: 6.5-8.4 s, onnxruntime 0.03)."""
    f1 = helper.make_tensor_sequence_value_info
    body = helper.make_graph(
        [helper.make_node("SequenceInsert", ["seq_in", "x"], ["seq_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, []), f1("seq_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), f1("seq_out", TensorProto.FLOAT, [1])])
    g = helper.make_graph([helper.make_node("SequenceEmpty", [], ["s0"], dtype=TensorProto.FLOAT),
                           helper.make_node("Loop", ["M", "", "s0"], ["sf"], body=body),
                           helper.make_node("ConcatFromSequence", ["sf"], ["y"], axis=0)], "g",
                          [helper.make_tensor_value_info("M", TensorProto.INT64, []),
                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sess = glassrt.InferenceSession(m.SerializeToString())
    y = sess.run(None, {"M": np.array(300, np.int64), "x": np.full(1, 3, F32)})[0]
    np.testing.assert_array_equal(y, np.full(300, 3, F32))
    assert [r.plans_built for _, r in sess.runner._sub_runners.values()] == [2]  # (the empty sequence's, then one)


@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
def test_grid_sample_at_a_nan_coordinate_is_nan(pad):
    """A NaN grid coordinate (an infinite one under reflection) samples nothing: NaN, where
    it read index -2**63 (an IndexError under border and reflection padding); onnxruntime
    reads whatever index its conversion makes."""
    x = np.array([[[[1, 2], [3, 4]]]], F32)
    grid = np.array([[[[np.nan, 0.3], [0.2, -0.4], [np.inf, 0.1]]]], F32)
    m = _model("GridSample", {"x": x, "g": grid}, attrs={"padding_mode": pad}, opset=20)
    for (y,) in _runs(m, {"x": x, "g": grid}):
        assert np.isnan(y[0, 0, 0, 0]) and np.isfinite(y[0, 0, 0, 1])
        assert np.isnan(y[0, 0, 0, 2]) == (pad == "reflection")
