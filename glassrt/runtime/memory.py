"""The memory planner: one arena per plan, offsets assigned from sizes and lifetimes.

Input: the steps of a plan in execution order, what each reads and writes, the byte size
of every value that can live in the arena, which outputs may reuse an input's buffer in
place, which are views (aliases) of an input, and each step's scratch workspace.
Output: an offset per arena value and three numbers that make "how good is this plan" a
fact: the naive total (every value its own buffer), the arena size, and the lower bound
(the most bytes live at any one step — no plan can do better).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import bisect
import heapq
import math
import random
import sys
import threading
import time
import weakref

import numpy as np

from ..pages import os_buffer, populate_soon

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def size_class(n: int) -> int:
    """n rounded up to a multiple of a quarter of its power of two (64-byte aligned)."""
    if n <= 4096:
        return _align(n)
    quarter = 1 << (n.bit_length() - 3)
    return (n + quarter - 1) // quarter * quarter


@dataclass
class StepIO:
    """What the planner needs to know about one step."""

    reads: list  # value names (inputs and implicit inputs)
    writes: list  # value names
    sizes: dict  # output name -> bytes, for outputs that may live in the arena
    inplace: dict = field(default_factory=dict)  # output -> input whose buffer it may reuse
    aliases: dict = field(default_factory=dict)  # output -> input it may be a view of
    workspace: int = 0


@dataclass
class PlannedValue:
    name: str
    bytes: int
    offset: int | None  # None: not in the arena
    first_step: int
    last_step: int
    kind: str  # arena | copied_output | workspace | inplace | alias | output | dynamic
    shares_with: str | None = None


@dataclass
class MemoryPlan:
    values: dict  # name -> PlannedValue
    arena_bytes: int
    naive_bytes: int
    lower_bound_bytes: int

    @property
    def ratio(self) -> float:
        return self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0


class _Group:
    """Values that share one buffer (a value and the in-place results that reuse it)."""

    __slots__ = ("names", "size", "first", "last", "offset", "near", "placed_in")

    def __init__(self, name, size, first, last):
        self.names, self.size, self.first, self.last, self.offset = [name], size, first, last, None
        self.near: list[_Group] = []  # the groups whose lifetimes overlap this one's
        self.placed_in = None  # the _place call that placed it last


def plan_memory(steps: list[StepIO], keep: set, copied: frozenset = frozenset()) -> MemoryPlan:
    """`keep`: values that must not live in the arena (graph outputs: returned to the user).
    `copied`: graph outputs that do live in it, copied out when the run returns (small ones:
    see plan.COPIED_OUTPUT_BYTES); they live until then.

    In-place reuse merges a value with its input into one longer-lived buffer, which can
    fragment the arena; when the plan with it misses the lower bound, the plan without
    in-place reuse is tried too, and the smaller arena wins."""
    plan = _plan(steps, keep, copied, inplace=True)
    if plan.arena_bytes > plan.lower_bound_bytes and any(s.inplace for s in steps):
        other = _plan(steps, keep, copied, inplace=False)
        if other.arena_bytes < plan.arena_bytes:
            return other
    return plan


def _plan(steps: list[StepIO], keep: set, copied: frozenset, inplace: bool) -> MemoryPlan:
    producer, last_use, root = {}, {}, {}
    for k, s in enumerate(steps):
        for o in s.writes:
            producer[o] = k
            last_use.setdefault(o, k)
        for i in s.reads:
            last_use[i] = k
    # Graph outputs are read when the run returns, after the last step.
    for o in (*keep, *copied):
        if o in producer:
            last_use[o] = len(steps)
    # A view keeps its base alive: extend the base's lifetime through the view's uses.
    for k, s in enumerate(steps):
        for o, base in s.aliases.items():
            root[o] = root.get(base, base)
    for o in reversed(list(root)):
        r = root[o]
        last_use[r] = max(last_use.get(r, 0), last_use.get(o, 0))

    groups: dict[str, _Group] = {}
    group_of: dict[str, _Group] = {}
    planned: dict[str, PlannedValue] = {}
    for k, s in enumerate(steps):
        for o in s.writes:
            if o in s.aliases:
                planned[o] = PlannedValue(o, 0, None, k, last_use.get(o, k), "alias", s.aliases[o])
                continue
            size = s.sizes.get(o)
            if size is None or o in keep:
                kind = "output" if o in keep else "dynamic"
                planned[o] = PlannedValue(o, size or 0, None, k, last_use.get(o, k), kind)
                continue
            src = s.inplace.get(o) if inplace else None
            g = group_of.get(src) if src else None
            if (g is not None and last_use.get(src) == k and src not in root.values() and g.size == _align(size)):
                g.names.append(o)
                g.last = last_use.get(o, k)
                group_of[o] = g
                planned[o] = PlannedValue(o, size, None, k, last_use.get(o, k),
                                          "copied_output" if o in copied else "inplace", src)
                continue
            g = _Group(o, _align(size), k, last_use.get(o, k))
            groups[o] = g
            group_of[o] = g
            planned[o] = PlannedValue(o, size, None, k, g.last, "copied_output" if o in copied else "arena")
        if s.workspace:
            w = f"<workspace {k}>"
            groups[w] = _Group(w, _align(s.workspace), k, k)
            planned[w] = PlannedValue(w, s.workspace, None, k, k, "workspace")

    arena = _assign_offsets(list(groups.values()))
    for g in groups.values():
        for n in g.names:
            planned[n].offset = g.offset
    naive = sum(p.bytes for p in planned.values() if p.kind in ("arena", "inplace", "workspace"))
    return MemoryPlan(planned, arena, naive, _lower_bound(list(groups.values()), len(steps)))


SEARCH_SECONDS = 0.3  # per plan, spent only while the arena is above the lower bound
# Tries without a smaller arena after which the search stops: where it finds one at all it
# does within a few dozen (densenet121: 16, then 16 more), and a bound it cannot reach (a
# transformer's: values that must coexist in no packing) would cost the whole budget at
# every session creation.
SEARCH_PATIENCE = 48


def _assign_offsets(groups: list[_Group]) -> int:
    """Place every buffer; try several orderings and keep the smallest arena.

    Each ordering is placed greedily: a buffer goes into the smallest gap (best fit)
    between already placed buffers whose lifetimes overlap its own, or on top. Tried in
    turn: TFLite's two orderings (by size; by breadth — the busiest steps first), two by
    lifetime, then seeded random perturbations of the size order and moves of whichever
    buffer ends highest, until the lower bound is reached, the time budget is spent or
    SEARCH_PATIENCE tries in a row found nothing smaller.
    Deterministic: the same graph always gets the same plan.
    """
    if not groups:
        return 0
    if _overlaps(groups) > MAX_OVERLAPS:
        return _first_fit_sweep(groups)
    _link_overlapping(groups)
    n_steps = max(g.last for g in groups) + 1
    live = [0] * (n_steps + 1)
    for g in groups:
        for k in range(g.first, g.last + 1):
            live[k] += g.size
    lower = max(live)
    # TFLite's breadth order: the busiest step first, the buffers alive there largest first,
    # then the next busiest step's not yet taken: a buffer comes at its busiest step's rank
    # (keyed so in one sort: a pass over every buffer per step was quadratic)
    rank = {k: r for r, k in enumerate(sorted(range(n_steps), key=lambda k: -live[k]))}
    at = {id(g): min(rank[k] for k in range(g.first, g.last + 1)) for g in groups}
    by_breadth = sorted(groups, key=lambda g: (at[id(g)], -g.size))
    orders = [sorted(groups, key=lambda g: (-g.size, g.first)), by_breadth,
              sorted(groups, key=lambda g: (-(g.last - g.first + 1) * g.size, g.first)),
              sorted(groups, key=lambda g: (g.first, -g.size))]
    best, best_order, best_ends = None, None, None
    for order in orders:
        top = _place(order)
        if best is None or top < best:
            best, best_order, best_ends = top, order, [g.offset + g.size for g in order]
    rng = random.Random(0)
    deadline = time.perf_counter() + SEARCH_SECONDS
    since_better = 0
    while best > lower and time.perf_counter() < deadline and since_better < SEARCH_PATIENCE:
        if rng.random() < 0.5:  # perturb the size order
            order = sorted(groups, key=lambda g: -g.size * rng.uniform(0.6, 1.4))
        else:  # place the buffer that ends highest earlier
            i = max(range(len(best_order)), key=best_ends.__getitem__)
            j = rng.randrange(0, i + 1)
            order = best_order[:j] + [best_order[i]] + best_order[j:i] + best_order[i + 1:]
        top = _place(order)
        since_better = 0 if top < best else since_better + 1
        if top <= best:
            best, best_order, best_ends = top, order, [g.offset + g.size for g in order]
    _place(best_order)
    for g in groups:
        g.near = []  # (the links are cycles: gone with the plan, not at the next GC)
    return best


# Pairs of buffers living at the same time above which the search gives way to one sweep:
# each placement looks at every buffer living with it, so a plan whose values mostly live
# together (thousands read by one late node) cost seconds per ordering (2,000: 3.7 s).
MAX_OVERLAPS = 200_000


def _overlaps(groups: list[_Group]) -> int:
    """How many pairs of groups live at the same time (a sweep by first step)."""
    ends: list[int] = []
    pairs = 0
    for g in sorted(groups, key=lambda g: g.first):
        while ends and ends[0] < g.first:
            heapq.heappop(ends)
        pairs += len(ends)
        heapq.heappush(ends, g.last)
    return pairs


def _first_fit_sweep(groups: list[_Group]) -> int:
    """Place each buffer, by first step, in the lowest free block that holds it (blocks freed
    after their last step, merged with their neighbours), else on top: one pass, for plans
    too dense for the search (_assign_offsets). The arena's size."""
    free: list[list[int]] = []  # [offset, size] below the top, by offset, none adjacent
    ending: list[tuple] = []  # (last step, offset, size) of the buffers placed
    top = 0
    for g in sorted(groups, key=lambda g: (g.first, -g.size)):
        while ending and ending[0][0] < g.first:
            _, off, size = heapq.heappop(ending)
            i = bisect.bisect(free, [off, size])
            free.insert(i, [off, size])
            if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:  # merge with the next
                free[i][1] += free.pop(i + 1)[1]
            if i and free[i - 1][0] + free[i - 1][1] == free[i][0]:  # and the one before
                free[i - 1][1] += free.pop(i)[1]
        for i, block in enumerate(free):
            if block[1] >= g.size:
                g.offset = block[0]
                block[0] += g.size
                block[1] -= g.size
                if not block[1]:
                    free.pop(i)
                break
        else:
            if free and free[-1][0] + free[-1][1] == top:  # the highest free block reaches the top
                g.offset = free.pop()[0]
            else:
                g.offset = top
            top = max(top, g.offset + g.size)
        heapq.heappush(ending, (g.last, g.offset, g.size))
    return top


