"""glassrt on Ray: batch inference with Ray Data (`Predictor`, `glassrt batch`).

    import ray, glassrt.ray
    ref = glassrt.ray.model_ref("model.onnx")          # the bytes go to the object store once
    out = ds.map_batches(glassrt.ray.Predictor, batch_format="numpy", batch_size=64, concurrency=4,
                         fn_constructor_kwargs={"model": ref, "inputs": {"pixels": "x"}, "run": "job-1"})
    out.materialize()
    glassrt.ray.Predictor.stats("job-1")                # each actor's fallbacks and plan-cache counts

Ray is an optional extra (`pip install 'glassrt[ray]'`): `import glassrt` never imports it,
and importing this package does not either; what needs Ray imports it when called and,
without it, raises RayNotInstalledError saying how to install it.
"""
from __future__ import annotations

from ..errors import GlassrtError

INSTALL_HINT = "pip install 'glassrt[ray]'"


class RayNotInstalledError(GlassrtError, ImportError):
    """Ray (the `ray` extra) is needed and not installed."""


def require_ray(what: str = "this"):
    """The `ray` module, or RayNotInstalledError naming `what` needed it and how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401  (the `data` part of the extra: pyarrow, pandas)
    except ImportError as e:
        raise RayNotInstalledError(f"{what} needs Ray, which is not installed ({e}); install the extra: "
                                   f"{INSTALL_HINT}") from e
    return ray


from .model import model_ref  # noqa: E402
from .predictor import Predictor  # noqa: E402
from .stats import summarize  # noqa: E402

__all__ = ["Predictor", "model_ref", "summarize", "require_ray", "RayNotInstalledError", "INSTALL_HINT"]
