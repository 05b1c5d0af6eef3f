"""One-row products streamed over oneDNN's packed weights by a compiled loop
(glassrt/kernels/onednn/row_panels.py): a decode step's layer products."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=str(capi.UNAVAILABLE))
pytest.importorskip("numba")  # loaded in this process, as a decoder's other kernels load it

from glassrt.kernels.onednn import row_panels  # noqa: E402

from .helpers import init, model, passes_in_a_forked_child, tensor  # noqa: E402

GELU_TANH = lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))  # noqa: E731
ERF = np.vectorize(__import__("math").erf)
ACTS = {"": lambda v: v, "Relu": lambda v: np.maximum(v, 0), "LeakyRelu": lambda v: np.where(v >= 0, v, 0.2 * v),
        "Clip": lambda v: np.clip(v, -0.5, 0.7), "Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "Tanh": np.tanh,
        "Gelu": lambda v: 0.5 * v * (1 + ERF(v / np.sqrt(2))), "GeluTanh": GELU_TANH}
PARAMS = {"LeakyRelu": [0.2], "Clip": [-0.5, 0.7]}


def _streams(sess, feeds, ref, runs=4):
    """Run past AFTER_RUNS, checking every run; True if the product was streamed."""
    before = row_panels.stats["streamed"]
    for _ in range(runs):
        # (float32 sums of a few hundred products in another order than the float64 reference:
        # an output near 0 among outputs near 100 is off by 2.3e-5 on an AVX2 machine)
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref, rtol=2e-5, atol=1e-4)
    return row_panels.stats["streamed"] > before


def _panels_here(k, n) -> bool:
    """Whether oneDNN packs a (k, n) weight in 64-column panels on this machine (AVX-512: yes;
    AVX2's oneDNN 3.2 reads them as they lie, and the primitive keeps running them)."""
    from glassrt.kernels.onednn import dnnl as D

    pd = D.matmul(D.md((1, k), np.float32, "ab"), D.md((k, n), np.float32, "any"), D.md((1, n), np.float32, "ab"))
    return row_panels.panel_view(D.Memory(pd.weights_md()), pd.weights_md()) is not None


@pytest.mark.parametrize("activation", list(ACTS))
@pytest.mark.parametrize("k,n,z", [(256, 1100, "row"), (300, 1024, "scalar"), (512, 640, None), (300, 960, "row"),
                                   (1027, 320, None)])
def test_one_row_fused_products_are_streamed_and_equal_numpy(activation, k, n, z, monkeypatch):
    """act(alpha·(x @ W) + bias + Z) at one row once the plan has run AFTER_RUNS times: K and
    N that are not whole blocks (padded in the packed layout), an odd number of panels, K
    not a multiple of 8, Z a row or a scalar."""
    monkeypatch.setattr(row_panels, "AFTER_RUNS", 2)
    rng = np.random.default_rng(k + n)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    inputs, inits, feeds = ["x", "w", "b"], [init("w", w), init("b", bias)], {"x": x}
    zv = 0.0
    if z:
        zv = rng.standard_normal((1, 1, n) if z == "row" else (1,)).astype(np.float32)
        inputs.append("z")
        feeds["z"] = zv
    extra = {"activation_params": PARAMS[activation]} if activation in PARAMS else {}
    node = helper.make_node("FusedMatMul", inputs, ["y"], name="p", domain="glassrt", alpha=0.75,
                            activation=activation, **extra)
    graph_inputs = [tensor("x", ["batch", "seq", k])] + ([tensor("z", list(zv.shape))] if z else [])
    m = model([node], graph_inputs, [tensor("y", None)], inits, opset=17, domains={"glassrt": 1})
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    ref = ACTS[activation](0.75 * (x.astype(np.float64) @ w) + bias + zv).astype(np.float32)
    assert _streams(sess, feeds, ref) == _panels_here(k, n)
    more = rng.standard_normal((1, 3, k)).astype(np.float32)  # three rows: the primitive, as before
    feeds["x"] = more
    np.testing.assert_allclose(sess.run(None, feeds)[0],
                               ACTS[activation](0.75 * (more.astype(np.float64) @ w) + bias + zv), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_one_row_matmul_and_gemm_with_transposed_weights_are_streamed(op, monkeypatch):
    monkeypatch.setattr(row_panels, "AFTER_RUNS", 3)
    rng = np.random.default_rng(5)
    k, n = 384, 768
    w = rng.standard_normal((n, k) if op == "Gemm" else (k, n)).astype(np.float32)
    if op == "Gemm":
        c = rng.standard_normal(n).astype(np.float32)
        node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="p", transB=1, alpha=2.0, beta=0.5)
        inits, x_shape = [init("w", w), init("c", c)], [1, k]
        ref = lambda x: 2.0 * (x.astype(np.float64) @ w.T) + 0.5 * c  # noqa: E731
    else:
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="p")
        inits, x_shape = [init("w", w)], [1, 1, k]
        ref = lambda x: x.astype(np.float64) @ w  # noqa: E731
    m = model([node], [tensor("x", x_shape)], [tensor("y", None)], inits, opset=17)
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    for _ in range(2):  # new inputs each time: nothing is kept from a previous run
        x = rng.standard_normal(x_shape).astype(np.float32)
        assert _streams(sess, {"x": x}, ref(x), runs=5) == (_panels_here(k, n) and _ == 0)
    said = sess.explain()["summary"]["row_products"]  # explain counts them (this process's)
    assert said["after_runs"] == 3 and said["streamed"] == row_panels.stats["streamed"]


