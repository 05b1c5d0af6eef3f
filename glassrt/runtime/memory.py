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

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


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
    kind: str  # arena | workspace | inplace | alias | output | dynamic
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

    __slots__ = ("names", "size", "first", "last", "offset")

    def __init__(self, name, size, first, last):
        self.names, self.size, self.first, self.last, self.offset = [name], size, first, last, None


def plan_memory(steps: list[StepIO], keep: set) -> MemoryPlan:
    """`keep`: values that must not live in the arena (graph outputs: returned to the user)."""
    producer, last_use, root = {}, {}, {}
    for k, s in enumerate(steps):
        for o in s.writes:
            producer[o] = k
            last_use.setdefault(o, k)
        for i in s.reads:
            last_use[i] = k
    # Graph outputs are read when the run returns, after the last step.
    for o in keep:
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
            src = s.inplace.get(o)
            g = group_of.get(src) if src else None
            if (g is not None and last_use.get(src) == k and src not in root.values() and g.size == _align(size)):
                g.names.append(o)
                g.last = last_use.get(o, k)
                group_of[o] = g
                planned[o] = PlannedValue(o, size, None, k, last_use.get(o, k), "inplace", src)
                continue
            g = _Group(o, _align(size), k, last_use.get(o, k))
            groups[o] = g
            group_of[o] = g
            planned[o] = PlannedValue(o, size, None, k, g.last, "arena")
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


def _assign_offsets(groups: list[_Group]) -> int:
    """Greedy by size: biggest first, each at the lowest offset that fits beside every
    already placed buffer whose lifetime overlaps (TFLite's arena planner does the same)."""
    placed: list[_Group] = []
    top = 0
    for g in sorted(groups, key=lambda g: (-g.size, g.first)):
        busy = sorted((p.offset, p.offset + p.size) for p in placed if p.first <= g.last and g.first <= p.last)
        offset = 0
        best = None
        for lo, hi in busy:
            if lo - offset >= g.size:
                gap = lo - offset
                if best is None or gap < best[1]:
                    best = (offset, gap)  # best fit: the smallest gap that holds it
            offset = max(offset, hi)
        g.offset = best[0] if best is not None else offset
        placed.append(g)
        top = max(top, g.offset + g.size)
    return top


def _lower_bound(groups: list[_Group], n_steps: int) -> int:
    live = [0] * (n_steps + 1)
    for g in groups:
        for k in range(g.first, g.last + 1):
            live[k] += g.size
    return max(live, default=0)
