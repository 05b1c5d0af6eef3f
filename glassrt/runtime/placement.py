"""Placement: which provider runs each node, and why every other one did not.

For each node, the provider priority list is walked in order. A composite op that the
first provider has no kernel for is expanded into its decomposition (so it runs
natively, op by op) rather than falling back whole to the reference provider — unless
another real provider has a kernel for it. Anything a later provider runs is a
fallback: warned once per node, counted, and an error under fallback="error".
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .. import dtypes
from ..errors import UnsupportedOperatorError, describe_node
from ..ir import Graph, Node, TensorType
from ..kernels.registry import BindContext, Kernel
from ..ops.contract import schema_defaults
from ..ops.registry import get_contract
from .infer import infer


@dataclass
class Decision:
    node: Node
    provider: str | None
    kernels: list  # the chosen provider's eligible kernels, best first
    reason: str  # why this provider
    rejected: list = field(default_factory=list)  # [(provider, reason)] for providers skipped
    fallback: bool = False


@dataclass
class Transfer:
    value: str
    src: str
    dst: str
    consumer: str


@dataclass
class Fallback:
    node: str
    op: str
    provider: str
    reason: str

    def __str__(self):
        return f"{self.op} node '{self.node}' ran on {self.provider}: {self.reason}"


@dataclass
class Placement:
    graph: Graph  # the graph as placed (composites expanded where needed)
    decisions: dict  # node name -> Decision
    subgraphs: dict  # node name -> {attr name: Placement or [Placement]}
    transfers: list
    expansions: list  # (node name, op, number of nodes it became, reason)
    inference: object  # the symbolic Inference the decisions were made on

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
            out[d.provider] = out.get(d.provider, 0) + 1
        return out


def _fallback_reason(d: Decision) -> str:
    return "; ".join(f"{p}: {r}" for p, r in d.rejected)


def kernel_reason(k: Kernel, ctx: BindContext, *, shapes: bool = True) -> str | None:
    """None if the kernel can run the node, else why not. shapes=False skips the kernel's
    own predicate (which may need concrete shapes; selection re-checks it per plan)."""
    since = ctx.since_version
    if not k.covers_version(since):
        lo, hi = k.versions
        return f"{k.name} covers {ctx.node.op_type} versions {lo}..{hi or 'latest'}, node needs version {since}"
    n_out = max((i + 1 for i, o in enumerate(ctx.node.outputs) if o), default=0)
    if n_out > 1 and not k.multi:
        return f"{k.name} computes one output; the node asks for {n_out}"
    if k.dtypes is not None:
        dt = _key_dtype(ctx)
        if dt is not None and dt not in k.dtypes:
            return f"dtype {dtypes.name(dt)} not covered (covers {', '.join(sorted(dtypes.name(d) for d in k.dtypes))})"
    if k.attrs is not None:
        defaults = schema_defaults(ctx.contract.schema) if ctx.contract else {}
        for a, v in ctx.node.attrs.items():
            if a not in k.attrs and a not in NO_EFFECT_ATTRS and not _same(defaults.get(a, _MISSING), v):
                return f"attribute {a}={_short(v)} not supported by {k.name}"
    if shapes and k.accepts is not None:
        try:
            why = k.accepts(ctx)
        except Exception as e:  # a predicate that can't decide on symbolic shapes says no
            why = f"{k.name} cannot decide on these shapes ({type(e).__name__}: {e})"
        if why:
            return why if isinstance(why, str) else f"{k.name} does not accept this node"
    return None


_MISSING = object()
# Attributes that never change what an op computes (opsets 1-5's memory hint).
NO_EFFECT_ATTRS = {"consumed_inputs"}


def _same(a, b):
    try:
        return bool(np.all(np.asarray(a) == np.asarray(b))) and np.shape(a) == np.shape(b)
    except Exception:
        return False


def _short(v):
    s = repr(v)
    return s if len(s) < 40 else s[:37] + "..."


def _key_dtype(ctx: BindContext):
    """The dtype kernels are chosen by: the first given input's (unknown when its producer's
    type is: judging by a later input, e.g. a float scale, would give a misleading reason),
    or the first output's for nodes without inputs."""
    given = [t for name, t in zip(ctx.node.inputs, ctx.input_types) if name]
    if given:
        return given[0].dtype if isinstance(given[0], TensorType) else None
    for t in ctx.output_types:
        if isinstance(t, TensorType):
            return t.dtype
    return None