def _link_overlapping(groups: list[_Group]) -> None:
    """Give each group the list of groups whose lifetimes overlap its own (a sweep by first
    step), so that placing a buffer looks only at those, not at every placed buffer."""
    active: list[_Group] = []
    for g in sorted(groups, key=lambda g: g.first):
        g.near = []
        active = [h for h in active if h.last >= g.first]
        for h in active:
            g.near.append(h)
            h.near.append(g)
        active.append(g)


def _place(order: list[_Group]) -> int:
    """Place greedily in this order (groups linked by _link_overlapping); the arena's size."""
    this = object()  # marks the groups placed by this call
    top = 0
    for g in order:
        size = g.size
        spans = sorted([(h.offset, h.offset + h.size) for h in g.near if h.placed_in is this])
        offset, best_offset, best_gap = 0, 0, -1
        for lo, hi in spans:  # by offset: the gaps between the buffers that live with g
            gap = lo - offset
            if gap >= size and (best_gap < 0 or gap < best_gap):
                best_offset, best_gap = offset, gap  # the smallest gap that holds it
            if hi > offset:
                offset = hi
        g.offset = best_offset if best_gap >= 0 else offset
        g.placed_in = this
        top = max(top, g.offset + size)
    return top


def _lower_bound(groups: list[_Group], n_steps: int) -> int:
    live = [0] * (n_steps + 1)
    for g in groups:
        for k in range(g.first, g.last + 1):
            live[k] += g.size
    return max(live, default=0)


