"""The general Conv kernels (Winograd F(4x4, 3x3), compiled 2-D im2col, 1x1 GEMM, N-d
im2col), Conv and FusedConv, against onnxruntime (float32) or a float64 direct conv written
here (float64, float16: onnxruntime's CPU Conv takes float32 only), on random inputs over a
spread of shapes, checking that the intended kernel is the one selected.

Tolerances, as max |glassrt - reference| / max |reference|:
  * im2col and 1x1 (the same products as a direct conv, summed in another order):
    1e-5 in float32, 1e-12 in float64;
  * Winograd: its transforms multiply by up to 8 (and the weights' by 1/6, 1/24) before
    and after the GEMM, so rounding errors grow by about the transforms' norms: measured
    1e-6..5e-6 in float32 (im2col: 1e-7..4e-7), 2e-15..1.3e-14 in float64; bounded here by
    5e-5 and 1e-12 (a relative error of 1e-3 in the transformed weights shows as 8e-4);
  * float16 (computed in float32, then rounded): 2e-3 (one float16 rounding is 5e-4).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt

ort = pytest.importorskip("onnxruntime")

ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16}
TOL = {"winograd": {np.float32: 5e-5, np.float64: 1e-12, np.float16: 2e-3},
       "other": {np.float32: 1e-5, np.float64: 1e-12, np.float16: 2e-3}}
ACTIVATIONS = {"Relu": lambda y: np.maximum(y, 0), "LeakyRelu": lambda y: np.where(y >= 0, y, float(np.float32(0.1)) * y),  # attributes are float32
               "Clip": lambda y: np.clip(y, -0.5, 0.75)}


def _model(x_shape, w, b, attrs, dtype, act=None, weights_as_input=False, z_shape=None):
    """x -> Conv(x, w, b) [-> Add(z)] [-> act]: with the fusion pass, Conv [+ z] + act
    becomes FusedConv."""
    elem = ONNX_TYPE[dtype]
    inputs = [helper.make_tensor_value_info("x", elem, list(x_shape))]
    if z_shape is not None:
        inputs.append(helper.make_tensor_value_info("z", elem, list(z_shape)))
    inits = []
    if weights_as_input:
        inputs.append(helper.make_tensor_value_info("w", elem, list(w.shape)))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    names = ["x", "w"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "b"))
        names.append("b")
    nodes = [helper.make_node("Conv", names, ["c" if act or z_shape is not None else "y"], name="conv", **attrs)]
    if z_shape is not None:
        pre = "r"
        nodes.append(helper.make_node("Add", ["z", "c"], ["r" if act else "y"], name="residual"))
    else:
        pre = "c"
    if act == "LeakyRelu":
        nodes.append(helper.make_node(act, [pre], ["y"], name="act", alpha=0.1))
    elif act == "Clip":
        inits += [numpy_helper.from_array(np.array(-0.5, dtype), "lo"),
                  numpy_helper.from_array(np.array(0.75, dtype), "hi")]
        nodes.append(helper.make_node(act, [pre, "lo", "hi"], ["y"], name="act"))
    elif act:
        nodes.append(helper.make_node(act, [pre], ["y"], name="act"))
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", elem, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9).SerializeToString()


def _direct_conv(x, w, b, attrs):
    """Reference N-d conv in float64: one multiply-add per kernel tap over strided views."""
    import itertools

    from glassrt.kernels.cpu._util import spatial_pads

    x, w = x.astype(np.float64), w.astype(np.float64)
    nd = x.ndim - 2
    begin, end, out, strides, dil = spatial_pads(list(x.shape[2:]), list(w.shape[2:]), attrs.get("strides"),
                                                 attrs.get("dilations"), attrs.get("pads"),
                                                 attrs.get("auto_pad", "NOTSET"))
    xp = np.pad(x, [(0, 0), (0, 0)] + [(bb, e) for bb, e in zip(begin, end)])
    g = int(attrs.get("group", 1))
    n, m, cg = x.shape[0], w.shape[0], w.shape[1]
    y = np.zeros((n, m) + tuple(out))
    for gi in range(g):
        ms, cs = slice(gi * (m // g), (gi + 1) * (m // g)), slice(gi * cg, (gi + 1) * cg)
        for tap in itertools.product(*[range(k) for k in w.shape[2:]]):
            idx = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, dil, out, strides))
            view = xp[(slice(None), cs) + idx]  # (n, cg, *out)
            y[:, ms] += np.einsum("nc...,mc->nm...", view, w[(ms, slice(None)) + tap])
    if b is not None:
        y += b.astype(np.float64).reshape((1, -1) + (1,) * nd)
    return y


def _run(x_shape, w_shape, attrs, dtype, kernel, act=None, bias=True, weights_as_input=False, seed=0,
         residual=False):
    rng = np.random.default_rng(seed)
    fan_in = int(np.prod(w_shape[1:]))
    x = rng.standard_normal(x_shape).astype(dtype)
    w = (rng.standard_normal(w_shape) / np.sqrt(fan_in)).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype) if bias else None
    conv = _direct_conv(x, w, b, attrs)
    z = rng.standard_normal(conv.shape).astype(dtype) if residual else None
    model = _model(x_shape, w, b, attrs, dtype, act, weights_as_input, None if z is None else z.shape)
    feeds = {"x": x, "w": w} if weights_as_input else {"x": x}
    if residual:
        feeds["z"] = z
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error",
                                    sess_options=glassrt.SessionOptions(intra_op_num_threads=2))
    got = sess.run(None, feeds)[0]
    chosen = sess.explain()["nodes"][0]["kernel"]
    op = "FusedConv" if act or residual else "Conv"
    assert chosen == f"cpu.{op}.{kernel}", f"expected cpu.{op}.{kernel}, got {chosen}"
    if dtype == np.float32:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        ref = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0].astype(np.float64)
    else:
        ref = conv if z is None else conv + z
        if act:
            ref = ACTIVATIONS[act](ref)
    assert got.shape == ref.shape and got.dtype == dtype
    err = np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max()
    tol = TOL["winograd" if kernel == "winograd" else "other"][dtype]
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"
    return err


# (id, x shape, w shape, Conv attributes, the kernel that should run)
CASES = [
    # Winograd: 3x3, stride 1, dilation 1, group 1, enough tiles for its channels
    ("wino_resnet_56", (1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, "winograd"),
    ("wino_vgg_224", (1, 16, 224, 224), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "winograd"),
    ("wino_odd", (2, 8, 13, 11), (12, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "winograd"),
    ("wino_asym_pads", (1, 9, 15, 17), (5, 9, 3, 3), {"pads": [0, 2, 1, 0]}, "winograd"),
    ("wino_no_pads", (3, 8, 10, 9), (4, 8, 3, 3), {}, "winograd"),
    ("wino_big_pads", (2, 10, 9, 6), (7, 10, 3, 3), {"pads": [2, 3, 2, 1]}, "winograd"),
    ("wino_same_lower", (3, 10, 7, 6), (16, 10, 3, 3), {"auto_pad": "SAME_LOWER"}, "winograd"),
    ("wino_batch", (5, 32, 14, 14), (48, 32, 3, 3), {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}, "winograd"),
    ("wino_chunks", (2, 128, 30, 30), (96, 128, 3, 3), {"pads": [1, 1, 1, 1]}, "winograd"),  # several chunks
    # compiled 2-D im2col: everything else in 2-D
    ("im2col_stride2", (2, 16, 15, 14), (24, 16, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "im2col2d"),
    ("im2col_7x7s2", (1, 3, 37, 40), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, "im2col2d"),
    ("im2col_1x1s2", (2, 32, 13, 14), (40, 32, 1, 1), {"strides": [2, 2]}, "im2col2d"),
    ("im2col_1x1_padded", (1, 8, 6, 7), (4, 8, 1, 1), {"pads": [1, 0, 2, 1]}, "im2col2d"),
    ("im2col_3ch", (2, 3, 20, 21), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "im2col2d"),
    ("im2col_few_tiles", (1, 256, 7, 7), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]}, "im2col2d"),
    ("im2col_dilated", (1, 8, 17, 16), (6, 8, 3, 3), {"dilations": [2, 3], "pads": [2, 3, 2, 3]}, "im2col2d"),
    ("im2col_groups", (2, 6, 15, 14), (9, 2, 3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [2, 1],
                                                      "group": 3}, "im2col2d"),
    ("im2col_group2_3x3", (1, 16, 12, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}, "im2col2d"),
    ("im2col_5x3_stride12", (3, 5, 11, 19), (7, 5, 5, 3), {"strides": [1, 2], "pads": [0, 1, 2, 0]}, "im2col2d"),
    ("im2col_stride3_tail", (1, 4, 10, 10), (3, 4, 2, 2), {"strides": [3, 3], "pads": [0, 0, 1, 1]}, "im2col2d"),
    ("im2col_kernel_past_pad", (1, 2, 3, 3), (2, 2, 3, 3), {"pads": [3, 3, 3, 3]}, "im2col2d"),
    # 1x1, stride 1, no pads: one GEMM
    ("gemm_1x1", (2, 16, 9, 7), (24, 16, 1, 1), {}, "gemm_1x1"),
    ("gemm_1x1_1d", (3, 6, 11), (5, 6, 1), {}, "gemm_1x1"),
    # N-d im2col (the general fallback)
    ("im2col_1d", (2, 4, 19), (6, 4, 5), {"strides": [2], "pads": [2, 1]}, "im2col_gemm"),
    ("im2col_3d", (1, 3, 5, 6, 7), (4, 3, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}, "im2col_gemm"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_kernel(case, dtype):
    _, x_shape, w_shape, attrs, kernel = case
    _run(x_shape, w_shape, attrs, dtype, kernel)


FUSED = [c for c in CASES if c[0] in ("wino_odd", "wino_resnet_56", "im2col_stride2", "im2col_groups", "gemm_1x1")]


@pytest.mark.parametrize("case", FUSED, ids=[c[0] for c in FUSED])
@pytest.mark.parametrize("act", ["Relu", "LeakyRelu", "Clip"])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_conv_kernel(case, act, bias):
    """FusedConv: Relu and Clip applied by the kernel's own output pass, LeakyRelu after it."""
    _, x_shape, w_shape, attrs, kernel = case
    _run(x_shape, w_shape, attrs, np.float32, kernel, act=act, bias=bias)


