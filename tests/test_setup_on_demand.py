"""What a session imports and sets up only when it is needed: NumPy's BLAS thread count for
the runs that may call BLAS, and only for those (runtime/threads.py use_threads, runner.py:
a plan of oneDNN's kernels alone leaves threadpoolctl unimported), and the backward
formulas for gradients. Each case runs in a fresh interpreter: imports and the libraries'
thread counts are process state."""
import json
import subprocess
import sys

import pytest

from glassrt.kernels.onednn import capi

_PROBE = r"""
import json, sys
import numpy as np
from onnx import TensorProto, helper
import glassrt

def blas_threads():
    from threadpoolctl import threadpool_info
    return sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})

kind, providers, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
if kind == "conv":  # oneDNN's kernels alone (a Conv, and a Reshape: a view on the cpu provider)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 2, 1, 1], np.ones(6, np.float32))
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 48])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Reshape", ["c", "shape"], ["y"])]
    inits, feed = [w, shape], {"x": np.ones((1, 2, 4, 4), np.float32)}
elif kind == "quant":  # 8-bit codes and back: elementwise cpu kernels, no BLAS, no ml_dtypes type
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    s = helper.make_tensor("s", TensorProto.FLOAT, [], [0.5])
    z = helper.make_tensor("z", TensorProto.UINT8, [], [3])
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    inits, feed = [s, z], {"x": np.ones((1, 2, 4, 4), np.float32)}
else:  # a float64 product: NumPy's matmul on the cpu provider
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4, 4])
    w = helper.make_tensor("w", TensorProto.DOUBLE, [4, 4], np.ones(16))
    nodes, inits, feed = [helper.make_node("MatMul", ["x", "w"], ["y"])], [w], {"x": np.ones((4, 4))}
y = helper.make_tensor_value_info("y", TensorProto.DOUBLE if kind == "matmul" else TensorProto.FLOAT, None)
model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
result = {"default": blas_threads()} if kind == "matmul" else {}  # (importing threadpoolctl: not for conv)
opts = glassrt.SessionOptions()
opts.intra_op_num_threads = threads
sess = glassrt.InferenceSession(model, providers=providers, sess_options=opts)
out = sess.run(None, feed)[0]
result.update({"imported": "threadpoolctl" in sys.modules, "sum": float(out.sum())})
result["blas"] = blas_threads()
print(json.dumps(result))
"""


def _probe(kind, providers, threads=2):
    run = subprocess.run([sys.executable, "-c", _PROBE, kind, json.dumps(providers), str(threads)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(capi.lib is None, reason=f"oneDNN unavailable: {capi.UNAVAILABLE}")
def test_a_plan_of_onednn_kernels_leaves_blas_alone():
    out = _probe("conv", ["onednn", "cpu"])
    assert out["sum"] == 2.0 * 48
    assert not out["imported"]  # no scan of the loaded libraries for a run that calls no BLAS


@pytest.mark.parametrize("providers", [["onednn", "cpu"], ["cpu"]])
def test_a_plan_of_elementwise_and_quantizing_kernels_leaves_blas_alone(providers):
    """QuantizeLinear, DequantizeLinear and Relu call no BLAS (Kernel.blas): no threadpoolctl."""
    out = _probe("quant", providers)
    assert out["sum"] == 32.0  # 1.0 -> code 5 -> 1.0, 32 of them
    assert not out["imported"]


def test_an_8_bit_model_needs_no_ml_dtypes(tmp_path):
    """The quantizing kernels name ml_dtypes' types (int4, float8...) rather than hold them:
    a uint8 model's session and runs import no ml_dtypes (~7 ms of its first run). In a
    process that has not imported onnx (whose helper imports ml_dtypes)."""
    from onnx import TensorProto, helper

    s = helper.make_tensor("s", TensorProto.FLOAT, [], [0.5])
    z = helper.make_tensor("z", TensorProto.UINT8, [], [3])
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [s, z]),
        opset_imports=[helper.make_opsetid("", 19)])
    path = tmp_path / "q.onnx"
    path.write_bytes(model.SerializeToString())
    code = (f"import sys, numpy as np, glassrt\ns = glassrt.InferenceSession({str(path)!r})\n"
            "for _ in range(3): y = s.run(None, {'x': np.full((2, 3), 1.2, np.float32)})[0]\n"
            "print(float(y.sum()), 'ml_dtypes' in sys.modules, 'onnx.helper' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["6.0", "False", "False"]  # 1.2 -> code 5 (2.4 rounds to 2) -> 1.0


def test_which_kernels_may_call_blas():
    from glassrt.kernels.registry import kernels_for
    from glassrt.runtime import _load_kernels

    def blas(op, domain=""):
        _load_kernels("cpu", domain, op)
        return {k.blas for k in kernels_for("cpu", domain, op)}

    assert blas("MatMul") == {True} and blas("Conv") == {True}
    assert blas("Relu") == {False} and blas("Reshape") == {False}  # elementwise; a view
    assert blas("QuantizeLinear") == {False} and blas("QLinearAdd", "com.microsoft") == {False}


@pytest.mark.skipif(capi.lib is None, reason=f"oneDNN unavailable: {capi.UNAVAILABLE}")
def test_a_plan_that_may_call_blas_holds_it_at_one_thread_beside_openmp():
    out = _probe("matmul", ["onednn", "cpu"])
    assert out["sum"] == 64.0
    assert out["imported"] and out["blas"] == [1]
    if out["default"] == [1]:  # (one core, or a count set outside: held or not, it reads 1)
        pytest.skip("NumPy's BLAS runs one thread here before any session")


def test_a_cpu_session_sets_blas_to_its_thread_count():
    out = _probe("matmul", ["cpu"], threads=1)
    assert out["imported"] and out["blas"] == [1]
    if out["default"] == [1]:
        pytest.skip("NumPy's BLAS runs one thread here before any session")


_LAZY_PROBE = r"""
import gc, json, sys
import numpy as np
from onnx import TensorProto, helper
import glassrt

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
w = helper.make_tensor("w", TensorProto.FLOAT, [3, 2], np.arange(6, dtype=np.float32))
model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]),
                                             helper.make_node("Tanh", ["m"], ["y"])], "g", [x], [y], [w]),
                          opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
sess = glassrt.InferenceSession(model)
feed = {"x": np.ones((2, 3), np.float32)}
sess.run(None, feed)
out = {"backward_after_run": "glassrt.ops.backward" in sys.modules, "gc_on": gc.isenabled()}
(grad,) = sess.gradients(feed, "y", ["x"])  # contracts made before the formulas were loaded
m = feed["x"] @ np.arange(6, dtype=np.float32).reshape(3, 2)
expected = (1 - np.tanh(m) ** 2) @ np.arange(6, dtype=np.float32).reshape(3, 2).T
out["grad_right"] = bool(np.allclose(grad, expected, rtol=1e-5))
print(json.dumps(out))
"""


def test_backward_formulas_load_when_gradients_first_ask():
    """A session and its runs import no backward formula (ops/registry.py load_backward);
    gradients asked afterwards still find them, through contracts made again. The plan's
    first run (collector paused: runtime/plan.py) leaves the collector on."""
    run = subprocess.run([sys.executable, "-c", _LAZY_PROBE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out == {"backward_after_run": False, "gc_on": True, "grad_right": True}
