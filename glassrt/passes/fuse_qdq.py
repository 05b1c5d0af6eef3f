"""QuantizeLinear -> DequantizeLinear pairs on float activations (a QDQ model, as
onnxruntime's quantize_static writes it and PyTorch's quantization exports): one
glassrt::QuantizeDequantize, a single pass over the tensor instead of two kernels and an
8-bit tensor between them. The values are the pair's to the bit (the same float32 steps);
`glassrt check` compares the fused kernel with its decomposition, the two nodes.

It fires only where that is the same program: per-tensor quantization (one scale, one
zero point, constants), 8-bit integers, the DequantizeLinear's scale and zero point equal
to the QuantizeLinear's, the quantized tensor read by that DequantizeLinear alone and not
a graph output, float32 data, and no attribute that changes the arithmetic (saturate,
block_size, output_dtype, precision).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node
from ._rewrite import Readers, origin, producers
from ..dtypes import EIGHT_BIT as _EIGHT_BIT

_Q_PLAIN = {"axis"}  # attributes with no effect on per-tensor quantization


def fuse_qdq(graph, ctx):
    consts, types = graph.constants(), ctx.types
    readers = Readers(graph, graph.nodes)
    producer = producers(graph.nodes)
    replaced, dropped, changes = {}, set(), []

    def scalar(name):
        c = consts.get(name) if name else None
        return c if c is not None and c.size == 1 else None

    for dq in graph.nodes:
        if dq.op_type != "DequantizeLinear" or dq.domain or set(dq.attrs) - _Q_PLAIN:
            continue
        q = producer.get(dq.inputs[0])
        if q is None or q.op_type != "QuantizeLinear" or q.domain or set(q.attrs) - _Q_PLAIN \
                or readers.single(q.outputs[0]) is not dq or len(q.inputs) < 2:
            continue
        x = q.inputs[0]
        if getattr(types.get(x), "dtype", None) != np.float32:
            continue
        q_params = (q.inputs + [""])[1:3]
        dq_params = (dq.inputs + [""])[1:3]
        q_scale, dq_scale = scalar(q_params[0]), scalar(dq_params[0])
        if q_scale is None or dq_scale is None or q_scale.dtype != np.float32 or dq_scale.dtype != np.float32 \
                or q_scale.reshape(-1)[0] != dq_scale.reshape(-1)[0]:
            continue
        q_zp = scalar(q_params[1]) if q_params[1] else np.zeros((), np.uint8)
        dq_zp = scalar(dq_params[1]) if dq_params[1] else np.zeros((), np.uint8)
        if q_zp is None or dq_zp is None or q_zp.dtype not in _EIGHT_BIT or q_zp.dtype != dq_zp.dtype \
                or q_zp.reshape(-1)[0] != dq_zp.reshape(-1)[0]:
            continue
        inputs = [x, q_params[0]] + ([q_params[1]] if q_params[1] else [])
        replaced[dq.name] = Node("QuantizeDequantize", "glassrt", inputs, list(dq.outputs), {}, dq.name, 1,
                                 origin=origin(dq, f"QuantizeLinear '{q.name}' and DequantizeLinear '{dq.name}'"))
        dropped.add(q.name)
        changes.append(f"fuse QuantizeLinear '{q.name}' and DequantizeLinear '{dq.name}' into QuantizeDequantize")
    if not changes:
        return graph, []
    return replace(graph, nodes=[replaced.get(n.name, n) for n in graph.nodes if n.name not in dropped]), changes
