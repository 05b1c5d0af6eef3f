"""The onednn provider's Transpose (a oneDNN reorder through permuted strides): which
transposes it takes, and that it computes NumPy's transpose, whatever the input's strides."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi
from glassrt.kernels.onednn.transpose import reduced

from .helpers import model, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=f"oneDNN: {capi.UNAVAILABLE}")


def _transpose_model(shape, perm):
    node = helper.make_node("Transpose", ["x"], ["y"], name="t", **({} if perm is None else {"perm": list(perm)}))
    return model([node], [tensor("x", list(shape))], [tensor("y", None)], opset=17)


def test_reduced_drops_dims_of_one_and_merges_neighbours():
    assert reduced((1, 128, 12, 64), (0, 2, 3, 1)) == ((128, 768), (1, 0))  # BERT's keys: a 2-D transpose
    assert reduced((1, 128, 12, 64), (0, 2, 1, 3)) == ((128, 12, 64), (1, 0, 2))
    assert reduced((1, 1, 12, 64), (0, 2, 1, 3)) == ((768,), (0,))  # only a dim of 1 moves: no transpose
    assert reduced((2, 3, 4, 5), (3, 1, 0, 2)) == ((2, 3, 4, 5), (3, 1, 0, 2))
    assert reduced((1, 1), (1, 0)) == ((), ())


@pytest.mark.parametrize("shape, perm", [
    ((1, 128, 12, 64), (0, 2, 3, 1)),  # the innermost dim moves
    ((2, 16, 16, 32), (0, 3, 1, 2)),  # NHWC -> NCHW
    ((96, 80), None),  # no perm: the dims reversed
    ((3, 1, 40, 50), (2, 1, 3, 0)),  # a dim of 1 among those that move
    ((4, 64, 8, 128), (0, 2, 1, 3)),  # whole rows move, 262,144 elements
    ((5, 6, 7, 8, 9), (4, 2, 0, 3, 1)),
])
def test_takes_large_transposes_and_matches_numpy(shape, perm):
    sess = glassrt.InferenceSession(_transpose_model(shape, perm), providers=["onednn", "cpu"])
    assert sess.explain()["nodes"][0]["kernel"] == "onednn.Transpose"
    rng = np.random.default_rng(0)
    for _ in range(2):  # a replay reuses the bound primitive and its memories
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.transpose(x, perm))


def test_a_strided_input_is_read_as_its_values():
    """A caller's array that is a view with other strides (a transposed or sliced array): the
    primitive reads C-order memory, so the kernel copies it first."""
    shape, perm = (1, 64, 12, 64), (0, 2, 3, 1)
    sess = glassrt.InferenceSession(_transpose_model(shape, perm), providers=["onednn", "cpu"])
    base = np.random.default_rng(1).standard_normal((1, 12, 64, 64)).astype(np.float32)
    for x in (base.transpose(0, 2, 1, 3), np.random.default_rng(2).standard_normal((1, 64, 24, 64))
              .astype(np.float32)[:, :, ::2]):
        assert not x.flags.c_contiguous
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.transpose(x, perm))


@pytest.mark.parametrize("shape, perm, why", [
    ((1, 8, 8, 16), (0, 2, 3, 1), "under 4,096"),
    ((1, 128, 12, 64), (0, 2, 1, 3), "innermost dim stays innermost"),
    ((1, 1, 12, 64), (0, 2, 1, 3), "only dims of size 1"),
])
def test_leaves_to_numpy_what_numpy_copies_as_fast(shape, perm, why):
    sess = glassrt.InferenceSession(_transpose_model(shape, perm), providers=["onednn", "cpu"])
    node = sess.explain()["nodes"][0]
    assert node["provider"] == "cpu" and why in node["reason"]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.transpose(x, perm))


def test_a_symbolic_batch_binds_per_plan_and_small_plans_move_to_numpy():
    """Placed on oneDNN for its symbolic batch; a batch whose transpose is too small for it
    runs on the cpu kernel in that plan, each plan right."""
    m = _transpose_model(("n", 16, 8, 16), (0, 2, 3, 1))
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    assert sess.placement.decisions[sess.graph.nodes[0].name].provider == "onednn"
    # explain without dims shows what a plan at batch 1 binds: too small for oneDNN, and says so
    unbound = sess.explain()["nodes"][0]
    assert unbound["provider"] == "cpu" and "a plan at batch 1 runs it on cpu" in unbound["reason"], unbound
    rng = np.random.default_rng(4)
    for n in (3, 1, 3):  # 6,144 elements, then 2,048
        x = rng.standard_normal((n, 16, 8, 16)).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.transpose(x, (0, 2, 3, 1)))
    assert sess.explain({"n": 3})["nodes"][0]["kernel"] == "onednn.Transpose"
    assert sess.explain({"n": 1})["nodes"][0]["kernel"] == "cpu.Transpose"
