"""Shape/dtype inference over a graph: runs each node's meta rule in order.

Pure: (graph, input types, known values) -> types and values for every value name.
Run once with the model's symbolic input types (for placement and `explain`) and once
per concrete input-shape signature (for the memory plan).
"""
from __future__ import annotations

import math
from collections import ChainMap
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

from .. import symbolic
from ..errors import GlassrtError, ShapeInferenceError, describe_node
from ..ir import Graph, OptionalType, SequenceType, TensorType
from ..ops.contract import MetaContext
from ..ops.ranks import check as check_ranks
from ..ops.registry import get_contract

_MAX_VALUE = 4096  # propagate known values only for small (shape-like) tensors


@dataclass
class Inference:
    types: dict
    values: dict  # name -> np.ndarray (concrete, or object array with symbolic dims)
    problems: dict = field(default_factory=dict)  # node name -> message (symbolic mode only)
    # id(node) -> (node, its input types, its input values): what each node was typed from,
    # so that a later inference of a changed graph (after the passes; a plan of the same
    # shapes) can take over a node's results instead of running its rule again.
    seen: dict = field(default_factory=dict, repr=False)


def _normalize(t):
    if isinstance(t, TensorType) and t.shape is not None:
        return TensorType(t.dtype, tuple(symbolic.normalize(d) for d in t.shape))
    if isinstance(t, SequenceType):
        return SequenceType(_normalize(t.elem))
    if isinstance(t, OptionalType):
        return OptionalType(_normalize(t.elem))
    return t


def scoped(own: dict, outer):
    """`own` over `outer` (a body's types or values over its enclosing scope's): a plain dict
    of both where the scope is small (a lookup in a ChainMap walks its maps in Python: deep
    nesting, If in Loop in If..., created twice as slow on chains), a ChainMap over a large
    scope rather than a copy of it per body (a model of 2,000 sibling Ifs copied its whole
    scope 2,000 times: quadratic), flattened once the chain holds MAX_CHAIN maps."""
    maps = outer.maps if isinstance(outer, ChainMap) else [outer]
    if sum(map(len, maps)) <= MAX_COPIED:
        return {**outer, **own}
    return ChainMap(own, dict(outer)) if len(maps) >= MAX_CHAIN else ChainMap(own, *maps)


MAX_COPIED = 2_000  # entries of a scope copied whole for each body
MAX_CHAIN = 6


def infer(graph: Graph, input_types: dict, *, outer_types=None, outer_values=None,
          strict: bool = True, reuse: Inference | None = None, subgraph: bool = False) -> Inference:
    """strict=False (symbolic planning) records a node's failure and carries on with
    unknown outputs, unless the node's inputs are fully static (then the model is wrong)
    and the graph is the model's own: in a subgraph (subgraph=True: an If branch, a loop
    body, and what they hold) such a node fails only if it runs (an If's guard that never
    takes its branch, a Loop of zero iterations), as onnxruntime loads such a model; its
    plan, built when it runs, says so then.

    reuse: an earlier inference (of this graph before passes rewrote parts of it, or of the
    same graph on other input types). A node it typed, given equal input types and the very
    same input values, gets the same results, which are copied, not recomputed. Sound
    because a node's rule is a function of the node and its inputs alone, and nodes are
    never changed in place (passes make new ones); nodes with subgraphs (which read the
    outer scope) and nodes whose rule failed there are inferred again."""
    # a subgraph also sees its outer scope's values; the top graph (no outer scope) gets
    # plain dicts: a ChainMap lookup costs several times a dict's, and inference looks up
    # every input of every node (a fifth of a small model's first inference)
    types = ChainMap({}, outer_types) if outer_types else {}
    vals = ChainMap({}, outer_values) if outer_values else {}
    problems = {}
    for name, arr in graph.initializers.items():
        types[name] = TensorType(arr.dtype, tuple(arr.shape))
        vals[name] = arr
    for vi in graph.inputs:
        if vi.name in graph.initializers and vi.name not in input_types:
            continue
        types[vi.name] = input_types.get(vi.name, vi.type)
    for name, t in input_types.items():  # outer-scope values fed to a subgraph
        types.setdefault(name, t)

    seen = {}
    for node in graph.nodes:
        in_types = [types.get(i) if i else None for i in node.inputs]
        in_values = [vals.get(i) if i else None for i in node.inputs]
        if reuse is None or not _take_over(reuse, node, in_types, in_values, types, vals):
            infer_node(graph, node, types, vals, problems, strict, in_types, in_values, subgraph)
        seen[id(node)] = (node, in_types, in_values)
    if not subgraph and outer_types is None:
        _outputs_as_declared(graph, types)
    own = lambda m: dict(m.maps[0]) if isinstance(m, ChainMap) else m  # noqa: E731
    return Inference(own(types), own(vals), problems, seen)


