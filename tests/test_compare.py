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
def broken_sqrt():
    """A cpu Sqrt that is subtly wrong (adds 1e-3), standing in for a kernel bug."""
    saved = list(registry.kernels_for("cpu", "", "Sqrt"))
    registry.unregister("cpu", "", "Sqrt")
    registry.register(registry.Kernel("cpu.Sqrt.buggy", "cpu", "", "Sqrt", lambda x: np.sqrt(x) + x.dtype.type(1e-3)))
    yield
    registry.unregister("cpu", "", "Sqrt")
    for k in saved:
        registry.register(k)


def test_first_disagreement_names_the_culprit(broken_sqrt):
    found, _ = first_disagreement(_chain(), {"x": np.array([1, 2, 3, 4], np.float32)}, ["cpu"], ["reference"])
    assert found.node == "root" and found.op == "Sqrt" and found.kernel_a == "cpu.Sqrt.buggy"
    assert found.kernel_b == "reference.Sqrt" and 9e-4 < found.max_abs < 1.1e-3


def test_first_anomaly_tells_produced_from_propagated():
    sess = glassrt.InferenceSession(_chain())
    found = first_anomaly(sess, {"x": np.array([1, -2, 3, 0], np.float32)})
    assert (found.node, found.kind, found.count, found.inputs_finite) == ("root", "NaN", 1, True)
    assert "produced here" in str(found)
    assert first_anomaly(sess, {"x": np.array([1, 2, 3, 4], np.float32)}) is None


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
    res = subprocess.run([sys.executable, "-m", "glassrt.cli", "compare", str(p), "--input", f"x={x}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "agree" in res.stdout, res.stdout + res.stderr
