"""Tools on top of the runtime: explain, profile, compare, check, metrics, the light model zoo."""
from __future__ import annotations

import importlib

_TOOLS = ("bench", "bench_models", "check", "compare", "explain", "gradcheck", "inputs", "light_models", "metrics",
          "profile")


def __getattr__(name):
    """`glassrt.tools.compare` (as the README writes it) after a plain `import glassrt`,
    without importing every tool (bench, check) each time glassrt is imported."""
    if name in _TOOLS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
