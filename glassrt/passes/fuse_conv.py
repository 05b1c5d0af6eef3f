"""Fuse what follows a Conv (or an inference BatchNormalization) into one glassrt op.

  * Conv → Add (a residual of the same shape) [→ Relu]: one glassrt::FusedConv with the
    residual as its fourth input (ResNet's blocks end this way);
  * Conv → Relu / LeakyRelu / Clip (constant bounds) / Sigmoid: one glassrt::FusedConv
    that applies the activation on the conv's output as it is written; the same after an
    inference BatchNormalization that could not be folded (glassrt::FusedBatchNormalization).

Each rewrite keeps the output names, fires only when the intermediate value has no other
reader and is not a graph output, and names the nodes it replaced in the fused node's
`origin`. The fused ops are contracts with decompositions (ops/fused.py), so any provider
can run them and `glassrt check` verifies their kernels against the decompositions.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Node
from ._rewrite import Readers, activation_of, origin, producers

ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid")


def fuse_conv_residual(graph, ctx):
    changes = []
    nodes = _fuse_residual(graph, list(graph.nodes), ctx.types, changes)
    return (replace(graph, nodes=nodes), changes) if changes else (graph, [])


def fuse_conv_activation(graph, ctx=None):
    changes = []
    nodes = _fuse_activation(graph, list(graph.nodes), graph.constants(), changes)
    return (replace(graph, nodes=nodes), changes) if changes else (graph, [])


def _fuse_residual(graph, nodes, types, log):
    """Conv → Add/Sum(conv, z) [→ Relu]: FusedConv(X, W, B, z) placed where the Add was
    (z is computed by then). Only when z has exactly the conv output's shape: the fused
    kernels add it element by element, without broadcasting."""
    readers = Readers(graph, nodes)
    producer = producers(nodes)
    replaced, dropped = {}, set()
    for add in nodes:
        if add.op_type not in ("Add", "Sum") or add.domain or len(add.inputs) != 2 or "broadcast" in add.attrs:
            continue
        for k in (0, 1):
            conv = producer.get(add.inputs[k])
            z = add.inputs[1 - k]
            if conv is None or conv.op_type != "Conv" or conv.domain or conv.name in dropped or z == add.inputs[k] \
                    or readers.single(add.inputs[k]) is not add:
                continue
            tc, tz = types.get(add.inputs[k]), types.get(z)
            if tc is None or tz is None or getattr(tc, "shape", None) is None or tc != tz:
                continue
            out, act, what = add.outputs[0], "", f"{add.op_type} '{add.name}'"
            relu = readers.single(out)
            if relu is not None and relu.op_type == "Relu" and not relu.domain:
                out, act, what = relu.outputs[0], "Relu", what + f" and Relu '{relu.name}'"
                dropped.add(relu.name)
            inputs = list(conv.inputs) + [""] * (3 - len(conv.inputs)) + [z]
            replaced[add.name] = Node("FusedConv", "glassrt", inputs, [out],
                                      {**conv.attrs, "activation": act, "activation_params": []},
                                      conv.name, 1, list(conv.implicit_inputs),
                                      origin=origin(conv, f"{what} fused in (residual)"))
            dropped.add(conv.name)
            log.append(f"fuse {what} into Conv '{conv.name}' (residual)")
            break
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]



def _fuse_activation(graph, nodes, consts, log):
    readers = Readers(graph, nodes)
    producer = producers(nodes)
    fused, dropped = {}, set()
    for n in nodes:
        if n.op_type not in ACTIVATIONS or n.domain or len(n.outputs) != 1:
            continue
        conv = producer.get(n.inputs[0])
        if conv is None or conv.domain or conv.name in fused or readers.single(n.inputs[0]) is not n:
            continue
        if conv.op_type == "BatchNormalization":
            if int(conv.attrs.get("training_mode", 0)) or not int(conv.attrs.get("spatial", 1)) \
                    or len([o for o in conv.outputs if o]) != 1:
                continue
        elif conv.op_type != "Conv":
            continue
        found = activation_of(n, consts)
        if found is None:
            continue
        params = found[1]
        kind = "FusedConv" if conv.op_type == "Conv" else "FusedBatchNormalization"
        attrs = dict(conv.attrs) if kind == "FusedConv" else {"epsilon": conv.attrs.get("epsilon", 1e-5)}
        fused[conv.name] = Node(kind, "glassrt", list(conv.inputs[:5]), list(n.outputs[:1]),
                                {**attrs, "activation": n.op_type, "activation_params": params},
                                conv.name, 1, list(conv.implicit_inputs),
                                origin=origin(conv, f"{n.op_type} '{n.name}' fused in"))
        dropped.add(n.name)
        log.append(f"fuse {n.op_type} '{n.name}' into {conv.op_type} '{conv.name}'")
    return [fused.get(n.name, n) for n in nodes if n.name not in dropped]
