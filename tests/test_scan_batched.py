"""A Scan whose iterations are independent runs its body once over all of them
(kernels/cpu/scan_batched.py): the bits equal the iteration loop's, the results
onnxruntime's, and it does not fire where an iteration reads the one before."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.kernels.cpu import scan_batched

from .helpers import init, model, tensor

RNG = np.random.default_rng(11)


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _scan_kernel(sess):
    return {n["name"]: n for n in sess.explain()["nodes"]}["scan"]


def _cdist(metric, opset=17, reduce_axes_as_input=False, keepdims=0, scan_attrs=None, dtype=TensorProto.FLOAT):
    """skl2onnx's cdist: the queries X as a state passed on unchanged, one training row a step."""
    axes = init("axes", np.array([1], np.int64))
    red = "ReduceSumSquare" if metric == "sqeuclidean" else "ReduceSum"
    reduce_axes_as_input = reduce_axes_as_input or red == "ReduceSum"  # (ReduceSum's axes are an input from opset 13)
    body_nodes = [helper.make_node("Identity", ["next_in"], ["next_out"]),
                  helper.make_node("Sub", ["next_in", "next"], ["diff"])]
    src = "diff"
    if metric == "cityblock":
        body_nodes.append(helper.make_node("Abs", ["diff"], ["absd"]))
        src = "absd"
    if reduce_axes_as_input:
        body_nodes.append(helper.make_node(red, [src, "axes"], ["red"], keepdims=keepdims))
    else:
        body_nodes.append(helper.make_node(red, [src], ["red"], axes=[1], keepdims=keepdims))
    body_nodes.append(helper.make_node("Identity", ["red"], ["scan_out"]))
    body = helper.make_graph(body_nodes, "body", [tensor("next_in", ["n", 4], dtype), tensor("next", [4], dtype)],
                             [tensor("next_out", ["n", 4], dtype), tensor("scan_out", None, dtype)],
                             [axes] if reduce_axes_as_input else [])
    node = helper.make_node("Scan", ["X", "rows"], ["X_out", "dists"], body=body, num_scan_inputs=1, name="scan",
                            **(scan_attrs or {}))
    return model([node], [tensor("X", ["n", 4], dtype), tensor("rows", ["r", 4], dtype)],
                 [tensor("X_out", None, dtype), tensor("dists", None, dtype)], opset=opset)


def _loop_results(monkeypatch, m, feeds):
    """The iteration loop's results (the all-at-once path turned away at run time)."""
    with monkeypatch.context() as mp:
        mp.setattr(scan_batched, "run", lambda *a, **k: None)
        return glassrt.InferenceSession(m.SerializeToString()).run(None, feeds)


CASES = [dict(metric="sqeuclidean"), dict(metric="cityblock"), dict(metric="sqeuclidean", keepdims=1),
         dict(metric="sqeuclidean", opset=18, reduce_axes_as_input=True),
         dict(metric="cityblock", scan_attrs=dict(scan_input_directions=[1], scan_output_directions=[1])),
         dict(metric="sqeuclidean", scan_attrs=dict(scan_output_axes=[1]))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_independent_iterations_run_at_once_with_the_loops_bits(case, dtype, monkeypatch):
    m = _cdist(**case, dtype=TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE)
    feeds = {"X": RNG.standard_normal((3, 4)).astype(dtype), "rows": RNG.standard_normal((40, 4)).astype(dtype)}
    sess = glassrt.InferenceSession(m.SerializeToString())
    assert _scan_kernel(sess)["kernel"] == "cpu.Scan.all_at_once"
    got = sess.run(None, feeds)
    for g, loop, want in zip(got, _loop_results(monkeypatch, m, feeds), _ort(m, feeds)):
        assert g.shape == loop.shape and g.dtype == loop.dtype
        np.testing.assert_array_equal(g, loop)
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6)


def test_a_large_scan_is_cut_into_chunks_with_the_same_result(monkeypatch):
    m = _cdist("sqeuclidean")
    feeds = {"X": RNG.standard_normal((5, 4)).astype(np.float32), "rows": RNG.standard_normal((37, 4)).astype(np.float32)}
    whole = glassrt.InferenceSession(m.SerializeToString()).run(None, feeds)
    monkeypatch.setattr(scan_batched, "CHUNK_BYTES", 5 * 4 * 4 * 3)  # three rows a chunk
    chunked = glassrt.InferenceSession(m.SerializeToString()).run(None, feeds)
    for a, b in zip(whole, chunked):
        np.testing.assert_array_equal(a, b)


