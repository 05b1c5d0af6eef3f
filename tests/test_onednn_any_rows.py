"""onednn's products over a row count known only at run time (kernels/onednn/matmul_rows.py):
a plan shared by several sequence lengths keeps its weight products on oneDNN, a primitive
per row count, and answers as onnxruntime does."""
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt
from glassrt.runtime.runner import ShapePattern

K, N = 48, 80


@pytest.fixture(autouse=True)
def _onednn():
    from glassrt.kernels.onednn import capi

    if capi.UNAVAILABLE is not None:
        pytest.skip(str(capi.UNAVAILABLE))


def _encoder_block():
    """x (1, s, K): MatMul + bias + Gelu (a FusedMatMul with its epilogue), a second product
    with a bias and the residual added per row, a Gemm over the flattened rows with its C, a
    product whose added tensor is one row for every row, attention's two products of
    computed values (x·xᵀ scaled, softmax, ·x), and a LayerNormalization."""
    rng = np.random.default_rng(0)
    w = lambda *s: numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32),  # noqa: E731
                                           f"w{len(inits)}")
    inits = []
    for shape in ((K, N), (N,), (N, K), (K,), (K, N), (N,), (K, N), (N,)):
        inits.append(w(*shape))
    names = [i.name for i in inits]
    nodes = [helper.make_node("MatMul", ["x", names[0]], ["h0"]),
             helper.make_node("Add", ["h0", names[1]], ["h1"]),
             helper.make_node("Gelu", ["h1"], ["h2"], domain="com.microsoft"),
             helper.make_node("MatMul", ["h2", names[2]], ["h3"]),
             helper.make_node("Add", ["h3", names[3]], ["h4"]),
             helper.make_node("Add", ["h4", "x"], ["y"]),
             helper.make_node("Reshape", ["y", "flat"], ["y2"]),
             helper.make_node("Gemm", ["y2", names[4], names[5]], ["g"]),
             helper.make_node("MatMul", ["x", names[6]], ["m"]),
             helper.make_node("Add", ["m", names[7]], ["row"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["s0"]),
             helper.make_node("Mul", ["s0", "scale"], ["s1"]),
             helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["att"]),
             helper.make_node("LayerNormalization", ["y", "gamma", "beta"], ["ln"], epsilon=1e-5)]
    inits.append(numpy_helper.from_array(np.array([-1, K], np.int64), "flat"))
    inits.append(numpy_helper.from_array(np.array(K ** -0.5, np.float32), "scale"))
    inits.append(numpy_helper.from_array(rng.standard_normal(K).astype(np.float32), "gamma"))
    inits.append(numpy_helper.from_array(rng.standard_normal(K).astype(np.float32), "beta"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", K])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "g", "row", "att", "ln")], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8).SerializeToString()


def _feeds(s, seed=None):
    return {"x": np.random.default_rng(s if seed is None else seed).standard_normal((1, s, K)).astype(np.float32)}


def _shared(sess):
    (pattern,) = [k for k in sess.runner.plans if isinstance(k, ShapePattern)]
    return sess.runner.plans[pattern]


def test_a_shared_plan_keeps_its_products_on_onednn_and_answers_as_onnxruntime():
    model = _encoder_block()
    sess = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for s in (1, 2, 3, 4, 5, 9, 33, 5, 128, 9, 1):
        f = _feeds(s)
        for got, want in zip(sess.run(None, f), oracle.run(None, f)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    shared = _shared(sess)
    kernels = {st.kernel.name for st in shared.steps if "MatMul" in st.node.op_type or st.node.op_type == "Gemm"}
    # (the scaled x·xᵀ is fused into a FusedMatMul; ·x stays a MatMul)
    assert kernels == {"onednn.FusedMatMul.matmul_any_rows", "onednn.Gemm.matmul_any_rows",
                       "onednn.FusedMatMul.batched_matmul_any_shape", "onednn.MatMul.batched_matmul_any_shape"}, kernels
    rows = {st.kernel.name for st in shared.steps if st.node.op_type in ("Softmax", "LayerNormalization")}
    assert rows == {"onednn.Softmax.softmax_any_shape", "onednn.LayerNormalization.layer_norm_any_rows"}, rows
    assert not shared.moved, shared.moved


def test_the_shared_steps_hold_no_array_of_a_run():
    """Each call points the shared step's memories at its own arrays and lets go of them
    after: the run's pool buffers go back to the pool, and a node's weights are not kept
    alive by a step another session may share."""
    from glassrt.kernels.onednn import kernels
    from glassrt.kernels.onednn.capi import ARG_ATTR_SCALES, ARG_SCRATCHPAD, ARG_WORKSPACE

    sess = glassrt.InferenceSession(_encoder_block(), providers=["onednn", "cpu"])
    for s in (2, 3, 4, 5, 6):
        sess.run(None, _feeds(s))
    assert kernels._THREAD_STEPS
    for v in kernels._THREAD_STEPS.values():
        st = v[0] if isinstance(v, tuple) else v
        held = [arg for arg, m in st.mems.items() if m.array is not None
                and arg not in (ARG_SCRATCHPAD, ARG_WORKSPACE) and not arg & ARG_ATTR_SCALES]
        assert len(st.mems) >= 2 and not held, held  # (its scratchpad and a constant scale are its own)
    pool = _shared(sess).pool.stats()
    sess.run(None, _feeds(6))
    assert _shared(sess).pool.stats()["misses"] == pool["misses"]  # every buffer came back


def test_the_shared_plan_is_safe_across_threads():
    model = _encoder_block()
    sess = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for s in (2, 3, 4, 5):
        sess.run(None, _feeds(s))
    errors = []

    def work(t):
        try:
            for i in range(12):
                s = 6 + (t * 12 + i) % 17
                f = _feeds(s, seed=t * 100 + i)
                for got, want in zip(sess.run(None, f), oracle.run(None, f)):
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_product_it_does_not_take_moves_and_says_why():
    """A Gemm reading A transposed is taken by the kernels bound per plan only: in the shared
    plan (its rows symbolic) it moves to cpu, and the selection says what refused it."""
    rng = np.random.default_rng(1)
    w, w1, w2 = (numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) / 4, n)
                 for n, s in (("w", (K, 16)), ("w1", (16, 16)), ("w2", (16, 16))))
    # (two products it takes after it: a shared plan that moved most of its steps is not used)
    g = helper.make_graph([helper.make_node("Gemm", ["z", "w"], ["h"], transA=1),
                           helper.make_node("MatMul", ["h", "w1"], ["h1"]),
                           helper.make_node("MatMul", ["h1", "w2"], ["y"])], "g",
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [K, "s"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, w1, w2])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for s in (2, 3, 4, 5, 6):
        f = {"z": np.random.default_rng(s).standard_normal((K, s)).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, f)[0], oracle.run(None, f)[0], rtol=1e-4, atol=1e-4)
    sel = {sel.node: sel for sel in _shared(sess).selections}["Gemm_0"]
    assert sel.provider == "cpu" and "matmul_any_rows: A is read transposed" in sel.reason, sel