RESIDUAL = FUSED + [c for c in CASES if c[0] in ("gemm_1x1_1d", "im2col_3d", "im2col_1x1s2")]


@pytest.mark.parametrize("case", RESIDUAL, ids=[c[0] for c in RESIDUAL])
@pytest.mark.parametrize("act", [None, "Relu", "LeakyRelu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_fused_conv_with_residual(case, act, dtype):
    """Conv + Add(z) [+ act] (ResNet's blocks): one FusedConv adding z in the kernel (1x1)
    or after it, then the activation (Relu fused with it, LeakyRelu a node of its own)."""
    _, x_shape, w_shape, attrs, kernel = case
    _run(x_shape, w_shape, attrs, dtype, kernel, act=act, residual=True)


@pytest.mark.parametrize("kernel,x_shape,w_shape,attrs", [
    ("winograd", (2, 8, 13, 11), (12, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("im2col2d", (2, 16, 15, 14), (24, 16, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
])
def test_weights_known_only_at_run_time(kernel, x_shape, w_shape, attrs):
    _run(x_shape, w_shape, attrs, np.float32, kernel, weights_as_input=True, bias=False)


@pytest.mark.parametrize("kernel,x_shape,w_shape,attrs", [
    ("winograd", (1, 16, 18, 18), (8, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("im2col2d", (1, 4, 11, 12), (6, 4, 3, 3), {"strides": [2, 2]}),
])
def test_float16(kernel, x_shape, w_shape, attrs):
    _run(x_shape, w_shape, attrs, np.float16, kernel)


def test_replayed_runs_allocate_little():
    """The kernels run from the planned workspace: a replay allocates about nothing."""
    import tracemalloc

    rng = np.random.default_rng(0)
    model = _model((1, 32, 28, 28), (rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32),
                   rng.standard_normal(32).astype(np.float32), {"pads": [1, 1, 1, 1]}, np.float32, "Relu")
    sess = glassrt.InferenceSession(model, providers=["cpu"])
    x = {"x": rng.standard_normal((1, 32, 28, 28)).astype(np.float32)}
    sess.run(None, x)
    assert sess.explain()["nodes"][0]["kernel"] == "cpu.FusedConv.winograd"
    tracemalloc.start()
    try:
        out = sess.run(None, x)[0]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 2 * out.nbytes + (64 << 10), peak


@pytest.mark.parametrize("z_shape", [[1, 4, 6, 6], ["n", 4, "h", "w"]], ids=["static", "dynamic"])
def test_residual_of_the_wrong_shape_is_refused(z_shape):
    """A glassrt::FusedConv written by hand with a Z that is not the conv's output shape:
    the kernels never broadcast Z (nor read past it). Static shapes fail when the session
    is made, dynamic ones when it runs; the conv's output here is (1, 4, 5, 5)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    node = helper.make_node("FusedConv", ["x", "w", "", "z"], ["y"], name="fc", domain="glassrt", activation="Relu")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 7]),
                                        helper.make_tensor_value_info("z", TensorProto.FLOAT, z_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("glassrt", 1)],
                              ir_version=9)
    x = rng.standard_normal((1, 3, 7, 7)).astype(np.float32)
    with pytest.raises(glassrt.ShapeInferenceError, match="FusedConv node 'fc'.*residual input Z"):
        sess = glassrt.InferenceSession(model.SerializeToString(), providers=["cpu"])
        assert isinstance(z_shape[0], str), "a static Z of the wrong shape must fail at load"
        sess.run(None, {"x": x, "z": np.zeros((1, 4, 6, 6), np.float32)})
