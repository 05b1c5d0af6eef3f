"""Prometheus metrics for a session in production: runs, latency, plans, memory, fallbacks.

    from prometheus_client import start_http_server
    metrics = glassrt.tools.metrics.instrument(sess, model="resnet50")
    start_http_server(9100)  # every sess.run is now counted and timed

Uses `prometheus-client` (optional: `pip install prometheus-client`), with a registry of
its own unless one is given, so two sessions never collide.
"""
from __future__ import annotations

import functools
import time


class SessionMetrics:
    def __init__(self, sess, model: str = "model", registry=None):
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as e:  # an optional dependency: say how to get it
            from ..errors import GlassrtError

            raise GlassrtError("metrics need prometheus-client: pip install prometheus-client") from e
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["model"]
        self.sess, self.model = sess, model
        self.runs = Counter("glassrt_runs", "Completed runs", labels, registry=self.registry)
        self.errors = Counter("glassrt_run_errors", "Runs that raised", labels + ["error"], registry=self.registry)
        self.latency = Histogram("glassrt_run_seconds", "Run latency", labels, registry=self.registry,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.fallbacks = Gauge("glassrt_fallback_nodes", "Nodes placed on a later provider", labels,
                               registry=self.registry)
        self.plans = Gauge("glassrt_plans_cached", "Compiled plans in the cache", labels, registry=self.registry)
        self.plans_built = Gauge("glassrt_plans_built", "Plans compiled so far", labels, registry=self.registry)
        self.arena = Gauge("glassrt_arena_bytes", "Arena bytes of the cached plans", labels, registry=self.registry)
        self.pool = Gauge("glassrt_pool_bytes", "Run-time buffer pool", labels + ["kind"], registry=self.registry)
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
