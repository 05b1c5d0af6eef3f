"""`glassrt serve --ray`: the same v2 app (app.create_app) as a Ray Serve deployment.

The driver (the `glassrt serve --ray` process) checks that each model file parses and puts
its bytes in Ray's object store, once; every replica gets the ObjectRefs in its constructor
arguments and fetches the bytes from its node's store (one copy per node, no replica reads
the file).
Each replica then builds the whole app once, as `glassrt serve` does in one process: its own
sessions (plans compiled once, reused), its own dynamic batcher, its own Prometheus registry.
Ray Serve's HTTP proxy routes each request to one replica (FastAPI ingress).

Needs the `ray` extra: pip install 'glassrt[ray]'. Nothing else in glassrt imports this module.
"""
from __future__ import annotations

import inspect
import logging
import os
import re
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import ray
from ray import serve

from ..errors import GlassrtError
from ..onnx_io import read_model
from .repository import ModelSource, resolve

log = logging.getLogger("glassrt.serve")

APP_NAME = "glassrt"
DEPLOYMENT_NAME = "GlassrtServer"
MIN_OBJECT_STORE_BYTES = 128 << 20  # above Ray's own floor (75 MiB), room for the models and Serve's objects


@dataclass(frozen=True)
class Scaling:
    """A fixed number of replicas, or Ray Serve's autoscaling between min and max."""
    replicas: int = 1
    autoscale: tuple[int, int] | None = None

    def deployment_options(self) -> dict:
        if self.autoscale is None:
            return {"num_replicas": self.replicas}
        low, high = self.autoscale
        return {"autoscaling_config": {"min_replicas": low, "max_replicas": high}}

    def describe(self) -> str:
        if self.autoscale is None:
            return f"{self.replicas} replica{'s' * (self.replicas != 1)}"
        return f"autoscaling between {self.autoscale[0]} and {self.autoscale[1]} replicas"


def parse_scaling(replicas: int | None, autoscale: str | None) -> Scaling:
    if replicas is not None and autoscale is not None:
        raise GlassrtError("give --replicas N or --autoscale MIN:MAX, not both")
    if autoscale is None:
        n = 1 if replicas is None else replicas
        if n < 1:
            raise GlassrtError(f"--replicas must be at least 1, got {n}")
        return Scaling(replicas=n)
    low, sep, high = autoscale.partition(":")
    try:
        bounds = int(low), int(high)
    except ValueError:
        bounds = None
    if not sep or bounds is None or bounds[0] < 0 or bounds[1] < 1 or bounds[0] > bounds[1]:
        raise GlassrtError(f"--autoscale must be MIN:MAX with 0 <= MIN <= MAX and MAX >= 1, got {autoscale!r}")
    return Scaling(autoscale=bounds)


class GlassrtServer:
    """One replica: the models' bytes fetched from the object store, the app built once."""

    def __init__(self, models: list, app_options: dict, modules: tuple = ()):
        # models: [(name, version, path, ObjectRef of the bytes)], nested in a list, so they
        # arrive as refs: one ray.get for all of them. `path` only names the model (and the
        # folder its external data is read from).
        from ..tools.check import load_module

        for module in modules:  # custom ops register in this process too, before the models load
            load_module(module)
        blobs = ray.get([ref for *_, ref in models])
        self.sources = [ModelSource(name, version, Path(path), data=blob)
                        for (name, version, path, _), blob in zip(models, blobs)]
        self.app_options = app_options

    def __serve_build_asgi_app__(self):
        from .app import create_app

        return create_app(self.sources, **self.app_options)


def _ingress_class():
    """GlassrtServer with Serve's FastAPI ingress, late-bound: each replica builds its own app
    (sessions, batcher, registry) in __serve_build_asgi_app__, after its constructor."""
    if inspect.signature(serve.ingress).parameters["app"].default is not None:
        raise GlassrtError(f"glassrt serve --ray needs a Ray Serve whose serve.ingress() builds the app in "
                           f"each replica (ray {ray.__version__} has none): pip install -U 'glassrt[ray]'")
    return serve.ingress()(GlassrtServer)


def _object_store_bytes(sources) -> int:
    return max(MIN_OBJECT_STORE_BYTES, 4 * sum(s.path.stat().st_size for s in sources))