def allocate_arena(nbytes: int) -> np.ndarray:
    """The arena's memory, mapped straight from the OS (anonymous mmap) rather than from
    malloc: when a plan is evicted its arena goes back to the OS at once, whatever malloc's
    heuristics (glibc keeps freed blocks below its sliding mmap threshold in the heap).

    From a huge page up it is on transparent huge pages from its first touch, whatever
    glassrt.pages' policy (under "late" weights wait until a plan keeps running): every run
    writes and reads all of it, often through strides that cross a small page every few
    rows, and on a VM each TLB miss walks two page tables. Measured on the 2-core AVX2 EPYC, BERT-base batch 1 (a 2.3 MiB arena:
    two huge pages), attention's P·V (12 x 128 x 128 @ 128 x 64, B and the result strided)
    8.1-8.5 -> 4.8-5.8 ms a run over its 12 products (four alternating process pairs, one
    with the OpenBLAS pin); the same product on one thread, alone, on small pages 1.31-1.33
    ms against 0.69-0.71 on huge pages (three processes). A first touch of a fresh huge page
    costs more than of its small pages on such a VM (64 MiB: 14-115 ms against 25-32), a
    few milliseconds for an arena's few pages, once."""
    if nbytes < (1 << 20):
        return np.empty(nbytes, np.uint8)
    arena = os_buffer(nbytes, whole_pages=True, early=True)
    # faulted in on another core while the plan is finished and its first run binds its
    # steps (pages.populate_soon: a YOLOv8n's first run waited up to ~5 ms on its arena's pages)
    populate_soon(arena)
    return arena


