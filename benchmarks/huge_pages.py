"""Matrix-vector products over weights on 4 KiB pages against the same weights on transparent
huge pages (glassrt/pages.py), in one process, alternating.

The weights are a GPT-2-sized decoder's twelve layers (768x2304, 768x768, 768x3072,
3072x768: 340 MB), read once per pass by one-row products as a decode step reads them.
Each pass is timed; the table shows medians. NumPy's BLAS does the products (its own
threads only, so no second pool spins against it).

Run from the repository root: python benchmarks/huge_pages.py [--passes 15] [--layers 12]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glassrt import pages  # noqa: E402

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]


def weights(layers: int, huge: bool, rng) -> list[np.ndarray]:
    os.environ["GLASSRT_HUGE_PAGES"] = "1" if huge else "0"
    out = []
    for _ in range(layers):
        for k, n in SHAPES:
            w = pages.os_buffer(k * n * 4).view(np.float32).reshape(k, n)
            w[...] = rng.standard_normal((k, n), dtype=np.float32)
            out.append(w)
    return out


def one_pass(ws, xs) -> float:
    t0 = time.perf_counter()
    for w in ws:
        xs[w.shape[0]] @ w
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=15)
    ap.add_argument("--layers", type=int, default=12)
    args = ap.parse_args()
    print(f"transparent huge pages: {pages.thp_mode()}", file=sys.stderr)
    rng = np.random.default_rng(0)
    sets = {"4 KiB pages": weights(args.layers, False, rng), "huge pages asked for": weights(args.layers, True, rng)}
    xs = {k: rng.standard_normal((1, k), dtype=np.float32) for k, _ in SHAPES}
    times = {name: [] for name in sets}
    for _ in range(args.passes):
        for name, ws in sets.items():
            times[name].append(one_pass(ws, xs))
    mb = sum(w.nbytes for w in sets["4 KiB pages"]) / 1e6
    print(f"| pages | ms per pass over {mb:.0f} MB (median of {args.passes}) | GB/s |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        ms = float(np.median(ts)) * 1e3
        print(f"| {name} | {ms:.2f} | {mb / ms:.1f} |")


if __name__ == "__main__":
    main()
