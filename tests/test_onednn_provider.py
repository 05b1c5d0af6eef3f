"""The `onednn` provider (kernels/onednn/kernels.py): oneDNN primitives placed like any
provider's kernels, NHWC between its own nodes (runtime/layout.py), results equal to
glassrt's cpu kernels and to onnxruntime. Skipped where the oneDNN library is missing."""
from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi
from glassrt.tools import light_models as lm

from .helpers import init, model, ort_outputs, passes_in_a_forked_child, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=f"oneDNN: {capi.UNAVAILABLE}")


def _sessions(m):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (glassrt.InferenceSession(m, providers=["onednn", "cpu"]),
                glassrt.InferenceSession(m, providers=["cpu"]))


@pytest.mark.parametrize("name", ["squeezenet", "densenet121", "inception_v1", "bvlc_alexnet"])
def test_light_models_match_the_cpu_kernels(name):
    m = lm.randomize_weights(onnx.load(lm.path(name)), seed=1)
    x_name, shape = lm.input_shape(m)
    x = np.random.default_rng(2).random(shape, dtype=np.float32)
    fast, cpu = _sessions(m)
    report = fast.explain()
    assert report["summary"]["nodes_per_provider"].get("onednn", 0) >= 10
    assert report["summary"]["layouts"]["nhwc_values"] >= 5
    for _ in range(2):  # a replay reuses the bound primitives and the arena
        a, b = fast.run(None, {x_name: x})[0], cpu.run(None, {x_name: x})[0]
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_region_meets_plain_values_at_its_edges():
    """conv → pool → conv (all oneDNN: NHWC inside) → Reshape (cpu: the pool before it writes
    NCHW), a residual read by a conv from a graph input, and the region's values as graph
    outputs: every layout change happens inside a oneDNN kernel, and the numbers agree."""
    rng = np.random.default_rng(0)
    w1 = init("w1", rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.2)
    w2 = init("w2", rng.standard_normal((16, 16, 1, 1)).astype(np.float32) * 0.2)
    nodes = [helper.make_node("Conv", ["x", w1.name], ["c1"], pads=[1, 1, 1, 1], name="c1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="p1"),
             helper.make_node("Conv", ["p1", w2.name], ["c2"], name="c2"),
             helper.make_node("Add", ["c2", "p1"], ["s"], name="add"),
             helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
             helper.make_node("Reshape", ["g", "shape"], ["y"], name="flat")]
    m = model(nodes, [tensor("x", [2, 3, 8, 8])], [tensor("y", None), tensor("r1", None)],
              [w1, w2, init("shape", np.array([2, -1], np.int64))], opset=17)
    fast, cpu = _sessions(m)
    layouts = fast.placement.layouts
    assert layouts.get("p1") == "nhwc" and layouts.get("c2", layouts.get("s")) == "nhwc"
    assert "r1" not in layouts and "g" not in layouts  # a graph output; read by the cpu Reshape
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    for a, b in zip(fast.run(None, {"x": x}), cpu.run(None, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    edges = fast.explain()["summary"]["layouts"]["edges"]
    assert {"value": "x", "node": "c1", "kind": "read"} in edges


def test_symbolic_shapes_are_placed_on_onednn_and_each_plan_binds_its_shapes():
    """A batch dim left symbolic (as most exported models have it) does not keep oneDNN out:
    the node is placed on it, and each plan, made for concrete shapes, binds its primitive."""
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], [tensor("x", ["n", 3, 8, 8])],
              [tensor("y", None)], [init("w", np.ones((4, 3, 1, 1), np.float32))], opset=17)
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    assert sess.explain()["nodes"][0]["provider"] == "onednn"
    for n in (2, 3):
        y = sess.run(None, {"x": np.ones((n, 3, 8, 8), np.float32)})[0]
        np.testing.assert_allclose(y, np.full((n, 4, 8, 8), 3.0))
        node = sess.explain({"n": n})["nodes"][0]
        assert node["provider"] == "onednn" and node["kernel"] == "onednn.Conv"


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "FusedMatMul"])
def test_one_row_against_weights_too_large_to_pack_runs_on_sgemm(op, monkeypatch):
    """A decode step's vocabulary projection: one row, weights above the packing limit (made
    small here) read where they lie by sgemm's matrix-vector path, the bias and the scale
    included; the same node with more rows keeps the matmul primitive. The rows are a
    symbolic dim, so placement must keep the one-row kernel as a candidate."""
    from glassrt.kernels.onednn import matmul as onednn_matmul

    monkeypatch.setattr(onednn_matmul, "_PACK_LIMIT", 1024)
    rng = np.random.default_rng(11)
    k, n = 37, 53  # a geometry no other test makes (primitive descriptors are shared by geometry)
    w = rng.standard_normal((n, k) if op == "Gemm" else (k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    if op == "Gemm":
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="p", transB=1, alpha=0.5, beta=2.0)
        ref = lambda x: 0.5 * x @ w.T + 2.0 * bias  # noqa: E731
        x_shape, domains = ["n", k], None
    elif op == "MatMul":
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="p")
        ref = lambda x: x @ w  # noqa: E731
        x_shape, domains = ["n", 1, k], None
    else:
        node = helper.make_node("FusedMatMul", ["x", "w", "b"], ["y"], name="p", domain="glassrt", alpha=1.5)
        ref = lambda x: 1.5 * (x @ w) + bias  # noqa: E731
        x_shape, domains = ["n", k], {"glassrt": 1}
    m = model([node], [tensor("x", x_shape)], [tensor("y", None)], [init("w", w), init("b", bias)], opset=17,
              domains=domains)
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    primitive = "onednn.MatMul" if op == "MatMul" else f"onednn.{op}.matmul"
    for rows, kernel in ((1, f"onednn.{op}.gemv"), (3, primitive)):
        x = rng.standard_normal([rows] + [int(d) for d in x_shape[1:]]).astype(np.float32)
        for _ in range(2):  # the bias is written anew each run, not accumulated
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref(x), rtol=1e-5, atol=1e-5)
        assert sess.explain({"n": rows})["nodes"][0]["kernel"] == kernel


