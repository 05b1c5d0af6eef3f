"""The server's own Prometheus metrics, on the registry the app is given (beside every
loaded session's metrics, glassrt.tools.metrics, on the same registry).

`model` and `version` label what the request asked for when the server has it, else ""
(an unknown name must not become a new series: a client could grow memory without bound).
"""
from __future__ import annotations

from prometheus_client import Counter, Histogram

# name (as exposed, histograms by their base name) -> help; the README lists the same.
SERVER_METRIC_NAMES = {
    "glassrt_server_requests_total": "Inference requests answered, by model, version and HTTP status",
    "glassrt_server_request_duration_seconds": "Inference request latency, body read to response, by model, "
                                               "version and HTTP status (histogram)",
    "glassrt_server_queue_duration_seconds": "Time a request waited before its run started (histogram)",
    "glassrt_server_batch_size": "Rows per run: requests stacked by the dynamic batcher (histogram)",
}

LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    def __init__(self, registry):
        labels = ["model", "version"]
        self.requests = Counter("glassrt_server_requests", SERVER_METRIC_NAMES["glassrt_server_requests_total"],
                                labels + ["status"], registry=registry)
        self.latency = Histogram("glassrt_server_request_duration_seconds",
                                 SERVER_METRIC_NAMES["glassrt_server_request_duration_seconds"],
                                 labels + ["status"], buckets=LATENCY_BUCKETS, registry=registry)
        self.queue = Histogram("glassrt_server_queue_duration_seconds",
                               SERVER_METRIC_NAMES["glassrt_server_queue_duration_seconds"], labels,
                               buckets=LATENCY_BUCKETS, registry=registry)
        self.batch = Histogram("glassrt_server_batch_size", SERVER_METRIC_NAMES["glassrt_server_batch_size"], labels,
                               buckets=BATCH_BUCKETS, registry=registry)

    def request(self, model: str, version: str, status: int, seconds: float) -> None:
        self.requests.labels(model, version, str(status)).inc()
        self.latency.labels(model, version, str(status)).observe(seconds)

    def run(self, model: str, version: str, rows: int, queued: list) -> None:
        self.batch.labels(model, version).observe(rows)
        for q in queued:
            self.queue.labels(model, version).observe(q)
