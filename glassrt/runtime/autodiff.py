"""Reverse-mode gradients through a model: the vector-Jacobian product of one output.

The forward pass runs a plan that keeps every intermediate value (no arena reuse); the
backward pass walks its steps in reverse and applies each op's backward formula
(ops/backward/). Initializers named in `wrt` are fed as inputs for the occasion, so
constant folding does not bake them into constants the gradient cannot reach.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import GlassrtError, describe_node
from ..ops.backward import GradContext
from ..ops.registry import get_contract, load_backward
from .plan import compile_plan, run_plan
from ..ir import type_of_value


def gradients(sess, feeds: dict, output: str, wrt: list, grad_output=None) -> list:
    load_backward()  # (the formulas are imported when first needed: ops/registry.py)
    lowered = sess.lowered_placement()
    graph = lowered.graph
    if output not in graph.output_names():
        raise GlassrtError(f"'{output}' is not a graph output; outputs are {graph.output_names()}")
    inputs = sess._check_feeds(feeds)
    known = set(graph.input_names()) | set(graph.initializers)
    missing = [w for w in wrt if w not in known]
    if missing:
        raise GlassrtError(f"cannot differentiate with respect to {missing}: only graph inputs and "
                           f"initializers can be named in wrt")
    all_feeds = dict(inputs)
    for w in wrt:
        if w not in all_feeds:
            all_feeds[w] = graph.initializers[w]
    options = replace(sess.options, constant_folding=False)
    types = {n: type_of_value(v) for n, v in all_feeds.items()}
    runner = sess.runner
    plan = compile_plan(lowered, types, options, runner.make_runner, pool=None, retain=True)
    outs, env = run_plan(plan, all_feeds, keep_env=True)
    y = outs[graph.output_names().index(output)]
    if grad_output is None:
        grad_output = np.ones_like(y)
    grad_output = np.asarray(grad_output, dtype=y.dtype)
    if grad_output.shape != y.shape:
        raise GlassrtError(f"grad_output has shape {list(grad_output.shape)}, output '{output}' has {list(y.shape)}")

    # Values that depend on something in wrt: only their producers need a backward.
    needs = set(wrt)
    for st in plan.steps:
        if any(i in needs for i in [*st.node.inputs, *st.node.implicit_inputs]):
            needs.update(o for o in st.node.outputs if o)
    grads = {output: grad_output}
    for st in reversed(plan.steps):
        node = st.node
        gys = [grads.get(o) if o else None for o in node.outputs]
        if all(g is None for g in gys) or not any(i in needs for i in node.inputs if i):
            continue
        contract = get_contract(node.domain, node.op_type, node.opset)
        if contract is None or contract.backward is None:
            raise GlassrtError(f"{describe_node(node)} has no backward formula, and the gradient of "
                               f"'{output}' with respect to {wrt} flows through it")
        ctx = GradContext(node, contract.attrs_with_defaults(node), [env.get(i) if i else None for i in node.inputs],
                          [env.get(o) if o else None for o in node.outputs], contract.since_version)
        gxs = contract.backward(ctx, *gys)
        for name, g in zip(node.inputs, gxs):
            if not name or g is None or name not in needs:
                continue
            g = np.asarray(g)
            x = env.get(name)
            if isinstance(x, np.ndarray) and g.shape != x.shape:
                raise GlassrtError(f"backward of {describe_node(node)} gave input '{name}' a gradient of shape "
                                   f"{list(g.shape)}; the input has shape {list(x.shape)}")
            grads[name] = grads[name] + g if name in grads else g
    out = []
    for w in wrt:
        v = all_feeds[w]
        out.append(grads[w].astype(v.dtype, copy=False) if w in grads else np.zeros_like(v))
    return out
