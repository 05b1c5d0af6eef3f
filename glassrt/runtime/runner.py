"""GraphRunner: runs one placed graph, with a bounded cache of compiled plans.

The top-level session and every subgraph (If/Loop/Scan bodies) each have one. A plan is
compiled per input-shape signature; the cache is an LRU of `plan_cache_size` entries, so
a stream of different shapes replaces plans instead of growing memory without bound.

A plan owns its arena, so one plan serves one run at a time: a run that finds its plan
busy (another thread is running it) uses an idle twin, compiled when needed and kept (a
few per signature) for the next time — concurrent `run` calls are safe, as in onnxruntime.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from dataclasses import replace

import numpy as np

from ..errors import GlassrtError
from ..kernels.cpu._jit import numba_loading, run_before_load
from ..ir import TensorType, alike_arrays, type_of_value  # noqa: F401  (type_of_value re-exported)
from . import nan_handling, threads
from .memory import BufferPool
from .plan import STRAIGHT_AFTER, compile_plan, run_plan


class GraphRunner:
    def __init__(self, placement, options, outer_names=(), adapt_threads=False, openmp_pool=False,
                 blas_providers=frozenset({"cpu", "reference"}), on_fallbacks=None):
        self.placement = placement
        self.options = options
        # Told of each new plan that runs nodes on a later provider than placement chose
        # (plan.fallbacks), with whether the plan is one shared by several shapes; returns
        # whether the plan may be used, or raises (the session: FallbackWarning, "error").
        self.on_fallbacks = on_fallbacks
        self._unshared: set = set()  # input structures whose shared plan on_fallbacks refused
        # The session's own runner picks each run's thread count and pool (threads.py);
        # subgraph runners (loop bodies) run inside it and keep what it chose.
        self.adapt_threads = adapt_threads
        self.openmp_pool = openmp_pool
        self.blas_providers = blas_providers  # whose kernels may call NumPy's BLAS (Provider.numpy_blas)
        self.threads_hint = None  # the count the latest plan run settled on: where a new plan starts
        self.outer_names = [n for n in outer_names]
        self.plans: OrderedDict = OrderedDict()
        self.plans_built = 0
        self.plans_evicted = 0
        self.plan_hits = 0  # plan lookups answered from the cache (metrics: plan-cache hit rate)
        self._sub_runners = {}
        self.pool = BufferPool()
        self._lock = threading.Lock()
        self._busy: set[int] = set()  # ids of plans some thread is running now
        self._twins: dict = {}  # signature -> idle plans beside the cached one
        self._seen: OrderedDict = OrderedDict()  # recent signatures -> times asked for
        self._nan_runner = None  # (nan_runner)
        self.nan_runs = 0  # runs fed a NaN or an Inf that went to it

    def make_runner(self, sub_placement):
        key = id(sub_placement)
        if key not in self._sub_runners:
            self._sub_runners[key] = (sub_placement, GraphRunner(sub_placement, self.options,
                                                                  sub_placement.graph.outer_names,
                                                                  on_fallbacks=self.on_fallbacks))
        return self._sub_runners[key][1]

    def nan_runner(self) -> GraphRunner:
        """This runner's twin whose plans keep NaN and Inf (nan_handling="exact"), for the
        runs fed one: made when first needed. Its plans choose another kernel for a node by
        design, so they report no fallbacks."""
        with self._lock:  # (two threads fed a NaN at once make one twin)
            if self._nan_runner is None:
                self._nan_runner = GraphRunner(self.placement, replace(self.options, nan_handling="exact"),
                                               self.outer_names, adapt_threads=self.adapt_threads,
                                               openmp_pool=self.openmp_pool, blas_providers=self.blas_providers)
            return self._nan_runner

    def signature(self, feeds: dict, outer: dict | None) -> tuple:
        sig = []
        for src in (feeds, outer or {}):
            for n, v in src.items():
                if isinstance(v, np.ndarray):
                    sig.append((n, v.shape, v.dtype.str))
                elif isinstance(v, list):
                    sig.append((n, "seq", _elements_key(v)))
                else:
                    sig.append((n, type(v).__name__))
        sig.sort(key=_name)
        return tuple(sig)

    def plan_for(self, feeds: dict, outer: dict | None = None):
        sig = self.signature(feeds, outer)
        with self._lock:
            plan = self.plans.get(sig)
            if plan is not None and not _warm(plan) and self.options.generalize_after:
                # A shape compiled for on its own before its structure had a shared plan
                # (a decode loop's first positions), whose plan runs once in a while and so
                # stays cold, where the shared plan is warm and no slower: it takes the shared
                # one from now on (GPT-2: the first 3-6 positions of every generation ran
                # ~1.5 ms a token slower on their own plans, products not yet streamed).
                shared = next((p for key, p in self.plans.items() if isinstance(key, ShapePattern)
                               and _warm(p) and not _slower(p) and key.matches(sig)), None)
                if shared is not None:
                    del self.plans[sig]
                    self._twins.pop(sig, None)
                    self.plans_evicted += 1
                    plan = shared
            if plan is not None:
                self.plans.move_to_end(plan.signature)
                self.plan_hits += 1
                return plan
            general = self._general_plan(sig)
        if general is not None:
            return general
        types = {n: type_of_value(v) for n, v in feeds.items()}
        outer_types = {n: type_of_value(v) for n, v in (outer or {}).items()}
        plan = compile_plan(self.placement, {**outer_types, **types}, self.options, self.make_runner, pool=self.pool)
        plan.signature = sig
        plan.compiled_for = {**outer_types, **types}
        self._admit(plan, shared=False)
        with self._lock:
            self._remember(sig, plan)
        return plan

    def _general_plan(self, sig):
        """For a shape seen for the first time once several shapes of its structure have
        come: a plan with the dims that varied left symbolic (compiled once, then shared;
        only its nodes whose shapes depend on those dims bind per shape at run time).
        None: compile a plan for exactly this shape (as for a shape asked for a fourth time:
        a hot shape earns a plan of its own)."""
        after = self.options.generalize_after
        if not after or not all(len(e) == 3 and isinstance(e[1], tuple) for e in sig) \
                or _structure(sig) in self._unshared:
            return None
        count = self._seen.pop(sig, 0)
        self._seen[sig] = count + 1
        while len(self._seen) > 64:
            self._seen.popitem(last=False)
        shared = next(((key, plan) for key, plan in reversed(self.plans.items())
                       if isinstance(key, ShapePattern) and key.matches(sig)), None)
        # A hot shape earns a plan of its own where the shared plan is the slower for it: some
        # nodes run on another provider than placement chose (its kernels refused the
        # symbolic dims: BERT-base's products there ~1.5x slower than on a length's own), or
        # more than a quarter of its steps bind per run (a CNN's batch left symbolic on the
        # cpu provider: all of them). And only into a free cache slot: evicting for it would
        # thrash when more shapes are hot than the cache holds (a decode loop run again and
        # again: 33 token positions, each seen often, against 8 slots, compiled a plan per
        # step, ~150 ms each for GPT-2). Otherwise a shape keeps the shared plan: one of its
        # own would gain little and start cold (GPT-2's shared decode plan binds 25 of 232
        # steps per run; its positions, each asked once a generation, ran 38-56 ms a token on
        # plans of their own not yet replayed or streamed, against 21-22 on the shared plan).
        if count >= 3 and len(self.plans) < self.options.plan_cache_size and (shared is None or _slower(shared[1])):
            return None
        if shared is not None:
            self.plans.move_to_end(shared[0])
            self.plan_hits += 1
            return shared[1]
        similar = [s for s in self._seen if _structure(s) == _structure(sig)]
        if len(similar) <= after:
            return None
        # From the latest shapes only: a decode loop's prompt (16 tokens, an empty cache)
        # must not make the token dim symbolic for every one-token step after it.
        pattern = ShapePattern.generalize(similar[-max(2, after):], self.placement.graph)
        if pattern is None or not pattern.matches(sig):
            return None
        types = pattern.types()
        plan = compile_plan(self.placement, types, self.options, self.make_runner, pool=self.pool)
        plan.signature = pattern
        plan.compiled_for = types
        if not self._admit(plan, shared=True):
            self._unshared.add(_structure(sig))  # each shape of this structure gets a plan of its own
            return None
        if _moved_most(plan):
            # Most of its work moved off the providers placement chose (a CNN's batch left
            # symbolic: every oneDNN convolution is bound to concrete shapes, so all went to
            # cpu's kernels): each shape compiles a plan of its own instead, as the first
            # ones did. squeezenet, 2 threads, batch 5: 248 ms a run on the shared plan
            # against 60 on its own (whose compiling costs one run's time or less).
            self._unshared.add(_structure(sig))
            return None
        self._remember(pattern, plan)
        return plan

    MAX_TWINS = 4

    def _checkout(self, feeds: dict):
        """A plan for these feeds that no other thread is running."""
        sig = self.signature(feeds, None)
        with self._lock:
            # the usual run: this shape's own plan, warm and idle (plan_for's other cases
            # concern plans not yet warm, or shapes shared by a generalized plan)
            plan = self.plans.get(sig)
            if plan is not None and plan.straight is not None and id(plan) not in self._busy:
                self.plans.move_to_end(sig)
                self.plan_hits += 1
                self._busy.add(id(plan))
                return plan
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
        twin = compile_plan(self.placement, plan.compiled_for, self.options, self.make_runner, pool=self.pool)
        twin.signature, twin.compiled_for = plan.signature, plan.compiled_for
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
        """The plan for these concrete input types, compiled without running anything (for
        explain: a plan that on_fallbacks refuses is returned to be shown, not kept to run)."""
        sig = tuple(sorted(((n, tuple(t.shape), t.dtype.str) for n, t in types.items()), key=lambda e: e[0]))
        plan = self.plans.get(sig)
        if plan is None:
            plan = compile_plan(self.placement, types, self.options, self.make_runner, pool=self.pool)
            plan.signature, plan.compiled_for = sig, types
            try:
                admitted = self._admit(plan, shared=False)
            except GlassrtError:
                admitted = False
            if admitted:
                self._remember(sig, plan)
        return plan

    def _admit(self, plan, shared: bool) -> bool:
        """Whether a newly compiled plan may run (on_fallbacks decides for one with fallbacks)."""
        if not plan.fallbacks or self.on_fallbacks is None:
            return True
        return self.on_fallbacks(plan, shared)

    def _remember(self, sig, plan):
        self.plans[sig] = plan
        self.plans_built += 1
        budget = self.options.plan_cache_bytes
        while len(self.plans) > 1 and (len(self.plans) > self.options.plan_cache_size or (
                budget and sum(p.memory.arena_bytes for p in self.plans.values()) > budget)):
            sig, _ = self.plans.popitem(last=False)
            self._twins.pop(sig, None)
            self.plans_evicted += 1

    def run(self, feeds: dict, outer: dict | None = None, profile=None, into=None) -> list:
        """Outputs in graph order. `outer`: values this (sub)graph reads from outside;
        `into`: {output name: caller's array} to write those outputs into."""
        if outer:
            feeds = {**{n: outer[n] for n in self.outer_names if n in outer}, **feeds}
        for n, v in feeds.items():
            if isinstance(v, np.generic):  # e.g. a scalar taken from a scan input
                feeds[n] = np.asarray(v)
        plan = self._checkout(feeds)
        if plan.drops_nan and nan_handling.checks_feeds(self.options) and not nan_handling.all_finite(feeds):
            self._checkin(plan)  # a NaN or an Inf: the plan of kernels that keep them
            self.nan_runs += 1
            return self.nan_runner().run(feeds, profile=profile, into=into)
        try:
            if not self.adapt_threads:
                return run_plan(plan, feeds, profile=profile, into=into)
            if plan.threads is None:
                plan.threads = threads.ThreadChoice(self.options.intra_op_num_threads or threads.available_cpus(),
                                                    self.options.adaptive_threads, start=self.threads_hint)
            if plan.uses_blas is None:
                # a step that may call NumPy's BLAS: a kernel of such a provider that may
                # (Kernel.blas); a plan of oneDNN's kernels and elementwise or quantizing steps
                # needs no BLAS count set (threadpoolctl's import and scan: ~4 ms of a first run)
                plan.uses_blas = any(st.provider in self.blas_providers and st.kernel.blas for st in plan.steps)
            if numba_loading():
                # Numba loads on a thread of its own (kernels/cpu/_jit.py: ~0.5 s, once per
                # process), which holds one core: a primitive split over two threads waits
                # for the one whose core it has. One core fewer until it is done, unmeasured,
                # and the load gives way to the run (run_before_load). A quantized
                # MobileNetV2's 2 ms runs while Numba loads, in a loop: 100-190 ms each before
                # either, 26-51 ms (median; the slowest 66-158) with one core fewer, 14-16
                # (30-45) with the load giving way too; on both cores with the load giving
                # way, 9.5-11 (52-78).
                spare = max(1, min(plan.threads.requested, threads.available_cpus() - 1))
                threads.use_threads(spare, self.openmp_pool, blas=plan.uses_blas)
                plan.threads.last = None  # (the next run's latency is not the one-thread run's)
                with run_before_load():
                    return run_plan(plan, feeds, profile=profile, into=into)
            if plan.threads.unmeasured():  # (a tiny plan between two measured runs: threads.TINY_MS)
                threads.use_threads(plan.threads.current, self.openmp_pool, blas=plan.uses_blas)
                return run_plan(plan, feeds, profile=profile, into=into)
            n = plan.threads.choose()
            threads.use_threads(n, self.openmp_pool, blas=plan.uses_blas)
            # (the CPU time tells a starved multi-thread run; a one-thread run's is not
            # needed, and the clock is a system call in some virtual machines)
            t0, c0 = time.perf_counter(), time.process_time() if n > 1 else None
            out = run_plan(plan, feeds, profile=profile, into=into)
            plan.threads.record(time.perf_counter() - t0, None if c0 is None else time.process_time() - c0)
            self.threads_hint = plan.threads.current
            return out
        finally:
            self._checkin(plan)

    @contextlib.contextmanager
    def repeated(self, outer: dict | None):
        """run(feeds) for a control-flow node's iterations (Loop, Scan, SequenceMap), all with
        the same `outer` values: one HeldPlan for the node's run, so the plan is checked out
        once and kept while the iterations' feeds keep their names, shapes and dtypes
        (a signature over every feed and outer value, a check-out and a check-in per
        iteration cost ~5 us each time: a Scan over 300 training rows, scikit-learn's nearest
        neighbours as skl2onnx writes them, ran 14 us an iteration)."""
        held = HeldPlan(self, {n: outer[n] for n in self.outer_names if n in outer} if outer else None)
        try:
            yield held.run
        finally:
            held.release()


class HeldPlan:
    """A (sub)graph's plan kept checked out while the values it is fed keep their names,
    shapes and dtypes: a run then skips GraphRunner.run's signature over every feed and
    outer value and its check-out and check-in. For a node that runs the graph once per run
    of its own plan (an If's branch: 11 of the 46 us the verifier branch of openWakeWord's
    hey-jarvis took, its ten weights read from the enclosing graph), held for the node's
    life; for a loop's iterations (`GraphRunner.repeated`), held for the node's run. The
    holder's own plan runs on one thread at a time, so the plan it holds does too; another
    plan of the enclosing graph (a twin run by another thread) holds its own. Checked in
    when the shapes change, by release, or when the holder goes.

    `base`: values fed at every run, the same while held (a loop's outer values), left out
    of the key."""

    __slots__ = ("runner", "base", "key", "plan")

    def __init__(self, runner: GraphRunner, base: dict | None = None):
        self.runner, self.base, self.key, self.plan = runner, base, None, None

    def run(self, feeds: dict) -> list:
        """The (sub)graph's outputs for `feeds` (with `base`). Feeds that are not all arrays
        (a sequence, a scalar, None) take GraphRunner.run's own path."""
        key = []
        for n, v in feeds.items():
            if type(v) is not np.ndarray:
                return self.runner.run(feeds, self.base)
            key.append((n, v.shape, v.dtype))
        key = tuple(key)
        merged = {**self.base, **feeds} if self.base else feeds
        if key != self.key:
            self.release()
            self.plan = self.runner._checkout(merged)
            self.key = key
        return run_plan(self.plan, merged, nested=True)

    def release(self) -> None:
        plan, self.plan, self.key = self.plan, None, None
        if plan is not None:
            self.runner._checkin(plan)

    def __del__(self):
        try:
            self.release()
        except Exception:  # (at interpreter exit the runner may be half torn down)
            pass


def _elements_key(v: list) -> tuple:
    """A sequence's part of a plan's signature: its elements' shapes and dtypes; one entry
    where all are alike, whatever their number (the plan depends on the element type, not
    the length: a Loop appending to a sequence compiled a plan per iteration, and keyed each
    by every element, quadratic in its trip count)."""
    x0 = alike_arrays(v)
    if x0 is not None:
        return ("alike", x0.shape, x0.dtype.str)
    return tuple((x.shape, x.dtype.str) if isinstance(x, np.ndarray) else None for x in v)


def _name(entry):
    return entry[0]


def _moved_computing(plan) -> int:
    """The steps of nodes a plan moved off their provider onto kernels that compute (one now
    a view, as GPT-2's attention Transposes on cpu, costs nothing)."""
    if not plan.moved:
        return 0
    moved = set(plan.moved)
    return sum(st.node.name in moved and not st.kernel.alias for st in plan.steps)


def _slower(plan) -> bool:
    """Whether a shared plan runs a shape slower than a plan of its own would (see
    _general_plan): some nodes moved onto kernels that compute, or over a quarter of the
    steps bound per run."""
    return _moved_computing(plan) > 0 or plan.dynamic_steps * 4 > len(plan.steps)


def _moved_most(plan) -> bool:
    """Whether more than half of a shared plan's steps moved onto kernels that compute."""
    return _moved_computing(plan) * 2 > len(plan.steps)


def _warm(plan) -> bool:
    """Whether a plan has run long enough to be compiled straight and its products streamed
    (runtime/plan.py's STRAIGHT_AFTER, row_panels' AFTER_RUNS)."""
    return plan.straight is not None or plan.runs >= STRAIGHT_AFTER


def _structure(sig) -> tuple:
    """What shapes of one structure share: input names, ranks and dtypes."""
    return tuple((name, len(shape), dt) for name, shape, dt in sig)


class ShapePattern:
    """Input shapes with some dims symbolic: the signatures one generalized plan serves.

    A dim that took one value in every shape seen stays that value; a dim that varied
    becomes a symbol, named as the model declares it (inputs declared with the same dim
    name share a symbol, so the plan may rely on their being equal) or after the input
    and axis. A signature matches when its fixed dims agree, every symbol has one value
    in it, and none of those values is 0 (symbols are positive; an empty dim gets a plan
    of its own)."""

    def __init__(self, entries):
        self.entries = entries  # ((name, (int | Symbol, ...), dtype str), ...)
        # The same with each symbol as ~k, k its index: `matches` runs per run of a shared
        # plan (each decode step) and then binds small ints instead of hashing expressions.
        index: dict = {}
        self._coded = tuple((name, tuple(d if isinstance(d, int) else ~index.setdefault(d, len(index)) for d in dims),
                             dt) for name, dims, dt in entries)
        self._n_symbols = len(index)

    @classmethod
    def generalize(cls, sigs, graph):
        from .. import symbolic

        declared = {v.name: getattr(v.type, "shape", None) for v in graph.inputs}
        entries = []
        for k, (name, shape, dt) in enumerate(sigs[-1]):
            dims = []
            for axis, d in enumerate(shape):
                if all(s[k][1][axis] == d for s in sigs):
                    dims.append(d)
                    continue
                decl = declared.get(name)
                named = decl[axis] if decl is not None and axis < len(decl) else None
                dims.append(named if symbolic.is_symbol(named)
                            else symbolic.symbol(f"{name}_dim{axis}"))
            entries.append((name, tuple(dims), dt))
        if all(isinstance(d, int) for _, dims, _ in entries for d in dims):
            return None
        return cls(tuple(entries))

    def matches(self, sig) -> bool:
        if len(sig) != len(self._coded):
            return False
        bound = [None] * self._n_symbols
        for (name, shape, dt), (pname, pdims, pdt) in zip(sig, self._coded):
            if name != pname or dt != pdt or not isinstance(shape, tuple) or len(shape) != len(pdims):
                return False
            for d, p in zip(shape, pdims):
                if p >= 0:
                    if d != p:
                        return False
                elif d == 0:
                    return False
                else:
                    b = bound[~p]
                    if b is None:
                        bound[~p] = d
                    elif b != d:
                        return False
        return True

    def types(self) -> dict:
        return {name: TensorType(np.dtype(dt), dims) for name, dims, dt in self.entries}

    def __hash__(self):
        return hash(self.entries)

    def __eq__(self, other):
        return isinstance(other, ShapePattern) and other.entries == self.entries

    def __repr__(self):
        return "ShapePattern(" + ", ".join(f"{n}{list(map(str, d))}" for n, d, _ in self.entries) + ")"