def test_where_products_are_not_streamed_it_says_why(monkeypatch):
    monkeypatch.setattr(row_panels, "_READY", [])
    monkeypatch.setattr(row_panels, "_forked", [True])
    assert "forked" in row_panels.why_not_here()
    monkeypatch.setattr(row_panels, "_forked", [False])
    import threading
    import types

    from glassrt.kernels.cpu import _jit

    monkeypatch.setattr(_jit, "_warm", threading.Event())  # (as before anything loaded Numba)
    monkeypatch.delitem(__import__("sys").modules, "numba")
    assert "Numba is not loaded" in row_panels.why_not_here()
    # an import under way on another thread (numba_warmup's) is in sys.modules, half made:
    # compiling against it failed, and the failure was kept for the process's life
    loading = types.ModuleType("numba")
    loading.__spec__ = types.SimpleNamespace(_initializing=True)
    monkeypatch.setitem(__import__("sys").modules, "numba", loading)
    assert "Numba is not loaded" in row_panels.why_not_here() and not row_panels._READY


def test_a_forked_child_runs_a_streamed_product_on_the_primitive(monkeypatch):
    """Numba's OpenMP layer ends a child forked after it ran a parallel loop; a product the
    parent streams runs on its oneDNN primitive in the child (one OpenMP thread there)."""
    monkeypatch.setattr(row_panels, "AFTER_RUNS", 1)
    rng = np.random.default_rng(9)
    k, n = 256, 1536
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="p")], [tensor("x", [1, k])], [tensor("y", None)],
              [init("w", w)], opset=17)
    sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    before = row_panels.stats["streamed"]
    for _ in range(3):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ w, rtol=2e-5, atol=2e-5)
    assert row_panels.stats["streamed"] == before + _panels_here(k, n)
    passes_in_a_forked_child(lambda: np.allclose(sess.run(None, {"x": x})[0], x @ w, rtol=2e-5, atol=2e-5))


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [40, 64, 200, 448])
def test_the_loop_gives_each_thread_a_block_of_panels_any_count(threads, n):
    """The loop splits the panels into `threads` blocks (more threads than panels, a partial
    last panel, blocks of unequal length), each thread applying the epilogue to its block:
    every output written once, bias + residual + activation applied once."""
    from glassrt.kernels.cpu._jit import compiled

    assert row_panels.why_not_here() is None
    rng = np.random.default_rng(n * 10 + threads)
    k = 24
    w = rng.standard_normal((k, n)).astype(np.float32)
    panels = -(-n // row_panels.PANEL)
    packed = np.zeros((panels, k, row_panels.PANEL), np.float32)  # (panels, K, 64), zero-padded columns
    for q in range(panels):
        cols = w[:, q * 64:(q + 1) * 64]
        packed[q, :, :cols.shape[1]] = cols
    a, bias, z = (rng.standard_normal(s).astype(np.float32) for s in (k, n, n))
    y = np.full(n, np.nan, np.float32)
    compiled(row_panels._row_panels)(a, packed, k, y, np.float32(0.5), bias, z, 7, 0.0, 0.0, threads)
    ref = GELU_TANH(0.5 * (a.astype(np.float64) @ w) + bias + z)
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)


