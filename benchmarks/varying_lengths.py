"""BERT-base served at varying sequence lengths (the requests of a text service, each as long
as its text), or a CNN at varying batch sizes (a server's dynamic batching), against
onnxruntime.

    python benchmarks/varying_lengths.py [--requests 400] [--lengths 8:128] [--rounds 3]
                                         [--threads 2] [--baseline PATH]
    python benchmarks/varying_lengths.py --cnn squeezenet --requests 48 --lengths 1:9

--cnn NAME: one of the onnx package's light models (random weights), its batch dim made
symbolic; `--lengths` are then the batch sizes.

The suite times each model at one shape; a service sees a new length at almost every request.
glassrt compiles a plan per shape for the first few, then one shared plan with the length
left symbolic (runtime/runner.py: ShapePattern), and a plan of its own for a length asked
for again and again while its plan cache has room. This times that whole life: one session
per process, `--requests` requests with lengths drawn uniformly from `--lengths` (seeded: the
same sequence for every process), batch 1. Each runtime runs in a fresh process per round,
alternating (glassrt, --baseline's glassrt if given, onnxruntime); per process the total, the
median and p90 of each half of the requests, and the peak RSS. --baseline PATH: another
glassrt checkout (its repository root) measured beside this one, as an A/B.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]

_SERVE = r"""
import json, sys, time
import numpy as np
path, runtime, threads, requests, lo, hi = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
image = json.loads(sys.argv[7])  # (a CNN's input name and its shape after the batch dim) or None
if runtime == "onnxruntime":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
else:
    import glassrt
    so = glassrt.SessionOptions(); so.intra_op_num_threads = threads
    sess = glassrt.InferenceSession(path, so)
rng = np.random.default_rng(0)
lengths = rng.integers(lo, hi, requests)
times = []
for n in lengths:
    if image:
        f = {image[0]: rng.standard_normal((n, *image[1])).astype(np.float32)}
    else:
        f = {"input_ids": rng.integers(0, 30522, (1, n), dtype=np.int64), "attention_mask": np.ones((1, n), np.int64),
             "token_type_ids": np.zeros((1, n), np.int64)}
    t = time.perf_counter(); sess.run(None, f); times.append(time.perf_counter() - t)
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"times": times, "peak_rss": peak * 1024}))
"""


def serve(model: str, runtime: str, root: Path, a, image) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    lo, hi = (int(v) for v in a.lengths.split(":"))
    done = subprocess.run([sys.executable, "-c", _SERVE, model, runtime, str(a.threads), str(a.requests), str(lo),
                           str(hi), json.dumps(image)], env=env, capture_output=True, text=True, cwd=root)
    if done.returncode:
        raise SystemExit(f"{runtime}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _symbolic_batch(name: str):
    """(the light model `name` with random weights and its batch dim symbolic, (its input's
    name, the input's shape after the batch dim))."""
    import onnx

    from glassrt.tools import light_models

    model = light_models.randomize_weights(onnx.load(str(light_models.path(name))))
    inits = {i.name for i in model.graph.initializer}
    x = next(v for v in model.graph.input if v.name not in inits)
    for v in (x, *model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    return model, (x.name, [d.dim_value for d in x.type.tensor_type.shape.dim][1:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--lengths", default="8:128", help="LO:HI, lengths drawn from [LO, HI)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline", type=Path, help="another glassrt checkout to measure beside this one")
    ap.add_argument("--cnn", metavar="NAME", help="a light model at varying batch sizes instead of BERT-base")
    a = ap.parse_args(argv)
    runtimes = [("glassrt", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else []) + \
        [("onnxruntime", ROOT)]
    sys.path.insert(0, str(ROOT))
    from glassrt.tools import bench_models

    with tempfile.TemporaryDirectory() as folder:
        import onnx

        model = str(Path(folder) / "model.onnx")
        graph, image = (bench_models.bert(), None) if not a.cnn else _symbolic_batch(a.cnn)
        onnx.save(graph, model)
        got = {name: [] for name, _ in runtimes}
        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("processes", total=a.rounds * len(runtimes))
            for _ in range(a.rounds):
                for name, root in runtimes:
                    got[name].append(serve(model, "onnxruntime" if name == "onnxruntime" else "glassrt", root, a, image))
                    bar.advance(task)
    halves = [(0, a.requests // 2), (a.requests // 2, a.requests)]
    what = f"{a.cnn}, {a.requests} requests of batch sizes {a.lengths}" if a.cnn else \
        f"BERT-base, {a.requests} requests of lengths {a.lengths}, batch 1"
    table = Table(title=f"{what} ({a.threads} threads): median of {a.rounds} processes")
    table.add_column("runtime")
    table.add_column("total, s (range)", justify="right")
    for lo, hi in halves:
        table.add_column(f"requests {lo}-{hi - 1}: median / p90, ms", justify="right")
    table.add_column("peak RSS, MB", justify="right")
    totals = {}
    for name, runs in got.items():
        sums = [sum(r["times"]) for r in runs]
        totals[name] = statistics.median(sums)
        cells = [f"{totals[name]:.1f} ({min(sums):.1f}-{max(sums):.1f})"]
        for lo, hi in halves:
            med = statistics.median(statistics.median(r["times"][lo:hi]) for r in runs) * 1e3
            p90 = statistics.median(sorted(r["times"][lo:hi])[int(0.9 * (hi - lo))] for r in runs) * 1e3
            cells.append(f"{med:.1f} / {p90:.1f}")
        cells.append(f"{statistics.median(r['peak_rss'] for r in runs) / 2**20:,.0f}")
        table.add_row(name, *cells)
    Console().print(table)
    for name in totals:
        if name != "onnxruntime":
            print(f"{name} / onnxruntime, total: {totals[name] / totals['onnxruntime']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
