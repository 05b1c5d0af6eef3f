"""`glassrt serve --ray --replicas 2`: the command in a subprocess (it starts its own local
Ray runtime), driven by tritonclient through Ray Serve's HTTP proxy; answers checked against
an in-process session, both replicas seen serving, and no Ray process left once it stops.
The tests without Ray (the install hint, no `import ray` in the core) run everywhere."""
from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest

import glassrt
from tests.helpers import add_model

RAY_MISSING = subprocess.run([sys.executable, "-c", "import ray.serve, psutil, httpx, tritonclient.http"],
                             capture_output=True).returncode != 0
needs_ray = pytest.mark.skipif(RAY_MISSING, reason="needs glassrt[ray] (and the test extra: psutil, tritonclient)")
REPLICA = "ray::ServeReplica:glassrt:GlassrtServer"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray_models") / "add.onnx"
    onnx.save(add_model(), path)
    return path


# ---------------------------------------------------------------- without Ray


def test_core_and_plain_serve_never_import_ray():
    code = ("import sys, glassrt, glassrt.cli, glassrt.serve.app\n"
            "assert 'ray' not in sys.modules, 'ray was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_ray_the_flag_says_how_to_install_it(model_file):
    # sys.modules['ray'] = None: `import ray` raises ImportError, as when it is not installed
    code = ("import sys; sys.modules['ray'] = None\n"
            "from glassrt.cli import main\n"
            f"main(['serve', {str(model_file)!r}, '--ray', '--replicas', '2'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "glassrt serve --ray needs Ray Serve (ray is missing): pip install 'glassrt[ray]'" in done.stderr


def test_ray_options_need_the_flag(model_file):
    from click.testing import CliRunner

    from glassrt.cli import main

    result = CliRunner().invoke(main, ["serve", str(model_file), "--replicas", "2"])
    assert result.exit_code == 2 and "--replicas, --autoscale and --address go with --ray" in result.output


@needs_ray
@pytest.mark.parametrize("replicas, autoscale, expected", [
    (None, None, {"num_replicas": 1}),
    (3, None, {"num_replicas": 3}),
    (None, "0:4", {"autoscaling_config": {"min_replicas": 0, "max_replicas": 4}}),
])
def test_scaling_options(replicas, autoscale, expected):
    from glassrt.serve.on_ray import parse_scaling

    assert parse_scaling(replicas, autoscale).deployment_options() == expected


@needs_ray
@pytest.mark.parametrize("replicas, autoscale, message", [
    (2, "1:2", "not both"), (0, None, "at least 1"), (None, "3:1", "MIN:MAX"), (None, "2", "MIN:MAX"),
    (None, "a:b", "MIN:MAX"), (None, "0:0", "MIN:MAX"),
])
def test_bad_scaling_is_refused(replicas, autoscale, message):
    from glassrt.errors import GlassrtError
    from glassrt.serve.on_ray import parse_scaling

    with pytest.raises(GlassrtError, match=message):
        parse_scaling(replicas, autoscale)


def test_an_app_loads_models_from_bytes_without_the_file(model_file, tmp_path):
    """What a replica does with the bytes from the object store: the file is never read."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from glassrt.serve.app import create_app
    from glassrt.serve.repository import ModelSource

    gone = tmp_path / "not_here" / "add.onnx"
    app = create_app([ModelSource("add", "1", gone, data=model_file.read_bytes())], max_batch_size=1)
    with TestClient(app) as http:
        body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
        r = http.post("/v2/models/add/infer", json=body)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 3, 4]
    assert not gone.parent.exists()


@needs_ray
def test_a_file_that_is_no_model_fails_before_ray_starts(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    done = subprocess.run([sys.executable, "-m", "glassrt.cli", "serve", "bad.onnx", "--ray"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    # (rich wraps at 80 columns, inside words too: compared without whitespace)
    assert done.returncode == 1 and "bad.onnx:notavalidONNXmodel" in "".join(done.stdout.split()), done.stdout
    assert "Ray" not in done.stdout + done.stderr  # refused before any Ray process started


# ---------------------------------------------------------------- on a local Ray runtime


def _serving(server) -> str:
    """The replicas line the command prints once serve.run returns (the proxy answers before)."""
    deadline = time.monotonic() + 60
    while not (found := re.search(r"^replicas: (.*);", server.log.read_text(), re.M)):
        assert time.monotonic() < deadline, server.log.read_text()[-3000:]
        time.sleep(0.2)
    return found[1]


@needs_ray
def test_serve_on_ray_with_two_replicas(model_file):
    """One test, one runtime: pytest-xdist would start a Ray runtime per worker for a shared
    fixture, and the last step stops it."""
    import httpx
    import psutil
    import tritonclient.http as httpclient

    from tests.test_serve import Server, _metric

    # batch timeout 20 ms: concurrent requests stack, so each replica's batcher is exercised
    server = Server([model_file, "--ray", "--replicas", 2, "--max-batch-size", 8, "--batch-timeout-ms", 20],
                    cwd=model_file.parent)
    try:
        # Everything the command started (gcs_server, raylet, the workers: Serve's controller,
        # proxy and replicas), seen while it serves: none of it may outlive the command.
        spawned = psutil.Process(server.proc.pid).children(recursive=True)
        assert _serving(server) == "2 RUNNING"  # Serve's status API, as the command prints it
        replicas = [p for p in spawned if REPLICA in " ".join(p.cmdline())]
        assert len(replicas) == 2, [" ".join(p.cmdline()) for p in spawned]

        # concurrent requests, JSON and binary, each answered with its own rows
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", concurrency=16, network_timeout=120)
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal((1 + i % 3, 3)).astype(np.float32) for i in range(48)]
        pending = []
        for i, x in enumerate(xs):
            inp = httpclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=i % 2 == 0)
            pending.append(client.async_infer("add", [inp]))
        local = glassrt.InferenceSession(str(model_file))
        for x, p in zip(xs, pending):
            np.testing.assert_array_equal(p.get_result().as_numpy("y"), local.run(None, {"x": x})[0])
        with httpx.Client(timeout=60) as http:
            for i in range(32):
                body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [i, 0, 1]}]}
                r = http.post(f"{server.url}/v2/models/add/infer", json=body)
                assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [i + 1, 1, 2]

            # What the README claims: a scrape through the proxy is one replica's registry, so
            # the scrapes show two counts, one per replica, that add up to every request.
            seen = set()
            deadline = time.monotonic() + 30
            while len(seen) < 2 and time.monotonic() < deadline:
                seen.add(_metric(http.get(f"{server.url}/metrics").text, "glassrt_server_requests_total",
                                 model="add", version="1", status="200"))
            # (an even split shows one count only: each replica's is half of every request)
            total = 48 + 32
            assert (len(seen) == 2 and sum(seen) == total and min(seen) > 0) or seen == {total / 2}, seen

            # the glass box and the errors come through the proxy as from `glassrt serve`
            report = http.get(f"{server.url}/v2/models/add/explain").json()
            assert report["inputs"] == [{"name": "x", "dtype": "float", "shape": ["batch", 3]}]
            r = http.post(f"{server.url}/v2/models/nope/infer", json={"inputs": []})
            assert r.status_code == 404 and r.json() == {"error": "unknown model 'nope'; this server has ['add']"}
    finally:
        server.stop()  # SIGTERM: the command shuts Serve and its Ray runtime down
    assert server.proc.returncode == 0, server.log.read_text()[-3000:]
    assert "stopping: Serve and the local Ray runtime" in server.log.read_text()
    _, alive = psutil.wait_procs(spawned, timeout=30)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [" ".join(p.cmdline()) for p in alive]


CLUSTER = """
import signal, sys, threading, ray
ray.init(num_cpus=2, include_dashboard=False, object_store_memory=150 * 2**20, logging_level="warning")
print(ray.get_runtime_context().gcs_address, flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
ray.shutdown()
"""

@needs_ray
def test_serve_on_an_existing_cluster_leaves_it_running(model_file, monkeypatch):
    """--address: the command deploys on a runtime it did not start; stopping deletes its
    application only, and the cluster (and Serve on it) keeps running."""
    # A local ray.init() turns Ray's token authentication on (Ray 2.60): a driver that connects
    # must say so, and reads the token ray.init wrote (~/.ray/auth_token), as the README says.
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    import httpx
    import psutil

    from tests.test_serve import ROOT, Server, _free_port, tanh_model

    cluster = subprocess.Popen([sys.executable, "-c", CLUSTER], stdout=subprocess.PIPE, text=True)
    try:
        address = cluster.stdout.readline().strip()
        assert re.fullmatch(r"[\d.]+:\d+", address), address
        # A model its replica refuses (--strict, and Tanh falls back once the --module, loaded in
        # the replica too, takes it from cpu): the command fails with the replica's glassrt error.
        onnx.save(tanh_model(), model_file.parent / "tanh.onnx")
        for _ in range(3):  # a port found free can be taken before Serve's proxy binds it (the cluster's own workers)
            port = _free_port()
            refused = subprocess.run([sys.executable, "-m", "glassrt.cli", "serve", "tanh.onnx", "--ray", "--address",
                                      address, "--strict", "--providers", "cpu,reference",
                                      "--module", ROOT / "tests" / "cpu_without_tanh.py", "--port", str(port)],
                                     cwd=model_file.parent, capture_output=True, text=True, timeout=300)
            if "Failed to bind to address" not in refused.stdout:
                break
        assert refused.returncode == 1, refused.stdout[-3000:]
        assert "in a replica: glassrt.errors.FallbackError: 1 node(s) would fall back from 'cpu':\n" \
               "Tanh node 'tanh' ran on reference" in " ".join(refused.stdout.split(" \n")), refused.stdout[-3000:]

        # Serve, started by the refused deploy, keeps its port (the cluster's): the same port again
        server = Server([model_file, "--ray", "--address", address], cwd=model_file.parent, port=port)
        try:
            assert _serving(server) == "1 RUNNING"
            body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
            r = httpx.post(f"{server.url}/v2/models/add/infer", json=body, timeout=60)
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 3, 4]
        finally:
            server.stop()
        assert server.proc.returncode == 0, server.log.read_text()[-3000:]
        assert "application 'glassrt' (the cluster keeps running)" in server.log.read_text()
        # Serve's proxy still answers, and routes nothing: the glassrt application is gone
        assert httpx.get(f"{server.url}/-/routes", timeout=30).json() == {}
        runtime = psutil.Process(cluster.pid).children(recursive=True)
        assert any("raylet" in " ".join(p.cmdline()) for p in runtime)  # still there
    finally:
        runtime = psutil.Process(cluster.pid).children(recursive=True)
        cluster.terminate()
        cluster.wait(timeout=60)
        psutil.wait_procs(runtime, timeout=30)
