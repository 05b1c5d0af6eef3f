"""A replayed run allocates (almost) nothing: every kernel writes into the plan's arena.

A plan is compiled for the first run's shapes; later runs replay its steps into the same
arena. What a replay still allocates is each graph output (handed to the caller) and the
scratch of the odd kernel; the bound below is two copies of the outputs plus 1 MiB. A kernel
that allocated its result per run instead of writing the planned buffer (LRN, LayerNorm,
Cast, a custom op without out=True...) would add a whole intermediate tensor to the peak:
the models below keep their intermediates far above a megabyte for that reason.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import glassrt
from glassrt.tools import light_models

MS = "com.microsoft"
SLACK = 1 << 20


def _replay_peak(sess, feeds):
    """(bytes allocated at the peak of a third run, bytes of its outputs)."""
    sess.run(None, feeds)
    sess.run(None, feeds)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        outs = sess.run(None, feeds)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, sum(o.nbytes for o in outs)


def _assert_replay_within_bound(sess, feeds):
    peak, out_bytes = _replay_peak(sess, feeds)
    limit = 2 * out_bytes + SLACK
    assert peak <= limit, f"a replayed run allocated {peak:,} bytes, over {limit:,} (outputs: {out_bytes:,} bytes)"


@pytest.mark.parametrize("name", light_models.NAMES)
def test_light_model_replay_allocates_no_intermediates(name):
    model = light_models.randomize_weights(onnx.load(light_models.path(name)), seed=0)
    x, shape = light_models.input_shape(model)
    feeds = {x: np.random.default_rng(0).random(shape, dtype=np.float32)}
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    _assert_replay_within_bound(sess, feeds)


# ---------------------------------------------------------------- onnxruntime's contrib ops

B, S, H, HEADS, FF = 1, 64, 256, 4, 4096  # FF-wide float32 activations are 1 MiB each


def _contrib_model():
    """A transformer block and a quantized tail written with com.microsoft ops, each
    intermediate between a quarter and two megabytes; the outputs are a few hundred bytes."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def f32(*shape, scale=0.05):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def node(op, inputs, outputs, domain=MS, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, domain=domain, name=outputs[0] or op, **attrs))
        return outputs[0]

    # Embeddings, LayerNorms, attention, rotary embedding.
    word, pos = const("word", f32(100, H, scale=1)), const("pos", f32(S, H, scale=1))
    gamma, beta, bias_h = const("gamma", f32(H, scale=1) + 1), const("beta", f32(H)), const("bias_h", f32(H))
    node("EmbedLayerNormalization", ["ids", "", word, pos, "", gamma, beta, "mask"], ["emb", "lengths"])
    node("SkipLayerNormalization", ["emb", "emb", gamma, beta, bias_h], ["sln", "", "", "skip_sum"])
    node("Attention", ["sln", const("w_qkv", f32(H, 3 * H)), const("b_qkv", f32(3 * H)), "lengths"], ["att"],
         num_heads=HEADS)
    node("RotaryEmbedding", ["att", const("pos0", np.array([0], np.int64)), const("cos", f32(S, H // HEADS // 2)),
                             const("sin", f32(S, H // HEADS // 2))], ["rot"], num_heads=HEADS)
    node("SkipSimplifiedLayerNormalization", ["rot", "skip_sum", gamma], ["ssl"])
    # The feed-forward part: every GELU flavour on FF-wide activations.
    b_ff = const("b_ff", f32(FF))
    node("FusedMatMul", ["ssl", const("w1", f32(H, FF))], ["ff"], alpha=0.5)
    node("BiasGelu", ["ff", b_ff], ["g1"])
    node("FastGelu", ["g1", b_ff], ["g2"])
    node("QuickGelu", ["g2"], ["g3"])
    node("Gelu", ["g3"], ["g4"])
    node("BiasAdd", ["g4", b_ff, "ff"], ["g5"])
    node("FusedMatMul", ["g5", const("w2", f32(FF, H, scale=0.01))], ["down"])
    packed = rng.integers(0, 256, (H, H // 32, 16), dtype=np.uint8)
    node("MatMulNBits", ["down", const("w_nbits", packed), const("s_nbits", f32(H * (H // 32), scale=0.01))],
         ["nbits"], K=H, N=H, block_size=32, bits=4)
    node("SimplifiedLayerNormalization", ["nbits", gamma], ["rms"], domain="")
    node("DynamicQuantizeMatMul", ["rms", const("w_q8", rng.integers(-64, 64, (H, H), dtype=np.int8)),
                                   const("s_q8", f32(H, scale=0.01) + 0.02), "", bias_h], ["dqmm"])
    # The quantized ops on the FF-wide activations (256 KiB of uint8 each).
    s, z = const("s", np.float32(0.02)), const("z", np.uint8(128))
    node("DynamicQuantizeLinear", ["ff"], ["q", "q_s", "q_z"], domain="")
    node("QLinearAdd", ["q", "q_s", "q_z", "q", "q_s", "q_z", s, z], ["q_add"])
    node("QLinearSigmoid", ["q_add", s, z, const("s_sig", np.float32(1 / 256)), const("z0", np.uint8(0))], ["q_sig"])
    node("QLinearLeakyRelu", ["q_sig", "s_sig", "z0", s, z], ["q_lrelu"], alpha=0.1)
    node("QLinearMul", ["q_lrelu", s, z, "q_add", s, z, s, z], ["q_mul"])
    node("Greater", ["ff", const("zero", np.float32(0))], ["positive"], domain="")
    node("QLinearWhere", ["positive", "q_mul", s, z, "q_lrelu", s, z, s, z], ["q_where"])
    node("QLinearConcat", [s, z, "q_mul", s, z, "q_where", s, z], ["q_cat"], axis=-1)
    node("QLinearSoftmax", ["q_cat", s, z, "s_sig", "z0"], ["q_soft"], opset=13, axis=-1)
    node("Reshape", ["q_soft", const("image", np.array([1, S, 64, 2 * FF // 64], np.int64))], ["q_img"], domain="")
    node("QLinearAveragePool", ["q_img", "s_sig", "z0", "s_sig", "z0"], ["q_pool"], kernel_shape=[2, 2], strides=[2, 2])
    node("QLinearGlobalAveragePool", ["q_pool", "s_sig", "z0", "s_sig", "z0"], ["q_gap"])
    node("Reshape", ["q_soft", const("rows", np.array([S, 2 * FF], np.int64))], ["q_rows"], domain="")
    node("QGemm", ["q_rows", "s_sig", "z0", const("w_gemm", rng.integers(-64, 64, (2 * FF, 32), dtype=np.int8)),
                   const("s_gemm", np.float32(0.01)), const("z_gemm", np.int8(0)), "", s, z], ["q_gemm"])
    node("MatMulIntegerToFloat", ["q_gemm", const("w_mitf", rng.integers(-64, 64, (32, 16), dtype=np.int8)), s,
                                  const("s_mitf", np.float32(0.01)), z], ["mitf"])
    # Small outputs: the bound is then about the allocations of the run itself.
    node("ReduceMean", ["dqmm"], ["out_dense"], domain="", keepdims=0)
    node("ReduceMean", ["mitf"], ["out_mitf"], domain="", keepdims=0)
    node("DequantizeLinear", ["q_gap", "s_sig", "z0"], ["out_pool"], domain="")

    graph = helper.make_graph(
        nodes, "contrib_block",
        [helper.make_tensor_value_info("ids", T.INT32, [B, S]), helper.make_tensor_value_info("mask", T.INT32, [B, S])],
        [helper.make_tensor_value_info(o, T.FLOAT, None) for o in ("out_dense", "out_mitf", "out_pool")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    feeds = {"ids": rng.integers(0, 100, (B, S)).astype(np.int32), "mask": np.ones((B, S), np.int32)}
    return model, feeds


def test_contrib_ops_replay_allocates_no_intermediates():
    model, feeds = _contrib_model()
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    # Discriminating: one intermediate allocated per run would break the bound by itself.
    assert max(v["bytes"] for v in sess.explain()["values"]) >= SLACK
    assert all(np.isfinite(o).all() for o in sess.run(None, feeds))
    _assert_replay_within_bound(sess, feeds)
