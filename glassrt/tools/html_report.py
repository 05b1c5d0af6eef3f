"""`glassrt profile MODEL --html report.html`: the profile and the explain report as one
self-contained page (inline CSS, JS and SVG; nothing loaded from the network).

Four pictures: time per op type (bars), one run's nodes on a time axis (a lane per op
type), the memory arena as occupancy over the plan's steps (x = step, y = offset, one
rectangle per value from the step that writes it to the last that reads it: the memory
plan as a picture), and the explain table. The geometry is computed here; the template
(templates/report.html.j2) only writes it out. Every string from the model (node, value
and op names, reasons) is data: Jinja2 escapes it in text and attributes, and the page's
script shows tooltips through textContent, never as markup.
"""
from __future__ import annotations

import math
from importlib.metadata import version

from .. import symbolic
from ..errors import GlassrtError
from ..ir import TensorType
from .explain import explain, fmt_bytes, fmt_flops

# Distinct on white and for the common kinds of colour blindness (Okabe-Ito, then Tableau).
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#4E79A7", "#F28E2B",
           "#59A14F", "#B07AA1", "#76B7B2", "#EDC948", "#FF9DA7", "#9C755F"]
OTHER = "#BAB0AC"

WIDTH = 1100          # SVG user units; the page scales them to its width
LABEL_W = 150         # the timeline's lane labels
LANE_H = 22
ARENA_H = 360


class ReportError(GlassrtError):
    """The HTML report cannot be written (Jinja2 missing, nothing was profiled)."""


def _tint(color: str, k: int) -> str:
    """The k-th of three shades of `color` (mixed with white): neighbouring values written
    by the same op type stay told apart in the arena picture."""
    t = (0.0, 0.22, 0.4)[k % 3]
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * t):02x}" for c in (r, g, b))


def _colors(ops_by_time: list) -> dict:
    return {op: PALETTE[k] if k < len(PALETTE) else OTHER for k, op in enumerate(ops_by_time)}


