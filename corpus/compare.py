"""Run every model in the corpus cache through glassrt and onnxruntime and compare them.

    python -m corpus.compare [--only ID ...] [--runs 5] [--threads 1] [--json FILE] [--markdown FILE]
    python -m corpus.compare --bisect ID      # the first intermediate value that differs

Both runtimes get the same inputs (made from the manifest's hints, seeded per model and
input) and the same intra-op thread count. Each model runs in a process of its own, one
after the other, so that one model's compiled kernels, thread pools or crash do not reach
the next, and session creation + first run is measured from a cold start of that model.

A model passes when every output agrees within the manifest's rtol/atol (float32 end to
end: |glassrt - ort| <= atol + rtol * |ort|, NaN equal to NaN) and integer outputs are
equal; it differs when an output does not; it fails when glassrt raises (the error's type,
the node it names and its message are recorded). Latency: session creation and the first
run (Numba's on-disk cache warm) of each runtime, then `runs` runs of each, alternating,
and the ratio of their medians (glassrt / onnxruntime; below 1 is faster).
"""
from __future__ import annotations

import argparse
from dataclasses import replace
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
import warnings
import zlib
from pathlib import Path

import numpy as np

from .fetch import cache_dir, model_path, present
from .manifest import MODELS, Feed, Model

BY_ID = {m.id: m for m in MODELS}


# --- inputs --------------------------------------------------------------------------------

def _declared_inputs(model_proto):
    inits = {i.name for i in model_proto.graph.initializer}
    return [vi for vi in model_proto.graph.input if vi.name not in inits]


def make_feeds(m: Model, model_proto) -> dict:
    """One value per graph input, from the manifest's hints; the same values every time."""
    from onnx import helper

    feeds = {}
    for vi in _declared_inputs(model_proto):
        spec: Feed = m.feeds.get(vi.name, Feed())
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise ValueError(f"{m.id}: input '{vi.name}' is not a tensor; the corpus makes only tensors")
        dtype = np.dtype(spec.dtype) if spec.dtype else np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if spec.shape is not None:
            shape = tuple(spec.shape)
        else:
            shape = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    shape.append(d.dim_value)
                elif d.HasField("dim_param") and d.dim_param in m.dims:
                    shape.append(m.dims[d.dim_param])
                else:
                    what = f"dim '{d.dim_param}'" if d.HasField("dim_param") else "a dim with no name and no value"
                    raise ValueError(f"{m.id}: input '{vi.name}' has {what}: give it in the manifest "
                                     f"(dims= or a Feed shape)")
            shape = tuple(shape)
        rng = np.random.default_rng(zlib.crc32(f"{m.id}/{vi.name}".encode()))
        if spec.kind == "uniform":
            value = rng.uniform(spec.low, spec.high, shape)
        elif spec.kind == "int":
            value = rng.integers(int(spec.low), int(spec.high), shape, endpoint=True)
        elif spec.kind == "zeros":
            value = np.zeros(shape)
        elif spec.kind == "const":
            value = np.full(shape, spec.value)
        else:
            raise ValueError(f"{m.id}: input '{vi.name}': unknown Feed kind {spec.kind!r}")
        feeds[vi.name] = np.asarray(value).astype(dtype)
    return feeds


# --- comparing outputs ---------------------------------------------------------------------

