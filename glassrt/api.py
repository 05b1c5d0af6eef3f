"""glassrt.InferenceSession: the Session (session.py) with the glass-box views on top —
`explain` and `profile` live in tools/ and read what the session built. Layers, bottom up:
ir, ops, kernels → runtime (stages) → passes → session → tools → api, cli."""
from __future__ import annotations

from .session import FallbackWarning, NodeArg, Session  # noqa: F401  (re-exported)
from .tools.explain import explain as _explain
from .tools.profile import profile_session


class InferenceSession(Session):
    __doc__ = Session.__doc__

    def explain(self, dims: dict | None = None) -> dict:
        """Every decision as plain data: see tools/explain.py and the README."""
        return _explain(self, dims)

    def profile(self, input_feed: dict, runs: int = 10, warmup: int = 1):
        """Time `runs` runs node by node; returns a runtime.profiling.Profile (tables, Chrome trace)."""
        return profile_session(self, input_feed, runs, warmup)