def _take_over(reuse: Inference, node, in_types, in_values, types, vals) -> bool:
    """Copy the node's results from `reuse` if it typed this node from the same inputs."""
    before = reuse.seen.get(id(node))
    if before is None or before[0] is not node or node.name in reuse.problems \
            or next(node.subgraphs(), None) is not None \
            or before[1] != in_types or any(a is not b for a, b in zip(before[2], in_values)):
        return False
    if any(o and reuse.types.get(o) is None for o in node.outputs):
        return False  # (an unknown type may have come from the other graph's declarations)
    for o in node.outputs:
        if o:
            types[o] = reuse.types[o]
            if o in reuse.values:
                vals[o] = reuse.values[o]
    return True


def infer_node(graph, node, types, vals, problems, strict, in_types=None, in_values=None, subgraph=False):
    """in_types, in_values: the node's inputs' types and values, where the caller has them;
    subgraph: the node is in a subgraph (see infer)."""
    contract = get_contract(node.domain, node.op_type, node.opset)
    if in_types is None:
        in_types = [types.get(i) if i else None for i in node.inputs]
    declared = graph.types if graph is not None else {}
    if contract is None:
        for o in node.outputs:
            if o:
                types[o] = declared.get(o)
        return

    def infer_subgraph(sub: Graph, sub_input_types):
        feed = {vi.name: t for vi, t in zip(sub.inputs, sub_input_types)}
        res = infer_body(sub, feed, types, vals, strict)
        return [res.types.get(v.name) for v in sub.outputs]

    if in_values is None:
        in_values = [vals.get(i) if i else None for i in node.inputs]
    ctx = MetaContext(node, contract, in_types, in_values, infer_subgraph)
    try:
        check_ranks(ctx)
        out = contract.meta(ctx)
        _no_negative_dims(ctx, node, out)
    except ShapeInferenceError as e:
        if strict or (_static_inputs(node, in_types) and not subgraph):
            raise
        problems[node.name] = str(e)
        out = [None] * len(node.outputs)
    except GlassrtError:
        raise
    except Exception as e:  # a bug in a meta rule must still name the node
        msg = f"{describe_node(node)}: shape inference failed ({type(e).__name__}: {e})"
        if strict or (_static_inputs(node, in_types) and not subgraph):
            raise ShapeInferenceError(msg) from e
        problems[node.name] = msg
        out = [None] * len(node.outputs)
    out = list(out) + [None] * (len(node.outputs) - len(out))
    for o, t in zip(node.outputs, out):
        if o:
            t = _normalize(t)
            types[o] = t if t is not None else declared.get(o)

    if contract.values is not None:  # Shape/Size need only types; the rules say None when they can't
        try:
            new_vals = contract.values(ctx)
        except Exception as e:  # the values stay unknown; shapes downstream may stay symbolic
            problems.setdefault(node.name, f"{describe_node(node)}: value propagation failed "
                                           f"({type(e).__name__}: {e})")
            new_vals = []
        for o, v in zip(node.outputs, new_vals):
            if o and v is not None and v.size <= _MAX_VALUE:
                t = types.get(o)
                if isinstance(t, TensorType) and symbolic.all_static(t.shape):
                    if v.size != math.prod(t.shape):  # (a value rule at odds with the meta's shape: not trusted)
                        continue
                    v = v.reshape(t.shape)
                vals[o] = v


def _element_type(t):
    while isinstance(t, (SequenceType, OptionalType)):
        t = t.elem
    return t.dtype if isinstance(t, TensorType) else None


def _outputs_as_declared(graph, types) -> None:
    """A graph output whose element type the model declares and its node computes another
    (a SequenceMap body turning floats into int64 for an output declared float): the model
    is refused, naming the node, as onnxruntime's type inference refuses it, rather than
    returning another type than the model says."""
    for vi in graph.outputs:
        declared, inferred = _element_type(vi.type), _element_type(types.get(vi.name))
        if declared is not None and inferred is not None and declared != inferred:
            node = next((n for n in graph.nodes if vi.name in n.outputs), None)
            where = describe_node(node) if node is not None else f"graph input '{vi.name}'"
            raise ShapeInferenceError(f"{where}: graph output '{vi.name}' is declared {vi.type} but is computed "
                                      f"as {types.get(vi.name)}")


