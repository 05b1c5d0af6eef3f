"""Load check of `glassrt serve`: requests per second and latency (p50, p99) for
light_resnet50 (its batch dim made symbolic, its constant 0.02 weights replaced by seeded
random ones: light_models.randomize_weights) on 127.0.0.1, without and with dynamic
batching, under concurrent clients.

Each configuration starts its own `glassrt serve` subprocess, warms it up, then runs
`--clients` threads for `--duration` seconds, each a closed loop (send a request, wait for
the answer, send the next) of v2 requests with a binary 1x3x224x224 tensor, over one
keep-alive connection per thread (httpx). Every answer is checked against an in-process
session's output for the same input. The clients share the machine with the server: on a
2-core machine they take part of its CPU, as a co-located load generator does.

    python benchmarks/serve_load.py --clients 8 --duration 20
    python benchmarks/serve_load.py --ray   # batched on uvicorn vs on Ray Serve, 1 and 2 replicas
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import glassrt
from glassrt.tools import light_models as lm
from glassrt.tools.compare import ATOL, RTOL

HEADER = "Inference-Header-Content-Length"


def symbolic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with dim 0 of its inputs and outputs named `batch`, and its Reshape targets
    made to keep that dim (caffe2's export of resnet50 flattens into a constant [1, 2048];
    0 copies the input's dim 0, as exporters with a dynamic batch write it)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    for vi in [*m.graph.input, *m.graph.output]:
        if vi.name not in inits:
            vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    for node in m.graph.node:
        target = inits.get(node.input[1]) if node.op_type == "Reshape" else None
        if target is not None:
            shape = onnx.numpy_helper.to_array(target).copy()
            if shape.ndim == 1 and shape.size and shape[0] == 1:
                shape[0] = 0
                target.CopyFrom(onnx.numpy_helper.from_array(shape, target.name))
    return m


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_path: Path, args: list, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "glassrt.cli", "serve", f"resnet50={model_path}", "--port",
                                 str(port), "--log-level", "warning", *map(str, args)],
                                stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"glassrt serve exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"glassrt serve not ready after 180 s:\n{log.read_text()}")


def request_body(name: str, x: np.ndarray) -> tuple[bytes, dict]:
    head = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + x.tobytes(), {HEADER: str(len(head)), "Content-Type": "application/octet-stream"}


def output_of(response: httpx.Response) -> np.ndarray:
    n = int(response.headers[HEADER])
    (out,) = json.loads(response.content[:n])["outputs"]
    return np.frombuffer(response.content[n:], np.float32).reshape(out["shape"])


def batch_stats(url: str) -> tuple[float, float]:
    """(runs, rows) so far, from the server's batch-size histogram."""
    from prometheus_client.parser import text_string_to_metric_families

    runs = rows = 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in family.samples:
            if s.name == "glassrt_server_batch_size_count":
                runs += s.value
            elif s.name == "glassrt_server_batch_size_sum":
                rows += s.value
    return runs, rows


