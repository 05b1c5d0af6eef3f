"""ai.onnx.ml tree ensembles: the compiled pass over rows and trees (kernels/cpu/ml.py
`_forest_sums`, once Numba is loaded) gives the bits of the NumPy loop it replaces, on
forests with every branch mode, missing values and set membership, and onnxruntime's results
on scikit-learn's forests as skl2onnx writes them."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
import glassrt.kernels.cpu.ml as ml
from glassrt.kernels.cpu._jit import numba_missing

from .helpers import count_calls, model, ort_outputs, tensor

pytestmark = pytest.mark.skipif(numba_missing() is not None, reason=f"{numba_missing()}")
ML = "ai.onnx.ml"
RNG = np.random.default_rng(5)


def _both_paths(monkeypatch, m, feeds):
    """The outputs with the NumPy loop, then with the compiled pass."""
    out = []
    for compiled in (False, True):
        monkeypatch.setattr(ml, "use_compiled", lambda path, after=64, c=compiled: c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(glassrt.InferenceSession(m.SerializeToString()).run(None, feeds))
    return out


def _classifier(attrs, n_features):
    """A TreeEnsembleClassifier model (ai.onnx.ml 3) over [N, n_features]."""
    return model([helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "scores"], name="trees", domain=ML,
                                   **attrs)],
                 [tensor("x", [None, n_features])], [tensor("label", None, TensorProto.INT64), tensor("scores", None)],
                 opset=17, domains={ML: 3}, ir_version=8)


def _same_bits_and_onnxruntimes(numpy_loop, compiled, m, x):
    """The compiled pass gives the NumPy loop's bits, and onnxruntime's labels and scores."""
    for u, v in zip(numpy_loop, compiled):
        np.testing.assert_array_equal(u, v)
    want = ort_outputs(m, {"x": x})
    np.testing.assert_array_equal(compiled[0], want[0])
    np.testing.assert_allclose(compiled[1], want[1], rtol=1e-5, atol=1e-6)


def _random_old_forest(n_trees, depth, n_features, modes):
    """TreeEnsemble{Regressor,Classifier} node attributes of full binary trees."""
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_modes", "nodes_featureids", "nodes_values",
                         "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true")}
    leaves = []
    for t in range(n_trees):
        n_internal = 2 ** depth - 1
        for i in range(2 ** (depth + 1) - 1):
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            internal = i < n_internal
            a["nodes_modes"].append(str(RNG.choice(modes)) if internal else "LEAF")
            a["nodes_featureids"].append(int(RNG.integers(n_features)) if internal else 0)
            a["nodes_values"].append(float(np.round(RNG.standard_normal(), 1)) if internal else 0.0)
            a["nodes_truenodeids"].append(2 * i + 1 if internal else 0)
            a["nodes_falsenodeids"].append(2 * i + 2 if internal else 0)
            a["nodes_missing_value_tracks_true"].append(int(RNG.integers(2)) if internal else 0)
            if not internal:
                leaves.append((t, i))
    return a, leaves


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE"])
def test_regressor_compiled_pass_gives_the_numpy_loops_bits(monkeypatch, aggregate):
    modes = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
    a, leaves = _random_old_forest(7, 4, 5, modes)
    a.update(target_treeids=[t for t, _ in leaves] * 2, target_nodeids=[i for _, i in leaves] * 2,
             target_ids=[0] * len(leaves) + [1] * len(leaves), target_weights=RNG.standard_normal(2 * len(leaves)).tolist(),
             n_targets=2, aggregate_function=aggregate, base_values=[0.5, -0.25])
    m = model([helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], name="trees", domain=ML, **a)],
              [tensor("x", [None, 5])], [tensor("y", None)], opset=17, domains={ML: 3}, ir_version=8)
    x = np.round(RNG.standard_normal((40, 5)), 1).astype(np.float32)  # (rounded: equal to thresholds at times)
    x[::5, 2] = np.nan  # missing values, some tracking true
    numpy_loop, compiled = _both_paths(monkeypatch, m, {"x": x})
    np.testing.assert_array_equal(numpy_loop[0], compiled[0])
    np.testing.assert_allclose(compiled[0], ort_outputs(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_classifier_compiled_pass_gives_the_numpy_loops_bits(monkeypatch):
    a, leaves = _random_old_forest(5, 3, 4, ["BRANCH_LEQ", "BRANCH_GT", "BRANCH_NEQ"])
    a.update(class_treeids=[t for t, _ in leaves] * 3, class_nodeids=[i for _, i in leaves] * 3,
             class_ids=[c for c in range(3) for _ in leaves], class_weights=RNG.random(3 * len(leaves)).tolist(),
             classlabels_int64s=[10, 20, 30], post_transform="SOFTMAX")
    m = _classifier(a, 4)
    x = RNG.standard_normal((30, 4)).astype(np.float32)
    numpy_loop, compiled = _both_paths(monkeypatch, m, {"x": x})
    _same_bits_and_onnxruntimes(numpy_loop, compiled, m, x)


def test_set_membership_and_a_cycle_on_the_compiled_pass(monkeypatch):
    """TreeEnsemble (ai.onnx.ml 5): a MEMBER node; then a tree whose node points back at its
    root, refused with the NumPy loop's error."""
    attrs = dict(n_targets=1, aggregate_function=1, post_transform=0, tree_roots=[0],
                 nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [2], [6, 0]),
                 nodes_featureids=[0, 1], nodes_splits=helper.make_tensor("s", TensorProto.FLOAT, [2], [0.0, 1.5]),
                 nodes_truenodeids=[0, 0], nodes_trueleafs=[1, 1], nodes_falsenodeids=[1, 1],
                 nodes_falseleafs=[0, 1], membership_values=helper.make_tensor("v", TensorProto.FLOAT, [3], [1, 3, 5]),
                 leaf_targetids=[0, 0], leaf_weights=helper.make_tensor("w", TensorProto.FLOAT, [2], [10.0, 20.0]))
    m = model([helper.make_node("TreeEnsemble", ["x"], ["y"], name="trees", domain=ML, **attrs)],
              [tensor("x", [None, 2])], [tensor("y", None)], opset=21, domains={ML: 5}, ir_version=10)
    x = np.array([[1, 0], [2, 2], [5, 2], [3, 1], [np.nan, 2]], np.float32)
    numpy_loop, compiled = _both_paths(monkeypatch, m, {"x": x})
    np.testing.assert_array_equal(numpy_loop[0], compiled[0])
    np.testing.assert_array_equal(compiled[0].ravel(), [10, 20, 10, 10, 20])  # x0 in {1, 3, 5}: 10; else x1 <= 1.5: 10, or 20

    cyclic = dict(attrs, nodes_falseleafs=[0, 0], nodes_falsenodeids=[1, 0])
    m = model([helper.make_node("TreeEnsemble", ["x"], ["y"], name="trees", domain=ML, **cyclic)],
              [tensor("x", [None, 2])], [tensor("y", None)], opset=21, domains={ML: 5}, ir_version=10)
    monkeypatch.setattr(ml, "use_compiled", lambda path, after=64: True)
    with pytest.raises(glassrt.GlassrtError, match="TreeEnsemble node 'trees'.*cycle"):
        glassrt.InferenceSession(m.SerializeToString()).run(None, {"x": np.array([[2.0, 2.0]], np.float32)})


