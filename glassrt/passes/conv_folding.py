"""Fold per-channel affine ops into the weights of the Conv before them.

  * Conv → BatchNormalization (inference): the normalization becomes the conv's weights
    and bias, and the BatchNormalization node disappears;
  * Conv / BatchNormalization → Mul or Add by a per-channel constant (the "scale" layers
    old exporters write after a BatchNormalization): folded into weights and bias.

A rewrite fires only when the intermediate value has no other reader and is not a graph
output, and only when every parameter has the shape it must have (one value per output
channel): a malformed model keeps its nodes, and running them reports the error.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._rewrite import Readers, finish, origin, per_channel, producers


def fold_affine_into_conv(graph, ctx=None):
    """Conv/BatchNormalization → Mul/Add by a per-channel constant. One pass in topological
    order: a folded node takes the place of its producer and becomes the producer of the
    Mul/Add's output, so a Conv → Mul → Add chain folds link by link in the same pass (a
    rescan per fold was quadratic: 1.5 s of densenet121's session creation)."""
    consts = {**graph.constants(), **graph.initializers}
    inits = dict(graph.initializers)
    nodes, changes, removed = list(graph.nodes), [], set()
    readers = Readers(graph, nodes)
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs if o}
    for i, n in enumerate(graph.nodes):
        folded = _fold_affine(n, nodes, producer, readers, consts, inits)
        if folded is None:
            continue
        j, merged, change = folded
        nodes[j] = merged
        removed.add(i)
        producer.update((o, j) for o in merged.outputs if o)
        changes.append(change)
    return finish(graph, [n for i, n in enumerate(nodes) if i not in removed], inits, changes)


def _conv_params(prev, consts):
    """(weights, bias as float64) of a Conv whose weights and bias are constants, else None."""
    if prev.op_type != "Conv" or len(prev.inputs) < 2 or prev.inputs[1] not in consts:
        return None
    w = consts[prev.inputs[1]]
    if w.dtype.kind != "f" or w.ndim < 3:
        return None
    has_bias = len(prev.inputs) > 2 and prev.inputs[2]
    if has_bias and (prev.inputs[2] not in consts or consts[prev.inputs[2]].shape != (w.shape[0],)):
        return None
    return w, consts[prev.inputs[2]].astype(np.float64) if has_bias else np.zeros(w.shape[0])


def _batchnorm_params(node, consts):
    """(scale, bias, mean, var) of an inference BatchNormalization whose parameters are
    constants of one value per channel, else None."""
    if node.op_type != "BatchNormalization" or node.domain or int(node.attrs.get("training_mode", 0)) \
            or not int(node.attrs.get("spatial", 1)) or len([o for o in node.outputs if o]) != 1 \
            or not node.outputs[0] or len(node.inputs) < 5 or not all(x in consts for x in node.inputs[1:5]):
        return None
    params = [consts[x] for x in node.inputs[1:5]]
    if any(p.ndim != 1 or p.shape != params[0].shape or p.dtype.kind != "f" for p in params):
        return None
    return params


def _fold_affine(n, nodes, producer, readers, consts, inits):
    """(index of n's producer, the producer with n folded in, what changed) when n is a Mul/Add
    by a per-channel constant of a Conv or BatchNormalization read by n alone; else None.
    New constants go into both `inits` and `consts`."""
    if n.op_type not in ("Mul", "Add") or n.domain or len(n.inputs) != 2 or "broadcast" in n.attrs:
        return None  # (opsets 1-6 broadcast differently: left alone)
    for k in (0, 1):
        x, c_name = n.inputs[k], n.inputs[1 - k]
        j = producer.get(x)
        prev = nodes[j] if j is not None else None
        if prev is None or c_name not in consts or prev.domain or readers.single(x) is not n:
            continue
        tag = f"{prev.name}/{n.op_type.lower()}_{n.name}"
        conv = _conv_params(prev, consts)
        bn = _batchnorm_params(prev, consts) if conv is None else None
        if conv is not None:
            w, b = conv
            c = per_channel(consts[c_name], w.ndim, w.shape[0]) if consts[c_name].dtype == w.dtype else None
            if c is None:
                continue
            if n.op_type == "Mul":
                inits[tag + "/W"] = (w.astype(np.float64) * c.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
                inits[tag + "/B"] = (b * c).astype(w.dtype)
                new_inputs = [prev.inputs[0], tag + "/W", tag + "/B"]
            else:
                inits[tag + "/B"] = (b + c).astype(w.dtype)
                new_inputs = [prev.inputs[0], prev.inputs[1], tag + "/B"]
        elif bn is not None:
            scale, bias = bn[0], bn[1]
            c = per_channel(consts[c_name], 4, scale.shape[0]) if consts[c_name].dtype == scale.dtype else None
            if c is None:
                continue
            if n.op_type == "Mul":
                inits[tag + "/scale"] = (scale * c).astype(scale.dtype)
                inits[tag + "/bias"] = (bias * c).astype(bias.dtype)
                new_inputs = [prev.inputs[0], tag + "/scale", tag + "/bias", *prev.inputs[3:]]
            else:
                inits[tag + "/bias"] = (bias + c).astype(bias.dtype)
                new_inputs = [prev.inputs[0], prev.inputs[1], tag + "/bias", *prev.inputs[3:]]
        else:
            continue
        consts.update((name, inits[name]) for name in new_inputs[1:] if name in inits)
        merged = replace(prev, inputs=new_inputs, outputs=list(n.outputs),
                         origin=origin(prev, f"{n.op_type} '{n.name}' folded in"))
        return j, merged, f"fold {n.op_type} '{n.name}' by a constant into {prev.op_type} '{prev.name}'"
    return None


def fold_batchnorm_into_conv(graph, ctx=None):
    consts = graph.constants()
    inits = dict(graph.initializers)
    readers = Readers(graph, graph.nodes)
    producer = producers(graph.nodes)
    replaced, dropped, changes = {}, set(), []
    for n in graph.nodes:
        bn = _batchnorm_params(n, consts)
        conv = producer.get(n.inputs[0]) if bn is not None else None
        if conv is None or conv.domain or readers.single(n.inputs[0]) is not n or conv.name in replaced:
            continue
        params = _conv_params(conv, consts)
        if params is None or params[0].shape[0] != bn[0].shape[0]:
            continue
        w, b = params
        scale, bias, mean, var = (p.astype(np.float64) for p in bn)
        factor = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
        w_name, b_name = f"{conv.name}/W_bn_folded", f"{conv.name}/B_bn_folded"
        # the weights scaled in their own type (float32 for float16: onnxruntime's fusion
        # computes in float too): a float64 round trip made three passes over the model's
        # weights and a temporary twice their size (resnet50: 50-150 ms of session creation)
        work = np.promote_types(w.dtype, np.float32)
        scaled = np.multiply(w, factor.astype(work).reshape((-1,) + (1,) * (w.ndim - 1)), dtype=work)
        inits[w_name] = scaled.astype(w.dtype, copy=False)
        inits[b_name] = ((b - mean) * factor + bias).astype(w.dtype)
        replaced[conv.name] = replace(conv, inputs=[conv.inputs[0], w_name, b_name], outputs=list(n.outputs),
                                      origin=origin(conv, f"BatchNormalization '{n.name}' folded in"))
        dropped.add(n.name)
        changes.append(f"fold BatchNormalization '{n.name}' into Conv '{conv.name}'")
    nodes = [replaced.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    return finish(graph, nodes, inits, changes)
