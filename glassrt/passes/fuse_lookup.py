"""A quantized SiLU as one table: QLinearMul(x, QLinearSigmoid(x)) (com.microsoft's, as
onnxruntime's quantizer writes a YOLO's x · sigmoid(x), or as passes/fuse_qdq_conv.py makes
it of a QDQ model) becomes glassrt::LookupTable(x, table).

Both operands of the Mul come from the same bytes of x, so each output byte is a function
of one input byte: the table holds the two kernels' own results for the 256 codes (computed
here, by those kernels), so the values are the same to the bit, and a run makes one gather
pass over the tensor instead of a lookup pass and a multiply pass (a YOLOv8n-style model:
27 of each, single-threaded, on tensors up to 409,600 bytes).

It fires where that is the program: the sigmoid's output read by that Mul alone, every scale
and zero point a constant, the Mul's parameters for x those the sigmoid reads x with, and
its parameters for the sigmoid's output those the sigmoid writes it with.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node
from ._rewrite import Readers, origin, producers, rebuild

MS = "com.microsoft"


def fuse_lookup(graph, ctx):
    if not any(n.op_type == "QLinearSigmoid" and n.domain == MS for n in graph.nodes):
        return graph, []
    from ..contrib.microsoft_quant import qlinear_mul, qlinear_sigmoid

    consts = graph.constants()
    readers = Readers(graph, graph.nodes)
    producer = producers(graph.nodes)
    replaced, dropped, changes, tables = {}, set(), [], {}

    def values(names):
        """The constants named (None for an absent optional input), or None if one is computed."""
        out = []
        for n in names:
            if n and n not in consts:
                return None
            out.append(consts[n] if n else None)
        return out

    def same(a, b):
        return (a is None and b is None) or (a is not None and b is not None and a.dtype == b.dtype
                                              and np.array_equal(a.reshape(-1), b.reshape(-1)))

    for mul in graph.nodes:
        if mul.op_type != "QLinearMul" or mul.domain != MS or len(mul.inputs) < 7:
            continue
        ins = (mul.inputs + [""])[:8]
        for x_at, s_at in ((0, 3), (3, 0)):
            sig = producer.get(ins[s_at])
            if sig is None or sig.op_type != "QLinearSigmoid" or sig.domain != MS or sig.inputs[0] != ins[x_at] \
                    or readers.single(ins[s_at]) is not mul or len(sig.inputs) < 4:
                continue
            sig_params = values((sig.inputs + [""])[1:5])
            mul_params = values([ins[1], ins[2], ins[4], ins[5], ins[6], ins[7]])
            x_type = ctx.types.get(ins[x_at])
            dt = getattr(x_type, "dtype", None)
            if sig_params is None or mul_params is None or dt not in (np.dtype(np.uint8), np.dtype(np.int8)):
                continue
            xs, xz = mul_params[0:2] if x_at == 0 else mul_params[2:4]
            ss, sz = mul_params[2:4] if x_at == 0 else mul_params[0:2]
            if not (same(xs, sig_params[0]) and same(xz, sig_params[1]) and same(ss, sig_params[2])
                    and same(sz, sig_params[3])):
                continue
            codes = np.arange(256, dtype=np.uint8).view(dt)
            try:
                s_codes = qlinear_sigmoid.kernels["cpu"](codes, *sig_params)
                a, b = (codes, s_codes) if x_at == 0 else (s_codes, codes)
                table = np.asarray(qlinear_mul.kernels["cpu"](a, mul_params[0], mul_params[1], b, mul_params[2],
                                                              mul_params[3], mul_params[4], mul_params[5]))
            except Exception:  # noqa: BLE001 - parameters the kernels refuse: left for them to report at run time
                continue
            name = f"{mul.outputs[0]}/table"
            tables[name] = np.ascontiguousarray(table)
            why = origin(mul, f"QLinearMul '{mul.name}' of x and QLinearSigmoid '{sig.name}' of x")
            replaced[id(mul)] = [Node("LookupTable", "glassrt", [ins[x_at], name], [mul.outputs[0]], {}, mul.name, 1,
                                      origin=why)]
            dropped.add(id(sig))
            changes.append(f"QLinearMul '{mul.name}' of QLinearSigmoid '{sig.name}' and its input -> LookupTable "
                           f"(a SiLU's 256 codes)")
            break
    if not changes:
        return graph, []
    nodes = rebuild(graph.nodes, replaced, dropped)
    return replace(graph, nodes=nodes, initializers={**graph.initializers, **tables},
                   opsets={**graph.opsets, "glassrt": 1}), changes