def _random_uneven_forest(n_trees, max_depth, n_features, mode):
    """TreeEnsembleClassifier attributes of trees of uneven depth (a branch ends early at
    random), every node comparing with `mode`, some tracking missing values as true."""
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_modes", "nodes_featureids", "nodes_values",
                         "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true")}
    leaves = []
    for t in range(n_trees):
        ids = iter(range(10 ** 6))
        todo = [(next(ids), 0)]
        while todo:
            i, depth = todo.pop()
            internal = depth < max_depth and (depth < 2 or RNG.random() < 0.7)
            kids = (next(ids), next(ids)) if internal else (0, 0)
            for k, v in (("nodes_treeids", t), ("nodes_nodeids", i), ("nodes_modes", mode if internal else "LEAF"),
                         ("nodes_featureids", int(RNG.integers(n_features)) if internal else 0),
                         ("nodes_values", float(np.round(RNG.standard_normal(), 1)) if internal else 0.0),
                         ("nodes_truenodeids", kids[0]), ("nodes_falsenodeids", kids[1]),
                         ("nodes_missing_value_tracks_true", int(RNG.integers(2)) if internal else 0)):
                a[k].append(v)
            if internal:
                todo += [(kids[0], depth + 1), (kids[1], depth + 1)]
            else:
                leaves.append((t, i))
    return a, leaves


@pytest.mark.parametrize("mode", ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"])
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 40])
def test_trees_of_one_comparison_walked_interleaved_give_the_numpy_loops_bits(monkeypatch, mode, rows):
    """Nodes that all compare alike take the interleaved walk (eight (tree, row) pairs a
    level at a time, leaves holding their rows): trees of uneven depth, a group that spans
    trees (one row) or rows, missing values; the NumPy loop's bits, onnxruntime's results."""
    a, leaves = _random_uneven_forest(11, 7, 5, mode)
    a.update(class_treeids=[t for t, _ in leaves] * 3, class_nodeids=[i for _, i in leaves] * 3,
             class_ids=[c for c in range(3) for _ in leaves], class_weights=RNG.random(3 * len(leaves)).tolist(),
             classlabels_int64s=[1, 2, 3], post_transform="LOGISTIC")
    m = _classifier(a, 5)
    x = np.round(RNG.standard_normal((rows, 5)), 1).astype(np.float32)  # (rounded: equal to thresholds at times)
    x[::3, 1] = np.nan
    monkeypatch.setattr(ml, "_INTERLEAVE_FROM", 0)  # (these forests are small: interleaved all the same)
    walked = count_calls(monkeypatch, ml, "_forest_sums_interleaved")
    numpy_loop, compiled = _both_paths(monkeypatch, m, {"x": x})
    assert walked, "the interleaved walk did not run"
    _same_bits_and_onnxruntimes(numpy_loop, compiled, m, x)


