"""Resident memory while light_squeezenet (batch dim made symbolic) runs 40 batch sizes in
a row, twice. glassrt's plan cache is a bounded LRU, so the second pass must peak no
higher than the first; onnxruntime's memory patterns grow with every new shape
(microsoft/onnxruntime#11118), shown alongside with --ort.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from _common import ort_session, rss_bytes  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

import glassrt  # noqa: E402
from glassrt.tools import light_models as lm  # noqa: E402


def symbolic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name for i in m.graph.initializer}
    for vi in [*m.graph.input, *m.graph.output]:
        if vi.name not in inits:
            vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    return m


def passes(run, sizes, n_passes, label, progress):
    peaks = []
    task = progress.add_task(label, total=len(sizes) * n_passes)
    for _ in range(n_passes):
        peak = 0
        for b in sizes:
            run(b)
            peak = max(peak, rss_bytes())
            progress.advance(task)
        peaks.append(peak)
    return peaks


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, default=40)
    ap.add_argument("--ort", action="store_true", help="also measure onnxruntime (in this process, after glassrt)")
    a = ap.parse_args(argv)
    m = symbolic_batch(lm.randomize_weights(onnx.load(lm.path("squeezenet"))))
    x_name, shape = lm.input_shape(m)
    sizes = list(range(1, a.sizes + 1))
    rng = np.random.default_rng(0)
    xs = {b: rng.random((b, *shape[1:]), dtype=np.float32) for b in sizes}
    console = Console()
    with Progress(console=console, transient=True) as progress:
        sess = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
        g = passes(lambda b: sess.run(None, {x_name: xs[b]}), sizes, 2, "glassrt", progress)
        o = None
        if a.ort:
            osess = ort_session(m.SerializeToString(), 2)
            o = passes(lambda b: osess.run(None, {x_name: xs[b]}), sizes, 2, "onnxruntime", progress)
    mib = lambda v: f"{v / 2**20:.0f} MiB"  # noqa: E731
    console.print(f"glassrt: pass 1 peak RSS {mib(g[0])}, pass 2 peak RSS {mib(g[1])} "
                  f"({'bounded' if g[1] <= g[0] * 1.02 else 'GREW'}); plans cached "
                  f"{sess.memory_stats()['plans_cached']}, built {sess.memory_stats()['plans_built']}")
    if o:
        console.print(f"onnxruntime (measured after glassrt, same process): pass 1 peak {mib(o[0])}, pass 2 peak {mib(o[1])}")
    return 0 if g[1] <= g[0] * 1.02 else 1


if __name__ == "__main__":
    sys.exit(main())
