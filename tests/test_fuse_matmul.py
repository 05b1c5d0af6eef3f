"""glassrt::FusedMatMul (passes/fuse_matmul.py) and the transformer kernels behind it:
the fusion keeps results and does not fire where it must not; oneDNN's matmul (constant
weights, epilogue as post-ops), LayerNormalization and Softmax equal glassrt's cpu kernels
and NumPy."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi
from glassrt.tools.bench_models import bert, bert_feeds

from .helpers import init, model, tensor

onednn = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=f"oneDNN: {capi.UNAVAILABLE}")
RNG = np.random.default_rng(0)


def _session(m, providers=None, **options):
    so = glassrt.SessionOptions()
    for k, v in options.items():
        setattr(so, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(m.SerializeToString(), so, providers=providers)


def _kernels(s):
    return {n["name"]: (n["op"], n.get("kernel")) for n in s.explain()["nodes"]}


def _ops(s):
    return sorted(n["op"] for n in s.explain()["nodes"])


def _gelu(v):
    from math import erf
    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


def _gelu_tanh(v):
    return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))


def _chain(steps, x_shape=(2, 5, 8), n=6, z_shape=None):
    """x @ W then `steps` (each 'scale', 'bias', 'z' or an activation name), as an exporter
    writes them, and the NumPy result."""
    w = RNG.standard_normal((x_shape[-1], n)).astype(np.float32) * 0.3
    b = RNG.standard_normal(n).astype(np.float32)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    z = RNG.standard_normal(z_shape or x_shape[:-1] + (n,)).astype(np.float32)
    inits = [init("W", w), init("b", b), init("c", np.array(4.0, np.float32))]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["t0"], name="mm")]
    ref = x @ w
    for i, s in enumerate(steps):
        src, dst = f"t{i}", f"t{i + 1}"
        if s == "scale":
            nodes.append(helper.make_node("Div", [src, "c"], [dst], name=f"s{i}"))
            ref = ref / 4
        elif s == "bias":
            nodes.append(helper.make_node("Add", ["b", src], [dst], name=f"s{i}"))  # PyTorch: bias first
            ref = ref + b
        elif s == "z":
            nodes.append(helper.make_node("Add", [src, "z"], [dst], name=f"s{i}"))
            ref = ref + z
        elif s == "GeluTanh":
            nodes.append(helper.make_node("Gelu", [src], [dst], name=f"s{i}", approximate="tanh"))
            ref = _gelu_tanh(ref)
        else:
            nodes.append(helper.make_node(s, [src], [dst], name=f"s{i}"))
            ref = {"Relu": lambda v: np.maximum(v, 0), "Tanh": np.tanh, "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
                   "Gelu": _gelu}[s](ref)
    out = f"t{len(steps)}"
    m = model(nodes, [tensor("x", list(x_shape)), tensor("z", list(z.shape))], [tensor(out, None)], inits,
              opset=20)
    return m, {"x": x, "z": z}, ref


CHAINS = [["bias"], ["bias", "Gelu"], ["bias", "GeluTanh"], ["scale", "z"], ["bias", "z"], ["bias", "z", "Relu"],
          ["scale", "bias", "Tanh"], ["Sigmoid"], ["z"]]


@pytest.mark.parametrize("providers", [["cpu"], pytest.param(None, marks=onednn)], ids=["cpu", "default"])
@pytest.mark.parametrize("steps", CHAINS, ids=["+".join(c) for c in CHAINS])
def test_fused_chains_equal_numpy_and_the_unfused_graph(steps, providers):
    m, feeds, ref = _chain(steps)
    fused = _session(m, providers)
    assert _ops(fused) == ["FusedMatMul"]
    plain = _session(m, providers, graph_optimization_level="basic")
    assert "FusedMatMul" not in _ops(plain)
    for _ in range(2):  # the replay reuses bound primitives
        got = fused.run(None, feeds)[0]
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(got, plain.run(None, feeds)[0], rtol=2e-5, atol=2e-5)


@onednn
@pytest.mark.parametrize("z_shape", [(2, 5, 6), (1, 1, 6), (6,), (2, 5, 1)], ids=str)
def test_a_mask_that_broadcasts_is_fused_and_read_as_it_lies(z_shape):
    m, feeds, ref = _chain(["scale", "z"], z_shape=z_shape)
    s = _session(m)
    assert _ops(s) == ["FusedMatMul"]
    np.testing.assert_allclose(s.run(None, feeds)[0], ref, rtol=2e-5, atol=2e-5)


def test_the_fusion_does_not_fire_where_it_must_not():
    # four products of different weights (the same product twice would be one node: cse.py)
    ws = [RNG.standard_normal((8, 6)).astype(np.float32) for _ in range(4)]
    b = init("b", np.ones(6, np.float32))
    col = init("col", np.ones((5, 1), np.float32))  # varies along rows: not a bias, but a Z
    # the product is also a graph output; its sum is read twice; a column; a Z that enlarges the product
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["p"], name="mm1"),
             helper.make_node("Add", ["p", "b"], ["q"], name="add1"),
             helper.make_node("MatMul", ["x", "W2"], ["p2"], name="mm2"),
             helper.make_node("Add", ["p2", "b"], ["q2"], name="add2"),
             helper.make_node("Relu", ["q2"], ["r2"], name="relu2"),
             helper.make_node("Sigmoid", ["q2"], ["s2"], name="sig2"),
             helper.make_node("MatMul", ["x", "W3"], ["p3"], name="mm3"),
             helper.make_node("Add", ["p3", "col"], ["q3"], name="add3"),
             helper.make_node("MatMul", ["x", "W4"], ["p4"], name="mm4"),
             helper.make_node("Add", ["p4", "big"], ["q4"], name="add4")]
    m = model(nodes, [tensor("x", [5, 8]), tensor("big", [3, 5, 6])],
              [tensor(v, None) for v in ("p", "q", "r2", "s2", "q3", "q4")],
              [init(f"W{k + 1}", w) for k, w in enumerate(ws)] + [b, col], opset=17)
    s = _session(m, ["cpu"])
    k = _kernels(s)
    assert k["mm1"][0] == "MatMul" and k["add1"][0] == "Add"      # p is a graph output
    assert k["mm2"][0] == "FusedMatMul" and k["relu2"][0] == "Relu"  # q2 has two readers: the bias only
    assert "add2" not in k
    assert k["mm3"][0] == "FusedMatMul" and "add3" not in k        # (5, 1) goes in as a Z, not as a bias
    assert "Add 'add3' fused in" in {n["name"]: n for n in s.explain()["nodes"]}["mm3"]["origin"]
    assert k["mm4"][0] == "MatMul" and k["add4"][0] == "Add"      # (3, 5, 6) would enlarge the product
    x, big = RNG.standard_normal((5, 8)).astype(np.float32), RNG.standard_normal((3, 5, 6)).astype(np.float32)
    got = s.run(None, {"x": x, "big": big})
    p1, p2, p3, p4 = (x @ w for w in ws)
    for g, r in zip(got, [p1, p1 + 1, np.maximum(p2 + 1, 0), 1 / (1 + np.exp(-(p2 + 1))), p3 + 1, p4 + big]):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)


def w_value(t):
    from onnx import numpy_helper
    return numpy_helper.to_array(t)


def test_integer_products_are_not_fused():
    w = init("W", np.arange(12, dtype=np.int32).reshape(4, 3))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["p"], name="mm"), helper.make_node("Add", ["p", "W0"], ["y"])]
    m = model(nodes, [tensor("x", [2, 4], 6)], [tensor("y", None, 6)], [w, init("W0", np.ones(3, np.int32))])
    assert "FusedMatMul" not in _ops(_session(m, ["cpu"]))


@onednn
@pytest.mark.parametrize("trans_a, trans_b, alpha, beta, c_shape",
                         [(0, 0, 1.0, 1.0, (6,)), (1, 0, 0.5, 1.0, (1, 6)), (0, 1, 1.0, 2.0, (6,)),
                          (1, 1, 2.0, 0.5, None), (0, 1, 1.0, 1.0, (1,))])
def test_gemm_on_onednn_equals_numpy(trans_a, trans_b, alpha, beta, c_shape):
    a = RNG.standard_normal((8, 5) if trans_a else (5, 8)).astype(np.float32)
    b = RNG.standard_normal((6, 8) if trans_b else (8, 6)).astype(np.float32)
    inits = [init("B", b)] + ([init("C", RNG.standard_normal(c_shape).astype(np.float32))] if c_shape else [])
    node = helper.make_node("Gemm", ["a", "B"] + (["C"] if c_shape else []), ["y"], name="g", transA=trans_a,
                            transB=trans_b, alpha=alpha, beta=beta)
    m = model([node], [tensor("a", list(a.shape))], [tensor("y", None)], inits, opset=13)
    s = _session(m)
    # (the inner product where oneDNN's matmul would pack the weights at every call: AVX2)
    assert _kernels(s)["g"][1] in ("onednn.Gemm.matmul", "onednn.Gemm.inner_product")
    ref = alpha * ((a.T if trans_a else a) @ (b.T if trans_b else b))
    if c_shape:
        ref = ref + beta * w_value(inits[1])
    np.testing.assert_allclose(s.run(None, {"a": a})[0], ref, rtol=2e-5, atol=2e-5)


GEMMS = [  # transB, alpha, beta, C (shape or "input"), the activation
    (1, 1.0, 1.0, (6,), "Relu"), (0, 0.5, 1.0, (1, 6), "Sigmoid"), (1, 1.0, 2.0, (6,), "Tanh"),
    (1, 2.0, 0.5, None, "Relu"), (0, 1.0, 1.0, (5, 1), "LeakyRelu"), (1, 1.0, 0.25, (5, 6), "Relu"),
    (1, 1.0, 1.0, "input", "Sigmoid"), (0, 1.0, 0.0, (6,), "Relu")]


@pytest.mark.parametrize("providers", [["cpu"], pytest.param(None, marks=onednn)], ids=["cpu", "default"])
@pytest.mark.parametrize("trans_b, alpha, beta, c, act", GEMMS, ids=[f"{g[4]}-{g[3]}-{g[2]}" for g in GEMMS])
def test_a_gemm_and_its_activation_fuse_and_keep_the_result(trans_b, alpha, beta, c, act, providers):
    a = RNG.standard_normal((5, 8)).astype(np.float32)
    b = RNG.standard_normal((6, 8) if trans_b else (8, 6)).astype(np.float32)
    cv = RNG.standard_normal((5, 6) if c == "input" else c or ()).astype(np.float32)
    inits, ins = [init("B", b)], [tensor("a", [5, 8])]
    if c == "input":
        ins.append(tensor("c", [5, 6]))
    elif c is not None:
        inits.append(init("c", cv))
    nodes = [helper.make_node("Gemm", ["a", "B"] + (["c"] if c is not None else []), ["y"], name="g",
                              transB=trans_b, alpha=alpha, beta=beta),
             helper.make_node(act, ["y"], ["z"], name="act")]
    m = model(nodes, ins, [tensor("z", None)], inits, opset=13)
    feeds = {"a": a, **({"c": cv} if c == "input" else {})}
    fused, plain = _session(m, providers), _session(m, providers, graph_optimization_level="basic")
    assert _ops(fused) == ["FusedMatMul"] and _ops(plain) == sorted(["Gemm", act])
    assert f"{act} 'act' fused in" in fused.explain()["nodes"][0]["origin"]
    y = alpha * (a @ (b.T if trans_b else b)) + (beta * cv if c is not None else 0)
    ref = {"Relu": lambda v: np.maximum(v, 0), "Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "Tanh": np.tanh,
           "LeakyRelu": lambda v: np.where(v > 0, v, 0.01 * v)}[act](y)
    for _ in range(2):
        got = fused.run(None, feeds)[0]
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(got, plain.run(None, feeds)[0], rtol=2e-5, atol=2e-5)


def test_a_gemm_stays_whole_where_its_fusion_must_not_fire():
    a_t = init("At", RNG.standard_normal((8, 5)).astype(np.float32))
    w = init("W", RNG.standard_normal((6, 8)).astype(np.float32))
    nodes = [  # A transposed; B computed; the product also a graph output; read twice; a scaled computed C
        helper.make_node("Gemm", ["xt", "W"], ["p1"], name="trans_a", transA=1, transB=1),
        helper.make_node("Relu", ["p1"], ["r1"], name="relu1"),
        helper.make_node("Gemm", ["x", "b"], ["p2"], name="computed_b"),
        helper.make_node("Relu", ["p2"], ["r2"], name="relu2"),
        helper.make_node("Gemm", ["x", "W"], ["p3"], name="output", transB=1),
        helper.make_node("Relu", ["p3"], ["r3"], name="relu3"),
        helper.make_node("Gemm", ["x", "W"], ["p4"], name="twice", transB=1, alpha=2.0),
        helper.make_node("Relu", ["p4"], ["r4"], name="relu4"),
        helper.make_node("Sigmoid", ["p4"], ["s4"], name="sig4"),
        helper.make_node("Gemm", ["x", "W", "c"], ["p5"], name="scaled_c", transB=1, beta=0.5),
        helper.make_node("Relu", ["p5"], ["r5"], name="relu5")]
    m = model(nodes, [tensor("xt", [8, 5]), tensor("x", [5, 8]), tensor("b", [8, 6]), tensor("c", [5, 6])],
              [tensor(v, None) for v in ("r1", "r2", "p3", "r3", "r4", "s4", "r5")], [a_t, w], opset=13)
    s = _session(m, ["cpu"])
    k = _kernels(s)
    assert all(k[g][0] == "Gemm" and k[r][0] in ("Relu", "Sigmoid") for g, r in
               (("trans_a", "relu1"), ("computed_b", "relu2"), ("output", "relu3"), ("twice", "relu4"),
                ("twice", "sig4"), ("scaled_c", "relu5")))
    feeds = {"xt": RNG.standard_normal((8, 5)).astype(np.float32), "x": RNG.standard_normal((5, 8)).astype(np.float32),
             "b": RNG.standard_normal((8, 6)).astype(np.float32), "c": RNG.standard_normal((5, 6)).astype(np.float32)}
    ref = _session(m, ["cpu"], graph_optimization_level="basic").run(None, feeds)
    for got, want in zip(s.run(None, feeds), ref):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@onednn
def test_products_onednn_does_not_take_say_why():
    w = init("W", RNG.standard_normal((8, 6)).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["p"], name="weights"),
             helper.make_node("MatMul", ["x", "y"], ["q"], name="runtime_b"),
             helper.make_node("MatMul", ["v", "W"], ["r"], name="vector")]
    m = model(nodes, [tensor("x", [5, 8]), tensor("y", [8, 3]), tensor("v", [8])],
              [tensor(v, None) for v in "pqr"], [w], opset=17)
    s = _session(m)
    rows = {n["name"]: n for n in s.explain()["nodes"]}
    assert rows["weights"]["kernel"] in ("onednn.MatMul", "onednn.MatMul.inner_product")  # (AVX2: the latter)
    assert rows["runtime_b"]["kernel"] == "onednn.MatMul.batched_matmul"
    assert rows["vector"]["provider"] == "cpu" and "matrix-vector" in str(rows["vector"])


@onednn
@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 7), (2, 3, 5, 7), (7,)], ids=str)
def test_attention_scores_run_on_onednn_with_scale_and_mask_as_post_ops(mask_shape):
    """Q·Kᵀ / √d + mask, both operands computed (and B's batch broadcast over heads), then P·V."""
    q = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    k = RNG.standard_normal((2, 1, 4, 7)).astype(np.float32)
    v = RNG.standard_normal((2, 3, 7, 4)).astype(np.float32)
    mask = (RNG.random(mask_shape) < 0.3).astype(np.float32) * -1e4
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"], name="qk"),
             helper.make_node("Div", ["s", "d"], ["sd"], name="scale"),
             helper.make_node("Add", ["sd", "mask"], ["sm"], name="mask_add"),
             helper.make_node("Softmax", ["sm"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    m = model(nodes, [tensor("q", [2, 3, 5, 4]), tensor("k", [2, 1, 4, 7]), tensor("v", [2, 3, 7, 4]),
                      tensor("mask", list(mask_shape))], [tensor("y", None)], [init("d", np.array(2.0, np.float32))],
              opset=17)
    s = _session(m)
    k_ = _kernels(s)
    assert k_["qk"] == ("FusedMatMul", "onednn.FusedMatMul.batched_matmul")
    assert k_["pv"] == ("MatMul", "onednn.MatMul.batched_matmul")
    sc = q @ k / 2 + mask
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    feeds = {"q": q, "k": k, "v": v, "mask": mask}
    for _ in range(2):
        np.testing.assert_allclose(s.run(None, feeds)[0], p @ v, rtol=1e-4, atol=1e-5)


@onednn
@pytest.mark.parametrize("axis, shape, bias", [(-1, (2, 7, 16), True), (1, (3, 4, 5), True), (-1, (6, 32), False)])
def test_layer_norm_on_onednn_equals_the_cpu_kernel(axis, shape, bias):
    x = RNG.standard_normal(shape).astype(np.float32) * 3 + 1
    a = axis % len(shape)
    scale = RNG.standard_normal(shape[a:]).astype(np.float32)
    b = RNG.standard_normal(shape[a:]).astype(np.float32)
    node = helper.make_node("LayerNormalization", ["x", "s"] + (["b"] if bias else []), ["y"], name="ln", axis=axis,
                            epsilon=1e-5)
    m = model([node], [tensor("x", list(shape))], [tensor("y", None)],
              [init("s", scale)] + ([init("b", b)] if bias else []), opset=17)
    fast, cpu = _session(m), _session(m, ["cpu"])
    assert _kernels(fast)["ln"][1] == "onednn.LayerNormalization.layer_norm"
    np.testing.assert_allclose(fast.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


@onednn
def test_layer_norm_with_its_statistics_outputs_runs_on_cpu():
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], name="ln")
    m = model([node], [tensor("x", [2, 8])], [tensor("y", None), tensor("mean", None)],
              [init("s", np.ones(8, np.float32))], opset=17)
    row = {n["name"]: n for n in _session(m).explain()["nodes"]}["ln"]
    assert row["provider"] == "cpu" and "Mean" in str(row)


@onednn
@pytest.mark.parametrize("op, opset, axis, provider", [
    ("Softmax", 13, -1, "onednn"), ("Softmax", 11, 1, "onednn"), ("LogSoftmax", 13, -1, "onednn"),
    ("LogSoftmax", 11, 2, "onednn"),  # (before opset 13 the dims from the axis on are one row: innermost)
    # an axis with dims after it: oneDNN 3.2 has only ref:any for it (14.8 ms for YOLOv8's DFL
    # softmax over axis 1 of (1, 16, 4, 2100)), so it runs on cpu and explain says why
    ("Softmax", 13, 1, "cpu"), ("LogSoftmax", 13, 2, "cpu")])
def test_softmax_on_onednn_equals_the_cpu_kernel(op, opset, axis, provider):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32) * 4
    m = model([helper.make_node(op, ["x"], ["y"], name="sm", axis=axis)], [tensor("x", [2, 3, 4, 5])],
              [tensor("y", None)], opset=opset)
    fast, cpu = _session(m), _session(m, ["cpu"])
    assert _kernels(fast)["sm"][1].startswith(provider + ".")
    if provider == "cpu":
        row = {n["name"]: n for n in fast.explain()["nodes"]}["sm"]
        assert "is not the innermost: oneDNN has only its reference implementation" in row["reason"]
    np.testing.assert_allclose(fast.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_small_bert_fuses_every_projection_and_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    m = bert(layers=2, hidden=64, heads=4, intermediate=128, vocab=100, max_positions=64)
    feeds = bert_feeds(2, 16, 100)
    s = _session(m)
    fused = [c for p in s.explain()["passes"] if p["name"] == "fuse_matmul" for c in p["changes"]]
    # per layer: Q, K, V, scores (scale + mask), output (+ residual), FFN in (+ Gelu), FFN out; the pooler's Gemm + Tanh
    assert len(fused) == 2 * 7 + 1 and fused[-1] == "fuse Tanh '/pooler/activation/Tanh' into Gemm '/pooler/dense/Gemm'"
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, r in zip(s.run(None, feeds), want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@onednn
def test_plans_of_one_session_share_the_packed_weights():
    """Each plan binds its own kernels (here batch 1 and batch 4); weights reordered for
    oneDNN (a conv's blocked layout) are made once and shared, and go with the session."""
    import gc

    from glassrt.kernels.onednn import kernels as onednn_kernels

    w = RNG.standard_normal((32, 16, 3, 3)).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "W"], ["y"], name="conv", pads=[1, 1, 1, 1])],
              [tensor("x", ["batch", 16, 8, 8])], [tensor("y", None)], [init("W", w)], opset=17)
    gc.collect()
    before = len(onednn_kernels._PACKED)
    s = _session(m)
    x = RNG.standard_normal((4, 16, 8, 8)).astype(np.float32)
    one = s.run(None, {"x": x[:1]})[0]
    after_one = len(onednn_kernels._PACKED)
    assert after_one == before + 1
    four = s.run(None, {"x": x})[0]
    assert len(onednn_kernels._PACKED) == after_one
    np.testing.assert_allclose(four[:1], one, rtol=1e-5, atol=1e-5)
    del s
    gc.collect()
    assert len(onednn_kernels._PACKED) == before
