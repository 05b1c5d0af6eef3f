"""ai.onnx.ml ZipMap and the seq(map(...)) values it makes, side by side with onnxruntime.

ZipMap is the last node skl2onnx writes for a classifier: its output comes back from
`run` as onnxruntime returns it, a list of dicts with Python int or str keys and Python
float values.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.ir import MapType, SequenceType, TensorType
from glassrt.onnx_io import parse_type, to_type_proto

from .helpers import model, tensor

ML = "ai.onnx.ml"
LABELS = {"int64s": [10, 20, 7], "strings": ["cat", "dog", "émeu"]}


def _seq_map_type(kind):
    key = TensorProto.STRING if kind == "strings" else TensorProto.INT64
    return helper.make_sequence_type_proto(
        helper.make_map_type_proto(key, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))


def _zipmap_model(kind, x_shape=("N", 3), **attrs):
    attrs = attrs or {f"classlabels_{kind}": LABELS[kind]}
    node = helper.make_node("ZipMap", ["x"], ["y"], name="zm", domain=ML, **attrs)
    return model([node], [tensor("x", x_shape)], [helper.make_value_info("y", _seq_map_type(kind))],
                 opset=17, domains={ML: 1})


def _classifier_model(kind):
    """LinearClassifier (softmax scores) → ZipMap, as skl2onnx writes a logistic regression."""
    rng = np.random.default_rng(0)
    labels = {f"classlabels_{'ints' if kind == 'int64s' else kind}": LABELS[kind]}
    nodes = [
        helper.make_node("LinearClassifier", ["x"], ["label", "scores"], name="lc", domain=ML,
                         coefficients=rng.standard_normal(3 * 4).astype(np.float32).tolist(),
                         intercepts=[0.1, -0.2, 0.3], post_transform="SOFTMAX", **labels),
        helper.make_node("ZipMap", ["scores"], ["probabilities"], name="zm", domain=ML,
                         **{f"classlabels_{kind}": LABELS[kind]}),
    ]
    label_type = TensorProto.STRING if kind == "strings" else TensorProto.INT64
    return model(nodes, [tensor("x", ["N", 4])],
                 [tensor("label", ["N"], label_type), helper.make_value_info("probabilities", _seq_map_type(kind))],
                 opset=17, domains={ML: 1})


def _both(m, feeds):
    ours = glassrt.InferenceSession(m, providers=["cpu"]).run(None, feeds)
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    return ours, theirs


def _assert_same_maps(ours, theirs, exact=True):
    assert type(ours) is list and len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert type(a) is dict
        assert list(a) == list(b)  # same keys, same order
        assert [type(k) for k in a] == [type(k) for k in b]
        assert all(type(v) is float for v in a.values())
        if exact:
            assert a == b  # float32 scores widened exactly, as onnxruntime does
        else:  # scores computed by another op: within float32 rounding
            np.testing.assert_allclose(list(a.values()), list(b.values()), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["int64s", "strings"])
@pytest.mark.parametrize("n", [0, 1, 5])
def test_classifier_then_zipmap_as_onnxruntime(kind, n):
    x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
    (label, probs), (ort_label, ort_probs) = _both(_classifier_model(kind), {"x": x})
    np.testing.assert_array_equal(label, ort_label)
    _assert_same_maps(probs, ort_probs, exact=False)
    assert len(probs) == n


@pytest.mark.parametrize("kind", ["int64s", "strings"])
def test_zipmap_alone_and_its_declared_type(kind):
    m = _zipmap_model(kind)
    x = np.array([[0.1, 0.2, 0.7], [1e-8, -3.5, np.inf]], np.float32)
    ours, theirs = _both(m, {"x": x})
    _assert_same_maps(ours[0], theirs[0])
    assert list(ours[0][0]) == sorted(LABELS[kind])  # onnxruntime's maps are ordered by key
    sess = glassrt.InferenceSession(m)
    ort_out = ort.InferenceSession(m.SerializeToString()).get_outputs()[0]
    assert sess.get_outputs()[0].type == ort_out.type == f"seq(map({'string' if kind == 'strings' else 'int64'},tensor(float)))"
    assert sess.get_outputs()[0].shape == ort_out.shape == []


def test_a_repeated_label_keeps_its_last_column():
    for kind, labels in (("int64s", [5, 3, 5]), ("strings", ["b", "a", "b"])):
        ours, theirs = _both(_zipmap_model(kind, **{f"classlabels_{kind}": labels}),
                             {"x": np.array([[1, 2, 3]], np.float32)})
        _assert_same_maps(ours[0], theirs[0])
        assert list(ours[0][0].values()) == [2.0, 3.0]


def test_a_one_d_input_is_one_row():
    m = _zipmap_model("int64s", x_shape=None)
    x = np.array([0.25, 0.5, 0.25], np.float32)
    ours, theirs = _both(m, {"x": x})
    _assert_same_maps(ours[0], theirs[0])
    assert len(ours[0]) == 1


def test_wrong_width_is_an_error_that_names_the_node():
    m = _zipmap_model("int64s", x_shape=["N", "C"])
    sess = glassrt.InferenceSession(m)
    with pytest.raises(glassrt.GlassrtError, match=r"ZipMap node 'zm'.*input 0 'x' has 2 columns.*3 class labels"):
        sess.run(None, {"x": np.zeros((4, 2), np.float32)})
    with pytest.raises(Exception, match="number of classlabels"):  # onnxruntime refuses it too
        ort.InferenceSession(m.SerializeToString()).run(None, {"x": np.zeros((4, 2), np.float32)})
    with pytest.raises(glassrt.GlassrtError, match=r"ZipMap node 'zm'.*must be \[N, C\] or \[C\], got rank 3"):
        glassrt.InferenceSession(_zipmap_model("int64s", x_shape=None)).run(None, {"x": np.zeros((2, 3, 1), np.float32)})
    # Known at load: the session is refused at creation.
    with pytest.raises(glassrt.GlassrtError, match=r"ZipMap node 'zm'.*has 2 columns"):
        glassrt.InferenceSession(_zipmap_model("strings", x_shape=[2, 2]))


@pytest.mark.parametrize("attrs, says", [
    ({"classlabels_int64s": [1, 2, 3], "classlabels_strings": ["a", "b", "c"]}, "got both"),
    ({}, "got neither"),
])
def test_labels_must_be_one_list(attrs, says):
    node = helper.make_node("ZipMap", ["x"], ["y"], name="zm", domain=ML, **attrs)
    m = model([node], [tensor("x", [2, 3])], [helper.make_value_info("y", _seq_map_type("int64s"))],
              opset=17, domains={ML: 1})
    with pytest.raises(glassrt.GlassrtError, match=f"ZipMap node 'zm'.*{says}"):
        glassrt.InferenceSession(m)


def test_map_types_load_and_round_trip():
    tp = _seq_map_type("strings")
    t = parse_type(tp)
    assert t == SequenceType(MapType(np.dtype(object), TensorType(np.dtype(np.float32), ())))
    assert str(t) == "seq(map(string,float[]))"
    assert to_type_proto(t) == tp
    with pytest.raises(glassrt.GlassrtError, match="map key must be an integer or a string"):
        parse_type(helper.make_map_type_proto(TensorProto.FLOAT, helper.make_tensor_type_proto(TensorProto.FLOAT, [])),
                   "m")


def test_a_map_input_is_checked_when_fed():
    # A graph whose input is a seq(map(int64, float)) passed straight through (Identity).
    m = model([helper.make_node("Identity", ["s"], ["t"])], [helper.make_value_info("s", _seq_map_type("int64s"))],
              [helper.make_value_info("t", _seq_map_type("int64s"))], opset=17, domains={ML: 1})
    sess = glassrt.InferenceSession(m, providers=["cpu"])
    assert sess.get_inputs()[0].type == "seq(map(int64,tensor(float)))"
    feed = [{1: 0.5, 2: 0.25}]
    assert sess.run(None, {"s": feed})[0] == feed
    with pytest.raises(glassrt.GlassrtError, match=r"input 's\[0\]': expected a map"):
        sess.run(None, {"s": [np.zeros(2, np.float32)]})
    with pytest.raises(glassrt.GlassrtError, match=r"input 's\[0\]': expected int64 keys, got str"):
        sess.run(None, {"s": [{"a": 0.5}]})


def test_sklearn_logistic_regression_through_skl2onnx():
    skl2onnx = pytest.importorskip("skl2onnx")
    datasets = pytest.importorskip("sklearn.datasets")
    linear_model = pytest.importorskip("sklearn.linear_model")
    X, y = datasets.load_iris(return_X_y=True)
    X = X.astype(np.float32)
    names = np.array(["setosa", "versicolor", "virginica"])
    for target in (y, names[y], (y > 0).astype(np.int64)):  # int labels, string labels, binary
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf = linear_model.LogisticRegression(max_iter=500).fit(X, target)
            onx = skl2onnx.to_onnx(clf, X[:1], target_opset={"": 17, ML: 3})
        assert onx.graph.node[-1].op_type == "ZipMap"
        sess = glassrt.InferenceSession(onx, providers=["cpu"])
        assert [o.type for o in sess.get_outputs()] == [
            o.type for o in ort.InferenceSession(onx.SerializeToString()).get_outputs()]
        for rows in (X[:0], X[::7]):
            (label, probs), (ort_label, ort_probs) = _both(onx, {"X": rows})
            np.testing.assert_array_equal(label, ort_label)
            assert len(probs) == len(ort_probs) == len(rows)
            _assert_same_maps(probs, ort_probs, exact=False)
            if len(rows):  # and the same answer as scikit-learn itself
                np.testing.assert_array_equal(label, clf.predict(rows))
                np.testing.assert_allclose([[p[c] for c in clf.classes_.tolist()] for p in probs],
                                           clf.predict_proba(rows), rtol=1e-4, atol=1e-5)
