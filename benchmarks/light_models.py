"""glassrt vs onnxruntime latency on the nine light models (same inputs, same threads).

Runs alternate in blocks (a few glassrt runs, then a few onnxruntime runs, ...) so that
noise from a busy machine hits both alike; the first run of each block is dropped, since
the other runtime's worker threads may still be spinning. Each cell is the median.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from _common import alternating_medians, ort_session  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import track  # noqa: E402
from rich.table import Table  # noqa: E402

import glassrt  # noqa: E402
from glassrt.tools import light_models as lm  # noqa: E402


def bench(name, runs, threads):
    m = lm.randomize_weights(onnx.load(lm.path(name)), seed=0)
    data = m.SerializeToString()
    x_name, shape = lm.input_shape(m)
    feeds = {x_name: np.random.default_rng(0).random(shape, dtype=np.float32)}
    g = glassrt.InferenceSession(data, providers=["cpu"], fallback="error",
                                 sess_options=glassrt.SessionOptions(intra_op_num_threads=threads))
    o = ort_session(data, threads)
    tg, to = alternating_medians(g, o, feeds, runs)
    a, b = g.run(None, feeds)[0], o.run(None, feeds)[0]
    return tg, to, float(np.abs(a - b).max())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="*", default=lm.NAMES)
    a = ap.parse_args(argv)
    rows = []
    for name in track(a.models, description="benchmarking", transient=True):
        rows.append((name, *bench(name, a.runs, a.threads)))
    t = Table(title=f"median latency, {a.threads} threads, about {a.runs} runs each in alternating blocks (random weights)")
    for c in ("model", "glassrt ms", "onnxruntime ms", "glassrt / ort", "max |diff|"):
        t.add_column(c, justify="right" if c != "model" else "left")
    for name, g, o, d in rows:
        t.add_row(name, f"{g:.2f}", f"{o:.2f}", f"{g / o:.2f}x", f"{d:.1e}")
    geo = float(np.exp(np.mean([np.log(g / o) for _, g, o, _ in rows])))
    Console().print(t)
    Console().print(f"geometric mean ratio: {geo:.2f}x")


if __name__ == "__main__":
    main()
