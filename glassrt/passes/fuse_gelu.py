"""x·0.5·(1 + erf(x/√2)) written out in five elementwise nodes (as PyTorch exports GELU
below opset 20): one ONNX Gelu node, computed in one pass."""
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
    """x·0.5·(1 + erf(x/√2)) written out as Div (or Mul by 1/√2), Erf, Add 1, and two Muls
    in any of the orders exporters write (PyTorch: Mul(x, add) then Mul 0.5; Mul(x, 0.5)
    first; Mul(add, 0.5) first): one ONNX Gelu node, computed in one pass."""
    readers = Readers(graph, nodes)
    producer = producers(nodes)

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
                                   origin=origin(last, "Gelu written out as " +
                                                  ", ".join(f"{n.op_type} '{n.name}'" for n in chain)))
        dropped.update(n.name for n in chain if n is not last)
        log.append(f"fuse {len(chain)} nodes into Gelu '{last.name}' (x·0.5·(1 + erf(x/√2)))")
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]
