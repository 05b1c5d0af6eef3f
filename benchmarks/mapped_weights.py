"""Mapped weights and optimized files, glassrt against onnxruntime, each measurement in a
fresh process (so that peak RSS is one session's, not the sum of all before it).

1. memory: a BERT-shaped encoder (hidden 768, 3 layers, a 1000-token vocabulary: ~90 MB of
   weights) written with glassrt's aligned external data (`glassrt optimize --level none
   --external-data`: same nodes, weights in a side file). Per runtime: the process's RSS
   after its imports, after a warm-up (a one-layer, hidden-64 BERT created and run: the
   libraries and compiled kernels a first session loads, which are not the model's), its
   peak RSS (VmHWM) after creating the session and running once, the creation time, and
   glassrt's arena; and the peak RSS of another process that only creates the session and
   runs it once (no warm-up: the whole cost of serving this one model).
2. optimized files: session creation + first run of the original and of `glassrt optimize`'s
   output, for the nine light models (random weights) and BERT-base (sequence 128).

    python benchmarks/mapped_weights.py [--only memory|optimized] [--repeats 3] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from glassrt.tools import bench, bench_models, light_models
from glassrt.tools import optimize as tool

# One measurement: import the runtime, note RSS, create + run once, report peak RSS and times.
WORKER = r"""
import json, sys, time
import numpy as np
runtime, path, feeds_path = sys.argv[1:4]
warm = sys.argv[4:6]  # a tiny model with the same ops, run first: libraries and JIT code loaded
feeds = dict(np.load(feeds_path))
def rss(key="VmRSS:"):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
def create(p):
    if runtime == "glassrt":
        import glassrt, warnings
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(p)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
if runtime == "glassrt":
    import glassrt
else:
    import onnxruntime
base = rss()
if warm:
    create(warm[0]).run(None, dict(np.load(warm[1])))
import gc; gc.collect()
warmed = rss()
t0 = time.perf_counter()
sess = create(path)
created = time.perf_counter() - t0
sess.run(None, feeds)
first = time.perf_counter() - t0 - created
arena = sum(sess.memory_stats()["arena_bytes"].values()) if runtime == "glassrt" else None
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, from the parent's RSS at fork time.
print(json.dumps({"base_rss": base, "warm_rss": warmed, "peak_rss": rss("VmHWM:"),
                  "end_rss": rss(), "create_s": created, "first_run_s": first, "arena": arena}))
