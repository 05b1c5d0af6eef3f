"""Placement: which provider runs each node, and why every other one did not.

Input: a graph after the passes (composites the providers lack are already expanded, see
passes/expand.py) and its inferred types. For each node the provider priority list is
walked in order; the first provider with a kernel that can run the node takes it.
A node that passes a complete provider (cpu: it aims to run every operator) and runs on a
later one (reference) is a fallback: warned once per node, counted, and an error under
fallback="error". Passing a partial provider (onednn: it takes only what it is fast at) is
its design, not a fallback; explain still gives its reason.

Where a value crosses between providers that keep data on different devices, a
`glassrt::Transfer` node is inserted: a step of the plan like any other, placed on the
device-side provider, counted and listed (`Placement.transfers`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Callable

from .. import symbolic
from ..errors import UnsupportedOperatorError, describe_node
from ..ir import Graph, Node, TensorType
from ..kernels.registry import BindContext
from ..ops.registry import get_contract
from .infer import Inference, infer, scoped
from .layout import choose_layouts
from .select import is_static, provider_verdict_checked

HOST = "cpu"  # the device whose arrays are NumPy arrays: graph inputs and outputs live here


@dataclass
class Decision:
    node: Node
    provider: str | None
    kernels: list  # the chosen provider's eligible kernels, best first
    reason: str  # why this provider
    rejected: list = field(default_factory=list)  # [(provider, reason)] for providers skipped
    fallback: bool = False
    # Decides what the later providers would do (see `alternative`), or None.
    later: Callable | None = field(default=None, repr=False, compare=False)
    # Earlier (partial) providers that refused the node only for shapes placement did not
    # know (an If body's values, of unknown rank): a plan, whose shapes are concrete, asks them
    # again (runtime/plan.py, _earlier_provider).
    earlier: tuple = field(default=(), repr=False, compare=False)
    # The kernels' verdicts on the node reached while placing it (BindContext.verdict), each
    # kept with its types and constants: a plan's context finds those of its own (plan.py).
    verdicts: dict | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def alternative(self) -> Decision | None:
        """What the later providers would do: a plan takes it when this provider's kernels
        refuse the plan's shapes (placement decides on symbolic ones; see runtime/plan.py).
        Decided when a plan first asks: most never do, and deciding it for every node of a
        model with a symbolic batch was a third of placing it (MobileNetV2)."""
        return self.later() if self.later is not None else None

    def skipped(self) -> str:
        """Why the providers before this one did not take the node ("" when none did not)."""
        return "; ".join(f"{p}: {r}" for p, r in self.rejected)


@dataclass
class Transfer:
    value: str  # the value copied
    src: str  # provider (or "host" for graph inputs and outputs) it comes from
    dst: str  # provider it goes to
    consumer: str  # the first node that reads the copy ("" for a graph output)
    node: str = ""  # the glassrt::Transfer node that copies it
    bytes: object = None  # an int, a formula in the symbolic dims, or None when unknown


@dataclass
class Fallback:
    """A node that runs on a later provider than the first that could have run it. Placement
    finds most (`shapes` empty: every run); a plan finds the rest, where the provider
    placement chose refuses the plan's shapes (`shapes`: the inputs the plan is for)."""

    node: str
    op: str
    provider: str
    reason: str
    shapes: str = ""

    def __str__(self):
        where = f" for {self.shapes}" if self.shapes else ""
        return f"{self.op} node '{self.node}' ran on {self.provider}{where}: {self.reason}"


@dataclass
class Placement:
    graph: Graph  # the graph as placed (transfer nodes inserted)
    decisions: dict  # node name -> Decision
    subgraphs: dict  # node name -> {attr name: Placement or [Placement]}
    transfers: list
    inference: Inference  # the symbolic types the decisions were made on
    layouts: dict = field(default_factory=dict)  # value -> "nhwc" where not plain NCHW (layout.py)
    layout_edges: list = field(default_factory=list)  # layout.LayoutEdge: where a region meets NCHW values
    # [(node, why)] that no provider can run, kept (provider None) only when placed with
    # mark_unsupported=True: explain shows them among the rest; such a placement never runs
    unsupported: list = field(default_factory=list)

    def all_decisions(self):
        yield from self.decisions.values()
        for subs in self.subgraphs.values():
            for p in subs.values():
                for q in p if isinstance(p, list) else [p]:
                    yield from q.all_decisions()

    @property
    def fallbacks(self) -> list[Fallback]:
        return [Fallback(d.node.name, d.node.op_type, d.provider, _fallback_reason(d))
                for d in self.all_decisions() if d.fallback]

    def counts(self) -> dict:
        out = {}
        for d in self.all_decisions():
            key = d.provider or "unsupported"
            out[key] = out.get(key, 0) + 1
        return out


