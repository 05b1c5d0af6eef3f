"""Prometheus metrics for a session in production: runs, latency, node time, plans, memory, fallbacks.

    from prometheus_client import start_http_server
    metrics = glassrt.tools.metrics.instrument(sess, model="resnet50")
    start_http_server(9100)  # every sess.run is now counted and timed

Uses `prometheus-client` (optional: `pip install 'glassrt[metrics]'`). The metrics go on
prometheus_client's default REGISTRY (what start_http_server serves) unless another
registry is given. Each metric is made once per registry and every instrumented session is
a `model` label on it, as Prometheus expects: two sessions never collide.

Two kinds of metric, by where the number lives:
- events a run produces (runs, errors, run and node latency) are counters and histograms
  the wrapped `run` updates;
- state the session holds (fallbacks, transfers, plan cache, arena, buffer pool) is read
  from the session when Prometheus scrapes (a collector), so it is never stale and costs
  the hot path nothing. A session that has been garbage-collected drops out.

Node latency comes from a profiled run (the plan timing each node) taken on the first run
and then every `profile_every`-th run (default 100), not from every run: the timing adds
two clock reads and a shape record per node, a few percent on small models, which a
production service should not pay on each request; one run in a hundred still fills the
per-op histograms within minutes at any useful request rate. `profile_every=1` times every
run, 0 none. `glassrt_profiled_runs_total` says how many runs the node histograms cover.

The names, by Prometheus' conventions (base units, `_total` for counters), are listed in
METRIC_NAMES and in the README.
"""
from __future__ import annotations

import functools
import threading
import time
import weakref

from ..errors import UnsupportedOperatorError

_families = weakref.WeakKeyDictionary()  # registry -> _Families, made once per registry
_lock = threading.Lock()

RUN_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
NODE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, .001, .0025, .005, .01, .025, .05, .1, .25, 1)

# name (as exposed, histograms by their base name) -> help. The README lists the same.
METRIC_NAMES = {
    "glassrt_runs_total": "Completed runs",
    "glassrt_run_errors_total": "Runs that raised, by error type",
    "glassrt_run_duration_seconds": "Run latency (histogram)",
    "glassrt_node_duration_seconds": "Node latency by op type and provider, from sampled profiled runs (histogram)",
    "glassrt_profiled_runs_total": "Runs timed node by node (the samples behind glassrt_node_duration_seconds)",
    "glassrt_fallback_nodes": "Nodes placed on a later provider than the first, by op and provider",
    "glassrt_transfer_nodes": "Values copied between providers, by source and destination",
    "glassrt_plan_cache_plans": "Compiled plans in the session's cache",
    "glassrt_plan_cache_hits_total": "Runs that found their plan in the cache",
    "glassrt_plan_cache_misses_total": "Plans compiled (a run that found none cached)",
    "glassrt_plan_cache_evictions_total": "Plans evicted from the cache (size or byte budget)",
    "glassrt_nan_runs_total": "Runs fed a NaN or an Inf, run on the plan of kernels that keep them (nan_handling)",
    "glassrt_arena_bytes": "Arena bytes of the cached plans",
    "glassrt_pool_allocated_bytes": "Run-time buffer pool: bytes handed out and in use",
    "glassrt_pool_reserved_bytes": "Run-time buffer pool: bytes held (in use + free for reuse)",
    "glassrt_pool_peak_allocated_bytes": "Run-time buffer pool: most bytes in use at once",
    "glassrt_pool_fragmentation_ratio": "Pool allocated / reserved bytes (1 when nothing is reserved); low is waste",
}


class _SessionState:
    """The collector of the state gauges: one per registry, reading every session
    instrumented on it at scrape time."""

    def __init__(self):
        self.sessions = {}  # model label -> weakref to the session
        self._lock = threading.Lock()

    def add(self, model, sess):
        with self._lock:
            self.sessions[model] = weakref.ref(sess)

    def describe(self):
        return []  # the series depend on the sessions present; nothing to check at register time

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def gauge(name, labels=()):
            return GaugeMetricFamily(name, METRIC_NAMES[name], labels=["model", *labels])

        def counter(name):
            return CounterMetricFamily(name[:-len("_total")], METRIC_NAMES[name], labels=["model"])

        fallbacks, transfers = gauge("glassrt_fallback_nodes", ["op", "provider"]), \
            gauge("glassrt_transfer_nodes", ["src", "dst"])
        plans, arena = gauge("glassrt_plan_cache_plans"), gauge("glassrt_arena_bytes")
        hits, misses, evictions = (counter("glassrt_plan_cache_hits_total"), counter("glassrt_plan_cache_misses_total"),
                                   counter("glassrt_plan_cache_evictions_total"))
        nan_runs = counter("glassrt_nan_runs_total")
        allocated, reserved = gauge("glassrt_pool_allocated_bytes"), gauge("glassrt_pool_reserved_bytes")
        peak, ratio = gauge("glassrt_pool_peak_allocated_bytes"), gauge("glassrt_pool_fragmentation_ratio")
        with self._lock:
            live = [(m, r()) for m, r in self.sessions.items()]
            for m, sess in live:
                if sess is None:
                    del self.sessions[m]
        for m, sess in live:
            if sess is None:
                continue
            for key, n in _count(sess.fallbacks, lambda f: (f.op, f.provider)).items():
                fallbacks.add_metric([m, *key], n)
            for key, n in _count(sess.transfers, lambda t: (t.src, t.dst)).items():
                transfers.add_metric([m, *key], n)
            try:
                stats = sess.memory_stats()
            except UnsupportedOperatorError:  # a session that cannot run (unsupported="mark") has no plans
                continue
            pool = stats["pool"]
            plans.add_metric([m], stats["plans_cached"])
            hits.add_metric([m], stats["plan_hits"])
            misses.add_metric([m], stats["plans_built"])
            evictions.add_metric([m], stats["plans_evicted"])
            nan_runs.add_metric([m], stats["runs_with_nan"])
            arena.add_metric([m], sum(stats["arena_bytes"].values()))
            allocated.add_metric([m], pool["allocated_bytes"])
            reserved.add_metric([m], pool["reserved_bytes"])
            peak.add_metric([m], pool["peak_allocated_bytes"])
            # Nothing reserved wastes nothing: 1, so that an idle pool never reads as fragmented.
            ratio.add_metric([m], pool["allocated_bytes"] / pool["reserved_bytes"] if pool["reserved_bytes"] else 1.0)
        yield from (fallbacks, transfers, plans, hits, misses, evictions, nan_runs, arena, allocated, reserved, peak,
                    ratio)