"""


def measure(runtime, path, feeds_file, warm=()) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER, runtime, str(path), str(feeds_file), *map(str, warm)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mb(n):
    return f"{n / 2**20:.1f}"


def memory(folder: Path, repeats: int, console):
    m = bench_models.bert(layers=3, vocab=1000)
    feeds = bench_models.bert_feeds(1, 128, vocab=1000)
    src = folder / "bert3.onnx"
    onnx.save(m, src)
    ext = folder / "bert3.ext.onnx"
    report = tool.optimize(src, ext, level="none", external_data=True)
    weights = report.weight_bytes_before
    np.savez(folder / "bert3.npz", **feeds)
    tiny = folder / "bert_tiny.onnx"
    onnx.save(bench_models.bert(layers=1, hidden=64, heads=4, intermediate=128, vocab=100, max_positions=128), tiny)
    np.savez(folder / "bert_tiny.npz", **bench_models.bert_feeds(1, 128, vocab=100))
    warm = (tiny, folder / "bert_tiny.npz")
    rows = {}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("memory: fresh processes", total=8 * repeats)
        for _ in range(repeats):
            for label, path in (("", ext), (", weights inside the model", src)):  # (raw_data in the model file)
                for rt in ("glassrt", "onnxruntime"):
                    run = measure(rt, path, folder / "bert3.npz", warm)
                    bar.advance(task)
                    # the same, in a process that creates and runs only this model
                    run["alone_peak_rss"] = measure(rt, path, folder / "bert3.npz")["peak_rss"]
                    bar.advance(task)
                    rows.setdefault(rt + label, []).append(run)
    table = Table(title=f"BERT-shaped encoder, 3 layers, {mb(weights)} MiB of weights in aligned external data "
                        f"({report.written.external_tensors} tensors), batch 1 x 128; median of {repeats} processes",
                  title_justify="left")
    for col in ("runtime", "RSS after import MiB", "after warm-up MiB", "peak RSS MiB", "peak - warm MiB",
                "(peak - warm) / weights", "peak RSS alone MiB", "arena MiB", "create s", "first run s"):
        table.add_column(col, justify="right" if col != "runtime" else "left")
    result = {"weights_bytes": weights}
    for rt, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("base_rss", "warm_rss", "peak_rss", "alone_peak_rss", "create_s", "first_run_s")}
        arena = runs[0]["arena"]
        grown = med["peak_rss"] - med["warm_rss"]
        table.add_row(rt, mb(med["base_rss"]), mb(med["warm_rss"]), mb(med["peak_rss"]), mb(grown),
                      f"{grown / weights:.2f}", mb(med["alone_peak_rss"]),
                      mb(arena) if arena is not None else "-", f"{med['create_s']:.3f}", f"{med['first_run_s']:.3f}")
        result[rt] = {**med, "arena": arena, "runs": runs}
    console.print(table)
    return result


def optimized(folder: Path, repeats: int, console, only=None):
    cases = [(n, bench_models.light, n) for n in light_models.NAMES] + [("bert-base", bench_models.bert, None)]
    cases = [c for c in cases if not only or any(o in c[0] for o in only)]
    table = Table(title=f"create + first run, glassrt, fresh process each, median of {repeats}", title_justify="left")
    for col in ("model", "create + run: original s", "optimized s", "ratio", "create only: original s", "optimized s",
                "ratio", "nodes", "file MB orig -> opt"):
        table.add_column(col, justify="right" if col != "model" else "left")
    result = {}
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("optimized files", total=len(cases))
        for name, build, arg in cases:
            m = build(arg) if arg else build()
            if arg:
                x, shape = light_models.input_shape(m)
                feeds = {x: light_models.reference_input(shape)}
            else:
                feeds = bench_models.bert_feeds(1, 128)
            src, out = folder / f"{name}.onnx", folder / f"{name}.opt.onnx"
            onnx.save(m, src)
            del m
            report = tool.optimize(src, out)
            np.savez(folder / f"{name}.npz", **feeds)
            for p in (src, out):  # both files in the page cache before any timing (just written or not)
                bench.read_through(p)
            times = {"original": [], "optimized": []}
            creates = {"original": [], "optimized": []}
            for k in range(repeats):  # alternating which goes first
                pairs = (("original", src), ("optimized", out))
                for kind, path in pairs if k % 2 == 0 else pairs[::-1]:
                    r = measure("glassrt", path, folder / f"{name}.npz")
                    times[kind].append(r["create_s"] + r["first_run_s"])
                    creates[kind].append(r["create_s"])
            a, b = statistics.median(times["original"]), statistics.median(times["optimized"])
            ca, cb = statistics.median(creates["original"]), statistics.median(creates["optimized"])
            table.add_row(name, f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}", f"{ca:.2f}", f"{cb:.2f}", f"{cb / ca:.2f}",
                          f"{sum(report.ops_before.values())} -> {sum(report.ops_after.values())}",
                          f"{src.stat().st_size / 1e6:.0f} -> {out.stat().st_size / 1e6:.0f}")
            result[name] = {"create_and_first_run": times, "create": creates}
            for p in (src, out):
                p.unlink()
            bar.advance(task)
    console.print(table)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["memory", "optimized"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="+", help="optimized files: only the models whose name contains one of these")
    ap.add_argument("--keep", help="folder for the models (default: a temporary one)")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        out = {}
        if args.only in (None, "memory"):
            out["memory"] = memory(folder, args.repeats, console)
        if args.only in (None, "optimized"):
            out["optimized"] = optimized(folder, args.repeats, console, args.models)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