def _leaves(value, path=""):
    """(path, ndarray) pairs: a tensor is one leaf, a sequence of maps (ZipMap) one per key."""
    if isinstance(value, np.ndarray) or np.isscalar(value):
        yield path, np.asarray(value)
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            yield from _leaves(value[k], f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        if value and all(isinstance(v, dict) for v in value):  # ZipMap: one array per key
            keys = sorted(value[0], key=str)
            for k in keys:
                yield f"{path}[*][{k!r}]", np.array([v.get(k, np.nan) for v in value])
            yield f"{path}[*].keys", np.array([sorted(map(str, v)) == sorted(map(str, keys)) for v in value])
        else:
            for i, v in enumerate(value):
                yield from _leaves(v, f"{path}[{i}]")
    else:
        raise TypeError(f"cannot compare a {type(value).__name__}")


def compare_outputs(names, got, want, rtol, atol) -> dict:
    """Max abs and rel differences over all outputs, and the first output out of tolerance."""
    worst = {"max_abs": 0.0, "max_rel": 0.0, "tol_used": 0.0, "compared": 0, "mismatch": None}
    for name, a_val, b_val in zip(names, got, want):
        a_leaves, b_leaves = dict(_leaves(a_val, name)), dict(_leaves(b_val, name))
        if a_leaves.keys() != b_leaves.keys():
            worst["mismatch"] = worst["mismatch"] or (f"{name}: structure differs "
                                                      f"({sorted(a_leaves)[:4]} vs {sorted(b_leaves)[:4]})")
            continue
        for leaf, a in a_leaves.items():
            b = b_leaves[leaf]
            worst["compared"] += int(b.size)
            if a.shape != b.shape:
                worst["mismatch"] = worst["mismatch"] or f"{leaf}: shape {a.shape} vs onnxruntime's {b.shape}"
                continue
            if a.dtype != b.dtype:
                worst["mismatch"] = worst["mismatch"] or f"{leaf}: dtype {a.dtype} vs onnxruntime's {b.dtype}"
                continue
            if a.dtype.kind not in "fc":
                if not np.array_equal(a, b):
                    n = int(np.sum(a != b))
                    worst["mismatch"] = worst["mismatch"] or f"{leaf}: {n} of {a.size} values differ"
                    worst["tol_used"] = max(worst["tol_used"], float("inf"))
                continue
            x, y = a.astype(np.float64), b.astype(np.float64)
            both_nan = np.isnan(x) & np.isnan(y)
            same = (x == y) | both_nan
            diff = np.where(same, 0.0, np.abs(x - y))
            diff = np.where(np.isnan(diff), np.inf, diff)       # NaN on one side only
            if diff.size:
                mag = np.where(np.isnan(y), 0.0, np.abs(y))       # NaN met NaN: diff 0 above
                rel = diff / np.maximum(mag, atol)
                used = diff / (atol + rtol * mag)
                worst["max_abs"] = max(worst["max_abs"], float(diff.max()))
                worst["max_rel"] = max(worst["max_rel"], float(rel.max()))
                worst["tol_used"] = max(worst["tol_used"], float(used.max()))
                if used.max() > 1:
                    i = np.unravel_index(int(np.argmax(used)), used.shape)
                    worst["mismatch"] = worst["mismatch"] or (
                        f"{leaf}: {int((used > 1).sum())} of {used.size} values out of tolerance, worst at "
                        f"{tuple(int(v) for v in i)}: glassrt {x[i]!r} vs onnxruntime {y[i]!r}")
    return worst


# --- one model -----------------------------------------------------------------------------

_NODE = re.compile(r"(\w+) node '([^']*)'")


def _error_info(e: BaseException) -> dict:
    msg = str(e)
    found = _NODE.search(msg)
    return {"error_type": type(e).__name__, "error": msg.splitlines()[0][:400] if msg else repr(e),
            "error_full": msg[:4000], "op": found.group(1) if found else None,
            "node": found.group(2) if found else None}


WARMUP = 20  # untimed runs per runtime before the timed ones (see compare_model)


def compare_model(m: Model, path=None, runs: int = 5, threads: int = 1, warmup: int = WARMUP) -> dict:
    """Everything about one model: status, differences, timings, glassrt's error if any.
    threads: intra-op threads of both runtimes; 0 leaves glassrt's process-wide setting
    alone and gives onnxruntime one. The latencies are medians of `runs` runs of each
    runtime back to back, after `warmup` untimed runs of each: a plan replayed 16 times is
    compiled to straight-line code (runtime/plan.STRAIGHT_AFTER), and runs alternating one
    by one each found the other's weights in the caches (timed that way from the first run,
    the wake-word and VAD models read 1.3-2.8x, against 1.1-1.9x each alone in a process)."""
    import onnx
    import onnxruntime as ort

    import glassrt

    path = str(path or model_path(m))
    r = {"id": m.id, "package": m.package, "version": m.version, "kind": m.kind, "what": m.what,
         "quantized": m.quantized, "rtol": m.rtol, "atol": m.atol, "threads": threads, "runs": runs}
    proto = onnx.load(path)
    feeds = make_feeds(m, proto)
    r["inputs"] = {k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()}

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = max(threads, 1), 1
    t0 = time.perf_counter()
    osess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    names = [o.name for o in osess.get_outputs()]
    want = osess.run(names, feeds)
    t2 = time.perf_counter()
    r["ort_create_s"], r["ort_first_s"] = t1 - t0, t2 - t1

    stage = "session creation"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            # threads=0 leaves glassrt's process-wide BLAS/Numba setting alone (the tests)
            gsess = glassrt.InferenceSession(path, glassrt.SessionOptions(intra_op_num_threads=threads))
            t1 = time.perf_counter()
            stage = "first run"
            got = gsess.run(names, feeds)
            t2 = time.perf_counter()
        r["glassrt_create_s"], r["glassrt_first_s"] = t1 - t0, t2 - t1
        r["fallbacks"] = [str(f) for f in gsess.fallbacks]
        r["warnings"] = sorted({str(w.message).splitlines()[0][:200] for w in caught
                                if not issubclass(w.category, glassrt.FallbackWarning)})[:5]
    except Exception as e:  # noqa: BLE001 - the failure is the result
        r.update(status="fails", stage=stage, **_error_info(e), traceback=traceback.format_exc()[-3000:])
        return r

    diff = compare_outputs(names, got, want, m.rtol, m.atol)
    r.update(diff)
    r["status"] = "differs" if diff["mismatch"] else "passes"

    if runs:
        g_times = _timed(lambda: gsess.run(names, feeds), runs, warmup)
        o_times = _timed(lambda: osess.run(names, feeds), runs, warmup)
        r["glassrt_ms"] = 1e3 * statistics.median(g_times)
        r["ort_ms"] = 1e3 * statistics.median(o_times)
        r["ratio"] = r["glassrt_ms"] / r["ort_ms"] if r["ort_ms"] > 0 else None
    return r


# The factors the manifest's dims are scaled by in `compare_varying`: after three distinct
# shapes a session serves the others on one plan with those dims symbolic (runtime/runner.py)
VARY_FACTORS = (1, 2, 1.5, 3, 1.25, 2.5, 0.75, 2)


def varied_dims(dims: dict, factor: float) -> dict:
    """The manifest's dims scaled by `factor` (a multiple of 8 stays one: image widths)."""
    def one(v):
        step = 8 if v % 8 == 0 else 1
        return max(step, round(v * factor / step) * step)
    return {k: one(v) for k, v in dims.items()}


def compare_varying(m: Model, path=None, factors=VARY_FACTORS) -> dict:
    """The model served at varying shapes in one glassrt session: its symbolic dims (the
    manifest's `dims`) scaled by each factor in turn, every answer against onnxruntime's at
    the manifest's tolerances. Shapes onnxruntime refuses are skipped. (A rougher run of this
    kind found onednn's any-shape products called without an output in magika's shared
    plan, stop 62.)"""
    import onnx
    import onnxruntime as ort

    import glassrt
    from glassrt.runtime.runner import ShapePattern

    path = str(path or model_path(m))
    r = {"id": m.id, "shapes": 0, "agree": 0, "differ": [], "errors": [], "ort_refused": 0, "shared_plan": False}
    if not m.dims:
        r["skipped"] = "no symbolic dims in the manifest"
        return r
    proto = onnx.load(path)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    osess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in osess.get_outputs()]
    gsess = glassrt.InferenceSession(path, fallback="silent")
    for f in factors:
        dims = varied_dims(m.dims, f)
        feeds = make_feeds(replace(m, dims=dims), proto)
        try:
            want = osess.run(names, feeds)
        except Exception:  # noqa: BLE001 - a shape the model does not take
            r["ort_refused"] += 1
            continue
        r["shapes"] += 1
        try:
            got = gsess.run(names, feeds)
        except Exception as e:  # noqa: BLE001 - the failure is the result
            r["errors"].append(f"{dims}: {_error_info(e)['error']}")
            continue
        diff = compare_outputs(names, got, want, m.rtol, m.atol)
        if diff["mismatch"]:
            r["differ"].append(f"{dims}: {diff['mismatch']}")
        else:
            r["agree"] += 1
    r["shared_plan"] = any(isinstance(k, ShapePattern) for k in gsess.runner.plans)
    return r


