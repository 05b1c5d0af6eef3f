"""Prometheus metrics for a session in production: runs, latency, plans, memory, fallbacks.

    from prometheus_client import start_http_server
    metrics = glassrt.tools.metrics.instrument(sess, model="resnet50")
    start_http_server(9100)  # every sess.run is now counted and timed

Uses `prometheus-client` (optional: `pip install prometheus-client`). The metrics go on
prometheus_client's default REGISTRY (what start_http_server serves) unless another
registry is given. Each metric is made once per registry and every instrumented session is
a `model` label on it, as Prometheus expects: two sessions never collide. Sessions given the
same model= name share its series (runs and latency add up; gauges show the latest run).
"""
from __future__ import annotations

import functools
import threading
import time
import weakref

_families = weakref.WeakKeyDictionary()  # registry -> {attribute: metric}, made once per registry
_lock = threading.Lock()


def _metric_families(registry) -> dict:
    from prometheus_client import Counter, Gauge, Histogram

    with _lock:
        if registry not in _families:
            labels = ["model"]
            _families[registry] = {
                "runs": Counter("glassrt_runs", "Completed runs", labels, registry=registry),
                "errors": Counter("glassrt_run_errors", "Runs that raised", labels + ["error"], registry=registry),
                "latency": Histogram("glassrt_run_seconds", "Run latency", labels, registry=registry,
                                     buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)),
                "fallbacks": Gauge("glassrt_fallback_nodes", "Nodes placed on a later provider", labels,
                                   registry=registry),
                "plans": Gauge("glassrt_plans_cached", "Compiled plans in the cache", labels, registry=registry),
                "plans_built": Gauge("glassrt_plans_built", "Plans compiled so far", labels, registry=registry),
                "arena": Gauge("glassrt_arena_bytes", "Arena bytes of the cached plans", labels, registry=registry),
                "pool": Gauge("glassrt_pool_bytes", "Run-time buffer pool", labels + ["kind"], registry=registry),
            }
        return _families[registry]


class SessionMetrics:
    def __init__(self, sess, model: str = "model", registry=None):
        try:
            from prometheus_client import REGISTRY
        except ImportError as e:  # an optional dependency: say how to get it
            from ..errors import GlassrtError

            raise GlassrtError("metrics need prometheus-client: pip install prometheus-client") from e
        self.registry = registry if registry is not None else REGISTRY
        self.sess, self.model = sess, model
        for name, metric in _metric_families(self.registry).items():
            setattr(self, name, metric)
        self.fallbacks.labels(model).set(len(sess.fallbacks))

    def observe(self, seconds: float) -> None:
        m = self.model
        self.runs.labels(m).inc()
        self.latency.labels(m).observe(seconds)
        stats = self.sess.memory_stats()
        self.plans.labels(m).set(stats["plans_cached"])
        self.plans_built.labels(m).set(stats["plans_built"])
        self.arena.labels(m).set(sum(stats["arena_bytes"].values()))
        self.pool.labels(m, "allocated").set(stats["pool"]["allocated_bytes"])
        self.pool.labels(m, "reserved").set(stats["pool"]["reserved_bytes"])


def instrument(sess, model: str = "model", registry=None) -> SessionMetrics:
    """Wrap sess.run so that every run updates the metrics; returns them."""
    metrics = SessionMetrics(sess, model, registry)
    run = sess.run

    @functools.wraps(run)
    def timed_run(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            out = run(*args, **kwargs)
        except Exception as e:
            metrics.errors.labels(model, type(e).__name__).inc()
            raise
        metrics.observe(time.perf_counter() - t0)
        return out

    sess.run = timed_run
    return metrics
