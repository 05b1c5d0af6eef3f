"""onnxruntime's contrib ops (glassrt/contrib/microsoft.py) against onnxruntime itself.

Every case builds a one-node model, runs it in onnxruntime's CPU provider and in glassrt
with native kernels only (providers=["cpu"], fallback="error"), and compares every output.
Where onnxruntime's CPU provider has no kernel for a dtype (float16 Attention, FusedMatMul...)
the oracle is onnxruntime on the same values in float32; BiasAdd (CUDA only there) is
checked against its formula.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.tools import check as checks

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
F16, F32, F64 = np.float16, np.float32, np.float64


# ---------------------------------------------------------------- harness


def _model(op, inputs, outputs, domain=MS, opset=17, out_types=None, **attrs):
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, outputs, domain=domain, name="node", **attrs)
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))
           for n, x in zip(names, inputs) if n]
    outs = [helper.make_tensor_value_info(o, out_types[o], None) if out_types and o in out_types
            else onnx.ValueInfoProto(name=o) for o in outputs if o]
    model = helper.make_model(helper.make_graph([node], "g", vis, outs),
                              opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model, {n: x for n, x in zip(names, inputs) if n}


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _glassrt(model, feeds):
    return glassrt.InferenceSession(model, providers=["cpu"], fallback="error").run(None, feeds)


def _tol(dt):
    return {np.dtype(F16): (2e-3, 2e-3), np.dtype(F32): (1e-5, 1e-5), np.dtype(F64): (1e-10, 1e-10)}[np.dtype(dt)]


def _assert_close(got, ref, dt, what, rtol=None, atol=None):
    r, a = _tol(dt)
    rtol, atol = rtol or r, atol or a
    assert got.shape == ref.shape, f"{what}: shape {got.shape} vs onnxruntime {ref.shape}"
    g, e = got.astype(np.float64), ref.astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
    err = np.abs(g - e)
    ok = err <= atol * scale + rtol * np.abs(e)
    assert ok.all(), f"{what}: max error {err.max():.3g} at {np.unravel_index(np.argmax(err), err.shape)}"


def compare(op, inputs, outputs=("y",), *, domain=MS, ort_dtype=None, rtol=None, atol=None, out_types=None,
            **attrs):
    """Run op in onnxruntime and glassrt; compare every output.
    ort_dtype: run onnxruntime on the float inputs cast to it (its CPU provider lacks the dtype)."""
    model, feeds = _model(op, inputs, list(outputs), domain=domain, out_types=out_types, **attrs)
    got = _glassrt(model, feeds)
    if ort_dtype is not None:
        cast = [x.astype(ort_dtype) if x is not None and x.dtype.kind == "f" else x for x in inputs]
        ref_model, ref_feeds = _model(op, cast, list(outputs), domain=domain, **attrs)
        ref = _ort(ref_model, ref_feeds)
    else:
        ref = _ort(model, feeds)
    names = [o for o in outputs if o]
    assert len(got) == len(names)
    for name, g, r in zip(names, got, ref):
        if ort_dtype is None:
            assert g.dtype == r.dtype, f"{op} {name}: dtype {g.dtype} vs onnxruntime {r.dtype}"
        if g.dtype.kind in "iu":
            np.testing.assert_array_equal(g, r, err_msg=f"{op} {name}")
        else:
            _assert_close(g, r, g.dtype, f"{op} {name}", rtol, atol)
    return got


def rand(*shape, dtype=F32, seed=None, scale=1.0):
    rng = np.random.default_rng(seed if seed is not None else abs(hash(shape)) % 2**32)
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ---------------------------------------------------------------- FusedMatMul


@pytest.mark.parametrize("sa, sb, attrs", [
    ((3, 4), (4, 5), {}),
    ((2, 3, 4), (2, 4, 5), {"alpha": 0.5}),
    ((2, 1, 3, 4), (5, 4, 6), {}),  # broadcast batch
    ((4, 3), (4, 5), {"transA": 1, "alpha": 2.0}),
    ((2, 3, 4), (2, 5, 4), {"transB": 1}),
    ((2, 4, 3), (2, 5, 4), {"transA": 1, "transB": 1, "alpha": -1.5}),
    ((2, 3, 4, 5), (3, 4, 5, 6), {"transBatchA": 1}),
    ((5, 3, 4, 2), (3, 4, 5, 6), {"transBatchA": 1, "transA": 1}),
    ((3, 4, 5, 6), (6, 3, 4, 7), {"transBatchB": 1}),
    ((3, 4, 5, 6), (7, 3, 4, 6), {"transBatchB": 1, "transB": 1, "alpha": 0.25}),
    ((4,), (3, 4, 5), {}),
    ((3, 4, 5), (5,), {}),
])
@pytest.mark.parametrize("dt", [F32, F64])
def test_fused_matmul(sa, sb, attrs, dt):
    compare("FusedMatMul", [rand(*sa, dtype=dt), rand(*sb, dtype=dt)], **attrs)


def test_fused_matmul_float16():
    compare("FusedMatMul", [rand(2, 3, 8, dtype=F16), rand(2, 5, 8, dtype=F16)], ort_dtype=F32, transB=1, alpha=0.5)


# ---------------------------------------------------------------- the GELU family


@pytest.mark.parametrize("dt", [F32, F16])
def test_gelu(dt):
    compare("Gelu", [rand(2, 5, 16, dtype=dt, scale=3)])


@pytest.mark.parametrize("dt", [F32, F16, F64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_gelu(dt, with_bias):
    inputs = [rand(2, 5, 16, dtype=dt, scale=3)] + ([rand(16, dtype=dt)] if with_bias else [])
    # onnxruntime runs float64 through its function body, to about float32 accuracy.
    tol = 1e-6 if dt == F64 else None
    compare("FastGelu", inputs, rtol=tol, atol=tol)


@pytest.mark.parametrize("dt", [F32, F16])
def test_bias_gelu(dt):
    compare("BiasGelu", [rand(3, 4, 16, dtype=dt, scale=3), rand(16, dtype=dt)], ort_dtype=F32 if dt == F16 else None)


@pytest.mark.parametrize("dt", [F32, F16, F64])
@pytest.mark.parametrize("alpha", [None, 1.0, 0.5])
def test_quick_gelu(dt, alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    compare("QuickGelu", [rand(2, 7, 8, dtype=dt, scale=4)], **attrs)


def test_gelu_float64_matches_the_formula():
    # onnxruntime has no float64 Erf kernel (Gelu's function body) nor float64 BiasGelu.
    import math

    x, b = rand(3, 9, dtype=F64, scale=3), rand(9, dtype=F64)
    exact = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))
    model, feeds = _model("Gelu", [x], ["y"])
    np.testing.assert_allclose(_glassrt(model, feeds)[0], exact(x), rtol=1e-13, atol=1e-15)
    model, feeds = _model("BiasGelu", [x, b], ["y"])
    np.testing.assert_allclose(_glassrt(model, feeds)[0], exact(x + b), rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------- BiasAdd (CUDA-only in onnxruntime)


@pytest.mark.parametrize("dt", [F32, F16])
def test_bias_add(dt):
    x, bias, skip = rand(2, 6, 8, dtype=dt), rand(8, dtype=dt), rand(2, 6, 8, dtype=dt)
    model, feeds = _model("BiasAdd", [x, bias, skip], ["y"])
    (y,) = _glassrt(model, feeds)
    assert y.dtype == dt
    want = (x.astype(F32) + bias.astype(F32) + skip.astype(F32)).astype(dt)
    np.testing.assert_allclose(y.astype(F32), want.astype(F32), rtol=1e-3 if dt == F16 else 1e-6)


# ---------------------------------------------------------------- Skip(Simplified)LayerNormalization


SKIP_SHAPES = [((2, 5, 16), (2, 5, 16)), ((2, 5, 16), (1, 5, 16)), ((2, 5, 16), (5, 16)), ((6, 16), (6, 16))]
OUTS4 = ("y", "mean", "inv_std_var", "sum")


@pytest.mark.parametrize("shapes", SKIP_SHAPES)
@pytest.mark.parametrize("beta, bias", [(False, False), (True, False), (True, True), (False, True)])
def test_skip_layer_norm(shapes, beta, bias):
    sx, ss = shapes
    h = sx[-1]
    inputs = [rand(*sx, seed=1), rand(*ss, seed=2), rand(h, seed=3), rand(h, seed=4) if beta else None,
              rand(h, seed=5) if bias else None]
    compare("SkipLayerNormalization", inputs, OUTS4, epsilon=1e-5)


@pytest.mark.parametrize("dt", [F16])
def test_skip_layer_norm_dtypes(dt):
    inputs = [rand(2, 4, 32, dtype=dt, seed=1), rand(2, 4, 32, dtype=dt, seed=2), rand(32, dtype=dt, seed=3),
              rand(32, dtype=dt, seed=4), rand(32, dtype=dt, seed=5)]
    compare("SkipLayerNormalization", inputs, OUTS4)


def test_skip_layer_norm_only_some_outputs():
    inputs = [rand(2, 3, 8, seed=1), rand(2, 3, 8, seed=2), rand(8, seed=3)]
    compare("SkipLayerNormalization", inputs, ("y", "", "", "sum"))
    compare("SkipLayerNormalization", inputs, ("y",))


@pytest.mark.parametrize("shapes", SKIP_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dt", [F32, F16])
def test_skip_simplified_layer_norm(shapes, bias, dt):
    sx, ss = shapes
    h = sx[-1]
    inputs = [rand(*sx, seed=1, dtype=dt), rand(*ss, seed=2, dtype=dt), rand(h, seed=3, dtype=dt),
              rand(h, seed=5, dtype=dt) if bias else None]
    got = compare("SkipSimplifiedLayerNormalization", inputs, OUTS4, epsilon=1e-6)
    assert not got[1].any()  # an RMSNorm has no mean: zeros, as onnxruntime writes them


# ---------------------------------------------------------------- SimplifiedLayerNormalization (domain "")


@pytest.mark.parametrize("axis", [-1, -2, 1])
@pytest.mark.parametrize("xdt, sdt", [(F32, F32), (F16, F16), (F64, F64), (F16, F32)])
def test_simplified_layer_norm(axis, xdt, sdt):
    x = rand(2, 3, 4, 8, dtype=xdt, seed=1)
    scale = rand(*x.shape[axis:], dtype=sdt, seed=2)
    compare("SimplifiedLayerNormalization", [x, scale], ("y", "inv_std_var"), domain="", axis=axis, epsilon=1e-5)


def test_simplified_layer_norm_default_attributes():
    compare("SimplifiedLayerNormalization", [rand(3, 16, seed=1), rand(16, seed=2)], ("y", "inv"), domain="")


# ---------------------------------------------------------------- Attention


B, S, HIN, N, DH = 2, 4, 12, 3, 4
H = N * DH


def _attention_inputs(dt=F32, qkv=(H, H, H)):
    return [rand(B, S, HIN, seed=1, dtype=dt), rand(HIN, sum(qkv), seed=2, dtype=dt, scale=0.5),
            rand(sum(qkv), seed=3, dtype=dt)]


ATTENTION_MASKS = {
    "raw_2d": np.array([[1, 1, 0, 1], [1, 1, 1, 0]], np.int32),
    "end_positions": np.array([3, 2], np.int32),
    "end_and_start": np.array([3, 4, 1, 2], np.int32),
    "3b_plus_2": np.array([3, 2, 0, 0, 0, 0, 0, 0], np.int32),
    "raw_3d": (np.random.default_rng(7).random((B, S, S)) > 0.4).astype(np.int32),
    "all_masked_row": np.array([[0, 0, 0, 0], [1, 1, 1, 1]], np.int32),
}


@pytest.mark.parametrize("mask", [None, *ATTENTION_MASKS])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks(mask, unidirectional):
    inputs = _attention_inputs() + [ATTENTION_MASKS.get(mask)]
    compare("Attention", inputs, num_heads=N, unidirectional=unidirectional)


@pytest.mark.parametrize("attrs", [{"scale": 0.3}, {"mask_filter_value": -3.0}, {"unidirectional": 1, "scale": 0.1}])
def test_attention_attributes(attrs):
    compare("Attention", _attention_inputs() + [ATTENTION_MASKS["raw_2d"]], num_heads=N, **attrs)


def test_attention_without_bias_and_with_attention_bias():
    x, w, _ = _attention_inputs()
    compare("Attention", [x, w], num_heads=N)
    for shape in [(1, N, S, S), (B, 1, S, S), (B, N, S, S)]:
        compare("Attention", [x, w, None, None, None, rand(*shape, seed=9)], num_heads=N)


def test_attention_qkv_hidden_sizes():
    compare("Attention", _attention_inputs(qkv=(H, H, 2 * N)), num_heads=N, qkv_hidden_sizes=[H, H, 2 * N])


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_past_and_present(unidirectional, with_mask):
    past = rand(2, B, N, 3, DH, seed=11)
    mask = np.ones((B, 3 + S), np.int32)
    mask[0, :2] = 0
    inputs = _attention_inputs() + [mask if with_mask else None, past]
    compare("Attention", inputs, ("y", "present"), num_heads=N, unidirectional=unidirectional)
    compare("Attention", _attention_inputs(), ("y", "present"), num_heads=N)  # present without past


def test_attention_float16():
    compare("Attention", _attention_inputs(F16) + [ATTENTION_MASKS["raw_2d"]], ("y", "present"), ort_dtype=F32,
            num_heads=N, unidirectional=1)


def test_attention_unsupported_is_refused_at_session_creation():
    model, _ = _model("Attention", _attention_inputs(), ["y"], num_heads=N, do_rotary=1)
    with pytest.raises(glassrt.GlassrtError, match="do_rotary"):
        glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    model, _ = _model("Attention", _attention_inputs(), ["y"])
    with pytest.raises(glassrt.GlassrtError, match="num_heads"):
        glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    model, _ = _model("Attention", _attention_inputs() + [np.ones((B, 1, 8, 8), np.int32)], ["y"], num_heads=N)
    with pytest.raises(glassrt.GlassrtError, match="4-D mask"):
        glassrt.InferenceSession(model, providers=["cpu"], fallback="error")


# ---------------------------------------------------------------- MultiHeadAttention


L = 5
MHA_OUTS = ("y", "present_key", "present_value")


def _qkv(dt=F32, kv_len=L, seed=0):
    return (rand(B, S, H, seed=seed + 1, dtype=dt), rand(B, kv_len, H, seed=seed + 2, dtype=dt),
            rand(B, kv_len, H, seed=seed + 3, dtype=dt))


KEY_PADDING = {
    "lengths": np.array([3, 5], np.int32),
    "3b_plus_2": np.array([3, 5, 0, 0, 0, 0, 0, 0], np.int32),
    "raw_2d": np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]], np.int32),
    "raw_3d": (np.random.default_rng(3).random((B, S, L)) > 0.4).astype(np.int32),
}


@pytest.mark.parametrize("mask", [None, *KEY_PADDING])
@pytest.mark.parametrize("with_bias", [False, True])
def test_mha_cross_attention(mask, with_bias):
    q, k, v = _qkv()
    compare("MultiHeadAttention", [q, k, v, rand(3 * H, seed=5) if with_bias else None, KEY_PADDING.get(mask)],
            num_heads=N)


@pytest.mark.parametrize("attrs", [{"scale": 0.2}, {"mask_filter_value": -2.0}, {"unidirectional": 1}])
def test_mha_attributes(attrs):
    q, k, v = _qkv()
    compare("MultiHeadAttention", [q, k, v, None, KEY_PADDING["raw_2d"]], num_heads=N, **attrs)


def test_mha_unidirectional_cross_attention_matches_onnxruntime_quirk():
    # More keys than queries: onnxruntime leaves its last query row unmasked.
    q, k, v = _qkv(kv_len=6)
    compare("MultiHeadAttention", [q, k, v], num_heads=N, unidirectional=1)
    q, _, _ = _qkv()
    compare("MultiHeadAttention", [q, q, q], num_heads=N, unidirectional=1)


@pytest.mark.parametrize("shape", [(1, N, S, L), (B, 1, S, L), (1, 1, S, L), (B, N, S, L)])
def test_mha_attention_bias(shape):
    q, k, v = _qkv()
    compare("MultiHeadAttention", [q, k, v, None, None, rand(*shape, seed=8)], num_heads=N)


@pytest.mark.parametrize("mask", [None, "raw_2d", "lengths"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_mha_past_and_present(mask, unidirectional):
    p = 3
    q, k, v = _qkv(kv_len=S)
    masks = {"raw_2d": np.array([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 1, 1]], np.int32),
             "lengths": np.array([5, 7], np.int32)}
    inputs = [q, k, v, rand(3 * H, seed=4), masks.get(mask), None, rand(B, N, p, DH, seed=6), rand(B, N, p, DH, seed=7)]
    compare("MultiHeadAttention", inputs, MHA_OUTS, num_heads=N, unidirectional=unidirectional)


@pytest.mark.parametrize("with_bias", [False, True])
def test_mha_keys_already_in_heads(with_bias):
    q = rand(B, S, H, seed=1)
    k, v = rand(B, N, L, DH, seed=2), rand(B, N, L, DH, seed=3)
    compare("MultiHeadAttention", [q, k, v, rand(3 * H, seed=4) if with_bias else None], MHA_OUTS, num_heads=N)


def test_mha_qk_output():
    q, k, v = _qkv()
    f = TensorProto.FLOAT
    compare("MultiHeadAttention", [q, k, v, None, KEY_PADDING["raw_2d"], rand(1, 1, S, L, seed=2)],
            ("y", "pk", "pv", "qk"), out_types={"y": f, "pk": f, "pv": f, "qk": f}, num_heads=N, atol=1e-8)


def test_mha_float16():
    q, k, v = _qkv(F16)
    compare("MultiHeadAttention", [q, k, v, rand(3 * H, seed=4, dtype=F16), KEY_PADDING["raw_2d"]], MHA_OUTS,
            num_heads=N)


def test_mha_packed_layouts_match_separate_inputs():
    # onnxruntime's CPU kernel refuses packed QKV / KV; glassrt unpacks them, so the oracle is
    # onnxruntime on the same values passed separately.
    q, k, v = _qkv(kv_len=S)
    qkv = np.stack([t.reshape(B, S, N, DH) for t in (q, k, v)], axis=3)
    model, feeds = _model("MultiHeadAttention", [qkv], ["y"], num_heads=N)
    ref_model, ref_feeds = _model("MultiHeadAttention", [q, k, v], ["y"], num_heads=N)
    _assert_close(_glassrt(model, feeds)[0], _ort(ref_model, ref_feeds)[0], F32, "packed QKV")
    kv = np.stack([t.reshape(B, S, N, DH) for t in (k, v)], axis=3)
    model, feeds = _model("MultiHeadAttention", [q, kv], ["y"], num_heads=N)
    _assert_close(_glassrt(model, feeds)[0], _ort(ref_model, ref_feeds)[0], F32, "packed KV")


# ---------------------------------------------------------------- RotaryEmbedding


ROPE_MAX = 16


def _rope_inputs(x, dt, half, positions):
    b, s = (x.shape[0], x.shape[2]) if x.ndim == 4 else x.shape[:2]
    pos = {"ids": np.random.default_rng(1).integers(0, ROPE_MAX - s, (b, s)).astype(np.int64),
           "start": np.array([2], np.int64), "scalar": np.array(1, np.int64)}[positions]
    return [x, pos, rand(ROPE_MAX, half, seed=2, dtype=dt), rand(ROPE_MAX, half, seed=3, dtype=dt)]


@pytest.mark.parametrize("positions", ["ids", "start", "scalar"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout, attrs", [("3d", {}), ("3d", {"num_heads": 2}), ("4d", {}),
                                           ("3d_partial", {"num_heads": 2, "rotary_embedding_dim": 4}),
                                           ("4d_partial", {"num_heads": 2, "rotary_embedding_dim": 4})])
@pytest.mark.parametrize("dt", [F32, F16])
def test_rotary_embedding(positions, interleaved, layout, attrs, dt):
    x = rand(2, 3, 16, dtype=dt, seed=0) if layout.startswith("3d") else rand(2, 2, 3, 8, dtype=dt, seed=0)
    half = 2 if "partial" in layout else 4
    compare("RotaryEmbedding", _rope_inputs(x, dt, half, positions), interleaved=interleaved, **attrs)


# ---------------------------------------------------------------- MatMulNBits


def _quantize(n, k, bits, block, zp_mode, rng, dt=F32):
    """Random packed weights in MatMulNBits' layout, built independently of the kernel."""
    kb = -(-k // block)
    q = rng.integers(0, 2 ** bits, (n, kb * block)).astype(np.uint8)
    bitplanes = ((q[..., None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(n, kb, block * bits)
    packed = np.packbits(bitplanes, axis=-1, bitorder="little")
    scales = (rng.random((n, kb)) * 0.1 + 0.01).astype(dt)
    if zp_mode == "none":
        return packed, scales, None
    if zp_mode == "float":
        return packed, scales, (rng.random((n, kb)) * 2 ** bits).astype(dt)
    zq = rng.integers(0, 2 ** bits, (n, kb)).astype(np.uint8)
    zbits = ((zq[..., None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(n, kb * bits)
    zbits = np.concatenate([zbits, np.zeros((n, -zbits.shape[1] % 8), np.uint8)], axis=1)
    return packed, scales, np.packbits(zbits, axis=-1, bitorder="little")


@pytest.mark.parametrize("bits, block", [(4, 16), (4, 32), (4, 128), (2, 16), (2, 64), (8, 32)])
@pytest.mark.parametrize("zp_mode", ["none", "packed", "float"])
@pytest.mark.parametrize("k", [64, 72])
def test_matmul_nbits(bits, block, zp_mode, k):
    if bits == 8 and zp_mode == "float":
        pytest.skip("onnxruntime's CPU kernel refuses float zero points with 8 bits")
    rng = np.random.default_rng(bits * 1000 + block + k)
    n = 6
    packed, scales, zp = _quantize(n, k, bits, block, zp_mode, rng)
    a = rng.standard_normal((2, 3, k)).astype(F32)
    compare("MatMulNBits", [a, packed, scales, zp], K=k, N=n, bits=bits, block_size=block, rtol=1e-4, atol=1e-4)


def test_matmul_nbits_bias_flat_scales_and_vector_input():
    rng = np.random.default_rng(0)
    k, n, block = 64, 10, 32
    packed, scales, zp = _quantize(n, k, 4, block, "packed", rng)
    a, bias = rng.standard_normal((5, k)).astype(F32), rng.standard_normal(n).astype(F32)
    attrs = dict(K=k, N=n, bits=4, block_size=block, rtol=1e-4, atol=1e-4)
    compare("MatMulNBits", [a, packed, scales, zp, None, bias], **attrs)
    compare("MatMulNBits", [a, packed, scales.reshape(-1), zp.reshape(-1)], **attrs)
    compare("MatMulNBits", [a[0], packed, scales, zp], **attrs)
    compare("MatMulNBits", [a, packed, scales, zp], accuracy_level=4, **attrs)


@pytest.mark.parametrize("zp_mode", ["none", "packed", "float"])
def test_matmul_nbits_float16(zp_mode):
    rng = np.random.default_rng(1)
    k, n, block = 64, 8, 32
    packed, scales, zp = _quantize(n, k, 4, block, zp_mode, rng, dt=F16)
    a = rng.standard_normal((3, k)).astype(F16)
    compare("MatMulNBits", [a, packed, scales, zp], K=k, N=n, bits=4, block_size=block, rtol=5e-3, atol=5e-3)


def test_matmul_nbits_g_idx_without_zero_points():
    rng = np.random.default_rng(2)
    k, n, block = 64, 6, 32
    packed, scales, _ = _quantize(n, k, 4, block, "none", rng)
    g_idx = rng.integers(0, k // block, k).astype(np.int32)
    a = rng.standard_normal((3, k)).astype(F32)
    compare("MatMulNBits", [a, packed, scales, None, g_idx], K=k, N=n, bits=4, block_size=block, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- EmbedLayerNormalization


def _embed_inputs(dt=F32, segments=True, mask=True, position_ids=None):
    rng = np.random.default_rng(0)
    b, s, hidden, vocab = 2, 5, 16, 30
    ids = rng.integers(0, vocab, (b, s)).astype(np.int32)
    seg = rng.integers(0, 2, (b, s)).astype(np.int32)
    m = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 2]], np.int32)
    pos = {None: None, "shared": np.array([[4, 3, 2, 1, 0]], np.int32),
           "per_batch": rng.integers(0, 12, (b, s)).astype(np.int32)}[position_ids]
    return [ids, seg if segments else None, rand(vocab, hidden, seed=1, dtype=dt), rand(12, hidden, seed=2, dtype=dt),
            rand(2, hidden, seed=3, dtype=dt) if segments else None, rand(hidden, seed=4, dtype=dt),
            rand(hidden, seed=5, dtype=dt), m if mask else None, pos]


@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("position_ids", [None, "shared", "per_batch"])
def test_embed_layer_norm(segments, mask, position_ids):
    compare("EmbedLayerNormalization", _embed_inputs(F32, segments, mask, position_ids), ("y", "mask_index", "sum"),
            epsilon=1e-5)


def test_embed_layer_norm_float16():
    compare("EmbedLayerNormalization", _embed_inputs(F16), ("y", "mask_index", "sum"))


def test_embed_layer_norm_rejects_out_of_range_ids():
    inputs = _embed_inputs()
    inputs[0][0, 0] = 99
    model, feeds = _model("EmbedLayerNormalization", inputs, ["y", "mask_index"])
    with pytest.raises(glassrt.GlassrtError, match="out of range"):
        _glassrt(model, feeds)


# ---------------------------------------------------------------- graph-level behaviour


def test_symbolic_dims_are_kept():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "x", "g"], ["h", "", "", "s"], domain=MS, name="ln"),
             helper.make_node("FastGelu", ["h", "b"], ["y"], domain=MS, name="gelu")]
    inits = [onnx.numpy_helper.from_array(np.ones(16, F32), n) for n in ("g", "b")]
    g = helper.make_graph(nodes, "g", [x], [onnx.ValueInfoProto(name="y"), onnx.ValueInfoProto(name="s")],
                          initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    assert [o.shape for o in sess.get_outputs()] == [["batch", "seq", 16]] * 2
    report = sess.explain({"batch": 3, "seq": 7})
    assert [r["kernel"] for r in report["nodes"]] == ["cpu.com.microsoft::SkipLayerNormalization",
                                                      "cpu.com.microsoft::FastGelu"]
    y, s = sess.run(None, {"x": rand(3, 7, 16)})
    assert y.shape == s.shape == (3, 7, 16)


def _graph_model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "g", inputs, [onnx.ValueInfoProto(name=o) for o in outputs],
                          initializer=[onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model


def _run_both(model, feeds, dims):
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    shapes = [o.shape for o in sess.get_outputs()]
    got, ref = sess.run(None, feeds), _ort(model, feeds)
    for o, g, r in zip(sess.get_outputs(), got, ref):
        assert g.dtype == r.dtype
        _assert_close(g, r, F32, o.name, rtol=1e-4, atol=1e-4)
    assert [list(g.shape) for g in got] == [[dims.get(d, d) for d in s] for s in shapes]
    return shapes


def test_bert_block_as_onnxruntime_optimizes_it():
    """EmbedLayerNormalization -> Attention (its mask_index) -> SkipLayerNormalization ->
    MatMulNBits -> FastGelu -> FusedMatMul -> SkipSimplifiedLayerNormalization, symbolic dims."""
    rng = np.random.default_rng(0)
    hidden, heads, vocab, ff, block = 32, 4, 50, 64, 16
    packed, scales, zp = _quantize(ff, hidden, 4, block, "packed", rng)
    inits = {"word": rand(vocab, hidden, seed=1), "pos": rand(16, hidden, seed=2), "seg": rand(2, hidden, seed=3),
             "g0": rand(hidden, seed=4), "b0": rand(hidden, seed=5),
             "w_qkv": rand(hidden, 3 * hidden, seed=6, scale=0.2),
             "b_qkv": rand(3 * hidden, seed=7), "g1": rand(hidden, seed=8), "b1": rand(hidden, seed=9),
             "w1": packed, "s1": scales, "z1": zp, "fb": rand(ff, seed=10), "w2": rand(hidden, ff, seed=11, scale=0.2),
             "g2": rand(hidden, seed=12)}
    node = lambda op, ins, outs, **a: helper.make_node(op, ins, outs, domain=MS, name=outs[0] or op, **a)
    nodes = [node("EmbedLayerNormalization", ["ids", "segs", "word", "pos", "seg", "g0", "b0", "mask"], ["emb", "mi"]),
             node("Attention", ["emb", "w_qkv", "b_qkv", "mi"], ["att"], num_heads=heads),
             node("SkipLayerNormalization", ["att", "emb", "g1", "b1"], ["ln1"]),
             node("MatMulNBits", ["ln1", "w1", "s1", "z1"], ["ff1"], K=hidden, N=ff, bits=4, block_size=block),
             node("FastGelu", ["ff1", "fb"], ["act"]),
             node("FusedMatMul", ["act", "w2"], ["ff2"], transB=1, alpha=0.5),
             node("SkipSimplifiedLayerNormalization", ["ff2", "ln1", "g2"], ["out", "", "", "res"])]
    ints = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", "seq"]) for n in ("ids", "segs", "mask")]
    model = _graph_model(nodes, ints, ["out", "res", "mi"], inits)
    b, s = 3, 6
    mask = np.ones((b, s), np.int32)
    mask[1, 4:] = 0
    feeds = {"ids": rng.integers(0, vocab, (b, s)).astype(np.int32),
             "segs": rng.integers(0, 2, (b, s)).astype(np.int32), "mask": mask}
    shapes = _run_both(model, feeds, {"batch": b, "seq": s})
    assert shapes == [["batch", "seq", hidden], ["batch", "seq", hidden], ["batch"]]


def test_llama_block_with_kv_cache_as_onnxruntime_optimizes_it():
    """SimplifiedLayerNormalization -> MatMulNBits Q/K/V -> RotaryEmbedding -> MultiHeadAttention
    with a K/V cache, causal; symbolic batch, seq and past length."""
    rng = np.random.default_rng(1)
    hidden, heads, block = 64, 4, 32
    dh = hidden // heads
    inits = {"ln": rand(hidden, seed=1), "cos": rand(32, dh // 2, seed=2), "sin": rand(32, dh // 2, seed=3)}
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "ln"], ["h"], name="ln", epsilon=1e-6)]
    for name in "qkv":
        packed, scales, zp = _quantize(hidden, hidden, 4, block, "none", rng)
        inits.update({f"w{name}": packed, f"s{name}": scales})
        nodes.append(helper.make_node("MatMulNBits", ["h", f"w{name}", f"s{name}"], [name], domain=MS, name=f"mm{name}",
                                      K=hidden, N=hidden, bits=4, block_size=block))
    for name in "qk":
        nodes.append(helper.make_node("RotaryEmbedding", [name, "pos", "cos", "sin"], [f"{name}r"], domain=MS,
                                      name=f"rope{name}", num_heads=heads))
    nodes.append(helper.make_node("MultiHeadAttention", ["qr", "kr", "v", "", "", "", "pk", "pv"], ["y", "ck", "cv"],
                                  domain=MS, name="mha", num_heads=heads, unidirectional=1))
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("x", f, ["batch", "seq", hidden]),
              helper.make_tensor_value_info("pos", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("pk", f, ["batch", heads, "past", dh]),
              helper.make_tensor_value_info("pv", f, ["batch", heads, "past", dh])]
    model = _graph_model(nodes, inputs, ["y", "ck", "cv"], inits)
    b, s, p = 2, 3, 5
    feeds = {"x": rand(b, s, hidden, seed=4), "pos": np.tile(np.arange(p, p + s), (b, 1)).astype(np.int64),
             "pk": rand(b, heads, p, dh, seed=5), "pv": rand(b, heads, p, dh, seed=6)}
    shapes = _run_both(model, feeds, {"batch": b, "seq": s, "past": p, "past + seq": p + s})
    assert shapes[0] == ["batch", "seq", hidden]
    assert shapes[1][2] in ("past + seq", "seq + past")


DECOMPOSED = {
    "FusedMatMul": lambda: ([rand(2, 4, 3), rand(2, 5, 4)], ("y",), {"transA": 1, "transB": 1, "alpha": 0.5}),
    "Gelu": lambda: ([rand(2, 3, 8)], ("y",), {}),
    "FastGelu": lambda: ([rand(2, 3, 8), rand(8)], ("y",), {}),
    "BiasGelu": lambda: ([rand(2, 3, 8), rand(8)], ("y",), {}),
    "QuickGelu": lambda: ([rand(2, 3, 8)], ("y",), {"alpha": 1.3}),
    "SkipLayerNormalization": lambda: ([rand(2, 3, 8), rand(3, 8), rand(8), rand(8), rand(8)], OUTS4, {}),
    "SkipSimplifiedLayerNormalization": lambda: ([rand(2, 3, 8), rand(2, 3, 8), rand(8), rand(8)], OUTS4, {}),
    "EmbedLayerNormalization": lambda: (_embed_inputs(), ("y", "mask_index", "sum"), {}),
}


@pytest.fixture
def without_kernel():
    """Remove an op's cpu kernel for the test (its decomposition then runs), and restore it."""
    from glassrt.kernels import registry

    saved = {}

    def remove(op):
        saved[op] = list(registry.kernels_for("cpu", MS, op))
        registry.unregister("cpu", MS, op)

    yield remove
    for op, ks in saved.items():
        registry.unregister("cpu", MS, op)
        for k in ks:
            registry.register(k)


@pytest.mark.parametrize("op", sorted(DECOMPOSED))
def test_decomposition_runs_in_a_session(op, without_kernel):
    inputs, outputs, attrs = DECOMPOSED[op]()
    without_kernel(op)
    model, feeds = _model(op, inputs, list(outputs), **attrs)
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    assert sess.explain()["summary"]["expansions"][0]["op"] == op
    ref = _ort(model, feeds)
    for name, g, r in zip(outputs, sess.run(None, feeds), ref):
        if g.dtype.kind in "iu":
            np.testing.assert_array_equal(g, r)
        else:
            _assert_close(g, r, F32, f"{op} {name} (decomposed)", rtol=1e-4, atol=1e-5)


def test_fused_matmul_batch_transpose_has_no_decomposition(without_kernel):
    without_kernel("FusedMatMul")
    model, _ = _model("FusedMatMul", [rand(2, 3, 4, 5), rand(3, 4, 5, 6)], ["y"], transBatchA=1)
    with pytest.raises(glassrt.UnsupportedOperatorError):
        glassrt.InferenceSession(model, providers=["cpu"], fallback="error")


# ---------------------------------------------------------------- glassrt check


@pytest.mark.parametrize("op", sorted(DECOMPOSED) + ["BiasAdd", "RotaryEmbedding", "SimplifiedLayerNormalization"])
def test_glassrt_check_passes(op):
    rows = checks.run_checks(op, builtins=False)
    assert rows, f"glassrt check lists no rows for {op}"
    failed = [(r.check, r.message) for r in rows if r.status == "fail"]
    assert not failed, failed
    if op in DECOMPOSED or op == "BiasAdd":
        assert any(r.check == "decomposition" and r.status == "pass" for r in rows)


def test_matmul_nbits_with_constant_weights_dequantizes_once():
    """Weights as initializers (the usual case): the kernel dequantizes them when the plan is
    built; the result still matches onnxruntime, and runs reuse it."""
    from onnx import numpy_helper

    rng = np.random.default_rng(5)
    k, n, block = 64, 8, 32
    packed, scales, zp = _quantize(n, k, 4, block, "packed", rng)
    node = helper.make_node("MatMulNBits", ["a", "b", "s", "zp"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                          [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(scales, "s"),
                           numpy_helper.from_array(zp, "zp")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    a = rng.standard_normal((3, k)).astype(F32)
    expected = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    import glassrt.contrib.microsoft as ms

    calls = []
    original = ms._nbits_weight
    ms._nbits_weight = lambda *args: calls.append(1) or original(*args)
    try:
        sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
        for _ in range(3):
            np.testing.assert_allclose(sess.run(None, {"a": a})[0], expected, rtol=1e-4, atol=1e-4)
    finally:
        ms._nbits_weight = original
    assert len(calls) == 1