def _timed(run, runs: int, warmup: int) -> list:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


# --- bisecting a difference ----------------------------------------------------------------

def bisect(m: Model, path=None, threads: int = 1, top: int = 8) -> list[dict]:
    """Intermediate values of the main graph, in glassrt's execution order, that differ
    from onnxruntime's beyond the model's tolerance: the first is where to look. Values
    inside If/Loop bodies are not seen (their node's outputs are)."""
    import onnx
    import onnxruntime as ort

    import glassrt
    from glassrt.tools.compare import all_values

    path = str(path or model_path(m))
    proto = onnx.load(path)
    feeds = make_feeds(m, proto)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gsess = glassrt.InferenceSession(path, glassrt.SessionOptions(intra_op_num_threads=threads))
    env, steps = all_values(gsess, feeds)
    produced = {o for n in proto.graph.node for o in n.output if o}
    wanted = [o for st in steps for o in st.node.outputs if o in produced and isinstance(env.get(o), np.ndarray)]
    have = {o.name for o in proto.graph.output}
    for name in wanted:
        if name not in have:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every value
    osess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = dict(zip([o.name for o in osess.get_outputs()], osess.run(None, feeds)))
    op_of = {o: (st.node.op_type, st.node.name, st.kernel.name) for st in steps for o in st.node.outputs if o}
    found = []
    for name in wanted:
        if name not in outs:
            continue
        d = compare_outputs([name], [env[name]], [outs[name]], m.rtol, m.atol)
        if d["mismatch"]:
            op, node, kernel = op_of[name]
            found.append({"value": name, "op": op, "node": node, "kernel": kernel, "max_abs": d["max_abs"],
                          "max_rel": d["max_rel"], "detail": d["mismatch"]})
            if len(found) >= top:
                break
    return found


