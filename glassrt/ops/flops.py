"""Floating-point operations per node, from shapes alone (symbolic dims give formulas).

A multiply-add counts as two FLOPs, as in most papers and profilers.
"""
from __future__ import annotations

from .. import symbolic
from ..ir import TensorType


def _shape(t):
    return t.shape if isinstance(t, TensorType) else None


def node_flops(node, attrs, in_types, out_types):
    """FLOPs as an int (or a symbolic Dim), or None for ops not counted."""
    ins = [_shape(t) for t in in_types]
    outs = [_shape(t) for t in out_types]
    op = node.op_type
    try:
        if op in ("Conv", "FusedConv", "ConvInteger", "QLinearConv", "DeformConv"):
            x_i, w_i = (0, 3) if op == "QLinearConv" else (0, 1)
            w, y = ins[w_i], outs[0]
            if w is None or y is None:
                return None
            return 2 * symbolic.prod(y) * symbolic.prod(w[1:])
        if op == "ConvTranspose":
            x, w = ins[0], ins[1]
            if x is None or w is None:
                return None
            return 2 * symbolic.prod(x) * symbolic.prod(w[1:])
        if op in ("MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul"):
            a, y = ins[0], outs[0]
            if a is None or y is None:
                return None
            k = a[-2] if op == "FusedMatMul" and attrs.get("transA", 0) else a[-1]
            if op == "FusedMatMul" and attrs.get("perm_a"):  # (glassrt's: A read through a permutation)
                k = a[int(attrs["perm_a"][-1])]
            # FusedMatMul's bias and Z: one add per output each (as Gemm's C below counts)
            adds = sum(1 for i in (2, 3) if op == "FusedMatMul" and len(ins) > i and ins[i] is not None)
            return 2 * symbolic.prod(y) * k + adds * symbolic.prod(y)
        if op == "Gemm":
            a, y = ins[0], outs[0]
            if a is None or y is None:
                return None
            k = a[0] if attrs.get("transA", 0) else a[-1]
            return 2 * symbolic.prod(y) * k + (symbolic.prod(y) if len(ins) > 2 and ins[2] is not None else 0)
        if op == "Attention" and node.domain == "":
            q, k = ins[0], ins[1]
            if q is None or k is None:
                return None
            # QK^T and PV: 2 * 2 * (query positions) * (key positions) * head size, per head.
            if len(q) == 4:
                b, h, sq, d = q
                sk = k[2]
            else:
                b, sq, hd = q
                sk = k[1]
                h, d = 1, hd
            y = outs[0]
            dv = y[-1] if y is not None and len(y) == 4 else d
            return 2 * b * h * sq * sk * (d + dv)
        if op == "ScaledDotProductAttention":
            q, k, y = ins[0], ins[1], outs[0]
            if q is None or k is None or y is None:
                return None
            # Q·Kᵀ and P·V: 2 * (query rows, all heads) * keys * (head size + value size)
            return 2 * symbolic.prod(q[:-1]) * k[-2] * (q[-1] + y[-1])
        if op in ("LSTM", "GRU", "RNN"):
            x, w, r = ins[0], ins[1], ins[2]
            if x is None or w is None or r is None:
                return None
            steps_batch = x[0] * x[1]
            return 2 * steps_batch * w[0] * w[1] * (w[2] + r[2])
    except (TypeError, IndexError):
        return None
    return None
