"""`glassrt optimize`: glassrt's graph passes run once, the result saved as a standard ONNX model.

The model is loaded, its symbolic input dims optionally bound (`--dim batch=1`: shape
arithmetic then folds into constants), the passes of the chosen level run exactly as a
session's do, and export.py writes the graph (fused ops as model-local functions). The
report says what changed: nodes per op type before and after, weight bytes before and
after, each pass with its rewrites.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .. import onnx_io, symbolic
from ..errors import InvalidArgumentError
from ..export import Written, write_model
from ..ir import Graph, TensorType, ValueInfo
from ..passes import run_passes
from ..passes.manager import LEVELS, level_rank
from ..runtime import providers as providers_mod
from ..runtime.options import SessionOptions


@dataclass
class Report:
    source: str
    written: Written
    level: str
    ops_before: dict
    ops_after: dict
    weight_bytes_before: int
    weight_bytes_after: int
    passes: list = field(default_factory=list)  # PassRecord
    seconds: float = 0.0

    def to_json(self) -> dict:
        w = self.written
        return {"source": self.source, "output": w.path, "external_data": w.data_path, "level": self.level,
                "ops_before": self.ops_before, "ops_after": self.ops_after,
                "weight_bytes_before": self.weight_bytes_before, "weight_bytes_after": self.weight_bytes_after,
                "functions": w.functions, "function_calls": w.calls, "embedded_bytes": w.embedded_bytes,
                "external_bytes": w.external_bytes, "external_tensors": w.external_tensors,
                "passes": [r.to_json() for r in self.passes], "seconds": round(self.seconds, 3)}


def op_counts(graph: Graph) -> dict:
    """Nodes per op type ("domain::op" outside the default domain), bodies of If/Loop/Scan included."""
    return dict(collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.walk()))


def weight_bytes(graph: Graph) -> int:
    graphs = [graph, *(s for n in graph.walk() for s in n.subgraphs())]
    return sum(int(a.nbytes) for g in graphs for a in g.initializers.values() if isinstance(a, np.ndarray))


def bind_dims(graph: Graph, dims: dict) -> Graph:
    """The graph with its inputs' named symbolic dims replaced by the given values; a name
    no input has is refused (a typo would otherwise bind nothing)."""
    if not dims:
        return graph
    known = sorted({n for vi in graph.inputs if isinstance(vi.type, TensorType) and vi.type.shape
                    for d in vi.type.shape for n in symbolic.free_names(d) if not n.startswith("unk__")})
    unknown = sorted(set(dims) - set(known))
    if unknown:
        raise InvalidArgumentError(f"--dim {', '.join(unknown)}: the model's inputs have no dim of that name; "
                                   f"their dims are: {', '.join(known) or 'none named'}")
    for k, v in dims.items():
        if not isinstance(v, int) or v < 0:
            raise InvalidArgumentError(f"--dim {k}={v!r}: a dim must be a non-negative integer")
    inputs = []
    for vi in graph.inputs:
        t = vi.type
        if isinstance(t, TensorType) and t.shape is not None:
            t = TensorType(t.dtype, tuple(d if isinstance(d, int) else symbolic.evaluate(d, dims) for d in t.shape))
        inputs.append(ValueInfo(vi.name, t))
    types = {**graph.types, **{vi.name: vi.type for vi in inputs if vi.type is not None}}
    return replace(graph, inputs=inputs, types=types)


def fold_bound_values(graph: Graph, infer_types) -> tuple[Graph, list]:
    """Nodes whose every output inference knows once the dims are bound (Shape, and the
    Gather/Unsqueeze/Concat arithmetic on it) become initializers; fold_constants then folds
    what reads them. Only with --dim: a session folds these per plan, once shapes are known."""
    from ..passes.manager import PassRecord
    from ..runtime.folding import may_fold

    t0 = time.perf_counter()
    values = infer_types(graph).values
    known = lambda o: isinstance(values.get(o), np.ndarray) and values[o].dtype != object  # noqa: E731
    keep, inits, changes = [], dict(graph.initializers), []
    for n in graph.nodes:
        outs = [o for o in n.outputs if o]
        if outs and may_fold(n) and all(known(o) for o in outs):
            inits.update({o: np.asarray(values[o]) for o in outs})
            changes.append(f"fold {n.op_type} '{n.name}': its value follows from the bound dims")
        else:
            keep.append(n)
    record = PassRecord("fold_bound_values", "basic", changes, len(graph.nodes), len(keep), time.perf_counter() - t0)
    return replace(graph, nodes=keep, initializers=inits), [record]


def optimize(model, output, *, level: str = "all", dims: dict | None = None, external_data: bool = False,
             size_threshold: int = 1024, providers=None) -> Report:
    """Load `model` (a path), run the passes of `level`, write `output`; see the module doc."""
    from ..runtime.infer import infer_symbolic

    level_rank(level)  # an unknown level is refused by name
    level = level if isinstance(level, str) and level in LEVELS else LEVELS[level_rank(level)]
    if size_threshold < 0:
        raise InvalidArgumentError(f"--size-threshold must be >= 0 bytes, got {size_threshold}")
    t0 = time.perf_counter()
    graph = onnx_io.load(model)
    before, bytes_before = op_counts(graph), weight_bytes(graph)
    graph, records = bind_dims(graph, dims or {}), []
    if dims and level_rank(level) >= level_rank("basic"):
        graph, records = fold_bound_values(graph, infer_symbolic)
    options = SessionOptions(graph_optimization_level=level)
    notes: list = []
    graph, _, more = run_passes(graph, options, providers_mod.make(providers, notes), infer_symbolic)
    records += more
    source = str(model) if not isinstance(model, (bytes, bytearray)) else None
    written = write_model(graph, output, passes=records, level=level, external_data=external_data,
                          size_threshold=size_threshold, source=source)
    return Report(str(model), written, level, before, op_counts(graph), bytes_before, weight_bytes(graph), records,
                  time.perf_counter() - t0)


def render(report: Report, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    from .explain import fmt_bytes

    table = Table(title=f"nodes per op type, level {report.level}", title_justify="left")
    for col, justify in (("op", "left"), ("before", "right"), ("after", "right"), ("change", "right")):
        table.add_column(col, justify=justify)
    ops = sorted(set(report.ops_before) | set(report.ops_after),
                 key=lambda k: (-max(report.ops_before.get(k, 0), report.ops_after.get(k, 0)), k))
    for op in ops:
        a, b = report.ops_before.get(op, 0), report.ops_after.get(op, 0)
        table.add_row(escape(op), str(a), str(b), f"{b - a:+d}" if a != b else "",
                      style="green" if b < a else "cyan" if b > a else None)
    na, nb = sum(report.ops_before.values()), sum(report.ops_after.values())
    table.add_row("total", str(na), str(nb), f"{nb - na:+d}" if na != nb else "", style="bold", end_section=True)
    wa, wb = report.weight_bytes_before, report.weight_bytes_after
    table.add_row("weight bytes", fmt_bytes(wa), fmt_bytes(wb), f"{(wb - wa) / 2**20:+.1f} MiB" if wa != wb else "")
    console.print(table)
    skipped = {r.skipped for r in report.passes if r.skipped}
    for why in skipped:
        console.print(f"  passes not run again: {why}", highlight=False, markup=False)
    for r in report.passes:
        if r.changes:
            console.print(f"  {r.name}: {len(r.changes)} rewrite(s), {r.nodes_before} → {r.nodes_after} nodes",
                          highlight=False, markup=False)
    w = report.written
    fns = ", ".join(f"glassrt::{op} ({w.calls.get(op, 0)} node(s), {k} function overload(s))"
                    for op, k in w.functions.items())
    console.print(f"wrote {w.path}" + (f" and {w.data_path} ({w.external_tensors} tensors, "
                                         f"{fmt_bytes(w.external_bytes)}, aligned for mapping)" if w.data_path else "")
                  + f" in {report.seconds:.2f} s", highlight=False, markup=False)
    if fns:
        console.print(f"fused ops as model-local functions: {fns}", highlight=False, markup=False)