def provider_verdict(provider, node, contract, ctx) -> tuple[list, str]:
    """(candidate kernels best first, reason). The provider can run the node when at
    least one kernel passes every check on the symbolic shapes; the candidates are all
    kernels that pass the shape-independent checks, for selection to choose from per plan."""
    ks = provider.kernels(node.domain, node.op_type, node.opset)
    if not ks:
        return [], f"no {provider.name} kernel for {node.op_type}" + (f" (domain {node.domain})" if node.domain else "")
    candidates, ok, why = [], [], []
    for k in ks:
        r = kernel_reason(k, ctx, shapes=False)
        if r:
            why.append(r)
            continue
        candidates.append(k)
        r = kernel_reason(k, ctx)
        (why.append(r) if r else ok.append(k))
    if ok or (candidates and not _all_static(ctx)):
        candidates.sort(key=lambda k: -k.priority)
        return candidates, f"{provider.name} has {node.op_type} kernel(s): {', '.join(k.name for k in candidates)}"
    return [], "; ".join(dict.fromkeys(why))


def _all_static(ctx) -> bool:
    return all(t is None or not isinstance(t, TensorType) or t.is_static for t in ctx.input_types)


def place(graph: Graph, providers, input_types: dict | None = None, *, outer_types=None,
          outer_values=None) -> Placement:
    inference = infer(graph, input_types or {}, outer_types=outer_types, outer_values=outer_values, strict=False)
    types, values = dict(outer_types or {}), dict(outer_values or {})
    types.update(inference.types)
    values.update(inference.values)
    decisions, subgraphs, expansions, unsupported = {}, {}, [], []
    nodes = list(graph.nodes)
    placed_nodes = []
    visible = set(types) | set(graph.initializers) | {v.name for v in graph.inputs}
    i = 0
    while i < len(nodes):
        node = nodes[i]
        i += 1
        contract = get_contract(node.domain, node.op_type, node.opset)
        if contract is None:
            unsupported.append((node, "no such operator in the onnx schemas or the custom-op registry"))
            continue
        in_types = [types.get(x) if x else None for x in node.inputs]
        out_types = [types.get(x) if x else None for x in node.outputs]
        ctx = BindContext(node, contract.attrs_with_defaults(node), in_types, out_types,
                          [values.get(x) if x else None for x in node.inputs], contract=contract)
        rejected, chosen = [], None
        for rank, p in enumerate(providers):
            ks, why = provider_verdict(p, node, contract, ctx)
            if ks:
                chosen = Decision(node, p.name, ks, why, list(rejected), fallback=rank > 0)
                break
            rejected.append((p.name, why))
            # A composite the first provider lacks is expanded rather than sent whole to the
            # reference fallback; a real kernel on another provider is still preferred.
            if rank == 0 and contract.decomposition is not None and not any(
                    q.name != "reference" and provider_verdict(q, node, contract, ctx)[0] for q in providers[1:]):
                body = _expand(node, contract, in_types, visible)
                if body:
                    expansions.append((node.name, node.op_type, len(body), why))
                    # Infer the new nodes' types, then place them like any other node.
                    sub = Graph(graph.name, body, [], [], {}, types={})
                    res = infer(sub, {}, outer_types=types, outer_values=values, strict=False)
                    types.update(res.types)
                    values.update(res.values)
                    visible |= set(res.types)
                    nodes[i:i] = body
                    chosen = "expanded"
                    break
        if chosen == "expanded":
            continue
        if chosen is None:
            unsupported.append((node, "; ".join(f"{p}: {r}" for p, r in rejected)))
            continue
        decisions[node.name] = chosen
        placed_nodes.append(node)
        subs = {}
        for attr, v in node.attrs.items():
            graphs = v if isinstance(v, list) else [v]
            if graphs and all(isinstance(g, Graph) for g in graphs):
                ps = [place(g, providers, {}, outer_types=types, outer_values=values) for g in graphs]
                unsupported += [u for p in ps for u in getattr(p, "_unsupported", [])]
                subs[attr] = ps if isinstance(v, list) else ps[0]
        if subs:
            subgraphs[node.name] = subs

    placed_graph = replace(graph, nodes=placed_nodes, types={**graph.types, **types})
    placement = Placement(placed_graph, decisions, subgraphs, _transfers(placed_graph, decisions, providers),
                          expansions, inference)
    if outer_types is not None:
        placement._unsupported = unsupported  # reported once, by the top-level call
    elif unsupported:
        raise UnsupportedOperatorError(
            f"{len(unsupported)} node(s) cannot run on providers [{', '.join(p.name for p in providers)}]:\n"
            + "\n".join(f"  {describe_node(n)}{' (' + n.origin + ')' if n.origin else ''}: {why}"
                        for n, why in unsupported))
    return placement


def _expand(node, contract, in_types, visible):
    try:
        return contract.decomposition(node, in_types, visible)
    except Exception:
        return None


def _transfers(graph, decisions, providers) -> list[Transfer]:
    device = {p.name: p.device for p in providers}
    where = {}
    out = []
    for n in graph.nodes:
        d = decisions[n.name]
        for x in n.inputs:
            if x in where and device[where[x]] != device[d.provider]:
                out.append(Transfer(x, where[x], d.provider, n.name))
        for o in n.outputs:
            where[o] = d.provider
    return out
