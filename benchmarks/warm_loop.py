"""Warm latency of small models in a loop: what a streaming model (a voice-activity detector,
a wake-word classifier) costs per call once its plans are compiled and its kernels warm.

    python benchmarks/warm_loop.py MODEL.onnx [...] [--rounds 3] [--threads 2] [--baseline PATH]

`glassrt bench` times a handful of runs after creation; a model called every 10-30 ms for
hours is better judged after warm-up. Each model runs in a fresh process per runtime and
round, the runtimes alternating (glassrt, --baseline's glassrt if given, onnxruntime, then
again), each process warming up for 1.5 s (at least 20 runs; a glassrt process then until
the Numba it loads in the background is loaded, and 0.5 s more) and then timing up to 2,000
runs or 2.5 s: the median of each process, and per runtime the median and range over the
rounds. Inputs: `MODEL.onnx.feeds.npz` beside the model if present, else a corpus model's
(`corpus/manifest.py`, by file name: what corpus.compare feeds it), else made up as
`glassrt bench` makes them. --baseline PATH: a glassrt checkout (its repository root) to
measure beside this one, as an A/B.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]

_LOOP = r"""
import os, sys, time
import numpy as np
path, runtime, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
if os.path.exists(path + ".feeds.npz"):
    feeds = dict(np.load(path + ".feeds.npz"))
else:
    import onnx
    from corpus import compare, manifest
    from glassrt.tools import bench
    model = onnx.load(path, load_external_data=False)
    spec = {m.id: m for m in manifest.MODELS}.get(os.path.basename(path)[:-len(".onnx")])
    feeds = compare.make_feeds(spec, model) if spec else bench.generate_feeds(model, {})
if runtime == "onnxruntime":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
else:
    import glassrt
    so = glassrt.SessionOptions(); so.intra_op_num_threads = threads
    sess = glassrt.InferenceSession(path, so)
try:
    from glassrt.kernels.cpu._jit import numba_loading
except ImportError:  # (onnxruntime's process, or a checkout without it)
    numba_loading = lambda: False
end, n = time.perf_counter() + 1.5, 0
while n < 20 or time.perf_counter() < end:
    sess.run(None, feeds); n += 1
if runtime != "onnxruntime" and numba_loading():
    # glassrt loads Numba on a thread of its own once a model keeps running (its compiled
    # loops: tree ensembles, 8-bit ops): a service's steady state is after it
    while numba_loading():
        sess.run(None, feeds)
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        sess.run(None, feeds)
times, end = [], time.perf_counter() + 2.5
while len(times) < 5 or (time.perf_counter() < end and len(times) < 2000):
    t = time.perf_counter(); sess.run(None, feeds); times.append(time.perf_counter() - t)
print(float(np.median(times)))
"""


def measure(model: str, runtime: str, threads: int, root: Path) -> float:
    """One process's median latency (seconds) of `model` on `runtime`, glassrt from `root`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    # run in `root`: `python -c` puts the working folder first on sys.path, so from this
    # checkout's root a baseline process would import this checkout's glassrt, not its own
    done = subprocess.run([sys.executable, "-c", _LOOP, str(Path(model).resolve()), runtime, str(threads)], env=env,
                          capture_output=True, text=True, cwd=root)
    if done.returncode:
        raise SystemExit(f"{model} on {runtime}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return float(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline", type=Path, help="another glassrt checkout to measure beside this one")
    a = ap.parse_args(argv)
    runtimes = [("glassrt", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else []) + \
        [("onnxruntime", ROOT)]
    table = Table(title=f"warm latency, us a run ({a.threads} threads; median and range of {a.rounds} rounds)")
    table.add_column("model")
    for name, _ in runtimes:
        table.add_column(name, justify="right")
    table.add_column("glassrt / onnxruntime", justify="right")
    if a.baseline:
        table.add_column("baseline / onnxruntime", justify="right")
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("models", total=len(a.models) * a.rounds * len(runtimes))
        for model in a.models:
            got = {name: [] for name, _ in runtimes}
            for _ in range(a.rounds):
                for name, root in runtimes:
                    got[name].append(measure(model, "onnxruntime" if name == "onnxruntime" else "glassrt",
                                             a.threads, root) * 1e6)
                    bar.advance(task)
            med = {k: statistics.median(v) for k, v in got.items()}
            cells = [f"{med[k]:,.0f} ({min(v):,.0f}-{max(v):,.0f})" for k, v in got.items()]
            ratios = [f"{med['glassrt'] / med['onnxruntime']:.2f}x"] + \
                ([f"{med['baseline'] / med['onnxruntime']:.2f}x"] if a.baseline else [])
            table.add_row(Path(model).name, *cells, *ratios)
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
