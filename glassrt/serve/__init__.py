"""`glassrt serve`: the KServe / Triton v2 inference protocol over HTTP (FastAPI on uvicorn).

protocol.py   v2 JSON and binary tensors, datatypes, request validation
repository.py which models, under which names and versions
batching.py   the dynamic batcher
metrics.py    the server's Prometheus metrics (the sessions' are glassrt.tools.metrics)
app.py        create_app(models, ...) -> fastapi.FastAPI
on_ray.py     `glassrt serve --ray`: the same app as a Ray Serve deployment (the `ray` extra)

Needs the `serve` extra: pip install 'glassrt[serve]'. Importing this package imports none
of it; `from glassrt.serve.app import create_app` does.
"""
