"""Rows/s of batch inference of light_resnet50 on Ray Data (glassrt.ray.Predictor, 1 and
2 actors) against a plain in-process loop over the same batches, same threads per session.

light_resnet50 declares a static batch of 1, so every configuration runs it row by row
(the Predictor does that by itself for such models); the batch size only sets how many
rows travel together through Ray. The weights are the shipped ConstantOfShape ones (the
timing does not depend on their values).

    .venv/bin/python benchmarks/ray_scaling.py --rows 64 --batch-size 8 --threads 1

Two rates per Ray run: "wall" (rows / wall time of the whole run: actor start and session
creation, reading from and writing to the object store, the driver collecting the rows)
and "in sessions" (rows / the busiest actor's time inside session.run: what the actors
would sustain once started). A shared machine is noisy: the load average before and after
each run is printed with it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

import glassrt
from glassrt.tools import light_models as lm

console = Console(width=None if Console().is_terminal else 150)  # a log keeps the table whole


def in_process(model_path: Path, x: np.ndarray, batch_size: int, threads: int) -> dict:
    """The plain loop: one session, the same batches, each row run alone (static batch 1)."""
    t0 = time.perf_counter()
    sess = glassrt.InferenceSession(str(model_path), sess_options=glassrt.SessionOptions(intra_op_num_threads=threads))
    name = sess.get_inputs()[0].name
    sess.run(None, {name: x[:1]})  # the plan, as an actor builds it on its first batch
    created = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs = []
    for i in range(0, len(x), batch_size):
        batch = x[i:i + batch_size]
        outs.append(np.concatenate([sess.run(None, {name: batch[j:j + 1]})[0] for j in range(len(batch))]))
    seconds = time.perf_counter() - t0
    return {"config": f"in-process loop, {threads} thread(s)", "actors": 0, "threads": threads,
            "rows": len(x), "wall_s": seconds, "session_s": seconds, "startup_s": created, "output": np.concatenate(outs)}


def on_ray(ray, model_path: Path, x: np.ndarray, batch_size: int, threads: int, actors: int) -> dict:
    import glassrt.ray

    run = f"scaling-{actors}-{time.time_ns()}"
    t0 = time.perf_counter()
    ref = glassrt.ray.model_ref(model_path)
    # one in-memory block per batch (no repartition: its tasks would wait for the CPUs the
    # actors hold, and hang with 2 actors on 2 CPUs)
    ds = ray.data.from_numpy([x[i:i + batch_size] for i in range(0, len(x), batch_size)])
    out = ds.map_batches(glassrt.ray.Predictor, batch_format="numpy", batch_size=batch_size,
                         compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=threads,
                         fn_constructor_kwargs={"model": ref, "inputs": {"data": "gpu_0/data_0"}, "threads": threads,
                                                "keep_inputs": False, "run": run})
    rows = out.take_all()
    wall = time.perf_counter() - t0
    reports = glassrt.ray.Predictor.stats(run)
    busiest = max(r["run_seconds"] for r in reports)
    return {"config": f"Ray Data, {actors} actor(s) x {threads} thread(s)", "actors": actors, "threads": threads,
            "rows": len(rows), "wall_s": wall, "session_s": busiest,
            "startup_s": max(r["session_seconds"] for r in reports),
            "per_actor_rows": [r["rows"] for r in reports],
            "output": np.concatenate([r["gpu_0/softmax_1"][None] for r in rows])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="threads per session (per actor)")
    ap.add_argument("--actors", default="1,2", help="actor counts to run")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import ray

    path = lm.path("resnet50")
    x = np.random.default_rng(0).random((args.rows, 1, 3, 224, 224), dtype=np.float32)[:, 0]
    cpus = os.cpu_count()
    console.print(f"light_resnet50, {args.rows} rows of [3, 224, 224] float32, batch size {args.batch_size}, "
                  f"{args.threads} thread(s) per session, {cpus} CPUs; load average before: "
                  f"{os.getloadavg()[0]:.2f}", highlight=False)
    results = []
    with console.status("in-process loop"):
        # first: also fills Numba's on-disk cache, which the actors then read
        results.append(in_process(path, x, args.batch_size, args.threads))
    results[-1]["load"] = os.getloadavg()[0]
    expected = results[0]["output"]
    ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=512 << 20, log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    try:
        for n in [int(a) for a in args.actors.split(",")]:
            with console.status(f"Ray Data, {n} actor(s)"):
                r = on_ray(ray, path, x, args.batch_size, args.threads, n)
            r["load"] = os.getloadavg()[0]
            # the same rows in the same order: the same numbers as the loop
            r["max_abs_diff"] = float(np.max(np.abs(r["output"].reshape(expected.shape) - expected)))
            results.append(r)
    finally:
        ray.shutdown()

    table = Table(title="light_resnet50 batch inference", title_justify="left")
    for col in ("configuration", "rows/s (wall)", "rows/s (in sessions)", "wall s", "session start s",
                "rows per actor", "max |diff| vs loop", "load avg after"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for r in results:
        table.add_row(r["config"], f"{r['rows'] / r['wall_s']:.2f}", f"{r['rows'] / r['session_s']:.2f}",
                      f"{r['wall_s']:.1f}", f"{r['startup_s']:.1f}", str(r.get("per_actor_rows", "-")),
                      f"{r.get('max_abs_diff', 0):.1e}", f"{r['load']:.2f}")
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "output"} for r in results],
                                              indent=1))


if __name__ == "__main__":
    sys.exit(main())