def test_weights_too_large_to_hold_twice_are_packed_when_mapped_from_their_file(tmp_path, monkeypatch):
    """Above the packing limit in-memory weights are read as they lie (a packed copy would hold
    them twice), but weights mapped from their file are packed like any other (the file's
    pages are released as the copy is made): a mapped vocabulary projection runs on a
    primitive that reads them packed (the matmul's, and so row_panels' loop in a decode loop,
    or the inner product's where the matmul would repack them at every call), not on sgemm."""
    from glassrt.kernels.onednn import matmul as onednn_matmul
    from glassrt.tools import optimize as tool

    monkeypatch.setattr(onednn_matmul, "_PACK_LIMIT", 1024)
    rng = np.random.default_rng(13)
    k, n = 39, 57
    w = rng.standard_normal((k, n)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="p")], [tensor("x", ["n", k])], [tensor("y", None)],
              [init("w", w)], opset=17)
    src, out = tmp_path / "m.onnx", tmp_path / "m.ext.onnx"
    onnx.save(m, src)
    tool.optimize(src, out, level="none", external_data=True, size_threshold=0)
    for path, kernels in ((src, {"onednn.MatMul.gemv"}), (out, {"onednn.MatMul", "onednn.MatMul.inner_product"})):
        sess = glassrt.InferenceSession(str(path), providers=["onednn", "cpu"])
        x = rng.standard_normal((1, k)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ w, rtol=1e-5, atol=1e-5)
        node = sess.explain({"n": 1})["nodes"][0]
        assert node["kernel"] in kernels, node


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Tanh", "Gelu"])
def test_the_one_row_kernel_applies_an_activation_and_leaves_a_residual_to_the_primitive(monkeypatch, act):
    """Weights too large to pack at one row: the gemv kernel (sgemm, then the rows loop once
    the plan keeps running) applies FusedMatMul's activation after the product; a residual
    needs the primitive's post-ops."""
    from glassrt.kernels.cpu.matmul import activate
    from glassrt.kernels.onednn import matmul as onednn_matmul
    from glassrt.kernels.onednn import row_panels

    monkeypatch.setattr(onednn_matmul, "_PACK_LIMIT", 1024)
    w = np.random.default_rng(12).standard_normal((41, 43)).astype(np.float32)
    nodes = [helper.make_node("FusedMatMul", ["x", "w"], ["y"], name="p", domain="glassrt", activation=act),
             helper.make_node("FusedMatMul", ["x", "w", "", "z"], ["y2"], name="r", domain="glassrt")]
    m = model(nodes, [tensor("x", [1, 41]), tensor("z", [1, 43])], [tensor("y", None), tensor("y2", None)],
              [init("w", w)], opset=17, domains={"glassrt": 1})
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    rows = {n["name"]: n for n in sess.explain()["nodes"]}
    assert rows["p"]["kernel"] == "onednn.FusedMatMul.gemv"
    assert rows["r"]["kernel"] == "onednn.FusedMatMul.matmul" and "post-ops" in rows["r"]["reason"]
    rng = np.random.default_rng(13)
    for _ in range(row_panels.AFTER_RUNS + 2):  # sgemm's runs, then the rows loop's
        x, z = rng.standard_normal((1, 41)).astype(np.float32), rng.standard_normal((1, 43)).astype(np.float32)
        y, y2 = sess.run(None, {"x": x, "z": z})
        np.testing.assert_allclose(y, activate(x @ w, act), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y2, x @ w + z, rtol=1e-5, atol=1e-5)