def _fallback_reason(d: Decision) -> str:
    return "; ".join(f"{p}: {r}" for p, r in d.rejected)


def place(graph: Graph, inference: Inference, providers, *, outer_types=None, outer_values=None,
          expansion_failures: dict | None = None, mark_unsupported: bool = False,
          batch: frozenset | None = None) -> Placement:
    """Decide a provider for every node of `graph` (typed by `inference`). Subgraphs (If,
    Loop and Scan bodies) are typed against the enclosing scope and placed the same way.
    `expansion_failures` (node name -> why its decomposition failed, from the expand pass)
    joins the reasons a node could not run natively. A node no provider can run raises
    UnsupportedOperatorError, or with `mark_unsupported` (for explain) gets a Decision with
    provider None and the reason, listed in `Placement.unsupported`."""
    failures = expansion_failures or {}
    batch = batch_symbols(graph) if batch is None else batch
    # a body's own over its scope's, not a copy of the scope per body (quadratic in a model
    # of many Ifs: 2,000 of them took 2.7 s to place and pass)
    own_types = dict(inference.types)
    types = scoped(own_types, outer_types) if outer_types is not None else own_types
    values = scoped(dict(inference.values), outer_values or {}) if outer_types is not None \
        else dict(inference.values)
    decisions, subgraphs, unsupported = {}, {}, []
    for node in graph.nodes:
        decision, why_not = decide(node, types, values, providers, failures.get(node.name), batch)
        if decision is None:
            unsupported.append((node, why_not))
            if mark_unsupported:
                decisions[node.name] = Decision(node, None, [], why_not)
            continue
        decisions[node.name] = decision
        subs = {}
        for attr, v in node.attrs.items():
            graphs = v if isinstance(v, list) else [v]
            if graphs and all(isinstance(g, Graph) for g in graphs):
                ps = [place(g, infer(g, {}, outer_types=types, outer_values=values, strict=False, subgraph=True),
                            providers, outer_types=types, outer_values=values, expansion_failures=failures,
                            mark_unsupported=mark_unsupported, batch=batch) for g in graphs]
                unsupported += [u for p in ps for u in getattr(p, "_unsupported", [])]
                subs[attr] = ps if isinstance(v, list) else ps[0]
        if subs:
            subgraphs[node.name] = subs

    # (a body's types: its own and the enclosing scope's it reads, what its plans look up)
    seen = types if outer_types is None else {**own_types, **{n: types[n] for n in graph.outer_names if n in types}}
    placed_graph = replace(graph, types={**graph.types, **seen})
    placement = Placement(placed_graph, decisions, subgraphs, [], inference)
    if outer_types is not None:
        placement._unsupported = unsupported  # reported once, by the top-level call
    elif unsupported and mark_unsupported:
        placement.unsupported = unsupported
    elif unsupported:
        raise unsupported_error(unsupported, providers)
    if not unsupported:
        _insert_transfers(placement, providers, types)
        # a body too: what it reads from outside and its outputs stay plain (layout.py)
        placement.layouts, placement.layout_edges = choose_layouts(placement.graph, placement.decisions, types)
    return placement


def unsupported_error(unsupported, providers) -> UnsupportedOperatorError:
    return UnsupportedOperatorError(
        f"{len(unsupported)} node(s) cannot run on providers [{', '.join(p.name for p in providers)}]:\n"
        + "\n".join(f"  {describe_node(n)}{' (' + n.origin + ')' if n.origin else ''}: {why}"
                    for n, why in unsupported))


def batch_symbols(graph: Graph) -> frozenset:
    """The symbols that lead a graph input of rank 2 or more: its batch, as exporters write
    it (a 1-D input's symbol is a length: Silero's samples). Judged at 1 first (select.py)."""
    return frozenset(n for v in graph.inputs
                     if isinstance(v.type, TensorType) and v.type.shape is not None and len(v.type.shape) >= 2
                     and not isinstance(v.type.shape[0], int) for n in symbolic.free_names(v.type.shape[0]))


