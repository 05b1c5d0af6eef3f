"""A QDQ model's MatMul of two DequantizeLinear outputs, one of constant int8 weights
(passes/fuse_qdq_matmul.py): one com.microsoft::MatMulIntegerToFloat on the onednn
provider's exact int8 matmul (kernels/onednn/int8.py) — onnxruntime's numbers, within
rounding of the float product of dequantized values; left alone where that kernel would
not run it. And QuantizeLinear's compiled per-tensor loop, which feeds those products."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import init, model, op_types, ort_outputs, skip_without_vnni, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")
RNG = np.random.default_rng(5)
K, N = 48, 20
X = (RNG.standard_normal((2, 7, K)) * 2).astype(np.float32)


needs_vnni = skip_without_vnni()


def _layer(w_dtype=np.int8, per_column=True, w_zp=0, axis=1, bias=True, a_dtype=np.uint8):
    """x -> Q -> DQ -> MatMul(., DQ(W)) [-> Add bias] -> y, as quantize_static writes a layer."""
    info = np.iinfo(w_dtype)
    w = RNG.integers(info.min, info.max + 1, (K, N)).astype(w_dtype)
    w_scale = (RNG.uniform(0.002, 0.02, N) if per_column else np.array(0.01)).astype(np.float32)
    a_zp = np.array(128 if a_dtype == np.uint8 else 3, a_dtype)
    inits = [init("a_s", np.array(0.03, np.float32)), init("a_z", a_zp), init("w", w), init("w_s", w_scale),
             init("w_z", np.full(w_scale.shape, w_zp, w_dtype)), init("b", RNG.standard_normal(N).astype(np.float32))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "a_s", "a_z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "a_s", "a_z"], ["xd"], name="dq_x"),
             helper.make_node("DequantizeLinear", ["w", "w_s", "w_z"], ["wd"], name="dq_w", axis=axis),
             helper.make_node("MatMul", ["xd", "wd"], ["mm"], name="mm")]
    nodes.append(helper.make_node("Add", ["mm", "b"], ["y"], name="bias") if bias else
                 helper.make_node("Identity", ["mm"], ["y"], name="out"))
    return model(nodes, [tensor("x", list(X.shape))], [tensor("y", None)], inits, opset=19)


def _ort(m):
    return ort_outputs(m, {"x": X})[0]


@needs_vnni
@pytest.mark.parametrize("per_column,bias,a_dtype", [(True, True, np.uint8), (False, True, np.uint8),
                                                     (True, False, np.uint8), (True, True, np.int8)])
def test_the_layer_becomes_one_integer_product(per_column, bias, a_dtype):
    m = _layer(per_column=per_column, bias=bias, a_dtype=a_dtype)
    sess = glassrt.InferenceSession(m)
    assert "MatMulIntegerToFloat" in op_types(sess) and "MatMul" not in op_types(sess)
    assert "Add" not in op_types(sess)  # the bias went in (where there is one)
    rows = {r["name"]: r for r in sess.explain()["nodes"]}
    assert rows["mm"]["kernel"] == "onednn.MatMulIntegerToFloat.int8"
    got = sess.run(None, {"x": X})[0]
    plain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(fusion=False)).run(None, {"x": X})[0]
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)  # rounding apart: exact sums against float ones
    np.testing.assert_allclose(got, _ort(m), rtol=1e-6, atol=1e-5)  # onnxruntime computes the integer product too (an ulp of the sums apart)
    on_cpu = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": X})[0]
    np.testing.assert_allclose(got, on_cpu, rtol=1e-5, atol=1e-5)


@needs_vnni
@pytest.mark.parametrize("case", ["uint8_weights", "weight_zero_point", "scale_per_row"])
def test_it_does_not_fire_where_the_kernel_would_not_take_it(case):
    m = {"uint8_weights": lambda: _layer(w_dtype=np.uint8, w_zp=128),
         "weight_zero_point": lambda: _layer(w_zp=2),
         "scale_per_row": lambda: _layer(per_column=False, axis=0)}[case]()
    if case == "scale_per_row":  # a scale per row of W (one per inner element): not factored out of the sum
        m.graph.initializer[3].CopyFrom(init("w_s", RNG.uniform(0.002, 0.02, K).astype(np.float32)))
        m.graph.initializer[4].CopyFrom(init("w_z", np.zeros(K, np.int8)))
    sess = glassrt.InferenceSession(m)
    assert "MatMulIntegerToFloat" not in op_types(sess) and {"MatMul", "FusedMatMul"} & set(op_types(sess))
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], _ort(m), rtol=1e-4, atol=1e-4)


def test_it_does_not_fire_without_an_exact_int8_engine(monkeypatch):
    m = _layer()
    assert "MatMulIntegerToFloat" not in op_types(glassrt.InferenceSession(m, providers=["cpu"]))
    lib = capi.require()
    monkeypatch.setattr(lib, "dnnl_get_effective_cpu_isa", lambda: capi.CPU_ISA["avx512_core"])
    assert "MatMulIntegerToFloat" not in op_types(glassrt.InferenceSession(m))


@needs_vnni
@pytest.mark.parametrize("a_dtype,per_column,bias,a_shape", [(np.uint8, True, True, (3, 5, K)),
                                                              (np.int8, False, False, (4, K)),
                                                              (np.uint8, True, False, (K,))])
def test_matmul_integer_to_float_on_onednn_is_the_cpu_kernel_bit_for_bit(a_dtype, per_column, bias, a_shape):
    info = np.iinfo(a_dtype)
    a = RNG.integers(info.min, info.max + 1, a_shape).astype(a_dtype)
    b = RNG.integers(-128, 128, (K, N)).astype(np.int8)
    consts = [init("b", b), init("a_s", np.array(0.031, np.float32)),
              init("b_s", (RNG.uniform(0.002, 0.02, N) if per_column else np.array(0.01)).astype(np.float32)),
              init("b_z", np.zeros(N if per_column else (), np.int8))]
    names = ["a", "b", "a_s", "b_s", "a_z", "b_z"] + (["bias"] if bias else [])
    if bias:
        consts.append(init("bias", RNG.standard_normal(N).astype(np.float32)))
    elem = TensorProto.UINT8 if a_dtype == np.uint8 else TensorProto.INT8
    node = helper.make_node("MatMulIntegerToFloat", names, ["y"], name="mm", domain="com.microsoft")
    m = model([node], [tensor("a", list(a_shape), elem), tensor("a_z", [], elem)], [tensor("y", None)], consts,
              opset=17)
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    feeds = {"a": a, "a_z": np.array(info.min + 77, a_dtype)}
    sess = glassrt.InferenceSession(m)
    assert {r["name"]: r for r in sess.explain()["nodes"]}["mm"]["kernel"] == "onednn.MatMulIntegerToFloat.int8"
    got = sess.run(None, feeds)[0]
    np.testing.assert_array_equal(got, glassrt.InferenceSession(m, providers=["cpu"]).run(None, feeds)[0])


def _counted(mp, module, name) -> list:
    """Replace module.name by a wrapper that records its calls (then calls it)."""
    calls, real = [], getattr(module, name)
    if hasattr(real, "dispatcher"):  # a lazy compiled loop: its module compiled now, while the name is its own
        real.dispatcher()
    mp.setattr(module, name, lambda *a: calls.append(1) or real(*a))
    return calls


def test_quantize_linear_per_tensor_loop_is_the_numpy_path(monkeypatch):
    pytest.importorskip("numba")  # imported: the compiled loops run from the first call (_jit.use_compiled)
    from glassrt.kernels.cpu import quantize

    x = np.concatenate([RNG.standard_normal(300).astype(np.float32) * 60,
                        np.array([np.nan, np.inf, -np.inf, 2.5, 3.5, -2.5, -0.0, 1e30], np.float32)])
    for dt, zp in ((np.uint8, 128), (np.int8, -3), (np.uint8, None)):
        z = None if zp is None else np.array(zp, dt)
        with monkeypatch.context() as mp:
            loop = _counted(mp, quantize, "_quantize8")
            fast = quantize.quantize_linear(x, np.array(0.37, np.float32), z)
        assert loop, "the compiled loop was not taken"
        with monkeypatch.context() as mp:
            mp.setattr(quantize, "_quantize8", None)  # the compiled loop must not be the one called
            mp.setattr(quantize, "_per_tensor_8bit", lambda *a: False)
            slow = quantize.quantize_linear(x, np.array(0.37, np.float32), z)
        assert fast.dtype == slow.dtype
        np.testing.assert_array_equal(fast, slow)


def test_dynamic_quantize_linear_loop_is_the_numpy_path(monkeypatch):
    pytest.importorskip("numba")
    from glassrt.kernels.cpu import quantize

    cases = [(RNG.standard_normal((3, 500)) * 7).astype(np.float32), np.array([np.nan, 1.0, -2.0, np.inf], np.float32),
             np.zeros(5, np.float32), np.array(3.5, np.float32), np.full(9, 2.0, np.float32)]
    for x in cases:
        with monkeypatch.context() as mp:
            loop = _counted(mp, quantize, "_quantize8")
            fast = quantize.dynamic_quantize_linear(x)
        assert loop, "the compiled loop was not taken"
        with monkeypatch.context() as mp, np.errstate(invalid="ignore"):
            mp.setattr(quantize, "use_compiled", lambda *a, **k: False)
            mp.setattr(quantize, "_quantize8", None)
            slow = quantize.dynamic_quantize_linear(x)
        for f, s in zip(fast, slow):
            assert f.dtype == s.dtype and f.shape == s.shape
            np.testing.assert_array_equal(f, s)


def test_dequantize_linear_per_tensor_loop_is_the_numpy_path(monkeypatch):
    pytest.importorskip("numba")
    from glassrt.kernels.cpu import quantize

    for dt, zp in ((np.uint8, 131), (np.int8, -7), (np.int8, None)):
        info = np.iinfo(dt)
        x = RNG.integers(info.min, info.max + 1, (3, 41, 7)).astype(dt)
        z = None if zp is None else np.array(zp, dt)
        with monkeypatch.context() as mp:
            loop = _counted(mp, quantize, "_dequantize8")
            fast = quantize.dequantize_linear(x, np.array(0.0371, np.float32), z)
        assert loop, "the compiled loop was not taken"
        with monkeypatch.context() as mp:
            mp.setattr(quantize, "use_compiled", lambda *a, **k: False)
            mp.setattr(quantize, "_dequantize8", None)
            slow = quantize.dequantize_linear(x, np.array(0.0371, np.float32), z)
        assert fast.dtype == slow.dtype == np.float32
        np.testing.assert_array_equal(fast, slow)
        assert np.array_equal(np.signbit(fast), np.signbit(slow))


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32])
def test_dequantize_linear_is_the_spec_in_float32_per_tensor_and_per_axis(dt):
    """(x - z) * s with x - z exact (in int64 for 32-bit x) and rounded once to float32, then
    one rounding in the multiply: per tensor and per axis, with and without a zero point,
    into a new array, a C-contiguous buffer and a channels-last one, NumPy's path (a weight
    folded at session creation) and with 32-bit values past float32's 2**24."""
    from glassrt.kernels.cpu import quantize

    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max, (2, 5, 3, 4), dtype=np.int64, endpoint=True).astype(dt)
    for axis, scale_shape in ((1, (5,)), (-1, (4,)), (0, ())):
        s = (RNG.random(scale_shape) * 0.05 + 1e-3).astype(np.float32)
        for z in (None, RNG.integers(info.min, info.max, scale_shape, dtype=np.int64, endpoint=True).astype(dt)):
            bshape = [1] * 4
            if scale_shape:
                bshape[axis] = -1
            diff = x.astype(np.int64) - (0 if z is None else z.astype(np.int64).reshape(bshape))
            want = diff.astype(np.float32) * s.reshape(bshape)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(quantize, "use_compiled", lambda *a, **k: False)

                def tiled(*a, **k):
                    raise AssertionError("took the tiled path, not the direct one")

                mp.setattr(quantize, "write_elementwise", tiled)  # (the direct path writes into y itself)
                outs = [None, np.empty(x.shape, np.float32), np.empty((2, 3, 4, 5), np.float32).transpose(0, 3, 1, 2)]
                for out in outs:
                    got = quantize.dequantize_linear(x, s, z, out=out, axis=axis)
                    assert got.dtype == np.float32 and (out is None or got is out)
                    np.testing.assert_array_equal(got, want)
                    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_optional_compiled_loops_wait_for_numba_or_a_model_that_keeps_running():
    """A process that has not imported Numba takes the NumPy twin of an optional compiled
    loop in the first session run that asks for it (importing Numba costs 0.5-1 s: more than
    a model run once gains); from the next run on, or once that path has run `after` times,
    Numba loads on another thread while the twins go on, and the loops run once it is
    loaded; where Numba is loaded, the loop runs at once. A whole session: its first run
    starts nothing, its second starts the load and does not wait for it."""
    import subprocess
    import sys

    code = ("import sys\nfrom glassrt.kernels.cpu import _jit\n"
            "from glassrt.kernels.cpu._jit import run_started, use_compiled, wait_for_numba\n"
            "run_started()\n"
            "one_run = [use_compiled('u', after=9) for _ in range(5)]\n"
            "idle = _jit._warmup is None\n"
            "first = [use_compiled('t', after=3) for _ in range(4)]\n"
            "started = _jit._warmup is not None\n"
            "wait_for_numba()\n"
            "print(one_run, idle, first, started, use_compiled('t', after=3), use_compiled('v', after=9),"
            " 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ("[False, False, False, False, False] True [False, False, False, False] True True True True"), out
    code = ("import sys, time, numpy as np, glassrt\n"
            "from onnx import helper, TensorProto\n"
            "from glassrt.kernels.cpu import _jit, quantize\n"
            "node = helper.make_node('DynamicQuantizeLinear', ['x'], ['y', 's', 'z'])\n"
            "g = helper.make_graph([node], 'g', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [4, 5])],"
            " [helper.make_tensor_value_info(o, t, None) for o, t in (('y', 2), ('s', 1), ('z', 2))])\n"
            "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)]); m.ir_version = 8\n"
            "sess = glassrt.InferenceSession(m.SerializeToString(), providers=['cpu'])\n"
            "x = np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)\n"
            "ref = sess.run(None, {'x': x}); once = _jit._warmup is None and 'numba' not in sys.modules\n"
            "second = sess.run(None, {'x': x}); loading = _jit._warmup is not None\n"
            "_jit.wait_for_numba()\n"
            "third = sess.run(None, {'x': x})\n"
            "loops = any(type(v).__name__ == 'CPUDispatcher' for v in vars(quantize).values())\n"
            "same = all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(ref, second, third))\n"
            "print(once, loading, loops, same)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "True True True True", out


def test_a_fork_waits_for_numba_loading_on_its_thread():
    """A child forked while Numba loads on glassrt's thread would find the import's locks
    held by a thread it does not have: the fork waits for the load, and the child can use
    Numba."""
    import subprocess
    import sys

    code = ("import os, sys\nfrom glassrt.kernels.cpu import _jit\n"
            "_jit.numba_warmup()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    import numba\n"
            "    os._exit(0 if _jit.numba_loaded() and numba.njit(lambda a: a + 1)(1) == 2 else 3)\n"
            "print(os.waitpid(pid, 0)[1], _jit.numba_loaded())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "0 True", out.stdout + out.stderr[-2000:]