def test_a_cycle_among_nodes_of_one_comparison_is_still_refused(monkeypatch):
    """The interleaved walk does not take a forest whose tree cycles (it would walk it for
    ever): the general pass reports it, naming the node."""
    a, leaves = _random_uneven_forest(2, 3, 3, "BRANCH_LEQ")
    a["nodes_falsenodeids"][a["nodes_modes"].index("BRANCH_LEQ", 1)] = 0  # back to the root of tree 0
    a.update(class_treeids=[t for t, _ in leaves], class_nodeids=[i for _, i in leaves], class_ids=[0] * len(leaves),
             class_weights=[1.0] * len(leaves), classlabels_int64s=[0, 1, 2])
    m = _classifier(a, 3)
    monkeypatch.setattr(ml, "use_compiled", lambda path, after=64: True)
    monkeypatch.setattr(ml, "_INTERLEAVE_FROM", 0)
    with pytest.raises(glassrt.GlassrtError, match="TreeEnsembleClassifier node 'trees'.*cycle"):
        glassrt.InferenceSession(m.SerializeToString()).run(None, {"x": np.full((4, 3), 9.0, np.float32)})


def test_scikit_learn_forests_agree_with_onnxruntime(monkeypatch):
    pytest.importorskip("sklearn")
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestRegressor

    x = RNG.standard_normal((200, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)
    for est, target in ((GradientBoostingClassifier(n_estimators=15, random_state=0), y),
                        (RandomForestRegressor(n_estimators=15, max_depth=5, random_state=0), x[:, 3] * 2)):
        onx = skl2onnx.to_onnx(est.fit(x, target), x[:1], options={id(est): {"zipmap": False}}
                               if hasattr(est, "predict_proba") else None)
        feeds = {onx.graph.input[0].name: x[:40]}
        numpy_loop, compiled = _both_paths(monkeypatch, onx, feeds)
        want = ort_outputs(onx, feeds)
        for u, v, w in zip(numpy_loop, compiled, want):
            np.testing.assert_array_equal(u, v)
            np.testing.assert_allclose(np.asarray(v, np.float64), np.asarray(w, np.float64), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("change, says", [
    (dict(nodes_trueleafs=[1, 1], nodes_truenodeids=[0, 7]), r"nodes_truenodeids\[1\] is 7, not a leaf of the 2"),
    (dict(nodes_falseleafs=[0, 0], nodes_falsenodeids=[-3, 1]), r"nodes_falsenodeids\[0\] is -3, not a node"),
    (dict(nodes_falseleafs=[0, 0], nodes_falsenodeids=[1, 2]), r"nodes_falsenodeids\[1\] is 2, not a node of the 2"),
    (dict(tree_roots=[2]), r"tree_roots\[0\] is 2, not a node of the 2"),
    (dict(leaf_targetids=[0]), "leaf_targetids.*leaf_weights"),
    (dict(aggregate_function=-1), "aggregate_function -1"),
    (dict(post_transform=5), "post_transform 5"),
    (dict(nodes_featureids=[0, -1]), "reads feature -1"),
])
def test_a_hostile_tree_is_refused_naming_the_node_before_anything_runs(monkeypatch, change, says):
    """Children, roots and features out of range: refused when the plan binds (the compiled
    pass indexes with them unchecked), on either path."""
    attrs = dict(n_targets=1, aggregate_function=1, post_transform=0, tree_roots=[0],
                 nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [2], [0, 0]),
                 nodes_featureids=[0, 1], nodes_splits=helper.make_tensor("s", TensorProto.FLOAT, [2], [0.0, 1.5]),
                 nodes_truenodeids=[0, 0], nodes_trueleafs=[1, 1], nodes_falsenodeids=[1, 1],
                 nodes_falseleafs=[0, 1], leaf_targetids=[0, 0],
                 leaf_weights=helper.make_tensor("w", TensorProto.FLOAT, [2], [10.0, 20.0]))
    m = model([helper.make_node("TreeEnsemble", ["x"], ["y"], name="trees", domain=ML, **{**attrs, **change})],
              [tensor("x", [None, 2])], [tensor("y", None)], opset=21, domains={ML: 5}, ir_version=10)
    for compiled in (False, True):
        monkeypatch.setattr(ml, "use_compiled", lambda path, after=64, c=compiled: c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(glassrt.GlassrtError, match=f"TreeEnsemble node 'trees'.*{says}"):
                glassrt.InferenceSession(m.SerializeToString()).run(None, {"x": np.ones((3, 2), np.float32)})
