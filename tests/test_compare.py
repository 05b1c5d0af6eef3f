"""Where two providers first disagree; which node first produced a NaN."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels import registry
from glassrt.tools.compare import first_anomaly, first_disagreement
from tests.helpers import init, model, tensor


def _chain():
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"], name="double"),
             helper.make_node("Sqrt", ["a"], ["b"], name="root"),
             helper.make_node("Log", ["b"], ["c"], name="log"),
             helper.make_node("Add", ["c", "two"], ["y"], name="shift")]
    return model(nodes, [tensor("x", [4])], [tensor("y", [4])], [init("two", np.array(2.0, np.float32))])


def test_cpu_and_reference_agree_on_a_light_model():
    from glassrt.tools import light_models as lm

    found, n = first_disagreement(str(lm.path("squeezenet")), {"data_0": lm.reference_input((1, 3, 224, 224))},
                                  ["cpu"], ["reference", "cpu"])
    assert found is None and n > 20


@pytest.fixture
def sqrt_plus():
    """Installs a cpu Sqrt that adds a constant: a kernel bug, or rounding noise when small."""
    glassrt.runtime._load_cpu_kernels()  # else a session would import Sqrt's module after this
    saved = list(registry.kernels_for("cpu", "", "Sqrt"))

    def install(offset):
        registry.unregister("cpu", "", "Sqrt")
        registry.register(registry.Kernel("cpu.Sqrt.buggy", "cpu", "", "Sqrt",
                                          lambda x: np.sqrt(x) + x.dtype.type(offset)))
    yield install
    registry.unregister("cpu", "", "Sqrt")
    for k in saved:
        registry.register(k)


def test_first_disagreement_names_the_culprit(sqrt_plus):
    sqrt_plus(1e-3)  # 5e-4 relative on these values: hunting it needs tighter than the defaults
    found, _ = first_disagreement(_chain(), {"x": np.array([1, 2, 3, 4], np.float32)}, ["cpu"], ["reference"],
                                  rtol=1e-4, atol=1e-5)
    assert found.node == "root" and found.op == "Sqrt" and found.kernel_a == "cpu.Sqrt.buggy"
    assert found.kernel_b == "reference.Sqrt" and 9e-4 < found.max_abs < 1.1e-3


def test_default_tolerances_suit_float32_end_to_end(sqrt_plus):
    from glassrt.tools.compare import ATOL, RTOL, verdict

    x = {"x": np.array([2e-4, 5e-4, 1e-3, 2e-3], np.float32)}  # sqrt(2x) in 0.02..0.06
    sqrt_plus(2e-5)  # float32 rounding noise a few layers deep: not a disagreement
    found, n = first_disagreement(_chain(), x, ["cpu"], ["reference"])
    assert found is None and n == 4
    assert verdict(found, n, RTOL, ATOL) == "agree: 4 values compared (rtol=0.001, atol=0.0001)"
    found, _ = first_disagreement(_chain(), x, ["cpu"], ["reference"], rtol=1e-4, atol=1e-5)  # the old defaults
    assert found is not None and found.node == "root"
    sqrt_plus(1e-2)  # a real bug is still caught with the defaults
    found, n = first_disagreement(_chain(), x, ["cpu"], ["reference"])
    assert found.node == "root"
    assert verdict(found, n, RTOL, ATOL).startswith("first disagreement (after 2 values compared, rtol=0.001, "
                                                    "atol=0.0001): Sqrt node 'root'")


def test_first_anomaly_tells_produced_from_propagated():
    sess = glassrt.InferenceSession(_chain())
    found = first_anomaly(sess, {"x": np.array([1, -2, 3, 0], np.float32)})
    assert (found.node, found.kind, found.count, found.inputs_finite) == ("root", "NaN", 1, True)
    assert "produced here" in str(found)
    assert first_anomaly(sess, {"x": np.array([1, 2, 3, 4], np.float32)}) is None


def test_first_anomaly_sees_a_nan_a_fused_relu_would_turn_into_zero():
    """oneDNN's fused relu is a max instruction, which makes a NaN 0: the tool runs on
    kernels that keep NaN (nan_handling="exact"), so the Conv that carries it is named."""
    w = np.array([2, -2], np.float32).reshape(1, 2, 1, 1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["y"])]
    m = model(nodes, [tensor("x", [1, 2, 2, 2])], [tensor("y", [1, 1, 2, 2])], [init("w", w)])
    x = {"x": np.ones((1, 2, 2, 2), np.float32)}
    x["x"][0, 1, 0, 0] = np.nan
    found = first_anomaly(glassrt.InferenceSession(m), x)
    assert (found.node, found.kind, found.count, found.inputs_finite) == ("conv", "NaN", 1, False)
    fast = glassrt.InferenceSession(m, glassrt.SessionOptions(nan_handling="fast"))
    if fast.explain()["nodes"][0]["kernel"].startswith("onednn"):
        assert fast.run(None, x)[0][0, 0, 0, 0] == 0.0  # what the fused relu made of it


def test_nan_tool_is_quiet_but_user_runs_still_warn():
    import warnings

    sess = glassrt.InferenceSession(_chain())
    x = {"x": np.array([1, -2, 3, 0], np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any RuntimeWarning would raise
        assert first_anomaly(sess, x).node == "root"
    assert np.geterr()["invalid"] == "warn"  # the tool's errstate ended with it: user code still warns
    with pytest.warns(RuntimeWarning, match="invalid value encountered in sqrt"):
        np.sqrt(np.float32(-1))


def test_cli_compare_and_nan(tmp_path):
    import subprocess
    import sys

    import onnx

    p = tmp_path / "chain.onnx"
    onnx.save(_chain(), p)
    x = tmp_path / "x.npy"
    np.save(x, np.array([1, -2, 3, 0], np.float32))
    res = subprocess.run([sys.executable, "-m", "glassrt.cli", "nan", str(p), "--input", f"x={x}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "root" in res.stdout and "NaN" in res.stdout
    assert "RuntimeWarning" not in res.stdout + res.stderr, res.stderr
    res = subprocess.run([sys.executable, "-m", "glassrt.cli", "compare", str(p), "--input", f"x={x}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "agree" in res.stdout, res.stdout + res.stderr
    assert "(rtol=0.001, atol=0.0001)" in res.stdout  # the tolerances in effect, in the verdict


def test_tools_reachable_after_a_plain_import_glassrt():
    import subprocess
    import sys

    code = "import glassrt; glassrt.tools.compare.first_disagreement; glassrt.tools.metrics.instrument"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
