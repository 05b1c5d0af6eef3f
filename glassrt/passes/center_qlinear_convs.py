"""Two 8-bit convolutions in a row hand each other float32 values, not bytes.

Where no exact 8-bit engine runs QLinearConv (no VNNI or AMX), oneDNN runs it as an exact
float32 convolution (kernels/onednn/int8_float.py) between two reorders: the 8-bit x into
float32 x - x_zero_point, and the requantized float32 result into 8-bit y (+ y_zero_point,
saturated). When a conv's y is read by the next conv alone, those two reorders only turn
float32 values into bytes and back: the first conv's epilogue can clip its result to
(lo - y_zero_point, hi - y_zero_point), which is exactly y - y_zero_point, and that is the
second conv's float32 input when its x_zero_point is the same value. Measured on a
quantize_static MobileNetV2 (QOperator), 2-core AVX2 EPYC: its 104 reorders were 8.9 ms of
a 20.7 ms run.

Both convs become glassrt::CenteredQLinearConv (x_centered on the second, y_centered on the
first; a conv in the middle of a chain both). It fires only where that is the same
program and where it pays: the y is read by that conv alone (as its x) and is not a graph
output, the zero points are equal one-value constants of one type, and oneDNN runs 8-bit
convs as float32 ones here (its provider is in the session's and this CPU has no exact
8-bit products).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Node
from ._rewrite import Readers, origin, producers
from .fuse_qdq_matmul import int8_engine_reason, onednn_reason


def _conv(node) -> bool:
    return (node.op_type, node.domain) in (("QLinearConv", ""), ("CenteredQLinearConv", "glassrt"))


def center_qlinear_convs(graph, ctx):
    if not any(n.op_type == "QLinearConv" for n in graph.nodes) or onednn_reason(ctx.providers) \
            or int8_engine_reason(ctx.providers) is None:
        return graph, []
    consts = graph.constants()
    readers = Readers(graph, graph.nodes)
    producer = producers(graph.nodes)
    current = {}  # name -> the node as rewritten so far (a conv in a chain is rewritten twice)
    changes = []
    taken = {v for n in graph.nodes for v in (*n.inputs, *n.outputs)} | set(graph.initializers) \
        | {v.name for v in graph.inputs}

    def zero_point(node, i):
        c = consts.get(node.inputs[i]) if len(node.inputs) > i and node.inputs[i] else None
        return c if c is not None and c.size == 1 else None

    def centered(node, inputs, outputs, **flags):
        """`node` (as rewritten so far) as a CenteredQLinearConv with these flags set."""
        node = current.get(node.name, node)
        what = "its x" if "x_centered" in flags else "its y"
        return Node("CenteredQLinearConv", "glassrt", inputs or list(node.inputs), outputs or list(node.outputs),
                    {**node.attrs, **flags}, node.name, 1, list(node.implicit_inputs),
                    origin=origin(node, f"{what} as float32 codes minus the zero point"))

    for b in graph.nodes:
        if not _conv(b) or not b.inputs:
            continue
        a = producer.get(b.inputs[0])
        if a is None or not _conv(a) or readers.single(b.inputs[0]) is not b or b.inputs[0] in b.inputs[1:]:
            continue
        yz, xz = zero_point(a, 7), zero_point(b, 2)
        if yz is None or xz is None or yz.dtype != xz.dtype or yz.reshape(-1)[0] != xz.reshape(-1)[0]:
            continue
        codes = f"{b.inputs[0]}/centered"
        while codes in taken:  # (a model may already hold a value of that name)
            codes += "_"
        taken.add(codes)
        current[a.name] = centered(a, None, [codes], y_centered=1)
        current[b.name] = centered(b, [codes, *b.inputs[1:]], None, x_centered=1)
        changes.append(f"conv '{a.name}' hands conv '{b.name}' its codes as float32")
    if not changes:
        return graph, []
    return replace(graph, nodes=[current.get(n.name, n) for n in graph.nodes]), changes
