"""Where the time goes: per-node timings over several runs, tables, Chrome trace.

The trace uses onnxruntime's profiler fields (`op_name`, `provider`,
`input_type_shape`, `output_type_shape` in each event's args), so tools that read
onnxruntime profiles read glassrt's; it opens in chrome://tracing and Perfetto.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class NodeRecord:
    run: int
    name: str
    op: str
    provider: str
    kernel: str
    start: float  # seconds, perf_counter clock
    end: float
    inputs: list
    outputs: list

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1e3


@dataclass
class Profile:
    records: list = field(default_factory=list)
    runs: list = field(default_factory=list)  # (start, end) per run

    def add_run(self, steps, start, end):
        run = len(self.runs)
        self.runs.append((start, end))
        for st, t0, t1, ins, outs in steps:
            self.records.append(NodeRecord(run, st.node.name, st.node.op_type, st.provider, st.kernel.name, t0, t1,
                                           ins, outs))

    @property
    def run_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in self.runs]

    def _group(self, key):
        groups = defaultdict(list)
        for r in self.records:
            groups[key(r)].append(r.ms)
        total = sum(self.run_ms) or 1.0
        rows = []
        for k, ms in groups.items():
            rows.append({"key": k, "calls": len(ms), "total_ms": sum(ms), "mean_ms": sum(ms) / len(ms),
                         "percent": 100.0 * sum(ms) / total})
        return sorted(rows, key=lambda r: -r["total_ms"])

    def by_op(self) -> list[dict]:
        return self._group(lambda r: r.op)

    def by_node(self) -> list[dict]:
        return self._group(lambda r: (r.name, r.op, r.provider, r.kernel))

    def latency(self) -> dict:
        ms = sorted(self.run_ms)
        if not ms:
            return {}
        q = lambda p: ms[min(len(ms) - 1, int(round(p * (len(ms) - 1))))]  # noqa: E731
        return {"runs": len(ms), "min_ms": ms[0], "median_ms": statistics.median(ms), "p90_ms": q(0.9),
                "max_ms": ms[-1], "mean_ms": statistics.fmean(ms)}

    def chrome_trace(self) -> list[dict]:
        if not self.runs:
            return []
        origin = self.runs[0][0]
        us = lambda t: round((t - origin) * 1e6, 3)  # noqa: E731
        pid, events = os.getpid(), []
        for i, (a, b) in enumerate(self.runs):
            events.append({"cat": "Session", "name": "model_run", "ph": "X", "pid": pid, "tid": 0, "ts": us(a),
                           "dur": round((b - a) * 1e6, 3), "args": {"run": i}})
        for r in self.records:
            events.append({
                "cat": "Node", "name": r.name, "ph": "X", "pid": pid, "tid": 0, "ts": us(r.start),
                "dur": round((r.end - r.start) * 1e6, 3),
                "args": {"op_name": r.op, "provider": r.provider, "kernel": r.kernel, "run": r.run,
                         "input_type_shape": [{t[0]: t[1]} if t else {} for t in r.inputs],
                         "output_type_shape": [{t[0]: t[1]} if t else {} for t in r.outputs]},
            })
        return events

    def write_trace(self, path) -> str:
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return str(path)


def profile_session(sess, feeds: dict, runs: int = 10, warmup: int = 1, progress=None) -> Profile:
    """Run `runs` timed runs (after `warmup` untimed ones that build the plan)."""
    for _ in range(warmup):
        sess.run(None, feeds)
    prof = Profile()
    checked = sess._check_feeds(feeds)
    for i in range(runs):
        steps = []
        start = time.perf_counter()
        sess.runner.run(checked, profile=steps)
        prof.add_run(steps, start, time.perf_counter())
        if progress:
            progress(i + 1)
    return prof


def render(prof: Profile, console, top: int = 15) -> None:
    from rich.markup import escape
    from rich.table import Table

    lat = prof.latency()
    t = Table(title="per op type", title_justify="left")
    for c in ("op", "calls", "total ms", "mean ms", "% of run"):
        t.add_column(c, justify="left" if c == "op" else "right")
    for r in prof.by_op()[:top]:
        t.add_row(escape(r["key"]), str(r["calls"]), f"{r['total_ms']:.2f}", f"{r['mean_ms']:.3f}", f"{r['percent']:.1f}")
    console.print(t)
    t = Table(title=f"top {top} nodes", title_justify="left")
    for c in ("node", "op", "kernel", "calls", "total ms", "mean ms", "% of run"):
        t.add_column(c, justify="right" if c in ("calls", "total ms", "mean ms", "% of run") else "left")
    for r in prof.by_node()[:top]:
        name, op, provider, kernel = r["key"]
        t.add_row(escape(name), op, escape(kernel), str(r["calls"]), f"{r['total_ms']:.2f}", f"{r['mean_ms']:.3f}", f"{r['percent']:.1f}")
    console.print(t)
    if lat:
        console.print(f"latency over {lat['runs']} runs: min {lat['min_ms']:.2f} ms, median {lat['median_ms']:.2f} ms, "
                      f"p90 {lat['p90_ms']:.2f} ms, max {lat['max_ms']:.2f} ms", highlight=False)
        covered = sum(r.ms for r in prof.records) / max(sum(prof.run_ms), 1e-9) * 100
        console.print(f"time inside kernels: {covered:.1f}% of the run (the rest is the runtime's own overhead)",
                      highlight=False)