def test_several_scan_inputs_and_outputs_and_an_output_every_iteration_shares(monkeypatch):
    """Two scan inputs (one scanned along axis 1), three scan outputs, one of them the same
    in every iteration (it reads the state only), a Div, a Sqrt and a ReduceMax."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["s_in"], ["s_out"]),
         helper.make_node("Mul", ["a", "b"], ["ab"]),
         helper.make_node("Div", ["ab", "s_in"], ["q"]),
         helper.make_node("ReduceMax", ["q"], ["m"], axes=[-1], keepdims=0),
         helper.make_node("Abs", ["s_in"], ["sa"]),
         helper.make_node("Sqrt", ["sa"], ["root"]),
         helper.make_node("Neg", ["q"], ["nq"])],
        "body", [tensor("s_in", [2, 3]), tensor("a", [3]), tensor("b", [2, 3])],
        [tensor("s_out", [2, 3]), tensor("m", None), tensor("root", None), tensor("nq", None)])
    node = helper.make_node("Scan", ["s", "A", "B"], ["s_final", "ms", "roots", "nqs"], body=body, num_scan_inputs=2,
                            scan_input_axes=[0, 1], name="scan")
    m = model([node], [tensor("s", [2, 3]), tensor("A", [6, 3]), tensor("B", [2, 6, 3])],
              [tensor(v, None) for v in ("s_final", "ms", "roots", "nqs")], opset=17)
    feeds = {"s": RNG.uniform(0.5, 2, (2, 3)).astype(np.float32), "A": RNG.standard_normal((6, 3)).astype(np.float32),
             "B": RNG.standard_normal((2, 6, 3)).astype(np.float32)}
    sess = glassrt.InferenceSession(m.SerializeToString())
    assert _scan_kernel(sess)["kernel"] == "cpu.Scan.all_at_once"
    for g, loop, want in zip(sess.run(None, feeds), _loop_results(monkeypatch, m, feeds), _ort(m, feeds)):
        np.testing.assert_array_equal(g, loop)
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6)


def test_iterations_that_read_the_one_before_or_other_ops_run_one_by_one():
    carried = helper.make_graph([helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
                                 helper.make_node("Identity", ["acc_out"], ["y"])],
                                "body", [tensor("acc_in", [4]), tensor("x", [4])], [tensor("acc_out", [4]), tensor("y", [4])])
    other_op = helper.make_graph([helper.make_node("Identity", ["acc_in"], ["acc_out"]),
                                  helper.make_node("Exp", ["x"], ["y"])],
                                 "body", [tensor("acc_in", [4]), tensor("x", [4])], [tensor("acc_out", [4]), tensor("y", [4])])
    for body, why in ((carried, "state 0 changes from one iteration to the next"),
                      (other_op, "Exp node")):
        node = helper.make_node("Scan", ["acc", "xs"], ["acc_final", "ys"], body=body, num_scan_inputs=1, name="scan")
        for rows_dim in (5, "r"):  # (a symbolic row count: a plan that also runs no iteration)
            m = model([node], [tensor("acc", [4]), tensor("xs", [rows_dim, 4])],
                      [tensor("acc_final", None), tensor("ys", None)], opset=17)
            sess = glassrt.InferenceSession(m.SerializeToString())
            if rows_dim == 5:
                row = _scan_kernel(sess)
                assert row["kernel"] == "cpu.Scan" and why in row["reason"], row
            feeds = {"acc": RNG.standard_normal(4).astype(np.float32), "xs": RNG.standard_normal((5, 4)).astype(np.float32)}
            for g, want in zip(sess.run(None, feeds), _ort(m, feeds)):
                np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6)
            if rows_dim == "r":  # no iteration (onnxruntime refuses it): outputs shaped as one would have made them
                acc_final, ys = sess.run(None, {"acc": feeds["acc"], "xs": np.zeros((0, 4), np.float32)})
                np.testing.assert_array_equal(acc_final, feeds["acc"])
                assert ys.shape == (0, 4) and ys.dtype == np.float32


def test_integer_values_take_the_loop_and_an_empty_scan_gives_empty_outputs():
    m = _cdist("sqeuclidean", dtype=TensorProto.INT64)
    feeds = {"X": RNG.integers(-9, 9, (3, 4)), "rows": RNG.integers(-9, 9, (6, 4))}
    got = glassrt.InferenceSession(m.SerializeToString()).run(None, feeds)
    for g, want in zip(got, _ort(m, feeds)):
        np.testing.assert_array_equal(g, want)
    m = _cdist("sqeuclidean")
    empty = {"X": RNG.standard_normal((3, 4)).astype(np.float32), "rows": np.zeros((0, 4), np.float32)}
    got = glassrt.InferenceSession(m.SerializeToString()).run(None, empty)
    assert got[1].shape[0] == 0
    np.testing.assert_array_equal(got[0], empty["X"])


def test_a_reduction_over_an_empty_axis_gives_the_loops_identity(monkeypatch):
    """ReduceMax over a zero-length axis in every iteration: -inf, as the loop's kernel gives
    (reduce.py's own reductions make the batched values too)."""
    body = helper.make_graph([helper.make_node("Identity", ["s_in"], ["s_out"]),
                              helper.make_node("Add", ["s_in", "row"], ["t"]),
                              helper.make_node("ReduceMax", ["t"], ["m"], axes=[1], keepdims=0)],
                             "body", [tensor("s_in", [3, 0]), tensor("row", [0])], [tensor("s_out", [3, 0]), tensor("m", None)])
    node = helper.make_node("Scan", ["s", "rows"], ["s_final", "ms"], body=body, num_scan_inputs=1, name="scan")
    m = model([node], [tensor("s", [3, 0]), tensor("rows", [4, 0])], [tensor("s_final", None), tensor("ms", None)],
              opset=17)
    feeds = {"s": np.zeros((3, 0), np.float32), "rows": np.zeros((4, 0), np.float32)}
    sess = glassrt.InferenceSession(m.SerializeToString())
    assert _scan_kernel(sess)["kernel"] == "cpu.Scan.all_at_once"
    got = sess.run(None, feeds)
    for g, loop in zip(got, _loop_results(monkeypatch, m, feeds)):
        np.testing.assert_array_equal(g, loop)
    assert got[1].shape == (4, 3) and (got[1] == -np.inf).all()
