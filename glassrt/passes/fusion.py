"""Fusions on a graph whose constants are known (after constant folding):

  * Conv → BatchNormalization (inference): the normalization is folded into the conv's
    weights and bias, so the BatchNormalization node disappears;
  * Conv / BatchNormalization → Mul or Add by a per-channel constant (the "scale" layers
    old exporters write after a BatchNormalization): folded into the weights and bias;
  * Conv → Add (a residual of the same shape) [→ Relu]: one glassrt::FusedConv with the
    residual as its fourth input (ResNet's blocks end this way);
  * Conv → Relu / LeakyRelu / Clip (constant bounds) / Sigmoid: one glassrt::FusedConv
    node that applies the activation in place on the conv's output; the same after an
    inference BatchNormalization that could not be folded (glassrt::FusedBatchNormalization);
  * x·0.5·(1 + erf(x/√2)) written out in five elementwise nodes (as PyTorch exports
    GELU below opset 20): one ONNX Gelu node.

Each rewrite keeps the output names, only fires when the intermediate value has no other
reader and is not a graph output, and is logged; the fused node's `origin` names the
nodes it replaced.
"""
from __future__ import annotations

import math
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
    nodes = _fuse_gelu(graph, nodes, {**consts, **new_inits}, log)
    if not log:
        return graph, []
    used = {i for n in nodes for i in [*n.inputs, *n.implicit_inputs]} | set(graph.output_names()) | \
        {v.name for v in graph.inputs}
    new_inits = {k: v for k, v in new_inits.items() if k in used}
    return replace(graph, nodes=nodes, initializers=new_inits), log


class _Readers:
    """Who reads each value, indexed once per node list (scanning all nodes per candidate
    would be quadratic on a 5,000-node transformer)."""

    def __init__(self, graph, nodes):
        self.outputs = set(graph.output_names())
        self.by_value = {}
        for n in nodes:
            for i in {*n.inputs, *n.implicit_inputs}:
                self.by_value.setdefault(i, []).append(n)

    def single(self, value):
        """The one node reading `value`; None if several, none, or it is a graph output."""
        found = self.by_value.get(value, [])
        return found[0] if len(found) == 1 and value not in self.outputs else None


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
    readers = _Readers(graph, nodes)
    producer = {o: n for n in nodes for o in n.outputs if o}
    for n in nodes:
        if n.op_type not in ("Mul", "Add") or n.domain or len(n.inputs) != 2 or "broadcast" in n.attrs:
            continue  # (opsets 1-6 broadcast differently: left alone)
        for k in (0, 1):
            x, c_name = n.inputs[k], n.inputs[1 - k]
            prev = producer.get(x)
            if prev is None or c_name not in consts or prev.domain or readers.single(x) is not n:
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
    readers = _Readers(graph, nodes)
    producer = {o: n for n in nodes for o in n.outputs if o}
    out, dropped = [], set()
    replaced = {}
    for n in nodes:
        if n.op_type != "BatchNormalization" or n.domain or int(n.attrs.get("training_mode", 0)) \
                or not int(n.attrs.get("spatial", 1)) or len([o for o in n.outputs if o]) != 1 or not n.outputs[0]:
            continue
        conv = producer.get(n.inputs[0])
        if conv is None or conv.op_type != "Conv" or conv.domain or readers.single(n.inputs[0]) is not n:
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
    readers = _Readers(graph, nodes)
    producer = {o: n for n in nodes for o in n.outputs if o}
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
            tc, tz = graph.types.get(add.inputs[k]), graph.types.get(z)
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
                                      origin=_origin(conv, f"{what} fused in (residual)"))
            dropped.add(conv.name)
            log.append(f"fuse {what} into Conv '{conv.name}' (residual)")
            break
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]


def _fuse_activation(graph, nodes, consts, log):
    readers = _Readers(graph, nodes)
    producer = {o: n for n in nodes for o in n.outputs if o}
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


def _scalar_const(consts, name, value):
    """name is a one-element float constant equal to `value` (to float32 precision)."""
    c = consts.get(name)
    return c is not None and c.size == 1 and c.dtype.kind == "f" and \
        abs(float(c.reshape(-1)[0]) - value) <= 1e-6 * abs(value)


def _other(node, value):
    """The other input of a two-input node that reads `value` once."""
    a, b = node.inputs
    return b if a == value else a if b == value else None


def _fuse_gelu(graph, nodes, consts, log):
    """x·0.5·(1 + erf(x/√2)) written out as Div (or Mul by 1/√2), Erf, Add 1, and two Muls
    in any of the orders exporters write (PyTorch: Mul(x, add) then Mul 0.5; Mul(x, 0.5)
    first; Mul(add, 0.5) first): one ONNX Gelu node, computed in one pass."""
    readers = _Readers(graph, nodes)
    producer = {o: n for n in nodes for o in n.outputs if o}

    def op(n, name, arity=2):
        return n is not None and n.op_type == name and not n.domain and len(n.inputs) == arity \
            and "broadcast" not in n.attrs

    replaced, dropped = {}, set()
    for erf in nodes:
        if not op(erf, "Erf", 1) or erf.name in dropped:
            continue
        scaled = producer.get(erf.inputs[0])
        if readers.single(erf.inputs[0]) is not erf:
            continue
        if op(scaled, "Div") and _scalar_const(consts, scaled.inputs[1], math.sqrt(2)):
            x = scaled.inputs[0]
        elif op(scaled, "Mul") and any(_scalar_const(consts, c, 1 / math.sqrt(2)) for c in scaled.inputs):
            x = scaled.inputs[1] if _scalar_const(consts, scaled.inputs[0], 1 / math.sqrt(2)) else scaled.inputs[0]
        else:
            continue
        add = readers.single(erf.outputs[0])
        if not op(add, "Add") or not _scalar_const(consts, _other(add, erf.outputs[0]), 1.0):
            continue
        m1 = readers.single(add.outputs[0])
        if not op(m1, "Mul"):
            continue
        other = _other(m1, add.outputs[0])
        half_x = producer.get(other)
        chain = [scaled, erf, add, m1]
        if other == x:  # Mul(x, 1 + erf) then Mul by 0.5
            m2 = readers.single(m1.outputs[0])
            if not op(m2, "Mul") or not _scalar_const(consts, _other(m2, m1.outputs[0]), 0.5):
                continue
            chain.append(m2)
        elif _scalar_const(consts, other, 0.5):  # Mul(1 + erf, 0.5) then Mul by x
            m2 = readers.single(m1.outputs[0])
            if not op(m2, "Mul") or _other(m2, m1.outputs[0]) != x:
                continue
            chain.append(m2)
        elif op(half_x, "Mul") and x in half_x.inputs and _scalar_const(consts, _other(half_x, x), 0.5) \
                and readers.single(other) is m1:  # Mul(x, 0.5) then Mul by 1 + erf
            chain.insert(0, half_x)
        else:
            continue
        last = chain[-1]
        replaced[last.name] = Node("Gelu", "", [x], list(last.outputs), {}, last.name, 20, [],
                                   origin=_origin(last, "Gelu written out as " +
                                                  ", ".join(f"{n.op_type} '{n.name}'" for n in chain)))
        dropped.update(n.name for n in chain if n is not last)
        log.append(f"fuse {len(chain)} nodes into Gelu '{last.name}' (x·0.5·(1 + erf(x/√2)))")
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]


def _origin(node, what):
    return f"{node.origin + '; ' if node.origin else ''}{what}"
