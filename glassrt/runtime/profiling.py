"""Per-node timings of runs, as the plan records them (`run_plan(..., profile=...)`).

A plain record of what ran, where and for how long, with a Chrome trace in onnxruntime's
profiler fields (`op_name`, `provider`, `input_type_shape`, `output_type_shape`), so tools
that read onnxruntime profiles read glassrt's; it opens in chrome://tracing and Perfetto.
The tables and `glassrt profile` are in tools/profile.py.
"""
from __future__ import annotations

import json
import os
import statistics
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
