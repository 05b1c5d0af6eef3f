"""Stopping a run from outside it: RunOptions.terminate (set from another thread) and
RunOptions.time_budget_s, checked by run_plan before each node and at the start of each
(sub)plan run, so a Loop's body checks once per iteration. A kernel already running is
not interrupted.

The guard of the run in progress lives in a context variable: each thread has its own, so
concurrent runs of one session (each with its own RunOptions or none) do not see each
other's; Loop/If/Scan bodies run in the caller's thread and see their run's guard.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import time

import numpy as np

from ..errors import RunTerminatedError, RunTimeoutError, describe_node

_current: contextvars.ContextVar = contextvars.ContextVar("glassrt_run_guard", default=None)
log = logging.getLogger("glassrt.run")


class RunGuard:
    __slots__ = ("deadline", "last", "options", "start", "verbose")

    def __init__(self, options):
        self.options = options
        self.start = time.perf_counter()
        budget = float(options.time_budget_s or 0)
        self.deadline = self.start + budget if budget > 0 else None
        self.verbose = int(options.log_severity_level) == 0
        self.last = None  # the node that ran last (the message names it when a subgraph run stops)

    def check(self, step=None, args=None):
        """Raise if the run must stop; `step` is the node about to run (None: a plan starts)."""
        if step is not None:
            where = f"before {describe_node(step.node)}"
            self.last = step.node
        elif self.last is not None:
            where = f"as a subgraph run began (Loop/Scan/If body; {describe_node(self.last)} ran last)"
        else:
            where = "before its first node"
        if self.options.terminate:
            raise RunTerminatedError(f"run stopped {where}: RunOptions.terminate is set"
                                     f"{self._id()} (clear it to run again)")
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise RunTimeoutError(f"run stopped {where}: it ran {time.perf_counter() - self.start:.3f} s, past "
                                  f"its RunOptions.time_budget_s of {self.options.time_budget_s} s{self._id()}")
        if self.verbose and step is not None:
            shapes = ""
            if int(self.options.log_verbosity_level) >= 1 and args is not None:
                shapes = " inputs " + ", ".join(str(list(a.shape)) if hasattr(a, "shape") else "-" for a in args)
            log.info("%s%s at %.3f ms%s", f"[{self.options.logid}] " if self.options.logid else "",
                     describe_node(step.node), (time.perf_counter() - self.start) * 1e3, shapes)

    def _id(self):
        return f" (logid {self.options.logid!r})" if self.options.logid else ""


def current() -> RunGuard | None:
    return _current.get()


@contextlib.contextmanager
def guarded(options):
    """Run the body under `options` (None: no guard, nothing changes)."""
    if options is None:
        yield
        return
    token = _current.set(RunGuard(options))
    try:
        quiet = int(options.log_severity_level) >= 3
        with np.errstate(all="ignore") if quiet else contextlib.nullcontext():
            yield
    finally:
        _current.reset(token)