def test_a_symbolic_conv_onednn_has_only_generic_code_for_goes_to_cpu_at_placement():
    """The batch is symbolic; oneDNN's choice is judged on a stand-in binding of it. 16 groups
    of 6 channels: no jit kernel grouped, and 16x the work as a dense conv."""
    w = np.random.default_rng(4).standard_normal((64, 6, 1, 1)).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=16)],
              [tensor("x", ["n", 96, 8, 8])], [tensor("y", None)], [init("w", w)], opset=17)
    node = glassrt.InferenceSession(m, providers=["onednn", "cpu"]).explain()["nodes"][0]
    from glassrt.runtime.select import STAND_IN_DIM

    if _jit_for_grouped_conv((STAND_IN_DIM, 96, 8, 8), (64, 6, 1, 1), 16, bias=False):
        assert node["provider"] == "onednn"
        return
    assert node["provider"] == "cpu" and "generic implementation" in node["reason"]
    assert "16x the work" in node["reason"]


def test_a_symbolic_batch_is_judged_at_1_so_a_batch_1_plan_makes_no_descriptor_again(monkeypatch):
    """Placement judges a static_only kernel on a stand-in binding of the symbolic dims, the
    batch (an input's leading symbol) at 1 first: the conv descriptor its predicate makes is
    the one a batch-1 plan binds, and that plan makes none (another batch makes its own)."""
    from glassrt.kernels.onednn import dnnl
    from glassrt.runtime.placement import batch_symbols

    made = []
    conv = dnnl.conv
    monkeypatch.setattr(dnnl, "conv", lambda x, *a, **k: made.append(tuple(x)) or conv(x, *a, **k))
    w = np.random.default_rng(7).standard_normal((13, 7, 3, 3)).astype(np.float32)  # (a shape no other test makes)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
              [tensor("x", ["n", 7, 9, 9])], [tensor("y", None)], [init("w", w)], opset=17)
    x = np.random.default_rng(8).standard_normal((3, 7, 9, 9)).astype(np.float32)
    cpu = glassrt.InferenceSession(m, providers=["cpu"])
    want1, want3 = cpu.run(None, {"x": x[:1]})[0], cpu.run(None, {"x": x})[0]
    # descriptors are made per OpenMP thread count: placement's and a new plan's at the count
    # the last run left (another session's, another test's), a run's at its session's: one
    # thread for all of them here, whatever ran before
    from glassrt.kernels.onednn import capi

    before = capi.get_max_threads()
    capi.set_num_threads(1)
    try:
        sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"], sess_options=glassrt.SessionOptions(
            intra_op_num_threads=1, adaptive_threads=False))
        assert batch_symbols(sess.placement.graph) == {"n"} and made == [(1, 7, 9, 9)]
        np.testing.assert_allclose(sess.run(None, {"x": x[:1]})[0], want1, rtol=1e-4, atol=1e-4)
        assert made == [(1, 7, 9, 9)]
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want3, rtol=1e-4, atol=1e-4)
        assert made == [(1, 7, 9, 9), (3, 7, 9, 9)]
    finally:
        capi.set_num_threads(before)


def test_batch_symbols_lead_inputs_of_rank_2_or_more():
    from glassrt.runtime.placement import batch_symbols

    m = model([helper.make_node("Identity", ["a"], ["y"]), helper.make_node("Identity", ["s"], ["z"]),
               helper.make_node("Identity", ["t"], ["u"])],
              [tensor("a", ["b", "seq"]), tensor("s", ["samples"]), tensor("t", [2, "k"])],
              [tensor("y", None), tensor("z", None), tensor("u", None)], [], opset=17)
    assert batch_symbols(glassrt.InferenceSession(m, providers=["cpu"]).placement.graph) == {"b"}


# ---------------------------------------------------------------- one pool of threads


@pytest.mark.parametrize("case", ["plain", "a_transposed", "b_transposed", "row_strides", "batched", "broadcast_b",
                                  "one_row", "float64", "empty", "small_stack"])
