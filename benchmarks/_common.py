"""Shared helpers: onnxruntime sessions with the same thread count, timing, RSS."""
from __future__ import annotations

import os
import statistics
import time


def ort_session(model_bytes: bytes, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def median_ms(fn, runs: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def alternating_medians(g, o, feeds, runs: int, block: int = 4, pause: float = 0.25) -> tuple[float, float]:
    """Median ms of glassrt session g and onnxruntime session o, run in alternating blocks
    after two warm-up runs each. The first run of every block is dropped and each block
    starts after a pause: the other runtime's idle worker threads (onnxruntime's pool,
    OpenBLAS's) spin for up to ~0.1 s after a run and would steal this one's cores."""
    for _ in range(2):  # plan building, compilation, onnxruntime's first-run allocations
        g.run(None, feeds)
        o.run(None, feeds)
    tg, to = [], []
    for _ in range(max(1, runs // (block - 1))):
        for sess, acc in ((g, tg), (o, to)):
            time.sleep(pause)
            for k in range(block):
                t0 = time.perf_counter()
                sess.run(None, feeds)
                if k:
                    acc.append(time.perf_counter() - t0)
    return statistics.median(tg) * 1e3, statistics.median(to) * 1e3
