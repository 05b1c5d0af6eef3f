"""glassrt::ScaledDotProductAttention (passes/fuse_attention.py): attention over a KV cache
(Concat onto the past, Q·Kᵀ, scale, Where/Add mask, Softmax, ·V) becomes one node with the
same numbers as onnxruntime's op-by-op run, on the compiled row loop (a few query rows)
and on the BLAS path (many); it does not fire elsewhere."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt

from .helpers import init, model, tensor

ort = pytest.importorskip("onnxruntime")
H, D = 3, 8


def _attention(scale_op="Div", masking="where", dtype=np.float32, fill=-3.0e38, perm=(0, 1, 3, 2), axis=-1,
               cached=True, expose_scores=False):
    """One attention step over a cache: q (b, H, s, D); past_k/past_v (b, H, past, D) grow
    by k/v (b, H, s, D); keep (bool) or mask (float) (b or 1, 1, s, past + s)."""
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    nodes, inputs = [], [tensor("q", ["b", H, "s", D], elem)]
    if cached:
        nodes += [helper.make_node("Concat", ["past_k", "k"], ["present_k"], axis=2, name="cat_k"),
                  helper.make_node("Concat", ["past_v", "v"], ["present_v"], axis=-2, name="cat_v")]
        inputs += [tensor(n, ["b", H, d, D], elem) for n, d in
                   (("past_k", "past"), ("k", "s"), ("past_v", "past"), ("v", "s"))]
        key, value = "present_k", "present_v"
    else:
        inputs += [tensor(n, ["b", H, "t", D], elem) for n in ("present_k", "present_v")]
        key, value = "present_k", "present_v"
    nodes += [helper.make_node("Transpose", [key], ["kt"], perm=list(perm), name="kt"),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk")]
    inits, cur = [], "scores"
    if scale_op:
        inits.append(init("c", np.array(np.sqrt(D) if scale_op == "Div" else 1 / np.sqrt(D), dtype)))
        nodes.append(helper.make_node(scale_op, [cur, "c"] if scale_op == "Div" else ["c", cur], ["scaled"], name="scale"))
        cur = "scaled"
    if masking in ("where", "both"):
        inits.append(init("fill", np.array(fill, dtype)))
        inputs.append(tensor("keep", [1, 1, "s", "t"], TensorProto.BOOL))
        nodes.append(helper.make_node("Where", ["keep", cur, "fill"], ["kept"], name="where"))
        cur = "kept"
    if masking in ("add", "both"):
        inputs.append(tensor("mask", ["b", 1, 1, "t"], elem))
        nodes.append(helper.make_node("Add", [cur, "mask"], ["masked"], name="add_mask"))
        cur = "masked"
    nodes += [helper.make_node("Softmax", [cur], ["p"], axis=axis, name="softmax"),
              helper.make_node("MatMul", ["p", value], ["y"], name="pv")]
    outputs = [tensor("y", ["b", H, "s", D], elem)] + ([tensor(n, ["b", H, "t", D], elem) for n in ("present_k", "present_v")] if cached else [])
    if expose_scores:
        outputs.append(tensor("scores", ["b", H, "s", "t"], elem))
    return model(nodes, inputs, outputs, inits, opset=17)


def _feeds(m, past, s, rng, dtype=np.float32, b=2):
    names = {i.name for i in m.graph.input}
    t = past + s
    f = {"q": rng.standard_normal((b, H, s, D)).astype(dtype)}
    if "past_k" in names:
        f.update({"past_k": rng.standard_normal((b, H, past, D)).astype(dtype),
                  "k": rng.standard_normal((b, H, s, D)).astype(dtype),
                  "past_v": rng.standard_normal((b, H, past, D)).astype(dtype),
                  "v": rng.standard_normal((b, H, s, D)).astype(dtype)})
    else:
        f.update({n: rng.standard_normal((b, H, t, D)).astype(dtype) for n in ("present_k", "present_v")})
    if "keep" in names:  # causal: query i sees the past and the new keys up to its own
        f["keep"] = (np.arange(t)[None, :] <= past + np.arange(s)[:, None]).reshape(1, 1, s, t)
    if "mask" in names:
        f["mask"] = rng.standard_normal((b, 1, 1, t)).astype(dtype)
    return f


def _session(m, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(m.SerializeToString(), glassrt.SessionOptions(**options), providers=["cpu"])


def _ops(sess):
    return [n["op"] for n in sess.explain()["nodes"]]


@pytest.mark.parametrize("scale_op, masking, dtype", [("Div", "where", np.float32), ("Mul", "add", np.float32),
                                                      ("", "both", np.float32), ("Div", "", np.float64)])
def test_kv_cache_attention_is_one_node_and_matches_onnxruntime(scale_op, masking, dtype):
    m = _attention(scale_op, masking, dtype)
    sess, oracle = _session(m), ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ops = _ops(sess)
    assert ops.count("ScaledDotProductAttention") == 1 and not {"Softmax", "Transpose", "MatMul", "Where"} & set(ops)
    rng = np.random.default_rng(0)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    # one query row per step (the compiled loop), a growing cache; then a 12-row prompt (BLAS)
    for past, s in [(0, 1), (1, 1), (5, 1), (6, 1), (17, 1), (9, 3), (0, 12), (4, 12)]:
        feeds = _feeds(m, past, s, rng, dtype)
        for got, want in zip(sess.run(None, feeds), oracle.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _causal_mask_model(max_len=512):
    """GPT-2's causal mask: each step slices rows [T - s, T) and columns [0, T) of a constant
    lower-triangular (1, 1, max, max) bool from its cache's length T; the row slice has a
    static shape (one query row) and lives in the plan's arena, the column slice is a view
    of it with the symbolic length."""
    m = _attention("Div", "")
    g = m.graph
    tri = np.tril(np.ones((max_len, max_len), bool)).reshape(1, 1, max_len, max_len)
    g.initializer.extend([init("bias", tri), init("two", np.array(2, np.int64)), init("zero1", np.array([0], np.int64)),
                          init("ax0", np.array([0], np.int64)), init("ax2", np.array([2], np.int64)),
                          init("ax3", np.array([3], np.int64))])
    mask_nodes = [helper.make_node("Shape", ["present_k"], ["shk"]), helper.make_node("Gather", ["shk", "two"], ["t"]),
                  helper.make_node("Shape", ["q"], ["shq"]), helper.make_node("Gather", ["shq", "two"], ["s_len"]),
                  helper.make_node("Sub", ["t", "s_len"], ["start"]),
                  helper.make_node("Unsqueeze", ["start", "ax0"], ["start1"]),
                  helper.make_node("Unsqueeze", ["t", "ax0"], ["end1"]),
                  helper.make_node("Slice", ["bias", "start1", "end1", "ax2"], ["rows"], name="mask_rows"),
                  helper.make_node("Slice", ["rows", "zero1", "end1", "ax3"], ["keep"], name="mask_cols"),
                  helper.make_node("Where", ["keep", "scaled", "fill"], ["kept"], name="where")]
    g.initializer.append(init("fill", np.array(-3.0e38, np.float32)))
    softmax = next(n for n in g.node if n.op_type == "Softmax")
    softmax.input[0] = "kept"
    at = list(g.node).index(softmax)
    for n in reversed(mask_nodes):
        g.node.insert(at, n)
    # the attention's output is read by one more node, so it is planned in the arena too
    next(n for n in g.node if n.name == "pv").output[0] = "att"
    g.node.append(helper.make_node("Neg", ["att"], ["y"], name="after"))
    return m


def test_a_causal_mask_sliced_per_step_matches_onnxruntime_on_the_shared_plan():
    """Token by token, past the point where the steps share one plan with the cache length
    symbolic: the mask's column slice is a view into the arena bytes of its row slice,
    which the memory plan frees after the column slice; the view must not be overwritten
    by the attention's output (it was, from the fourth step on)."""
    m = _causal_mask_model()
    sess, oracle = _session(m), ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert "ScaledDotProductAttention" in _ops(sess)
    rng = np.random.default_rng(5)
    for past in range(1, 24):
        feeds = _feeds(m, past, 1, rng, b=1)
        for got, want in zip(sess.run(None, feeds), oracle.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fusion_level_basic_keeps_the_nodes():
    ops = _ops(_session(_attention(), graph_optimization_level="basic"))
    assert "ScaledDotProductAttention" not in ops and "Softmax" in ops


@pytest.mark.parametrize("variant", ["no-cache", "scores-read-elsewhere", "other-perm", "other-axis"])
def test_the_fusion_does_not_fire_where_it_must_not(variant):
    kwargs = {"no-cache": dict(cached=False), "scores-read-elsewhere": dict(expose_scores=True),
              "other-perm": dict(perm=(0, 2, 1, 3)), "other-axis": dict(axis=2)}[variant]
    m = _attention(**kwargs)
    sess = _session(m)
    assert "ScaledDotProductAttention" not in _ops(sess)
    if variant in ("no-cache", "scores-read-elsewhere"):  # still runs, op by op, with onnxruntime's numbers
        feeds = _feeds(m, 4, 1, np.random.default_rng(1))
        oracle = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for got, want in zip(sess.run(None, feeds), oracle.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("s", [1, 12], ids=["row-loop", "blas"])
def test_nan_and_fully_masked_rows_are_what_the_unfused_graph_gives(s):
    """A NaN in a query row makes that row NaN; a row whose every key is filled with -inf is
    NaN (inf - inf), as onnxruntime's Softmax gives; the other rows are untouched."""
    m = _attention("Div", "where", fill=-np.inf)
    sess, oracle = _session(m), ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert "ScaledDotProductAttention" in _ops(sess)
    feeds = _feeds(m, 3, s, np.random.default_rng(2))
    feeds["q"][0, 1, 0, 2] = np.nan
    feeds["keep"] = feeds["keep"].copy()
    feeds["keep"][..., s - 1, :] = False
    got, want = sess.run(None, feeds)[0], oracle.run(None, feeds)[0]
    assert np.isnan(got[0, 1, 0]).all() and np.isnan(got[:, :, s - 1]).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_mask_that_does_not_fit_fails_with_the_fused_node_named():
    """keep's length is a symbol of its own: the plan may not assume it fits the scores, so
    the kernel checks it at run time and the error names the node and op."""
    m = _attention()
    sess = _session(m)
    feeds = _feeds(m, 4, 1, np.random.default_rng(3))
    feeds["keep"] = np.ones((1, 1, 1, 7), bool)  # 7 keys kept, 5 keys there
    with pytest.raises(glassrt.GlassrtError, match="ScaledDotProductAttention.*'pv'|'pv'.*ScaledDotProductAttention"):
        sess.run(None, feeds)


def test_an_optimized_file_carries_the_decomposition_onnxruntime_runs(tmp_path):
    import onnx

    from glassrt.tools.optimize import optimize

    m = _attention("Div", "both")
    src, dst = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(m, src)
    optimize(str(src), str(dst))
    written = onnx.load(dst)
    onnx.checker.check_model(written, full_check=True)
    assert [n.op_type for n in written.graph.node].count("ScaledDotProductAttention") == 1
    feeds = _feeds(m, 4, 1, np.random.default_rng(4))
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    for sess in (ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]), _session(written)):
        for got, ref in zip(sess.run(None, feeds), want):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_a_session_with_the_fused_attention_starts_loading_numba_as_it_is_made(tmp_path):
    """Its one-row loop (a decode step's) needs Numba and has no NumPy twin of the same bits:
    a session whose placement chose the kernel (Kernel.warms_numba) starts loading Numba on
    its own thread as its creation ends, so that the first decode step does not wait for the
    import; a session without such a kernel starts nothing. Fresh processes: imports are
    process state."""
    import subprocess
    import sys

    path = tmp_path / "attention.onnx"
    path.write_bytes(_attention().SerializeToString())
    plain = tmp_path / "relu.onnx"
    plain.write_bytes(model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2, 3])], [tensor("y", None)],
                            [], opset=17).SerializeToString())
    code = ("import sys, glassrt\nfrom glassrt.kernels.cpu import _jit\n"
            "s = glassrt.InferenceSession(sys.argv[1], providers=['cpu'])\n"
            "started = _jit._warmup is not None\n_jit.wait_for_numba()\n"
            "print(started, _jit.numba_loaded())")
    outs = [subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120,
                           check=True).stdout.split() for p in (path, plain)]
    assert outs == [["True", "True"], ["False", "False"]], outs