def _rows_model(op, x_shape, opset=17, **attrs):
    """One row op (LayerNormalization with a Scale and B over the dims from `axis` on, or a
    Softmax / LogSoftmax) on X of `x_shape` (symbolic dims named), and a Relu after it."""
    inits, ins = [], ["x"]
    if op == "LayerNormalization":
        axis = attrs.get("axis", -1)
        width = x_shape[axis:] if axis < 0 else x_shape[axis:]
        rng = np.random.default_rng(3)
        inits = [numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), n) for n in ("gamma", "beta")]
        ins += ["gamma", "beta"]
    g = helper.make_graph([helper.make_node(op, ins, ["r"], **attrs), helper.make_node("Relu", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("op, x_shape, opset, attrs", [
    ("LayerNormalization", [2, "s", 24], 17, {}),
    ("LayerNormalization", ["b", "s", 6, 8], 17, {"axis": -2, "epsilon": 1e-3}),
    ("Softmax", [1, 3, "s", "s"], 13, {}),
    ("LogSoftmax", [2, "s", 40], 13, {"axis": 2}),
    ("Softmax", ["b", 3, "s"], 11, {"axis": 1}),  # (before opset 13: the dims from axis on are one row)
])
def test_row_ops_over_shapes_known_at_run_time_stay_on_onednn(op, x_shape, opset, attrs):
    """LayerNormalization, Softmax and LogSoftmax in a shared plan run on oneDNN, a primitive
    per (rows, width), and answer as onnxruntime does at every shape (empty ones included)."""
    model = _rows_model(op, x_shape, opset, **attrs)
    sess = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for s in (1, 2, 3, 4, 7, 2, 33, 0, 5):
        shape = [s if isinstance(d, str) else d for d in x_shape]
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], oracle.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    shared = _shared(sess)
    (st,) = [st for st in shared.steps if st.node.op_type == op]
    assert st.provider == "onednn" and st.kernel.name.endswith(("layer_norm_any_rows", "softmax_any_shape")), \
        {sel.node: sel for sel in shared.selections}[st.node.name]
    assert st.node.name not in shared.moved  # (the Relu after it moves: oneDNN's eltwise is bound to shapes)


def test_a_layer_norm_over_symbolic_dims_moves_and_says_why():
    """Normalized dims that change from run to run (Scale and B fed with them) give no fixed
    row width: in the shared plan the node moves to cpu, and its selection says why."""
    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["r"]),
                           helper.make_node("Relu", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "s", "w"]),
                           helper.make_tensor_value_info("gamma", TensorProto.FLOAT, ["w"]),
                           helper.make_tensor_value_info("beta", TensorProto.FLOAT, ["w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for s, w in ((2, 3), (3, 5), (4, 8), (5, 6), (6, 7)):
        f = {"x": rng.standard_normal((2, s, w)).astype(np.float32), "gamma": rng.standard_normal(w).astype(np.float32),
             "beta": rng.standard_normal(w).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, f)[0], oracle.run(None, f)[0], rtol=1e-5, atol=1e-5)
    sel = {sel.node: sel for sel in _shared(sess).selections}["LayerNormalization_0"]
    assert sel.provider == "cpu" and "layer_norm_any_rows: the dims from axis 2 on ([w]) are symbolic" in sel.reason, sel


def test_a_pool_buffer_read_through_a_view_comes_back_once_the_view_is_gone():
    """A shared plan releases a value whose Reshape (a view of its pool buffer) is still
    read: the buffer waits for the view to go, then is reused (before, it was dropped, and
    every run allocated it again)."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]),
                           helper.make_node("Reshape", ["a", "shape"], ["v"]),
                           helper.make_node("Sigmoid", ["v"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([0, -1, 8, 8], np.int64), "shape")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = glassrt.InferenceSession(model, providers=["cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for s in (2, 3, 4, 5, 50, 50):
        x = np.random.default_rng(s).standard_normal((1, s, 64)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], oracle.run(None, {"x": x})[0], rtol=1e-6)
    pool = _shared(sess).pool
    before = pool.stats()["misses"]
    for _ in range(5):
        sess.run(None, {"x": x})
    assert pool.stats()["misses"] == before


def test_any_shape_kernels_allocate_their_output_where_the_plan_cannot_size_it():
    """Rows that are an expression of dims no input of the node gives bare (x [s, 16] and
    z [t, 16] concatenated: s + t rows) leave the shared plan no formula for the outputs:
    the steps are called without an output, and the any-shape products and softmax allocate
    it (the corpus's magika model failed so, its rows Max(slice, n))."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("Concat", ["x", "z"], ["r"], axis=0),
             helper.make_node("MatMul", ["r", "w"], ["m"]),
             helper.make_node("Softmax", ["m"], ["p"], axis=-1),
             helper.make_node("Transpose", ["r"], ["rt"], perm=[1, 0]),
             helper.make_node("MatMul", ["r", "rt"], ["g"]),
             helper.make_node("Softmax", ["g"], ["q"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", 16]),
                                       helper.make_tensor_value_info("z", TensorProto.FLOAT, ["t", 16])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("p", "q")], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for s, t in ((2, 1), (3, 2), (4, 5), (5, 3), (6, 2), (7, 7), (3, 2)):
        rng = np.random.default_rng(s * 10 + t)
        f = {"x": rng.standard_normal((s, 16)).astype(np.float32), "z": rng.standard_normal((t, 16)).astype(np.float32)}
        for got, want in zip(sess.run(None, f), oracle.run(None, f)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    kernels = {st.kernel.name for st in _shared(sess).steps}
    assert {"onednn.MatMul.matmul_any_rows", "onednn.FusedMatMul.batched_matmul_any_shape",
            "onednn.Softmax.softmax_any_shape"} <= kernels, kernels
