"""GELU written out in elementwise nodes (as PyTorch exports it below opset 20: five nodes
for the exact form, nine for GPT-2's tanh form): one ONNX Gelu node, computed in one pass
(and then an activation fuse_matmul can put into the product before it)."""
from __future__ import annotations

import math
from dataclasses import replace

from ..ir import Node
from ._rewrite import Readers, origin, producers


def fuse_gelu(graph, ctx=None):
    changes = []
    nodes = _fuse_gelu(graph, list(graph.nodes), graph.constants(), changes)
    return (replace(graph, nodes=nodes), changes) if changes else (graph, [])


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
    """GELU written out, in the orders exporters write it, becomes one ONNX Gelu node:
      exact:  x·0.5·(1 + erf(x/√2))  — Div by √2 (or Mul by 1/√2), Erf, Add 1, two Muls
              (PyTorch: Mul(x, add) then Mul 0.5; Mul(x, 0.5) first; Mul(add, 0.5) first);
      tanh:   x·0.5·(1 + tanh(√(2/π)·(x + 0.044715·x³)))  — GPT-2's gelu_new: Pow 3, Mul,
              Add x, Mul √(2/π), Tanh, Add 1, the same two Muls: Gelu(approximate="tanh")."""
    readers = Readers(graph, nodes)
    producer = producers(nodes)

    def op(n, name, arity=2):
        return n is not None and n.op_type == name and not n.domain and len(n.inputs) == arity \
            and "broadcast" not in n.attrs

    def single(n, value_index=0):
        return readers.single(n.inputs[value_index]) is n

    def exact_head(erf):
        """(x, nodes) when erf reads x/√2."""
        scaled = producer.get(erf.inputs[0])
        if not single(erf):
            return None
        if op(scaled, "Div") and _scalar_const(consts, scaled.inputs[1], math.sqrt(2)):
            return scaled.inputs[0], [scaled]
        if op(scaled, "Mul") and any(_scalar_const(consts, c, 1 / math.sqrt(2)) for c in scaled.inputs):
            return (scaled.inputs[1] if _scalar_const(consts, scaled.inputs[0], 1 / math.sqrt(2))
                    else scaled.inputs[0]), [scaled]
        return None

    def tanh_head(tanh):
        """(x, nodes) when tanh reads √(2/π)·(x + 0.044715·x³)."""
        scaled = producer.get(tanh.inputs[0])
        if not single(tanh) or not op(scaled, "Mul"):
            return None
        c = next((i for i in scaled.inputs if _scalar_const(consts, i, math.sqrt(2 / math.pi))), None)
        inner = producer.get(_other(scaled, c)) if c is not None else None
        if not op(inner, "Add") or readers.single(inner.outputs[0]) is not scaled:
            return None
        for x, m in ((inner.inputs[0], inner.inputs[1]), (inner.inputs[1], inner.inputs[0])):
            cubed = producer.get(m)
            if not op(cubed, "Mul") or readers.single(m) is not inner:
                continue
            k = next((i for i in cubed.inputs if _scalar_const(consts, i, 0.044715)), None)
            pw = producer.get(_other(cubed, k)) if k is not None else None
            if op(pw, "Pow") and pw.inputs[0] == x and _scalar_const(consts, pw.inputs[1], 3.0) \
                    and readers.single(pw.outputs[0]) is cubed:
                return x, [pw, cubed, inner, scaled]
        return None

    replaced, dropped = {}, set()
    for fn in nodes:
        if fn.name in dropped:
            continue
        if op(fn, "Erf", 1):
            head, approximate = exact_head(fn), "none"
        elif op(fn, "Tanh", 1):
            head, approximate = tanh_head(fn), "tanh"
        else:
            continue
        if head is None:
            continue
        x, chain = head
        add = readers.single(fn.outputs[0])
        if not op(add, "Add") or not _scalar_const(consts, _other(add, fn.outputs[0]), 1.0):
            continue
        tail = _tail(op, readers, producer, consts, x, add)
        if tail is None:
            continue
        before, after = tail
        chain = before + chain + [fn, add] + after
        last = chain[-1]
        attrs = {"approximate": "tanh"} if approximate == "tanh" else {}
        formula = "x·0.5·(1 + tanh(√(2/π)·(x + 0.044715·x³)))" if approximate == "tanh" else "x·0.5·(1 + erf(x/√2))"
        replaced[last.name] = Node("Gelu", "", [x], list(last.outputs), attrs, last.name, 20, [],
                                   origin=origin(last, "Gelu written out as " +
                                                  ", ".join(f"{n.op_type} '{n.name}'" for n in chain)))
        dropped.update(n.name for n in chain if n is not last)
        log.append(f"fuse {len(chain)} nodes into Gelu '{last.name}' ({formula})")
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]


def _tail(op, readers, producer, consts, x, add):
    """The two Muls that make 0.5·x·add, in the orders exporters write them: (nodes before
    the head, nodes after add), or None."""
    m1 = readers.single(add.outputs[0])
    if not op(m1, "Mul"):
        return None
    other = _other(m1, add.outputs[0])
    half_x = producer.get(other)
    if other == x:  # Mul(x, 1 + f) then Mul by 0.5
        m2 = readers.single(m1.outputs[0])
        if op(m2, "Mul") and _scalar_const(consts, _other(m2, m1.outputs[0]), 0.5):
            return [], [m1, m2]
        return None
    if _scalar_const(consts, other, 0.5):  # Mul(1 + f, 0.5) then Mul by x
        m2 = readers.single(m1.outputs[0])
        if op(m2, "Mul") and _other(m2, m1.outputs[0]) == x:
            return [], [m1, m2]
        return None
    if op(half_x, "Mul") and x in half_x.inputs and _scalar_const(consts, _other(half_x, x), 0.5) \
            and readers.single(other) is m1:  # Mul(x, 0.5) then Mul by 1 + f
        return [half_x], [m1]
    return None
