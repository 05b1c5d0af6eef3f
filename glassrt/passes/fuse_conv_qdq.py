"""A convolution whose output goes straight into a glassrt::QuantizeDequantize (a QDQ CNN
run in float: each layer's output fake-quantized to 8 bits) becomes one glassrt::FusedConv
with the pair's scale and zero point as its inputs 4 and 5: the quantization runs in the
convolution's epilogue, on each tile while it is still in cache, instead of as a pass of
its own over the activation (a quantize_static MobileNetV2: 52 of its 66 such passes follow
a conv).

It fires only where that is the same program: the conv's output is read by that
QuantizeDequantize alone and is not a graph output, the conv has no QDQ of its own yet,
and the scale and zero point are one-value constants (float32 and 8-bit: fuse_qdq's
conditions). An activation or residual the conv already has stays before the
quantization, as the decomposition writes it.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..dtypes import EIGHT_BIT
from ..ir import Node
from ..ops.fused import fused_conv_quantizes
from ._rewrite import Readers, origin, producers, rebuild


def _constant_params(consts, node) -> bool:
    """Whether a QuantizeDequantize's scale and zero point are one-value constants of the
    types the fused conv takes (float32, 8-bit)."""
    scale = consts.get(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
    zero = consts.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else np.zeros((), np.uint8)
    return scale is not None and zero is not None and scale.size == 1 and zero.size == 1 \
        and scale.dtype == np.float32 and zero.dtype in EIGHT_BIT


def fuse_conv_qdq(graph, ctx):
    if not any(n.op_type == "QuantizeDequantize" for n in graph.nodes):
        return graph, []
    consts = graph.constants()
    readers = Readers(graph, graph.nodes)
    producer = producers(graph.nodes)
    replaced, dropped, changes = {}, set(), []
    for qdq in graph.nodes:
        if qdq.op_type != "QuantizeDequantize" or qdq.domain != "glassrt" or not _constant_params(consts, qdq):
            continue
        conv = producer.get(qdq.inputs[0])
        if conv is None or readers.single(qdq.inputs[0]) is not qdq or id(conv) in replaced:
            continue
        if conv.op_type == "Conv" and not conv.domain:
            attrs = {**conv.attrs, "activation": "", "activation_params": []}
        elif conv.op_type == "FusedConv" and conv.domain == "glassrt" and not fused_conv_quantizes(conv):
            attrs = dict(conv.attrs)
        else:
            continue
        inputs = (list(conv.inputs) + [""] * 4)[:4] + list(qdq.inputs[1:3])
        while inputs and not inputs[-1]:
            inputs.pop()
        replaced[id(conv)] = [Node("FusedConv", "glassrt", inputs, list(qdq.outputs), attrs, conv.name, 1,
                                   list(conv.implicit_inputs),
                                   origin=origin(conv, f"QuantizeDequantize '{qdq.name}' fused in"))]
        dropped.add(id(qdq))
        changes.append(f"fuse QuantizeDequantize '{qdq.name}' into {conv.op_type} '{conv.name}'")
    if not changes:
        return graph, []
    return replace(graph, nodes=rebuild(graph.nodes, replaced, dropped)), changes