def test_products_through_onednn_sgemm_equal_numpy(case):
    from glassrt.kernels import gemm

    rng = np.random.default_rng(1)
    f = np.float64 if case == "float64" else np.float32
    a, b = rng.standard_normal((7, 5)).astype(f), rng.standard_normal((5, 9)).astype(f)
    if case == "a_transposed":
        a = np.ascontiguousarray(a.T).T
    elif case == "b_transposed":
        b = np.ascontiguousarray(b.T).T
    elif case == "row_strides":
        a, b = rng.standard_normal((7, 8)).astype(f)[:, 1:6], rng.standard_normal((5, 12)).astype(f)[:, 2:11]
    elif case == "batched":  # stacks of matrices big enough to go to oneDNN one by one
        a, b = rng.standard_normal((3, 40, 50)).astype(f), rng.standard_normal((3, 50, 40)).astype(f)
    elif case == "broadcast_b":
        a, b = rng.standard_normal((2, 3, 40, 50)).astype(f), rng.standard_normal((50, 40)).astype(f)
    elif case == "small_stack":  # attention-head-sized: the whole stack in one NumPy call
        a, b = rng.standard_normal((3, 7, 5)).astype(f), rng.standard_normal((3, 5, 9)).astype(f)
    elif case == "one_row":
        a = rng.standard_normal((1, 5)).astype(f)
    elif case == "empty":
        a = np.zeros((0, 5), f)
    out = np.full(np.broadcast_shapes(a.shape[:-1] + (1,), (1,) * (a.ndim - b.ndim) + b.shape[:-2] + (1, 1))[:-1]
                  + (b.shape[-1],), np.nan, f)
    gemm.use_openmp(True)
    calls, sgemm = [], gemm._sgemm
    gemm._sgemm = lambda *args: calls.append(args) or sgemm(*args)  # count the products oneDNN ran
    try:
        assert gemm.engine().startswith("oneDNN")
        gemm.matmul(a, b, out)
    finally:
        gemm.use_openmp(False)
    np.testing.assert_allclose(out, np.matmul(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)
    numpy_cases = ("float64", "empty", "small_stack")
    assert (len(calls) == 0) if case in numpy_cases else (len(calls) == int(np.prod(out.shape[:-2], dtype=int)))


def test_a_session_with_onednn_runs_on_the_openmp_pool_and_says_so():
    from glassrt.kernels import gemm
    from glassrt.runtime import threads

    w = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [tensor("x", [4, 16])], [tensor("y", None)],
              [init("w", w)], opset=17)
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    y = sess.run(None, {"x": x})[0]
    assert threads._current[1] is True and gemm.engine().startswith("oneDNN")
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
    assert any("OpenMP's pool alone" in n for n in sess.explain()["summary"]["notes"])
    cpu = glassrt.InferenceSession(m, providers=["cpu"])
    cpu.run(None, {"x": x})
    assert threads._current[1] is False and gemm.engine() == "NumPy BLAS"


def test_passing_the_partial_onednn_provider_is_not_a_fallback():
    """onednn takes only what it is fast at: a Reshape after it runs on cpu without a warning,
    with onednn's reason in explain; a node that passes cpu (the complete provider) still
    counts as a fallback."""
    m = model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
               helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape")],
              [tensor("x", [1, 2, 3, 3])], [tensor("y", None)], [init("s", np.array([1, -1], np.int64))], opset=17)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    assert sess.fallbacks == []
    node = next(n for n in sess.explain()["nodes"] if n["name"] == "reshape")
    assert node["provider"] == "cpu" and not node["fallback"] and "onednn: no onednn kernel for Reshape" in node["reason"]

    from glassrt.runtime.providers import CpuProvider

    class NoReshape(CpuProvider):
        def kernels(self, domain, op_type, opset):
            return [] if op_type == "Reshape" else super().kernels(domain, op_type, opset)

    with pytest.warns(glassrt.FallbackWarning):
        sess = glassrt.InferenceSession(m, providers=[NoReshape(), "reference"])
    assert [f.node for f in sess.fallbacks] == ["reshape"]


def _jit_for_grouped_conv(x_shape, w_shape, group, bias) -> bool:
    """Whether this CPU's oneDNN has a jit kernel for the grouped conv itself (on AVX-512
    oneDNN 3.2 has kernels for groups that on AVX2 get only its generic implementation)."""
    from glassrt.kernels.onednn import dnnl
    from glassrt.kernels.onednn.kernels import _SLOW_IMPLS

    pads = [0] * 2 * (len(x_shape) - 2)
    impl = dnnl.conv(x_shape, w_shape, group=group, strides=[1, 1], dilations=[1, 1], pads=pads, bias=bias,
                     src_format="acdb", dst_format="acdb").impl
    return not impl.startswith(_SLOW_IMPLS)


