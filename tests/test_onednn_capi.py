"""The oneDNN 3.2 ctypes binding (glassrt.kernels.onednn) against NumPy references, float32.

Skipped, with the reason, when libdnnl cannot be loaded (pip install onednn-cpu-gomp).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from glassrt.kernels.onednn import capi

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=str(capi.UNAVAILABLE))

from glassrt.kernels.onednn import dnnl as D

F32 = np.float32
RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype(F32)


def close(a, b, tol=1e-4):
    b = np.asarray(b, np.float64)
    scale = max(1.0, float(np.abs(b).max()))
    assert a.shape == b.shape, (a.shape, b.shape)
    err = float(np.abs(a.astype(np.float64) - b).max()) / scale
    assert err < tol, err


# --------------------------------------------------------------------------- references


def ref_conv(x, w, b=None, group=1, strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0)):
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - ((kh - 1) * dilations[0] + 1)) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - ((kw - 1) * dilations[1] + 1)) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dilations[0], j * dilations[1]
                patch = xp[:, g * cg:(g + 1) * cg, r0:r0 + strides[0] * (oh - 1) + 1:strides[0],
                           c0:c0 + strides[1] * (ow - 1) + 1:strides[1]]
                y[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", patch, w[g * mg:(g + 1) * mg, :, i, j])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def ref_pool(x, k, s, pads, mode):
    n, c, h, w = x.shape
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])),
                constant_values=fill)
    ones = np.pad(np.ones((h, w)), ((pads[0], pads[2]), (pads[1], pads[3])))
    oh, ow = (h + pads[0] + pads[2] - k[0]) // s[0] + 1, (w + pads[1] + pads[3] - k[1]) // s[1] + 1
    y = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
            if mode == "max":
                y[:, :, i, j] = win.max(axis=(2, 3))
            elif mode == "avg_include_padding":
                y[:, :, i, j] = win.mean(axis=(2, 3))
            else:
                cnt = ones[i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].sum()
                y[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return y


def run_conv(x, w, b=None, *, group=1, strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), fmt="plain",
             post_ops=None, dst_init=None, binary=None):
    """Conv through oneDNN with pre-packed weights; plain NumPy in and out."""
    pd = D.conv(x.shape, w.shape, group=group, strides=strides, dilations=dilations, pads=pads,
                bias=b is not None, src_format=fmt, post_ops=post_ops)
    user_w = D.md(D.grouped_weights_shape(w.shape, group), F32, "goihw" if group > 1 else "oihw")
    args = {D.ARG_WEIGHTS: D.prepack(w, user_w, pd.weights_md()), D.ARG_SRC: D.from_numpy(x, pd.src_md())}
    if b is not None:
        args[D.ARG_BIAS] = b
    dst = D.from_numpy(dst_init, pd.dst_md()) if dst_init is not None else D.Memory(pd.dst_md())
    args[D.ARG_DST] = dst
    if binary is not None:
        args[pd.attr.post_ops.binary_arg()] = binary
    pd.primitive().execute(args)
    return D.to_numpy(dst), pd


# --------------------------------------------------------------------------- library, enums, errors


def test_library_and_enums():
    info = capi.info()
    assert info["available"] and info["version"].startswith("3.")
    assert capi.version >= (3, 2, 0)
    assert capi._check_names(capi.lib) == []  # every enum value used agrees with the library's names
    assert capi.lib.dnnl_fmt_tag2str(capi.format_tag("nChw8c")) == b"aBcd8b"
    assert capi.lib.dnnl_fmt_tag2str(capi.format_tag("goihw")) == b"abcde"
    assert ctypes_sizes() == (16, 96)
    assert "libgomp" in (capi.openmp_path() or "")


def ctypes_sizes():
    import ctypes

    return ctypes.sizeof(capi.ExecArg), ctypes.sizeof(capi.Dims)


def test_error_names_call_and_status():
    src, w, dst = D.md((1, 4, 8, 8), F32, "nchw"), D.md((8, 5, 3, 3), F32, "any"), D.md((1, 8, 6, 6), F32, "nchw")
    with pytest.raises(capi.DnnlError) as e:
        D.convolution(src, w, dst, strides=[1, 1], padding_l=[0, 0], padding_r=[0, 0])
    assert e.value.call == "dnnl_convolution_forward_primitive_desc_create"
    assert e.value.status_name == "invalid_arguments" and "invalid_arguments" in str(e.value)


def test_unavailable_reason_without_raising():
    code = "import glassrt.kernels.onednn.capi as m\nprint(m.UNAVAILABLE); print(m.lib)\n"
    env = dict(os.environ, GLASSRT_ONEDNN="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "GLASSRT_ONEDNN=0" in out.stdout and "None" in out.stdout
    env = dict(os.environ, GLASSRT_ONEDNN_LIBRARY="/nonexistent/libdnnl.so.3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("None")  # the wheel is still found after it


def test_threads_roundtrip():
    n = capi.get_max_threads()
    try:
        capi.set_num_threads(1)
        assert capi.get_max_threads() == 1
    finally:
        capi.set_num_threads(n)


# --------------------------------------------------------------------------- memory


def test_memory_descs():
    m = D.md((2, 3, 5, 5), F32, "nchw")
    assert m.dims == (2, 3, 5, 5) and m.dtype == F32 and m.format == "abcd" and m.size == 2 * 3 * 25 * 4
    assert m.is_plain and m.strides == (75, 25, 5, 1)
    assert D.md((2, 3, 5, 5), F32, "nhwc").format == "acdb"
    b = D.md((2, 3, 5, 5), F32, "nChw8c")
    assert b.format == "aBcd8b" and b.inner_blocks == [(8, 1)] and b.padded_dims == (2, 8, 5, 5)
    assert b.size == 2 * 8 * 25 * 4 and not b.is_plain  # channels padded to the block
    assert D.md((4, 4), F32, "any").format == "any"
    a = np.zeros((3, 4), F32).T
    t = D.MemoryDesc.from_array(a)
    assert t.dims == (4, 3) and t.strides == (1, 4) and t.format == "ba"
    assert t == D.md((4, 3), F32, "ba") and t != D.md((4, 3), F32, "ab")
    assert D.md((2, 12), F32, "ab").reshape((2, 3, 4)).format == "abc"


def test_memory_over_numpy_without_copy():
    x, y = rand(64), np.empty(64, F32)
    pd = D.eltwise(D.MemoryDesc.from_array(x), None, "relu")
    step = pd.primitive().bind({D.ARG_SRC: x, D.ARG_DST: y})
    assert step[D.ARG_SRC].data_ptr == x.ctypes.data and step[D.ARG_DST].array is y
    step.run()
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    x2, y2 = rand(64), np.empty(64, F32)  # same step, new buffers (set_data_handle)
    step.run({D.ARG_SRC: x2, D.ARG_DST: y2})
    np.testing.assert_array_equal(y2, np.maximum(x2, 0))
    with pytest.raises(ValueError):
        step.run({D.ARG_DST: np.empty(8, F32)})  # too small


def test_step_runs_in_another_thread():
    x, w = rand(1, 8, 9, 9), rand(8, 8, 3, 3)
    pd = D.conv(x.shape, w.shape, pads=[1] * 4, bias=False, src_format="any")
    wm = D.prepack(w, D.md(w.shape, F32, "oihw"), pd.weights_md())
    src, dst = D.from_numpy(x, pd.src_md()), D.Memory(pd.dst_md())
    step = pd.primitive().bind({D.ARG_SRC: src, D.ARG_WEIGHTS: wm, D.ARG_DST: dst})
    errors = []

    def work():
        try:
            step.run()
        except Exception as e:  # pragma: no cover
            errors.append(e)

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert not errors
    close(D.to_numpy(dst), ref_conv(x, w, pads=(1, 1, 1, 1)))


# --------------------------------------------------------------------------- convolution

CONVS = {
    "3x3": dict(x=(1, 8, 10, 10), w=(16, 8, 3, 3), pads=(1, 1, 1, 1)),
    "grouped": dict(x=(2, 8, 9, 9), w=(12, 4, 3, 3), group=2, pads=(1, 1, 1, 1)),
    "depthwise": dict(x=(1, 16, 12, 12), w=(16, 1, 3, 3), group=16, pads=(1, 1, 1, 1)),
    "depthwise_s2": dict(x=(1, 24, 13, 13), w=(24, 1, 5, 5), group=24, strides=(2, 2), pads=(2, 2, 2, 2)),
    "strided": dict(x=(1, 8, 15, 15), w=(16, 8, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    "dilated": dict(x=(1, 8, 14, 14), w=(8, 8, 3, 3), dilations=(2, 2), pads=(2, 2, 2, 2)),
    "asymmetric": dict(x=(1, 8, 11, 10), w=(16, 8, 3, 3), pads=(0, 1, 2, 1)),
    "1x1": dict(x=(1, 32, 7, 7), w=(64, 32, 1, 1)),
    "1x1_s2": dict(x=(1, 32, 8, 8), w=(64, 32, 1, 1), strides=(2, 2)),
    "7x7_s2_rgb": dict(x=(1, 3, 32, 32), w=(16, 3, 7, 7), strides=(2, 2), pads=(3, 3, 3, 3)),
    "rect_kernel": dict(x=(1, 8, 9, 12), w=(8, 8, 1, 5), pads=(0, 2, 0, 2)),
}


@pytest.mark.parametrize("fmt", ["plain", "any", "nChw8c"])
@pytest.mark.parametrize("case", list(CONVS))
def test_conv(case, fmt):
    c = dict(CONVS[case])
    x, w, b = rand(*c.pop("x")), rand(*c.pop("w")), None
    w /= np.sqrt(w[0].size)
    if case != "dilated":
        b = rand(w.shape[0])
    y, pd = run_conv(x, w, b, fmt=fmt, **c)
    close(y, ref_conv(x, w, b, **c))
    if fmt == "nChw8c":
        assert pd.src_md().format == "aBcd8b" and pd.dst_md().format == "aBcd8b"
    assert pd.impl and pd.weights_md().size >= w.nbytes


@pytest.mark.parametrize("fmt", ["plain", "any"])
@pytest.mark.parametrize("post", [("relu",), ("leaky_relu", 0.1), ("clip", 0.0, 6.0), ("sigmoid",), ("tanh",)])
def test_conv_eltwise_post_ops(post, fmt):
    x, w, b = rand(1, 8, 8, 8), rand(16, 8, 3, 3) / 8, rand(16)
    y, _ = run_conv(x, w, b, pads=(1, 1, 1, 1), fmt=fmt, post_ops=[post])
    r = ref_conv(x, w, b, pads=(1, 1, 1, 1))
    ref = {"relu": lambda v: np.maximum(v, 0), "leaky_relu": lambda v: np.where(v > 0, v, 0.1 * v),
           "clip": lambda v: np.clip(v, 0, 6), "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh}[post[0]]
    close(y, ref(r))


@pytest.mark.parametrize("fmt", ["plain", "any"])
def test_conv_sum_post_op_is_a_residual_add(fmt):
    x, w, b, res = rand(1, 16, 7, 7), rand(16, 16, 1, 1) / 4, rand(16), rand(1, 16, 7, 7)
    y, pd = run_conv(x, w, b, fmt=fmt, post_ops=["sum", "relu"], dst_init=res)
    close(y, np.maximum(ref_conv(x, w, b) + res, 0))


def test_conv_binary_add_post_op():
    x, w, other = rand(1, 8, 6, 6), rand(8, 8, 3, 3) / 8, rand(1, 8, 6, 6)
    po = D.PostOps().binary("add", D.MemoryDesc.from_array(other)).eltwise("relu")
    y, pd = run_conv(x, w, pads=(1, 1, 1, 1), post_ops=po, binary=other)
    close(y, np.maximum(ref_conv(x, w, pads=(1, 1, 1, 1)) + other, 0))


def test_conv_bound_step_points_at_new_buffers():
    w = rand(8, 4, 3, 3) / 6
    pd = D.conv((1, 4, 6, 6), w.shape, pads=[1] * 4, bias=False, src_format="plain")
    wm = D.prepack(w, D.md(w.shape, F32, "oihw"), pd.weights_md())
    step = pd.primitive().bind({D.ARG_SRC: None, D.ARG_WEIGHTS: wm, D.ARG_DST: None})
    for _ in range(3):
        x, y = rand(1, 4, 6, 6), np.empty((1, 8, 6, 6), F32)
        step.run({D.ARG_SRC: x, D.ARG_DST: y})
        close(y, ref_conv(x, w, pads=(1, 1, 1, 1)))


def test_conv_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    x, w, b = rand(1, 6, 11, 11), rand(12, 3, 3, 3) / 5, rand(12)
    attrs = dict(group=2, strides=[2, 1], dilations=[1, 2], pads=[1, 0, 2, 1])
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    expect = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    y, _ = run_conv(x, w, b, group=2, strides=(2, 1), dilations=(1, 2), pads=(1, 0, 2, 1), fmt="any")
    close(y, expect)


# --------------------------------------------------------------------------- reorder


@pytest.mark.parametrize("c", [16, 3])
def test_reorder_roundtrip_nchw_nChw8c(c):
    x = rand(2, c, 5, 4)
    plain, blocked = D.md(x.shape, F32, "nchw"), D.md(x.shape, F32, "nChw8c")
    mem = D.from_numpy(x, blocked)
    cp = -(-c // 8) * 8
    manual = np.zeros((2, cp, 5, 4), F32)
    manual[:, :c] = x
    manual = manual.reshape(2, cp // 8, 8, 5, 4).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(mem.array.view(F32), manual.reshape(-1))
    back = np.empty_like(x)
    D.reorder(blocked, plain).primitive().execute({D.ARG_FROM: mem, D.ARG_TO: back})
    np.testing.assert_array_equal(back, x)
    np.testing.assert_array_equal(D.to_numpy(mem), x)


def test_reorder_to_nhwc():
    x = rand(1, 5, 3, 4)
    y = np.empty((1, 3, 4, 5), F32)
    D.reorder(D.md(x.shape, F32, "nchw"), D.md(x.shape, F32, "nhwc")).primitive().execute(
        {D.ARG_FROM: x, D.ARG_TO: y})
    np.testing.assert_array_equal(y, x.transpose(0, 2, 3, 1))


# --------------------------------------------------------------------------- matmul, inner product


@pytest.mark.parametrize("post", [None, ["relu"]])
def test_matmul_with_packed_weights(post):
    a, w, b = rand(5, 64), rand(64, 48), rand(1, 48)
    pd = D.matmul(D.MemoryDesc.from_array(a), D.md(w.shape, F32, "any"), D.md((5, 48), F32, "ab"),
                  D.MemoryDesc.from_array(b), attr=post)
    wm = D.prepack(w, None, pd.weights_md())
    y = np.empty((5, 48), F32)
    step = pd.primitive().bind({D.ARG_SRC: a, D.ARG_WEIGHTS: wm, D.ARG_BIAS: b, D.ARG_DST: y})
    step.run()
    ref = a.astype(np.float64) @ w + b
    close(y, np.maximum(ref, 0) if post else ref)
    a2 = rand(5, 64)
    step.run({D.ARG_SRC: a2})
    close(y, np.maximum(a2 @ w.astype(np.float64) + b, 0) if post else a2 @ w.astype(np.float64) + b)


@pytest.mark.parametrize("shape,trans", [((768, 1024), False), ((1000, 130), False), ((3072, 96), True),
                                         ((256, 3072), True), ((40, 4096), False)])
def test_prepack_in_slabs_writes_the_same_bytes_as_one_reorder(shape, trans):
    """A large weight packed a slab at a time (each slab's source bytes reported done, so a
    mapped weight's pages can be dropped as it goes) is byte for byte the one-reorder copy:
    row counts that split the layout's blocks, a source read transposed (Gemm's transB: its
    outermost dimension in memory is N) and a slab size larger than the weight included."""
    k, n = shape
    w = rand(n, k) if trans else rand(k, n)  # transposed: stored (N, K), read as (K, N)
    user = D.MemoryDesc.with_strides((k, n), F32, (1, k)) if trans else D.MemoryDesc.from_array(w)
    pd = D.matmul(D.md((32, k), F32, "ab"), D.md((k, n), F32, "any"), D.md((32, n), F32, "ab"))
    whole = D.prepack(w, user, pd.weights_md())
    seen = []
    sliced = D.prepack(w, user, pd.weights_md(), slab_bytes=64 << 10, done=lambda lo, hi: seen.append((lo, hi)))
    np.testing.assert_array_equal(sliced.array, whole.array)
    if seen:  # the slabs cover the source once, in order
        assert seen[0][0] == 0 and seen[-1][1] == w.nbytes
        assert all(a[1] == b[0] for a, b in zip(seen, seen[1:]))
    np.testing.assert_array_equal(D.to_numpy(sliced), w.T if trans else w)
    if k % 64 == 0 and n % 64 == 0 and pd.weights_md() != user:  # no slab splits a block: no fallback
        assert len(seen) > 2


def test_prepack_shares_the_plain_descriptor_of_weights_of_one_shape():
    """Weights given without their layout are read as their array's plain one, made once per
    shape, strides and dtype and shared (a grouped conv's 4-D weights seen as the 5-D
    descriptor it packs them into): the same packed bytes as a descriptor of their own."""
    group, w1, w2 = 2, rand(8, 3, 3, 3), rand(8, 3, 3, 3)
    pd = D.conv((1, 6, 10, 10), w1.shape, group=group, pads=[1, 1, 1, 1], src_format="acdb", dst_format="acdb")
    target = pd.weights_md()
    assert len(target.dims) == 5
    D._plain_desc.cache_clear()
    packed = [D.prepack(w, None, target) for w in (w1, w2)]
    assert D._plain_desc.cache_info().hits == 1 and D._plain_desc.cache_info().currsize == 1
    for w, p in zip((w1, w2), packed):
        own = D.prepack(w, D.MemoryDesc.from_array(w).reshape(target.dims), target)
        np.testing.assert_array_equal(p.array, own.array)
        np.testing.assert_array_equal(D.to_numpy(p).reshape(w.shape), w)


def test_matmul_batched_broadcast_weights():
    a, w = rand(3, 4, 16), rand(1, 16, 8)
    y = np.empty((3, 4, 8), F32)
    pd = D.matmul(D.MemoryDesc.from_array(a), D.MemoryDesc.from_array(w), D.MemoryDesc.from_array(y))
    pd.primitive().execute({D.ARG_SRC: a, D.ARG_WEIGHTS: w, D.ARG_DST: y})
    close(y, a.astype(np.float64) @ w)


def test_inner_product():
    x, w, b = rand(4, 32), rand(10, 32), rand(10)
    y = np.empty((4, 10), F32)
    pd = D.inner_product(D.MemoryDesc.from_array(x), D.md(w.shape, F32, "any"), D.MemoryDesc.from_array(y),
                         D.MemoryDesc.from_array(b))
    pd.primitive().execute({D.ARG_SRC: x, D.ARG_WEIGHTS: D.prepack(w, None, pd.weights_md()), D.ARG_BIAS: b,
                            D.ARG_DST: y})
    close(y, x.astype(np.float64) @ w.T + b)


# --------------------------------------------------------------------------- pooling


@pytest.mark.parametrize("fmt", ["plain", "nChw8c"])
@pytest.mark.parametrize("alg,k,s,pads", [
    ("max", (3, 3), (2, 2), (1, 1, 1, 1)),
    ("max", (2, 2), (2, 2), (0, 0, 0, 0)),
    ("avg_include_padding", (3, 3), (1, 1), (1, 1, 1, 1)),
    ("avg_exclude_padding", (3, 3), (2, 2), (1, 0, 1, 2)),
])
def test_pooling(alg, k, s, pads, fmt):
    x = rand(1, 16, 9, 9)
    pd = D.pool(x.shape, k, strides=s, pads=pads, alg=alg, src_format=fmt, dst_format="any")
    assert pd.dst_md().format == pd.src_md().format  # 'any' dst follows the source's layout
    dst = D.Memory(pd.dst_md())
    pd.primitive().execute({D.ARG_SRC: D.from_numpy(x, pd.src_md()), D.ARG_DST: dst})
    close(D.to_numpy(dst), ref_pool(x, k, s, pads, alg))


def test_pooling_ceil_mode():
    x = rand(1, 4, 8, 8)
    pd = D.pool(x.shape, (3, 3), strides=(2, 2), alg="max", ceil_mode=True)
    y = np.empty(pd.dst_md().dims, F32)
    assert y.shape == (1, 4, 4, 4)  # floor mode would give 3
    pd.primitive().execute({D.ARG_SRC: x, D.ARG_DST: y})
    close(y, ref_pool(x, (3, 3), (2, 2), (0, 0, 1, 1), "max"))


# --------------------------------------------------------------------------- eltwise, binary, concat


@pytest.mark.parametrize("name,alpha,beta,ref", [
    ("relu", None, None, lambda v: np.maximum(v, 0)),
    ("leaky_relu", 0.2, None, lambda v: np.where(v > 0, v, 0.2 * v)),
    ("clip", -1.0, 1.0, lambda v: np.clip(v, -1, 1)),
    ("sigmoid", None, None, lambda v: 1 / (1 + np.exp(-v))),
    ("tanh", None, None, np.tanh),
    ("elu", 1.0, None, lambda v: np.where(v > 0, v, np.exp(v) - 1)),
    ("hard_sigmoid", 0.2, 0.5, lambda v: np.clip(0.2 * v + 0.5, 0, 1)),
    ("hard_swish", None, None, lambda v: v * np.clip(v / 6 + 0.5, 0, 1)),
    ("softplus", None, None, lambda v: np.log1p(np.exp(v))),
    ("exp", None, None, np.exp),
    ("abs", None, None, np.abs),
])
def test_eltwise(name, alpha, beta, ref):
    x = rand(2, 3, 4, 5)
    y = np.empty_like(x)
    D.eltwise(D.MemoryDesc.from_array(x), None, name, alpha, beta).primitive().execute({D.ARG_SRC: x, D.ARG_DST: y})
    close(y, ref(x.astype(np.float64)))


@pytest.mark.parametrize("alg,op", [("add", np.add), ("mul", np.multiply), ("max", np.maximum)])
def test_binary_broadcast(alg, op):
    a, b = rand(2, 8, 5, 5), rand(1, 8, 1, 1)
    y = np.empty_like(a)
    pd = D.binary(D.MemoryDesc.from_array(a), D.MemoryDesc.from_array(b), D.MemoryDesc.from_array(y), alg)
    pd.primitive().execute({D.ARG_SRC_0: a, D.ARG_SRC_1: b, D.ARG_DST: y})
    close(y, op(a.astype(np.float64), b))


def test_concat_channels_plain_and_blocked():
    xs = [rand(1, c, 4, 4) for c in (8, 16, 8)]
    y = np.empty((1, 32, 4, 4), F32)
    pd = D.concat([D.MemoryDesc.from_array(x) for x in xs], 1, D.MemoryDesc.from_array(y))
    args = {D.ARG_MULTIPLE_SRC + i: x for i, x in enumerate(xs)}
    pd.primitive().execute({**args, D.ARG_DST: y})
    np.testing.assert_array_equal(y, np.concatenate(xs, 1))
    blocked = [D.md(x.shape, F32, "nChw8c") for x in xs]
    pd = D.concat(blocked, 1)  # dst chosen by oneDNN: blocked too
    assert pd.dst_md().format == "aBcd8b"
    dst = D.Memory(pd.dst_md())
    pd.primitive().execute({**{D.ARG_MULTIPLE_SRC + i: D.from_numpy(x, m) for i, (x, m) in
                               enumerate(zip(xs, blocked))}, D.ARG_DST: dst})
    np.testing.assert_array_equal(D.to_numpy(dst), np.concatenate(xs, 1))


def test_sum():
    a, b = rand(3, 7), rand(3, 7)
    y = np.empty_like(a)
    pd = D.sum_([D.MemoryDesc.from_array(a)] * 2, [0.5, 2.0], D.MemoryDesc.from_array(y))
    pd.primitive().execute({D.ARG_MULTIPLE_SRC: a, D.ARG_MULTIPLE_SRC + 1: b, D.ARG_DST: y})
    close(y, 0.5 * a + 2.0 * b.astype(np.float64))


def test_shuffle():
    x = rand(1, 12, 3, 3)
    y = np.empty_like(x)
    D.shuffle(D.MemoryDesc.from_array(x), None, axis=1, group_size=3).primitive().execute(
        {D.ARG_SRC: x, D.ARG_DST: y})
    # ShuffleNet's Reshape(1, g, C/g, H, W) + Transpose(0, 2, 1, 3, 4) with g = 4: group_size is C/g
    np.testing.assert_array_equal(y, x.reshape(1, 4, 3, 3, 3).transpose(0, 2, 1, 3, 4).reshape(x.shape))


# --------------------------------------------------------------------------- normalization, softmax


@pytest.mark.parametrize("fmt", ["nchw", "nChw8c"])
def test_batch_norm_inference(fmt):
    x = rand(2, 16, 5, 5)
    mean, var = rand(16), np.abs(rand(16)) + 0.5
    scale, shift = rand(16), rand(16)
    src = D.md(x.shape, F32, fmt)
    pd = D.batch_norm(src, None, 1e-5)
    dst = D.Memory(pd.dst_md())
    pd.primitive().execute({D.ARG_SRC: D.from_numpy(x, src), D.ARG_MEAN: mean, D.ARG_VARIANCE: var,
                            D.ARG_SCALE: scale, D.ARG_SHIFT: shift, D.ARG_DST: dst})
    r = lambda v: v.reshape(1, -1, 1, 1).astype(np.float64)
    close(D.to_numpy(dst), (x - r(mean)) / np.sqrt(r(var) + 1e-5) * r(scale) + r(shift))


def test_lrn_across_channels():
    x = rand(1, 10, 4, 4)
    size, alpha, beta, bias = 5, 1e-2, 0.75, 2.0
    y = np.empty_like(x)
    pd = D.lrn(D.MemoryDesc.from_array(x), None, size=size, alpha=alpha, beta=beta, k=bias)
    pd.primitive().execute({D.ARG_SRC: x, D.ARG_DST: y})
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), ((size - 1) // 2, size // 2), (0, 0), (0, 0)))
    s = sum(sq[:, i:i + 10] for i in range(size))
    close(y, x / (bias + alpha / size * s) ** beta)  # ONNX LRN


@pytest.mark.parametrize("axis,log", [(-1, False), (1, False), (-1, True)])
def test_softmax(axis, log):
    x = rand(2, 5, 7) * 3
    y = np.empty_like(x)
    D.softmax(D.MemoryDesc.from_array(x), None, axis, log=log).primitive().execute({D.ARG_SRC: x, D.ARG_DST: y})
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    ref = e / e.sum(axis=axis, keepdims=True)
    close(y, np.log(ref) if log else ref)


def test_layer_norm():
    x, g, b = rand(3, 4, 32), rand(32), rand(32)
    y = np.empty_like(x)
    pd = D.layer_norm(D.MemoryDesc.from_array(x), None, 1e-5)
    pd.primitive().execute({D.ARG_SRC: x, D.ARG_SCALE: g, D.ARG_SHIFT: b, D.ARG_DST: y})
    xd = x.astype(np.float64)
    mu, var = xd.mean(-1, keepdims=True), xd.var(-1, keepdims=True)
    close(y, (xd - mu) / np.sqrt(var + 1e-5) * g + b)


def _bind_and_run_convs(n: int):
    for _ in range(n):
        x = np.ones((1, 8, 6, 6), np.float32)
        pd = D.conv(x.shape, (4, 8, 3, 3), pads=[1, 1, 1, 1], post_ops=D.PostOps(["relu"]))
        w = D.prepack(np.ones((4, 8, 3, 3), np.float32), None, pd.weights_md())
        step = pd.primitive().bind({D.ARG_SRC: None, D.ARG_WEIGHTS: w, D.ARG_DST: None,
                                    D.ARG_BIAS: np.zeros(4, np.float32)})
        step.run({D.ARG_SRC: x, D.ARG_DST: np.empty((1, 4, 6, 6), np.float32)})
        step.run({D.ARG_SRC: x, D.ARG_DST: np.empty((1, 4, 6, 6), np.float32)})


def test_every_handle_is_destroyed_with_its_object(monkeypatch):
    """Handles go with their Python objects (_Owned.__del__): each destroyed once, none left."""
    import gc

    events = []  # ("made" | "destroyed", kind, handle) in order: addresses are reused after a free
    classes = {D.MemoryDesc: "dnnl_memory_desc_destroy", D.Memory: "dnnl_memory_destroy",
               D.PrimitiveDesc: "dnnl_primitive_desc_destroy", D.Primitive: "dnnl_primitive_destroy",
               D.Attr: "dnnl_primitive_attr_destroy", D.PostOps: "dnnl_post_ops_destroy"}
    D._plain_desc.cache_clear()  # (prepack's shared plain descriptors: kept while cached, cleared below)
    gc.collect()  # what earlier tests left dies now, not while this one records
    for cls, kind in classes.items():
        real_init, real_destroy = cls.__init__, getattr(capi.lib, kind)

        def init(self, *a, real_init=real_init, kind=kind, **k):
            real_init(self, *a, **k)
            events.append(("made", kind, self.handle.value))
        monkeypatch.setattr(cls, "__init__", init)
        monkeypatch.setattr(capi.lib, kind, lambda h, kind=kind, real=real_destroy:
                            events.append(("destroyed", kind, h.value)) or real(h))
    gc.disable()  # (the loop makes no reference cycles: everything goes by reference count)
    try:
        _bind_and_run_convs(20)
    finally:
        D._plain_desc.cache_clear()
        gc.enable()
    alive, made = set(), {}
    for what, kind, h in events:
        if what == "made":
            alive.add((kind, h))
            made[kind] = made.get(kind, 0) + 1
        else:
            assert (kind, h) in alive, f"{kind} of a handle that is not alive"
            alive.remove((kind, h))
    assert not alive, f"{len(alive)} handles left: {sorted(alive)[:3]}"
    assert made["dnnl_primitive_destroy"] >= 20 and made["dnnl_memory_destroy"] >= 80


def test_a_strided_view_binds_to_the_layout_the_primitive_asked_for():
    """Attention's Q·Kᵀ on transposed views, bound at bind time (the memory's layout is read
    from the primitive descriptor before the memory exists)."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 6, 3, 4), dtype=np.float32), rng.standard_normal((1, 6, 3, 4), dtype=np.float32)
    qv, kv = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1)
    y = np.empty((1, 3, 6, 6), np.float32)
    pd = D.matmul(D.MemoryDesc.from_array(qv), D.MemoryDesc.from_array(kv), D.MemoryDesc.from_array(y))
    pd.primitive().bind({D.ARG_SRC: qv, D.ARG_WEIGHTS: kv, D.ARG_DST: y}).run()
    np.testing.assert_allclose(y, qv @ kv, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="C-contiguous"):  # a plain layout still refuses a strided buffer
        plain = D.matmul(D.MemoryDesc.create((1, 3, 6, 4), np.float32, "abcd"), D.MemoryDesc.from_array(kv),
                         D.MemoryDesc.from_array(y))
        plain.primitive().bind({D.ARG_SRC: qv, D.ARG_WEIGHTS: kv, D.ARG_DST: y})


def test_handles_destroyed_after_the_modules_globals_are_cleared_raise_nothing(monkeypatch):
    """The interpreter's exit clears module globals (sets them to None) before it destroys
    what module-level caches still hold (the shared descriptors): a handle's destructor
    then must neither raise ("Exception ignored in ... __del__" on the user's stderr) nor
    call into a library that may be going."""
    from glassrt.kernels.onednn import ahead

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    md = D.MemoryDesc.create((2,), np.float32, "a")
    job = ahead.Job(None, 1)
    job.handle = type(md.handle)(1)  # (a made primitive nobody claimed: must not be destroyed then)
    for name in ("capi", "_exiting"):
        monkeypatch.setattr(D, name, None)
    monkeypatch.setattr(ahead, "_closing", None)
    monkeypatch.setattr(ahead, "capi", None)
    del md, job
    assert seen == []
