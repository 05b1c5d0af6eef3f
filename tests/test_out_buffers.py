"""Kernels write into the buffers the plan hands them (`out=`): the helpers they do it with,
custom ops registered with out=True, and the lazily compiled Numba loops behind them."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.kernels.buffers import as_out, tiles, write_elementwise


# ---------------------------------------------------------------- helpers


@pytest.mark.parametrize("shape, limit", [((), 4), ((7,), 3), ((5, 6, 7), 10), ((3, 100), 7), ((2, 0, 3), 4),
                                          ((4, 5), 1000)])
def test_tiles_cover_every_element_once_within_the_limit(shape, limit):
    seen = np.zeros(shape, np.int64)
    for idx in tiles(shape, limit):
        block = seen[idx]
        assert block.size <= max(limit, 1) or block.ndim == 0
        seen[idx] += 1
    assert (seen == 1).all()


def test_write_elementwise_gives_the_bits_of_the_whole_array_expression():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 41)).astype(np.float32)
    b = rng.standard_normal(41).astype(np.float32)

    def fn(u, v):
        return (u / (1 + np.abs(u + v)) * np.float32(0.7)).astype(np.float32)

    out = np.empty_like(x)
    assert write_elementwise(out, fn, x, b, limit=100) is out
    assert out.tobytes() == fn(x, b).tobytes()
    assert write_elementwise(None, fn, x, b).tobytes() == fn(x, b).tobytes()


def test_a_result_that_does_not_fit_the_planned_buffer_is_an_error_not_a_broadcast():
    out = np.empty((3, 4), np.float32)
    with pytest.raises(ValueError, match="shape"):
        as_out(np.ones((1, 4), np.float32), out)
    with pytest.raises(ValueError, match="type"):
        as_out(np.ones((3, 4), np.float64), out)
    as_out(np.ones((3, 4), np.float64), out, cast=True)
    assert (out == 1).all()
    with pytest.raises(ValueError, match="broadcast"):  # (4,) would fill (3, 4) only by stretching
        write_elementwise(np.empty((3, 4), np.float32), np.negative, np.ones(4, np.float32))


# ---------------------------------------------------------------- custom ops with out=True


def _chain_model(op, domain, n_outputs):
    """x -> op -> Neg -> y: op's first output is an intermediate value, planned in the arena."""
    outs = ["t"] + [""] * (n_outputs - 1)
    nodes = [helper.make_node(op, ["x"], outs, domain=domain, name="custom"), helper.make_node("Neg", ["t"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)])


def test_custom_kernel_with_out_writes_into_the_arena():
    handed = []
    op = glassrt.custom_op("outtest::twice(Tensor x) -> Tensor", dtypes=[np.float32])
    op.register_meta(lambda x: x)

    def twice(x, *, out=None):
        handed.append(out)
        return np.multiply(x, 2, out=out)

    op.register_kernel("cpu", twice, out=True)

    try:
        sess = glassrt.InferenceSession(_chain_model("twice", "outtest", 1), providers=["cpu"], fallback="error")
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        for _ in range(2):
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -2 * x)
        buf = handed[-1]
        assert isinstance(buf, np.ndarray) and buf.shape == (2, 3) and buf.dtype == np.float32
        assert buf.base is not None  # a view of the plan's arena, not an array of its own
        assert twice(x).tobytes() == (2 * x).tobytes()  # called directly (glassrt check): no buffer
    finally:
        op.unregister()


def test_multi_output_custom_kernel_gets_one_buffer_per_schema_output():
    handed = []
    op = glassrt.custom_op("outtest::split_sign(Tensor x) -> (Tensor pos, Tensor neg)", dtypes=[np.float32])
    op.register_meta(lambda x: (x, x))

    def build(ctx):
        def step(x, *, out):
            handed.append(out)
            pos = np.maximum(x, 0, out=out[0])
            neg = np.minimum(x, 0, out=out[1])  # None: the node leaves this output unused
            return pos, neg
        return step

    op.register_kernel("cpu", build, bind=True, out=True)
    try:
        sess = glassrt.InferenceSession(_chain_model("split_sign", "outtest", 2), providers=["cpu"], fallback="error")
        x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -np.maximum(x, 0))
        assert len(handed[-1]) == 2
        assert handed[-1][0] is not None and handed[-1][0].shape == (2, 3)
        assert handed[-1][1] is None
    finally:
        op.unregister()


# ---------------------------------------------------------------- lazily compiled loops


def test_importing_the_cpu_kernels_imports_no_numba():
    code = "import sys, glassrt, glassrt.kernels.cpu; print('numba' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_compiled_loops_call_each_other_once_compiled():
    from glassrt.kernels.cpu import erf

    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    got = erf.erf(x)  # _erf_out calls the inlined _erf_select: the module compiles on first use
    ref = np.array([math.erf(float(v)) for v in x])
    assert np.max(np.abs(got - ref)) < 1e-6
    assert type(erf._erf_select).__name__ == "CPUDispatcher"  # the module's globals now hold dispatchers


# ---------------------------------------------------------------- Transpose as a view