@pytest.mark.parametrize("activation", [None, "Relu"])
def test_a_grouped_conv_without_a_jit_kernel_runs_dense_with_block_diagonal_weights(activation):
    """24 input channels in 4 groups (6 per group, ShuffleNet's first 1x1): oneDNN 3.2 has
    only x64:gemm:jit for it grouped, a jit kernel for the dense conv of 4x the work."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((112, 6, 1, 1)).astype(np.float32)
    b = rng.standard_normal(112).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if activation else "y"], name="conv", group=4)]
    if activation:
        nodes.append(helper.make_node(activation, ["c"], ["y"]))
    m = model(nodes, [tensor("x", [1, 24, 8, 8])], [tensor("y", None)], [init("w", w), init("b", b)], opset=17)
    fast, cpu = _sessions(m)
    node = fast.explain()["nodes"][0]
    if _jit_for_grouped_conv((1, 24, 8, 8), (112, 6, 1, 1), 4, bias=True):
        assert node["provider"] == "onednn" and "dense_groups" not in node["kernel"], node
    else:
        assert node["kernel"].endswith(".dense_groups"), node
    x = rng.standard_normal((1, 24, 8, 8)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(fast.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_dense_groups_does_not_take_a_grouped_conv_onednn_has_a_jit_kernel_for():
    w = np.random.default_rng(4).standard_normal((64, 16, 3, 3)).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=4, pads=[1, 1, 1, 1])],
              [tensor("x", [1, 64, 8, 8])], [tensor("y", None)], [init("w", w)], opset=17)
    fast, cpu = _sessions(m)
    node = fast.explain()["nodes"][0]
    assert node["provider"] == "onednn" and "dense_groups" not in node["kernel"], node
    x = np.random.default_rng(5).standard_normal((1, 64, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(fast.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_runs_instead_of_hanging_in_openmp():
    """GNU OpenMP's workers do not survive a fork: a child that used them with two threads
    would hang in its first parallel region. glassrt runs OpenMP on one thread there."""
    w = np.random.default_rng(6).standard_normal((8, 4, 3, 3)).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
              [tensor("x", [1, 4, 16, 16])], [tensor("y", None)], [init("w", w)], opset=17)
    so = glassrt.SessionOptions()
    so.intra_op_num_threads = 2
    sess = glassrt.InferenceSession(m, so, providers=["onednn", "cpu"])
    x = np.ones((1, 4, 16, 16), np.float32)
    expected = sess.run(None, {"x": x})[0]
    passes_in_a_forked_child(lambda: np.allclose(sess.run(None, {"x": x})[0], expected))


def test_a_branch_node_reading_an_outer_weight_falls_back_when_its_plan_sees_a_runtime_input():
    """Placement types an If branch with the outer graph's values (the weight looks constant);
    the branch's plan receives it as an input, which oneDNN's weights kernel refuses: the node
    runs on cpu then, as recorded at placement (openwakeword's hey-jarvis model)."""
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "W")
    then = helper.make_graph([helper.make_node("Gemm", ["x", "W"], ["t"], name="gemm_in_branch")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["e"], name="mm_else")], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                                helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    s, o = glassrt.InferenceSession(m), ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        np.testing.assert_allclose(s.run(None, feeds)[0], o.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_contiguous_views_keep_views_of_the_same_array_and_recopy_strided_ones():
    """A kernel's operand as C-contiguous float32: a view of the same array object is kept
    (no new view, a oneDNN memory keeps its pointer) and sees its new values; a strided
    array is copied again every call, so a buffer reused with new values is never stale."""
    from glassrt.kernels.onednn.kernels import ContiguousViews

    views = ContiguousViews()
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = views(0, a)
    a += 10
    assert views(0, a) is first and first.base is not None
    np.testing.assert_array_equal(first, np.arange(6) + 10)
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    copy = views(1, strided, (3, 2))
    strided[...] = -1
    again = views(1, strided, (3, 2))
    assert again is not copy and copy.flags.c_contiguous
    np.testing.assert_array_equal(again, -np.ones((3, 2)))


@pytest.mark.parametrize("op,operand,first", [
    ("Mul", "scalar", False), ("Add", "scalar", True), ("Mul", "channel", True), ("Add", "channel", False),
    ("Mul", "squeeze_excite", False), ("Mul", "squeeze_excite", True)])
def test_broadcast_operands_keep_a_value_in_the_region(op, operand, first):
    """conv → Mul/Add by a scalar or per-channel constant, or by a squeeze-and-excitation's
    computed per-channel scales → conv: the broadcast binary kernel keeps the value NHWC
    between the convs, with the cpu kernels' bits (x·c and x + c are IEEE's either way)."""
    rng = np.random.default_rng(5)
    w1 = init("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3)
    w2 = init("w2", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3)
    inits, nodes = [w1, w2], [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="c1"),
                              helper.make_node("Relu", ["c1"], ["r1"], name="r1")]
    if operand == "squeeze_excite":
        inits.append(init("w3", rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.3))
        nodes += [helper.make_node("GlobalAveragePool", ["r1"], ["g"], name="gap"),
                  helper.make_node("Conv", ["g", "w3"], ["g1"], name="c3"),
                  helper.make_node("HardSigmoid", ["g1"], ["k"], name="hs")]
    else:
        shape = (1,) if operand == "scalar" else (8, 1, 1)
        inits.append(init("k", rng.uniform(0.5, 1.5, shape).astype(np.float32)))
    pair = ["k", "r1"] if first else ["r1", "k"]
    nodes += [helper.make_node(op, pair, ["m"], name="bin"),
              helper.make_node("Conv", ["m", "w2"], ["y"], pads=[1, 1, 1, 1], name="c2")]
    m = model(nodes, [tensor("x", [1, 3, 10, 12])], [tensor("y", None)], inits, opset=17)
    fast, cpu = _sessions(m)
    assert {r["name"]: r for r in fast.explain()["nodes"]}["bin"]["kernel"] == f"onednn.{op}.broadcast"
    assert fast.placement.layouts.get("r1") == "nhwc" and fast.placement.layouts.get("m") == "nhwc"
    x = rng.standard_normal((1, 3, 10, 12)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(fast.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["Mul", "Add"])
@pytest.mark.parametrize("shape", [(), (1,), (1, 5, 1, 1), (5, 1, 1), (1, 1, 1, 7)])
def test_a_broadcast_binary_step_has_the_cpu_kernels_bits(op, shape):
    """The kernel in the NHWC region, bit for bit: convolutions of small integers (exact in
    any order of sums) around it, the second a 1x1 identity, so that the output is the
    Mul / Add itself; a constant of each broadcastable shape, as either operand."""
    rng = np.random.default_rng(7)
    k = rng.uniform(-2, 2, shape).astype(np.float32)
    w1 = rng.integers(-2, 3, (5, 5, 3, 3)).astype(np.float32)
    for pair in (["r1", "k"], ["k", "r1"]):
        nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="c1"),
                 helper.make_node("Relu", ["c1"], ["r1"], name="r1"),  # (no folding the constant into the conv)
                 helper.make_node(op, pair, ["m"], name="bin"),
                 helper.make_node("Conv", ["m", "eye"], ["y"], name="c2")]
        m = model(nodes, [tensor("x", [2, 5, 6, 7])], [tensor("y", None)],
                  [init("k", k), init("w1", w1), init("eye", np.eye(5, dtype=np.float32).reshape(5, 5, 1, 1))], opset=17)
        fast, cpu = _sessions(m)
        x = rng.integers(-3, 4, (2, 5, 6, 7)).astype(np.float32)
        got = fast.run(None, {"x": x})[0]
        (plan,) = fast.runner.plans.values()
        assert [st.kernel.name for st in plan.steps if st.node.name == "bin"] == [f"onednn.{op}.broadcast"]
        np.testing.assert_array_equal(got, cpu.run(None, {"x": x})[0])


