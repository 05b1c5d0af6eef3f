"""`glassrt serve`: started as a subprocess on a free port, driven by Triton's own client
(tritonclient.http, JSON and binary tensors) and by raw HTTP requests for every kind of bad
request; outputs checked against an in-process session and exact expected values."""
from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import glassrt
from tests.helpers import add_model, init, model, tensor

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MAX_BODY = 200_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`glassrt serve ARGS` in a subprocess, ready when /v2/health/ready answers 200."""

    def __init__(self, args, cwd, port=None):
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(cwd) / f"serve-{self.port}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "glassrt.cli", "serve", *map(str, args),
                                          "--port", str(self.port), "--log-level", "warning"],
                                         cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"glassrt serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/v2/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"glassrt serve not ready after 120 s:\n{self.log.read_text()}")

    def ready(self) -> bool:
        return httpx.get(self.url + "/v2/health/ready", timeout=10).status_code == 200

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- models


def mixed_model():
    """Three datatypes, one batch dim: y = x + 1 (FP32), m = 2k (INT64), t = s (BYTES)."""
    return model([helper.make_node("Add", ["x", "one"], ["y"], name="add"),
                  helper.make_node("Mul", ["k", "two"], ["m"], name="mul"),
                  helper.make_node("Identity", ["s"], ["t"], name="copy")],
                 [tensor("x", ["batch", 3]), tensor("k", ["batch", 2], TensorProto.INT64),
                  tensor("s", ["batch"], TensorProto.STRING)],
                 [tensor("y", ["batch", 3]), tensor("m", ["batch", 2], TensorProto.INT64),
                  tensor("t", ["batch"], TensorProto.STRING)],
                 [init("one", np.ones(3, np.float32)), init("two", np.array(2, np.int64))])


def reshape_model():
    """y = reshape(x, s): a shape that does not fit fails in the run, not in the request."""
    return model([helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_by_input")],
                 [tensor("x", [6]), tensor("s", [2], TensorProto.INT64)], [tensor("y", None)])


def tanh_model():
    """tanh(-x): with tests/cpu_without_tanh.py loaded, Tanh falls back to reference."""
    return model([helper.make_node("Neg", ["x"], ["a"], name="neg"),
                  helper.make_node("Tanh", ["a"], ["y"], name="tanh")],
                 [tensor("x", ["batch", 3])], [tensor("y", ["batch", 3])])


def flat_model():
    """Declares a batch dim but flattens into a constant [1, 4], as caffe2's resnet50 does:
    each request runs, a stacked batch cannot."""
    return model([helper.make_node("Reshape", ["x", "to"], ["y"], name="flatten_to_one")],
                 [tensor("x", ["batch", 2, 2])], [tensor("y", ["batch", 4])], [init("to", np.array([1, 4], np.int64))])


def plus_model(c: float):
    return model([helper.make_node("Add", ["x", "c"], ["y"], name="plus")], [tensor("x", ["batch", 3])],
                 [tensor("y", ["batch", 3])], [init("c", np.full(3, c, np.float32))])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    for name, m in (("add", add_model()), ("mixed", mixed_model()), ("reshape", reshape_model()),
                    ("tanh", tanh_model()), ("flat", flat_model())):
        onnx.save(m, d / f"{name}.onnx")
    return d


@pytest.fixture(scope="module")
def server(models):
    s = Server([models / "add.onnx", f"multi={models / 'mixed.onnx'}", models / "reshape.onnx",
                models / "tanh.onnx", models / "flat.onnx", "--module", ROOT / "tests" / "cpu_without_tanh.py",
                "--providers", "cpu,reference",
                "--max-batch-size", 32, "--batch-timeout-ms", 50, "--max-body-bytes", MAX_BODY], cwd=models)
    yield s
    s.stop()


@pytest.fixture
def client(server):
    # One per test: a pooled connection left idle while other tests run (xdist interleaves
    # modules on a worker) may be closed by the server as the next test reuses it.
    c = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", concurrency=32, network_timeout=120)
    yield c
    c.close()


# ---------------------------------------------------------------- tritonclient


def test_health_metadata_and_readiness(server, client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add") and client.is_model_ready("multi", "1")
    assert not client.is_model_ready("nope")
    meta = client.get_model_metadata("multi")
    assert meta["name"] == "multi" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]},
                              {"name": "k", "datatype": "INT64", "shape": [-1, 2]},
                              {"name": "s", "datatype": "BYTES", "shape": [-1]}]
    assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [("y", "FP32"), ("m", "INT64"), ("t", "BYTES")]
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_infers_every_datatype(client, models, binary):
    x = np.array([[0.5, -1.25, 3.0], [1e-3, 2.0, -7.5]], np.float32)
    k = np.array([[1, -2], [2**40, 7]], np.int64)
    s = np.array([b"caf\xc3\xa9", b""], dtype=object)
    inputs = []
    for name, value, dt in (("x", x, "FP32"), ("k", k, "INT64"), ("s", s, "BYTES")):
        inputs.append(httpclient.InferInput(name, list(value.shape), dt))
        inputs[-1].set_data_from_numpy(value, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("y", "m", "t")]
    result = client.infer("multi", inputs, outputs=outputs, request_id="r1")
    assert result.get_response()["id"] == "r1" and result.get_response()["model_version"] == "1"
    expected = glassrt.InferenceSession(str(models / "mixed.onnx")).run(None, {"x": x, "k": k, "s": s})
    np.testing.assert_array_equal(result.as_numpy("y"), x + 1)  # exact: one float32 add
    np.testing.assert_array_equal(result.as_numpy("y"), expected[0])
    np.testing.assert_array_equal(result.as_numpy("m"), k * 2)
    assert result.as_numpy("m").dtype == np.int64
    # tritonclient hands JSON strings back as str, binary ones as bytes
    assert [t if isinstance(t, bytes) else t.encode() for t in result.as_numpy("t")] == [b"caf\xc3\xa9", b""]


def test_all_outputs_binary_when_none_are_named(client):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    inp = httpclient.InferInput("x", [2, 3], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("add", [inp])  # tritonclient then asks binary_data_output
    assert result.get_output("y")["parameters"]["binary_data_size"] == 24
    np.testing.assert_array_equal(result.as_numpy("y"), x + 1)


def test_tritonclient_sees_server_errors(client):
    inp = httpclient.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((2, 4), np.float32))
    with pytest.raises(InferenceServerException, match=r"input 'x': dim 1 is 4, the model takes \[batch, 3\]"):
        client.infer("add", [inp])


def test_32_concurrent_requests_are_batched_and_correct(server, client, models):
    def batch_histogram():
        text = server.metrics()
        count = _metric(text, "glassrt_server_batch_size_count", model="add", version="1")
        ones = _metric(text, "glassrt_server_batch_size_bucket", model="add", version="1", le="1.0")
        return count, ones

    count0, ones0 = batch_histogram()
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1 + i % 2, 3)).astype(np.float32) for i in range(32)]
    pending = []
    for x in xs:
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        pending.append(client.async_infer("add", [inp]))
    results = [p.get_result().as_numpy("y") for p in pending]
    local = glassrt.InferenceSession(str(models / "add.onnx"))
    for x, y in zip(xs, results):
        np.testing.assert_array_equal(y, local.run(None, {"x": x})[0])  # each got its own rows back
    count, ones = batch_histogram()
    runs, single_runs = count - count0, ones - ones0
    assert runs < 32, f"32 requests ran in {runs} runs: nothing was batched"
    assert runs - single_runs > 0, "no run held more than one row"


def test_a_model_that_cannot_stack_requests_still_answers_each(server, client):
    xs = [np.full((1, 2, 2), i, np.float32) for i in range(8)]
    pending = []
    for x in xs:
        inp = httpclient.InferInput("x", [1, 2, 2], "FP32")
        inp.set_data_from_numpy(x)
        pending.append(client.async_infer("flat", [inp]))
    for x, p in zip(xs, pending):  # each gets its own answer, none an error
        np.testing.assert_array_equal(p.get_result().as_numpy("y"), x.reshape(1, 4))
    assert "batching turned off" in server.log.read_text()  # the stacked run failed, so the batcher stopped


# ---------------------------------------------------------------- bad requests

X = {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]}


def _json(**request):
    return json.dumps(request).encode()


def _binary(header: dict, blob: bytes, header_length=None):
    head = json.dumps(header).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head) if header_length is None else header_length)}


def _bad_requests():
    six_floats = np.arange(6, dtype=np.float32).tobytes()
    binary_x = {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}}
    cases = [
        ("unknown model", "/v2/models/nope/infer", _json(inputs=[X]), {}, 404, "unknown model 'nope'"),
        ("unknown version", "/v2/models/add/versions/7/infer", _json(inputs=[X]), {}, 404, "has no version '7'"),
        ("unknown model metadata", "/v2/models/nope", None, {}, 404, "unknown model 'nope'"),
        ("malformed JSON", "/v2/models/add/infer", b'{"inputs": [', {}, 400, "malformed JSON"),
        ("JSON not an object", "/v2/models/add/infer", b"[1, 2]", {}, 400, "must be a JSON object"),
        ("no inputs", "/v2/models/add/infer", _json(outputs=[]), {}, 400, "needs 'inputs'"),
        ("wrong dim", "/v2/models/add/infer", _json(inputs=[{**X, "shape": [3, 2]}]), {}, 400,
         "input 'x': dim 1 is 2, the model takes [batch, 3]"),
        ("wrong rank", "/v2/models/add/infer", _json(inputs=[{**X, "shape": [6]}]), {}, 400,
         "input 'x': shape [6] has rank 1, the model takes rank 2"),
        ("negative dim", "/v2/models/add/infer", _json(inputs=[{**X, "shape": [-1, 3]}]), {}, 400,
         "input 'x': shape must be a list of non-negative integers"),
        ("wrong datatype", "/v2/models/add/infer", _json(inputs=[{**X, "datatype": "FP64"}]), {}, 400,
         "input 'x': datatype FP64, the model takes FP32"),
        ("unknown datatype", "/v2/models/add/infer", _json(inputs=[{**X, "datatype": "FLOAT"}]), {}, 400,
         "input 'x': unknown datatype 'FLOAT'"),
        ("wrong name", "/v2/models/add/infer", _json(inputs=[{**X, "name": "z"}]), {}, 400,
         "unknown input 'z'; the model's inputs are ['x']"),
        ("missing input", "/v2/models/multi/infer", _json(inputs=[X]), {}, 400, "missing input(s) ['k', 's']"),
        ("unknown output", "/v2/models/add/infer", _json(inputs=[X], outputs=[{"name": "q"}]), {}, 400,
         "unknown output 'q'; the model's outputs are ['y']"),
        ("data shorter than shape", "/v2/models/add/infer", _json(inputs=[{**X, "data": [1, 2, 3, 4, 5]}]), {}, 400,
         "input 'x': shape [2, 3] holds 6 elements, data has 5"),
        ("data longer than shape", "/v2/models/add/infer", _json(inputs=[{**X, "data": list(range(7))}]), {}, 400,
         "input 'x': shape [2, 3] holds 6 elements, data has 7"),
        ("data not numbers", "/v2/models/add/infer", _json(inputs=[{**X, "data": ["a"] * 6}]), {}, 400,
         "input 'x': data must hold FP32 numbers, got str 'a'"),
        ("ragged data", "/v2/models/add/infer", _json(inputs=[{**X, "data": [[1, 2, 3], [4, 5]]}]), {}, 400,
         "input 'x': data is not a regular nested list"),
        ("int out of range", "/v2/models/multi/infer",
         _json(inputs=[{**X}, {"name": "k", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 2**70]},
                       {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]), {}, 400,
         f"input 'k': value {2**70} does not fit in INT64"),
        ("float into int", "/v2/models/multi/infer",
         _json(inputs=[{**X}, {"name": "k", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 4.5]},
                       {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]), {}, 400,
         "input 'k': INT64 data must be integers"),
        ("batch dims disagree", "/v2/models/multi/infer",
         _json(inputs=[{**X}, {"name": "k", "shape": [3, 2], "datatype": "INT64", "data": [1] * 6},
                       {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]), {}, 400,
         "input 'k': dim 0 is 'batch', which input 'x' set to 2; got 3"),
        ("body over --max-body-bytes", "/v2/models/add/infer", b" " * (MAX_BODY + 1), {}, 413,
         f"the request body is {MAX_BODY + 1} bytes, over --max-body-bytes ({MAX_BODY})"),
        ("gzip body inflating past the limit", "/v2/models/add/infer", gzip.compress(b" " * (MAX_BODY * 10)),
         {"Content-Encoding": "gzip"}, 413, "inflates to more than --max-body-bytes"),
        ("header length past the body", "/v2/models/add/infer", *_binary({"inputs": [binary_x]}, six_floats, 10_000),
         400, "Inference-Header-Content-Length is 10000, but the body has"),
        ("header length not a number", "/v2/models/add/infer", *_binary({"inputs": [binary_x]}, six_floats, "ten"),
         400, "Inference-Header-Content-Length must be an integer, got 'ten'"),
        ("header length cutting the JSON", "/v2/models/add/infer", *_binary({"inputs": [binary_x]}, six_floats, 20),
         400, "malformed JSON"),
        ("binary size past the body", "/v2/models/add/infer", *_binary({"inputs": [binary_x]}, six_floats[:20]),
         400, "input 'x': binary_data_size 24 at offset 0, but the binary part of the body has 20 bytes"),
        ("binary size not the shape's", "/v2/models/add/infer",
         *_binary({"inputs": [{**binary_x, "parameters": {"binary_data_size": 20}}]}, six_floats[:20]),
         400, "input 'x': shape [2, 3] of FP32 is 24 bytes, binary_data_size is 20"),
        ("bytes beyond the tensors", "/v2/models/add/infer", *_binary({"inputs": [binary_x]}, six_floats + b"\0" * 4),
         400, "the body has 4 bytes after the tensors it declares"),
        ("BYTES not UTF-8", "/v2/models/multi/infer",
         *_binary({"inputs": [X, {"name": "k", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 4]},
                              {"name": "s", "shape": [2], "datatype": "BYTES",
                               "parameters": {"binary_data_size": 10}}]},
                  b"\x01\0\0\0a" + b"\x01\0\0\0\xff"),
         400, "input 's': BYTES element 1 is not UTF-8"),
        ("unknown route", "/v2/nowhere", None, {}, 404, "GET /v2/nowhere: Not Found"),
    ]
    return [pytest.param(*c[1:], id=c[0]) for c in cases]


@pytest.mark.parametrize("path, body, headers, status, message", _bad_requests())
def test_bad_requests_get_4xx_naming_the_culprit(server, path, body, headers, status, message):
    if body is None:
        r = httpx.get(server.url + path, timeout=30)
    else:
        r = httpx.post(server.url + path, content=body, headers=headers, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error, error
    assert server.ready()


def test_a_failing_run_is_a_500_with_glassrt_message(server):
    ok = {"inputs": [{"name": "x", "shape": [6], "datatype": "FP32", "data": list(range(6))},
                     {"name": "s", "shape": [2], "datatype": "INT64", "data": [2, 3]}]}
    r = httpx.post(server.url + "/v2/models/reshape/infer", content=json.dumps(ok), timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [2, 3]
    failed_before = _metric(server.metrics(), "glassrt_server_requests_total", model="reshape", version="1",
                            status="500")
    ok["inputs"][1]["data"] = [4, 4]
    r = httpx.post(server.url + "/v2/models/reshape/infer", content=json.dumps(ok), timeout=30)
    assert r.status_code == 500, r.text
    assert "reshape_by_input" in r.json()["error"]  # glassrt's error names the node
    assert server.ready()
    assert _metric(server.metrics(), "glassrt_server_requests_total", model="reshape", version="1",
                   status="500") == failed_before + 1


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's RSS from /proc")
def test_many_requests_good_and_bad_do_not_grow_the_server(server):
    """200 requests of ~100 KB each, half refused at different stages: a request that kept
    its body would add ~20 MB."""
    x = np.random.default_rng(0).random((8000, 3), dtype=np.float32)
    good, headers = _binary({"inputs": [{"name": "x", "shape": [8000, 3], "datatype": "FP32",
                                         "parameters": {"binary_data_size": x.nbytes}}]}, x.tobytes())
    bad = [good[:-4], good + b"\0\0\0\0", good.replace(b'"FP32"', b'"FP64"')]

    def rss():
        status = Path(f"/proc/{server.proc.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) * 1024

    with httpx.Client(timeout=60) as http:
        def burst(n):
            for i in range(n):
                body = good if i % 2 else bad[i % 3]
                r = http.post(server.url + "/v2/models/add/infer", content=body, headers=headers)
                assert r.status_code == (200 if i % 2 else 400), r.text
        burst(60)  # warm: plans, pool, allocator arenas
        before = rss()
        burst(200)
        grown = rss() - before
    assert grown < 10 << 20, f"the server grew {grown / 2**20:.1f} MiB over 200 requests"
    assert server.ready()


def test_bad_requests_are_counted_without_new_series_for_unknown_names(server):
    for name in ("ghost1", "ghost2"):
        httpx.post(f"{server.url}/v2/models/{name}/infer", content=b"{}", timeout=30)
    text = server.metrics()
    assert "ghost" not in text
    assert _metric(text, "glassrt_server_requests_total", model="", version="", status="404") >= 2


# ---------------------------------------------------------------- metrics, explain, fallbacks


def test_metrics_serve_server_and_session_metrics(server, client):
    inp = httpclient.InferInput("x", [1, 3], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3), np.float32))
    before = _metric(server.metrics(), "glassrt_runs_total", model="tanh")
    client.infer("tanh", [inp])
    text = server.metrics()
    assert _metric(text, "glassrt_runs_total", model="tanh") == before + 1
    assert _metric(text, "glassrt_server_requests_total", model="tanh", version="1", status="200") >= 1
    assert _metric(text, "glassrt_server_queue_duration_seconds_count", model="tanh", version="1") >= 1
    # the Tanh node fell back to reference (tests/cpu_without_tanh.py took cpu's kernel away)
    assert _metric(text, "glassrt_fallback_nodes", model="tanh", op="Tanh", provider="reference") == 1
    # the first run of a session is profiled: node latency by op type and provider
    assert _metric(text, "glassrt_node_duration_seconds_count", model="tanh", op="Tanh", provider="reference") >= 1
    assert _metric(text, "glassrt_plan_cache_plans", model="tanh") == 1
    assert "glassrt_pool_fragmentation_ratio{" in text and "glassrt_arena_bytes{" in text


def test_explain_over_http_is_the_explain_report(server, models):
    r = httpx.get(server.url + "/v2/models/tanh/explain", timeout=30)
    assert r.status_code == 200
    report = r.json()
    row = next(n for n in report["nodes"] if n["name"] == "tanh")
    assert row["provider"] == "reference" and row["fallback"] is True
    assert report["summary"]["fallback_count"] == 1
    assert [n["name"] for n in report["nodes"]] == ["neg", "tanh"]


def test_strict_refuses_a_model_that_would_fall_back(models):
    from glassrt.kernels import registry
    from glassrt.runtime import _load_cpu_kernels

    _load_cpu_kernels()
    saved = list(registry.kernels_for("cpu", "", "Tanh"))
    registry.unregister("cpu", "", "Tanh")  # as tests/cpu_without_tanh.py does in the server above
    try:
        res = _cli("serve", models / "tanh.onnx", "--strict", "--providers", "cpu,reference")
    finally:
        for k in saved:
            registry.register(k)
    assert res.exit_code == 1, res.output
    out = _flat(res.output)
    assert "would fall back" in out and "Tanh node 'tanh'" in out and "no cpu kernel for Tanh" in out, out


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_create_app_is_a_factory_two_apps_in_one_process(models):
    """The app is importable and self-contained (a later host, e.g. Ray Serve, mounts it):
    two apps in one process, each with its own registry, answer and count on their own."""
    from fastapi.testclient import TestClient

    from glassrt.serve.app import create_app

    request = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    for runs in (1, 2):
        with TestClient(create_app([f"plus={models / 'add.onnx'}"], max_batch_size=1)) as http:
            for _ in range(runs):
                r = http.post("/v2/models/plus/infer", json=request)
                assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0, 3.0, 4.0]
            text = http.get("/metrics").text
            assert _metric(text, "glassrt_runs_total", model="plus") == runs
            assert _metric(text, "glassrt_server_requests_total", model="plus", version="1", status="200") == runs


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
@pytest.mark.parametrize("max_batch_size", [1, 8], ids=["unbatched", "batched"])
def test_a_full_queue_is_a_503(models, max_batch_size):
    from fastapi.testclient import TestClient

    from glassrt.serve.app import create_app

    request = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    with TestClient(create_app([str(models / "add.onnx")], max_batch_size=max_batch_size, max_queue=0)) as http:
        r = http.post("/v2/models/add/infer", json=request)
        assert r.status_code == 503 and "queue is full (0 requests waiting)" in r.json()["error"]
        assert http.get("/v2/health/ready").status_code == 200


# ---------------------------------------------------------------- repository and versions


def test_model_repository_with_versions(tmp_path):
    for name, version, m in (("plus", 1, plus_model(1)), ("plus", 2, plus_model(2)), ("plus", 10, plus_model(10)),
                             ("other", 3, plus_model(100))):
        (tmp_path / "repo" / name / str(version)).mkdir(parents=True)
        onnx.save(m, tmp_path / "repo" / name / str(version) / "model.onnx")
    (tmp_path / "repo" / "plus" / "config.pbtxt").write_text('name: "plus"\n')  # Triton's; left alone
    s = Server(["--model-repository", tmp_path / "repo", "--max-batch-size", 1], cwd=tmp_path)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{s.port}")
        assert client.get_model_metadata("plus")["versions"] == ["1", "2", "10"]
        assert client.is_model_ready("plus", "2") and not client.is_model_ready("plus", "3")
        x = np.zeros((1, 3), np.float32)
        inp = httpclient.InferInput("x", [1, 3], "FP32")
        inp.set_data_from_numpy(x)
        for version, plus in (("", 10), ("1", 1), ("2", 2), ("10", 10)):  # no version: the highest
            result = client.infer("plus", [inp], model_version=version)
            np.testing.assert_array_equal(result.as_numpy("y"), x + plus)
            assert result.get_response()["model_version"] == (version or "10")
        np.testing.assert_array_equal(client.infer("other", [inp]).as_numpy("y"), x + 100)
        with pytest.raises(InferenceServerException, match="model 'plus' has no version '3'"):
            client.infer("plus", [inp], model_version="3")
        # several versions of one name: the session metrics label them name/version
        assert _metric(httpx.get(s.url + "/metrics").text, "glassrt_runs_total", model="plus/1") == 1
    finally:
        s.stop()


def test_a_repository_folder_without_versions_is_refused(tmp_path):
    (tmp_path / "repo" / "empty" / "1").mkdir(parents=True)
    res = _cli("serve", "--model-repository", tmp_path / "repo")
    assert res.exit_code == 1 and "empty has no VERSION/model.onnx" in _flat(res.output), res.output


def test_serve_needs_models_and_names_them_once(tmp_path):
    onnx.save(add_model(), tmp_path / "a.onnx")
    res = _cli("serve")
    assert res.exit_code == 2 and "give MODEL files or --model-repository DIR" in res.output
    res = _cli("serve", tmp_path / "a.onnx", f"a={tmp_path / 'a.onnx'}")
    assert res.exit_code == 1 and "two models are named 'a'" in _flat(res.output), res.output
    res = _cli("serve", tmp_path / "missing.onnx")
    assert res.exit_code == 1 and "no such file" in _flat(res.output), res.output


# ---------------------------------------------------------------- deploy/: alerts and dashboard

ALERTS = ROOT / "deploy" / "prometheus" / "glassrt-alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "glassrt.json"


def test_alert_rules_pass_promtool_and_each_says_what_to_run():
    import shutil

    text = ALERTS.read_text()
    alerts = text.split("- alert: ")[1:]
    assert len(alerts) >= 8
    for block in alerts:  # each alert tells the on-call what to run next
        assert "`glassrt " in block, block.splitlines()[0]
    for must in ("glassrt_fallback_nodes", "glassrt_pool_fragmentation_ratio < 0.7", "glassrt_node_duration_seconds"):
        assert must in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus; CI installs it)")
    res = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and f"SUCCESS: {len(alerts)} rules found" in res.stdout, res.stdout + res.stderr


def test_every_metric_in_the_alerts_and_dashboard_is_served(server, client):
    import re

    from prometheus_client.parser import text_string_to_metric_families

    inp = httpclient.InferInput("x", [1, 3], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3), np.float32))
    client.infer("tanh", [inp])  # a run (profiled: the first one is) on a model that falls back
    bad = {"inputs": [{"name": "x", "shape": [6], "datatype": "FP32", "data": [0] * 6},
                      {"name": "s", "shape": [2], "datatype": "INT64", "data": [5, 5]}]}
    assert httpx.post(server.url + "/v2/models/reshape/infer", json=bad, timeout=30).status_code == 500  # a run error
    served = set()
    for family in text_string_to_metric_families(server.metrics()):
        # the family (its HELP and TYPE lines) even where no series exists yet (no transfers on cpu)
        served |= {family.name} | {s.name for s in family.samples}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dashboard["templating"]["list"]]
    used = set(re.findall(r"\bglassrt_[a-z0-9_]+", ALERTS.read_text() + "\n".join(exprs)))
    assert len(used) >= 15
    missing = sorted(used - served)
    assert not missing, f"named in deploy/ but not served by /metrics: {missing}"
    assert all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in dashboard["panels"] if p["type"] != "row")


def test_without_the_extra_serve_says_how_to_install(monkeypatch, models):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if `pip install glassrt` without [serve]
    res = _cli("serve", models / "add.onnx")
    assert res.exit_code == 1 and "pip install 'glassrt[serve]'" in res.output and "uvicorn" in res.output, res.output


# ---------------------------------------------------------------- helpers


def _cli(*args):
    """`glassrt ARGS` in this process (no server starts: each of these fails while loading)."""
    from click.testing import CliRunner

    from glassrt import cli

    width = cli.console.width
    cli.console.width = 10_000  # no wrapping inside the long paths of the messages
    try:
        return CliRunner().invoke(cli.main, [str(a) for a in args])
    finally:
        cli.console.width = width


def _flat(text: str) -> str:
    """rich wraps long lines at the terminal's width: the words, one space apart."""
    return " ".join(text.split())


def _metric(text: str, name: str, **labels) -> float:
    """The value of one sample in Prometheus' text format (0 when the series is absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()) \
                    and set(sample.labels) == set(labels):
                return sample.value
    return 0.0


def test_an_idle_connection_outlives_uvicorns_five_seconds(server):
    """Pooled clients reuse idle connections: `glassrt serve` keeps them 75 s (--keep-alive),
    not uvicorn's 5 s, after which a reused connection was reset under the client."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().read() is not None
        sock = conn.sock
        time.sleep(6)
        conn.request("GET", "/v2/health/ready")
        r = conn.getresponse()
        assert r.status == 200 and conn.sock is sock  # the same connection, still open
    finally:
        conn.close()
