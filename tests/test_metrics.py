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
    metrics = instrument(sess, model="add", registry=prometheus_client.CollectorRegistry())
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


def test_readme_recipe_serves_glassrt_metrics_on_the_default_registry():
    """instrument() + start_http_server(), as the README writes it: the server (default
    REGISTRY) must answer with this session's metrics."""
    import urllib.request

    sess = glassrt.InferenceSession(add_model())
    glassrt.tools.metrics.instrument(sess, model="served-add")  # reached from a plain `import glassrt`
    sess.run(None, {"x": np.ones((2, 3), np.float32)})
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1")
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'glassrt_runs_total{model="served-add"} 1.0' in text
    assert 'glassrt_run_seconds_count{model="served-add"} 1.0' in text


def test_two_sessions_share_the_metrics_by_model_label():
    registry = prometheus_client.CollectorRegistry()
    a, b = glassrt.InferenceSession(add_model()), glassrt.InferenceSession(add_model())
    instrument(a, model="a", registry=registry)
    instrument(b, model="b", registry=registry)  # no "Duplicated timeseries" error
    for sess, runs in ((a, 2), (b, 1)):
        for _ in range(runs):
            sess.run(None, {"x": np.ones((1, 3), np.float32)})
    text = prometheus_client.generate_latest(registry).decode()
    assert 'glassrt_runs_total{model="a"} 2.0' in text and 'glassrt_runs_total{model="b"} 1.0' in text
