"""The pass manager: graph passes as entries of one ordered pipeline.

A pass is a function `fn(graph, ctx) -> (graph', [what it changed, one line per
rewrite])` that leaves its input graph untouched. It declares what it needs from the
manager — `types` (the inferred type of every value), `providers` (to ask which ops can
run natively) — and the level it belongs to; `SessionOptions.graph_optimization_level`
picks the levels that run, as onnxruntime's graph optimization levels do:

  required   lowering the graph must have to run at all (composites the providers lack
             are expanded): runs at every level, even "none";
  basic      rewrites that keep every op as it is: dead code, constant folding, folding
             BatchNormalization and per-channel Mul/Add into Conv weights;
  extended   fusions into glassrt's own ops (Conv + residual + activation, GELU);
  all        layout rewrites (none yet).

Before the first pass that needs types the graph is type-checked: inference runs once and a static shape
error names its node, so no pass meets a graph whose types are wrong. Every pass keeps
the type of each value it leaves in place (rewrites keep output names and shapes); one
that adds values records their types in `ctx.types`. Each run is recorded (`PassRecord`)
for `explain`: what changed, how many nodes before and after, how long it took.
"""
from __future__ import annotations

import time
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Callable

from ..runtime.infer import scoped
from ._rewrite import Readers

LEVELS = ("none", "basic", "extended", "all")
_RANK = {"required": 0, "basic": 1, "extended": 2, "all": 3}


@dataclass(frozen=True)
class Pass:
    name: str
    level: str  # required | basic | extended | all
    fn: Callable
    needs: frozenset = frozenset()  # of "types", "providers"
    option: str | None = None  # a SessionOptions flag that must be true for it to run
    doc: str = ""
    # Whether a model file keeps what it did (`glassrt optimize` writes the graph after the
    # passes): a pass whose effect a file cannot hold (two initializers sharing memory) runs
    # again on a file that says its level was applied.
    persists: bool = True


@dataclass
class PassContext:
    """What the manager provides to passes."""

    options: object
    providers: list
    types: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)  # small known values (shapes), from inference
    # Filled by passes for the session and explain:
    expansions: list = field(default_factory=list)  # (node name, op, nodes it became, why)
    folded: list = field(default_factory=list)  # names of nodes folded into constants
    expansion_failures: dict = field(default_factory=dict)  # node name -> why its decomposition failed
    final_inference: object = None  # the Inference of the graph the pipeline returns, when it has one
    first_inference: object = None  # the Inference the passes were given (of the graph before them)
    body: bool = False  # passes over an If / Loop / Scan body (bodies.py), whose inputs and outputs are not the caller's


@dataclass
class PassRecord:
    name: str
    level: str
    changes: list  # one line per rewrite
    nodes_before: int
    nodes_after: int
    seconds: float
    skipped: str = ""  # why it did not run (its rewrites are already in the model)

    def to_json(self) -> dict:
        out = {"name": self.name, "level": self.level, "changes": self.changes, "nodes_before": self.nodes_before,
               "nodes_after": self.nodes_after, "ms": round(self.seconds * 1e3, 3)}
        return {**out, "skipped": self.skipped} if self.skipped else out


def level_rank(level) -> int:
    """onnxruntime's names and numbers are accepted too (ORT_ENABLE_BASIC, 99...)."""
    aliases = {"disable_all": "none", "ort_disable_all": "none", "enable_basic": "basic",
               "ort_enable_basic": "basic", "enable_extended": "extended", "ort_enable_extended": "extended",
               "enable_all": "all", "ort_enable_all": "all", 0: "none", 1: "basic", 2: "extended", 99: "all"}
    key = level.lower() if isinstance(level, str) else getattr(level, "value", level)
    name = aliases.get(key, key)
    if name not in LEVELS:
        from ..errors import InvalidArgumentError

        raise InvalidArgumentError(f"graph_optimization_level must be one of {', '.join(LEVELS)}, got {level!r}")
    return LEVELS.index(name)


def selected(pipeline, options) -> list[Pass]:
    rank = level_rank(getattr(options, "graph_optimization_level", "all"))
    return [p for p in pipeline if _RANK[p.level] <= rank and (p.option is None or getattr(options, p.option))]


def _own(m):
    """A copy the passes may add to: of a body's scope (a ChainMap), a layer over it (or a
    plain copy, where the scope is small: infer.scoped)."""
    return scoped({}, m) if isinstance(m, ChainMap) else dict(m)


def run_pipeline(graph, pipeline, ctx: PassContext, infer_types) -> tuple:
    """(graph', [PassRecord]). `infer_types(graph) -> Inference` types the graph once, before
    the first pass that needs types (which also checks them). When no pass after that
    changed the graph (each returns its input graph itself when it has nothing to do), that
    inference is the final graph's too: `ctx.final_inference`, so the session does not
    infer the same graph twice."""
    records, typed = [], None
    try:
        for p in pipeline:
            if "types" in p.needs and typed is None:
                inference = infer_types(graph)
                ctx.types, ctx.values, typed = _own(inference.types), _own(inference.values), (graph, inference)
            before = len(graph.nodes)
            t0 = time.perf_counter()
            graph, changes = p.fn(graph, ctx)
            records.append(PassRecord(p.name, p.level, list(changes), before, len(graph.nodes),
                                      time.perf_counter() - t0))
    finally:
        Readers.forget()  # (the index of the last node list: not kept past the passes)
    if typed is not None:
        ctx.first_inference = typed[1]
        if typed[0] is graph:
            ctx.final_inference = typed[1]
    return graph, records
