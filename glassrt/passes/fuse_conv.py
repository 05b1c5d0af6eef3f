"""Fuse what follows a Conv (or an inference BatchNormalization) into one glassrt op.

  * Conv → Add (a residual of the same shape) [→ Relu]: one glassrt::FusedConv with the
    residual as its fourth input (ResNet's blocks end this way);
  * Conv → Relu / LeakyRelu / Clip (constant bounds) / Sigmoid / HardSigmoid / HardSwish:
    one glassrt::FusedConv that applies the activation on the conv's output as it is
    written; the same after an inference BatchNormalization that could not be folded
    (glassrt::FusedBatchNormalization);
  * Conv → Mul(y, Sigmoid(y)) (SiLU / Swish: ONNX has no op for it, so exporters write these
    two; YOLOv5/v8, EfficientNet) and Conv → Mul(y, HardSigmoid(y)) (HardSwish as older
    exporters write it): the same, activation Swish or HardSwish (its alpha and beta).

Each rewrite keeps the output names, fires only when the intermediate value has no other
reader and is not a graph output, and names the nodes it replaced in the fused node's
`origin`. The fused ops are contracts with decompositions (ops/fused.py), so any provider
can run them and `glassrt check` verifies their kernels against the decompositions.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Node
from ._rewrite import Readers, activation_of, origin, producers

ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish")
# gates g in y·g(y), a Mul reading the conv output and the gate over it -> the activation
GATES = {"Sigmoid": "Swish", "HardSigmoid": "HardSwish"}


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
        found = _single_activation(n, readers, producer, consts) or _gated_activation(n, readers, producer, consts)
        if found is None:
            continue
        conv, act, params, replaced = found
        if conv.name in fused or any(r.name in dropped for r in replaced) or not _fusable_producer(conv):
            continue
        kind = "FusedConv" if conv.op_type == "Conv" else "FusedBatchNormalization"
        attrs = dict(conv.attrs) if kind == "FusedConv" else {"epsilon": conv.attrs.get("epsilon", 1e-5)}
        what = " and ".join(f"{r.op_type} '{r.name}'" for r in replaced)
        named = f" ({act})" if len(replaced) > 1 else ""  # the activation a gated pair makes
        fused[conv.name] = Node(kind, "glassrt", list(conv.inputs[:5]), list(n.outputs[:1]),
                                {**attrs, "activation": act, "activation_params": params},
                                conv.name, 1, list(conv.implicit_inputs),
                                origin=origin(conv, f"{what} fused in{named}"))
        dropped.update(r.name for r in replaced)
        log.append(f"fuse {what} into {conv.op_type} '{conv.name}'{named}")
    return [fused.get(n.name, n) for n in nodes if n.name not in dropped]


def _fusable_producer(conv) -> bool:
    """A Conv, or an inference BatchNormalization with its one output."""
    if conv.domain:
        return False
    if conv.op_type == "BatchNormalization":
        return not int(conv.attrs.get("training_mode", 0)) and bool(int(conv.attrs.get("spatial", 1))) \
            and len([o for o in conv.outputs if o]) == 1
    return conv.op_type == "Conv"


def _single_activation(n, readers, producer, consts):
    """(conv, activation, params, [n]) for an activation node n that alone reads a conv's output."""
    if n.op_type not in ACTIVATIONS or n.domain or len(n.outputs) != 1 or not n.inputs:
        return None
    conv = producer.get(n.inputs[0])
    found = activation_of(n, consts)
    if conv is None or found is None or readers.single(n.inputs[0]) is not n:
        return None
    return conv, found[0], found[1], [n]


def _gated_activation(mul, readers, producer, consts):
    """(conv, Swish | HardSwish, params, [gate, mul]) for mul = Mul(y, gate(y)) where the conv's
    output y is read by the gate and the Mul alone and the gate's output by the Mul alone."""
    if mul.op_type != "Mul" or mul.domain or len(mul.inputs) != 2 or len(mul.outputs) != 1:
        return None
    for k in (0, 1):
        y, g = mul.inputs[k], mul.inputs[1 - k]
        gate = producer.get(g)
        if gate is None or gate.op_type not in GATES or gate.domain or not gate.inputs or gate.inputs[0] != y \
                or readers.single(g) is not mul or y in readers.outputs \
                or {r.name for r in readers.by_value.get(y, [])} != {gate.name, mul.name}:
            continue
        conv = producer.get(y)
        found = activation_of(gate, consts)
        if conv is None or found is None:
            continue
        return conv, GATES[gate.op_type], found[1], [gate, mul]
    return None
