"""Prometheus metrics of a session."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.tools.metrics import METRIC_NAMES, instrument
from tests.helpers import add_model, model, tensor

prometheus_client = pytest.importorskip("prometheus_client")


def _sample(registry, name, **labels):
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"no sample {name}{labels} in:\n" + prometheus_client.generate_latest(registry).decode()
    return value


def test_runs_latency_plans_and_errors_are_exported():
    sess = glassrt.InferenceSession(add_model())
    registry = prometheus_client.CollectorRegistry()
    metrics = instrument(sess, model="add", registry=registry)
    for b in (1, 2, 2):
        sess.run(None, {"x": np.ones((b, 3), np.float32)})
    with pytest.raises(glassrt.InputShapeError):
        sess.run(None, {"x": np.ones((2, 4), np.float32)})
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert 'glassrt_runs_total{model="add"} 3.0' in text
    assert 'glassrt_run_duration_seconds_count{model="add"} 3.0' in text
    assert 'glassrt_plan_cache_plans{model="add"} 2.0' in text
    assert 'glassrt_run_errors_total{error="InputShapeError",model="add"} 1.0' in text
    # batch 1 and batch 2 compiled a plan each; the second batch-2 run found its plan
    assert _sample(registry, "glassrt_plan_cache_misses_total", model="add") == 2
    assert _sample(registry, "glassrt_plan_cache_hits_total", model="add") == 1
    assert _sample(registry, "glassrt_plan_cache_evictions_total", model="add") == 0
    assert _sample(registry, "glassrt_nan_runs_total", model="add") == 0  # (an Add loses no NaN: never checked)
    # the batch-2 plan's arena is empty (one Add, input to output): what the session reports
    stats = sess.memory_stats()
    assert _sample(registry, "glassrt_arena_bytes", model="add") == sum(stats["arena_bytes"].values())
    assert _sample(registry, "glassrt_pool_reserved_bytes", model="add") == stats["pool"]["reserved_bytes"]
    assert "glassrt_fallback_nodes{" not in text  # no fallback, no series


def test_node_latency_is_sampled_by_op_and_provider():
    sess = glassrt.InferenceSession(add_model(), providers=["cpu"])
    registry = prometheus_client.CollectorRegistry()
    instrument(sess, model="add", registry=registry, profile_every=3)
    for _ in range(7):  # runs 1, 4 and 7 are profiled
        sess.run(None, {"x": np.ones((2, 3), np.float32)})
    assert _sample(registry, "glassrt_profiled_runs_total", model="add") == 3
    assert _sample(registry, "glassrt_node_duration_seconds_count", model="add", op="Add", provider="cpu") == 3
    assert _sample(registry, "glassrt_node_duration_seconds_sum", model="add", op="Add", provider="cpu") > 0
    assert _sample(registry, "glassrt_runs_total", model="add") == 7


def test_fallbacks_by_op_and_provider():
    from glassrt.kernels import registry as kernels
    from glassrt.runtime import _load_cpu_kernels

    _load_cpu_kernels()
    saved = list(kernels.kernels_for("cpu", "", "Tanh"))
    kernels.unregister("cpu", "", "Tanh")  # cpu runs every ONNX op: take one away to make a fallback
    try:
        m = model([helper.make_node("Neg", ["x"], ["a"], name="neg"),
                   helper.make_node("Tanh", ["a"], ["y"], name="tanh")],
                  [tensor("x", ["n"])], [tensor("y", ["n"])])
        sess = glassrt.InferenceSession(m, providers=["cpu", "reference"], fallback="silent")
    finally:
        for k in saved:
            kernels.register(k)
    registry = prometheus_client.CollectorRegistry()
    instrument(sess, model="m", registry=registry)
    assert [(f.op, f.provider) for f in sess.fallbacks] == [("Tanh", "reference")]
    assert _sample(registry, "glassrt_fallback_nodes", model="m", op="Tanh", provider="reference") == 1
    assert registry.get_sample_value("glassrt_fallback_nodes", {"model": "m", "op": "Neg", "provider": "cpu"}) is None


def test_pool_fragmentation_ratio_is_allocated_over_reserved():
    sess = glassrt.InferenceSession(add_model())
    registry = prometheus_client.CollectorRegistry()
    instrument(sess, model="add", registry=registry)
    assert _sample(registry, "glassrt_pool_fragmentation_ratio", model="add") == 1.0  # nothing reserved yet
    sess.runner.pool.allocated, sess.runner.pool.reserved = 300, 1000  # as after buffers were freed for reuse
    assert _sample(registry, "glassrt_pool_fragmentation_ratio", model="add") == pytest.approx(0.3)
    assert _sample(registry, "glassrt_pool_allocated_bytes", model="add") == 300


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
    assert 'glassrt_run_duration_seconds_count{model="served-add"} 1.0' in text
    assert 'glassrt_plan_cache_plans{model="served-add"} 1.0' in text


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


def test_every_documented_name_is_exported_and_in_the_readme():
    from pathlib import Path

    sess = glassrt.InferenceSession(add_model())
    registry = prometheus_client.CollectorRegistry()
    instrument(sess, model="add", registry=registry, profile_every=1)
    sess.run(None, {"x": np.ones((1, 3), np.float32)})
    families = {fam.name: fam for fam in registry.collect()}  # counters by their name without _total
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name in METRIC_NAMES:
        assert name.removesuffix("_total") in families, name
        assert f"`{name}`" in readme, f"{name} is not listed in the README"
    samples = {s.name for fam in families.values() for s in fam.samples}
    # a series from the first run for all but the ones that need an error, a fallback, a transfer
    for name in set(METRIC_NAMES) - {"glassrt_run_errors_total", "glassrt_fallback_nodes", "glassrt_transfer_nodes"}:
        assert name in samples or f"{name}_count" in samples, name
