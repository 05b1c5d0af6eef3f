"""The pass pipeline inside If / Loop / Scan bodies.

A body is a graph of its own whose nodes may also read the scope around it. Exporters put
whole models inside one: Silero VAD v5 and v6 compute everything under `If(sr == 16000)`,
their weights Constant nodes of the branch or initializers of the top graph sliced inside
nested branches. Left as loaded, such a body had no constants of its own: no convolution
had constant weights (so oneDNN took none), no LSTM had its weights packed once, no Relu
was fused into its Conv. Each body now gets the pipeline the top graph got, after it,
typed against the scope it sits in (the top graph's types, then each enclosing body's).

The outer constants a body's nodes read become the body's own initializers first, under
names of its own (the same arrays, not copies; ONNX forbids a body to redefine an outer
name, and `glassrt optimize` writes bodies out): its passes then fold what follows from
them, and its plans bind kernels that need constant weights. Overridable initializers
(also graph inputs) are not constants and stay outer reads.

What keeps this sound is what keeps the passes sound on a top graph: they keep a graph's
outputs and the names its subgraphs read, and never rewrite a name the graph does not
define. Each body's records join the session's, named by where the body is, when they
changed something.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Graph
from ..runtime.infer import Inference, infer_body, scoped
from .manager import PassContext, run_pipeline


def has_bodies(graph: Graph) -> bool:
    return any(True for n in graph.nodes for _ in n.subgraphs())


def optimize_bodies(graph: Graph, passes, ctx: PassContext, scope: Inference, constants: dict, records: list,
                    where: str = "") -> Graph:
    """`graph` with each node's bodies run through `passes` (and theirs, recursively).
    `scope` types `graph` (with what encloses it), `constants` are the constants it and
    its enclosing graphs define; `records` gets the body passes that changed something."""
    nodes, changed = [], False
    for node in graph.nodes:
        new_attrs = {}
        for attr, v in node.attrs.items():
            bodies = v if isinstance(v, list) else [v]
            if not bodies or not all(isinstance(g, Graph) for g in bodies):
                continue
            done = [_optimize_body(g, passes, ctx, scope, constants, records, f"{where}{node.name}.{attr}"
                                   + (f"[{k}]" if isinstance(v, list) else "")) for k, g in enumerate(bodies)]
            if any(d is not g for d, g in zip(done, bodies)):
                # what a body reads from outside, again: the outer constants it captured are its
                # own now and its dead code is gone (kept as loaded, a branch was fed every weight
                # it had captured at each run: openWakeWord's hey-jarvis, ten)
                done = [d if d is g else replace(d, outer_names=d.reads_from_outside()) for d, g in zip(done, bodies)]
                new_attrs[attr] = done if isinstance(v, list) else done[0]
        if new_attrs:
            node = replace(node, attrs={**node.attrs, **new_attrs})
            reads = dict.fromkeys(n for g in node.subgraphs() for n in g.outer_names)
            node, changed = replace(node, implicit_inputs=list(reads)), True
        nodes.append(node)
    return replace(graph, nodes=nodes) if changed else graph


def _optimize_body(body: Graph, passes, ctx: PassContext, scope: Inference, constants: dict, records: list,
                   where: str) -> Graph:
    def typed(g: Graph) -> Inference:
        """The body's types and known values, with those of the scope it reads from."""
        own = infer_body(g, {}, scope.types, scope.values)
        # (the body's own over the scope's, not a copy of both: a copy per body was quadratic
        # in a model of many Ifs)
        return Inference(scoped(dict(own.types), scope.types), scoped(dict(own.values), scope.values),
                         own.problems, own.seen)

    body = _capture(body, constants, where)
    # the lists passes fill for explain are the session's; types and values are the body's
    body_ctx = PassContext(ctx.options, ctx.providers, expansions=ctx.expansions, folded=ctx.folded,
                           expansion_failures=ctx.expansion_failures, body=True)
    body, ran = run_pipeline(body, passes, body_ctx, typed)
    records += [replace(r, name=f"{r.name} in {where}") for r in ran if r.changes]
    if has_bodies(body):
        body = optimize_bodies(body, passes, ctx, typed(body), {**constants, **body.constants()}, records,
                               f"{where}/")
    return body


def _capture(body: Graph, constants: dict, where: str) -> Graph:
    """The body with the outer constants its own nodes read as initializers of its own
    (`name@where`); nested bodies keep their outer reads and capture them in turn."""
    defined = {v.name for v in body.inputs} | set(body.initializers) | {o for n in body.nodes for o in n.outputs}
    alias = {i: f"{i}@{where}" for n in body.nodes for i in n.inputs
             if i and i in constants and i not in defined}
    if not alias:
        return body
    nodes = [replace(n, inputs=[alias.get(i, i) for i in n.inputs]) if any(i in alias for i in n.inputs) else n
             for n in body.nodes]
    return replace(body, nodes=nodes,
                   initializers={**body.initializers, **{a: constants[i] for i, a in alias.items()}})