def test_a_broadcast_between_plain_values_runs_on_cpu():
    """Between cpu's nodes (no NHWC region to keep) the plan gives the node to cpu, whose
    loop costs less than a oneDNN call there, and says why."""
    m = model([helper.make_node("Sin", ["x"], ["s"], name="sin"), helper.make_node("Mul", ["s", "k"], ["m"], name="bin"),
               helper.make_node("Cos", ["m"], ["y"], name="cos")],
              [tensor("x", [1, 4, 5, 6])], [tensor("y", None)], [init("k", np.array([1.5], np.float32))], opset=17)
    fast, cpu = _sessions(m)
    x = np.random.default_rng(8).standard_normal((1, 4, 5, 6)).astype(np.float32)
    np.testing.assert_array_equal(fast.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0])
    (plan,) = fast.runner.plans.values()
    (sel,) = [s for s in plan.selections if s.node == "bin"]
    assert sel.kernel == "cpu.Mul" and "plain NCHW" in sel.reason, sel


def test_a_broadcast_that_grows_the_value_is_not_taken():
    """Mul of (1, 8, 1, 1) by (1, 1, 4, 4): the output is larger than either operand."""
    m = model([helper.make_node("Mul", ["a", "b"], ["y"], name="bin")],
              [tensor("a", [1, 8, 1, 1]), tensor("b", [1, 1, 4, 4])], [tensor("y", None)], [], opset=17)
    fast, cpu = _sessions(m)
    assert {r["name"]: r for r in fast.explain()["nodes"]}["bin"]["kernel"] == "cpu.Mul"
    rng = np.random.default_rng(6)
    f = {"a": rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "b": rng.standard_normal((1, 1, 4, 4)).astype(np.float32)}
    np.testing.assert_array_equal(fast.run(None, f)[0], cpu.run(None, f)[0])