def _no_negative_dims(ctx, node, out) -> None:
    """A rule that worked a dim out below 0 (Tile's repeats, Resize's sizes, a sample count,
    a pool's window... given as negative numbers): the node fails here, named, rather than
    the run where its output is allocated."""
    for o, t in zip(node.outputs, out or ()):
        if isinstance(t, TensorType) and t.shape is not None and any(type(d) is int and d < 0 for d in t.shape):
            ctx.fail(f"output '{o}' would have the shape {list(t.shape)}: a negative dim (from the node's "
                     "attributes or constant inputs)")


def _static_inputs(node, in_types) -> bool:
    """Every input the node is given (not the omitted optional ones) a tensor of known shape."""
    given = [t for name, t in zip(node.inputs, in_types) if name]
    return bool(given) and all(isinstance(t, TensorType) and t.is_static for t in given) and len(given) == len(in_types) - in_types.count(None) \
        and all(isinstance(t, TensorType) and t.is_static for t in given)


# A body's inference (what an If, Loop or Scan's rule asks of its subgraphs, what the
# passes type a body with) is a function of the body, its input types and the outer types
# and values it reads. Creating a session infers the same bodies again and again (the If
# rule at every inference of the graph around them, the expand pass, the bodies' own
# pipelines): Silero VAD's nested If bodies, ~690 nodes under a 5-node top graph, were 60%
# of its creation. While `subgraph_memo()` is open (a session's creation, a plan's
# compilation) each is kept, keyed by the body and what it reads (infer_body).
_subgraph_memo: ContextVar = ContextVar("glassrt_subgraph_memo", default=None)


@contextmanager
def subgraph_memo():
    """Keep bodies' inferences while open (nested: the outermost one's memo)."""
    token = _subgraph_memo.set({}) if _subgraph_memo.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _subgraph_memo.reset(token)


def infer_body(sub: Graph, input_types: dict, outer_types, outer_values, strict: bool = False) -> Inference:
    """infer() of a subgraph (an If, Loop or Scan body) typed against the scope around it;
    while subgraph_memo() is open, answered once per body and what it reads from that scope
    (the Inference is shared: read it, do not change it)."""
    memo = _subgraph_memo.get()
    if memo is None:
        return infer(sub, input_types, outer_types=outer_types, outer_values=outer_values, strict=strict,
                     subgraph=True)
    free = _free_names(sub, memo)
    key = (id(sub), strict, tuple(input_types.items()),
           tuple((n, outer_types.get(n), _value_key(outer_values.get(n))) for n in free))
    hit = memo.get(key)
    if hit is None:
        res = infer(sub, input_types, outer_types=outer_types, outer_values=outer_values, strict=strict,
                    subgraph=True)
        # (the entry holds the body and the values its key names by id: the ids stay theirs)
        hit = memo[key] = ((sub, [outer_values.get(n) for n in free]), res)
    return hit[1]


def _value_key(v):
    """A known value as a memo key: a small one by its contents (inference makes such values
    anew each time, a Shape's or a Gather's), a large one by identity (the memo's entry
    keeps it alive, so the id stays its own)."""
    if isinstance(v, np.ndarray) and v.size <= 64 and v.dtype != object:
        return v.dtype.str, v.shape, v.tobytes()
    return id(v)


def _free_names(g: Graph, memo: dict) -> tuple:
    """The names a body reads from its enclosing scopes, its nested bodies' included (walked,
    not taken from outer_names, which passes that rewrite a body do not update)."""
    key = ("free", id(g))
    hit = memo.get(key)
    if hit is not None:
        return hit[1]
    own = {v.name for v in g.inputs} | set(g.initializers) | {o for n in g.nodes for o in n.outputs if o}
    reads = []
    for n in g.nodes:
        for i in [*n.inputs, *(x for sg in n.subgraphs() for x in _free_names(sg, memo))]:
            if i and i not in own and i not in reads:
                reads.append(i)
    reads += [v.name for v in g.outputs if v.name not in own and v.name not in reads]
    memo[key] = (g, tuple(reads))
    return memo[key][1]


def infer_symbolic(graph: Graph, reuse: Inference | None = None):
    """Types of every value on the model's declared (symbolic) input types; a static shape
    error (every input shape known) is raised naming its node."""
    return infer(graph, {}, strict=False, reuse=reuse)