def decide(node, types, values, providers, expansion_failure=None, batch=frozenset()) -> tuple[Decision | None, str]:
    """(the decision, "") or (None, why no provider can run the node). A partial provider's
    choice also records the next providers' (decided only if a plan asks): a plan may see
    what placement could not, symbolic dims made concrete, the layouts it chose, or an If
    body's outer values as run-time inputs (openwakeword's hey-jarvis: a Gemm in an If
    branch reading an outer weight)."""
    contract = get_contract(node.domain, node.op_type, node.opset)
    if contract is None:
        return None, "no such operator in the onnx schemas or the custom-op registry"
    ctx = node_context(node, contract, types, values)
    rejected, shape_bound = [], []
    for rank, p in enumerate(providers):
        ks, why, accepted, shape_free = provider_verdict_checked(p, node, contract, ctx, batch)
        if ks:
            passed_complete = any(not q.partial for q in providers[:rank])
            d = Decision(node, p.name, ks, why, list(rejected), fallback=passed_complete,
                         earlier=tuple(q for q in shape_bound if q.device == p.device), verdicts=ctx.verdicts)
            if rank + 1 < len(providers) and (not accepted or p.partial):
                # taken on shapes it cannot judge yet (symbolic), or by a partial provider
                # whose kernels judge a plan's layouts too: the next providers' choice, for
                # plans whose shapes or layouts its kernels refuse (decided only if one does)
                d.later = functools.partial(_later_providers, node, types, values, providers[rank + 1:],
                                            list(rejected), p, passed_complete, batch)
            return d, ""
        rejected.append((p.name, why))
        if p.partial and shape_free and not is_static(ctx):  # refused on shapes it could not see
            shape_bound.append(p)
        if rank == 0 and expansion_failure:
            rejected.append(("decomposition", expansion_failure))
    return None, "; ".join(f"{p}: {r}" for p, r in rejected)


def _later_providers(node, types, values, later, rejected, provider, passed_complete, batch) -> Decision | None:
    alt, _ = decide(node, types, values, later, batch=batch)
    if alt is not None:
        alt.rejected = rejected + [(provider.name, "refused the plan's shapes")] + alt.rejected
        alt.fallback = alt.fallback or passed_complete or not provider.partial
    return alt


def node_context(node, contract, types, values) -> BindContext:
    return BindContext(node, contract.attrs_with_defaults(node),
                       [types.get(x) if x else None for x in node.inputs],
                       [types.get(x) if x else None for x in node.outputs],
                       [values.get(x) if x else None for x in node.inputs], contract=contract)


# ---------------------------------------------------------------- transfers


def _insert_transfers(placement: Placement, providers, types) -> None:
    """A glassrt::Transfer node wherever a value meets a provider on another device: one
    copy per (value, device), shared by every reader there; graph outputs come home."""
    by_name = {p.name: p for p in providers}
    device = {name: p.device for name, p in by_name.items()}
    graph = placement.graph
    if all(d == HOST for d in device.values()):
        return
    where = {v.name: "host" for v in graph.inputs}
    where.update({name: "host" for name in graph.initializers})
    dev_of = lambda owner: HOST if owner == "host" else device[owner]  # noqa: E731
    copies = {}  # (value, device) -> name of the copy
    nodes = []

    def transfer(value, src, dst_provider, dst_device, consumer, out_name=None):
        key = (value, dst_device)
        if key in copies and out_name is None:
            return copies[key]
        owner = by_name[dst_provider] if dst_device != HOST else by_name[src]
        name = out_name or f"{value}@{dst_device}"
        tnode = Node("Transfer", "glassrt", [value], [name], {"src_device": dev_of(src), "dst_device": dst_device},
                     f"transfer/{value}->{dst_device}", 1, origin=f"copy of '{value}' for {dst_provider}")
        kern = owner.transfer_kernel(dev_of(src), dst_device)
        if kern is None:
            raise UnsupportedOperatorError(
                f"provider '{owner.name}' keeps data on device '{owner.device}' but has no copy between "
                f"'{dev_of(src)}' and '{dst_device}' for value '{value}' (read by {consumer or 'the caller'})")
        placement.decisions[tnode.name] = Decision(
            tnode, owner.name, [kern], f"copy from {dev_of(src)} to {dst_device} ({src} → {dst_provider})")
        t = types.get(value)
        types[name] = t
        placement.transfers.append(Transfer(value, src, dst_provider, consumer, tnode.name,
                                            t.nbytes() if isinstance(t, TensorType) and t.shape is not None else None))
        nodes.append(tnode)
        copies[key] = name
        return name

    outputs = set(graph.output_names())
    for node in graph.nodes:
        d = placement.decisions[node.name]
        here = device[d.provider]
        new_inputs = []
        for x in node.inputs:
            src = where.get(x)
            if x and src is not None and dev_of(src) != here:
                x = transfer(x, src, d.provider, here, node.name)
            new_inputs.append(x)
        # Outputs the caller reads leave the device: the node writes a device copy, and a
        # transfer after it writes the value itself.
        home = {o: f"{o}@{here}" for o in node.outputs if o in outputs} if here != HOST else {}
        if new_inputs != list(node.inputs) or home:
            node = replace(node, inputs=new_inputs, outputs=[home.get(o, o) for o in node.outputs])
            placement.decisions[node.name] = replace(d, node=node)
        nodes.append(node)
        for o in node.outputs:
            where[o] = d.provider
        for o, on_device in home.items():
            types[on_device] = types.get(o)
            transfer(on_device, d.provider, "host", HOST, "", out_name=o)
    placement.graph = replace(graph, nodes=nodes, types={**graph.types, **types})