def test_a_long_one_row_attention_splits_its_heads_between_threads_with_the_same_numbers(monkeypatch):
    """Past SDPA_PARALLEL_KEYS keys the one-row loop runs its (batch, head) pairs on OpenMP's
    threads: each pair's arithmetic is the one-thread loop's (compiled apart, so within
    rounding: LLVM may fuse multiply-adds differently), every pair is computed."""
    pytest.importorskip("numba")
    from glassrt.kernels.cpu import attention as A

    rng = np.random.default_rng(11)
    b, heads, t = 3, 3, 300  # (9 pairs: two threads take 5 and 4)
    q = rng.standard_normal((b, heads, 1, D)).astype(np.float32)
    k, v = (rng.standard_normal((b, heads, t, D)).astype(np.float32) for _ in range(2))
    keep = rng.random((b, 1, 1, t)) > 0.2
    mask = rng.standard_normal((1, 1, 1, t)).astype(np.float32)
    monkeypatch.setattr(A, "SDPA_PARALLEL_KEYS", 10**9)
    one = A.scaled_dot_product_attention(q, k, v, keep, mask, scale=0.3, fill=-1e9)
    monkeypatch.setattr(A, "SDPA_PARALLEL_KEYS", 1)
    threads = A._parallel_threads(b * heads, t)
    if threads == 1:
        from glassrt.kernels.onednn import row_panels
        pytest.skip(f"one thread here: {row_panels.why_not_here() or 'Numba has one thread'}")
    split = A.scaled_dot_product_attention(q, k, v, keep, mask, scale=0.3, fill=-1e9)
    np.testing.assert_allclose(split, one, rtol=1e-6, atol=1e-7)
    many_rows = A.scaled_dot_product_attention(np.repeat(q, 9, axis=2), k, v, keep, mask, scale=0.3, fill=-1e9)
    np.testing.assert_allclose(split, many_rows[:, :, :1], rtol=1e-5, atol=1e-6)  # (the BLAS path)


def test_a_many_row_attention_splits_its_heads_between_two_threads_with_the_same_bits(monkeypatch):
    """A prompt's attention (many query rows: BLAS products and NumPy passes) runs half of its
    heads on a helper thread where runs have two threads: the same operations per head, so
    the same bits; a keep per head is cut with them, one for all heads is shared."""
    from glassrt.kernels import run_threads
    from glassrt.kernels.cpu import attention as A

    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((2, 5, 40, D)).astype(np.float32) for _ in range(3))
    for keep in (np.tril(np.ones((40, 40), bool)), rng.random((2, 5, 40, 40)) > 0.3):
        mask = rng.standard_normal((2, 1, 1, 40)).astype(np.float32)
        monkeypatch.setattr(A, "SDPA_SPLIT_SCORES", 1)
        monkeypatch.setattr(run_threads, "count", 1)
        one = A.scaled_dot_product_attention(q, k, v, keep, mask, scale=0.3, fill=-1e9)
        monkeypatch.setattr(run_threads, "count", 2)
        two = A.scaled_dot_product_attention(q, k, v, keep, mask, scale=0.3, fill=-1e9)
        np.testing.assert_array_equal(two, one)
