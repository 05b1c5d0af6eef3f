"""A QDQ CNN's layers as integer ones, as onnxruntime's QDQ transformer makes them:
QuantizeLinear(Conv(DequantizeLinear(x_q), DequantizeLinear(W_q)[, DequantizeLinear(b_q)]))
becomes one QLinearConv(x_q, ..., W_q, ..., b_q) -> y_q;
QuantizeLinear(Add / Mul(DequantizeLinear(a_q), DequantizeLinear(b_q))) one com.microsoft
QLinearAdd / QLinearMul; QuantizeLinear(Sigmoid / LeakyRelu(DequantizeLinear(x_q))) one
QLinearSigmoid / QLinearLeakyRelu (a 256-entry table: a YOLO's SiLU, a detector's LeakyRelu);
QuantizeLinear(Concat(DequantizeLinear(x1_q), ...)) one QLinearConcat (each input's codes
through a table of the float program's: exact); a Split, MaxPool, Flatten, Reshape,
Transpose, Squeeze or Unsqueeze between a DequantizeLinear and QuantizeLinears of the same
scale and zero point the same op on the bytes (exact: moving commutes with dequantization and
taking the max with an increasing one, a positive scale; quantizing a dequantized code gives
the code back),
so that a YOLO's C2f and SPPF blocks stay 8-bit; a classifier's head, GlobalAveragePool
and Gemm, QLinearGlobalAveragePool and QGemm (a float bias quantized in x_scale · w_scale,
as onnxruntime's BiasQuantization does).

onnxruntime.quantization.quantize_static writes a model this way by default (QuantFormat.QDQ):
every activation quantized and dequantized around float ops. Left alone, glassrt runs the
float convolutions over dequantized values with a fake-quantization pass between them
(passes/fuse_qdq.py); the integer layers read a quarter of the bytes, multiply them as
bytes (VNNI, AMX) and requantize as they write (kernels/onednn/int8.py), and the 8-bit
values between them stay channels-last.

The numbers move by rounding only: the float program rounds each partial sum of dequantized
values and quantizes the float result; the integer layer sums exactly and requantizes once,
as onnxruntime computes these layers (a code apart at most, at a rounding tie).

It fires only where that is the program: per-tensor activations (one scale and zero point
each, constants, 8-bit), weights int8 constants with zero point 0 (per tensor, or per filter
along axis 0), an int32 bias whose scale is x_scale · w_scale and zero point 0, the float
result read by its QuantizeLinear alone, no attribute but the axis on the Q/DQ nodes; and
only where the onednn provider's exact 8-bit engine runs it (VNNI or AMX), 2-D images. A
float32 bias of a Conv or Gemm is quantized in x_scale · w_scale, as onnxruntime's
BiasQuantization does it.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node
from ._rewrite import Readers, drop_unread, known_shape, origin, producers, rebuild
from .fuse_qdq_matmul import MS, int8_engine_reason
from ..dtypes import EIGHT_BIT as _EIGHT_BIT

_F32 = np.dtype(np.float32)
_BINARY = {"Add": "QLinearAdd", "Mul": "QLinearMul"}  # com.microsoft's, same-shape operands
_UNARY = {"Sigmoid": "QLinearSigmoid", "LeakyRelu": "QLinearLeakyRelu"}  # lookup tables of the 256 codes
# the same op on the bytes, where the parameters are the same on both sides
_MOVES = ("Split", "MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze")


def fuse_qdq_conv(graph, ctx):
    ops = {n.op_type for n in graph.nodes}
    if "QuantizeLinear" not in ops or "DequantizeLinear" not in ops or int8_engine_reason(ctx.providers):
        return graph, []
    consts, types = graph.constants(), ctx.types
    readers = Readers(graph, graph.nodes)
    producer = producers(graph.nodes)
    replaced, dropped, changes = {}, set(), []

    def one(name, dtypes):
        c = consts.get(name) if name else None
        return c is not None and c.size == 1 and c.ndim <= 1 and c.dtype in dtypes

    def per_tensor_dq(name):
        """(DQ node, 8-bit input, scale, zero point) of an activation's DequantizeLinear, or None."""
        dq = producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.domain or set(dq.attrs) - {"axis"} \
                or len(dq.inputs) < 3 or not one(dq.inputs[1], (_F32,)) or not one(dq.inputs[2], _EIGHT_BIT):
            return None
        x = dq.inputs[0]
        dt = consts[x].dtype if x in consts else getattr(types.get(x), "dtype", None)
        return (dq, x, dq.inputs[1], dq.inputs[2]) if dt == consts[dq.inputs[2]].dtype else None

    def quantized_by(node, k=0):
        """The QuantizeLinear (per tensor, 8-bit zero point) that alone reads node's output k, or None."""
        q = readers.single(node.outputs[k])
        if q is None or q.op_type != "QuantizeLinear" or q.domain or set(q.attrs) - {"axis"} or len(q.inputs) < 3 \
                or not one(q.inputs[1], (_F32,)) or not one(q.inputs[2], _EIGHT_BIT):
            return None
        return q

    def same_params(dq, q):
        """Whether QuantizeLinear q undoes DequantizeLinear dq exactly (one scale, one zero point)."""
        return consts[dq[2]].tobytes() == consts[q.inputs[1]].tobytes() \
            and consts[dq[3]].dtype == consts[q.inputs[2]].dtype and consts[dq[3]].item() == consts[q.inputs[2]].item()

    maybe_dead = set()  # outputs of DequantizeLinear nodes the fused nodes no longer read through

    for node in graph.nodes:
        if node.domain or node.op_type not in _MOVES or len(node.outputs) < 1 or not node.inputs:
            continue
        # a Split, MaxPool, reshape... (_MOVES) of a dequantized value whose every result is
        # quantized again with the same scale and zero point: the same op on the bytes (max and
        # moving values commute with the monotone dequantization, and quantizing a dequantized
        # code gives the code back)
        x = per_tensor_dq(node.inputs[0])
        qs = [quantized_by(node, k) if o else None for k, o in enumerate(node.outputs)]
        if x is None or any(o and (q is None or not same_params(x, q)) for o, q in zip(node.outputs, qs)) \
                or not qs[0] \
                or (node.op_type == "MaxPool" and (len([o for o in node.outputs if o]) != 1
                                                    or not float(consts[x[2]].item()) > 0)):
            continue  # (a MaxPool commutes with an increasing dequantization only: a negative scale flips it)
        moved = Node(node.op_type, "", [x[1], *node.inputs[1:]], [q.outputs[0] if q else "" for q in qs],
                     dict(node.attrs), node.name, node.opset,
                     origin=origin(node, f"{node.op_type} '{node.name}' of a DequantizeLinear output, each result "
                                         f"quantized again with its scale and zero point"))
        replaced[id(node)] = [moved]
        dropped.update(id(q) for q in qs if q)
        maybe_dead.add(x[0].outputs[0])
        changes.append(f"{node.op_type} '{node.name}' between DequantizeLinear and QuantizeLinear of the same "
                       f"parameters -> {node.op_type} of the 8-bit values")

    new_consts = {}  # the float biases quantized here

    def quantized_bias(node, scale, n):
        """The name of node's int32 bias in `scale` (x_scale · w_scale, per output column or
        filter), "" without one, None where it cannot be had: the input of a DequantizeLinear
        of an int32 constant in that scale with zero point 0 (quantize_static's), or a float32
        constant of one value per column quantized here, as onnxruntime's BiasQuantization
        does it (QuantizeLinear's float32 round(bias / scale), half to even; one that would
        not fit int32 leaves the node float)."""
        if len(node.inputs) < 3 or not node.inputs[2]:
            return ""
        name = node.inputs[2]
        b_dq = producer.get(name)
        if b_dq is not None and b_dq.op_type == "DequantizeLinear" and not b_dq.domain \
                and not set(b_dq.attrs) - {"axis"}:
            bq, bs = consts.get(b_dq.inputs[0]), consts.get(b_dq.inputs[1])
            bz = consts.get(b_dq.inputs[2]) if len(b_dq.inputs) > 2 and b_dq.inputs[2] else None
            # (scale and bs hold 1 or n values: == broadcasts them; np.broadcast_to and
            # array_equal took ~25 us a conv)
            if bq is None or bq.dtype != np.int32 or bq.shape != (n,) or bs is None or bs.dtype != _F32 \
                    or bs.size not in (1, n) or (bz is not None and bz.any()) \
                    or not (bs.reshape(-1) == scale.reshape(-1)).all():
                return None
            maybe_dead.add(b_dq.outputs[0])
            return b_dq.inputs[0]
        b = consts.get(name)
        if b is None or b.dtype != _F32 or b.shape != (n,):
            return None
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = np.rint(b / scale.reshape(-1))
        if not np.all(np.isfinite(q)) or np.abs(q).max(initial=0) >= 2 ** 31 - 128:
            return None
        quantized = f"{node.outputs[0]}/bias_quantized"
        new_consts[quantized] = q.astype(np.int32)
        return quantized

    def quantized_note(bias):
        return "; its float bias quantized in x_scale · w_scale, as onnxruntime does" if bias in new_consts else ""

    for node in graph.nodes:
        if node.domain or node.op_type not in ("Conv", "Concat", "GlobalAveragePool", "Gemm", *_BINARY, *_UNARY) \
                or len(node.outputs) != 1:
            continue
        q = quantized_by(node)
        if q is None:
            continue
        if node.op_type == "GlobalAveragePool":
            x = per_tensor_dq(node.inputs[0])
            shape = known_shape(types, node.inputs[0])
            if x is None or shape is None or len(shape) < 3 or consts[x[3]].dtype != consts[q.inputs[2]].dtype:
                continue
            fused = Node("QLinearGlobalAveragePool", MS, [x[1], x[2], x[3], q.inputs[1], q.inputs[2]], [q.outputs[0]],
                         {"channels_last": 0}, node.name, 1,
                         origin=origin(node, f"GlobalAveragePool '{node.name}' of a DequantizeLinear output, "
                                             f"quantized by '{q.name}'"))
            maybe_dead.add(x[0].outputs[0])
        elif node.op_type == "Gemm":
            a = per_tensor_dq(node.inputs[0]) if len(node.inputs) >= 2 else None
            w_dq = producer.get(node.inputs[1]) if a is not None else None
            trans_b = int(node.attrs.get("transB", 0))
            if a is None or w_dq is None or w_dq.op_type != "DequantizeLinear" or w_dq.domain \
                    or set(w_dq.attrs) - {"axis"} or len(w_dq.inputs) < 3 or int(node.attrs.get("transA", 0)) \
                    or float(node.attrs.get("alpha", 1.0)) != 1.0 or float(node.attrs.get("beta", 1.0)) != 1.0 \
                    or consts[q.inputs[2]].dtype != consts[a[3]].dtype:
                continue
            w, ws, wz = (consts.get(i) for i in w_dq.inputs[:3])
            if w is None or w.dtype not in _EIGHT_BIT or w.ndim != 2 or ws is None or ws.dtype != _F32 \
                    or wz is None or wz.dtype != w.dtype or wz.shape != ws.shape:
                continue
            n = w.shape[0] if trans_b else w.shape[1]
            column_axis = 0 if trans_b else 1
            if ws.size != 1 and (ws.shape != (n,) or int(w_dq.attrs.get("axis", 1)) % 2 != column_axis):
                continue
            bias = quantized_bias(node, (consts[a[2]].reshape(()) * ws.reshape(-1)).astype(_F32), n)
            if bias is None:
                continue
            inputs = [a[1], a[2], a[3], w_dq.inputs[0], w_dq.inputs[1], w_dq.inputs[2], bias, q.inputs[1], q.inputs[2]]
            fused = Node("QGemm", MS, inputs, [q.outputs[0]], {"transB": trans_b}, node.name, 1,
                         origin=origin(node, f"Gemm '{node.name}' of DequantizeLinear outputs, quantized by "
                                             f"'{q.name}'" + quantized_note(bias)))
            maybe_dead.add(a[0].outputs[0])
            maybe_dead.add(w_dq.outputs[0])
        elif node.op_type == "Concat":
            xs = [per_tensor_dq(i) for i in node.inputs]
            y_dt = consts[q.inputs[2]].dtype
            if not xs or any(x is None or consts[x[3]].dtype != y_dt for x in xs) or "axis" not in node.attrs:
                continue
            fused = Node("QLinearConcat", MS, [q.inputs[1], q.inputs[2], *[v for x in xs for v in x[1:]]],
                         [q.outputs[0]], {"axis": int(node.attrs["axis"])}, node.name, 1,
                         origin=origin(node, f"Concat '{node.name}' of DequantizeLinear outputs, quantized by "
                                             f"'{q.name}'"))
            maybe_dead.update(x[0].outputs[0] for x in xs)
        elif node.op_type in _UNARY:
            x = per_tensor_dq(node.inputs[0]) if len(node.inputs) == 1 else None
            if x is None or consts[x[3]].dtype != consts[q.inputs[2]].dtype:
                continue
            attrs = {"alpha": float(node.attrs.get("alpha", 0.01))} if node.op_type == "LeakyRelu" else {}
            fused = Node(_UNARY[node.op_type], MS, [x[1], x[2], x[3], q.inputs[1], q.inputs[2]], [q.outputs[0]],
                         attrs, node.name, 1, origin=origin(node, f"{node.op_type} '{node.name}' of a "
                                                                  f"DequantizeLinear output, quantized by '{q.name}'"))
            maybe_dead.add(x[0].outputs[0])
        elif node.op_type in _BINARY:
            if len(node.inputs) != 2:
                continue
            a, b = per_tensor_dq(node.inputs[0]), per_tensor_dq(node.inputs[1])
            y_dt = consts[q.inputs[2]].dtype
            if a is None or b is None or consts[a[3]].dtype != y_dt or consts[b[3]].dtype != y_dt:
                continue
            shapes = known_shape(types, node.inputs[0]), known_shape(types, node.inputs[1])
            if shapes[0] is None or shapes[0] != shapes[1]:
                continue  # (broadcasting ones stay float: a residual Add, a SiLU's Mul have one shape)
            inputs = [a[1], a[2], a[3], b[1], b[2], b[3], q.inputs[1], q.inputs[2]]
            fused = Node(_BINARY[node.op_type], MS, inputs, [q.outputs[0]], {}, node.name, 1,
                         origin=origin(node, f"{node.op_type} '{node.name}' of DequantizeLinear outputs, quantized by "
                                             f"'{q.name}'"))
            for dq in (a[0], b[0]):
                maybe_dead.add(dq.outputs[0])
        else:
            if len(node.inputs) < 2:
                continue
            x = per_tensor_dq(node.inputs[0])
            shape = known_shape(types, node.inputs[0])
            w_dq = producer.get(node.inputs[1])
            if x is None or shape is None or len(shape) != 4 or w_dq is None or w_dq.op_type != "DequantizeLinear" \
                    or w_dq.domain or set(w_dq.attrs) - {"axis"} or len(w_dq.inputs) < 3:
                continue
            w, ws, wz = (consts.get(i) for i in w_dq.inputs[:3])
            if w is None or w.dtype != np.int8 or w.ndim != 4 or ws is None or ws.dtype != _F32 or wz is None \
                    or wz.dtype != np.int8 or wz.any() or wz.shape != ws.shape:
                continue
            m = w.shape[0]
            if ws.size != 1 and (ws.shape != (m,) or int(w_dq.attrs.get("axis", 1)) != 0):
                continue
            bias = quantized_bias(node, (consts[x[2]].reshape(()) * ws.reshape(-1)).astype(_F32), m)
            if bias is None:
                continue
            inputs = [x[1], x[2], x[3], w_dq.inputs[0], w_dq.inputs[1], w_dq.inputs[2], q.inputs[1], q.inputs[2]]
            if bias:
                inputs.append(bias)
            attrs = {k: v for k, v in node.attrs.items() if k in ("auto_pad", "dilations", "group", "kernel_shape",
                                                                 "pads", "strides")}
            fused = Node("QLinearConv", "", inputs, [q.outputs[0]], attrs, node.name, node.opset,
                         origin=origin(node, f"Conv '{node.name}' of DequantizeLinear outputs, quantized by "
                                             f"'{q.name}'" + quantized_note(bias)))
            maybe_dead.add(x[0].outputs[0])
            maybe_dead.add(w_dq.outputs[0])
        replaced[id(q)] = [fused]  # where the QuantizeLinear was: every input is computed by then
        dropped.add(id(node))
        changes.append(f"{node.op_type} '{node.name}' between DequantizeLinear and QuantizeLinear '{q.name}' -> "
                       f"{fused.op_type}")
    if not changes:
        return graph, []
    # a DequantizeLinear whose every reader was fused goes too (one read by a float op stays)
    nodes = drop_unread(rebuild(graph.nodes, replaced, dropped), graph, maybe_dead)
    opsets = {**graph.opsets, MS: 1} if any(n.domain == MS for n in nodes) else dict(graph.opsets)
    return replace(graph, nodes=nodes, opsets=opsets, initializers={**graph.initializers, **new_consts}), changes