def test_a_replayed_product_reads_new_values_from_the_same_buffers(monkeypatch):
    """Inside a plan the product's operands are the same arena buffers every run (the loop's
    arguments are then reused): each run must still read the values of that run, the
    residual's too, also after the plan is compiled to a replay and over many runs."""
    monkeypatch.setattr(row_panels, "AFTER_RUNS", 2)
    rng = np.random.default_rng(11)
    k, n = 512, 1100
    w = (rng.standard_normal((k, n)) / 16).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["r"], ["zr"]),
             helper.make_node("FusedMatMul", ["h", "w", "", "zr"], ["p"], name="p", domain="glassrt",
                              activation="GeluTanh"), helper.make_node("Neg", ["p"], ["y"])]
    m = model(nodes, [tensor("x", [1, 1, k]), tensor("r", [1, 1, n])], [tensor("y", None)], [init("w", w)],
              opset=17, domains={"glassrt": 1})
    views = []  # the argument views the streamed product made: none once its arguments are reused

    class Counting(row_panels.ContiguousViews):
        def __call__(self, slot, a, shape=(-1,)):
            views.append(slot)
            return super().__call__(slot, a, shape)

    monkeypatch.setattr(row_panels, "ContiguousViews", Counting)
    # (a fixed thread count: on a loaded machine the adaptive choice may try one thread in
    # the last runs, and a new count rightly makes the loop's arguments anew)
    sess = glassrt.InferenceSession(m, glassrt.SessionOptions(adaptive_threads=False), providers=["onednn", "cpu"])
    before = row_panels.stats["streamed"]
    for i in range(24):
        x, r = rng.standard_normal((1, 1, k)).astype(np.float32), rng.standard_normal((1, 1, n)).astype(np.float32)
        ref = -GELU_TANH(np.maximum(x, 0).astype(np.float64) @ w - r)
        np.testing.assert_allclose(sess.run(None, {"x": x, "r": r})[0], ref, rtol=2e-5, atol=2e-5)
        if i == 19:
            views.clear()
    assert (row_panels.stats["streamed"] > before) == _panels_here(k, n)
    assert views == []  # the last runs reused the loop's arguments (the values still each run's)


def test_a_session_with_another_thread_count_does_not_change_a_streamed_products(monkeypatch):
    """Numba's thread count is per thread and another session may set its own (intra_op 1)
    on the same thread: a streamed product of a 2-thread session runs on 2 threads again."""
    import numba

    monkeypatch.setattr(row_panels, "AFTER_RUNS", 2)
    rng = np.random.default_rng(12)
    k, n = 512, 1100
    w = rng.standard_normal((k, n)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["p"]),
             helper.make_node("Neg", ["p"], ["y"])]
    m = model(nodes, [tensor("x", [1, k])], [tensor("y", None)], [init("w", w)], opset=17)
    two = glassrt.InferenceSession(m, providers=["onednn", "cpu"],
                                   sess_options=glassrt.SessionOptions(intra_op_num_threads=2, adaptive_threads=False))
    one = glassrt.InferenceSession(m, providers=["onednn", "cpu"],
                                   sess_options=glassrt.SessionOptions(intra_op_num_threads=1, adaptive_threads=False))
    x = rng.standard_normal((1, k)).astype(np.float32)
    before, panels = row_panels.stats["streamed"], _panels_here(k, n)
    for i in range(20):
        np.testing.assert_allclose(two.run(None, {"x": x})[0], -(np.maximum(x, 0) @ w), rtol=2e-5, atol=2e-4)
        one.run(None, {"x": x})
        np.testing.assert_allclose(two.run(None, {"x": x})[0], -(np.maximum(x, 0) @ w), rtol=2e-5, atol=2e-4)
        if i >= 2 and panels:  # (both sessions' products streamed by now; without panels, never: AVX2)
            assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)
    assert (row_panels.stats["streamed"] - before == 2) == panels
