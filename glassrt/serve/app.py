"""The v2 inference server as a FastAPI app: `create_app(models, ...)`.

A factory with no process-global state but the Prometheus registry it is given (a fresh one
by default), so that `glassrt serve` runs it on uvicorn and another host (Ray Serve, a test's
TestClient) can import and mount the same app. The models are loaded when the app is made:
a model that cannot load (or would fall back, with strict=True) fails here, before any
port is opened.

Routes (KServe / Triton v2): GET /v2, /v2/health/live, /v2/health/ready,
/v2/models/{name}[/versions/{v}], .../ready, POST .../infer, and glassrt's own
GET .../explain (the explain report as JSON) and GET /metrics.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException

from ..errors import GlassrtError, InputError
from . import protocol
from .batching import Batcher
from .metrics import ServerMetrics
from .protocol import HEADER_LENGTH, ProtocolError
from .repository import ModelSource, resolve

log = logging.getLogger("glassrt.serve")

DEFAULT_MAX_BODY_BYTES = 64 << 20


@dataclass
class ServedModel:
    source: ModelSource
    session: object
    inputs: dict  # name -> (v2 datatype, shape: ints, names of symbolic dims, None)
    outputs: dict  # name -> (v2 datatype, shape)
    batchable: bool
    batcher: Batcher | None = None
    label: str = ""  # the session metrics' model label
    waiting: int = 0  # unbatched requests in the executor's queue or running
    output_names: list = field(default_factory=list)

    @property
    def name(self):
        return self.source.name

    @property
    def version(self):
        return self.source.version

    def metadata(self, versions) -> dict:
        def tensors(specs):
            return [{"name": n, "datatype": dt, "shape": [d if isinstance(d, int) else -1 for d in shape or []]}
                    for n, (dt, shape) in specs.items()]

        return {"name": self.name, "versions": versions, "platform": "glassrt_onnx",
                "inputs": tensors(self.inputs), "outputs": tensors(self.outputs)}


def _specs(args, what, source) -> dict:
    out = {}
    for a in args:
        dt = protocol.datatype_of_type(a.type)
        if dt is None:
            raise GlassrtError(f"model {source.name!r} ({source.path}): {what} '{a.name}' is {a.type}; the v2 "
                               f"protocol carries tensors of its datatypes only")
        out[a.name] = (dt, a.shape)
    return out


def _batch_dim(specs: dict) -> str | None:
    """The symbolic dim every tensor has first, if there is one."""
    firsts = {shape[0] if shape else None for _, shape in specs.values()}
    (first,) = firsts if len(firsts) == 1 else (None,)
    return first if isinstance(first, str) else None


def load_model(source: ModelSource, *, providers=None, strict=False, registry=None, label=None) -> ServedModel:
    import glassrt
    from glassrt.tools.metrics import instrument

    # strict: fallback="error" refuses the model at creation, listing every node that would
    # fall back (and a request whose shapes would make one fall back fails with the reason).
    # Otherwise the fallbacks are logged once here and exported as a metric.
    model, base_dir = (str(source.path), None) if source.data is None else (source.data, str(source.path.parent))
    sess = glassrt.InferenceSession(model, providers=providers, fallback="error" if strict else "silent",
                                    base_dir=base_dir)
    for f in sess.fallbacks:
        log.warning("model %s version %s: fallback: %s (--strict refuses such a model)", source.name, source.version, f)
    inputs = _specs(sess.get_inputs(), "input", source)
    outputs = _specs(sess.get_outputs(), "output", source)
    batch = _batch_dim(inputs)
    model = ServedModel(source, sess, inputs, outputs, batchable=batch is not None and _batch_dim(outputs) == batch,
                        label=label or source.name, output_names=list(outputs))
    if registry is not None:
        instrument(sess, model=model.label, registry=registry)
    return model


def create_app(models, *, max_batch_size: int = 8, batch_timeout_ms: float = 1.0,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, strict: bool = False, providers=None,
               registry=None, max_queue: int = 1024, workers: int | None = None):
    """The app serving `models`: ModelSources, MODEL arguments (`PATH`, `NAME=PATH`) or a
    Triton-style repository folder. max_batch_size <= 1 turns dynamic batching off;
    models without one named batch dim first on every input and output are never batched.
    registry: the prometheus_client registry for /metrics (a fresh CollectorRegistry when None).
    workers: threads that run sessions (default: the CPUs this process may use)."""
    import glassrt

    if registry is None:
        registry = CollectorRegistry()
    if max_body_bytes <= 0:
        raise GlassrtError(f"max_body_bytes must be positive, got {max_body_bytes}")
    if batch_timeout_ms < 0:
        raise GlassrtError(f"batch_timeout_ms must be 0 or more, got {batch_timeout_ms}")
    sources = resolve(models)
    multi = {s.name for s in sources if sum(t.name == s.name for t in sources) > 1}
    served: dict[str, dict[str, ServedModel]] = {}
    for s in sources:
        # one series per session: a name with several versions labels them name/version
        label = f"{s.name}/{s.version}" if s.name in multi else s.name
        served.setdefault(s.name, {})[s.version] = load_model(s, providers=providers, strict=strict,
                                                              registry=registry, label=label)
    server_metrics = ServerMetrics(registry)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    executor = ThreadPoolExecutor(max_workers=workers or cpus,
                                  thread_name_prefix="glassrt-serve")
    batching = max_batch_size > 1
    for versions in served.values():
        for m in versions.values():
            if batching and m.batchable:
                m.batcher = Batcher(_runner(m), executor, max_batch_size=max_batch_size,
                                    timeout_s=batch_timeout_ms / 1000, max_queue=max_queue,
                                    on_run=_observer(server_metrics, m))

    @asynccontextmanager
    async def lifespan(app):
        yield
        for versions in served.values():
            for m in versions.values():
                if m.batcher:
                    m.batcher.close()
        executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="glassrt", version=glassrt.__version__,
                  lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.models = served
    app.state.registry = registry

    def error(status: int, message: str):
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(ProtocolError)
    async def _protocol_error(request, e: ProtocolError):
        return error(e.status, str(e))

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):  # unknown routes, wrong methods
        return error(e.status_code, f"{request.method} {request.url.path}: {e.detail}")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e):
        return error(400, str(e))

    def find(name: str, version: str | None) -> ServedModel:
        versions = served.get(name)
        if versions is None:
            raise ProtocolError(f"unknown model '{name}'; this server has {sorted(served)}", 404)
        if version is None:
            return versions[max(versions, key=int)]
        if version not in versions:
            raise ProtocolError(f"model '{name}' has no version '{version}'; it has {sorted(versions, key=int)}", 404)
        return versions[version]

    @app.get("/v2")
    async def server_metadata():
        return {"name": "glassrt", "version": app.version, "extensions": ["binary_tensor_data"]}

    @app.get("/v2/health/live")
    async def live():
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready():
        return Response(status_code=200)  # every model loaded when the app was made

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None):
        m = find(name, version)
        return m.metadata(sorted(served[name], key=int))

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None):
        find(name, version)
        return Response(status_code=200)

    @app.get("/v2/models/{name}/explain")
    @app.get("/v2/models/{name}/versions/{version}/explain")
    async def explain(name: str, version: str | None = None):
        from ..tools.explain import explain as build_report

        m = find(name, version)
        # off the event loop: a big model's report takes a while, and requests keep coming
        report = await asyncio.get_running_loop().run_in_executor(executor, build_report, m.session)
        # explain's report holds formulas for symbolic dims (symbolic.Dim): strings, as `glassrt explain --json` writes them
        return Response(json.dumps(report, default=str), media_type="application/json")

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str | None = None):
        t0 = time.perf_counter()
        labels, status = ("", ""), 500
        try:
            m = find(name, version)
            labels = (m.name, m.version)
            response = await _infer(m, request)
            status = 200
            return response
        except ProtocolError as e:
            status = e.status
            return error(e.status, str(e))
        except InputError as e:  # glassrt's own feed checks (a symbolic dim two inputs disagree on...)
            status = 400
            return error(400, str(e))
        except GlassrtError as e:  # the run failed: the model's fault or glassrt's, not the request's form
            status = 500
            return error(500, str(e))
        except Exception as e:  # noqa: BLE001  never take the server down; say what happened
            log.exception("inference on %s failed", name)
            status = 500
            return error(500, f"internal error: {type(e).__name__}: {e}")
        finally:
            server_metrics.request(*labels, status, time.perf_counter() - t0)

    async def _infer(m: ServedModel, request: Request):
        body = await _read_body(request, max_body_bytes)
        body = protocol.decompress(body, request.headers.get("content-encoding"), max_body_bytes)
        req, binary = protocol.split_body(body, request.headers.get(HEADER_LENGTH))
        feeds = protocol.decode_inputs(req, binary, m.inputs)
        wanted = protocol.requested_outputs(req, m.output_names)
        request_id = req.get("id")
        if request_id is not None and not isinstance(request_id, str):
            raise ProtocolError(f"'id' must be a string, got {request_id!r}")
        feeds = m.session._check_feeds(feeds)  # glassrt's own checks before the request joins a batch
        if m.batcher is not None:
            outs = await m.batcher.submit(feeds)
        else:
            outs = await _run_alone(m, feeds)
        if isinstance(outs, BaseException):
            raise outs
        by_name = dict(zip(m.output_names, outs))
        header = {"model_name": m.name, "model_version": m.version, **({"id": request_id} if request_id else {})}
        body, header_length = protocol.encode_response(header, [(n, by_name[n], b) for n, b in wanted])
        headers = {HEADER_LENGTH: str(header_length)} if header_length is not None else {}
        return Response(body, media_type="application/octet-stream" if header_length else "application/json",
                        headers=headers)

    async def _run_alone(m: ServedModel, feeds):
        # the executor's queue has no bound of its own: the same limit as a batcher's queue
        if m.waiting >= max_queue:
            raise ProtocolError(f"the model's queue is full ({max_queue} requests waiting); retry later", 503)
        m.waiting += 1  # only the event loop's thread touches it
        try:
            return await _run_in_executor(m, feeds)
        finally:
            m.waiting -= 1

    async def _run_in_executor(m: ServedModel, feeds):
        enqueued = time.perf_counter()
        rows = next(iter(feeds.values())).shape[0] if m.batchable else 1

        def work():
            server_metrics.run(m.name, m.version, rows, [time.perf_counter() - enqueued])
            return m.session.run(None, feeds)

        return await asyncio.get_running_loop().run_in_executor(executor, work)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _runner(m: ServedModel):
    return lambda feeds: m.session.run(None, feeds)


def _observer(server_metrics: ServerMetrics, m: ServedModel):
    return lambda rows, queued: server_metrics.run(m.name, m.version, rows, queued)


async def _read_body(request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to pass `limit` bytes: from
    Content-Length before reading anything, else while it streams in."""
    length = request.headers.get("content-length")
    if length is not None:
        try:
            n = int(length)
        except ValueError:
            raise ProtocolError(f"Content-Length must be an integer, got {length!r}") from None
        if n > limit:
            raise ProtocolError(f"the request body is {n} bytes, over --max-body-bytes ({limit})", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProtocolError(f"the request body passes --max-body-bytes ({limit} bytes)", 413)
        chunks.append(chunk)
    return b"".join(chunks)