class _Handed(weakref.ref):
    """A weak reference to an array the pool handed out; `key` is None once released.
    (weakref.finalize did the same job at 2.7 us per buffer, a tenth of a small decode op.)"""

    __slots__ = ("key",)


MAX_PARKED = 256  # pool buffers parked at most (BufferPool._unpark)


class BufferPool:
    """Run-time allocations for values whose size is only known while running
    (downstream of NonZero, nodes of a plan with symbolic dims, Loop bodies with changing
    shapes...).

    Freed buffers are kept per size class and handed out again, so a plan replayed with
    the same data-dependent sizes stops allocating. Sizes round up to a quarter of their
    power of two (25% at most unused), so that a buffer that grows a little per run (a KV
    cache during decoding) reuses what the previous run freed. A buffer handed out and
    never released (a graph output the caller keeps, then drops) is forgotten when it is
    garbage-collected, so it cannot pin memory. `reserved` counts every byte the pool
    holds, `allocated` the bytes handed out now: their gap is the fragmentation.
    """

    def __init__(self, max_reserved: int = 1 << 30):
        self.free: dict[int, list[np.ndarray]] = {}
        self.parked: list[np.ndarray] = []  # released while a view of them lived on (_unpark)
        self.in_use: dict[int, tuple] = {}  # id(buffer) -> (raw block, its _Handed weak reference)
        self.reserved = 0
        self.allocated = 0
        self.peak_allocated = 0
        self.max_reserved = max_reserved
        self.hits = 0
        self.misses = 0
        # Runs of one session may share the pool across threads; reentrant, since a handed
        # array that dies while the pool is busy calls back into it (_dead).
        self._lock = threading.RLock()

    def empty(self, shape, dtype) -> np.ndarray:
        with self._lock:
            return self._empty(shape, dtype)

    def release(self, array) -> bool:
        """Take back an array `empty` handed out (True); anything else — including a view
        of a pool buffer — is ignored (False)."""
        with self._lock:
            return self._release(array)

    def hand_over(self, handed, result) -> None:
        """A kernel given `handed` returned `result` instead: a view of it (then `result` is
        what the run will release) or another array (then `handed` is not used: take it back)."""
        with self._lock:
            entry = self.in_use.get(id(handed))
            if entry is None:
                return
            if isinstance(result, np.ndarray) and np.may_share_memory(result, entry[0]):
                entry[1].key = None
                del self.in_use[id(handed)]
                self.in_use[id(result)] = (entry[0], self._watch(result))
            else:
                entry = None  # no reference of ours may keep the block from being reused
                self._release(handed)

    def _empty(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        size = size_class(max(nbytes, 1))
        bucket = self.free.get(size)
        if not bucket and self.parked:
            self._unpark()
            bucket = self.free.get(size)
        if bucket:
            raw = bucket.pop()
            self.hits += 1
        else:
            raw = np.empty(size, np.uint8)
            self.reserved += size
            self.misses += 1
        handed = raw[:nbytes].view(dtype).reshape(shape)
        self.in_use[id(handed)] = (raw, self._watch(handed))
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return handed

    def _watch(self, array) -> "_Handed":
        ref = _Handed(array, self._dead)
        ref.key = id(array)
        return ref

    def _dead(self, ref) -> None:
        """An array handed out died without being released: its block goes with it."""
        with self._lock:
            key = ref.key
            entry = self.in_use.get(key) if key is not None else None
            if entry is not None and entry[1] is ref:
                del self.in_use[key]
                self.allocated -= entry[0].size
                self.reserved -= entry[0].size

    def _release(self, array) -> bool:
        entry = self.in_use.pop(id(array), None)
        if entry is None:
            return False
        raw, ref = entry
        ref.key = None  # released: its death later means nothing
        self.allocated -= raw.size
        # Reuse the buffer only if nothing but the released array still refers to it (a
        # kernel may have returned a view of it that lives on). References now: `raw`,
        # `entry`, the released array's .base, and getrefcount's own argument.
        if self.reserved > self.max_reserved:
            self.reserved -= raw.size  # leave it to the garbage collector
        elif sys.getrefcount(raw) > 4:
            self.parked.append(raw)  # a view lives on: reused once it is gone (_unpark)
            if len(self.parked) > MAX_PARKED:  # (views kept for long: the oldest left to the collector)
                self.reserved -= self.parked.pop(0).size
        else:
            self.free.setdefault(raw.size, []).append(raw)
        return True

    def _unpark(self) -> None:
        """The parked buffers no view refers to any more, back to the free lists. Asked on a
        miss: a plan with symbolic dims releases a value whose Reshape (a view of it) is still
        read (attention's heads), and dropping such a buffer made BERT-base's shared plan
        allocate 48 new ones of 256 KiB a run, each page faulted in again."""
        keep = []
        for raw in self.parked:
            if sys.getrefcount(raw) > 3:  # (the list, this loop's name, getrefcount's argument)
                keep.append(raw)
            else:
                self.free.setdefault(raw.size, []).append(raw)
        self.parked = keep

    def trim(self) -> None:
        for bucket in [*self.free.values(), self.parked]:
            self.reserved -= sum(b.size for b in bucket)
        self.free.clear()
        self.parked = []

    def stats(self) -> dict:
        return {"allocated_bytes": self.allocated, "reserved_bytes": self.reserved,
                "peak_allocated_bytes": self.peak_allocated, "hits": self.hits, "misses": self.misses}