def _transpose_model(shape, perm, dims=None):
    """x -> Relu -> Transpose(perm) -> Mul by 2 (the Relu's buffer must live while the view is
    read), with a second Relu of x computed after the Transpose (the planner must not hand
    it the viewed buffer)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=perm),
             helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Relu", ["n"], ["r2"]),
             helper.make_node("ReduceSum", ["r2"], ["s"], keepdims=0),
             helper.make_node("Mul", ["t", "s"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph(nodes, "t", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shape, perm, view", [((1, 1, 12, 64), [0, 2, 1, 3], True), ((2, 1, 3), [1, 0, 2], True),
                                               ((1, 5, 1, 4), [2, 0, 3, 1], False), ((2, 3, 4), [0, 2, 1], False)])
def test_a_transpose_that_moves_only_dims_of_one_is_a_view(shape, perm, view):
    """Moving only dims of size 1 leaves the elements in order: the view kernel takes it and
    explain says so; a transpose that reorders keeps the copying kernel and explain says why."""
    sess = glassrt.InferenceSession(_transpose_model(shape, perm), providers=["cpu"])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ref = np.transpose(np.maximum(x, 0), perm) * np.maximum(-x, 0).sum()
    for _ in range(20):  # past the compiled replay
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-6)
    chosen = [n for n in sess.explain()["nodes"] if n["op"] == "Transpose"][0]["kernel"]
    assert (chosen == "cpu.Transpose.view") == view, chosen


def test_a_transpose_on_symbolic_dims_is_a_view_only_in_plans_whose_shapes_keep_the_order():
    """Placement sees symbolic dims; each plan judges its own shapes: a view where the moved
    dims are 1, the copying kernel where they are not (or stay symbolic), right values in both."""
    sess = glassrt.InferenceSession(_transpose_model(None, [0, 2, 1, 3], ["b", "s", 4, 8]), providers=["cpu"])
    rng = np.random.default_rng(1)
    for s in (1, 3, 1, 2, 1):
        x = rng.standard_normal((1, s, 4, 8)).astype(np.float32)
        ref = np.transpose(np.maximum(x, 0), [0, 2, 1, 3]) * np.maximum(-x, 0).sum()
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-6)


# ---------------------------------------------------------------- Split as views


def _split_model(shape, axis, sizes=None, dims=None):
    """x -> Relu -> Split(axis) -> each piece times 2, 3, 4 (the Relu's buffer must live while
    the pieces are read), with a Neg of x computed between (the planner must not hand it the
    split buffer), and the pieces' sum and the last piece itself as outputs."""
    ins = ["r"] + (["sizes"] if sizes is not None else [])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Split", ins, ["p0", "p1", "p2"], axis=axis),
             helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Relu", ["n"], ["r2"]),
             helper.make_node("ReduceSum", ["r2"], ["s"], keepdims=0)]
    for i in range(3):
        nodes.append(helper.make_node("Mul", [f"p{i}", f"k{i}"], [f"m{i}"]))
    nodes += [helper.make_node("Add", ["m0", "m1"], ["m01"]), helper.make_node("Add", ["m01", "m2"], ["m012"]),
              helper.make_node("Mul", ["m012", "s"], ["y"])]
    inits = [helper.make_tensor(f"k{i}", TensorProto.FLOAT, [], [float(i + 2)]) for i in range(3)]
    if sizes is not None:
        inits.append(helper.make_tensor("sizes", TensorProto.INT64, [3], sizes))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or list(shape))
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "p2")]
    return helper.make_model(helper.make_graph(nodes, "s", [x], outs, inits), opset_imports=[helper.make_opsetid("", 18)])


def _split_reference(x, axis, sizes):
    r = np.maximum(x, 0)
    pieces = np.split(r, np.cumsum(sizes)[:-1], axis=axis)
    return (pieces[0] * 2 + pieces[1] * 3 + pieces[2] * 4) * np.maximum(-x, 0).sum(), pieces[2]


@pytest.mark.parametrize("shape, axis, view", [((1, 1, 12), 2, True), ((1, 6, 4), 1, True), ((2, 6), 1, False),
                                               ((6, 3), 0, True)])
def test_a_split_whose_leading_dims_are_one_is_views(shape, axis, view):
    """Pieces that are contiguous runs of the input are views (the view kernel, explain says
    so); pieces with a stride between rows keep the copying kernel and explain says why.
    The returned piece is the caller's own array, not a view into the arena."""
    sizes = [shape[axis] // 3] * 3
    sess = glassrt.InferenceSession(_split_model(shape, axis, sizes), providers=["cpu"])
    rng = np.random.default_rng(2)
    for _ in range(20):  # past the compiled replay
        x = rng.standard_normal(shape).astype(np.float32)
        y, p2 = sess.run(None, {"x": x})
        want_y, want_p2 = _split_reference(x, axis, sizes)
        np.testing.assert_allclose(y, want_y, rtol=1e-6)
        np.testing.assert_array_equal(p2, want_p2)
        p2[...] = -1  # the caller's array: the next run must not see it
    row = [n for n in sess.explain()["nodes"] if n["op"] == "Split"][0]
    assert (row["kernel"] == "cpu.Split.view") == view, row
    if not view:
        assert "strided" in row["reason"]


def test_a_split_on_symbolic_dims_is_views_only_in_plans_of_one_row():
    sess = glassrt.InferenceSession(_split_model(None, 2, [4, 4, 4], ["b", "s", 12]), providers=["cpu"])
    rng = np.random.default_rng(3)
    for s in (1, 3, 1, 2, 1):
        x = rng.standard_normal((1, s, 12)).astype(np.float32)
        y, p2 = sess.run(None, {"x": x})
        want_y, want_p2 = _split_reference(x, 2, [4, 4, 4])
        np.testing.assert_allclose(y, want_y, rtol=1e-6)
        np.testing.assert_array_equal(p2, want_p2)
    kernels = {s: [n for n in sess.explain({"b": 1, "s": s})["nodes"] if n["op"] == "Split"][0]["kernel"]
               for s in (1, 3)}
    assert kernels == {1: "cpu.Split.view", 3: "cpu.Split"}