# --- the CLI -------------------------------------------------------------------------------

def _worker(model_id: str, runs: int, threads: int, warmup: int) -> int:
    m = BY_ID[model_id]
    try:
        r = compare_model(m, runs=runs, threads=threads, warmup=warmup)
    except Exception as e:  # noqa: BLE001 - e.g. onnxruntime itself refused the model
        r = {"id": m.id, "package": m.package, "version": m.version, "kind": m.kind, "status": "error",
             **_error_info(e), "traceback": traceback.format_exc()[-3000:]}
    print("@@RESULT@@" + json.dumps(r, default=float))
    return 0


def run_isolated(m: Model, runs: int, threads: int, timeout: float, warmup: int = WARMUP) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "corpus.compare", "--worker", m.id, "--runs", str(runs), "--threads", str(threads),
           "--warmup", str(warmup)]
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return {"id": m.id, "package": m.package, "version": m.version, "kind": m.kind, "status": "fails",
                "error_type": "Timeout", "error": f"no result within {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@"):])
    tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
    return {"id": m.id, "package": m.package, "version": m.version, "kind": m.kind, "status": "fails",
            "error_type": f"exit {done.returncode}", "error": " | ".join(tail)[:400]}


def _fmt(v, spec):
    return "" if v is None else format(v, spec)


def _ms(v):
    """Milliseconds to three significant digits (a wake-word model's 0.0412, a detector's 27.4)."""
    return "" if v is None else (f"{v:.0f}" if v >= 99.95 else f"{v:#.3g}")


