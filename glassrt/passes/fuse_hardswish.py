"""HardSwish written out, x · Clip(x + 3, 0, 6) / 6 (PaddlePaddle's hardswish as paddle2onnx
writes it, and PyTorch's below opset 14): one ONNX HardSwish, which fuse_conv then puts into
the convolution before it. PP-OCR's backbones run these four-node chains on cpu, each between two oneDNN convs:
rapidocr's detector 24, its recognizer 28, its direction classifier 18.

The orders exporters write are taken: Mul(x, clip) then Div by 6 (or Mul by 1/6), and Div
(or Mul by 1/6) then Mul by x. HardSwish computes x · max(0, min(1, x/6 + 1/2)): the same
function, rounded in another order (a few float32 ulps), as fuse_gelu's Gelu is.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Node
from ._rewrite import Readers, activation_of, origin, producers


def fuse_hardswish(graph, ctx=None):
    consts = graph.constants()
    nodes = list(graph.nodes)
    readers = Readers(graph, nodes)
    producer = producers(nodes)
    replaced, dropped, changes = {}, set(), []

    def op(n, name):
        return n is not None and n.op_type == name and not n.domain and len(n.inputs) == 2 \
            and "broadcast" not in n.attrs

    def scalar(name, value):
        c = consts.get(name)
        return c is not None and c.size == 1 and c.dtype.kind == "f" and abs(float(c.reshape(-1)[0]) - value) <= 1e-6

    def other(n, value):
        a, b = n.inputs
        return b if a == value else a if b == value else None

    def sixth(n, value):
        """n divides `value` by 6 (or multiplies it by 1/6)."""
        return (op(n, "Div") and n.inputs[0] == value and scalar(n.inputs[1], 6.0)) or \
            (op(n, "Mul") and value in n.inputs and scalar(other(n, value), 1 / 6))

    for clip in nodes:
        if clip.op_type != "Clip" or clip.domain or activation_of(clip, consts) != ("Clip", [0.0, 6.0]):
            continue
        add = producer.get(clip.inputs[0])
        if not op(add, "Add") or readers.single(add.outputs[0]) is not clip:
            continue
        x = next((i for i in add.inputs if scalar(other(add, i), 3.0)), None)
        first = readers.single(clip.outputs[0])
        if x is None or first is None:
            continue
        if op(first, "Mul") and other(first, clip.outputs[0]) == x:  # x · clip, then / 6
            last = readers.single(first.outputs[0])
            ok = last is not None and sixth(last, first.outputs[0])
        else:  # clip / 6, then · x
            last = readers.single(first.outputs[0]) if sixth(first, clip.outputs[0]) else None
            ok = op(last, "Mul") and other(last, first.outputs[0]) == x
        chain = [add, clip, first, last]
        if not ok or any(n.name in dropped or n.name in replaced for n in chain):
            continue
        replaced[last.name] = Node("HardSwish", "", [x], list(last.outputs), {}, last.name, 14,
                                   origin=origin(last, "HardSwish written out as " +
                                                 ", ".join(f"{n.op_type} '{n.name}'" for n in chain)))
        dropped.update(n.name for n in chain[:-1])
        changes.append(f"fuse 4 nodes into HardSwish '{last.name}' (x·Clip(x + 3, 0, 6)/6)")
    if not changes:
        return graph, []
    return replace(graph, nodes=[replaced.get(n.name, n) for n in nodes if n.name not in dropped]), changes
