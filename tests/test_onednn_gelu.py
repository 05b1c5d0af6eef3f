"""Gelu on the onednn provider (kernels/onednn/gelu.py): oneDNN's eltwise gelu_erf /
gelu_tanh, within rounding of cpu's exact kernel and onnxruntime, the same at the edges
(infinities, NaN, the largest floats, where oneDNN alone would overflow)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import model, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")
RNG = np.random.default_rng(3)
EDGES = np.array([np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1.7e38, 2e38, 1e30, -1e30, 8.0, 8.5, 100.0, -100.0,
                  -5.5, 1e-30, -1e-30, 0.0, -0.0, 1e-45], np.float32)


def _gelu(shape, approximate=None):
    attrs = {} if approximate is None else {"approximate": approximate}
    return model([helper.make_node("Gelu", ["x"], ["y"], name="gelu", **attrs)], [tensor("x", list(shape))],
                 [tensor("y", list(shape))], opset=20)


def _ort(m, x):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("shape", [(3, 128, 96), (512,), (2, 8, 16, 16)])
@pytest.mark.parametrize("approximate", [None, "tanh"])
def test_gelu_on_onednn_is_cpus_within_rounding_and_onnxruntimes(shape, approximate):
    m = _gelu(shape, approximate)
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[:EDGES.size] = EDGES
    sess = glassrt.InferenceSession(m)
    assert {r["name"]: r for r in sess.explain()["nodes"]}["gelu"]["kernel"] == "onednn.Gelu.eltwise"
    got = sess.run(None, {"x": x})[0]
    cpu = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    ort = _ort(m, x)
    wild = slice(0, 9)  # infinities, NaN and |x| >= 1e30: the same values exactly
    np.testing.assert_array_equal(got.reshape(-1)[wild], cpu.reshape(-1)[wild])
    np.testing.assert_array_equal(got.reshape(-1)[wild], ort.reshape(-1)[wild])
    np.testing.assert_allclose(got, cpu, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(got, ort, rtol=2e-6, atol=2e-6)


def test_a_gelu_of_symbolic_shape_runs_on_each_plans_shape():
    m = _gelu(("batch", 64))
    sess = glassrt.InferenceSession(m)
    for batch in (3, 5):
        x = RNG.standard_normal((batch, 64)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(m, x), rtol=2e-6, atol=2e-6)
    kernels = {st.kernel.name for plan in sess.runner.plans.values() for st in plan.steps}
    assert kernels == {"onednn.Gelu.eltwise"}