def load(url: str, inputs: list, expected: list, name: str, clients: int, duration: float, progress) -> dict:
    bodies = [request_body(name, x) for x in inputs]
    latencies, errors, lock = [], [], threading.Lock()
    stop_at = time.perf_counter() + duration

    def client(k: int):
        mine = []
        with httpx.Client(timeout=120) as http:
            i = k
            while time.perf_counter() < stop_at:
                body, headers = bodies[i % len(bodies)]
                t0 = time.perf_counter()
                r = http.post(url + "/v2/models/resnet50/infer", content=body, headers=headers)
                mine.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors.append(f"{r.status_code}: {r.text[:200]}")
                else:
                    got, want = output_of(r), expected[i % len(bodies)]
                    # float32 tolerances: a batched run may take other kernels than batch 1
                    if not np.allclose(got, want, rtol=RTOL, atol=ATOL):
                        errors.append(f"an answer differs from the in-process session's by up to "
                                      f"{np.abs(got - want).max():.3g} (argmax {got.argmax()} vs {want.argmax()})")
                i += clients
        with lock:
            latencies.extend(mine)

    runs0, rows0 = batch_stats(url)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    task = progress.add_task("  clients running", total=duration)
    while any(t.is_alive() for t in threads):
        progress.update(task, completed=min(duration, time.perf_counter() - t0))
        time.sleep(0.25)
    wall = time.perf_counter() - t0
    progress.remove_task(task)
    runs, rows = batch_stats(url)
    if errors:
        raise SystemExit(f"{len(errors)} bad answers, e.g. {errors[0]}")
    ms = sorted(x * 1e3 for x in latencies)
    q = lambda p: ms[min(len(ms) - 1, int(round(p * (len(ms) - 1))))]  # noqa: E731
    return {"requests": len(ms), "rps": len(ms) / wall, "p50_ms": statistics.median(ms), "p99_ms": q(0.99),
            "rows_per_run": (rows - rows0) / max(runs - runs0, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8, help="concurrent closed-loop clients")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per configuration")
    ap.add_argument("--max-batch-size", type=int, default=8, help="for the batching configuration")
    ap.add_argument("--batch-timeout-ms", type=float, default=2.0, help="for the batching configuration")
    ap.add_argument("--ray", action="store_true", help="compare batched `glassrt serve` with `--ray --replicas` 1 "
                    "and 2: needs glassrt[ray]")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args(argv)
    console = Console()

    model = symbolic_batch(lm.randomize_weights(onnx.load(lm.path("resnet50"))))
    tmp = Path(tempfile.mkdtemp(prefix="serve_load_"))
    model_path = tmp / "resnet50.onnx"
    onnx.save(model, model_path)
    rng = np.random.default_rng(0)
    inputs = [rng.random((1, 3, 224, 224), dtype=np.float32) for _ in range(8)]
    local = glassrt.InferenceSession(str(model_path))
    name = local.get_inputs()[0].name
    expected = [local.run(None, {name: x})[0] for x in inputs]

    configs = [("no batching", ["--max-batch-size", 1]),
               (f"dynamic batching (max {args.max_batch_size}, {args.batch_timeout_ms:g} ms)",
                ["--max-batch-size", args.max_batch_size, "--batch-timeout-ms", args.batch_timeout_ms])]
    if args.ray:
        batched = configs[1]
        configs = [batched] + [(f"Ray Serve, {n} replica{'s' * (n > 1)}, batched",
                                [*batched[1], "--ray", "--replicas", n]) for n in (1, 2)]
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        for label, server_args in configs:
            task = progress.add_task(f"{label}: starting the server")
            proc, url = start_server(model_path, server_args, tmp / f"serve-{len(results)}.log")
            try:
                progress.update(task, description=f"{label}: warm-up")
                sizes = range(1, (args.max_batch_size if "--batch-timeout-ms" in server_args else 1) + 1)
                with httpx.Client(timeout=300) as http:
                    # A plan per batch size the server will run, compiled before the clock starts: a
                    # size asked for the 4th time gets its own plan (before, the shared one with
                    # the batch dim symbolic: SessionOptions.generalize_after)
                    for b in sizes:
                        for _ in range(4):
                            body, headers = request_body(name, np.concatenate([inputs[0]] * b))
                            http.post(url + "/v2/models/resnet50/infer", content=body,
                                      headers=headers).raise_for_status()
                progress.update(task, description=f"{label}: {args.clients} clients for {args.duration:g} s")
                result = {"config": label, **load(url, inputs, expected, name, args.clients, args.duration, progress)}
                if "--ray" in server_args:  # each /metrics scrape is one replica's: its batches only
                    result["rows_per_run"] = None
                results.append(result)
            finally:
                proc.terminate()
                proc.wait(timeout=60)  # with --ray: Serve and the Ray runtime shut down first
            progress.remove_task(task)

    table = Table(title=f"glassrt serve, light_resnet50 1x3x224x224, {args.clients} clients, "
                        f"{args.duration:g} s each, 127.0.0.1")
    for c in ("configuration", "requests", "req/s", "p50 ms", "p99 ms", "rows per run"):
        table.add_column(c, justify="left" if c == "configuration" else "right")
    for r in results:
        table.add_row(r["config"], str(r["requests"]), f"{r['rps']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                      "n/a" if r["rows_per_run"] is None else f"{r['rows_per_run']:.2f}")
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
