"""GraphRunner: runs one placed graph, with a bounded cache of compiled plans.

The top-level session and every subgraph (If/Loop/Scan bodies) each have one. A plan is
compiled per input-shape signature; the cache is an LRU of `plan_cache_size` entries, so
a stream of different shapes replaces plans instead of growing memory without bound.

A plan owns its arena, so one plan serves one run at a time: a run that finds its plan
busy (another thread is running it) uses an idle twin, compiled when needed and kept (a
few per signature) for the next time — concurrent `run` calls are safe, as in onnxruntime.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ..ir import SequenceType, TensorType
from .memory import BufferPool
from .plan import compile_plan, run_plan


def type_of_value(v):
    if isinstance(v, np.ndarray):
        return TensorType(v.dtype, tuple(v.shape))
    if isinstance(v, list):
        from ..ops.meta.control import merge

        elem = type_of_value(v[0]) if v else None
        for x in v[1:]:
            elem = merge(elem, type_of_value(x))
        return SequenceType(elem)
    return None


class GraphRunner:
    def __init__(self, placement, options, outer_names=()):
        self.placement = placement
        self.options = options
        self.outer_names = [n for n in outer_names]
        self.plans: OrderedDict = OrderedDict()
        self.plans_built = 0
        self.plans_evicted = 0
        self._sub_runners = {}
        self.pool = BufferPool()
        self._lock = threading.Lock()
        self._busy: set[int] = set()  # ids of plans some thread is running now
        self._twins: dict = {}  # signature -> idle plans beside the cached one

    def make_runner(self, sub_placement):
        key = id(sub_placement)
        if key not in self._sub_runners:
            self._sub_runners[key] = (sub_placement, GraphRunner(sub_placement, self.options,
                                                                  sub_placement.graph.outer_names))
        return self._sub_runners[key][1]

    def signature(self, feeds: dict, outer: dict | None) -> tuple:
        sig = []
        for src in (feeds, outer or {}):
            for n, v in src.items():
                if isinstance(v, np.ndarray):
                    sig.append((n, tuple(v.shape), v.dtype.str))
                elif isinstance(v, list):
                    sig.append((n, "seq", tuple((x.shape, x.dtype.str) if isinstance(x, np.ndarray) else None for x in v)))
                else:
                    sig.append((n, type(v).__name__))
        return tuple(sorted(sig, key=lambda e: e[0]))

    def plan_for(self, feeds: dict, outer: dict | None = None):
        sig = self.signature(feeds, outer)
        with self._lock:
            plan = self.plans.get(sig)
            if plan is not None:
                self.plans.move_to_end(sig)
                return plan
        types = {n: type_of_value(v) for n, v in feeds.items()}
        outer_types = {n: type_of_value(v) for n, v in (outer or {}).items()}
        plan = compile_plan(self.placement, {**outer_types, **types}, self.options, self.make_runner, pool=self.pool)
        plan.signature = sig
        with self._lock:
            self._remember(sig, plan)
        return plan

    MAX_TWINS = 4

    def _checkout(self, feeds: dict):
        """A plan for these feeds that no other thread is running."""
        plan = self.plan_for(feeds)
        with self._lock:
            if id(plan) not in self._busy:
                self._busy.add(id(plan))
                return plan
            twins = self._twins.get(plan.signature, [])
            if twins:
                twin = twins.pop()
                self._busy.add(id(twin))
                return twin
        types = {n: type_of_value(v) for n, v in feeds.items()}
        twin = compile_plan(self.placement, types, self.options, self.make_runner, pool=self.pool)
        twin.signature = plan.signature
        with self._lock:
            self._busy.add(id(twin))
        return twin

    def _checkin(self, plan):
        with self._lock:
            self._busy.discard(id(plan))
            cached = self.plans.get(plan.signature)
            if cached is not plan and cached is not None:
                twins = self._twins.setdefault(plan.signature, [])
                if len(twins) < self.MAX_TWINS:
                    twins.append(plan)

    def plan_for_types(self, types: dict):
        """The plan for these concrete input types, compiled without running anything."""
        sig = tuple(sorted(((n, tuple(t.shape), t.dtype.str) for n, t in types.items()), key=lambda e: e[0]))
        plan = self.plans.get(sig)
        if plan is None:
            plan = compile_plan(self.placement, types, self.options, self.make_runner, pool=self.pool)
            plan.signature = sig
            self._remember(sig, plan)
        return plan

    def _remember(self, sig, plan):
        self.plans[sig] = plan
        self.plans_built += 1
        budget = self.options.plan_cache_bytes
        while len(self.plans) > 1 and (len(self.plans) > self.options.plan_cache_size or (
                budget and sum(p.memory.arena_bytes for p in self.plans.values()) > budget)):
            sig, _ = self.plans.popitem(last=False)
            self._twins.pop(sig, None)
            self.plans_evicted += 1

    def run(self, feeds: dict, outer: dict | None = None, profile=None) -> list:
        """Outputs in graph order. `outer`: values this (sub)graph reads from outside."""
        if outer:
            feeds = {**{n: outer[n] for n in self.outer_names if n in outer}, **feeds}
        for n, v in feeds.items():
            if isinstance(v, np.generic):  # e.g. a scalar taken from a scan input
                feeds[n] = np.asarray(v)
        plan = self._checkout(feeds)
        try:
            return run_plan(plan, feeds, profile=profile)
        finally:
            self._checkin(plan)