@pytest.mark.parametrize("op", ["Mul", "Add"])
def test_a_same_shape_binary_step_has_the_cpu_kernels_bits(op):
    """Two computed values of one shape (a SiLU's x · sigmoid(x) left unfused, a residual Add)
    on oneDNN's binary kernel in the NHWC region, bit for bit: convolutions of small integers
    (exact in any order of sums) make both operands, a 1x1 identity conv reads the result
    (each element in its place, in either layout)."""
    rng = np.random.default_rng(9)
    w1 = rng.integers(-2, 3, (5, 5, 3, 3)).astype(np.float32)
    w2 = rng.integers(-2, 3, (5, 5, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="c1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
             helper.make_node("Conv", ["x", "w2"], ["c2"], name="c2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="r2"),
             helper.make_node(op, ["r1", "r2"], ["m"], name="bin"),
             helper.make_node("Conv", ["m", "eye"], ["y"], name="c3")]
    m = model(nodes, [tensor("x", [2, 5, 6, 7])], [tensor("y", None)],
              [init("w1", w1), init("w2", w2), init("eye", np.eye(5, dtype=np.float32).reshape(5, 5, 1, 1))], opset=17)
    fast, cpu = _sessions(m)
    assert {r["name"]: r for r in fast.explain()["nodes"]}["bin"]["kernel"] == f"onednn.{op}.binary"
    assert fast.placement.layouts.get("m") == "nhwc"
    x = rng.integers(-3, 4, (2, 5, 6, 7)).astype(np.float32)
    np.testing.assert_array_equal(fast.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0])


def test_one_thread_asked_stays_one_after_numba_loads(tmp_path):
    """intra_op_num_threads=1 holds for oneDNN's primitives after the run that loads Numba:
    Numba's first launch of its OpenMP layer sets the calling thread's OpenMP count to every
    core (NUMBA_NUM_THREADS), which ran a 1-thread session's 8-bit convolutions on two."""
    import subprocess
    import sys

    from onnx import TensorProto, helper, numpy_helper

    from glassrt.kernels.onednn import capi

    if capi.UNAVAILABLE:
        pytest.skip(capi.UNAVAILABLE)
    pytest.importorskip("numba")
    s, z = numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(3, np.uint8), "z")
    m = helper.make_model(helper.make_graph(
        [helper.make_node("QLinearAdd", ["x", "s", "z", "x", "s", "z", "s", "z"], ["y"], domain="com.microsoft")], "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 8, 16, 16])], [s, z]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    code = f"""
import sys, numpy as np, glassrt
from glassrt.kernels.onednn import capi
s = glassrt.InferenceSession({str(path)!r}, glassrt.SessionOptions(intra_op_num_threads=1))
x = np.full((1, 8, 16, 16), 7, np.uint8)
for _ in range(2):
    s.run(None, {{"x": x}})
from glassrt.kernels.cpu import _jit
_jit.wait_for_numba()  # (the second run started loading it, for QLinearAdd's compiled loop)
s.run(None, {{"x": x}})
assert _jit.numba_loaded()
print("openmp threads", capi.get_max_threads())
"""
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "openmp threads 1" in r.stdout, r.stdout


def test_an_elementwise_cpu_node_stays_inside_the_region():
    """conv → LeakyRelu (fused) → Max(x, -0.4) → conv, as openWakeWord's embedding model has
    it 19 times: oneDNN has no kernel for the Max, cpu's follows the region's layout (its
    values stay NHWC, no reorder around it) and the numbers are cpu's and onnxruntime's."""
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="c1"),
             helper.make_node("LeakyRelu", ["c1"], ["l1"], alpha=0.2, name="leaky"),
             helper.make_node("Max", ["l1", "floor"], ["m"], name="floor"),
             helper.make_node("Conv", ["m", "w2"], ["y"], pads=[1, 1, 1, 1], name="c2")]
    m = model(nodes, [tensor("x", [1, 3, 10, 12])], [tensor("y", None)],
              [init("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3),
               init("w2", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3),
               init("floor", np.full((1, 1, 1, 1), -0.4, np.float32))], opset=17)
    fast, cpu = _sessions(m)
    report = fast.explain()
    assert {r["name"]: r for r in report["nodes"]}["floor"]["kernel"] == "cpu.Max"
    assert fast.placement.layouts.get("l1") == "nhwc" and fast.placement.layouts.get("m") == "nhwc"
    assert not [e for e in report["summary"]["layouts"]["edges"] if e["node"] == "floor"]
    x = rng.standard_normal((1, 3, 10, 12)).astype(np.float32)
    for _ in range(2):
        got = fast.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, ort_outputs(m, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["graph_output", "bool_result", "cpu_chain", "plain_operand"])
def test_elementwise_cpu_nodes_never_change_a_layout(case):
    """A node whose kernels follow the layout keeps its values in one: where one of them must
    be plain (a graph output, a bool result, a value from a graph input, an operand read
    elsewhere in NCHW) all are, and the conv before it writes NCHW itself (a oneDNN reorder,
    not NumPy changing layout element by element); nor does a chain of them start a region."""
    rng = np.random.default_rng(10)
    w = init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv")
    after = helper.make_node("Conv", ["e", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")
    w2 = init("w2", rng.standard_normal((4, 4, 3, 3)).astype(np.float32))
    k = init("k", np.array([0.5], np.float32))
    outs = [tensor("y", None)]
    if case == "graph_output":
        nodes, inits, outs = [conv, helper.make_node("Max", ["c", "k"], ["e"], name="elt"), after], [w, w2, k], \
            [tensor("y", None), tensor("e", None)]
    elif case == "bool_result":
        nodes, inits = [conv, helper.make_node("Greater", ["c", "k"], ["g"], name="elt"),
                        helper.make_node("Where", ["g", "c", "k"], ["e"], name="where"), after], [w, w2, k]
    elif case == "cpu_chain":
        nodes, inits = [helper.make_node("Sin", ["x"], ["s"], name="elt"),
                        helper.make_node("Max", ["s", "k"], ["e0"], name="max"),
                        helper.make_node("Mul", ["e0", "k"], ["e1"], name="mul"),
                        helper.make_node("Cos", ["e1"], ["z"], name="cos")], [k]
        outs = [tensor("z", None)]
    else:  # the other operand a graph input, plain
        nodes, inits = [conv, helper.make_node("Sub", ["c", "x2"], ["e"], name="elt"), after], [w, w2]
    inputs = [tensor("x", [1, 3, 6, 7])] + ([tensor("x2", [1, 4, 6, 7])] if case == "plain_operand" else [])
    m = model(nodes, inputs, outs, inits, opset=17)
    fast, cpu = _sessions(m)
    elt = {r["name"]: r for r in fast.explain()["nodes"]}["elt"]
    assert elt["kernel"].startswith("cpu."), elt
    node = next(n for n in fast.placement.graph.nodes if n.name == "elt")
    assert not [v for v in list(node.inputs) + list(node.outputs) if v in fast.placement.layouts]
    if case == "cpu_chain":
        assert not fast.placement.layouts
    feeds = {"x": rng.standard_normal((1, 3, 6, 7)).astype(np.float32)}
    if case == "plain_operand":
        feeds["x2"] = rng.standard_normal((1, 4, 6, 7)).astype(np.float32)
    for a, b in zip(fast.run(None, feeds), cpu.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_a_replayed_step_only_executes_and_never_reads_a_stale_copy(monkeypatch):
    """A conv step called again with the very arrays of its last call (a replayed plan's
    arena) only executes its primitive, reading the values the arrays hold now; called with
    a strided array (which its views copy dense) it copies again every call, never reading
    the last call's copy. Both against the cpu kernels, the input's contents changed in
    place between calls."""
    from glassrt.kernels.onednn import kernels as onednn_kernels

    calls = []
    real = onednn_kernels.KeptViews.__call__
    monkeypatch.setattr(onednn_kernels.KeptViews, "__call__", lambda self, slot, a, *args: (
        calls.append(slot), real(self, slot, a, *args))[1])
    rng = np.random.default_rng(11)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")],
              [tensor("x", [1, 3, 8, 8])], [tensor("y", None)],
              [init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))], opset=17)
    so = glassrt.SessionOptions()
    so.intra_op_num_threads, so.adaptive_threads = 1, False
    fast = glassrt.InferenceSession(m, so, providers=["onednn", "cpu"])
    cpu = glassrt.InferenceSession(m, providers=["cpu"])
    fast.run(None, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    (plan,) = fast.runner.plans.values()
    (conv,) = [st for st in plan.steps if st.node.name == "conv"]
    assert conv.kernel.name == "onednn.Conv"
    out = np.empty((1, 4, 8, 8), np.float32)
    dense, wide = np.empty((1, 3, 8, 8), np.float32), np.empty((1, 3, 8, 16), np.float32)
    for x, replayed in ((dense, True), (wide[..., ::2], False)):
        for i in range(4):
            x[...] = rng.standard_normal(x.shape)
            want = cpu.run(None, {"x": np.ascontiguousarray(x)})[0]  # (sets OpenMP's count: before the step)
            calls.clear()
            conv.fn(x, out=out)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
            if i:
                assert (calls == []) == replayed, calls
