"""GraphRunner: runs one placed graph, with a bounded cache of compiled plans.

The top-level session and every subgraph (If/Loop/Scan bodies) each have one. A plan is
compiled per input-shape signature; the cache is an LRU of `plan_cache_size` entries, so
a stream of different shapes replaces plans instead of growing memory without bound.
"""
from __future__ import annotations

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
        plan = self.plans.get(sig)
        if plan is not None:
            self.plans.move_to_end(sig)
            return plan
        types = {n: type_of_value(v) for n, v in feeds.items()}
        outer_types = {n: type_of_value(v) for n, v in (outer or {}).items()}
        plan = compile_plan(self.placement, {**outer_types, **types}, self.options, self.make_runner, pool=self.pool)
        plan.signature = sig
        self._remember(sig, plan)
        return plan

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
            self.plans.popitem(last=False)
            self.plans_evicted += 1

    def run(self, feeds: dict, outer: dict | None = None, profile=None) -> list:
        """Outputs in graph order. `outer`: values this (sub)graph reads from outside."""
        if outer:
            feeds = {**{n: outer[n] for n in self.outer_names if n in outer}, **feeds}
        for n, v in feeds.items():
            if isinstance(v, np.generic):  # e.g. a scalar taken from a scan input
                feeds[n] = np.asarray(v)
        plan = self.plan_for(feeds)
        return run_plan(plan, feeds, profile=profile)