def markdown(results: list[dict]) -> str:
    lines = ["| model | package | kind | result | max abs diff | max rel diff | glassrt / ort latency "
             "| create + first run, glassrt vs ort |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for r in results:
        status = r["status"]
        if status == "fails":
            status = f"fails: {r.get('error_type')}" + (f" at {r['op']} '{r['node']}'" if r.get("node") else "")
        kind = r["kind"] + (", int8" if r.get("quantized") else "")
        first = (f"{r['glassrt_create_s'] + r['glassrt_first_s']:.2f} s vs {r['ort_create_s'] + r['ort_first_s']:.2f} s"
                 if "glassrt_first_s" in r else "")
        lines.append(f"| {r['id']} | {r['package']}=={r['version']} | {kind} | {status} | "
                     f"{_fmt(r.get('max_abs'), '.2g')} | {_fmt(r.get('max_rel'), '.2g')} | "
                     f"{_fmt(r.get('ratio'), '.2f')}{'x' if r.get('ratio') else ''} | {first} |")
    return "\n".join(lines) + "\n"


def table(results: list[dict]):
    from rich.table import Table

    t = Table(title="glassrt vs onnxruntime on the corpus")
    for col, just in (("model", "left"), ("kind", "left"), ("result", "left"), ("max abs", "right"),
                      ("max rel", "right"), ("glassrt ms", "right"), ("ort ms", "right"), ("ratio", "right"),
                      ("create+first g/o s", "right")):
        t.add_column(col, justify=just, no_wrap=col in ("model", "ratio"))
    style = {"passes": "green", "differs": "yellow", "fails": "red", "error": "magenta"}
    for r in results:
        first = (f"{r['glassrt_create_s'] + r['glassrt_first_s']:.2f}/{r['ort_create_s'] + r['ort_first_s']:.2f}"
                 if "glassrt_first_s" in r else "")
        result = r["status"] if r["status"] != "fails" else f"fails ({r.get('error_type')})"
        t.add_row(r["id"], r["kind"] + (" int8" if r.get("quantized") else ""),
                  f"[{style.get(r['status'], '')}]{result}[/]", _fmt(r.get("max_abs"), ".2g"),
                  _fmt(r.get("max_rel"), ".2g"), _ms(r.get("glassrt_ms")), _ms(r.get("ort_ms")),
                  _fmt(r.get("ratio"), ".2f"), first)
    return t


def _vary(models, console) -> int:
    from rich.table import Table

    t = Table(title="Served at varying shapes, one session each (compare_varying)")
    for col in ("model", "shapes", "agree", "differ", "errors", "onnxruntime refused", "shared plan", "first problem"):
        t.add_column(col)
    bad = 0
    with console.status("") as status:
        for m in models:
            status.update(m.id)
            r = compare_varying(m)
            problems = r["errors"] + r["differ"]
            bad += bool(problems)
            t.add_row(m.id, str(r["shapes"]), str(r["agree"]), str(len(r["differ"])), str(len(r["errors"])),
                      str(r["ort_refused"]), "yes" if r["shared_plan"] else r.get("skipped", "no"),
                      problems[0][:120] if problems else "")
    console.print(t)
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m corpus.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", default=(), metavar="ID", help="Compare only these models.")
    ap.add_argument("--runs", type=int, default=5, help="Timed runs per runtime (default 5), back to back.")
    ap.add_argument("--warmup", type=int, default=WARMUP,
                    help=f"Untimed runs per runtime before them, after the first (default {WARMUP}).")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra_op_num_threads for both (default 1). Both runtimes share one process here, so "
                         "above 1 onnxruntime's idle threads spin against glassrt's: time more threads with "
                         "`glassrt bench --vs onnxruntime` (a process each).")
    ap.add_argument("--timeout", type=float, default=600, help="Seconds per model (default 600).")
    ap.add_argument("--json", dest="json_file", help="Write every result (default: CACHE/results.json).")
    ap.add_argument("--markdown", help="Write the results table (default: CACHE/results.md).")
    ap.add_argument("--bisect", metavar="ID", help="List the first intermediate values that differ, for one model.")
    ap.add_argument("--vary", action="store_true",
                    help="Serve each model with symbolic dims at varying shapes in one session (its plan shared "
                         "by shapes), each answer against onnxruntime's; no timing.")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args.worker, args.runs, args.threads, args.warmup)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.bisect:
        m = BY_ID[args.bisect]
        for row in bisect(m, threads=args.threads):
            console.print(f"{row['op']} '{row['node']}' [{row['kernel']}] -> {row['value']}: "
                          f"max abs {row['max_abs']:.3g}, rel {row['max_rel']:.3g}; {row['detail']}")
        return 0
    unknown = sorted(set(args.only) - set(BY_ID))
    if unknown:
        ap.error(f"unknown model id(s): {', '.join(unknown)}")
    models = [m for m in present() if not args.only or m.id in args.only]
    if not models:
        console.print(f"no corpus models in {cache_dir() / 'models'}: run python -m corpus.fetch first")
        return 1
    if args.vary:
        return _vary(models, console)
    if args.threads > 1:
        # (measured, rapidocr-det at 2 threads: glassrt 39-56 ms here against 16.7-17.8 alone,
        # onnxruntime 17.4-18.7)
        console.print(f"[yellow]note:[/] with {args.threads} threads the latency ratios are not to be trusted: both "
                      "runtimes run in one process and onnxruntime's idle threads spin against glassrt's; "
                      "`glassrt bench MODEL --vs onnxruntime` times each in a process of its own")
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("", total=len(models))
        for m in models:
            bar.update(task, description=m.id)
            r = run_isolated(m, args.runs, args.threads, args.timeout, args.warmup)
            results.append(r)
            if r["status"] in ("fails", "error", "differs"):
                bar.console.print(f"[bold]{m.id}[/bold] {r['status']}: {r.get('error') or r.get('mismatch')}")
            bar.advance(task)
    console.print(table(results))
    counts = {s: sum(r["status"] == s for r in results) for s in ("passes", "differs", "fails", "error")}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    ratios = [r["ratio"] for r in results if r.get("ratio")]
    if ratios:
        console.print(f"geometric mean latency ratio glassrt/onnxruntime: {np.exp(np.mean(np.log(ratios))):.2f}x "
                      f"over {len(ratios)} models ({args.threads} thread(s), median of {args.runs} runs after "
                      f"{args.warmup} untimed)")
    json_file = Path(args.json_file) if args.json_file else cache_dir() / "results.json"
    md_file = Path(args.markdown) if args.markdown else cache_dir() / "results.md"
    json_file.write_text(json.dumps(results, indent=1, default=float))
    md_file.write_text(markdown(results))
    console.print(f"results: {json_file}, {md_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
