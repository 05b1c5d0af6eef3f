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
    computed values (x·xᵀ scaled, softmax, ·x), and a LayerNormalization (which moves to cpu)."""
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
    ops = {st.node.name: st.node.op_type for st in shared.steps}
    # (LayerNormalization and Softmax move to cpu: oneDNN's are bound to concrete shapes)
    assert not [n for n in shared.moved if ops[n] not in ("Softmax", "LayerNormalization")], shared.moved


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
        assert len(st.mems) >= 3 and not held, held  # (its scratchpad and a constant scale are its own)
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
