"""Prometheus metrics of a session."""
from __future__ import annotations

import numpy as np
import pytest

import glassrt
from glassrt.tools.metrics import instrument
from tests.helpers import add_model

prometheus_client = pytest.importorskip("prometheus_client")


def test_runs_latency_plans_and_errors_are_exported():
    sess = glassrt.InferenceSession(add_model())
    metrics = instrument(sess, model="add")
    for b in (1, 2, 2):
        sess.run(None, {"x": np.ones((b, 3), np.float32)})
    with pytest.raises(glassrt.InputShapeError):
        sess.run(None, {"x": np.ones((2, 4), np.float32)})
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert 'glassrt_runs_total{model="add"} 3.0' in text
    assert 'glassrt_run_seconds_count{model="add"} 3.0' in text
    assert 'glassrt_plans_cached{model="add"} 2.0' in text
    assert 'glassrt_run_errors_total{error="InputShapeError",model="add"} 1.0' in text
    assert 'glassrt_fallback_nodes{model="add"} 0.0' in text
