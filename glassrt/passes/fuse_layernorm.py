"""Layer normalization written out in elementwise nodes (as PyTorch exports LayerNorm below
opset 17, and paddle2onnx): one ONNX LayerNormalization node.

    mean = ReduceMean(x, axes=[-1]);  d = x - mean;  var = ReduceMean(d ** 2 | d * d)
    y = d / Sqrt(var + eps)  [* gamma]  [+ beta]

Nine nodes, each a pass over the tensor and a step of the plan: openWakeWord's hey-jarvis
head runs four (two in its verifier branch), where the ReduceMeans alone cost more than
onnxruntime's whole model; rapidocr's recognizer has five. The fused node computes the same formula (mean, then the variance of x - mean) in
one kernel; results agree to float32 rounding (the sums in another order), as
onnxruntime's own LayerNormFusion does.

It fires only on the last axis, with a scalar float constant epsilon, gamma and beta
constants one per element of the last dim (or absent), every intermediate read by the
next node alone and none of them a graph output.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node, TensorType
from ._rewrite import FUSED_FLOATS, Readers, known_shape, origin


def fuse_layernorm(graph, ctx):
    changes, scales = [], {}
    nodes = _fuse(graph, list(graph.nodes), graph.constants(), ctx.types, changes, scales)
    if not changes:
        return graph, []
    for name, ones in scales.items():
        ctx.types[name] = TensorType(ones.dtype, ones.shape)
    return replace(graph, nodes=nodes, initializers={**graph.initializers, **scales}), changes


def _fuse(graph, nodes, consts, types, log, scales):
    readers = Readers(graph, nodes)

    def op(n, name, arity=2):
        return n is not None and n.op_type == name and not n.domain and len(n.inputs) == arity \
            and "broadcast" not in n.attrs

    def last_axis_mean(n, x):
        """n is ReduceMean(x) over the last axis, dims kept."""
        if n is None or n.op_type != "ReduceMean" or n.domain or n.inputs[0] != x \
                or not int(n.attrs.get("keepdims", 1)):
            return False
        if len(n.inputs) > 1 and n.inputs[1]:  # opset 18: axes as an input
            axes = consts.get(n.inputs[1])
            axes = None if axes is None else [int(a) for a in axes.reshape(-1)]
        else:
            axes = n.attrs.get("axes")
        shape = known_shape(types, x)
        return axes is not None and len(axes) == 1 and shape is not None \
            and int(axes[0]) in (-1, len(shape) - 1)

    def scalar(name):
        c = consts.get(name)
        return float(c.reshape(-1)[0]) if c is not None and c.size == 1 and c.dtype.kind == "f" else None

    def per_channel(name, width):
        c = consts.get(name)
        return c if c is not None and c.dtype.kind == "f" and c.size == width and c.shape[-1:] == (width,) else None

    replaced, dropped = {}, set()
    for mean in nodes:
        if mean.name in dropped or mean.op_type != "ReduceMean" or mean.domain:
            continue
        x = mean.inputs[0]
        t = types.get(x)
        if getattr(t, "dtype", None) not in FUSED_FLOATS or not last_axis_mean(mean, x):
            continue
        sub = readers.single(mean.outputs[0])
        if not op(sub, "Sub") or sub.inputs != [x, mean.outputs[0]]:
            continue
        d = sub.outputs[0]
        d_readers = readers.by_value.get(d, [])
        if d in readers.outputs or len(d_readers) not in (2, 3):
            continue
        square = next((n for n in d_readers if op(n, "Pow") and n.inputs[0] == d and scalar(n.inputs[1]) == 2.0
                       or op(n, "Mul") and n.inputs == [d, d]), None)
        var = readers.single(square.outputs[0]) if square is not None else None
        if var is None or not last_axis_mean(var, square.outputs[0]):
            continue
        add = readers.single(var.outputs[0])
        eps_name = (add.inputs[1] if add.inputs[0] == var.outputs[0] else add.inputs[0]) if op(add, "Add") else None
        eps = scalar(eps_name) if eps_name else None
        sqrt = readers.single(add.outputs[0]) if eps is not None else None
        if not op(sqrt, "Sqrt", 1):
            continue
        div = readers.single(sqrt.outputs[0])
        if not op(div, "Div") or div.inputs != [d, sqrt.outputs[0]] \
                or {n.name for n in d_readers} != {square.name, div.name}:
            continue
        chain, last, gamma, beta = [mean, sub, square, var, add, sqrt, div], div, "", ""
        width = known_shape(types, x)[-1]
        if isinstance(width, int):
            mul = readers.single(div.outputs[0])
            g = _other(mul, div.outputs[0]) if op(mul, "Mul") else None
            if g is not None and per_channel(g, width) is not None:
                chain, last, gamma = chain + [mul], mul, g
                bias = readers.single(mul.outputs[0])
                b = _other(bias, mul.outputs[0]) if op(bias, "Add") else None
                if b is not None and per_channel(b, width) is not None:
                    chain, last, beta = chain + [bias], bias, b
        if any(n.name in dropped or n.name in replaced for n in chain):
            continue
        if not gamma:  # LayerNormalization needs a scale: ones, of the last dim
            if not isinstance(width, int):
                continue
            gamma = f"{last.name}/layernorm_scale"
            scales[gamma] = np.ones(width, t.dtype)
        replaced[last.name] = Node(
            "LayerNormalization", "", [x, gamma] + ([beta] if beta else []), list(last.outputs),
            {"axis": -1, "epsilon": float(eps)}, last.name, 17,
            origin=origin(last, "layer normalization written out as " +
                          ", ".join(f"{n.op_type} '{n.name}'" for n in chain)))
        dropped.update(n.name for n in chain if n is not last)
        log.append(f"fuse {len(chain)} nodes into LayerNormalization '{last.name}' (epsilon {eps:g})")
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]


def _other(node, value):
    a, b = node.inputs
    return b if a == value else a if b == value else None
