"""A QDQ model's layers as integer products: MatMul(DequantizeLinear(a_q), DequantizeLinear(W_q))
[+ a constant bias Add], W_q a constant int8 matrix, becomes one com.microsoft
MatMulIntegerToFloat(a_q, W_q, a_scale, w_scale, a_zp, w_zp[, bias]): what onnxruntime's QDQ
transformer makes of them.

Left alone, constant folding turns DequantizeLinear(W_q) into float weights and the layer
is a float GEMM over dequantized activations (smart-turn v3.2: 25 such layers, 23 ms of
its 42). The integer product reads a quarter of the bytes and multiplies them as bytes
(VNNI, AMX) on the onednn provider's exact int8 kernel (kernels/onednn/int8.py).

The numbers move by rounding only: the float product rounds each partial sum of
dequantized values, the integer product is exact and then scaled once, as onnxruntime
computes these layers (its outputs and glassrt's agree more closely than before).

It fires only where that kernel will run the product: the onednn provider among the
session's, its 8-bit products exact on this CPU (VNNI or AMX). Elsewhere the cpu kernel's
exact integer product converts the weights to float32 at every call, slower than the
float GEMM of weights folded once. And only where the program is the same: float32
scales, A's per tensor (one scale, one zero point, constants), W's one or one per column,
A 8-bit, W int8 with zero points 0 (what that kernel takes; symmetric weights, as
quantize_static writes them), no DequantizeLinear attribute but the axis of W's columns.
A bias Add (a float32 constant, one value per column) after the MatMul goes in too.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node
from ._rewrite import Readers, bias_add, origin, producers, rebuild
from ..dtypes import EIGHT_BIT as _EIGHT_BIT

MS = "com.microsoft"


def onednn_reason(providers) -> str | None:
    """None where the session's providers include the onednn provider, and oneDNN loads."""
    if not any(p.name == "onednn" and not getattr(p, "unavailable", None) for p in providers):
        return "the onednn provider is not among the session's (or oneDNN is unavailable)"
    return None


def int8_engine_reason(providers) -> str | None:
    """None where the session's providers include one that runs exact 8-bit products."""
    why = onednn_reason(providers)
    if why:
        return why
    from ..kernels.onednn.int8 import exact_reason

    return exact_reason()


def fuse_qdq_matmul(graph, ctx):
    if not any(n.op_type == "DequantizeLinear" for n in graph.nodes) or int8_engine_reason(ctx.providers):
        return graph, []
    consts, types = graph.constants(), ctx.types
    readers = Readers(graph, graph.nodes)
    producer = producers(graph.nodes)
    replaced, dropped, changes = {}, set(), []

    def dq_parts(name):
        """(the DQ node, its 8-bit input, scale, zero point name or "") of a DequantizeLinear output."""
        dq = producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.domain or set(dq.attrs) - {"axis"} \
                or len(dq.inputs) < 2:
            return None
        x = dq.inputs[0]
        dt = consts[x].dtype if x in consts else getattr(types.get(x), "dtype", None)
        scale = consts.get(dq.inputs[1])
        zp = dq.inputs[2] if len(dq.inputs) > 2 else ""
        if dt not in _EIGHT_BIT or scale is None or scale.dtype != np.float32 or (zp and zp not in consts):
            return None
        return dq, x, scale, zp

    for mm in graph.nodes:
        if mm.op_type != "MatMul" or mm.domain or len(mm.inputs) != 2:
            continue
        a, b = dq_parts(mm.inputs[0]), dq_parts(mm.inputs[1])
        if a is None or b is None or b[1] not in consts:
            continue
        (dq_a, a_q, a_scale, a_zp), (dq_b, w_q, w_scale, w_zp) = a, b
        w = consts[w_q]
        if a_scale.size != 1 or (a_zp and consts[a_zp].size != 1) or w.ndim != 2 or w.dtype != np.int8:
            continue
        n = w.shape[1]
        axis = int(dq_b.attrs.get("axis", 1))
        if w_scale.size != 1 and (w_scale.shape != (n,) or axis not in (1, -1)):
            continue  # a scale per row of W (per inner element) cannot be taken out of the sum
        if w_zp and (consts[w_zp].shape != w_scale.shape or consts[w_zp].any()):
            continue
        add, bias = bias_add(readers, consts, mm.outputs[0], n)
        out = add.outputs[0] if add else mm.outputs[0]
        if add:
            dropped.add(id(add))
        why = origin(mm, f"MatMul '{mm.name}' of DequantizeLinear '{dq_a.name}' and '{dq_b.name}'"
                         + (" and its bias Add" if bias else ""))
        inputs = [a_q, w_q, dq_a.inputs[1], dq_b.inputs[1], a_zp, w_zp, bias]
        while not inputs[-1]:
            inputs.pop()
        replaced[id(mm)] = [Node("MatMulIntegerToFloat", MS, inputs, [out], {}, mm.name, 1, origin=why)]
        for dq in (dq_a, dq_b):
            if readers.single(dq.outputs[0]) is mm:
                dropped.add(id(dq))
        changes.append(f"MatMul '{mm.name}' of DequantizeLinear '{dq_a.name}' and '{dq_b.name}'"
                       f"{' + bias' if bias else ''} -> MatMulIntegerToFloat (w {w.dtype}{list(w.shape)})")
    if not changes:
        return graph, []
    nodes = rebuild(graph.nodes, replaced, dropped)
    return replace(graph, nodes=nodes, opsets={MS: 1, **graph.opsets}), changes
