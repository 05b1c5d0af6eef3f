"""The bound cpu kernels a streaming model runs every few milliseconds (Silero VAD's, a
wake-word model's): Gather with constant indices, Cast decided at binding, reductions and
Pad with their geometry kept per shape. Each against NumPy's or onnxruntime's answer, the
error paths included, and run twice (the second run takes what the first kept)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.runtime.plan import _DynamicStep
from glassrt.errors import GlassrtError

from .helpers import count_calls, init, model, ort_outputs, tensor

RNG = np.random.default_rng(11)


def _run_twice(m, feeds):
    sess = glassrt.InferenceSession(m.SerializeToString())
    first = sess.run(None, feeds)
    second = sess.run(None, feeds)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    return first


@pytest.mark.parametrize("indices", [np.array([2, 0, -1]), np.array(1), np.array([[0, -3], [2, 2]])])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_constant_indices(indices, axis):
    x = RNG.standard_normal((3, 4, 3)).astype(np.float32)
    m = model([helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=axis)],
              [tensor("x", [3, 4, 3])], [tensor("y", None)], [init("i", indices.astype(np.int64))])
    (got,) = _run_twice(m, {"x": x})
    np.testing.assert_array_equal(got, np.take(x, indices, axis=axis))


def test_gather_constant_index_out_of_range_names_the_node():
    """A constant index checked once at binding still fails each run where the data is too
    short for it (a symbolic dim), naming the node."""
    m = model([helper.make_node("Gather", ["x", "i"], ["y"], name="rows")],
              [tensor("x", ["n", 2])], [tensor("y", None)], [init("i", np.array([0, 3], np.int64))])
    sess = glassrt.InferenceSession(m.SerializeToString())
    np.testing.assert_array_equal(sess.run(None, {"x": np.arange(8, dtype=np.float32).reshape(4, 2)})[0],
                                  [[0, 1], [6, 7]])
    with pytest.raises(GlassrtError, match="rows"):
        sess.run(None, {"x": np.zeros((3, 2), np.float32)})


@pytest.mark.parametrize("src,to", [(np.float32, TensorProto.INT32), (np.float32, TensorProto.FLOAT16),
                                    (np.float64, TensorProto.FLOAT), (np.int64, TensorProto.FLOAT),
                                    (np.bool_, TensorProto.FLOAT), (np.float32, TensorProto.BOOL),
                                    (np.int32, TensorProto.UINT8), (np.float16, TensorProto.FLOAT)])
def test_cast_as_onnxruntime_and_quiet(src, to):
    """NaN, infinities and values beyond the target's range as onnxruntime casts them
    (where it defines them), and no NumPy warning escapes either path."""
    x = np.array([0, 1.5, -2.5, 300, -70000, 1e30], np.float64)
    x = x if np.dtype(src).kind == "f" else np.array([0, 1, -2, 300, 7, 1], np.float64)
    x = x.astype(src) if src is not np.float16 else np.array([0, 1.5, -2.5, 300], np.float16)
    m = model([helper.make_node("Cast", ["x"], ["y"], name="c", to=to)],
              [tensor("x", list(x.shape), helper.np_dtype_to_tensor_dtype(x.dtype))], [tensor("y", None, to)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = _run_twice(m, {"x": x})
    if np.dtype(src).kind != "f" or to not in (TensorProto.INT32, TensorProto.UINT8):
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(got, x.astype(helper.tensor_dtype_to_np_dtype(to)))
    ok = np.isfinite(x.astype(np.float64)) & (np.abs(x.astype(np.float64)) < 2 ** 31)
    np.testing.assert_array_equal(got[ok], ort_outputs(m, {"x": x})[0][ok])


def test_cast_float_nan_to_int_does_not_warn():
    x = np.array([np.nan, np.inf, 2.7], np.float32)
    m = model([helper.make_node("Cast", ["x"], ["y"], name="c", to=TensorProto.INT64)],
              [tensor("x", [3])], [tensor("y", None, TensorProto.INT64)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = _run_twice(m, {"x": x})
    assert got[2] == 2


def test_cast_like_takes_the_target_type():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    m = model([helper.make_node("CastLike", ["x", "like"], ["y"], name="c")],
              [tensor("x", [2, 3]), tensor("like", [1], TensorProto.DOUBLE)], [tensor("y", None, TensorProto.DOUBLE)])
    (got,) = _run_twice(m, {"x": x, "like": np.zeros(1)})
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, x.astype(np.float64))


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
@pytest.mark.parametrize("axes,keep", [([1], 1), ([1], 0), ([-1, 0], 1), (None, 0), ([], 1)])
def test_reductions_as_graph_outputs_and_inside(op, axes, keep):
    """A reduction straight to a graph output (no buffer given: the result allocated per
    run) and inside the graph (into the arena), both equal to NumPy's."""
    x = RNG.standard_normal((3, 5, 4)).astype(np.float32)
    inits = []
    inputs = ["x"]
    if axes is not None:
        inits.append(init("axes", np.array(axes, np.int64)))
        inputs.append("axes")
    nodes = [helper.make_node(op, inputs, ["r"], name="red", keepdims=keep),
             helper.make_node("Neg", ["r"], ["n"], name="neg")]
    m = model(nodes, [tensor("x", [3, 5, 4])], [tensor("r", None), tensor("n", None)], inits)
    r, n = _run_twice(m, {"x": x})
    ax = None if not axes else tuple(a % 3 for a in axes)
    want = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max}[op](x, axis=ax, keepdims=bool(keep))
    np.testing.assert_allclose(r, want, rtol=1e-6)
    np.testing.assert_allclose(n, -want, rtol=1e-6)