def deploy(models, *, scaling: Scaling, address: str | None, host: str, port: int, app_options: dict,
           modules: tuple = (), say=print, connected=lambda: None) -> dict:
    """Connect to Ray (the cluster at `address`, RAY_ADDRESS, or a new local runtime), put the
    models in the object store and run the app on Serve's proxy at host:port. Returns what
    stop() needs. A model that cannot load fails the deployment here, with its replica's error.
    connected() is called once Ray is up (ray.init installs signal handlers of its own)."""
    sources = [ModelSource(s.name, s.version, s.path.resolve()) for s in resolve(models)]
    for s in sources:  # a file that is no ONNX model fails here, by its path, before any Ray process starts
        read_model(str(s.path))
    ingress = _ingress_class()
    owned_runtime = not ray.is_initialized() and not address and not os.environ.get("RAY_ADDRESS")
    try:
        if not ray.is_initialized():
            if address:
                ray.init(address=address, logging_level="warning")
            else:
                # RAY_ADDRESS set: ray.init() connects to that cluster, as `ray` itself does; else a
                # local runtime sized for these models, no dashboard (a cluster of yours has one).
                ray.init(include_dashboard=False, object_store_memory=_object_store_bytes(sources),
                         logging_level="warning")
    except Exception as e:  # noqa: BLE001  no cluster there, a version mismatch...: Ray's reason, no traceback
        ray.shutdown()
        where = address or os.environ.get("RAY_ADDRESS") or "a local runtime"
        raise GlassrtError(f"cannot start Ray ({where}): {type(e).__name__}: {e}") from e
    except BaseException:  # Ctrl-C or SIGTERM while it starts: leave no half-started runtime
        ray.shutdown()
        raise
    try:
        connected()
        refs = [(s.name, s.version, str(s.path), ray.put(s.path.read_bytes())) for s in sources]
        serve.start(http_options={"host": host, "port": port})
        max_batch = app_options.get("max_batch_size", 8)
        deployment = serve.deployment(ingress, name=DEPLOYMENT_NAME,
                                      # room for a full batch while another runs; more wait in Serve's queue
                                      max_ongoing_requests=max(16, 2 * max_batch),
                                      **scaling.deployment_options())
        say(f"deploying on Ray Serve ({scaling.describe()}), cluster {_cluster_address()}")
        # a module given as a .py file is found from the replicas' working folder too
        modules = tuple(str(Path(m).resolve()) if m.endswith(".py") and Path(m).is_file() else m for m in modules)
        serve.run(deployment.bind(refs, app_options, modules), name=APP_NAME, route_prefix="/")
        http, note = _serve_http_address(host, port)
        if note:
            say(note)
    except Exception as e:  # noqa: BLE001  a replica failed to start (a model that cannot load): Serve says why
        why = _replica_error()
        stop(owned_runtime)
        raise GlassrtError(f"the deployment on Ray Serve failed: {e}" + (f"\nin a replica: {why}" if why else "")) \
            from e
    return {"owned_runtime": owned_runtime, "sources": sources, "refs": refs, "http": http}


def _serve_http_address(host: str, port: int) -> tuple[str, str | None]:
    """Where Serve's proxies listen: the cluster's setting, which a Serve already running keeps
    whatever --host/--port say (Ray only logs it)."""
    from ray.serve.context import _get_global_client

    config = _get_global_client().http_config
    note = None
    if (config.host, config.port) != (host, port):
        note = (f"note: Ray Serve already runs on this cluster on {config.host}:{config.port} and keeps it: "
                f"--host {host} --port {port} do not apply")
    return f"http://{config.host}:{config.port}", note


def _replica_error() -> str | None:
    """The exception that ends the traceback Serve keeps for a replica that failed to start
    (a glassrt error: which model, which nodes), or None."""
    try:
        message = serve.status().applications[APP_NAME].deployments[DEPLOYMENT_NAME].message
    except Exception:  # noqa: BLE001  Serve never got that far
        return None
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if re.match(r"[\w.]+(Error|Exception): ", line)]
    return "\n".join(lines[starts[-1]:]) if starts else (lines[-1] if lines else None)


def _cluster_address() -> str:
    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001  a Ray client (ray://) connection does not know it
        return os.environ.get("RAY_ADDRESS", "(via Ray client)")


def replica_states() -> dict:
    """{state: count} of the deployment's replicas, from Serve's status API."""
    app = serve.status().applications.get(APP_NAME)
    if app is None or DEPLOYMENT_NAME not in app.deployments:
        return {}
    return {str(k): v for k, v in app.deployments[DEPLOYMENT_NAME].replica_states.items()}


def stop(owned_runtime: bool) -> None:
    """Serve and the local runtime shut down when this process started them; on a cluster of
    yours only this application goes, and Serve keeps running for the others."""
    try:
        if owned_runtime:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
    except Exception as e:  # noqa: BLE001  Serve never started (a failed deploy): still leave Ray
        log.warning("stopping Ray Serve: %s: %s", type(e).__name__, e)
    finally:
        ray.shutdown()  # the local runtime's processes end; on a cluster of yours, this driver disconnects


def run_command(models, *, scaling: Scaling, address, host, port, app_options, modules, console) -> None:
    say = lambda text: console.print(text, highlight=False, markup=False)  # noqa: E731
    # Ctrl-C and SIGTERM only set a flag: one that comes while Serve deploys stops it right
    # after, and the shutdown itself is never cut short. Installed once Ray is up: ray.init puts
    # in a SIGTERM handler of its own that aborts the driver (status 134) and skips the shutdown.
    stopping = threading.Event()
    previous = {}

    def trap_signals():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stopping.set())

    try:
        state = deploy(models, scaling=scaling, address=address, host=host, port=port, app_options=app_options,
                       modules=modules, say=say, connected=trap_signals)
        try:
            for s in state["sources"]:
                say(f"serving {s.name} version {s.version} ({s.path}) on Ray Serve")
            states = ", ".join(f"{n} {k}" for k, n in replica_states().items())
            say(f"replicas: {states}; {state['http']}/v2 (Ctrl-C stops)")
            console.file.flush()  # a log file learns it is up now, not when a block fills
            while not stopping.wait(1.0):
                pass
        finally:
            say("stopping: " + ("Serve and the local Ray runtime" if state["owned_runtime"]
                                else f"application {APP_NAME!r} (the cluster keeps running)"))
            console.file.flush()
            stop(state["owned_runtime"])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # None: set outside Python