def _nice_step(span: float, ticks: int = 8) -> float:
    """A round tick spacing (1, 2 or 5 times a power of ten) giving about `ticks` ticks."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _dims_from_feeds(sess, feeds: dict) -> dict:
    """The symbolic input dims bound to the sizes of the profiled feeds, so that explain
    shows the plan the profile ran."""
    dims = {}
    for vi in sess._inputs:
        t, v = vi.type, feeds.get(vi.name)
        if isinstance(t, TensorType) and t.shape is not None and hasattr(v, "shape") and len(v.shape) == len(t.shape):
            for d, n in zip(t.shape, v.shape):
                if not isinstance(d, int) and len(symbolic.free_names(d)) == 1 and str(d) in symbolic.free_names(d):
                    dims[str(d)] = int(n)
    return dims


def _median_run(prof) -> int:
    order = sorted(range(len(prof.runs)), key=lambda k: prof.run_ms[k])
    return order[len(order) // 2]


def _op_bars(prof, colors) -> list:
    runs = max(len(prof.runs), 1)
    rows = prof.by_op()
    top = max((r["total_ms"] for r in rows), default=1.0) or 1.0
    return [{"op": r["key"], "calls": r["calls"] // runs, "ms_per_run": r["total_ms"] / runs,
             "mean_ms": r["mean_ms"], "percent": r["percent"], "width": round(100 * r["total_ms"] / top, 2),
             "color": colors.get(r["key"], OTHER)} for r in rows]


def _timeline(prof, colors, run: int) -> dict:
    start, end = prof.runs[run]
    span_ms = max((end - start) * 1e3, 1e-6)
    lanes = list(colors)
    records = [r for r in prof.records if r.run == run]
    scale = (WIDTH - LABEL_W) / span_ms
    nodes = []
    for r in records:
        t0 = (r.start - start) * 1e3
        nodes.append({"x": round(LABEL_W + t0 * scale, 2), "y": lanes.index(r.op) * LANE_H + 3,
                      "w": round(max(r.ms * scale, 0.6), 2), "h": LANE_H - 6, "color": colors[r.op], "op": r.op,
                      "tip": f"{r.name}\n{r.op} on {r.provider}: {r.kernel}\n{r.ms:.3f} ms, from {t0:.3f} ms"})
    step = _nice_step(span_ms)
    ticks = [{"x": round(LABEL_W + k * step * scale, 2), "label": f"{k * step:g} ms"}
             for k in range(int(span_ms / step) + 1)]
    inside = sum(r.ms for r in records)
    return {"run": run, "ms": span_ms, "nodes": nodes, "ticks": ticks, "height": len(lanes) * LANE_H,
            "lanes": [{"op": op, "y": k * LANE_H, "color": colors[op]} for k, op in enumerate(lanes)],
            "kernel_percent": 100 * inside / span_ms}


def _arena(report, colors) -> dict:
    """One rectangle per value with an arena offset (arena, in-place and workspace values)."""
    producer = {}
    for n in report["nodes"]:
        if n.get("step") is not None:
            producer[n["step"]] = n
    steps = max([n["step"] for n in report["nodes"] if n.get("step") is not None], default=-1) + 1
    arena = report["summary"].get("arena_bytes") or 0
    placed = [v for v in report["values"] if v["offset"] is not None]
    if not steps or not arena or not placed:
        return {"values": [], "steps": steps, "bytes": arena, "ticks_x": [], "ticks_y": [], "height": ARENA_H}
    sx, sy = (WIDTH - 70) / steps, ARENA_H / arena
    rects = []
    for k, v in enumerate(sorted(placed, key=lambda v: (v["first_step"], v["offset"]))):
        node = producer.get(v["first_step"], {})
        op = node.get("op", "?")
        what = {"workspace": "scratch of", "inplace": f"in place of '{v['shares_with']}', written by"}.get(
            v["kind"], "written by")
        rects.append({
            "x": round(70 + v["first_step"] * sx, 2),
            "w": round(max((v["last_step"] - v["first_step"] + 1) * sx, 1), 2),
            "y": round(v["offset"] * sy, 2), "h": round(max(v["bytes"] * sy, 1), 2), "kind": v["kind"],
            "color": _tint(colors.get(op, OTHER), k), "op": op,
            "tip": f"{v['name']}\n{fmt_bytes(v['bytes'])} ({v['bytes']:,} B) at offset {v['offset']:,}\n"
                   f"{what} {node.get('name', '?')} ({op})\nlive at steps {v['first_step']}..{v['last_step']}"
                   + (f", {v['layout']}" if v.get("layout") else "")})
    xstep = max(1, int(_nice_step(steps, 10)))
    ystep = _nice_step(arena / 2**20, 6) * 2**20
    return {"values": rects, "steps": steps, "bytes": arena, "height": ARENA_H,
            "ticks_x": [{"x": round(70 + k * sx, 2), "label": str(k)} for k in range(0, steps + 1, xstep)],
            "ticks_y": [{"y": round(k * ystep * sy, 2), "label": f"{k * ystep / 2**20:g} MiB"}
                        for k in range(int(arena / ystep) + 1)]}


def _table(report) -> list:
    values = {v["name"]: v for v in report["values"]}
    rows, k = [], 0
    for n in report["nodes"]:
        outs = []
        for o in n["outputs"]:
            shape = "?" if o["shape"] is None else "[" + ",".join(map(str, o["shape"])) + "]"
            v = values.get(o["name"], {})
            where = "" if not v else (f"@{v['offset']:,}" if v["offset"] is not None else v["kind"])
            outs.append({"name": o["name"], "type": f"{o['dtype'] or ''}{shape}", "where": where,
                         "bytes": fmt_bytes(v.get("bytes")) if v else "",
                         "life": f"{v['first_step']}..{v['last_step']}" if v else ""})
        depth = n.get("depth") or 0
        rows.append({"index": "" if depth else k, "depth": depth, "name": n["name"], "op": n["op"],
                     "provider": n["provider"] or "none", "kernel": n["kernel"] or "", "reason": n["reason"] or "",
                     "outputs": outs, "flops": fmt_flops(n["flops"]) if n.get("flops") else "",
                     "state": "unsupported" if n.get("unsupported") else "fallback" if n["fallback"] else ""})
        k += 0 if depth else 1
    return rows


def report_data(sess, prof, feeds: dict, title: str) -> dict:
    """Everything the page shows, geometry included (plain data: the template adds no logic)."""
    if not prof.runs:
        raise ReportError("no profiled run to report (profile with --runs 1 or more)")
    report = explain(sess, _dims_from_feeds(sess, feeds))
    ops_by_time = [r["key"] for r in prof.by_op()]
    ops_by_time += sorted({n["op"] for n in report["nodes"]} - set(ops_by_time))
    colors = _colors(ops_by_time)
    lat, s = prof.latency(), report["summary"]
    run = _median_run(prof)
    timeline = _timeline(prof, {op: colors[op] for op in ops_by_time if any(r.op == op for r in prof.records)}, run)
    arena = _arena(report, colors)
    cards = [("median latency", f"{lat['median_ms']:.2f} ms", f"p90 {lat['p90_ms']:.2f} ms over {lat['runs']} runs"),
             ("nodes", str(s["nodes"]), ", ".join(f"{p} {c}" for p, c in s["nodes_per_provider"].items())),
             ("fallbacks", str(s["fallback_count"]), "nodes on a slower provider than asked"),
             ("arena", fmt_bytes(s.get("arena_bytes")),
              f"lower bound {fmt_bytes(s.get('lower_bound_bytes'))}, naive {fmt_bytes(s.get('naive_bytes'))}"),
             ("FLOPs", fmt_flops(s["flops"]), f"{len(prof.records) // len(prof.runs)} kernels per run"),
             ("in kernels", f"{timeline['kernel_percent']:.0f}%", "of the median run; the rest is the runtime's own")]
    return {
        "title": title, "version": version("glassrt"), "cards": cards, "bars": _op_bars(prof, colors),
        "timeline": timeline, "arena": arena, "rows": _table(report), "passes": report["passes"],
        "fallbacks": s["fallbacks"], "notes": s["notes"], "width": WIDTH, "label_w": LABEL_W,
        "arena_values": len(arena["values"]), "legend": [{"op": op, "color": c} for op, c in colors.items()
                                                        if c != OTHER],
        "lower_bound": s.get("lower_bound_bytes"), "ratio": s.get("arena_over_lower_bound"),
    }


def render_html(data: dict) -> str:
    try:
        import jinja2
    except ImportError as e:
        raise ReportError("glassrt profile --html needs Jinja2: pip install 'glassrt[report]'") from e
    env = jinja2.Environment(loader=jinja2.PackageLoader("glassrt.tools", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template("report.html.j2").render(**data)


def write_html(sess, prof, feeds: dict, path, title: str) -> dict:
    """Write the page to `path`; returns its data (what a caller may want to say or check)."""
    data = report_data(sess, prof, feeds, title)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(data))
    return data
