"""Where the time goes: `glassrt profile` and `sess.profile()` — timed runs, tables.

The per-node record and its Chrome trace are runtime/profiling.py's `Profile`.
"""
from __future__ import annotations

import time

from ..runtime.profiling import NodeRecord, Profile  # noqa: F401  (re-exported)


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