def _count(items, key) -> dict:
    out = {}
    for item in items:
        out[key(item)] = out.get(key(item), 0) + 1
    return out


class _Families:
    """The event metrics and the state collector of one registry."""

    def __init__(self, registry):
        from prometheus_client import Counter, Histogram

        def help_of(name):
            return METRIC_NAMES[name]

        self.runs = Counter("glassrt_runs", help_of("glassrt_runs_total"), ["model"], registry=registry)
        self.errors = Counter("glassrt_run_errors", help_of("glassrt_run_errors_total"), ["model", "error"],
                              registry=registry)
        self.latency = Histogram("glassrt_run_duration_seconds", help_of("glassrt_run_duration_seconds"), ["model"],
                                 registry=registry, buckets=RUN_BUCKETS)
        self.node_latency = Histogram("glassrt_node_duration_seconds", help_of("glassrt_node_duration_seconds"),
                                      ["model", "op", "provider"], registry=registry, buckets=NODE_BUCKETS)
        self.profiled = Counter("glassrt_profiled_runs", help_of("glassrt_profiled_runs_total"), ["model"],
                                registry=registry)
        self.state = _SessionState()
        registry.register(self.state)


def _families_of(registry) -> _Families:
    with _lock:
        if registry not in _families:
            _families[registry] = _Families(registry)
        return _families[registry]


class SessionMetrics:
    def __init__(self, sess, model: str = "model", registry=None, profile_every: int = 100):
        try:
            from prometheus_client import REGISTRY
        except ImportError as e:  # an optional dependency: say how to get it
            from ..errors import GlassrtError

            raise GlassrtError("metrics need prometheus-client: pip install 'glassrt[metrics]'") from e
        if profile_every < 0:
            from ..errors import InvalidArgumentError

            raise InvalidArgumentError(f"profile_every must be 0 (never) or a positive number of runs, "
                                       f"got {profile_every}")
        self.registry = registry if registry is not None else REGISTRY
        self.sess, self.model, self.profile_every = sess, model, profile_every
        families = _families_of(self.registry)
        self.runs, self.errors, self.latency = families.runs, families.errors, families.latency
        self.node_latency, self.profiled = families.node_latency, families.profiled
        families.state.add(model, sess)
        self._calls = 0
        self._count_lock = threading.Lock()
        # Touch the labelled series so that a session that has not run yet shows zeros.
        self.runs.labels(model)
        self.latency.labels(model)
        self.profiled.labels(model)

    def observe(self, seconds: float) -> None:
        self.runs.labels(self.model).inc()
        self.latency.labels(self.model).observe(seconds)

    def take_sample(self) -> bool:
        """Whether this run is one of the profiled ones: the first, then every profile_every-th."""
        if not self.profile_every:
            return False
        with self._count_lock:
            n, self._calls = self._calls, self._calls + 1
        return n % self.profile_every == 0

    def observe_nodes(self, steps) -> None:
        """steps: what run_plan(profile=...) records, (step, t0, t1, input shapes, output shapes)."""
        self.profiled.labels(self.model).inc()
        for st, t0, t1, _, _ in steps:
            self.node_latency.labels(self.model, st.node.op_type, st.provider).observe(t1 - t0)


def instrument(sess, model: str = "model", registry=None, profile_every: int = 100) -> SessionMetrics:
    """Wrap sess.run so that every run updates the metrics (and every `profile_every`-th
    run is timed node by node); returns them. The state metrics are read at scrape time."""
    metrics = SessionMetrics(sess, model, registry, profile_every)
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
    from ..runtime.runner import GraphRunner

    runner = getattr(sess, "runner", None)
    if isinstance(runner, GraphRunner):  # not a session that cannot run (unsupported="mark")
        runner_run = runner.run
        # The session's runner takes a profile list per call: the sampled runs pass one.
        @functools.wraps(runner_run)
        def sampled_run(feeds, outer=None, profile=None, into=None):
            if profile is None and metrics.take_sample():
                steps = []
                out = runner_run(feeds, outer, profile=steps, into=into)
                metrics.observe_nodes(steps)
                return out
            return runner_run(feeds, outer, profile=profile, into=into)

        runner.run = sampled_run
    return metrics
