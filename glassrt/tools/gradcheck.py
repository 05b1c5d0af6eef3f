"""Finite-difference checks of gradients: the oracle for every backward formula.

`gradcheck` compares `session.gradients` (the analytic vector-Jacobian product) with
central differences of sum(output * grad_output), in float64, on a sample of elements.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import dtypes


def single_node_model(op_type, inputs: list, attrs: dict | None = None, *, domain="", opset=None,
                      n_outputs=1, input_names=None) -> onnx.ModelProto:
    """A model of one node whose inputs are graph inputs (None entries: absent optional inputs)."""
    names = input_names or [f"in{i}" for i in range(len(inputs))]
    node_inputs = [n if x is not None else "" for n, x in zip(names, inputs)]
    while node_inputs and not node_inputs[-1]:
        node_inputs.pop()
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, node_inputs, outs, domain=domain, name="node", **(attrs or {}))
    vis = [helper.make_tensor_value_info(n, dtypes.elem_type(x.dtype), list(x.shape))
           for n, x in zip(names, inputs) if x is not None]
    vos = [onnx.ValueInfoProto(name=o) for o in outs]
    graph = helper.make_graph([node], "single", vis, vos)
    imports = [helper.make_opsetid("", opset or onnx.defs.onnx_opset_version())]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports)


def gradcheck(sess, feeds: dict, output: str, wrt: list, grad_output=None, *, eps=1e-6, max_elems=48,
              rtol=1e-4, atol=1e-6, seed=0):
    """(ok, worst relative error, message). Analytic gradients from sess.gradients."""
    rng = np.random.default_rng(seed)
    names = [o.name for o in sess.get_outputs()]
    k = names.index(output)
    y = sess.run(None, feeds)[k]
    if grad_output is None:
        grad_output = rng.standard_normal(y.shape).astype(y.dtype)
    analytic = sess.gradients(feeds, output, wrt, grad_output)
    init = sess.lowered_placement().graph.initializers
    worst, msg = 0.0, ""
    for name, g in zip(wrt, analytic):
        base = feeds[name] if name in feeds else init[name]
        flat = np.arange(base.size)
        picks = flat if base.size <= max_elems else rng.choice(flat, max_elems, replace=False)
        for idx in picks:
            def f(delta):
                x = base.copy()
                x.reshape(-1)[idx] += delta
                if name in feeds:
                    out = sess.run(None, {**feeds, name: x})[k]
                else:
                    out = _run_with_initializer(sess, feeds, name, x)[k]
                return float(np.sum(out.astype(np.float64) * grad_output))
            numeric = (f(eps) - f(-eps)) / (2 * eps)
            a = float(g.reshape(-1)[idx])
            err = abs(a - numeric)
            tol = atol + rtol * max(abs(a), abs(numeric))
            rel = err / max(abs(numeric), abs(a), 1e-12)
            if err > tol and rel > worst:
                worst = rel
                msg = (f"d/d{name}[{np.unravel_index(idx, base.shape)}]: backward gives {a:.6g}, "
                       f"central differences give {numeric:.6g}")
    return worst == 0.0, worst, msg


def _run_with_initializer(sess, feeds, name, value):
    from ..runtime.plan import compile_plan, run_plan
    from ..ir import type_of_value
    from dataclasses import replace

    all_feeds = {**sess._check_feeds(feeds), name: value}
    plan = compile_plan(sess.lowered_placement(), {n: type_of_value(v) for n, v in all_feeds.items()},
                        replace(sess.options, constant_folding=False), sess.runner.make_runner)
    return run_plan(plan, all_feeds)


def to_float64(arrays):
    return [x.astype(np.float64) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x for x in arrays]


__all__ = ["single_node_model", "gradcheck", "to_float64", "numpy_helper"]


def model_to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy computing in float64: float initializers, declared types, Cast targets and
    constant attributes widened (finite differences need the precision)."""
    from onnx import TensorProto

    F = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    m = onnx.ModelProto()
    m.CopyFrom(model)

    def widen_tensor(t):
        if t.data_type in F:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    def widen_graph(g):
        for t in g.initializer:
            widen_tensor(t)
        for vi in [*g.input, *g.value_info]:
            if vi.type.tensor_type.elem_type in F:
                vi.type.tensor_type.elem_type = TensorProto.DOUBLE
        for vi in g.output:  # (left to inference: not every float output follows the inputs, e.g.
            if vi.type.tensor_type.elem_type in F:  # LayerNormalization's Mean is its stash_type)
                vi.type.tensor_type.elem_type = TensorProto.UNDEFINED
        for n in g.node:
            for a in n.attribute:
                if a.name == "to" and a.i in F:
                    a.i = TensorProto.DOUBLE
                if a.type == onnx.AttributeProto.TENSOR:
                    widen_tensor(a.t)
                if a.type == onnx.AttributeProto.GRAPH:
                    widen_graph(a.g)

    widen_graph(m.graph)
    return m
