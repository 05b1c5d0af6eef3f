"""Fusions on a graph whose constants are known (after constant folding):

  * Conv → BatchNormalization (inference): the normalization is folded into the conv's
    weights and bias, so the BatchNormalization node disappears;
  * Conv / BatchNormalization → Mul or Add by a per-channel constant (the "scale" layers
    old exporters write after a BatchNormalization): folded into the weights and bias;
  * Conv → Add (a residual of the same shape) [→ Relu]: one glassrt::FusedConv with the
    residual as its fourth input (ResNet's blocks end this way);
  * Conv → Relu / LeakyRelu / Clip (constant bounds) / Sigmoid: one glassrt::FusedConv
    node that applies the activation in place on the conv's output; the same after an
    inference BatchNormalization that could not be folded (glassrt::FusedBatchNormalization).

Each rewrite keeps the output names, only fires when the intermediate value has no other
reader and is not a graph output, and is logged; the fused node's `origin` names the
nodes it replaced.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node

ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid")


def fuse(graph):
    """(new graph, [log lines]); the input graph is left untouched."""
    consts = graph.constants()
    new_inits = dict(graph.initializers)
    log = []
    nodes = list(graph.nodes)
    while True:  # Conv → Mul → Add chains fold one link at a time
        before = len(log)
        nodes = _fold_affine(graph, nodes, {**consts, **new_inits}, new_inits, log)
        if len(log) == before:
            break
    nodes = _fold_batchnorm(graph, nodes, {**consts, **new_inits}, new_inits, log)
    nodes = _fuse_residual(graph, nodes, log)
    nodes = _fuse_activation(graph, nodes, {**consts, **new_inits}, log)
    if not log:
        return graph, []
    used = {i for n in nodes for i in [*n.inputs, *n.implicit_inputs]} | set(graph.output_names()) | \
        {v.name for v in graph.inputs}
    new_inits = {k: v for k, v in new_inits.items() if k in used}
    return replace(graph, nodes=nodes, initializers=new_inits), log


def _single_reader(graph, nodes, value):
    if value in graph.output_names():
        return None
    readers = [n for n in nodes if value in n.inputs or value in n.implicit_inputs]
    return readers[0] if len(readers) == 1 else None


def _per_channel(c, rank, channels):
    """c as a vector over axis 1 of a rank-`rank` tensor, or None if it broadcasts otherwise."""
    if c.ndim == 0 or c.size == 1:
        return np.full(channels, c.reshape(-1)[0], dtype=np.float64)
    shape = (1,) * (rank - c.ndim) + c.shape
    if len(shape) != rank or shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return c.reshape(-1).astype(np.float64)


def _fold_affine(graph, nodes, consts, inits, log):
    """One round of folding Mul/Add by a per-channel constant into the Conv or
    BatchNormalization before it."""
    producer = {o: n for n in nodes for o in n.outputs if o}
    for n in nodes:
        if n.op_type not in ("Mul", "Add") or n.domain or len(n.inputs) != 2 or "broadcast" in n.attrs:
            continue  # (opsets 1-6 broadcast differently: left alone)
        for k in (0, 1):
            x, c_name = n.inputs[k], n.inputs[1 - k]
            prev = producer.get(x)
            if prev is None or c_name not in consts or prev.domain or _single_reader(graph, nodes, x) is not n:
                continue
            if prev.op_type == "Conv" and prev.inputs[1] in consts and (len(prev.inputs) < 3 or not prev.inputs[2]
                                                                        or prev.inputs[2] in consts):
                w = consts[prev.inputs[1]]
                if w.dtype.kind != "f" or consts[c_name].dtype != w.dtype:
                    continue
                c = _per_channel(consts[c_name], w.ndim, w.shape[0])
                if c is None:
                    continue
                b = consts[prev.inputs[2]].astype(np.float64) if len(prev.inputs) > 2 and prev.inputs[2] \
                    else np.zeros(w.shape[0])
                tag = f"{prev.name}/{n.op_type.lower()}_{n.name}"
                if n.op_type == "Mul":
                    inits[tag + "/W"] = (w.astype(np.float64) * c.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
                    inits[tag + "/B"] = (b * c).astype(w.dtype)
                    new_inputs = [prev.inputs[0], tag + "/W", tag + "/B"]
                else:
                    inits[tag + "/B"] = (b + c).astype(w.dtype)
                    new_inputs = [prev.inputs[0], prev.inputs[1], tag + "/B"]
            elif (prev.op_type == "BatchNormalization" and not int(prev.attrs.get("training_mode", 0))
                  and int(prev.attrs.get("spatial", 1)) and len([o for o in prev.outputs if o]) == 1
                  and all(i in consts for i in prev.inputs[1:5])):
                scale, bias = consts[prev.inputs[1]], consts[prev.inputs[2]]
                if consts[c_name].dtype != scale.dtype:
                    continue
                c = _per_channel(consts[c_name], 4, scale.shape[0]) if scale.ndim == 1 else None
                if c is None:
                    continue
                tag = f"{prev.name}/{n.op_type.lower()}_{n.name}"
                if n.op_type == "Mul":
                    inits[tag + "/scale"] = (scale * c).astype(scale.dtype)
                    inits[tag + "/bias"] = (bias * c).astype(bias.dtype)
                    new_inputs = [prev.inputs[0], tag + "/scale", tag + "/bias", *prev.inputs[3:]]
                else:
                    inits[tag + "/bias"] = (bias + c).astype(bias.dtype)
                    new_inputs = [prev.inputs[0], prev.inputs[1], tag + "/bias", *prev.inputs[3:]]
            else:
                continue
            merged = replace(prev, inputs=new_inputs, outputs=list(n.outputs),
                             origin=_origin(prev, f"{n.op_type} '{n.name}' folded in"))
            log.append(f"fold {n.op_type} '{n.name}' by a constant into {prev.op_type} '{prev.name}'")
            return [merged if m is prev else m for m in nodes if m is not n]
    return nodes


def _fold_batchnorm(graph, nodes, consts, inits, log):
    producer = {o: n for n in nodes for o in n.outputs if o}
    out, dropped = [], set()
    replaced = {}
    for n in nodes:
        if n.op_type != "BatchNormalization" or n.domain or int(n.attrs.get("training_mode", 0)) \
                or not int(n.attrs.get("spatial", 1)) or len([o for o in n.outputs if o]) != 1 or not n.outputs[0]:
            continue
        conv = producer.get(n.inputs[0])
        if conv is None or conv.op_type != "Conv" or conv.domain or _single_reader(graph, nodes, n.inputs[0]) is not n:
            continue
        names = n.inputs[1:5]
        if len(names) != 4 or not all(x in consts for x in names) or conv.inputs[1] not in consts:
            continue
        if len(conv.inputs) > 2 and conv.inputs[2] and conv.inputs[2] not in consts:
            continue
        w = consts[conv.inputs[1]]
        if w.dtype.kind != "f":
            continue
        scale, bias, mean, var = (consts[x].astype(np.float64).reshape(-1) for x in names)
        if scale.shape[0] != w.shape[0]:
            continue
        factor = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
        b = consts[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
        w_name, b_name = f"{conv.name}/W_bn_folded", f"{conv.name}/B_bn_folded"
        inits[w_name] = (w.astype(np.float64) * factor.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        inits[b_name] = ((b - mean) * factor + bias).astype(w.dtype)
        replaced[conv.name] = replace(conv, inputs=[conv.inputs[0], w_name, b_name], outputs=list(n.outputs),
                                      origin=_origin(conv, f"BatchNormalization '{n.name}' folded in"))
        dropped.add(n.name)
        log.append(f"fold BatchNormalization '{n.name}' into Conv '{conv.name}'")
    for n in nodes:
        if n.name in dropped:
            continue
        out.append(replaced.get(n.name, n))
    return out


def _fuse_residual(graph, nodes, log):
    """Conv → Add/Sum(conv, z) [→ Relu]: FusedConv(X, W, B, z) placed where the Add was
    (z is computed by then). Only when z has exactly the conv output's shape: the fused
    kernels add it element by element, without broadcasting."""
    producer = {o: n for n in nodes for o in n.outputs if o}
    replaced, dropped = {}, set()
    for add in nodes:
        if add.op_type not in ("Add", "Sum") or add.domain or len(add.inputs) != 2 or "broadcast" in add.attrs:
            continue
        for k in (0, 1):
            conv = producer.get(add.inputs[k])
            z = add.inputs[1 - k]
            if conv is None or conv.op_type != "Conv" or conv.domain or conv.name in dropped or z == add.inputs[k] \
                    or _single_reader(graph, nodes, add.inputs[k]) is not add:
                continue
            tc, tz = graph.types.get(add.inputs[k]), graph.types.get(z)
            if tc is None or tz is None or getattr(tc, "shape", None) is None or tc != tz:
                continue
            out, act, what = add.outputs[0], "", f"{add.op_type} '{add.name}'"
            relu = _single_reader(graph, nodes, out)
            if relu is not None and relu.op_type == "Relu" and not relu.domain:
                out, act, what = relu.outputs[0], "Relu", what + f" and Relu '{relu.name}'"
                dropped.add(relu.name)
            inputs = list(conv.inputs) + [""] * (3 - len(conv.inputs)) + [z]
            replaced[add.name] = Node("FusedConv", "glassrt", inputs, [out],
                                      {**conv.attrs, "activation": act, "activation_params": []},
                                      conv.name, 1, list(conv.implicit_inputs),
                                      origin=_origin(conv, f"{what} fused in (residual)"))
            dropped.add(conv.name)
            log.append(f"fuse {what} into Conv '{conv.name}' (residual)")
            break
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]


def _fuse_activation(graph, nodes, consts, log):
    producer = {o: n for n in nodes for o in n.outputs if o}
    fused, dropped = {}, set()
    for n in nodes:
        if n.op_type not in ACTIVATIONS or n.domain or len(n.outputs) != 1:
            continue
        conv = producer.get(n.inputs[0])
        if conv is None or conv.domain or conv.name in fused or _single_reader(graph, nodes, n.inputs[0]) is not n:
            continue
        if conv.op_type == "BatchNormalization":
            if int(conv.attrs.get("training_mode", 0)) or not int(conv.attrs.get("spatial", 1)) \
                    or len([o for o in conv.outputs if o]) != 1:
                continue
        elif conv.op_type != "Conv":
            continue
        params = []
        if n.op_type == "LeakyRelu":
            params = [float(n.attrs.get("alpha", 0.01))]
        elif n.op_type == "Clip":
            if n.opset < 11:
                params = [float(n.attrs.get("min", -3.4e38)), float(n.attrs.get("max", 3.4e38))]
            else:
                bounds = [consts.get(x) if x else None for x in (n.inputs[1:3] + ["", ""])[:2]]
                if any(x and b is None for x, b in zip((n.inputs[1:3] + ["", ""])[:2], bounds)):
                    continue  # bounds known only at run time
                params = [float(bounds[0]) if bounds[0] is not None else -np.inf,
                          float(bounds[1]) if bounds[1] is not None else np.inf]
        kind = "FusedConv" if conv.op_type == "Conv" else "FusedBatchNormalization"
        attrs = dict(conv.attrs) if kind == "FusedConv" else {"epsilon": conv.attrs.get("epsilon", 1e-5)}
        fused[conv.name] = Node(kind, "glassrt", list(conv.inputs[:5]), list(n.outputs[:1]),
                                {**attrs, "activation": n.op_type, "activation_params": params},
                                conv.name, 1, list(conv.implicit_inputs),
                                origin=_origin(conv, f"{n.op_type} '{n.name}' fused in"))
        dropped.add(n.name)
        log.append(f"fuse {n.op_type} '{n.name}' into {conv.op_type} '{conv.name}'")
    return [fused.get(n.name, n) for n in nodes if n.name not in dropped]


def _origin(node, what):
    return f"{node.origin + '; ' if node.origin else ''}{what}"
