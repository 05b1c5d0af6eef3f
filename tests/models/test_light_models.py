"""The nine light models from the onnx package: native (zero fallbacks), against the
expected outputs that ship with them, and against onnxruntime with random weights."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import glassrt
from glassrt.tools import light_models as lm
from tests.helpers import expose

ort = pytest.importorskip("onnxruntime")


def _ort_run(model: onnx.ModelProto, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _pre_softmax(model):
    """The logits: the input of the final Softmax, where one exists (softmax saturates)."""
    soft = [n for n in model.graph.node if n.op_type == "Softmax"]
    return [soft[-1].input[0]] if soft else []


@pytest.mark.parametrize("name", lm.NAMES)
def test_light_model_native_matches_shipped_output(name):
    m = expose(onnx.load(lm.path(name)), _pre_softmax(onnx.load(lm.path(name))))
    x_name, shape = lm.input_shape(m)
    sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
    assert sess.fallbacks == []
    y, *logits = sess.run(None, {x_name: lm.reference_input(shape)})
    expected = lm.expected_output(name)
    if logits and not np.allclose(y, expected, rtol=1e-3, atol=1e-6):
        # The 0.02 weights make every logit mathematically equal (squeezenet's are ~1e10): the
        # uniform expected softmax then holds only if every summation order is the same, and
        # a softmax of logits one float32 ulp apart is anything. Allowed exactly then.
        z = logits[0].astype(np.float64)
        assert np.ptp(expected) == 0 and np.ptp(z) <= 8 * np.finfo(np.float32).eps * np.abs(z).max(), \
            f"{name}: logits spread {np.ptp(z):.3g} around {np.abs(z).max():.3g}"
        return
    np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("name", lm.NAMES)
def test_light_model_random_weights_match_onnxruntime(name):
    m = lm.randomize_weights(onnx.load(lm.path(name)), seed=1)
    m = expose(m, _pre_softmax(m))
    x_name, shape = lm.input_shape(m)
    x = np.random.default_rng(2).random(shape, dtype=np.float32)
    ours = glassrt.InferenceSession(m, providers=["cpu"], fallback="error").run(None, {x_name: x})
    theirs = _ort_run(m, {x_name: x})
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype
        scale = float(np.abs(b).max()) or 1.0
        # Weights are random, so the outputs vary: compare relative to their magnitude.
        np.testing.assert_allclose(a / scale, b / scale, rtol=1e-3, atol=1e-4)
    assert float(np.std(ours[-1])) > 0  # not the near-uniform output of the 0.02 weights