def test_reduce_noop_with_empty_axes_copies():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    m = model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="red", noop_with_empty_axes=1)],
              [tensor("x", [2, 3])], [tensor("y", None)], [init("axes", np.array([], np.int64))])
    (got,) = _run_twice(m, {"x": x})
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap", "constant"])
def test_pad_constant_pads_on_new_shapes(mode):
    """Pads known at binding over a symbolic dim: each new length gets its own geometry."""
    pads = np.array([0, 2, 0, 3], np.int64)
    m = model([helper.make_node("Pad", ["x", "pads", "v"], ["y"], name="pad", mode=mode)],
              [tensor("x", [1, "n"])], [tensor("y", None)], [init("pads", pads), init("v", np.float32(1.5))])
    sess = glassrt.InferenceSession(m.SerializeToString())
    for n in (8, 5, 8, 4):
        x = RNG.standard_normal((1, n)).astype(np.float32)
        kw = dict(constant_values=1.5) if mode == "constant" else {}
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.pad(x, [(0, 0), (2, 3)], mode=mode, **kw))


def test_openmp_count_kept_per_thread():
    """capi's count is the one set on the calling thread, and query_max_threads asks libgomp
    again (another library may have set it)."""
    from glassrt.kernels.onednn import capi

    if capi.lib is None:
        pytest.skip(capi.UNAVAILABLE)
    was = capi.query_max_threads()
    try:
        capi.set_num_threads(1)
        assert capi.get_max_threads() == 1
        capi._omp_funcs()[0](2)  # as another library would, behind capi's back
        assert capi.get_max_threads() == 1
        assert capi.query_max_threads() == 2
        assert capi.get_max_threads() == 2
    finally:
        capi.set_num_threads(was)


# ---------------------------------------------------------------- ai.onnx.ml linear models, bound once

ML = "ai.onnx.ml"


def _ml_model(nodes, inputs, outputs):
    return model(nodes, inputs, outputs, opset=17, domains={ML: 1}, ir_version=8)


@pytest.mark.parametrize("labels", [{"classlabels_ints": [0, 1, 2]}, {"classlabels_strings": ["a", "b", "c"]}])
@pytest.mark.parametrize("post_transform", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_linear_classifier_normalizer_zipmap_as_skl2onnx_writes_them(labels, post_transform, norm):
    """A logistic regression's chain (onnxruntime's logreg_iris.onnx has it): the attributes'
    arrays made when the plan binds, the results onnxruntime's, a run repeated the same."""
    strings = "classlabels_strings" in labels
    nodes = [helper.make_node("LinearClassifier", ["x"], ["label", "scores"], name="lc", domain=ML,
                              coefficients=RNG.standard_normal(12).tolist(), intercepts=RNG.standard_normal(3).tolist(),
                              post_transform=post_transform, **labels),
             helper.make_node("Normalizer", ["scores"], ["normalized"], name="norm", domain=ML, norm=norm),
             helper.make_node("ZipMap", ["normalized"], ["probabilities"], name="zm", domain=ML,
                              **({"classlabels_strings": labels["classlabels_strings"]} if strings
                                 else {"classlabels_int64s": labels["classlabels_ints"]}))]
    m = _ml_model(nodes, [tensor("x", [None, 4])],
                  [tensor("label", None, TensorProto.STRING if strings else TensorProto.INT64),
                   helper.make_value_info("probabilities", helper.make_sequence_type_proto(helper.make_map_type_proto(
                       TensorProto.STRING if strings else TensorProto.INT64,
                       helper.make_tensor_type_proto(TensorProto.FLOAT, [])))),
                   tensor("normalized", None)])
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    label, probabilities, normalized = _run_twice(m, {"x": x})
    want = ort_outputs(m, {"x": x})
    assert list(label) == list(want[0])
    np.testing.assert_allclose(normalized, want[2], rtol=1e-5, atol=1e-6)
    assert [sorted(d) for d in probabilities] == [sorted(d) for d in want[1]]
    for got, exp in zip(probabilities, want[1]):
        assert list(got) == list(exp)  # (onnxruntime's key order)
        np.testing.assert_allclose([got[k] for k in got], [exp[k] for k in exp], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("offset, scale", [([1.0, 2.0, 3.0], [0.5, 2.0, -1.0]), ([1.5], [2.0])])
def test_scaler_and_linear_regressor_bound_once(dtype, offset, scale):
    elem = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64}[dtype]
    nodes = [helper.make_node("Scaler", ["x"], ["s"], name="sc", domain=ML, offset=offset, scale=scale),
             helper.make_node("LinearRegressor", ["s"], ["y"], name="lr", domain=ML,
                              coefficients=RNG.standard_normal(6).tolist(), intercepts=[0.5, -1.0], targets=2)]
    m = _ml_model(nodes, [tensor("x", [None, 3], elem)], [tensor("s", None), tensor("y", None)])
    x = (RNG.standard_normal((4, 3)) * 10).astype(dtype)
    got = _run_twice(m, {"x": x})
    for g, w in zip(got, ort_outputs(m, {"x": x})):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_an_unknown_norm_is_refused_naming_the_node():
    m = _ml_model([helper.make_node("Normalizer", ["x"], ["y"], name="norm", domain=ML, norm="L3")],
                  [tensor("x", [2, 3])], [tensor("y", None)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(GlassrtError, match=r"Normalizer node 'norm'.*unknown norm 'L3'"):
            glassrt.InferenceSession(m.SerializeToString()).run(None, {"x": np.ones((2, 3), np.float32)})


@pytest.mark.parametrize("rows, n, partitions", [(3, 300, False), (3, 5000, True), (16, 1000, True)])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_short_and_long_axes_keep_ties_in_index_order(monkeypatch, rows, n, partitions, largest):
    """A short axis sorts whole, a long one (or many rows of a shorter one) partitions first
    (indexing._PARTIAL_FROM, _PARTIAL_VALUES): both give the stable order onnxruntime gives,
    ties (few distinct values) by index."""
    from glassrt.kernels.cpu import indexing

    partitioned = count_calls(monkeypatch, indexing, "_topk_partial")
    x = RNG.integers(0, 20, (rows, n)).astype(np.float32)
    m = model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", axis=1, largest=largest)],
              [tensor("x", [rows, n])], [tensor("v", None), tensor("i", None, TensorProto.INT64)],
              [init("k", np.array([7], np.int64))])
    values, indices = _run_twice(m, {"x": x})
    order = np.argsort(-x if largest else x, axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=1))
    for got, want in zip((values, indices), ort_outputs(m, {"x": x})):
        np.testing.assert_array_equal(got, want)
    assert bool(partitioned) == partitions


@pytest.mark.parametrize("constant", [True, False])
def test_array_feature_extractor_constant_and_fed_indices(constant):
    idx = np.array([[2, 0, 2]], np.int64)
    node = helper.make_node("ArrayFeatureExtractor", ["x", "idx"], ["y"], name="afe", domain=ML)
    m = _ml_model([node], [tensor("x", [2, 3])] + ([] if constant else [tensor("idx", [1, 3], TensorProto.INT64)]),
                  [tensor("y", None)])
    if constant:
        m.graph.initializer.append(init("idx", idx))
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    feeds = {"x": x} if constant else {"x": x, "idx": idx}
    (got,) = _run_twice(m, feeds)
    np.testing.assert_array_equal(got, x[:, [2, 0, 2]])
    np.testing.assert_array_equal(got, ort_outputs(m, feeds)[0])
    bad = np.array([[0, 3, 1]], np.int64)
    if constant:
        m.graph.initializer[0].CopyFrom(init("idx", bad))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(GlassrtError, match=r"ArrayFeatureExtractor node 'afe'.*index 3 is out of range"):
            glassrt.InferenceSession(m.SerializeToString()).run(None, {"x": x} if constant else {"x": x, "idx": bad})


@pytest.mark.parametrize("x_shape, idx_shape", [((3,), (1, 1)), ((4, 5), (2,)), ((2, 3, 5), (1, 3)), ((4, 5), (1,))])
def test_array_feature_extractor_shapes_are_known_before_it_runs(x_shape, idx_shape):
    """Its meta gives X's dims but the last, then one per index (a 1-D X: [1, indices]), so
    a plan binds the step once (skl2onnx's classifiers end with one, mapping an ArgMax to
    the class labels); the shape and values are onnxruntime's."""
    x = RNG.integers(-9, 9, x_shape).astype(np.int64)
    idx = RNG.integers(0, x_shape[-1], idx_shape).astype(np.int64)
    node = helper.make_node("ArrayFeatureExtractor", ["x", "idx"], ["y"], name="afe", domain=ML)
    m = _ml_model([node], [tensor("x", list(x_shape), TensorProto.INT64), tensor("idx", list(idx_shape), TensorProto.INT64)],
                  [tensor("y", None, TensorProto.INT64)])
    sess = glassrt.InferenceSession(m.SerializeToString())
    got = sess.run(None, {"x": x, "idx": idx})[0]
    want = ort_outputs(m, {"x": x, "idx": idx})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    (plan,) = sess.runner.plans.values()
    assert not isinstance(plan.steps[0].fn, _DynamicStep)  # (bound once, for the shapes the meta gave)


def test_a_linear_classifiers_logistic_gives_the_plain_formulas_float32_bits():
    """LinearClassifier's LOGISTIC scores cap e^-v where float64 overflows (no errstate per
    run): in float32, what they become, the same bits as 1 / (1 + e^-v), at the extremes too."""
    from glassrt.kernels.cpu.ml import _logistic, _logistic_to_float32

    edges = [-1e308, -800.0, -709.79, -709.0, -104.0, -103.9, -88.0, -1.0, -0.0, 0.0, 1.0, 88.0, 800.0,
             np.inf, -np.inf, np.nan]
    v = np.concatenate([edges, RNG.standard_normal(20_000) * 300])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no overflow warning from the capped one)
        got = _logistic_to_float32(v.copy())
    np.testing.assert_array_equal(got.astype(np.float32), _logistic(v).astype(np.float32))
